//! `divvy counters get|reset`: read or reset one actor's counters of a rule
//! on a running server through its admin API (`GET` and `DELETE /counters`).
//! A reset needs the admin token (`--token` or `DIVVY_ADMIN_TOKEN`); a read
//! uses it, or `DIVVY_ADMIN_READ_TOKEN`, when the server protects reads.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use super::knob::{agent, token};

/// Which counters, on which server.
#[derive(Args)]
pub struct CounterArgs {
    /// The server's admin API.
    #[arg(long, env = "DIVVY_ADMIN_URL", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// The rule's label (or a `limits` entry's).
    #[arg(long)]
    rule: String,
    /// The actor: the value of the rule's actorField (omit for a rule without one).
    #[arg(long)]
    actor: Option<String>,
    /// Other request fields, as KEY=VALUE (an actor field named directly).
    #[arg(long = "field", value_name = "KEY=VALUE")]
    fields: Vec<String>,
    /// The admin token (default: DIVVY_ADMIN_TOKEN; a read also takes DIVVY_ADMIN_READ_TOKEN).
    #[arg(long, env = "DIVVY_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// What to do with the counters.
#[derive(Subcommand)]
pub enum CountersCommand {
    /// Show the counters: key, count, remaining, debt, reset, and whether
    /// the server's over-limit cache holds a denial.
    Get(CounterArgs),
    /// Reset the counters in the store; every replica answers the actor as
    /// fresh within a second.
    Reset(CounterArgs),
}

/// Runs a counters command.
pub fn run(command: CountersCommand) -> anyhow::Result<()> {
    let (args, reset) = match &command {
        CountersCommand::Get(a) => (a, false),
        CountersCommand::Reset(a) => (a, true),
    };
    let url = url(args)?;
    let token = args
        .token
        .clone()
        .filter(|t| !t.is_empty())
        .or_else(|| (!reset).then(|| token("DIVVY_ADMIN_READ_TOKEN")).flatten());
    let agent = agent();
    let mut req = if reset {
        agent.delete(&url)
    } else {
        agent.get(&url)
    };
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let method = if reset { "DELETE" } else { "GET" };
    let mut response = req
        .call()
        .with_context(|| format!("cannot reach the admin API: {method} {url}"))?;
    super::knob::print_answer(&mut response, &format!("{method} {url}: "))
}

/// `<server>/counters?rule=...&actor=...&key=value...`.
fn url(args: &CounterArgs) -> anyhow::Result<String> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("rule", &args.rule);
    if let Some(a) = &args.actor {
        query.append_pair("actor", a);
    }
    for f in &args.fields {
        let Some((k, v)) = f.split_once('=') else {
            bail!("--field `{f}` is not KEY=VALUE (e.g. --field user=alice)");
        };
        query.append_pair(k, v);
    }
    let base = args.server.trim_end_matches('/');
    Ok(format!("{base}/counters?{}", query.finish()))
}
