//! envoyproxy/ratelimit's config format, read as that project reads it.
//!
//! A file is `{domain, descriptors}`; a descriptor is `{key, value?,
//! rate_limit?, descriptors?, shadow_mode, quota_mode, detailed_metric,
//! value_to_metric, share_threshold, metadata}`; a rate limit is `{unit,
//! requests_per_unit, unlimited, name, replaces: [{name}]}`. Every error
//! that project rejects is rejected here, with its wording, each message
//! starting with the file: unknown keys anywhere (except inside
//! `metadata`), non-string keys, list items that are not maps, an empty
//! domain, an empty key, a duplicate composite key, an invalid unit, a unit
//! with `unlimited`, an empty `replaces` entry, a limit replacing itself,
//! `share_threshold` without a wildcard.

use std::collections::HashSet;

use serde_norway::Value;

/// Keys valid anywhere in the file (envoyproxy/ratelimit checks the set,
/// not the level).
const VALID_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// A time unit of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvoyUnit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl EnvoyUnit {
    /// The unit exactly `seconds` long, if any.
    pub fn of_seconds(seconds: u64) -> Option<EnvoyUnit> {
        [
            EnvoyUnit::Second,
            EnvoyUnit::Minute,
            EnvoyUnit::Hour,
            EnvoyUnit::Day,
            EnvoyUnit::Week,
            EnvoyUnit::Month,
            EnvoyUnit::Year,
        ]
        .into_iter()
        .find(|u| u.seconds() == seconds)
    }

    /// The unit named `name` (any case), as envoyproxy/ratelimit reads it.
    pub fn parse(name: &str) -> Option<EnvoyUnit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => EnvoyUnit::Second,
            "MINUTE" => EnvoyUnit::Minute,
            "HOUR" => EnvoyUnit::Hour,
            "DAY" => EnvoyUnit::Day,
            "WEEK" => EnvoyUnit::Week,
            "MONTH" => EnvoyUnit::Month,
            "YEAR" => EnvoyUnit::Year,
            _ => return None,
        })
    }

    /// Its length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            EnvoyUnit::Second => 1,
            EnvoyUnit::Minute => 60,
            EnvoyUnit::Hour => 3600,
            EnvoyUnit::Day => 86_400,
            EnvoyUnit::Week => 7 * 86_400,
            EnvoyUnit::Month => 30 * 86_400,
            EnvoyUnit::Year => 365 * 86_400,
        }
    }

    /// The upper-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            EnvoyUnit::Second => "SECOND",
            EnvoyUnit::Minute => "MINUTE",
            EnvoyUnit::Hour => "HOUR",
            EnvoyUnit::Day => "DAY",
            EnvoyUnit::Week => "WEEK",
            EnvoyUnit::Month => "MONTH",
            EnvoyUnit::Year => "YEAR",
        }
    }
}

/// A descriptor's `rate_limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyLimit {
    /// Requests per unit (0 refuses every request).
    pub requests_per_unit: u32,
    /// The unit; `None` only when unlimited.
    pub unit: Option<EnvoyUnit>,
    /// Never limited.
    pub unlimited: bool,
    /// Its name (for `replaces` and `current_limit.name`).
    pub name: String,
    /// Names of the limits it replaces.
    pub replaces: Vec<String>,
}

/// A descriptor node as written, without its children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyNodeInfo {
    /// The entry key.
    pub key: String,
    /// The entry value (`*` wildcards anywhere); empty: any value.
    pub value: String,
    /// The limit on this node.
    pub limit: Option<EnvoyLimit>,
    /// Counted, never over the limit.
    pub shadow_mode: bool,
    /// Over the limit only when every quota descriptor is.
    pub quota_mode: bool,
    /// Stats under the request's own values.
    pub detailed_metric: bool,
    /// Stats keep the request's value at this level.
    pub value_to_metric: bool,
    /// One counter for every value the wildcard matches.
    pub share_threshold: bool,
    /// Free metadata, as JSON (for dynamic metadata).
    pub metadata: Option<serde_json::Value>,
}

impl EnvoyNodeInfo {
    /// `key` or `key_value`, as envoyproxy/ratelimit names the node.
    pub fn composite(&self) -> String {
        if self.value.is_empty() {
            self.key.clone()
        } else {
            format!("{}_{}", self.key, self.value)
        }
    }
}

/// One descriptor node of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyNode {
    /// The node itself.
    pub info: EnvoyNodeInfo,
    /// Children in file order.
    pub children: Vec<EnvoyNode>,
}

/// One envoyproxy/ratelimit file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyConfig {
    /// The file it came from.
    pub file: String,
    /// Its domain.
    pub domain: String,
    /// The top-level descriptors in file order.
    pub descriptors: Vec<EnvoyNode>,
    /// The file's text (for `/rlconfig`).
    pub text: String,
}

/// Whether parsed YAML is an envoyproxy/ratelimit config: a map with
/// `domain` or `descriptors` at the top (a divvy policy has neither).
pub fn looks_like_envoy(doc: &Value) -> bool {
    doc.as_mapping().is_some_and(|m| {
        m.keys()
            .any(|k| matches!(k.as_str(), Some("domain") | Some("descriptors")))
            || m.keys().any(|k| !k.is_string())
    })
}

/// Reads an envoyproxy/ratelimit file (`name` is how errors name it).
pub fn parse(name: &str, text: &str) -> Result<EnvoyConfig, String> {
    let err = |m: String| format!("{name}: {m}");
    let doc: Value =
        serde_norway::from_str(text).map_err(|e| err(format!("error loading config file: {e}")))?;
    parse_value(name, text, &doc)
}

/// [`parse`] on YAML already read.
pub fn parse_value(name: &str, text: &str, doc: &Value) -> Result<EnvoyConfig, String> {
    let err = |m: String| format!("{name}: {m}");
    let empty = serde_norway::Mapping::new();
    let root = match doc {
        Value::Mapping(m) => m,
        Value::Null => &empty,
        _ => {
            return Err(err(
                "error loading config file: the file is not a map".to_owned()
            ))
        }
    };
    validate_keys(root).map_err(err)?;
    let domain = text_of(root.get("domain")).unwrap_or_default();
    if domain.is_empty() {
        return Err(err("config file cannot have empty domain".to_owned()));
    }
    let descriptors =
        load_descriptors(root.get("descriptors"), &format!("{domain}.")).map_err(err)?;
    Ok(EnvoyConfig {
        file: name.to_owned(),
        domain,
        descriptors,
        text: text.to_owned(),
    })
}

fn validate_keys(map: &serde_norway::Mapping) -> Result<(), String> {
    for (k, v) in map {
        let Some(key) = k.as_str() else {
            return Err(format!(
                "config error, key is not of type string: {}",
                scalar_text(k)
            ));
        };
        if !VALID_KEYS.contains(&key) {
            return Err(format!("config error, unknown key '{key}'"));
        }
        if key == "metadata" {
            continue;
        }
        match v {
            Value::Sequence(items) => {
                for item in items {
                    let Value::Mapping(m) = item else {
                        return Err(format!(
                            "config error, yaml file contains list of type other than map: {}",
                            scalar_text(item)
                        ));
                    };
                    validate_keys(m)?;
                }
            }
            Value::Mapping(m) => validate_keys(m)?,
            Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null => {}
            Value::Tagged(_) => return Err("error checking config".to_owned()),
        }
    }
    Ok(())
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "<nil>".to_owned(),
        other => serde_norway::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Null => None,
        other => Some(scalar_text(other)),
    }
}

fn flag(map: &serde_norway::Mapping, key: &str) -> Result<bool, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "error loading config file: `{key}` must be true or false, found {}",
            scalar_text(other)
        )),
    }
}

fn load_descriptors(list: Option<&Value>, parent: &str) -> Result<Vec<EnvoyNode>, String> {
    let items = match list {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(items)) => items,
        Some(other) => {
            return Err(format!(
                "error loading config file: `descriptors` must be a list, found {}",
                scalar_text(other)
            ))
        }
    };
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Mapping(m) = item else {
            return Err(format!(
                "config error, yaml file contains list of type other than map: {}",
                scalar_text(item)
            ));
        };
        let key = text_of(m.get("key")).unwrap_or_default();
        if key.is_empty() {
            return Err("descriptor has empty key".to_owned());
        }
        let value = text_of(m.get("value")).unwrap_or_default();
        let composite = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let full = format!("{parent}{composite}");
        if !seen.insert(composite.clone()) {
            return Err(format!("duplicate descriptor composite key '{full}'"));
        }
        let limit = match m.get("rate_limit") {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(rl)) => Some(load_limit(rl)?),
            Some(other) => {
                return Err(format!(
                    "error loading config file: `rate_limit` must be a map, found {}",
                    scalar_text(other)
                ))
            }
        };
        let share_threshold = flag(m, "share_threshold")?;
        if share_threshold && !composite.contains('*') {
            return Err(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
            ));
        }
        let metadata = match m.get("metadata") {
            None | Some(Value::Null) => None,
            Some(v) => {
                Some(serde_json::to_value(v).map_err(|e| format!("error parsing metadata: {e}"))?)
            }
        };
        out.push(EnvoyNode {
            info: EnvoyNodeInfo {
                key,
                value,
                limit,
                shadow_mode: flag(m, "shadow_mode")?,
                quota_mode: flag(m, "quota_mode")?,
                detailed_metric: flag(m, "detailed_metric")?,
                value_to_metric: flag(m, "value_to_metric")?,
                share_threshold,
                metadata,
            },
            children: load_descriptors(m.get("descriptors"), &format!("{full}."))?,
        });
    }
    Ok(out)
}

fn load_limit(rl: &serde_norway::Mapping) -> Result<EnvoyLimit, String> {
    let unlimited = flag(rl, "unlimited")?;
    let unit_text = text_of(rl.get("unit")).unwrap_or_default();
    let unit = EnvoyUnit::parse(&unit_text);
    if unlimited {
        if unit.is_some() {
            return Err("should not specify rate limit unit when unlimited".to_owned());
        }
    } else if unit.is_none() {
        return Err(format!("invalid rate limit unit '{unit_text}'"));
    }
    let requests_per_unit = match rl.get("requests_per_unit") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                format!("error loading config file: requests_per_unit must be an integer from 0 to 4294967295, found {n}")
            })?,
        Some(other) => {
            return Err(format!(
                "error loading config file: requests_per_unit must be an integer, found {}",
                scalar_text(other)
            ))
        }
    };
    let name = text_of(rl.get("name")).unwrap_or_default();
    let mut replaces = Vec::new();
    match rl.get("replaces") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(items)) => {
            for item in items {
                let n = item
                    .as_mapping()
                    .and_then(|m| text_of(m.get("name")))
                    .unwrap_or_default();
                if n.is_empty() {
                    return Err("should not have an empty replaces entry".to_owned());
                }
                if n == name {
                    return Err("replaces should not contain name of same descriptor".to_owned());
                }
                replaces.push(n);
            }
        }
        Some(other) => {
            return Err(format!(
                "error loading config file: `replaces` must be a list, found {}",
                scalar_text(other)
            ))
        }
    }
    Ok(EnvoyLimit {
        requests_per_unit,
        unit,
        unlimited,
        name,
        replaces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse("f.yaml", text).unwrap_err()
    }

    #[test]
    fn each_error_class_is_refused_with_its_words() {
        assert_eq!(
            err("descriptors:\n"),
            "f.yaml: config file cannot have empty domain"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - value: v\n"),
            "f.yaml: descriptor has empty key"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - {key: a, value: b}\n  - {key: a, value: b}\n"),
            "f.yaml: duplicate descriptor composite key 'd.a_b'"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: foo, requests_per_unit: 1}}\n"),
            "f.yaml: invalid rate limit unit 'foo'"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, unlimited: true}}\n"),
            "f.yaml: should not specify rate limit unit when unlimited"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - {key: a, ratelimit: {unit: second}}\n"),
            "f.yaml: config error, unknown key 'ratelimit'"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - {key: a, rate_limit: {name: n, unit: second, replaces: [{name: n}]}}\n"),
            "f.yaml: replaces should not contain name of same descriptor"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, replaces: [{name: ''}]}}\n"),
            "f.yaml: should not have an empty replaces entry"
        );
        assert_eq!(
            err("0.25: d\ndescriptors: []\n"),
            "f.yaml: config error, key is not of type string: 0.25"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - a\n  - b\n"),
            "f.yaml: config error, yaml file contains list of type other than map: a"
        );
        assert!(
            err("domain: d\ndescriptors:\n  - {key: a, value: b, share_threshold: true}\n")
                .contains("share_threshold can only be used with wildcard values")
        );
    }

    #[test]
    fn reads_the_tree() {
        let c = parse(
            "f.yaml",
            "domain: rl\ndescriptors:\n  - key: foo\n    rate_limit: {unit: minute, requests_per_unit: 2}\n    descriptors:\n      - key: bar\n        value: 'b*'\n        shadow_mode: true\n        rate_limit: {unlimited: true, name: x}\n",
        )
        .unwrap();
        assert_eq!(c.domain, "rl");
        let foo = &c.descriptors[0];
        assert_eq!(
            foo.info.limit.as_ref().unwrap().unit,
            Some(EnvoyUnit::Minute)
        );
        let bar = &foo.children[0].info;
        assert_eq!(bar.composite(), "bar_b*");
        assert!(bar.shadow_mode && bar.limit.as_ref().unwrap().unlimited);
    }
}
