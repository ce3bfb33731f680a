//! Reading and validating the policy file.
//!
//! One schema ([`schema::RawConfig`]) in three syntaxes chosen by file
//! extension: YAML (`.yaml`, `.yml`; the primary form), divvy's JSON
//! (`.json`) and divvy's INI (`.ini`). [`load_file`] reads, parses and
//! validates a file into a [`Policy`]; every error names the file, the rule
//! and what is wrong.

pub mod duration;
pub mod governor;
pub mod ini;
pub mod schema;
pub mod validate;

use std::fmt;
use std::path::Path;

use thiserror::Error;

pub use governor::GovernorSpec;
pub use validate::{LimitSpec, MatchPolicy, Policy, RuleSpec};

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

/// Reads, parses and validates a policy file.
pub fn load_file(path: &Path) -> Result<Policy, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read {
        file: path.display().to_string(),
        source,
    })?;
    load_bytes(path, &bytes)
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
