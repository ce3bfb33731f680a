//! The `divvy` command: `serve`, `check`, `explain`, `knob`, `probe` and `replay`.

mod cli;

/// mimalloc ([`divvy::allocator`]): fast, and it gives freed pages back to
/// the system soon after a flood of short-lived counters ends (glibc's
/// allocator, when it held everything, kept tens of MB of a flood's small
/// blocks; see the README's "Limits and hostile traffic"). The counter
/// tables' big arrays are the exception, on glibc's allocator: see
/// [`tables_unmapped_when_freed`].
#[global_allocator]
static ALLOCATOR: divvy::allocator::MiMalloc = divvy::allocator::MiMalloc;

/// Keeps transparent huge pages off this process: the kernel would merge
/// the allocator's freed small pages back into resident 2 MiB pages, and
/// memory would not go back after a flood (measured; see
/// docs/performance.md, "Notes moved from the code").
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes integer arguments only and
    // changes nothing but this process's huge-page policy.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Blocks of this size or more come from glibc's allocator as mappings of
/// their own (when its free lists cannot serve them).
const OWN_MAPPING_BYTES: libc::c_int = 128 * 1024;

/// On glibc, has its allocator, which the memory store's counter tables use
/// (see `store::lru_table`; everything else of divvy's goes through
/// mimalloc), map blocks of [`OWN_MAPPING_BYTES`] or more on their own,
/// unmapped when freed. Setting the threshold fixes it: by default glibc
/// raises it up to 32 MiB as mapped blocks are freed, and the arrays a
/// table leaves behind when it grows would then stay in its heap until the
/// sweep trims it. (A purge delay of 0 in mimalloc would get them back too,
/// but it purges every page the request path frees, and the page faults
/// cost far more: docs/performance.md, "The allocator".) Elsewhere it does
/// nothing: the sweep's trim is then the only way back.
fn tables_unmapped_when_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only sets glibc's allocator's
    // threshold, before any table exists. A refusal (0) leaves glibc's
    // default, which the sweep's trim covers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_MAPPING_BYTES);
    }
}

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cli::serve::ServeArgs;

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
    Serve(Box<ServeArgs>),
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
        /// A running server's admin URL: also show its live fair shares for
        /// the request (token from DIVVY_ADMIN_READ_TOKEN or DIVVY_ADMIN_TOKEN).
        #[arg(long, env = "DIVVY_ADMIN_URL")]
        server: Option<String>,
    },
    /// Run as envoyproxy/ratelimit's process, configured by its environment
    /// variables with its defaults (what `/bin/ratelimit` does).
    Ratelimit,
    /// Change a running server's knobs (live overrides of a rule's limits); the token comes from DIVVY_ADMIN_TOKEN.
    Knob {
        /// The server's admin API.
        #[arg(
            long,
            env = "DIVVY_ADMIN_URL",
            default_value = "http://127.0.0.1:8080",
            global = true
        )]
        admin_url: String,
        #[command(subcommand)]
        command: cli::knob::KnobCommand,
    },
    /// Decide recorded traffic again under a policy (and an old one beside it): per rule, allowed and denied, and the first requests whose decision changed.
    Replay(cli::replay::ReplayArgs),
    /// Read or reset one actor's counters of a rule on a running server
    /// (every replica answers it as fresh within a second after a reset).
    Counters {
        #[command(subcommand)]
        command: cli::counters::CountersCommand,
    },
    /// GET a URL (e.g. the admin API's /readyz) and print the body; exit non-zero unless the answer is 2xx. For images without curl.
    Probe(cli::probe::ProbeArgs),
}

/// Whether the process was started under the name `ratelimit`
/// (envoyproxy/ratelimit's `/bin/ratelimit`).
fn started_as_ratelimit() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n == "ratelimit"))
        .unwrap_or(false)
}

/// `ratelimit` mode: envoyproxy/ratelimit's environment as `serve` arguments.
fn ratelimit() -> anyhow::Result<()> {
    let env: cli::ratelimit::Env = std::env::vars().collect();
    let (args, mode) = cli::ratelimit::serve_args(&env)?;
    // divvy's own names for settings the environment gives there would
    // otherwise be read as well: statsd only as USE_STATSD says.
    if !args.iter().any(|a| a == "--statsd-host") {
        std::env::remove_var("STATSD_HOST");
    }
    let parsed = Cli::try_parse_from(std::iter::once("ratelimit".to_owned()).chain(args))?;
    let Command::Serve(serve) = parsed.command else {
        anyhow::bail!("the ratelimit environment did not give serve arguments");
    };
    no_huge_pages();
    tables_unmapped_when_freed();
    cli::serve::serve(serve.with_ratelimit_mode(mode))
}

fn main() -> ExitCode {
    if started_as_ratelimit() {
        return exit(ratelimit());
    }
    let parsed = Cli::parse();
    let result = match parsed.command {
        Command::Serve(args) => {
            no_huge_pages();
            tables_unmapped_when_freed();
            cli::serve::serve(*args)
        }
        Command::Check { file } => cli::inspect::check(&file),
        Command::Explain {
            file,
            domain,
            pairs,
            server,
        } => cli::inspect::explain(&file, domain.as_deref(), &pairs, server.as_deref()),
        Command::Ratelimit => ratelimit(),
        Command::Knob { admin_url, command } => cli::knob::run(command, &admin_url),
        Command::Counters { command } => cli::counters::run(command),
        Command::Probe(args) => cli::probe::run(&args),
        Command::Replay(args) => cli::replay::run(&args),
    };
    exit(result)
}

fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("divvy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
