//! What a bucket is told, and how a limit's rate is divided among the
//! streams that report it (the fair-share arithmetic of [`crate::quota`]).

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

use crate::quota::{grant, targets, Sharing};

/// The smallest share of a stream with demand, as a fraction of the rate
/// (as global quotas' default floor).
pub const FLOOR: f64 = 0.01;
/// Room above a stream's measured demand, as a fraction of it.
pub const HEADROOM: f64 = 0.1;
/// A live share within this fraction of its new target is kept: Envoy
/// refills a token bucket it is given anew, so needless changes cost a burst.
pub const HYSTERESIS: f64 = 0.1;

/// What a bucket is told to enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// Every request allowed.
    AllowAll,
    /// Every request denied.
    DenyAll,
    /// A token bucket: `tokens_per_fill` every `fill_interval_secs`, holding
    /// at most `max_tokens`.
    TokenBucket {
        /// Capacity.
        max_tokens: u32,
        /// Tokens added per interval.
        tokens_per_fill: u32,
        /// The interval, in whole seconds (Envoy's filter reads whole seconds).
        fill_interval_secs: u32,
    },
}

impl Assignment {
    /// The `divvy_rlqs_assignments_total` kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Assignment::AllowAll => "allow_all",
            Assignment::DenyAll => "deny_all",
            Assignment::TokenBucket { .. } => "token_bucket",
        }
    }

    /// The token bucket of `rate` per second and `burst`. The fill interval
    /// is the shortest whole number of seconds that counts the rate to 1 %,
    /// and tokens are rounded down, so shares never add up past the rate.
    pub fn token_bucket(rate: f64, burst: f64) -> Assignment {
        let rate = rate.max(0.0);
        let secs = if rate > 0.0 {
            (100.0 / rate).ceil().clamp(1.0, 86_400.0)
        } else {
            86_400.0
        };
        let tokens = (rate * secs + 1e-9).floor().clamp(1.0, f64::from(u32::MAX));
        Assignment::TokenBucket {
            max_tokens: (burst + 1e-9).floor().clamp(1.0, f64::from(u32::MAX)) as u32,
            tokens_per_fill: tokens as u32,
            fill_interval_secs: secs as u32,
        }
    }

    /// Tokens per second (`None` for the blanket rules).
    pub fn rate(&self) -> Option<f64> {
        match self {
            Assignment::TokenBucket {
                tokens_per_fill,
                fill_interval_secs,
                ..
            } => Some(f64::from(*tokens_per_fill) / f64::from(*fill_interval_secs)),
            _ => None,
        }
    }

    /// The action telling a bucket this, valid for `ttl_secs`.
    pub fn action(&self, id: &[(String, String)], ttl_secs: u64) -> BucketAction {
        let strategy = match *self {
            Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_secs,
            } => Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(UInt32Value {
                    value: tokens_per_fill,
                }),
                fill_interval: Some(PbDuration {
                    seconds: i64::from(fill_interval_secs),
                    nanos: 0,
                }),
            }),
        };
        BucketAction {
            bucket_id: Some(bucket_id(id)),
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(PbDuration {
                    seconds: i64::try_from(ttl_secs).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })),
        }
    }
}

/// The action abandoning bucket `id`.
pub fn abandon(id: &[(String, String)]) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(id)),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

fn bucket_id(id: &[(String, String)]) -> BucketId {
    BucketId {
        bucket: id.iter().cloned().collect(),
    }
}

/// One stream's claim on a limit: its demand in credits per second (`None`
/// until a report measures it: it may want the whole rate) and the share
/// it holds now (0 for none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    /// Measured demand (allowed + denied per second).
    pub demand: Option<f64>,
    /// The live share.
    pub held: f64,
}

/// The new shares of `rate` for `claims`: max-min fair by demand with the
/// floor and headroom of global quotas. A share within [`HYSTERESIS`] of
/// its target is kept unless another claimant waits for share (holds less
/// than 0.9 × its target); shares that fall are applied before shares that
/// rise, and a rise takes only what the others leave, so the sum never
/// exceeds `rate`.
pub fn allocate(rate: f64, claims: &[Claim]) -> Vec<f64> {
    let sharing = Sharing {
        rate,
        floor: FLOOR,
        headroom: HEADROOM,
    };
    // An idle stream still wants its floor: its next request is served.
    let demands: Vec<f64> = claims
        .iter()
        .map(|c| c.demand.unwrap_or(rate).max(1e-9))
        .collect();
    let target = targets(&sharing, &demands);
    let sticky = |i: usize| {
        let held = claims[i].held;
        held > 0.0 && (target[i] - held).abs() <= HYSTERESIS * held.max(FLOOR * rate)
    };
    let wanted: Vec<f64> = (0..claims.len())
        .map(|i| if sticky(i) { claims[i].held } else { target[i] })
        .collect();
    let shares = settle(rate, claims, &wanted);
    let waiting = (0..claims.len()).any(|i| shares[i] < 0.9 * target[i]);
    if waiting {
        settle(rate, claims, &target)
    } else {
        shares
    }
}

/// Falls first, then rises capped by what the others hold.
fn settle(rate: f64, claims: &[Claim], wanted: &[f64]) -> Vec<f64> {
    let mut live: Vec<f64> = claims.iter().map(|c| c.held).collect();
    for (i, &w) in wanted.iter().enumerate() {
        if w <= live[i] {
            live[i] = w;
        }
    }
    for (i, &w) in wanted.iter().enumerate() {
        if w > live[i] {
            let others: f64 = live.iter().sum::<f64>() - live[i];
            live[i] = grant(rate, w, others);
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(demand: Option<f64>, held: f64) -> Claim {
        Claim { demand, held }
    }

    #[test]
    fn new_streams_split_the_rate_and_measured_demand_moves_it() {
        let s = allocate(20.0, &[claim(None, 0.0), claim(None, 0.0)]);
        assert!(
            (s[0] - 10.0).abs() < 1e-9 && (s[1] - 10.0).abs() < 1e-9,
            "{s:?}"
        );
        // Equal demand measured a little apart: the shares stay put.
        let s2 = allocate(20.0, &[claim(Some(30.4), s[0]), claim(Some(29.6), s[1])]);
        assert_eq!(s2, s);
        // 5/s and 50/s: the small one gets its demand and headroom, the rest goes on.
        let s3 = allocate(20.0, &[claim(Some(5.0), s[0]), claim(Some(50.0), s[1])]);
        assert!((s3[0] - 5.5).abs() < 1e-9, "{s3:?}");
        assert!((s3[1] - 14.5).abs() < 1e-9, "{s3:?}");
    }

    #[test]
    fn the_sum_never_exceeds_the_rate_and_a_newcomer_is_not_starved() {
        let held: Vec<Claim> = (0..10).map(|_| claim(Some(5.0), 2.0)).collect();
        let mut claims = held.clone();
        claims.push(claim(None, 0.0));
        let s = allocate(20.0, &claims);
        assert!(s.iter().sum::<f64>() <= 20.0 + 1e-9, "{s:?}");
        assert!(s[10] > 1.5, "{s:?}");
        // A stream that ends: the others take its share back.
        let s = allocate(20.0, &held[..2]);
        assert!((s.iter().sum::<f64>() - 20.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn token_buckets_count_whole_seconds_and_round_down() {
        assert_eq!(
            Assignment::token_bucket(10.0, 10.0),
            Assignment::TokenBucket {
                max_tokens: 10,
                tokens_per_fill: 100,
                fill_interval_secs: 10
            }
        );
        let tb = Assignment::token_bucket(20.0 / 3.0, 20.0 / 3.0);
        assert!(tb.rate().unwrap() <= 20.0 / 3.0, "{tb:?}");
        assert!(tb.rate().unwrap() > 0.99 * 20.0 / 3.0, "{tb:?}");
        let Assignment::TokenBucket { max_tokens, .. } = Assignment::token_bucket(1e6, 0.2) else {
            panic!()
        };
        assert_eq!(max_tokens, 1);
    }
}
