//! `divvy check` and `divvy explain`: read a policy file, serve nothing.

use std::path::Path;

use anyhow::bail;
use divvy::config::{self, ConfigError, Policy};
use divvy::rules::{Operation, RuleSet};

/// A policy file loaded, every problem listed in the error.
pub fn load_for_cli(file: &Path) -> anyhow::Result<Policy> {
    match config::load_file(file) {
        Ok(p) => Ok(p),
        Err(ConfigError::Invalid { problems, file }) => {
            bail!(
                "{} problem(s) in {file}:\n{}",
                problems.len(),
                problems
                    .iter()
                    .map(|p| format!("  - {p}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        }
        Err(e) => Err(e.into()),
    }
}

pub fn check(file: &Path) -> anyhow::Result<()> {
    let policy = load_for_cli(file)?;
    print!("{}", summary(&policy));
    Ok(())
}

/// A one-screen summary: the rules, the envoyproxy/ratelimit domains, the governors.
fn summary(policy: &Policy) -> String {
    use divvy::config::envoy_ratelimit as crate_envoy;
    let mut out = if policy.divvy_rules {
        rules_table(policy)
    } else {
        format!("{}: OK\n", policy.source)
    };
    for c in &policy.envoy {
        fn count(nodes: &[crate_envoy::EnvoyNode]) -> usize {
            nodes
                .iter()
                .map(|n| usize::from(n.info.limit.is_some()) + count(&n.children))
                .sum()
        }
        out.push_str(&format!(
            "envoyproxy/ratelimit domain {} ({}): {} limits\n",
            c.domain,
            c.file,
            count(&c.descriptors)
        ));
    }
    if !policy.divvy_rules {
        out.push_str("no divvy policy: domains no file defines get no limit\n");
    }
    for g in &policy.governors {
        out.push_str(&format!(
            "governor {}: {} -> setpoint {} every {:?}, creditLimit {}..{}, kp {} ki {} kd {}{}{}\n",
            g.rule,
            g.query,
            g.tuning.setpoint,
            g.every,
            g.tuning.min,
            g.tuning.max,
            g.tuning.kp,
            g.tuning.ki,
            g.tuning.kd,
            g.tuning.breaker_above
                .map_or_else(String::new, |a| format!(", breaker above {a}")),
            g.prometheus
                .as_deref()
                .map_or_else(String::new, |p| format!(", prometheus {p}")),
        ));
    }
    out
}

/// `divvy explain`: which rule decides a request, its canaries and counter
/// keys; with `server`, also that server's live fair shares for it.
pub fn explain(
    file: &Path,
    domain: Option<&str>,
    pairs: &[String],
    server: Option<&str>,
) -> anyhow::Result<()> {
    let policy = load_for_cli(file)?;
    let mut kv = Vec::with_capacity(pairs.len());
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else {
            bail!("`{p}` is not a key=value pair");
        };
        kv.push((k, v));
    }
    let op = Operation::from_pairs(kv.iter().copied());
    let rules = RuleSet::new(policy);
    let plan = rules.plan(domain, &op);
    let describe = |i: usize| {
        let rule = rules.rule(i);
        let spec = &rule.spec;
        let what: Vec<String> = spec
            .limits
            .iter()
            .map(|l| {
                let name = l
                    .label
                    .as_deref()
                    .map(|n| format!("[{n}] "))
                    .unwrap_or_default();
                match (l.credit_limit, l.reset_seconds) {
                    (0, _) => format!("{name}always denies (creditLimit 0); no counter"),
                    (_, 0) => format!("{name}always allows (resetSeconds 0); no counter"),
                    _ => format!(
                        "{name}{}; counter {}{}",
                        l.describe(),
                        rule.counter_key(&op, l),
                        fair_text(l, &op)
                    ),
                }
            })
            .collect();
        if what.len() == 1 {
            format!("{spec}: {}", what[0])
        } else {
            format!(
                "{spec}: {} limits, all must allow:\n           {}",
                what.len(),
                what.join("\n           ")
            )
        }
    };
    match domain {
        Some(d) => println!("request (domain {d}): {}", pairs.join(" ")),
        None => println!("request (line protocol): {}", pairs.join(" ")),
    }
    let shadow = match rules.rule(plan.decider).is_shadow() {
        true => " (shadow: never denies; would-be denials are counted)",
        false => "",
    };
    println!("decides: {}{shadow}", describe(plan.decider));
    if plan.canaries.is_empty() {
        println!("canaries: none");
    }
    for c in plan.canaries {
        println!("canary:  {}", describe(c));
    }
    match server {
        Some(base) => super::explain_live::print_shares(base, domain, &kv),
        None => Ok(()),
    }
}

/// How a fairShare limit divides itself, for `explain` (shares and
/// demands are live figures: `GET /explain` or `GET /fair` on a server).
fn fair_text(l: &config::LimitSpec, op: &Operation) -> String {
    let Some(f) = &l.fair_share else {
        return String::new();
    };
    let value = op.get(&f.by).unwrap_or("");
    format!(
        ", fair share by {} among the values active in the last {:?} (at most {}); \
         this request's value {value:?} is held to its share (counter ...:fair:{value}; \
         its current share and demand: --server URL, or GET /fair?rule=... on a running server)",
        f.by, f.idle, f.max_actors
    )
}

/// The rules as a table.
fn rules_table(policy: &Policy) -> String {
    const SHOWN: usize = 40;
    let rules = &policy.rules;
    let mut out = rules_summary(policy);
    let mut rows: Vec<[String; 7]> = vec![[
        "#".into(),
        "label".into(),
        "policy".into(),
        "domain".into(),
        "limit".into(),
        "actor".into(),
        "operation".into(),
    ]];
    rows.extend(rules.iter().take(SHOWN).map(rule_row));
    out.push_str(&aligned(&rows));
    if rules.len() > SHOWN {
        out.push_str(&format!("  ... and {} more rules\n", rules.len() - SHOWN));
    }
    out
}

/// The table's first line: the source and its rules by match policy.
fn rules_summary(policy: &Policy) -> String {
    let rules = &policy.rules;
    let canaries = rules
        .iter()
        .filter(|r| r.match_policy == config::MatchPolicy::Canary)
        .count();
    let shadows = rules
        .iter()
        .filter(|r| !r.is_default && r.match_policy == config::MatchPolicy::Shadow)
        .count();
    // Shadow rules are named only when there are some (scripts read this line).
    let shadow_text = match shadows {
        0 => String::new(),
        n => format!(", {n} shadow"),
    };
    format!(
        "{}: OK, {} rules ({} stop, {} canary{shadow_text}, 1 default)\n",
        policy.source,
        rules.len(),
        rules.len().saturating_sub(canaries + shadows + 1),
        canaries
    )
}

/// One rule's row of the table.
fn rule_row(r: &config::RuleSpec) -> [String; 7] {
    let limit = r
        .limits
        .iter()
        .map(|l| match &l.fair_share {
            Some(f) => format!("{}, fair by {}", l.describe(), f.by),
            None => l.describe(),
        })
        .collect::<Vec<_>>()
        .join(" + ");
    let actors: Vec<&str> = r
        .limits
        .iter()
        .map(|l| l.actor_field.as_deref().unwrap_or("-"))
        .collect();
    let op = if r.is_default {
        "(default)".to_owned()
    } else {
        r.operation_text()
    };
    [
        r.position.to_string(),
        r.label.clone().unwrap_or_else(|| "-".into()),
        r.match_policy.as_str().into(),
        r.domain.clone().unwrap_or_else(|| "*".into()),
        limit,
        actors.join(" + "),
        op,
    ]
}

/// `rows` as lines, each column padded to its widest cell.
fn aligned(rows: &[[String; 7]]) -> String {
    let mut widths = [0usize; 7];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
