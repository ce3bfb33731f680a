//! The hub on an injected clock: allocation across streams, TTLs and
//! renewals, pushes on a knob change, abandons after a reload.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::sync::mpsc;

use super::hub::Outbound;
use super::{Hub, RlqsError, RlqsSettings};
use crate::clock::ManualClock;
use crate::config::{no_policy, parse_str, Format};
use crate::knobs::{Knob, Knobs};
use crate::limiter::Limiter;
use crate::rules::RuleSet;
use crate::store::MemoryStore;

const POLICY: &str = r#"
overrides:
  - operation: {user: zero}
    creditLimit: 0
  - operation: {user: "*"}
    label: per-user
    actorField: user
    creditLimit: 20
    resetSeconds: 1
    algorithm: token_bucket
  - operation: {team: "*"}
    actorField: team
    creditLimit: 600
    resetSeconds: 60
default: {creditLimit: 1, resetSeconds: 0}
"#;

struct Setup {
    hub: Hub,
    clock: Arc<ManualClock>,
    knobs: Arc<Knobs>,
    limiter: Arc<Limiter>,
}

fn setup(max_buckets: usize) -> Setup {
    let policy = parse_str(POLICY, Format::Yaml, "t.yaml").unwrap();
    let knobs = Arc::new(Knobs::local(Arc::new(
        crate::observe::metrics::Metrics::new(),
    )));
    let limiter = Arc::new(Limiter::with_knobs(
        RuleSet::new(policy),
        Arc::new(MemoryStore::new()),
        knobs.clone(),
    ));
    let clock = Arc::new(ManualClock::default());
    let settings = RlqsSettings {
        assignment_ttl: Duration::from_secs(10),
        max_buckets_per_stream: max_buckets,
    };
    Setup {
        hub: Hub::new(limiter.clone(), settings, clock.clone()),
        clock,
        knobs,
        limiter,
    }
}

fn open(hub: &Hub) -> (u64, mpsc::Receiver<Outbound>) {
    let (tx, rx) = mpsc::channel(64);
    (hub.open("test".into(), tx), rx)
}

fn usage(pairs: &[(&str, &str)], secs: i64, allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }),
        time_elapsed: Some(PbDuration {
            seconds: secs,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn report(hub: &Hub, id: u64, usages: Vec<BucketQuotaUsage>) -> Result<(), RlqsError> {
    hub.report(
        id,
        RateLimitQuotaUsageReports {
            domain: "d".into(),
            bucket_quota_usages: usages,
        },
    )
}

/// [`report`], then the recompute the allocation task would run next.
fn report_tick(hub: &Hub, id: u64, usages: Vec<BucketQuotaUsage>) {
    report(hub, id, usages).unwrap();
    hub.tick();
}

/// What a bucket was told, simplified: a rate (token bucket), "allow",
/// "deny" or "abandon".
#[derive(Debug, Clone, PartialEq)]
enum Told {
    Rate {
        per_second: f64,
        burst: u32,
        ttl: i64,
    },
    Allow,
    Deny,
    Abandon,
}

/// Every action received so far, by bucket (`user` or `team` value), last wins.
fn received(rx: &mut mpsc::Receiver<Outbound>) -> HashMap<String, Told> {
    let mut out = HashMap::new();
    while let Ok(message) = rx.try_recv() {
        for a in message.unwrap().bucket_action {
            let id = a.bucket_id.unwrap().bucket;
            let name = id.values().next().cloned().unwrap_or_default();
            let told = match a.bucket_action.unwrap() {
                Action::AbandonAction(_) => Told::Abandon,
                Action::QuotaAssignmentAction(q) => {
                    let ttl = q.assignment_time_to_live.unwrap().seconds;
                    match q.rate_limit_strategy.unwrap().strategy.unwrap() {
                        Strategy::TokenBucket(tb) => Told::Rate {
                            per_second: f64::from(tb.tokens_per_fill.unwrap().value)
                                / tb.fill_interval.unwrap().seconds as f64,
                            burst: tb.max_tokens,
                            ttl,
                        },
                        Strategy::BlanketRule(r) if r == BlanketRule::DenyAll as i32 => Told::Deny,
                        _ => Told::Allow,
                    }
                }
            };
            out.insert(name, told);
        }
    }
    out
}

fn rate(told: Option<&Told>) -> f64 {
    match told {
        Some(Told::Rate { per_second, .. }) => *per_second,
        other => panic!("not a token bucket: {other:?}"),
    }
}

#[test]
fn two_streams_share_a_users_rate_by_demand_and_others_are_apart() {
    let s = setup(100);
    let (one, mut rx1) = open(&s.hub);
    let (two, mut rx2) = open(&s.hub);
    report_tick(&s.hub, one, vec![usage(&[("user", "a")], 0, 1, 0)]);
    // Alone, the first stream may take the whole rate.
    let told = received(&mut rx1);
    assert_eq!(
        told.get("a"),
        Some(&Told::Rate {
            per_second: 20.0,
            burst: 20,
            ttl: 10
        })
    );
    report_tick(&s.hub, two, vec![usage(&[("user", "a")], 0, 1, 0)]);
    // The first is pushed its half at once; the second gets the other half.
    assert_eq!(rate(received(&mut rx1).get("a")), 10.0);
    assert_eq!(rate(received(&mut rx2).get("a")), 10.0);
    // Demand shifts: 5/s through one, 50/s through two.
    s.clock.advance(Duration::from_secs(5));
    report_tick(&s.hub, one, vec![usage(&[("user", "a")], 5, 25, 0)]);
    report_tick(&s.hub, two, vec![usage(&[("user", "a")], 5, 50, 200)]);
    let (r1, r2) = (
        rate(received(&mut rx1).get("a")),
        rate(received(&mut rx2).get("a")),
    );
    assert!((5.4..=5.5).contains(&r1), "{r1}");
    assert!(r2 >= 13.0 && r1 + r2 <= 20.0, "{r1} + {r2}");
    // Another user, and a team limit given as a token bucket of its average rate.
    report_tick(
        &s.hub,
        one,
        vec![
            usage(&[("user", "b")], 0, 1, 0),
            usage(&[("team", "t")], 0, 1, 0),
        ],
    );
    let told = received(&mut rx1);
    assert_eq!(rate(told.get("b")), 20.0);
    assert_eq!(
        told.get("t"),
        Some(&Told::Rate {
            per_second: 10.0,
            burst: 600,
            ttl: 10
        })
    );
    // A stream that ends gives its share back at the next recompute.
    s.hub.close(two);
    s.clock.advance(Duration::from_secs(1));
    s.hub.tick();
    assert_eq!(rate(received(&mut rx1).get("a")), 20.0);
}

#[test]
fn assignments_are_renewed_before_their_ttl_and_silent_buckets_are_abandoned() {
    let s = setup(100);
    let (one, mut rx) = open(&s.hub);
    report_tick(&s.hub, one, vec![usage(&[("user", "a")], 0, 1, 0)]);
    assert!(received(&mut rx).contains_key("a"));
    // Nothing changed: nothing is sent until half the TTL has passed.
    s.clock.advance(Duration::from_secs(4));
    s.hub.tick();
    assert!(received(&mut rx).is_empty());
    s.clock.advance(Duration::from_secs(1));
    s.hub.tick();
    assert_eq!(rate(received(&mut rx).get("a")), 20.0);
    // A report is answered with the assignment (a renewal) even unchanged.
    s.clock.advance(Duration::from_secs(1));
    report(&s.hub, one, vec![usage(&[("user", "a")], 1, 0, 0)]).unwrap();
    assert!(
        received(&mut rx).contains_key("a"),
        "answered without a recompute"
    );
    // Not reported for twice the TTL: abandoned and forgotten.
    s.clock.advance(Duration::from_secs(21));
    s.hub.tick();
    assert_eq!(received(&mut rx).get("a"), Some(&Told::Abandon));
    assert!(s.hub.lock().streams[&one].buckets.is_empty());
}

#[tokio::test]
async fn a_stop_knob_pushes_deny_all_to_every_stream_and_its_removal_a_token_bucket() {
    let s = setup(100);
    let (one, mut rx1) = open(&s.hub);
    let (two, mut rx2) = open(&s.hub);
    report_tick(&s.hub, one, vec![usage(&[("user", "a")], 0, 1, 0)]);
    report_tick(&s.hub, two, vec![usage(&[("user", "a")], 0, 1, 0)]);
    received(&mut rx1);
    received(&mut rx2);
    let stop = Knob::credit_limit(0);
    s.knobs.set("per-user", stop).await.unwrap();
    s.hub.tick();
    assert_eq!(received(&mut rx1).get("a"), Some(&Told::Deny));
    assert_eq!(received(&mut rx2).get("a"), Some(&Told::Deny));
    s.knobs.delete("per-user").await.unwrap();
    s.hub.tick();
    assert_eq!(rate(received(&mut rx1).get("a")), 10.0);
    assert_eq!(rate(received(&mut rx2).get("a")), 10.0);
}

#[test]
fn blanket_rules_and_an_abandon_after_a_reload_that_leaves_no_rule() {
    let s = setup(100);
    let (one, mut rx) = open(&s.hub);
    report_tick(
        &s.hub,
        one,
        vec![
            usage(&[("user", "zero")], 0, 1, 0),
            usage(&[("path", "/free")], 0, 1, 0),
            usage(&[("user", "a")], 0, 1, 0),
        ],
    );
    let told = received(&mut rx);
    assert_eq!(told.get("zero"), Some(&Told::Deny));
    assert_eq!(told.get("/free"), Some(&Told::Allow));
    // A reload to no rules at all: no rule decides these buckets any more.
    s.limiter.install(RuleSet::new(no_policy().unwrap()));
    s.hub.tick();
    let told = received(&mut rx);
    assert_eq!(told.get("zero"), Some(&Told::Abandon));
    assert_eq!(told.get("a"), Some(&Told::Abandon));
    assert!(s.hub.lock().streams[&one].buckets.is_empty());
    // Reported again, such a bucket is allowed.
    report_tick(&s.hub, one, vec![usage(&[("user", "a")], 0, 1, 0)]);
    assert_eq!(received(&mut rx).get("a"), Some(&Told::Allow));
}

#[test]
fn buckets_past_the_bound_and_oversized_ids_are_refused() {
    let s = setup(10);
    let (one, mut rx) = open(&s.hub);
    let many: Vec<BucketQuotaUsage> = (0..1000)
        .map(|i| usage(&[("user", &format!("u{i}"))], 0, 1, 0))
        .collect();
    report_tick(&s.hub, one, many);
    assert_eq!(s.hub.lock().streams[&one].buckets.len(), 10);
    assert_eq!(received(&mut rx).len(), 10);
    let long = "x".repeat(2000);
    let err = report(&s.hub, one, vec![usage(&[("user", &long)], 0, 1, 0)]).unwrap_err();
    assert!(matches!(err, RlqsError::BucketIdTooLarge { .. }), "{err}");
    let err = report(&s.hub, one, vec![usage(&[], 0, 1, 0)]).unwrap_err();
    assert!(matches!(err, RlqsError::EmptyBucketId), "{err}");
    // The first message of a stream must name its domain.
    let (two, _rx2) = open(&s.hub);
    let err = s
        .hub
        .report(two, RateLimitQuotaUsageReports::default())
        .unwrap_err();
    assert!(matches!(err, RlqsError::NoDomain), "{err}");
}

#[test]
fn a_replica_asks_for_each_limit_counter_with_its_streams_summed_demand() {
    let s = setup(100);
    let (one, _rx1) = open(&s.hub);
    let (two, _rx2) = open(&s.hub);
    report_tick(&s.hub, one, vec![usage(&[("user", "a")], 0, 1, 0)]);
    report_tick(&s.hub, two, vec![usage(&[("user", "a")], 0, 1, 0)]);
    // Not measured yet: each bucket may want the whole rate.
    let asks = s.hub.asks();
    assert_eq!(asks.len(), 1, "{asks:?}");
    assert_eq!((asks[0].rate, asks[0].demand), (20.0, 40.0));
    s.clock.advance(Duration::from_secs(5));
    report_tick(&s.hub, one, vec![usage(&[("user", "a")], 5, 25, 0)]);
    report_tick(&s.hub, two, vec![usage(&[("user", "a")], 5, 50, 200)]);
    let asks = s.hub.asks();
    assert!((asks[0].demand - 55.0).abs() < 1e-9, "{asks:?}");
    // Blanket rules and unlimited buckets ask for nothing.
    report_tick(
        &s.hub,
        one,
        vec![
            usage(&[("user", "zero")], 0, 1, 0),
            usage(&[("other", "x")], 0, 1, 0),
        ],
    );
    assert_eq!(s.hub.asks().len(), 1);
}
