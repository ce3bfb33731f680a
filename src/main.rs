//! The `divvy` command: `serve`, `check` and `explain`.

mod cli;

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
}

fn main() -> ExitCode {
    let parsed = Cli::parse();
    let result = match parsed.command {
        Command::Serve(args) => cli::serve::serve(*args),
        Command::Check { file } => cli::inspect::check(&file),
        Command::Explain {
            file,
            domain,
            pairs,
        } => cli::inspect::explain(&file, domain.as_deref(), &pairs),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("divvy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
