//! The `divvy` command: `serve`, `check` and `explain`.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use divvy::config::{self, ConfigError, Policy};
use divvy::limiter::Limiter;
use divvy::reload::Reloader;
use divvy::rules::{Operation, RuleSet};
use divvy::server::line::{serve_line, ConnLimits};
use divvy::store::failover::{FailoverStore, FailurePolicy};
use divvy::store::redis::{RedisOptions, RedisStore};
use divvy::store::redis_url::{parse_redis_url, RedisTarget};
use divvy::store::{MemoryStore, Store};
use tokio::net::TcpListener;
use tracing::{error, info};

/// A global rate-limit service: Envoy's RateLimitService and divvy rules.
#[derive(Parser)]
#[command(name = "divvy", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the policy: Envoy RateLimitService v3 over gRPC (with grpc.health.v1) and the divvy line protocol over TCP.
    Serve(ServeArgs),
    /// Validate a policy file: every error, or a summary of the rules.
    Check {
        /// The policy file (.yaml, .yml, .json or .ini).
        file: PathBuf,
    },
    /// Show which rule decides a request, which canaries run and the counter keys; consumes nothing.
    Explain {
        /// The policy file.
        file: PathBuf,
        /// Envoy domain of the request; without it, the request is a line-protocol HIT.
        #[arg(long)]
        domain: Option<String>,
        /// The request as key=value pairs.
        #[arg(value_name = "KEY=VALUE")]
        pairs: Vec<String>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The policy file (.yaml, .yml, .json or .ini).
    #[arg(long, env = "DIVVY_CONFIG")]
    config: PathBuf,
    /// Address of the Envoy RateLimitService (gRPC).
    #[arg(long, env = "DIVVY_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Address of the divvy line protocol (TCP). Without it, divvy's `PORT`
    /// variable gives the port on 0.0.0.0; the default is 0.0.0.0:8321.
    #[arg(long, env = "DIVVY_LINE_ADDR")]
    line_addr: Option<SocketAddr>,
    /// Longest accepted line-protocol request, in bytes; longer lines get an ERR.
    #[arg(long, env = "DIVVY_LINE_MAX_BYTES", default_value_t = 16 * 1024)]
    line_max_bytes: usize,
    /// Most pipelined line-protocol requests decided together per connection.
    #[arg(long, env = "DIVVY_LINE_MAX_BATCH", default_value_t = 256)]
    line_max_batch: usize,
    /// Close a line-protocol connection that sends nothing for this many seconds.
    #[arg(long, env = "DIVVY_LINE_IDLE_SECONDS", default_value_t = 600)]
    line_idle_seconds: u64,
    /// Keep counters in Redis, shared by every replica: redis://[user:pass@]host:port[/db],
    /// rediss://..., redis+cluster://host:port[,host:port...] or
    /// redis+sentinel://host:port[,host:port...]/master-name. Without it (and
    /// without divvy's REDIS_HOST), counters live in the embedded memory store.
    #[arg(long, env = "DIVVY_REDIS_URL")]
    redis_url: Option<String>,
    /// Longest wait for one Redis command, in milliseconds.
    #[arg(long, env = "DIVVY_REDIS_TIMEOUT_MS", default_value_t = 100)]
    redis_timeout_ms: u64,
    /// What requests get while Redis is failing: allow (fail open), deny
    /// (fail closed) or local (the embedded store with a share of each limit).
    #[arg(
        long,
        env = "DIVVY_ON_STORE_FAILURE",
        value_enum,
        default_value = "local"
    )]
    on_store_failure: FailurePolicy,
    /// With --on-store-failure local, the share of each limit a replica may
    /// grant on its own while Redis is failing.
    #[arg(long, env = "DIVVY_LOCAL_SHARE", default_value_t = 0.5)]
    local_share: f64,
    /// Do not watch the policy file for changes (SIGHUP still reloads it).
    #[arg(long, env = "DIVVY_NO_WATCH")]
    no_watch: bool,
    /// How often expired counters are reclaimed from the memory store, in seconds.
    #[arg(long, env = "DIVVY_SWEEP_SECONDS", default_value_t = 5)]
    sweep_seconds: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Check { file } => check(&file),
        Command::Explain {
            file,
            domain,
            pairs,
        } => explain(&file, domain.as_deref(), &pairs),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("divvy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DIVVY_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging();
    let (policy, hash) = divvy::reload::load_with_hash(&args.config)?;
    info!(
        rules = policy.rules.len(),
        source = %policy.source,
        "policy loaded"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let store: Arc<dyn Store> = match redis_target(args.redis_url.as_deref())? {
            None => {
                let memory = Arc::new(MemoryStore::new());
                memory.spawn_sweeper(Duration::from_secs(args.sweep_seconds.max(1)));
                info!("counters in the embedded memory store");
                memory
            }
            Some(target) => {
                info!(target = ?target, policy = ?args.on_store_failure, "counters in redis");
                let options = RedisOptions {
                    target,
                    timeout: Duration::from_millis(args.redis_timeout_ms.max(1)),
                };
                let (redis, connected) =
                    RedisStore::connect(&options, Duration::from_secs(2)).await?;
                let failover =
                    FailoverStore::new(Arc::new(redis), args.on_store_failure, args.local_share);
                let failover = Arc::new(if connected {
                    failover
                } else {
                    failover.start_failed()
                });
                failover.spawn_probe();
                failover
            }
        };
        let limiter = Arc::new(Limiter::new(RuleSet::new(policy), store));
        let reloader = Arc::new(Reloader::new(args.config.clone(), limiter.clone(), hash));
        reloader.clone().spawn(!args.no_watch);
        let grpc = TcpListener::bind(args.grpc_addr)
            .await
            .with_context(|| format!("cannot listen for gRPC on {}", args.grpc_addr))?;
        let line_addr = line_addr(args.line_addr)?;
        let line = TcpListener::bind(line_addr)
            .await
            .with_context(|| format!("cannot listen for the line protocol on {line_addr}"))?;
        info!("grpc listening on {}", grpc.local_addr()?);
        info!("line protocol listening on {}", line.local_addr()?);
        let limits = ConnLimits {
            max_line: args.line_max_bytes.max(1),
            max_batch: args.line_max_batch.max(1),
            idle_timeout: Duration::from_secs(args.line_idle_seconds.max(1)),
        };
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let line_task = tokio::spawn(serve_line(line, limiter.clone(), limits, stop_rx.clone()));
        let grpc_task = tokio::spawn(divvy::server::serve_grpc(grpc, limiter, stopped(stop_rx)));
        shutdown_signal().await;
        let _ = stop_tx.send(true);
        let _ = line_task.await;
        match grpc_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                error!("gRPC server failed: {e}");
                bail!("gRPC server failed: {e}");
            }
            Err(e) => bail!("gRPC server task failed: {e}"),
        }
        info!("shut down");
        Ok(())
    })
}

/// `--redis-url`, else divvy's `REDIS_HOST` and `REDIS_PORT`, else none
/// (the memory store). The password may come from `REDIS_PASSWORD`.
fn redis_target(flag: Option<&str>) -> anyhow::Result<Option<RedisTarget>> {
    let password = std::env::var("REDIS_PASSWORD").ok();
    let url = match flag {
        Some(url) => url.to_owned(),
        None => match std::env::var("REDIS_HOST") {
            Ok(host) if !host.trim().is_empty() => {
                let port = std::env::var("REDIS_PORT").unwrap_or_else(|_| "6379".into());
                let host = host.trim();
                if host.contains(':') {
                    format!("redis://[{host}]:{}", port.trim())
                } else {
                    format!("redis://{host}:{}", port.trim())
                }
            }
            _ => return Ok(None),
        },
    };
    Ok(Some(parse_redis_url(&url, password)?))
}

/// `--line-addr`, else `0.0.0.0:$PORT` (divvy's variable), else `0.0.0.0:8321`.
fn line_addr(flag: Option<SocketAddr>) -> anyhow::Result<SocketAddr> {
    if let Some(addr) = flag {
        return Ok(addr);
    }
    match std::env::var("PORT") {
        Ok(port) if !port.trim().is_empty() => {
            let port: u16 = port
                .trim()
                .parse()
                .with_context(|| format!("PORT must be a TCP port number, found `{port}`"))?;
            Ok(SocketAddr::from(([0, 0, 0, 0], port)))
        }
        _ => Ok(SocketAddr::from(([0, 0, 0, 0], 8321))),
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    info!("shutdown signal received");
}

fn load_for_cli(file: &std::path::Path) -> anyhow::Result<Policy> {
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

fn check(file: &std::path::Path) -> anyhow::Result<()> {
    let policy = load_for_cli(file)?;
    print!("{}", summary(&policy));
    Ok(())
}

/// A one-screen table of the rules.
fn summary(policy: &Policy) -> String {
    const SHOWN: usize = 40;
    let rules = &policy.rules;
    let canaries = rules
        .iter()
        .filter(|r| r.match_policy == config::MatchPolicy::Canary)
        .count();
    let mut out = format!(
        "{}: OK, {} rules ({} stop, {} canary, 1 default)\n",
        policy.source,
        rules.len(),
        rules.len() - canaries - 1,
        canaries
    );
    let mut rows: Vec<[String; 7]> = vec![[
        "#".into(),
        "label".into(),
        "policy".into(),
        "domain".into(),
        "limit".into(),
        "actor".into(),
        "operation".into(),
    ]];
    for r in rules.iter().take(SHOWN) {
        let limit = match (r.credit_limit, r.reset_seconds) {
            (0, _) => "always deny".to_owned(),
            (n, 0) => format!("always allow ({n})"),
            (n, s) => format!("{n} per {s}s"),
        };
        let op = if r.is_default {
            "(default)".to_owned()
        } else {
            r.operation_text()
        };
        rows.push([
            r.position.to_string(),
            r.label.clone().unwrap_or_else(|| "-".into()),
            r.match_policy.as_str().into(),
            r.domain.clone().unwrap_or_else(|| "*".into()),
            limit,
            r.actor_field.clone().unwrap_or_else(|| "-".into()),
            op,
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if rules.len() > SHOWN {
        out.push_str(&format!("  ... and {} more rules\n", rules.len() - SHOWN));
    }
    out
}

fn explain(file: &std::path::Path, domain: Option<&str>, pairs: &[String]) -> anyhow::Result<()> {
    let policy = load_for_cli(file)?;
    let mut kv = Vec::with_capacity(pairs.len());
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else {
            bail!("`{p}` is not a key=value pair");
        };
        kv.push((k, v));
    }
    let op = Operation::from_pairs(kv);
    let rules = RuleSet::new(policy);
    let plan = rules.plan(domain, &op);
    let describe = |i: usize| {
        let rule = rules.rule(i);
        let spec = &rule.spec;
        let what = match (spec.credit_limit, spec.reset_seconds) {
            (0, _) => "always denies (creditLimit 0); no counter".to_owned(),
            (_, 0) => "always allows (resetSeconds 0); no counter".to_owned(),
            (n, s) => format!("{n} per {s}s; counter {}", rule.counter_key(&op, n, s)),
        };
        format!("{spec}: {what}")
    };
    match domain {
        Some(d) => println!("request (domain {d}): {}", pairs.join(" ")),
        None => println!("request (line protocol): {}", pairs.join(" ")),
    }
    println!("decides: {}", describe(plan.decider));
    if plan.canaries.is_empty() {
        println!("canaries: none");
    }
    for c in plan.canaries {
        println!("canary:  {}", describe(c));
    }
    Ok(())
}
