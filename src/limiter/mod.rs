//! Decides requests: the one core every protocol calls.
//!
//! [`Limiter::decide`] takes a [`Request`] (its descriptors, domain and
//! deadline), picks the engine that decides its domain (the divvy rules or
//! an envoyproxy/ratelimit tree), lets it plan the counter ops, sends them
//! to the store in a single call, lets the engine turn the answer into a
//! [`Verdict`], and records the outcome in one step shared by every engine.
//! Protocol adapters only translate in and out.

mod bucket;
pub mod debtors;
mod divvy;
mod engine;
pub mod envoy;
mod outcome;
mod plan;
mod record;
mod request;

pub use bucket::{BucketLimit, BucketRate};
pub use outcome::{Decision, Decisions, LimitOutcome, Outcome, Reset, Verdict};
pub use request::{Caller, Descriptor, Entries, Hit, Items, LimitOverride, Request};

pub use plan::{counter_op, knob_for};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::observe::telemetry::Telemetry;

use crate::fair::FairShares;
use crate::global::Global;
use crate::knobs::Knobs;
use crate::reuse;
use crate::rules::RuleSet;
use crate::store::{Charge, CounterOp, CounterState, Store, StoreError};

use divvy::DivvyRules;
use engine::{Choice, Engine};
use envoy::{EnvoySettings, Tree};

/// The rate limiter: the current rule set, the knobs in force, the region's
/// global leases, envoyproxy/ratelimit's settings and a counter store.
pub struct Limiter {
    rules: ArcSwap<RuleSet>,
    store: Arc<dyn Store>,
    knobs: Arc<Knobs>,
    global: Option<Arc<Global>>,
    fair: Arc<FairShares>,
    envoy: Arc<EnvoySettings>,
    telemetry: Telemetry,
    debtors: debtors::Debtors,
    /// Set while the xDS control plane's first configuration is awaited.
    xds_pending: AtomicBool,
}

impl Limiter {
    /// A limiter over `rules` and `store`, with knobs of its own.
    pub fn new(rules: RuleSet, store: Arc<dyn Store>) -> Limiter {
        let telemetry = Telemetry::system();
        let knobs = Arc::new(Knobs::local(telemetry.metrics.clone()));
        Limiter::build(rules, store, knobs, telemetry)
    }

    /// A limiter over `rules` and `store` that applies `knobs`, recording
    /// to metrics and a dashboard of its own.
    pub fn with_knobs(rules: RuleSet, store: Arc<dyn Store>, knobs: Arc<Knobs>) -> Limiter {
        Limiter::build(rules, store, knobs, Telemetry::system())
    }

    /// A limiter over `rules` and `store` that applies `knobs` and records
    /// every decision to `telemetry`.
    pub fn build(
        mut rules: RuleSet,
        store: Arc<dyn Store>,
        knobs: Arc<Knobs>,
        telemetry: Telemetry,
    ) -> Limiter {
        rules.attach(&telemetry);
        let clock = Arc::new(crate::clock::SystemClock::default());
        let fair = FairShares::new(clock, telemetry.metrics.fair.clone(), None);
        Limiter {
            rules: ArcSwap::from_pointee(rules),
            store,
            knobs,
            global: None,
            fair: Arc::new(fair),
            envoy: Arc::new(EnvoySettings::default()),
            telemetry,
            debtors: debtors::Debtors::default(),
            xds_pending: AtomicBool::new(false),
        }
    }

    /// Counts `scope: global` limits against this region's leases of them
    /// (without, a global limit is counted as a local token bucket: this
    /// process is the whole world).
    pub fn with_global(mut self, global: Arc<Global>) -> Limiter {
        self.global = Some(global);
        self
    }

    /// Keeps fair shares in `fair` (one that exchanges demands with the
    /// other replicas; without, this process's own).
    pub fn with_fair(mut self, fair: Arc<FairShares>) -> Limiter {
        self.fair = fair;
        self
    }

    /// The fair shares of `fairShare` limits.
    pub fn fair(&self) -> &Arc<FairShares> {
        &self.fair
    }

    /// The counters each rule's overdraft limits last charged past what was left.
    pub fn debtors(&self) -> &debtors::Debtors {
        &self.debtors
    }

    /// Decides envoyproxy/ratelimit domains under `settings` (built once at
    /// start; without, that project's defaults).
    pub fn with_envoy(mut self, settings: Arc<EnvoySettings>) -> Limiter {
        self.envoy = settings;
        self
    }

    /// The region's global leases, if global limits are coordinated.
    pub fn global(&self) -> Option<&Arc<Global>> {
        self.global.as_ref()
    }

    /// The knobs in force.
    pub fn knobs(&self) -> &Arc<Knobs> {
        &self.knobs
    }

    /// envoyproxy/ratelimit's settings.
    pub fn envoy(&self) -> &Arc<EnvoySettings> {
        &self.envoy
    }

    /// Marks the xDS control plane's first configuration as awaited (or,
    /// `false`, as installed): until then the xDS domains are missing, and
    /// readiness says so.
    pub fn set_xds_pending(&self, pending: bool) {
        self.xds_pending.store(pending, Ordering::Release);
    }

    /// Whether the xDS control plane's first configuration is still awaited.
    pub fn xds_pending(&self) -> bool {
        self.xds_pending.load(Ordering::Acquire)
    }

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Installs a new rule set in one atomic step; requests in flight finish on the old one.
    pub fn install(&self, mut rules: RuleSet) {
        rules.attach(&self.telemetry);
        self.rules.store(Arc::new(rules));
    }

    /// Where decisions are recorded.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// The counter store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Decides and charges every descriptor of one request, in order, with
    /// one store call, by whichever engine the rule set in force gives its
    /// domain. Divvy rules charge each rule's limits together or not at
    /// all, and under the policy's `charge: all-or-nothing` nothing is
    /// charged when any descriptor is denied (a line connection's HITs are
    /// each charged on their own).
    pub async fn decide(&self, request: &Request<'_>) -> Result<Verdict, StoreError> {
        let rules = self.rules();
        match Choice::of(&rules, request.domain) {
            Choice::Tree(tree) => self.run(&rules, &self.tree(tree), request).await,
            Choice::Divvy => self.run(&rules, &self.divvy(&rules), request).await,
            Choice::NoRules => Ok(Verdict::NoRules),
            Choice::NoConfig => Ok(Verdict::NoConfig),
        }
    }

    fn divvy<'a>(&'a self, rules: &'a Arc<RuleSet>) -> DivvyRules<'a> {
        DivvyRules {
            rules,
            knobs: &self.knobs,
            global: self.global.as_deref(),
            fair: &self.fair,
            metrics: &self.telemetry.metrics,
            debtors: &self.debtors,
        }
    }

    fn tree<'a>(&'a self, tree: &'a crate::rules::descriptor_tree::DomainTree) -> Tree<'a> {
        Tree {
            tree,
            settings: &self.envoy,
        }
    }

    /// The pipeline every engine runs: plan, one store call, finish, record.
    /// The clock is read twice: once at the start (the store's "now" and
    /// the start of both timings) and once when the store answers.
    async fn run<'r, E: Engine<'r>>(
        &self,
        rules: &RuleSet,
        engine: &E,
        request: &Request<'r>,
    ) -> Result<Verdict, StoreError> {
        let started = Instant::now();
        let mut ops = reuse::take(&OPS);
        let (plan, charge) = engine.plan(request, &mut ops);
        // The store's answer ends the decision's time too (what follows is
        // bookkeeping); without a store call, the time is read at the end.
        let (states, decided) = if ops.is_empty() {
            (Vec::new(), None)
        } else {
            let (states, answered) = self.apply(&ops, charge, request.deadline, started).await?;
            (states, Some(answered))
        };
        let mut tallies = reuse::take(&TALLIES);
        let verdict = engine.finish(plan, &mut ops, &states, &mut tallies);
        let decided = decided.unwrap_or_else(|| {
            let at = Instant::now();
            (at, at.saturating_duration_since(started))
        });
        record::record(
            &self.telemetry,
            rules,
            &tallies,
            decided,
            request.items.len(),
        );
        crate::store::keep_states(states);
        reuse::keep(&OPS, ops);
        reuse::keep(&TALLIES, tallies);
        Ok(verdict)
    }

    /// The one store call of a request begun at `started`, timed from then
    /// (the plan before it is a fraction of a microsecond); one state per
    /// op, and when the store answered with the time since `started`.
    async fn apply(
        &self,
        ops: &[CounterOp],
        charge: Charge,
        deadline: Option<tokio::time::Instant>,
        started: Instant,
    ) -> Result<(Vec<CounterState>, (Instant, Duration)), StoreError> {
        // The memory store answers at once: no boxed future per call.
        let applied = match self.store.apply_ready(ops, charge, started) {
            Some(applied) => applied,
            None => self.store.apply_by(ops, charge, deadline).await,
        };
        let answered = Instant::now();
        let took = answered.saturating_duration_since(started);
        let store = &self.telemetry.metrics.store;
        store.duration.observe(took.as_secs_f64());
        let states = applied.inspect_err(|_| store.errors.inc())?;
        Ok((
            crate::store::answered_all(states, ops.len())?,
            (answered, took),
        ))
    }
}

thread_local! {
    /// A decision's ops and tallies, kept for the thread's next (see [`crate::reuse`]).
    static OPS: std::cell::Cell<Vec<CounterOp>> = const { std::cell::Cell::new(Vec::new()) };
    static TALLIES: std::cell::Cell<Vec<record::Tally>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
mod fair_tests;
#[cfg(test)]
mod shadow_tests;
#[cfg(test)]
mod tests;
