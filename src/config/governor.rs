//! Checks the `governors:` section (a PID controller per governed rule) into
//! [`GovernorSpec`]s, applying the defaults below.
//!
//! ```yaml
//! governors:
//!   - {rule: reindex, query: 'max(mongo_load1)', setpoint: 2.0, max: 500}
//! ```
//!
//! Defaults: `every` 5s, `min` 0, `kp` 3, `ki` 3, `kd` 0, no breaker,
//! `fallbackAfter` 6 intervals, `prometheus` from `--prometheus-url` (all
//! fields: README, "Governing a job by load"). Governors are written in
//! YAML or JSON policies (INI has no lists of maps).

use std::time::Duration;

use super::duration::parse_millis;
use super::model::{GovernorSpec, RuleSpec, Tuning, MAX_CREDIT_LIMIT};
use super::schema::{RawGovernor, Scalar};

/// Default control interval.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(5);
/// Default gains (`kp`, `ki`, `kd`): the example's, tested on a simulated
/// plant with a 15 s lag in `governor::pid`.
pub const DEFAULT_GAINS: (f64, f64, f64) = (3.0, 3.0, 0.0);
/// Default intervals without data before falling to `min`.
pub const DEFAULT_FALLBACK_AFTER: u32 = 6;

/// Whether `label` names something a governor can set: a `limits` entry,
/// or a rule with a single limit.
fn governable(rules: &[RuleSpec], label: &str) -> Result<(), String> {
    for rule in rules {
        if rule
            .limits
            .iter()
            .any(|l| l.label.as_deref() == Some(label))
        {
            return Ok(());
        }
        if rule.label.as_deref() == Some(label) {
            if rule.limits.len() == 1 {
                return Ok(());
            }
            return Err(format!(
                "rule `{label}` has {} limits; govern one of them by its label",
                rule.limits.len()
            ));
        }
    }
    Err(format!("no rule or limit has the label `{label}`"))
}

/// Validates `raw` against the policy's `rules`, pushing every problem.
pub fn check_governors(
    raw: Vec<RawGovernor>,
    rules: &[RuleSpec],
    problems: &mut Vec<String>,
) -> Vec<GovernorSpec> {
    let mut out: Vec<GovernorSpec> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for (i, g) in raw.into_iter().enumerate() {
        let name = match &g.rule {
            Some(r) => format!("governor #{} (rule {r})", i + 1),
            None => format!("governor #{}", i + 1),
        };
        let before = problems.len();
        let mut bad = |m: String| problems.push(format!("{name}: {m}"));
        let spec = check_governor(g, rules, &mut seen, &mut bad);
        if problems.len() == before {
            out.push(spec);
        }
    }
    out
}

/// Validates one governor, reporting each problem to `bad`; `seen` holds
/// the labels already governed. The result counts only if nothing was bad.
fn check_governor(
    g: RawGovernor,
    rules: &[RuleSpec],
    seen: &mut Vec<String>,
    bad: &mut dyn FnMut(String),
) -> GovernorSpec {
    let rule = check_rule_label(g.rule.as_deref(), rules, seen, bad);
    let query = match g.query.as_deref().map(str::trim) {
        None | Some("") => {
            bad("`query` is required (a PromQL instant query)".to_owned());
            String::new()
        }
        Some(q) => q.to_owned(),
    };
    if let Some(p) = &g.prometheus {
        if !(p.starts_with("http://") && p.len() > "http://".len()) {
            bad(format!(
                "`prometheus` must be an http:// URL such as http://prometheus:9090, found `{p}`"
            ));
        }
    }
    let mut tuning = check_tuning(&g, bad);
    let every = check_every(g.every.as_ref(), bad);
    // Checked after `every`, so the messages keep the order of the fields.
    tuning.fallback_after = match g.fallback_after {
        Some(0) => {
            bad("`fallbackAfter` must be at least 1 interval".to_owned());
            1
        }
        Some(n) => n,
        None => DEFAULT_FALLBACK_AFTER,
    };
    GovernorSpec {
        rule,
        query,
        prometheus: g.prometheus,
        every,
        tuning,
    }
}

/// `rule`: a label that [`governable`] accepts and no earlier governor took.
fn check_rule_label(
    rule: Option<&str>,
    rules: &[RuleSpec],
    seen: &mut Vec<String>,
    bad: &mut dyn FnMut(String),
) -> String {
    match rule.map(str::trim) {
        None | Some("") => {
            bad("`rule` is required (a rule or limit label)".to_owned());
            String::new()
        }
        Some(r) => {
            if let Err(e) = governable(rules, r) {
                bad(e);
            }
            if seen.iter().any(|o| o == r) {
                bad(format!("`{r}` already has a governor"));
            }
            seen.push(r.to_owned());
            r.to_owned()
        }
    }
}

/// The controller's numbers, with their defaults, each finite and in range
/// (`fallback_after` is left at its default for the caller to check).
fn check_tuning(g: &RawGovernor, bad: &mut dyn FnMut(String)) -> Tuning {
    let mut number = |field: &str, v: Option<f64>, default: Option<f64>| -> f64 {
        match v.or(default) {
            None => {
                bad(format!("`{field}` is required"));
                0.0
            }
            Some(x) if !x.is_finite() => {
                bad(format!("`{field}` must be a finite number"));
                0.0
            }
            Some(x) => x,
        }
    };
    let tuning = Tuning {
        setpoint: number("setpoint", g.setpoint, None),
        min: number("min", g.min, Some(0.0)),
        max: number("max", g.max, None),
        kp: number("kp", g.kp, Some(DEFAULT_GAINS.0)),
        ki: number("ki", g.ki, Some(DEFAULT_GAINS.1)),
        kd: number("kd", g.kd, Some(DEFAULT_GAINS.2)),
        breaker_above: g
            .breaker
            .as_ref()
            .map(|b| number("breaker.above", b.above, None)),
        fallback_after: DEFAULT_FALLBACK_AFTER,
    };
    check_ranges(&tuning, bad);
    tuning
}

/// Gains and `min` not negative, `max` a credit limit, `min <= max`, and a
/// breaker above the setpoint.
fn check_ranges(t: &Tuning, bad: &mut dyn FnMut(String)) {
    for (field, v) in [("kp", t.kp), ("ki", t.ki), ("kd", t.kd)] {
        if v < 0.0 {
            bad(format!("`{field}` must not be negative, found {v}"));
        }
    }
    let (min, max, setpoint) = (t.min, t.max, t.setpoint);
    if min < 0.0 {
        bad(format!("`min` must not be negative, found {min}"));
    }
    if max > MAX_CREDIT_LIMIT as f64 {
        bad(format!(
            "`max` must be at most {MAX_CREDIT_LIMIT}, found {max}"
        ));
    }
    if min > max {
        bad(format!("`min` ({min}) is greater than `max` ({max})"));
    }
    if let Some(a) = t.breaker_above {
        if a <= setpoint {
            bad(format!(
                "`breaker.above` ({a}) must be above the setpoint ({setpoint})"
            ));
        }
    }
}

/// `every`: a duration of at least 100 ms ([`DEFAULT_EVERY`] when absent).
fn check_every(every: Option<&Scalar>, bad: &mut dyn FnMut(String)) -> Duration {
    match every {
        None => DEFAULT_EVERY,
        Some(s) => match parse_millis(&s.to_text()) {
            Some(ms) if ms >= 100 => Duration::from_millis(ms),
            _ => {
                bad(format!(
                    "`every` must be a duration of at least 100ms such as `5s`, `500ms` or `1m`, found `{}`",
                    s.to_text()
                ));
                DEFAULT_EVERY
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{parse_str, Format};

    const RULES: &str = "overrides:\n  - operation: {path: /reindex}\n    creditLimit: 10\n    resetSeconds: 1\n    label: reindex\n  - operation: {path: /both}\n    label: both\n    limits:\n      - {creditLimit: 1, resetSeconds: 1, label: both-key}\n      - {creditLimit: 2, resetSeconds: 1}\ndefault: {creditLimit: 0}\n";

    fn check(governors: &str) -> Result<Vec<super::GovernorSpec>, String> {
        parse_str(
            &format!("{RULES}governors:\n{governors}"),
            Format::Yaml,
            "p.yaml",
        )
        .map(|p| p.governors)
        .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_the_example() {
        let g = check("  - {rule: reindex, query: 'max(load)', setpoint: 2, max: 500}\n").unwrap();
        assert_eq!(g.len(), 1);
        let g = &g[0];
        let t = g.tuning;
        assert_eq!((t.kp, t.ki, t.kd), super::DEFAULT_GAINS);
        assert_eq!(
            (t.min, g.every, t.fallback_after),
            (0.0, super::DEFAULT_EVERY, 6)
        );
        assert_eq!(t.breaker_above, None);
        let g = check("  - {rule: both-key, query: x, setpoint: 2, max: 5, every: 500ms, breaker: {above: 6}, prometheus: 'http://p:9090'}\n").unwrap();
        assert_eq!(g[0].every, std::time::Duration::from_millis(500));
        assert_eq!(g[0].tuning.breaker_above, Some(6.0));
    }

    #[test]
    fn each_problem_is_named() {
        let e = check("  - {rule: both, query: x, setpoint: 2, max: 5}\n  - {rule: reindex, query: x, setpoint: 2, max: 5}\n  - {rule: reindex, query: x, setpoint: 2, max: 5}\n").unwrap_err();
        assert!(e.contains("rule `both` has 2 limits"), "{e}");
        assert!(
            e.contains("governor #3 (rule reindex): `reindex` already has a governor"),
            "{e}"
        );
        let e = check(
            "  - {rule: reindex, query: x, setpoint: 2, max: 5, ki: -1, every: 50ms, kp: .nan}\n",
        )
        .unwrap_err();
        assert!(e.contains("`ki` must not be negative"), "{e}");
        assert!(
            e.contains("`every` must be a duration of at least 100ms"),
            "{e}"
        );
        assert!(e.contains("`kp` must be a finite number"), "{e}");
        let e = check("  - {rule: reindex, query: x, setpoint: 2, max: 5, breaker: {above: 2}}\n")
            .unwrap_err();
        assert!(
            e.contains("`breaker.above` (2) must be above the setpoint (2)"),
            "{e}"
        );
        let e = check("  - {rule: reindex, query: x, setpoint: 2}\n").unwrap_err();
        assert!(e.contains("`max` is required"), "{e}");
        let e =
            check("  - {rule: reindex, query: x, setpoint: 2, max: 5, colour: red}\n").unwrap_err();
        assert!(e.contains("colour"), "{e}");
    }
}
