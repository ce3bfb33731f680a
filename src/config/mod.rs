//! Reading and validating the policy file.
//!
//! One schema ([`schema::RawConfig`]) in three syntaxes chosen by file
//! extension: YAML (`.yaml`, `.yml`; the primary form), divvy's JSON
//! (`.json`) and divvy's INI (`.ini`). [`load_file`] reads, parses and
//! validates a file into a [`Policy`]; every error names the file, the rule
//! and what is wrong.
//!
//! The imports run one way: [`schema`] (every raw serde type) imports nothing
//! of config and [`model`] (policy types and bounds) only
//! [`envoy_ratelimit`]'s file type; [`governor`] and [`validate`] check the
//! one into the other; this module reads files and hands them to the parsers.

pub mod duration;
pub mod envoy_ratelimit;
pub mod envoy_xds;
pub mod governor;
pub mod ini;
pub mod model;
pub mod schema;
pub mod validate;

use std::fmt;
use std::path::Path;

use thiserror::Error;

pub use model::{
    DeniedBody, FairShareSpec, GovernorSpec, LimitSpec, MatchPolicy, Policy, RuleSpec,
};

/// The syntax of a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML (a superset of divvy's JSON schema).
    Yaml,
    /// divvy's JSON.
    Json,
    /// divvy's INI.
    Ini,
}

impl Format {
    /// The format a file's extension names, if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "json" => Some(Format::Json),
            "ini" => Some(Format::Ini),
            _ => None,
        }
    }
}

/// Why a config could not be loaded. Nothing is ever half-loaded.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read the config: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The extension names no supported syntax.
    #[error("{file}: unknown config format; use a .yaml, .yml, .json or .ini file")]
    UnknownFormat {
        /// The file.
        file: String,
    },
    /// The text is not valid YAML / JSON / INI for the schema.
    #[error("{file}: {message}")]
    Syntax {
        /// The file.
        file: String,
        /// Where and what, e.g. `line 4: unknown field ...`.
        message: String,
    },
    /// A policy directory holds no policy file (yet).
    #[error("{dir}: the directory holds no *.yaml or *.yml file")]
    NoPolicyFiles {
        /// The directory.
        dir: String,
    },
    /// The rules parsed but break the rules of the schema.
    #[error("{}", Problems { file, problems })]
    Invalid {
        /// The file.
        file: String,
        /// Every problem found, each naming its rule.
        problems: Vec<String>,
    },
}

struct Problems<'a> {
    file: &'a str,
    problems: &'a [String],
}

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: {p}", self.file)?;
        }
        Ok(())
    }
}

/// One file of a config source, as read.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Where it is.
    pub path: std::path::PathBuf,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// The policy files of directory `dir`, sorted: `*.yaml` and `*.yml`
/// files whose names do not start with a dot.
fn policy_files(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| !n.starts_with('.'))
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml") | Some("yml")
                )
                && p.is_file()
        })
        .collect();
    names.sort();
    Ok(names)
}

/// Reads the config at `path`: the file, or every `*.yaml` / `*.yml` file
/// directly in the directory, sorted by name (names starting with `.` are
/// skipped, so a Kubernetes ConfigMap mount's `..data` entries are not
/// read twice; its symlinks to the files are followed).
pub fn read_source(path: &Path) -> Result<Vec<SourceFile>, ConfigError> {
    let read_err = |p: &Path, source| ConfigError::Read {
        file: p.display().to_string(),
        source,
    };
    if !path.is_dir() {
        let bytes = std::fs::read(path).map_err(|e| read_err(path, e))?;
        return Ok(vec![SourceFile {
            path: path.to_path_buf(),
            bytes,
        }]);
    }
    let names = policy_files(path).map_err(|e| read_err(path, e))?;
    if names.is_empty() {
        return Err(ConfigError::NoPolicyFiles {
            dir: path.display().to_string(),
        });
    }
    names
        .into_iter()
        .map(|p| {
            std::fs::read(&p)
                .map(|bytes| SourceFile {
                    path: p.clone(),
                    bytes,
                })
                .map_err(|e| read_err(&p, e))
        })
        .collect()
}

/// Loads the files of a config source into one policy: at most one divvy
/// policy and any number of envoyproxy/ratelimit files (one domain each,
/// told apart by their top-level keys). Without a divvy policy every
/// request of a domain no file defines gets "no limit". Any bad file fails
/// the whole set.
pub fn load_source(path: &Path, files: &[SourceFile]) -> Result<Policy, ConfigError> {
    let mut policy: Option<Policy> = None;
    let mut envoy: Vec<std::sync::Arc<envoy_ratelimit::EnvoyConfig>> = Vec::new();
    for f in files {
        let file = f.path.display().to_string();
        let is_yaml = matches!(Format::from_path(&f.path), Some(Format::Yaml));
        if is_yaml {
            let text = std::str::from_utf8(&f.bytes).map_err(|e| ConfigError::Syntax {
                file: file.clone(),
                message: format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
            })?;
            let doc: Option<serde_norway::Value> = serde_norway::from_str(text).ok();
            if let Some(doc) = doc.filter(envoy_ratelimit::looks_like_envoy) {
                let config =
                    envoy_ratelimit::parse_value(&file, text, &doc).map_err(|message| {
                        ConfigError::Invalid {
                            file: file.clone(),
                            problems: vec![message
                                .strip_prefix(&format!("{file}: "))
                                .unwrap_or(&message)
                                .to_owned()],
                        }
                    })?;
                if let Some(first) = envoy.iter().find(|c| c.domain == config.domain) {
                    return Err(ConfigError::Invalid {
                        file,
                        problems: vec![format!(
                            "duplicate domain '{}' in config file (already defined by {})",
                            config.domain, first.file
                        )],
                    });
                }
                envoy.push(std::sync::Arc::new(config));
                continue;
            }
        }
        let loaded = load_bytes(&f.path, &f.bytes)?;
        if let Some(first) = &policy {
            return Err(ConfigError::Invalid {
                file,
                problems: vec![format!(
                    "a second divvy policy in the directory (the first is {}); keep divvy rules in one file",
                    first.source
                )],
            });
        }
        policy = Some(loaded);
    }
    let mut policy = match policy {
        Some(p) => p,
        None => stand_in(&path.display().to_string())?,
    };
    if path.is_dir() {
        policy.source = path.display().to_string();
    }
    policy.envoy = envoy;
    Ok(policy)
}

/// A policy of no divvy rules (its one rule allows everything and is never
/// reported), from `source`.
fn stand_in(source: &str) -> Result<Policy, ConfigError> {
    let mut p = parse_str(
        "default: {creditLimit: 1, resetSeconds: 0}\n",
        Format::Yaml,
        source,
    )?;
    p.divvy_rules = false;
    Ok(p)
}

/// The policy in force before any source gave one (`divvy serve` without
/// `--config`, configured over xDS only): no rules, no domains, and an
/// empty source, which marks it as no configuration at all.
pub fn no_policy() -> Result<Policy, ConfigError> {
    stand_in("")
}

/// Reads, parses and validates a policy file or directory.
pub fn load_file(path: &Path) -> Result<Policy, ConfigError> {
    let files = read_source(path)?;
    load_source(path, &files)
}

/// Parses and validates `bytes`, the content of the file at `path` (whose
/// extension chooses the syntax).
pub fn load_bytes(path: &Path, bytes: &[u8]) -> Result<Policy, ConfigError> {
    let file = path.display().to_string();
    let format =
        Format::from_path(path).ok_or_else(|| ConfigError::UnknownFormat { file: file.clone() })?;
    let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Syntax {
        file: file.clone(),
        message: format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
    })?;
    parse_str(text, format, &file)
}

/// Parses and validates config text; `file` names it in errors.
pub fn parse_str(text: &str, format: Format, file: &str) -> Result<Policy, ConfigError> {
    let syntax = |message: String| ConfigError::Syntax {
        file: file.to_owned(),
        message,
    };
    let raw = match format {
        Format::Yaml => {
            if text.trim().is_empty() {
                return Err(syntax("the file is empty".to_owned()));
            }
            let de = serde_norway::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| syntax(describe_serde(&e, false)))?
        }
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut de)
                .map_err(|e| syntax(describe_serde(&e, true)))?
        }
        Format::Ini => {
            ini::parse(text).map_err(|(line, msg)| syntax(format!("line {line}: {msg}")))?
        }
    };
    validate::validate(raw, file).map_err(|problems| ConfigError::Invalid {
        file: file.to_owned(),
        problems,
    })
}

/// `rule #2: unknown field ... at line 3 column 5`: the rule by its 1-based
/// position (as in validation messages), then the parser's own message.
fn describe_serde<E: fmt::Display>(e: &serde_path_to_error::Error<E>, with_path: bool) -> String {
    let path = e.path().to_string();
    let rule = path
        .strip_prefix("overrides[")
        .and_then(|rest| rest.split(']').next())
        .and_then(|n| n.parse::<usize>().ok())
        .map(|n| format!("rule #{}: ", n + 1))
        .or_else(|| {
            path.starts_with("default")
                .then(|| "the default rule: ".to_owned())
        })
        .unwrap_or_default();
    if with_path && path != "." {
        format!("{rule}at `{path}`: {}", e.inner())
    } else {
        format!("{rule}{}", e.inner())
    }
}
