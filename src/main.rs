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
use divvy::rules::{Operation, RuleSet};
use divvy::store::MemoryStore;
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
    /// Serve the policy: Envoy RateLimitService v3 over gRPC (with grpc.health.v1).
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
    let policy = config::load_file(&args.config)?;
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
        let store = Arc::new(MemoryStore::new());
        store.spawn_sweeper(Duration::from_secs(args.sweep_seconds.max(1)));
        let limiter = Arc::new(Limiter::new(RuleSet::new(policy), store));
        let grpc = TcpListener::bind(args.grpc_addr)
            .await
            .with_context(|| format!("cannot listen for gRPC on {}", args.grpc_addr))?;
        info!("grpc listening on {}", grpc.local_addr()?);
        let served = divvy::server::serve_grpc(grpc, limiter, shutdown_signal()).await;
        if let Err(e) = served {
            error!("gRPC server failed: {e}");
            bail!("gRPC server failed: {e}");
        }
        info!("shut down");
        Ok(())
    })
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
