//! The service, built in the library: [`App::build`] wires the stores, the
//! rule sources, the background tasks and the three listeners from one
//! [`Settings`]; [`App::serve`] serves until its shutdown future completes.
//! `cli/` only maps flags and environment variables into `Settings`, so a
//! test can run the whole service in its own process.

mod listeners;
mod settings;
mod stores;

pub use settings::Settings;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

use crate::config::{ConfigError, Policy};
use crate::coord::Coordination;
use crate::fair::FairShares;
use crate::governor::Governors;
use crate::limiter::Limiter;
use crate::rules::RuleSet;
use crate::server::admin::AdminState;
use crate::server::readiness::Readiness;
use crate::sources::file::{load_with_hash, Reloader};
use crate::sources::{xds, zookeeper, RuleSources};
use listeners::Listeners;

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The policy could not be loaded.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A store could not be set up.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Redis's TLS files could not be loaded.
    #[error(transparent)]
    RedisTls(#[from] crate::store::redis_tls::RedisTlsError),
    /// A listener could not be bound.
    #[error("cannot listen for {what} on {addr}: {source}")]
    Bind {
        /// gRPC, the line protocol or HTTP.
        what: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A port's TLS files could not be served.
    #[error("cannot serve TLS on the {port} port: {source}")]
    Tls {
        /// grpc or http.
        port: &'static str,
        /// Why.
        source: crate::server::tls::TlsError,
    },
    /// A setting that cannot be served.
    #[error("{0}")]
    Setting(String),
    /// A server stopped with an error.
    #[error("{what} server failed: {message}")]
    Server {
        /// gRPC or HTTP.
        what: &'static str,
        /// Its error.
        message: String,
    },
}

/// The service, built and bound, ready to serve.
pub struct App {
    settings: Settings,
    limiter: Arc<Limiter>,
    admin: AdminState,
    listeners: Listeners,
}

impl App {
    /// Loads the policy, builds the stores and the limiter, starts the rule
    /// sources and background tasks, and binds the three listeners.
    pub async fn build(settings: Settings) -> Result<App, AppError> {
        listeners::validate_metrics_path(&settings.metrics_path)?;
        let (policy, hash) = match settings.config.as_deref().map(load_with_hash) {
            Some(Err(ConfigError::NoPolicyFiles { dir })) if settings.config_may_start_empty => {
                warn!(%dir, "no policy file yet: serving without a configuration until one appears");
                (crate::config::no_policy()?, String::new())
            }
            Some(loaded) => loaded?,
            None => (crate::config::no_policy()?, String::new()),
        };
        info!(rules = policy.rules.len(), source = %policy.source, "policy loaded");
        let (limiter, coord) = build_limiter(&settings, &policy).await?;
        if let Some(otlp) = &settings.otlp {
            crate::observe::tracing_otlp::install(otlp, &limiter.telemetry().metrics)
                .map_err(|e| AppError::Setting(e.to_string()))?;
            info!(endpoint = %otlp.endpoint, protocol = ?otlp.protocol, "exporting traces over OTLP");
        }
        // Governors elect one replica per rule through the counters' Redis.
        let governors = Arc::new(Governors::new(
            limiter.clone(),
            coord.clone(),
            settings.prometheus_url.clone().filter(|u| !u.is_empty()),
        ));
        governors.spawn();
        let reloader = start_sources(&settings, &limiter, policy, hash);
        wait_for_xds(&settings, &limiter).await;
        if let Some(path) = &settings.record {
            let metrics = limiter.telemetry().metrics.traffic.clone();
            crate::observe::traffic::start(path, settings.record_max_bytes, metrics)
                .map_err(|e| AppError::Setting(e.to_string()))?;
            info!(file = %path.display(), max_bytes = settings.record_max_bytes, "recording requests");
        }
        let listeners = Listeners::bind(&settings, &limiter.telemetry().metrics).await?;
        if let Some((addr, path)) = &settings.ratelimit_prometheus {
            let mapper = match &settings.ratelimit_mapper {
                Some(text) => Some(
                    crate::observe::statsd_mapper::Mapper::parse(text)
                        .map_err(|e| AppError::Setting(format!("PROMETHEUS_MAPPER_YAML: {e}")))?,
                ),
                None => None,
            };
            crate::server::admin::spawn_ratelimit_metrics(
                addr,
                path,
                mapper,
                limiter.telemetry().metrics.clone(),
            )
            .await
            .map_err(|e| AppError::Setting(e.to_string()))?;
        }
        if let Some(statsd) = settings.statsd.clone() {
            info!(host = %statsd.host, port = statsd.port, tcp = statsd.tcp, "sending statsd metrics");
            crate::observe::statsd::init(statsd);
        }
        let admin = admin_state(&settings, &limiter, &reloader, governors, coord);
        Ok(App {
            settings,
            limiter,
            admin,
            listeners,
        })
    }

    /// The gRPC address bound (a port of 0 asked for any free one).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.listeners.grpc_addr
    }

    /// The line protocol's address bound.
    pub fn line_addr(&self) -> SocketAddr {
        self.listeners.line_addr
    }

    /// The HTTP admin address bound.
    pub fn http_addr(&self) -> SocketAddr {
        self.listeners.http_addr
    }

    /// Serves the three protocols until `shutdown` completes, then drains
    /// them: readiness turns false, and after the shutdown delay the
    /// listeners close and requests in flight finish.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), AppError> {
        let App {
            settings,
            limiter,
            admin,
            listeners,
        } = self;
        let shutting_down = admin.shutting_down.clone();
        let (stop_tx, tasks) = listeners.serve(&settings, limiter, admin);
        shutdown.await;
        shutting_down.store(true, Ordering::Release);
        if !settings.shutdown_delay.is_zero() {
            info!(
                seconds = settings.shutdown_delay.as_secs(),
                "not ready; still serving until the shutdown delay ends"
            );
            tokio::time::sleep(settings.shutdown_delay).await;
        }
        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(SHUTDOWN_TIMEOUT, tasks.join()).await;
        let Ok(result) = drained else {
            error!("requests still in flight after {SHUTDOWN_TIMEOUT:?}; exiting anyway");
            return Ok(());
        };
        result.inspect_err(|e| error!("{e}"))?;
        // What was recorded reaches the file before the process exits.
        if let Some(recorder) = crate::observe::traffic::active() {
            let flush = tokio::task::spawn_blocking(|| recorder.flush(SHUTDOWN_TIMEOUT));
            if !flush.await.unwrap_or(false) {
                error!("--record: the last recorded requests could not be written");
            }
        }
        // The spans of the last requests, if tracing is on.
        crate::observe::tracing_otlp::flush(Duration::from_secs(2)).await;
        info!("shut down");
        Ok(())
    }
}

/// How long shutdown waits for requests in flight.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// The store, the knobs (refreshed from the start), the limiter, global
/// leases, and the agreement on the actor-hash key; with the coordination
/// handle of the counters' Redis, which governors and RLQS share.
async fn build_limiter(
    s: &Settings,
    policy: &Policy,
) -> Result<(Arc<Limiter>, Coordination), AppError> {
    // The store and the decisions are recorded to what `/metrics` and the
    // dashboard serve.
    let telemetry = crate::observe::telemetry::Telemetry::system();
    let budget = stores::memory_budget(s, policy.rules.len(), &telemetry.metrics);
    let mut parts = stores::build_store(s, budget.max_counters, &telemetry.metrics).await?;
    if let Some(rx) = parts.refunds.take() {
        let announce = crate::counters::resets::announce_refunds;
        tokio::spawn(announce(rx, parts.coord.clone(), s.replica.clone()));
    }
    let knobs = Arc::new(parts.knobs.with_replica(s.replica.clone()));
    // Knobs set while this replica was down apply from the first request.
    let _ = knobs.refresh().await;
    knobs.spawn_refresh(Duration::from_millis(250));
    let fair = Arc::new(FairShares::new(
        Arc::new(crate::clock::SystemClock::default()),
        telemetry.metrics.fair.clone(),
        Some((parts.coord.clone(), s.replica.clone())),
    ));
    fair.spawn();
    let limiter = Limiter::build(RuleSet::new(policy.clone()), parts.store, knobs, telemetry)
        .with_envoy(Arc::new(s.envoy.clone()))
        .with_fair(fair);
    let (limiter, secret_coord) = stores::with_global(s, limiter, &parts.coord).await?;
    if let Some(coord) = secret_coord {
        stores::agree_on_key_secret(coord).await;
    }
    Ok((Arc::new(limiter), parts.coord))
}

/// The policy file's reloader (watching it unless told not to), the
/// ZooKeeper aux rules and the xDS domains, all feeding one set of sources.
fn start_sources(
    s: &Settings,
    limiter: &Arc<Limiter>,
    policy: Policy,
    hash: String,
) -> Arc<Reloader> {
    let sources = Arc::new(RuleSources::new(limiter.clone(), policy));
    let reloader = Arc::new(Reloader::new(
        s.config.clone(),
        limiter,
        sources.clone(),
        hash,
    ));
    if let Some(zk) = s.zookeeper.clone() {
        info!(hosts = %zk.hosts, path = %zk.path, "aux rules from ZooKeeper, ahead of the policy file's");
        zookeeper::spawn(zk, sources.clone());
    }
    if let Some(options) = s.xds.clone() {
        info!(server = %options.server, node = %options.node_id, "envoyproxy/ratelimit domains over xDS");
        limiter.set_xds_pending(s.ready_awaits_xds);
        xds::spawn(options, sources);
    }
    reloader.clone().spawn(s.watch);
    reloader
}

/// With `wait_for_xds` (`ratelimit` mode without
/// `FORCE_START_WITHOUT_INITIAL_CONFIG`), nothing is served until the
/// control plane's first configuration is in force, as envoyproxy/ratelimit does.
async fn wait_for_xds(s: &Settings, limiter: &Limiter) {
    if !s.wait_for_xds || s.xds.is_none() || !limiter.rules().source().is_empty() {
        return;
    }
    info!("waiting for the first configuration from the xDS control plane");
    while limiter.rules().source().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the admin API reads.
fn admin_state(
    s: &Settings,
    limiter: &Arc<Limiter>,
    reloader: &Reloader,
    governors: Arc<Governors>,
    coord: Coordination,
) -> AdminState {
    if s.tokens.admin.is_none() {
        info!("no --admin-token: knob changes are refused (GET /knobs still answers)");
    }
    if s.tokens.read.is_some() {
        info!("--admin-read-token: admin reads need a token (health, readiness and metrics stay open)");
    }
    AdminState {
        limiter: limiter.clone(),
        status: reloader.status(),
        shutting_down: Arc::new(AtomicBool::new(false)),
        readiness: Readiness {
            requires_store: s.ready_requires_store,
            needs_config: s.envoy.error_without_config,
        },
        tokens: s.tokens.clone(),
        governors,
        deadline_margin: s.deadline_margin,
        healthy_needs_config: s.healthy_needs_config,
        failure_policy: s.redis.is_some().then(|| s.on_store_failure.as_str()),
        resets: counter_resets(s, limiter, &coord),
        rlqs: Arc::new(rlqs_hub(s, limiter, coord)),
    }
}

/// Counter resets through the counters' store, told to the other replicas
/// through `coord` (polled from now on when it is shared).
fn counter_resets(
    s: &Settings,
    limiter: &Arc<Limiter>,
    coord: &Coordination,
) -> Arc<crate::counters::resets::CounterResets> {
    let resets = Arc::new(crate::counters::resets::CounterResets::new(
        limiter.store().clone(),
        coord,
        &s.replica,
        limiter.telemetry().metrics.clone(),
    ));
    // Detached: the task ends once the admin state (the last handle) is dropped.
    let _ = resets.spawn();
    resets
}

/// The RLQS streams' hub; with the counters' Redis, limits are shared
/// with the other replicas through it.
fn rlqs_hub(s: &Settings, limiter: &Arc<Limiter>, coord: Coordination) -> crate::server::rlqs::Hub {
    use crate::server::rlqs::{replicas::Replicas, Hub, RlqsSettings};
    let hub = Hub::new(
        limiter.clone(),
        RlqsSettings {
            assignment_ttl: s.rlqs_assignment_ttl.max(Duration::from_secs(1)),
            max_buckets_per_stream: s.rlqs_max_buckets_per_stream.max(1),
        },
        Arc::new(crate::clock::SystemClock::default()),
    );
    if !coord.is_shared() {
        return hub;
    }
    let metrics = limiter.telemetry().metrics.clone();
    let replicas = Arc::new(Replicas::new(coord, s.replica.clone(), metrics));
    info!(holder = %replicas.holder(), "RLQS limits shared with the other replicas through Redis");
    hub.with_replicas(replicas)
}
