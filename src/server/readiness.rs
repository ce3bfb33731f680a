//! Whether this replica can answer: what `/readyz`, `/healthcheck` and the
//! gRPC health of the rate-limit service report.
//!
//! A failing counter store does not make a replica unready: its failure
//! policy still decides every request, and taking every replica out of the
//! Service at once (they all share the store) would turn those answers into
//! connection errors. Unready means it cannot answer at all: shutting down,
//! (in `ratelimit` mode) no configuration loaded yet, or (with `--xds`) the
//! control plane's first configuration not yet installed, so its domains
//! would be answered without their limits.

use crate::limiter::Limiter;

/// What readiness follows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Readiness {
    /// Unready while the counter store fails (`--ready-requires-store`).
    pub requires_store: bool,
    /// Unready until a configuration is loaded (`ratelimit` mode, which
    /// answers an error without one).
    pub needs_config: bool,
}

/// Ready or not, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Answers from the store and the rules.
    Ready,
    /// Answers, but not all from the store: the note says what decides.
    Degraded(String),
    /// Cannot answer: the reason.
    NotReady(String),
}

impl Verdict {
    /// Whether the replica should receive traffic.
    pub fn is_ready(&self) -> bool {
        !matches!(self, Verdict::NotReady(_))
    }
}

impl Readiness {
    /// The verdict for `limiter` now (`shutting_down`: a shutdown signal came).
    pub fn check(&self, limiter: &Limiter, shutting_down: bool) -> Verdict {
        if shutting_down {
            return Verdict::NotReady("shutting down".into());
        }
        if self.needs_config && limiter.rules().source().is_empty() {
            return Verdict::NotReady("no rate-limit configuration loaded".into());
        }
        if limiter.xds_pending() {
            return Verdict::NotReady(
                "waiting for the first configuration from the xDS control plane".into(),
            );
        }
        let store = limiter.store();
        if !store.ready() {
            let why = format!(
                "the {} counter store is failing; the failure policy decides",
                store.name()
            );
            return if self.requires_store {
                Verdict::NotReady(why)
            } else {
                Verdict::Degraded(why)
            };
        }
        match limiter.global() {
            Some(g) if g.in_fallback() => Verdict::Degraded(
                "global store unreachable: global limits decide on conservative quotas \
                 (a share of the last lease for a bounded time, then the floor)"
                    .into(),
            ),
            _ => Verdict::Ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleSet;
    use crate::store::MemoryStore;
    use std::sync::Arc;

    fn limiter(policy: &str) -> Limiter {
        let policy = crate::config::parse_str(policy, crate::config::Format::Yaml, "test.yaml")
            .expect("policy");
        Limiter::new(RuleSet::new(policy), Arc::new(MemoryStore::new()))
    }

    #[test]
    fn shutting_down_and_no_config_are_unready() {
        let l = limiter("default: {creditLimit: 1, resetSeconds: 60}");
        let r = Readiness::default();
        assert_eq!(r.check(&l, false), Verdict::Ready);
        assert!(!r.check(&l, true).is_ready());
        let empty = Limiter::new(
            RuleSet::new(crate::config::no_policy().expect("no policy")),
            Arc::new(MemoryStore::new()),
        );
        assert!(Readiness::default().check(&empty, false).is_ready());
        let needs = Readiness {
            needs_config: true,
            ..Readiness::default()
        };
        assert_eq!(
            needs.check(&empty, false),
            Verdict::NotReady("no rate-limit configuration loaded".into())
        );
        assert_eq!(needs.check(&l, false), Verdict::Ready);
    }

    /// A failing store leaves the replica ready (its failure policy
    /// answers), unless readiness is told to require the store.
    #[test]
    fn a_failing_store_is_degraded_not_unready() {
        use crate::store::failover::{FailoverStore, FailurePolicy};
        let policy = crate::config::parse_str(
            "default: {creditLimit: 1, resetSeconds: 60}",
            crate::config::Format::Yaml,
            "test.yaml",
        )
        .expect("policy");
        let failed = FailoverStore::new(
            Arc::new(MemoryStore::new()),
            FailurePolicy::Local,
            0.5,
            Arc::new(crate::observe::metrics::Metrics::new()),
        )
        .start_failed();
        let l = Limiter::new(RuleSet::new(policy), Arc::new(failed));
        let verdict = Readiness::default().check(&l, false);
        assert!(verdict.is_ready());
        assert!(
            matches!(&verdict, Verdict::Degraded(why) if why.contains("failure policy decides"))
        );
        let strict = Readiness {
            requires_store: true,
            ..Readiness::default()
        };
        assert!(!strict.check(&l, false).is_ready());
    }
}
