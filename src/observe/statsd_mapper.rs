//! statsd_exporter's mapping format, which envoyproxy/ratelimit reads from
//! `PROMETHEUS_MAPPER_YAML` to name its Prometheus series: each statsd
//! name (`ratelimit.service.rate_limit.<domain>.<key>.over_limit`) is
//! matched against the mappings (globs first, then regular expressions,
//! each in file order) and becomes the first match's name and labels, or
//! is dropped by `action: drop`; an unmatched name is kept with every
//! character outside `[a-zA-Z0-9_]` turned into `_`, as the exporter does.

use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;
use thiserror::Error;

/// A mapping file divvy cannot use.
#[derive(Debug, Error)]
pub enum MapperError {
    /// Not YAML of the mapping format.
    #[error("not a statsd_exporter mapping file: {0}")]
    Format(String),
    /// A mapping's `match` is not a valid pattern.
    #[error("mapping {index} ({pattern:?}): {why}")]
    Pattern {
        /// The mapping's position, from 1.
        index: usize,
        /// Its `match`.
        pattern: String,
        /// What is wrong.
        why: String,
    },
}

/// The kind of a statsd event, for `match_metric_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A counter.
    Counter,
    /// A timer (an observer), rendered as a histogram.
    Timer,
    /// A gauge (divvy sends none: a mapping of gauges matches nothing).
    Gauge,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    mappings: Vec<MappingSpec>,
    /// Accepted and not used: divvy's defaults are the exporter's.
    #[serde(default)]
    #[allow(dead_code)]
    defaults: Option<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MappingSpec {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    match_metric_type: Option<String>,
    #[serde(default)]
    help: Option<String>,
    // Shapes of the exporter's own observers: divvy renders timers as
    // histograms of its own buckets, whatever they say.
    #[serde(default)]
    #[allow(dead_code)]
    timer_type: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    observer_type: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    buckets: Option<serde_norway::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    quantiles: Option<serde_norway::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    histogram_options: Option<serde_norway::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    summary_options: Option<serde_norway::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    ttl: Option<serde_norway::Value>,
}

/// One compiled mapping.
#[derive(Debug)]
struct Mapping {
    regex: Regex,
    glob: bool,
    name: String,
    labels: Vec<(String, String)>,
    drop: bool,
    kind: Option<EventKind>,
    help: Option<String>,
}

/// What a statsd name becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// The Prometheus name.
    pub name: String,
    /// Its labels, in the mapping's order.
    pub labels: Vec<(String, String)>,
    /// The mapping's `help`, if any.
    pub help: Option<String>,
}

/// A parsed mapping file.
#[derive(Debug)]
pub struct Mapper {
    mappings: Vec<Mapping>,
}

impl Mapper {
    /// Parses a mapping file's text.
    pub fn parse(yaml: &str) -> Result<Mapper, MapperError> {
        let spec: FileSpec =
            serde_norway::from_str(yaml).map_err(|e| MapperError::Format(e.to_string()))?;
        let mut mappings = Vec::with_capacity(spec.mappings.len());
        for (i, m) in spec.mappings.into_iter().enumerate() {
            mappings.push(compile(i + 1, m)?);
        }
        // Globs are tried before regular expressions, as the exporter does.
        mappings.sort_by_key(|m| !m.glob);
        Ok(Mapper { mappings })
    }

    /// What the statsd name `name` of an event of `kind` becomes; `None`
    /// when a mapping drops it.
    pub fn map(&self, name: &str, kind: EventKind) -> Option<Mapped> {
        for m in &self.mappings {
            if m.kind.is_some_and(|k| k != kind) {
                continue;
            }
            let Some(caps) = m.regex.captures(name) else {
                continue;
            };
            if m.drop {
                return None;
            }
            let expand = |template: &str| {
                let mut out = String::new();
                caps.expand(template, &mut out);
                out
            };
            return Some(Mapped {
                name: escape_name(&expand(&m.name)),
                labels: m
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .collect(),
                help: m.help.clone(),
            });
        }
        Some(Mapped {
            name: escape_name(name),
            labels: Vec::new(),
            help: None,
        })
    }
}

fn compile(index: usize, m: MappingSpec) -> Result<Mapping, MapperError> {
    let bad = |why: String| MapperError::Pattern {
        index,
        pattern: m.pattern.clone(),
        why,
    };
    let glob = match m.match_type.as_deref() {
        None | Some("" | "glob") => true,
        Some("regex") => false,
        Some(other) => return Err(bad(format!("match_type {other:?}: glob or regex"))),
    };
    let drop = match m.action.as_deref() {
        None | Some("" | "map") => false,
        Some("drop") => true,
        Some(other) => return Err(bad(format!("action {other:?}: map or drop"))),
    };
    let kind = match m.match_metric_type.as_deref() {
        None | Some("") => None,
        Some("counter") => Some(EventKind::Counter),
        Some("observer" | "timer") => Some(EventKind::Timer),
        Some("gauge") => Some(EventKind::Gauge),
        Some(other) => return Err(bad(format!("match_metric_type {other:?}"))),
    };
    let source = if glob {
        glob_regex(&m.pattern)
    } else {
        format!("^(?:{})$", m.pattern)
    };
    let regex = Regex::new(&source).map_err(|e| bad(e.to_string()))?;
    let name = match (m.name, drop) {
        (Some(n), _) if !n.is_empty() => n,
        (_, true) => String::new(),
        _ => return Err(bad("a mapping needs a name (or action: drop)".into())),
    };
    Ok(Mapping {
        regex,
        glob,
        name,
        labels: m.labels.into_iter().collect(),
        drop,
        kind,
        help: m.help,
    })
}

/// A glob as a regular expression: `*` is any run of characters but a dot,
/// each one a capture (`$1`, `$2`…); everything else is literal.
fn glob_regex(glob: &str) -> String {
    let mut out = String::from("^");
    for (i, part) in glob.split('*').enumerate() {
        if i > 0 {
            out.push_str("([^.]*)");
        }
        out.push_str(&regex::escape(part));
    }
    out.push('$');
    out
}

/// A Prometheus-safe name: characters outside `[a-zA-Z0-9_:]` become `_`,
/// and a leading digit gets a `_` before it.
fn escape_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "rl_over"
    labels: {domain: "$1", descriptor: "$2"}
  - match: "ratelimit\\.service\\.rate_limit\\.(.*)\\.total_hits"
    match_type: regex
    name: "rl_hits"
    labels: {path: "$1"}
  - match: "ratelimit_server.*.response_time"
    match_metric_type: observer
    timer_type: histogram
    name: "rl_time"
    labels: {method: "$1"}
  - match: "ratelimit.service.config_load_*"
    action: drop
"#;

    #[test]
    fn globs_then_regexes_name_and_label_events() {
        let m = Mapper::parse(FILE).expect("valid");
        let over = m.map(
            "ratelimit.service.rate_limit.eg.k_v.over_limit",
            EventKind::Counter,
        );
        let over = over.expect("mapped");
        assert_eq!(over.name, "rl_over");
        assert_eq!(
            over.labels,
            [
                ("descriptor".into(), "k_v".into()),
                ("domain".into(), "eg".into())
            ]
        );
        // Three parts: the glob's `*` takes no dot, the regex takes the rest.
        let hits = m.map(
            "ratelimit.service.rate_limit.eg.a.b.total_hits",
            EventKind::Counter,
        );
        assert_eq!(
            hits.expect("mapped").labels,
            [("path".into(), "eg.a.b".into())]
        );
        let time = m.map(
            "ratelimit_server.ShouldRateLimit.response_time",
            EventKind::Timer,
        );
        assert_eq!(time.expect("mapped").name, "rl_time");
        // The observer mapping does not take a counter of that name.
        let counter = m.map(
            "ratelimit_server.ShouldRateLimit.response_time",
            EventKind::Counter,
        );
        assert_eq!(
            counter.expect("kept").name,
            "ratelimit_server_ShouldRateLimit_response_time"
        );
        assert_eq!(
            m.map("ratelimit.service.config_load_success", EventKind::Counter),
            None
        );
    }

    #[test]
    fn a_bad_file_is_refused_with_the_mapping_named() {
        for (yaml, says) in [
            (
                "mappings: [{match: 'a.*', name: x, colour: red}]",
                "unknown field",
            ),
            (
                "mappings: [{match: '(', match_type: regex, name: x}]",
                "mapping 1",
            ),
            ("mappings: [{match: 'a.*'}]", "needs a name"),
            (
                "mappings: [{match: 'a', action: explode, name: x}]",
                "map or drop",
            ),
            ("- just a list", "mapping file"),
        ] {
            let err = Mapper::parse(yaml).expect_err(yaml).to_string();
            assert!(err.contains(says), "{yaml}: {err}");
        }
    }
}
