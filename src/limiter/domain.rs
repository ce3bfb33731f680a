//! The one entry point for a domain's request (Envoy's ShouldRateLimit,
//! `POST /json`): the limiter, not the protocol adapter, knows whether an
//! envoyproxy/ratelimit file or the divvy rules decide a domain.

use crate::config::envoy_ratelimit::EnvoyUnit;
use crate::rules::Operation;
use crate::store::StoreError;

use super::envoy::{EnvoySettings, EnvoyStatus};
use super::{Decisions, Hit, LimitOverride, Limiter};

/// One descriptor of a domain's request, in no protocol's shape: its
/// entries in order, borrowed from the request, and what it asks besides.
#[derive(Debug, Clone)]
pub struct Descriptor<'a> {
    /// Key/value entries in request order (a repeated key: the last wins
    /// for divvy rules; envoyproxy/ratelimit trees walk them in order).
    pub entries: Vec<(&'a str, &'a str)>,
    /// Hits to add; 0 checks without consuming.
    pub cost: u64,
    /// Give `cost` back instead of taking it.
    pub refund: bool,
    /// A limit to use instead of the rule's or the file's.
    pub limit_override: Option<LimitOverride>,
}

impl Descriptor<'_> {
    /// The descriptor as a divvy-rules hit (its entries copied into one
    /// operation string).
    pub fn hit(&self) -> Hit {
        Hit {
            operation: Operation::from_pairs(self.entries.iter().copied()),
            cost: self.cost,
            refund: self.refund,
            limit_override: self.limit_override,
        }
    }

    /// The override as envoyproxy/ratelimit reads it: requests per unit and
    /// the unit. A window that is no Envoy unit cannot come from Envoy and
    /// is no override there.
    pub fn envoy_override(&self) -> Option<(u32, EnvoyUnit)> {
        let o = self.limit_override?;
        let unit = EnvoyUnit::of_seconds(o.reset_seconds)?;
        Some((u32::try_from(o.credit_limit).unwrap_or(u32::MAX), unit))
    }
}

/// How a domain's request was decided, for its adapter to format.
#[derive(Debug)]
pub enum Verdict {
    /// By the divvy rules.
    Divvy(Decisions),
    /// By the envoyproxy/ratelimit file that defines the domain: one status
    /// per descriptor.
    Envoy(Vec<EnvoyStatus>),
    /// No file defines the domain and no divvy rules are loaded: no limit.
    NoRules,
    /// No configuration was loaded at all (no policy file, no xDS update yet).
    NoConfig,
}

impl Limiter {
    /// Decides every descriptor of one request of `domain`, with one store
    /// call, by whichever engine the rule set in force gives the domain.
    /// The store is waited for until `deadline` at most (then the failure
    /// policy decides).
    pub async fn should_rate_limit(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        envoy: &EnvoySettings,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Verdict, StoreError> {
        let rules = self.rules();
        if let Some(tree) = rules.envoy_domain(domain) {
            let statuses = self.check_envoy(tree, descriptors, envoy, deadline).await?;
            return Ok(Verdict::Envoy(statuses));
        }
        if !rules.has_divvy_rules() {
            if rules.source().is_empty() {
                return Ok(Verdict::NoConfig);
            }
            return Ok(Verdict::NoRules);
        }
        let hits: Vec<Hit> = descriptors.iter().map(Descriptor::hit).collect();
        let decisions = self
            .decide(rules, Some(domain), &hits, false, deadline)
            .await?;
        Ok(Verdict::Divvy(decisions))
    }
}
