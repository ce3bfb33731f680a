//! `divvy replay`: recorded traffic decided again, in process, by one
//! policy or by two side by side, on a simulated clock set to each
//! request's recorded time (the memory store, nothing reaches a service's
//! metrics). What it reports is [`report::Report`]: per rule, what each
//! policy allowed and denied, and the first requests whose decision changed.

pub mod report;
pub mod traffic;

use std::io::BufRead;
use std::sync::Arc;

use crate::clock::SimulatedClock;
use crate::config::Policy;
use crate::knobs::Knobs;
use crate::limiter::{Descriptor, Limiter, Request, Verdict};
use crate::observe::telemetry::Telemetry;
use crate::rules::RuleSet;
use crate::store::{MemoryStore, StoreError};
use report::{Fate, Report};
use traffic::{Asked, Recorded};

/// Why a replay stopped (a malformed line does not stop it: it is skipped).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The traffic could not be read.
    #[error("reading the traffic: {0}")]
    Read(#[from] std::io::Error),
    /// The in-process memory store failed (it does not, short of a bug).
    #[error("the simulated store failed: {0}")]
    Store(#[from] StoreError),
}

/// One policy with a limiter, store and clock of its own.
struct Side {
    limiter: Limiter,
    clock: Arc<SimulatedClock>,
}

impl Side {
    fn new(policy: Policy) -> Side {
        let clock = Arc::new(SimulatedClock::default());
        let telemetry = Telemetry::detached(clock.clone());
        let store = MemoryStore::build(clock.clone(), None, telemetry.metrics.clone());
        let knobs = Arc::new(Knobs::local(telemetry.metrics.clone()));
        let limiter = Limiter::build(RuleSet::new(policy), Arc::new(store), knobs, telemetry);
        Side { limiter, clock }
    }

    /// Each descriptor's deciding rule and fate, as the server would have
    /// decided the request at its recorded time.
    async fn decide(&self, r: &Recorded) -> Result<Vec<(String, Fate)>, StoreError> {
        if let Some(ms) = r.at_ms {
            self.clock.set(ms);
        }
        let verdict = match &r.request {
            Asked::Line(hit) => {
                let hits = std::slice::from_ref(hit);
                self.limiter.decide(&Request::line(hits)).await?
            }
            Asked::Envoy { domain, hits } => {
                let ds: Vec<Descriptor> = hits.iter().map(Descriptor::of_hit).collect();
                self.limiter.decide(&Request::envoy(domain, &ds)).await?
            }
        };
        Ok(fates(&r.request, verdict))
    }
}

/// Names and fates of a verdict's descriptors.
fn fates(asked: &Asked, verdict: Verdict) -> Vec<(String, Fate)> {
    let fate = |allowed: bool| if allowed { Fate::Allowed } else { Fate::Denied };
    match verdict {
        Verdict::Divvy(d) => d
            .items
            .iter()
            .map(|i| {
                let f = if i.shadow_denied {
                    Fate::Shadow
                } else {
                    fate(i.decider.allowed)
                };
                (d.rule(&i.decider).name().to_owned(), f)
            })
            .collect(),
        Verdict::Envoy(statuses) => {
            let domain = match asked {
                Asked::Envoy { domain, .. } => domain.as_str(),
                Asked::Line(_) => "",
            };
            let name = format!("envoyproxy/ratelimit domain {domain}");
            statuses
                .iter()
                .map(|s| (name.clone(), fate(!s.over)))
                .collect()
        }
        Verdict::NoRules | Verdict::NoConfig => vec![("(no limit)".to_owned(), Fate::Allowed)],
    }
}

/// Replays `traffic` under `new` (and `old`, side by side), keeping the
/// first `examples` changed decisions and malformed lines.
pub async fn replay(
    traffic: impl BufRead,
    new: Policy,
    old: Option<Policy>,
    examples: usize,
) -> Result<Report, ReplayError> {
    let new = Side::new(new);
    let old = old.map(Side::new);
    let mut report = Report::new(old.is_some(), examples);
    // Decoding and validating a line counts nothing anywhere.
    let scratch = crate::observe::metrics::Metrics::new();
    for (i, line) in traffic.lines().enumerate() {
        let number = i + 1;
        let line = line?;
        let recorded = match traffic::parse_line(&line, &scratch) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                report.malformed(number, e.to_string());
                continue;
            }
        };
        let under_new = new.decide(&recorded).await?;
        let under_old = match &old {
            Some(side) => Some(side.decide(&recorded).await?),
            None => None,
        };
        report.add(
            number,
            &line,
            recorded.at_ms,
            &under_new,
            under_old.as_deref(),
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
