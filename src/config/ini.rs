//! divvy's INI config form.
//!
//! ```ini
//! [method=GET path=/pantry/cookies/* ip=*]
//! creditLimit = 3
//! resetSeconds = 3600
//! actorField = ip
//! comment = '3 requests per hour for GET /pantry/cookies, by IP'
//!
//! [default]
//! creditLimit = 10
//! resetSeconds = 60
//! ```
//!
//! Each section name is the rule's operation as whitespace-separated `k=v`
//! pairs (split at the first `=`); `[default]` is the default rule and must be
//! the last section. Values may be wrapped in single or double quotes; an
//! unquoted value ends at a `;` or `#` comment. Unlike the original's INI
//! reader, dots in section names are plain characters. A small reader of our
//! own (rather than a general INI crate) keeps those divvy rules exact and
//! reports every error with its line number.

use std::collections::BTreeMap;

use super::schema::{RawConfig, RawRule, Scalar};

/// Parses INI text; an error carries the 1-based line and what is wrong.
pub fn parse(text: &str) -> Result<RawConfig, (usize, String)> {
    let mut config = RawConfig::default();
    // The section being filled: its rule, and whether it is `[default]`.
    let mut current: Option<(RawRule, bool, usize)> = None;
    let mut seen_sections: BTreeMap<String, usize> = BTreeMap::new();

    for (idx, raw_line) in text.lines().enumerate() {
        let line_no = idx + 1;
        let line = raw_line.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest
                .strip_suffix(']')
                .ok_or_else(|| {
                    (
                        line_no,
                        format!("section header `{line}` has no closing `]`"),
                    )
                })?
                .trim();
            if let Some(first) = seen_sections.insert(name.to_owned(), line_no) {
                return Err((
                    line_no,
                    format!("section [{name}] appears twice (first on line {first})"),
                ));
            }
            finish(&mut config, current.take());
            if config.default.is_some() {
                return Err((
                    line_no,
                    "the [default] section must be the last section".to_owned(),
                ));
            }
            if name == "default" {
                current = Some((RawRule::default(), true, line_no));
            } else {
                let rule = RawRule {
                    operation: parse_operation(name).map_err(|e| (line_no, e))?,
                    ..RawRule::default()
                };
                current = Some((rule, false, line_no));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err((line_no, format!("expected `key = value`, found `{line}`")));
        };
        let key = key.trim();
        let value = unquote(value.trim());
        let Some((rule, _, _)) = current.as_mut() else {
            return Err((line_no, format!("`{key}` appears before any [section]")));
        };
        let slot = match key {
            "creditLimit" => set_scalar(&mut rule.credit_limit, value),
            "resetSeconds" => set_scalar(&mut rule.reset_seconds, value),
            "actorField" => set_text(&mut rule.actor_field, value),
            "matchPolicy" => set_text(&mut rule.match_policy, value),
            "label" => set_text(&mut rule.label, value),
            "comment" => set_text(&mut rule.comment, value),
            "domain" => set_text(&mut rule.domain, value),
            other => {
                return Err((
                    line_no,
                    format!(
                        "unknown field `{other}`; expected one of creditLimit, resetSeconds, \
                         actorField, matchPolicy, label, comment, domain"
                    ),
                ))
            }
        };
        if !slot {
            return Err((line_no, format!("`{key}` is set twice in this section")));
        }
    }
    finish(&mut config, current.take());
    Ok(config)
}

fn finish(config: &mut RawConfig, section: Option<(RawRule, bool, usize)>) {
    match section {
        Some((rule, true, _)) => config.default = Some(rule),
        Some((rule, false, _)) => config.overrides.push(rule),
        None => {}
    }
}

fn set_scalar(slot: &mut Option<Scalar>, value: String) -> bool {
    let fresh = slot.is_none();
    *slot = Some(Scalar::Str(value));
    fresh
}

fn set_text(slot: &mut Option<String>, value: String) -> bool {
    let fresh = slot.is_none();
    *slot = Some(value);
    fresh
}

/// `method=GET path=/x` → `{method: GET, path: /x}`.
fn parse_operation(name: &str) -> Result<BTreeMap<String, Scalar>, String> {
    let mut op = BTreeMap::new();
    for pair in name.split_whitespace() {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!(
                "section [{name}]: `{pair}` is not a key=value pair"
            ));
        };
        if op.insert(k.to_owned(), Scalar::Str(v.to_owned())).is_some() {
            return Err(format!("section [{name}]: key `{k}` appears twice"));
        }
    }
    if op.is_empty() {
        return Err(format!(
            "section [{name}] has no key=value pairs (the catch-all rule is [default])"
        ));
    }
    Ok(op)
}

/// Strips one pair of matching quotes, or an inline comment from an unquoted value.
fn unquote(value: &str) -> String {
    for q in ['\'', '"'] {
        if value.len() >= 2 && value.starts_with(q) && value.ends_with(q) {
            return value[1..value.len() - 1].to_owned();
        }
    }
    match value.find([';', '#']) {
        Some(at) => value[..at].trim_end().to_owned(),
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sections_and_default() {
        let cfg = parse(
            "; comment\n[method=GET path=/index.html ip=10.0.0.1]\ncreditLimit = 3\nresetSeconds = '1h'\nactorField = ip ; who\n\n[default]\ncreditLimit = 0\n",
        )
        .unwrap();
        assert_eq!(cfg.overrides.len(), 1);
        let r = &cfg.overrides[0];
        assert_eq!(r.operation["path"], Scalar::Str("/index.html".into()));
        assert_eq!(r.operation["ip"], Scalar::Str("10.0.0.1".into()));
        assert_eq!(r.reset_seconds, Some(Scalar::Str("1h".into())));
        assert_eq!(r.actor_field.as_deref(), Some("ip"));
        assert!(cfg.default.is_some());
    }

    #[test]
    fn errors_carry_line_numbers() {
        assert_eq!(parse("[a=b]\ncreditLimt = 3\n").unwrap_err().0, 2);
        assert_eq!(parse("creditLimit = 3\n").unwrap_err().0, 1);
        assert_eq!(parse("[a=b\n").unwrap_err().0, 1);
        assert_eq!(parse("[a]\n").unwrap_err().0, 1);
        assert_eq!(parse("[a=b]\n[a=b]\n").unwrap_err().0, 2);
        assert_eq!(parse("[default]\n[a=b]\n").unwrap_err().0, 2);
        assert_eq!(
            parse("[a=b]\ncreditLimit=1\ncreditLimit=2\n")
                .unwrap_err()
                .0,
            3
        );
        assert_eq!(parse("[a=b]\njunk\n").unwrap_err().0, 2);
    }
}
