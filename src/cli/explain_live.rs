//! `divvy explain --server URL`: a running server's live figures from its
//! `/explain`: a fairShare limit's value, share and demand, and an
//! overdraft limit's debt.

use anyhow::{bail, Context};
use serde_json::Value;

use super::knob::{agent, token};

/// Prints each fairShare limit's live share of the request's value, as the
/// server at `base` (its admin URL) sees it now.
pub fn print_shares(
    base: &str,
    domain: Option<&str>,
    pairs: &[(&str, &str)],
) -> anyhow::Result<()> {
    let base = base.trim_end_matches('/');
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(d) = domain {
        query.append_pair("domain", d);
    }
    for (k, v) in pairs {
        query.append_pair(k, v);
    }
    let url = format!("{base}/explain?{}", query.finish());
    let mut req = agent().get(&url);
    let auth = token("DIVVY_ADMIN_READ_TOKEN").or_else(|| token("DIVVY_ADMIN_TOKEN"));
    if let Some(t) = auth {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut response = req.call().with_context(|| format!("GET {url}"))?;
    let status = response.status();
    let body = response
        .body_mut()
        .read_to_string()
        .context("reading /explain")?;
    if !status.is_success() {
        bail!("GET {url}: {status}: {}", body.trim());
    }
    let v: Value = serde_json::from_str(&body).context("/explain answered no JSON")?;
    let rules =
        std::iter::once(&v["decider"]).chain(v["canaries"].as_array().into_iter().flatten());
    let mut shown = 0;
    for rule in rules {
        for limit in rule["limits"].as_array().into_iter().flatten() {
            if let Some(debt) = limit["counter"]["debt"].as_u64() {
                shown += 1;
                let reset = limit["counter"]["resetSeconds"].as_f64().unwrap_or(0.0);
                println!(
                    "live ({base}): {} has a debt of {debt} (full again in {reset:.0} s)",
                    rule["rule"].as_str().unwrap_or("?")
                );
            }
            let f = &limit["fairShare"];
            if f.is_null() {
                continue;
            }
            shown += 1;
            println!("live ({base}): {}", share_line(rule, f));
        }
    }
    if shown == 0 {
        println!("live ({base}): no fairShare or overdraft limit decides this request");
    }
    Ok(())
}

/// `rule …: user=alice has a share of 25.0/s, demand 40.2/s` (or not active).
fn share_line(rule: &Value, f: &Value) -> String {
    let who = format!(
        "{} {}={}",
        rule["rule"].as_str().unwrap_or("?"),
        f["by"].as_str().unwrap_or("?"),
        f["value"].as_str().unwrap_or("")
    );
    match (f["shareRate"].as_f64(), f["demandRate"].as_f64()) {
        (Some(share), Some(demand)) => {
            format!("{who} has a share of {share:.1}/s, demand {demand:.1}/s")
        }
        _ => format!("{who} is not active on this replica (it gets an equal split when it asks)"),
    }
}
