//! `divvy replay`: recorded traffic decided again by a policy file (and an
//! old one beside it), printed as a per-rule table and changed decisions.

use std::io::BufReader;
use std::path::PathBuf;

use anyhow::Context;

use super::inspect::load_for_cli;

/// The arguments of `divvy replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The policy to rehearse (.yaml, .yml, .json or .ini).
    #[arg(long)]
    pub policy: PathBuf,
    /// The policy in force, to compare with: changed decisions are listed.
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// How many changed decisions (and malformed lines) to print.
    #[arg(long, default_value_t = 10)]
    pub examples: usize,
    /// Recorded traffic: one `HIT ...` line or `POST /json` body a line,
    /// each optionally preceded by a unix-ms timestamp (what `serve --record` writes).
    #[arg(value_name = "TRAFFIC")]
    pub traffic: PathBuf,
}

/// Runs the replay and prints its report; a malformed line is reported and skipped.
pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let new = load_for_cli(&args.policy)?;
    let old = args.against.as_deref().map(load_for_cli).transpose()?;
    let file = std::fs::File::open(&args.traffic)
        .with_context(|| format!("opening {}", args.traffic.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(divvy::replay::replay(
        BufReader::new(file),
        new,
        old,
        args.examples,
    ))?;
    print!("{report}");
    Ok(())
}
