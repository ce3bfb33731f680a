//! `divvy knob set|list|delete`: change a running server's knobs through its
//! admin API (`--admin-url`, default `http://127.0.0.1:8080`), with the
//! token from `DIVVY_ADMIN_TOKEN` (a list may use `DIVVY_ADMIN_READ_TOKEN`
//! instead, for a server that protects reads).

use std::io::Write;

use anyhow::{bail, Context};
use clap::Subcommand;
use divvy::config::duration::parse_seconds;
use serde_json::{Map, Value};

/// What to do with knobs.
#[derive(Subcommand)]
pub enum KnobCommand {
    /// Set a knob: `divvy knob set reindex creditLimit=50 [resetSeconds=30s] [burst=10] [--ttl 1h]`.
    Set {
        /// A rule's label (or a `limits` entry's).
        label: String,
        /// Fields to set: creditLimit=N, resetSeconds=N|30s, burst=N.
        #[arg(value_name = "FIELD=VALUE", required = true)]
        fields: Vec<String>,
        /// Remove the knob by itself after this long (seconds or 90s, 1m, 1h, 1d).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// List the knobs in force.
    List,
    /// Delete a knob: the rule's own values again.
    Delete {
        /// The knob's label.
        label: String,
    },
}

pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(10)))
        .build()
        .into()
}

pub(crate) fn token(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|t| !t.is_empty())
}

/// Runs a knob command against the server at `admin_url`.
pub fn run(command: KnobCommand, admin_url: &str) -> anyhow::Result<()> {
    let base = admin_url.trim_end_matches('/');
    let agent = agent();
    let auth = token("DIVVY_ADMIN_TOKEN").map(|t| format!("Bearer {t}"));
    let mut response = match &command {
        KnobCommand::List => {
            let mut req = agent.get(&format!("{base}/knobs"));
            let read = auth
                .clone()
                .or_else(|| token("DIVVY_ADMIN_READ_TOKEN").map(|t| format!("Bearer {t}")));
            if let Some(a) = &read {
                req = req.header("Authorization", a);
            }
            req.call()
        }
        KnobCommand::Delete { label } => {
            let mut req = agent.delete(&format!("{base}/knobs/{}", path_segment(label)));
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.call()
        }
        KnobCommand::Set { label, fields, ttl } => {
            let body = body(fields, ttl.as_deref())?;
            let mut req = agent
                .put(&format!("{base}/knobs/{}", path_segment(label)))
                .header("Content-Type", "application/json");
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.send(body.to_string())
        }
    }
    .with_context(|| format!("cannot reach the admin API at {base}"))?;
    print_answer(&mut response, "")
}

/// Prints an admin API answer (JSON pretty-printed); an error status is an
/// error naming `what` (the request, when the caller names it).
pub(crate) fn print_answer(
    response: &mut ureq::http::Response<ureq::Body>,
    what: &str,
) -> anyhow::Result<()> {
    let status = response.status();
    let text = response
        .body_mut()
        .read_to_string()
        .context("cannot read the answer")?;
    let pretty = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(text);
    if !status.is_success() {
        bail!("{what}{status}: {pretty}");
    }
    // A closed stdout (`| head`) is not an error worth a panic.
    let _ = writeln!(std::io::stdout(), "{pretty}");
    Ok(())
}

fn path_segment(label: &str) -> String {
    // Labels are [A-Za-z0-9_-]; anything else is sent escaped and refused by the server.
    label
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `creditLimit=50 resetSeconds=30s` (and `--ttl 1h`) as the JSON body.
fn body(fields: &[String], ttl: Option<&str>) -> anyhow::Result<Value> {
    let mut map = Map::new();
    for f in fields {
        let Some((k, v)) = f.split_once('=') else {
            bail!("`{f}` is not FIELD=VALUE (e.g. creditLimit=50)");
        };
        let value = match v.parse::<u64>() {
            Ok(n) => Value::from(n),
            Err(_) => Value::from(v),
        };
        map.insert(k.to_owned(), value);
    }
    if let Some(t) = ttl {
        let secs = parse_seconds(t)
            .filter(|&s| s > 0)
            .with_context(|| format!("--ttl `{t}` is not a duration such as 90s, 10m, 1h"))?;
        map.insert("ttlSeconds".to_owned(), Value::from(secs));
    }
    Ok(Value::Object(map))
}
