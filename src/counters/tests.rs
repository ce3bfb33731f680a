//! Finding the counters of a rule and an actor.

use std::sync::Arc;

use super::*;
use crate::config::{parse_str, Format};
use crate::observe::metrics::Metrics;

const POLICY: &str = r#"
overrides:
  - operation: {path: "/api/*"}
    label: api
    creditLimit: 3
    resetSeconds: 1h
    actorField: user
  - operation: {path: /multi}
    label: multi
    limits:
      - {label: multi-user, creditLimit: 5, resetSeconds: 60, actorField: user}
      - {creditLimit: 100, resetSeconds: 1h}
  - operation: {path: /off}
    label: off
    creditLimit: 0
    resetSeconds: 60
default: {creditLimit: 2, resetSeconds: 30}
"#;

fn rules() -> RuleSet {
    RuleSet::new(parse_str(POLICY, Format::Yaml, "test.yaml").unwrap())
}

fn knobs() -> Knobs {
    Knobs::local(Arc::new(Metrics::new()))
}

fn find_q(query: &str) -> Result<Vec<Target>, QueryError> {
    find(&rules(), &knobs(), &CounterQuery::parse(query)?)
}

#[test]
fn a_rule_and_an_actor_name_the_counter_the_limiter_charges() {
    let set = rules();
    let found = find_q("rule=api&actor=alice").unwrap();
    assert_eq!(found.len(), 1);
    let op = found[0].op.as_ref().unwrap();
    // The key a HIT of alice on /api/x is counted under.
    let hit = Operation::from_pairs([("path", "/api/x"), ("user", "alice")]);
    let plan = set.plan(None, &hit);
    let rule = set.rule(plan.decider);
    let expected = rule.counter_key(&hit, &rule.spec.limits[0]);
    assert_eq!(op.key, expected);
    assert_eq!((op.limit, found[0].rule.as_str()), (3, "api"));
    // The actor field named directly is the same counter.
    assert_eq!(find_q("rule=api&user=alice").unwrap()[0].op, found[0].op);
}

#[test]
fn a_rule_with_limits_lists_each_and_a_limit_label_names_one() {
    let all = find_q("rule=multi&actor=bob").unwrap();
    assert_eq!(all.len(), 2);
    assert_ne!(
        all[0].op.as_ref().unwrap().key,
        all[1].op.as_ref().unwrap().key
    );
    let one = find_q("rule=multi-user&actor=bob").unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].op, all[0].op);
    assert_eq!(one[0].limit_label.as_deref(), Some("multi-user"));
    // A rule without a label is named by its text.
    let set = rules();
    let default = set.rules().iter().find(|r| r.spec.label.is_none()).unwrap();
    let query = CounterQuery {
        rule: default.name().to_owned(),
        actor: None,
        fields: Vec::new(),
    };
    assert_eq!(
        find(&set, &knobs(), &query).unwrap()[0]
            .op
            .as_ref()
            .unwrap()
            .limit,
        2
    );
    // A limit without a counter is listed without one.
    assert!(find_q("rule=off").unwrap()[0].op.is_none());
}

#[test]
fn malformed_queries_are_refused_with_what_to_do() {
    assert_eq!(find_q("actor=a").unwrap_err(), QueryError::MissingRule);
    assert_eq!(find_q("rule=").unwrap_err(), QueryError::Repeated("rule"));
    assert_eq!(
        find_q("rule=api&actor=a&actor=b").unwrap_err(),
        QueryError::Repeated("actor")
    );
    assert_eq!(
        find_q("rule=nope&actor=a").unwrap_err(),
        QueryError::UnknownRule("nope".into())
    );
    assert_eq!(
        find_q("rule=api").unwrap_err(),
        QueryError::MissingActor {
            rule: "api".into(),
            field: "user".into()
        }
    );
    assert_eq!(
        find_q("rule=off&actor=a").unwrap_err(),
        QueryError::NoActorField("off".into())
    );
}
