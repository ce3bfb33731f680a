//! divvy's INI config form (README, "Configuration reference").
//!
//! ```ini
//! [method=GET path=/pantry/cookies/* ip=*]
//! creditLimit = 3
//! resetSeconds = 3600
//! actorField = ip
//! ```
//!
//! A section name is the rule's operation (`k=v` pairs); `[default]` comes
//! last; several limits are `limits.<n>.<field>`, from 1. A reader of our own
//! (not an INI crate) keeps divvy's rules exact and every error's line number.

use std::collections::BTreeMap;

use super::schema::{RawConfig, RawFairShare, RawLimit, RawRule, Scalar};

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
            let section = (line, rest, line_no);
            current = Some(open_section(
                &mut config,
                current.take(),
                &mut seen_sections,
                section,
            )?);
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err((line_no, format!("expected `key = value`, found `{line}`")));
        };
        let key = key.trim();
        let value = unquote(value.trim());
        let Some((rule, _, _)) = current.as_mut() else {
            if key == "charge" && config.charge.is_none() {
                config.charge = Some(value);
                continue;
            }
            return Err((
                line_no,
                format!("`{key}` appears before any [section] (only `charge` may, once)"),
            ));
        };
        if let Some(rest) = key.strip_prefix("limits.") {
            set_limit_field(rule, rest, value).map_err(|e| (line_no, e))?;
            continue;
        }
        let slot = set_rule_field(rule, key, value).map_err(|e| (line_no, e))?;
        if !slot {
            return Err((line_no, format!("`{key}` is set twice in this section")));
        }
    }
    finish(&mut config, current.take());
    Ok(config)
}

/// A section header, `line` (`rest` after its `[`, on line `line_no`):
/// finishes the section being filled and returns the one it opens (its
/// rule, whether it is `[default]`, its line).
fn open_section(
    config: &mut RawConfig,
    current: Option<(RawRule, bool, usize)>,
    seen_sections: &mut BTreeMap<String, usize>,
    (line, rest, line_no): (&str, &str, usize),
) -> Result<(RawRule, bool, usize), (usize, String)> {
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
    finish(config, current);
    if config.default.is_some() {
        return Err((
            line_no,
            "the [default] section must be the last section".to_owned(),
        ));
    }
    if name == "default" {
        return Ok((RawRule::default(), true, line_no));
    }
    let rule = RawRule {
        operation: parse_operation(name).map_err(|e| (line_no, e))?,
        ..RawRule::default()
    };
    Ok((rule, false, line_no))
}

/// `key = value` on a rule's own field: whether it was unset before.
fn set_rule_field(rule: &mut RawRule, key: &str, value: String) -> Result<bool, String> {
    Ok(match key {
        "creditLimit" => set_scalar(&mut rule.credit_limit, value),
        "resetSeconds" => set_scalar(&mut rule.reset_seconds, value),
        "actorField" => set_text(&mut rule.actor_field, value),
        "matchPolicy" => set_text(&mut rule.match_policy, value),
        "label" => set_text(&mut rule.label, value),
        "comment" => set_text(&mut rule.comment, value),
        "domain" => set_text(&mut rule.domain, value),
        "algorithm" => set_text(&mut rule.algorithm, value),
        "burst" => set_scalar(&mut rule.burst, value),
        "scope" => set_text(&mut rule.scope, value),
        "fairShare" => set_fair_share(&mut rule.fair_share, value),
        "deniedBody" => set_text(&mut rule.denied_body, value),
        "overdraft" => set_bool(&mut rule.overdraft, value),
        other => {
            return Err(format!(
                "unknown field `{other}`; expected one of creditLimit, resetSeconds, \
                 actorField, matchPolicy, label, comment, domain, algorithm, burst, scope, \
                 fairShare, deniedBody, overdraft, limits.<n>.<field>"
            ))
        }
    })
}

/// `limits.<n>.<field> = value`: `rest` is `<n>.<field>`.
fn set_limit_field(rule: &mut RawRule, rest: &str, value: String) -> Result<(), String> {
    let (n, field) = rest
        .split_once('.')
        .ok_or_else(|| format!("`limits.{rest}` must be written limits.<n>.<field>"))?;
    let n: usize = n
        .parse()
        .ok()
        .filter(|&n| (1..=64).contains(&n))
        .ok_or_else(|| format!("`limits.{rest}`: the limit number must be 1 to 64"))?;
    let limits = rule.limits.get_or_insert_with(Vec::new);
    if n > limits.len() + 1 {
        return Err(format!(
            "`limits.{rest}`: limits are numbered in order from 1; limit {} comes first",
            limits.len() + 1
        ));
    }
    if n == limits.len() + 1 {
        limits.push(RawLimit::default());
    }
    let limit = &mut limits[n - 1];
    let fresh = match field {
        "creditLimit" => set_scalar(&mut limit.credit_limit, value),
        "resetSeconds" => set_scalar(&mut limit.reset_seconds, value),
        "algorithm" => set_text(&mut limit.algorithm, value),
        "burst" => set_scalar(&mut limit.burst, value),
        "actorField" => set_text(&mut limit.actor_field, value),
        "label" => set_text(&mut limit.label, value),
        "scope" => set_text(&mut limit.scope, value),
        "fairShare" => set_fair_share(&mut limit.fair_share, value),
        "overdraft" => set_bool(&mut limit.overdraft, value),
        other => {
            return Err(format!(
                "unknown limit field `{other}`; expected one of creditLimit, resetSeconds, \
                 algorithm, burst, actorField, label, scope, fairShare, overdraft"
            ))
        }
    };
    if fresh {
        Ok(())
    } else {
        Err(format!("`limits.{rest}` is set twice in this section"))
    }
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

/// `true` and `false` as booleans (INI has only text); anything else as
/// the text it is, which validation refuses with the value in its message.
fn set_bool(slot: &mut Option<Scalar>, value: String) -> bool {
    let fresh = slot.is_none();
    *slot = Some(match value.as_str() {
        "true" => Scalar::Bool(true),
        "false" => Scalar::Bool(false),
        _ => Scalar::Str(value),
    });
    fresh
}

fn set_text(slot: &mut Option<String>, value: String) -> bool {
    let fresh = slot.is_none();
    *slot = Some(value);
    fresh
}

/// `fairShare = KEY` (the short form; INI has no nested values).
fn set_fair_share(slot: &mut Option<RawFairShare>, value: String) -> bool {
    let fresh = slot.is_none();
    *slot = Some(RawFairShare::Key(value));
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
        assert_eq!(parse("[a=b]\nlimits.2.creditLimit=1\n").unwrap_err().0, 2);
        assert_eq!(parse("[a=b]\nlimits.1.rate=1\n").unwrap_err().0, 2);
        assert_eq!(parse("charge=each\ncharge=each\n").unwrap_err().0, 2);
    }

    #[test]
    fn reads_limits_algorithms_and_charge() {
        let cfg = parse(
            "charge = all-or-nothing\n[path=/api/*]\nlimits.1.creditLimit = 40\nlimits.1.resetSeconds = 1\n\
             limits.1.algorithm = token_bucket\nlimits.1.burst = 80\nlimits.1.actorField = apiKey\n\
             limits.2.creditLimit = 120\nlimits.2.resetSeconds = 1\n[default]\ncreditLimit=1\nresetSeconds=1\nalgorithm=sliding\n",
        )
        .unwrap();
        assert_eq!(cfg.charge.as_deref(), Some("all-or-nothing"));
        let limits = cfg.overrides[0].limits.as_ref().unwrap();
        assert_eq!(limits.len(), 2);
        assert_eq!(limits[0].burst, Some(Scalar::Str("80".into())));
        assert_eq!(limits[1].credit_limit, Some(Scalar::Str("120".into())));
        assert_eq!(cfg.default.unwrap().algorithm.as_deref(), Some("sliding"));
    }
}
