//! The `divvy` command: `serve`, `check`, `explain` and `knob`.

mod cli;

/// mimalloc: fast, and it gives freed pages back to the system soon after
/// a flood of short-lived counters ends (glibc's allocator kept tens of MB;
/// see the README's "Limits and hostile traffic").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keeps transparent huge pages off this process: the kernel would merge
/// the allocator's freed small pages back into resident 2 MiB pages, and
/// memory would not go back after a flood (measured: RSS creeping up in
/// 2-4 MB steps every 10 s once the counters were swept).
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes integer arguments only and
    // changes nothing but this process's huge-page policy.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// mimalloc's `mi_option_purge_delay` (15 in its `mi_option_e`, v2 and v3;
/// the crate's bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Gives freed memory back to the system at once rather than after
/// mimalloc's default 10 ms, which a worker thread that goes quiet may never
/// reach: without it, the arrays a counter table leaves behind when it
/// grows stayed resident in some runs (103 instead of 74 bytes per counter
/// at 1 M counters); the hot path's CPU per HIT is the same within noise.
fn purge_at_once() {
    // SAFETY: mi_option_set takes two integers and only sets an option
    // read by the allocator's own purging.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
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
    },
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
}

fn main() -> ExitCode {
    let parsed = Cli::parse();
    let result = match parsed.command {
        Command::Serve(args) => {
            no_huge_pages();
            purge_at_once();
            cli::serve::serve(*args)
        }
        Command::Check { file } => cli::inspect::check(&file),
        Command::Explain {
            file,
            domain,
            pairs,
        } => cli::inspect::explain(&file, domain.as_deref(), &pairs),
        Command::Knob { admin_url, command } => cli::knob::run(command, &admin_url),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("divvy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
