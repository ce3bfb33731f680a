//! The dashboard's JSON API under `/api/v1/` (documented in docs/dashboard.md).
//!
//! `overview`, `rules`, `rules/{name}` and `offenders` read the
//! [`crate::observe::recorder`] (15 minutes of history, lost at a restart);
//! `knobs`, `global`, `rlqs` and `governors` answer what the older routes
//! of the same names answer. With `--admin-read-token` every route here
//! needs the read or the admin token ([`super::auth::gate`]).

use std::time::UNIX_EPOCH;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::state::AdminState;
use crate::limiter::knob_for;
use crate::observe::history::{RuleHistory, Second, SECONDS};
use crate::observe::metrics::Metrics;
use crate::rules::Rule;

/// Seconds over which `allowedPerSecond` and `deniedPerSecond` are averaged.
pub const RATE_SECONDS: u64 = 10;
/// Most offenders a list returns.
pub const MAX_TOP: usize = 100;
/// Most rules one page of `/api/v1/rules` returns.
pub const MAX_PAGE: usize = 1000;

/// One rule as the rules list shows it, before its page is cut.
struct Row<'a> {
    name: &'a str,
    kind: &'static str,
    rule: Option<&'a Rule>,
    history: &'a RuleHistory,
    envoy_limit: Option<&'a str>,
    rate: Second,
}

impl Row<'_> {
    fn share(&self) -> f64 {
        let all = self.rate.allowed + self.rate.denied;
        if all == 0 {
            0.0
        } else {
            self.rate.denied as f64 / all as f64
        }
    }
}

/// A query the API refuses (400, with the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// `window` is not `1m`, `5m` or `15m`.
    #[error("window must be 1m, 5m or 15m, found {0:?}")]
    Window(String),
    /// `sort` names no column.
    #[error("sort must be name, position, denied, allowed, share or limit, found {0:?}")]
    Sort(String),
    /// `order` is not `asc` or `desc`.
    #[error("order must be asc or desc, found {0:?}")]
    Order(String),
}

impl IntoResponse for QueryError {
    fn into_response(self) -> Response {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": self.to_string()})),
        )
            .into_response()
    }
}

/// A window's name (`1m`, `5m`, `15m`) in seconds.
fn window_seconds(w: Option<&str>) -> Result<u64, QueryError> {
    match w.unwrap_or("5m") {
        "1m" => Ok(60),
        "5m" => Ok(300),
        "15m" => Ok(900),
        other => Err(QueryError::Window(other.to_owned())),
    }
}

/// The 900 seconds up to `now` in `points` points (each the mean of its seconds).
fn series(seconds: &[Second], points: usize) -> (Vec<f64>, Vec<f64>) {
    let per = (SECONDS / points.clamp(1, SECONDS)).max(1);
    let mean = |f: fn(&Second) -> u64| -> Vec<f64> {
        seconds
            .chunks(per)
            .map(|c| c.iter().map(f).sum::<u64>() as f64 / c.len() as f64)
            .collect()
    };
    (mean(|s| s.allowed), mean(|s| s.denied))
}

fn history_json(h: &RuleHistory, now: u64, points: usize) -> Value {
    if !h.active() {
        return Value::Null;
    }
    let mut seconds = vec![Second::default(); SECONDS];
    h.add_into(now, &mut seconds);
    let (allowed, denied) = series(&seconds, points);
    json!({"allowed": allowed, "denied": denied})
}

/// The p99 of `divvy_hit_duration_seconds` since start, in seconds
/// (interpolated within its bucket; `None` before the first decision).
fn p99_seconds(metrics: &Metrics) -> Option<f64> {
    use prometheus::core::Metric as _;
    let metric = metrics.hit_duration.metric();
    let h = metric.get_histogram();
    let total = h.get_sample_count();
    if total == 0 {
        return None;
    }
    let rank = (total as f64 * 0.99).ceil() as u64;
    let (mut lower, mut below) = (0.0, 0u64);
    for b in h.get_bucket() {
        let (upper, count) = (b.upper_bound(), b.cumulative_count());
        if count >= rank {
            let within = (count - below).max(1) as f64;
            return Some(lower + (upper - lower) * (rank - below) as f64 / within);
        }
        (lower, below) = (upper, count);
    }
    // Above the last bucket: its bound is all that is known.
    Some(lower)
}

/// `GET /api/v1/overview`.
pub async fn overview(State(s): State<AdminState>) -> Json<Value> {
    let board = &*s.limiter.telemetry().recorder;
    let now = board.now();
    let rules = s.limiter.rules();
    let envoy = board.envoy_limits();
    let all = rules
        .rules()
        .iter()
        .filter_map(|r| r.telemetry().map(|t| &*t.stats))
        .chain(envoy.iter().map(|e| &**e));
    let seconds = board.total(now, all);
    let (allowed, denied) = series(&seconds, SECONDS);
    let recent = &seconds[SECONDS - RATE_SECONDS as usize..];
    let sum =
        |f: fn(&Second) -> u64| recent.iter().map(f).sum::<u64>() as f64 / RATE_SECONDS as f64;
    let store = s.limiter.store();
    let status = s.status.snapshot();
    Json(json!({
        "now": now,
        "historySeconds": SECONDS,
        "historySurvivesRestart": false,
        "allowedPerSecond": sum(|s| s.allowed),
        "deniedPerSecond": sum(|s| s.denied),
        "series": {"allowed": allowed, "denied": denied},
        "offenders": board.top(300, None, 20),
        "offendersWindow": "5m",
        "store": {
            "name": store.name(),
            "up": store.ready(),
            "failurePolicy": s.failure_policy,
            "acting": match (store.ready(), s.failure_policy) {
                (false, Some(p)) => Some(p),
                _ => None,
            },
        },
        "policy": {
            "hash": status.hash,
            "source": rules.source(),
            "generation": status.generation,
            "loadedAt": status.loaded_at.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs_f64()),
            "lastError": status.last_error,
            "reloads": {"succeeded": status.successes, "failed": status.failures},
            "rules": rules.rules().len(),
            "domains": rules.envoy_domains().iter().map(|t| t.domain().to_owned()).collect::<Vec<_>>(),
        },
        "p99DecisionSeconds": p99_seconds(&s.limiter.telemetry().metrics),
        "configured": {
            "global": s.limiter.global().is_some(),
            "governors": !rules.governors().is_empty(),
            "rlqsStreams": s.rlqs.lock().streams.len(),
        },
    }))
}

/// The query of `GET /api/v1/rules`.
#[derive(Debug, Default, Deserialize)]
pub struct RulesQuery {
    /// Rules whose name contains this (case-insensitive).
    pub filter: Option<String>,
    /// `name` (the default), `denied`, `allowed`, `share`, `limit` or `position`.
    pub sort: Option<String>,
    /// `asc` or `desc` (the default: `asc` for name and position, else `desc`).
    pub order: Option<String>,
    /// First row of the page (0 by default).
    pub offset: Option<usize>,
    /// Rows in the page (100 by default, at most [`MAX_PAGE`]).
    pub limit: Option<usize>,
    /// Points of each sparkline (900 by default: one a second).
    pub points: Option<usize>,
}

fn effective_limit(s: &AdminState, rule: &Rule) -> (Option<crate::config::LimitSpec>, Value) {
    let own = rule.spec.first_limit();
    let knob = knob_for(s.limiter.knobs(), &rule.spec, 0);
    let effective = knob.as_ref().map_or_else(|| own.clone(), |k| k.apply(own));
    let knob = knob.map_or(Value::Null, |k| super::render::knob_json(&k));
    (Some(effective), knob)
}

fn row_json(s: &AdminState, row: &Row, now: u64, points: usize) -> Value {
    let (limit, knob) = match row.rule {
        Some(r) => effective_limit(s, r),
        None => (None, Value::Null),
    };
    let spec = row.rule.map(|r| &r.spec);
    json!({
        "name": row.name,
        "kind": row.kind,
        "label": spec.and_then(|s| s.label.as_deref()),
        "domain": spec.and_then(|s| s.domain.as_deref()),
        "position": spec.map(|s| s.position),
        "creditLimit": limit.as_ref().map(|l| l.credit_limit),
        "resetSeconds": limit.as_ref().map(|l| l.reset_seconds),
        "algorithm": limit.as_ref().map(|l| l.algorithm.as_str()),
        "limit": limit.as_ref().map(|l| l.describe()).or(row.envoy_limit.map(str::to_owned)),
        "knob": knob,
        "matchPolicy": spec.map(|s| s.match_policy.as_str()),
        // A shadow rule's would-be denials (its history counts them allowed).
        "shadowDenials": row.rule.filter(|r| r.is_shadow()).and_then(|r| r.telemetry()).map(|t| t.stats.shadow_denials()),
        "allowedPerSecond": row.rate.allowed as f64 / RATE_SECONDS as f64,
        "deniedPerSecond": row.rate.denied as f64 / RATE_SECONDS as f64,
        "deniedShare": row.share(),
        "history": history_json(row.history, now, points),
    })
}

fn rows<'a>(
    rules: &'a crate::rules::RuleSet,
    envoy: &'a [std::sync::Arc<crate::observe::recorder::RuleStats>],
    now: u64,
) -> Vec<Row<'a>> {
    let divvy = rules.rules().iter().filter_map(move |r| {
        let stats = &r.telemetry()?.stats;
        Some(Row {
            name: r.name(),
            kind: if r.spec.aux { "aux" } else { "divvy" },
            rule: Some(r),
            history: &stats.history,
            envoy_limit: None,
            rate: stats.history.sum(now, RATE_SECONDS),
        })
    });
    let envoy = envoy.iter().map(move |e| Row {
        name: &e.name,
        kind: "envoyproxy/ratelimit",
        rule: None,
        history: &e.history,
        envoy_limit: e.describe.as_deref(),
        rate: e.history.sum(now, RATE_SECONDS),
    });
    divvy.chain(envoy).collect()
}

fn sort_rows(rows: &mut [Row], sort: &str, desc: bool) -> Result<(), QueryError> {
    let f = |a: f64, b: f64| a.total_cmp(&b);
    match sort {
        "name" => rows.sort_by(|a, b| a.name.cmp(b.name)),
        "position" => rows.sort_by_key(|r| r.rule.map_or(usize::MAX, |r| r.spec.position)),
        "denied" => rows.sort_by_key(|r| r.rate.denied),
        "allowed" => rows.sort_by_key(|r| r.rate.allowed),
        "share" => rows.sort_by(|a, b| f(a.share(), b.share())),
        "limit" => rows.sort_by_key(|r| {
            r.rule
                .map_or(u64::MAX, |r| r.spec.first_limit().credit_limit)
        }),
        other => return Err(QueryError::Sort(other.to_owned())),
    }
    if desc {
        rows.reverse();
    }
    Ok(())
}

/// `GET /api/v1/rules`: every rule, filtered, sorted and cut into a page.
pub async fn rules(State(s): State<AdminState>, Query(q): Query<RulesQuery>) -> Response {
    let board = &*s.limiter.telemetry().recorder;
    let now = board.now();
    let set = s.limiter.rules();
    let envoy = board.envoy_limits();
    let mut rows = rows(&set, &envoy, now);
    let total = rows.len();
    if let Some(f) = q.filter.as_deref().filter(|f| !f.is_empty()) {
        let f = f.to_lowercase();
        rows.retain(|r| r.name.to_lowercase().contains(&f));
    }
    let sort = q.sort.as_deref().unwrap_or("name");
    let desc = match q.order.as_deref() {
        Some("asc") => false,
        Some("desc") => true,
        None => !matches!(sort, "name" | "position"),
        Some(other) => return QueryError::Order(other.to_owned()).into_response(),
    };
    if let Err(e) = sort_rows(&mut rows, sort, desc) {
        return e.into_response();
    }
    let matched = rows.len();
    let offset = q.offset.unwrap_or(0).min(matched);
    let limit = q.limit.unwrap_or(100).min(MAX_PAGE);
    let points = q.points.unwrap_or(SECONDS);
    let page: Vec<Value> = rows[offset..(offset + limit).min(matched)]
        .iter()
        .map(|r| row_json(&s, r, now, points))
        .collect();
    Json(json!({
        "now": now,
        "total": total,
        "matched": matched,
        "offset": offset,
        "rules": page,
    }))
    .into_response()
}

/// `GET /api/v1/rules/{name}`: one rule's 900 seconds and its top actors in
/// each window.
pub async fn rule(State(s): State<AdminState>, Path(name): Path<String>) -> Response {
    let board = &*s.limiter.telemetry().recorder;
    let now = board.now();
    let set = s.limiter.rules();
    let envoy = board.envoy_limits();
    let rows = rows(&set, &envoy, now);
    let Some(row) = rows.iter().find(|r| r.name == name) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("no rule named {name:?} is in force")})),
        )
            .into_response();
    };
    let mut v = row_json(&s, row, now, SECONDS);
    v["offenders"] = json!({
        "1m": board.top(60, Some(&name), 20),
        "5m": board.top(300, Some(&name), 20),
        "15m": board.top(900, Some(&name), 20),
    });
    let rule = set.rules().iter().find(|r| r.name() == name);
    if rule.is_some_and(|r| r.spec.limits.iter().any(|l| l.fair_share.is_some())) {
        v["fair"] = super::fair::page_json(s.limiter.fair(), &name, 1, 50);
    }
    if let Some(r) = rule.filter(|r| r.spec.limits.iter().any(|l| l.overdraft)) {
        v["overdraft"] = super::debts::rule_json(&s, r).await;
    }
    Json(v).into_response()
}

/// The query of `GET /api/v1/offenders`.
#[derive(Debug, Default, Deserialize)]
pub struct OffendersQuery {
    /// `1m`, `5m` (the default) or `15m`.
    pub window: Option<String>,
    /// One rule's offenders only.
    pub rule: Option<String>,
    /// How many (20 by default, at most [`MAX_TOP`]).
    pub top: Option<usize>,
}

/// `GET /api/v1/offenders`: the actors with the most denied hits.
pub async fn offenders(State(s): State<AdminState>, Query(q): Query<OffendersQuery>) -> Response {
    let seconds = match window_seconds(q.window.as_deref()) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let rule = q.rule.as_deref().filter(|r| !r.is_empty());
    let top = q.top.unwrap_or(20).clamp(1, MAX_TOP);
    Json(json!({
        "window": q.window.as_deref().unwrap_or("5m"),
        "rule": rule,
        "capacity": crate::observe::offenders::CAPACITY,
        "offenders": s.limiter.telemetry().recorder.top(seconds, rule, top),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_series() {
        assert_eq!(window_seconds(None), Ok(300));
        assert_eq!(window_seconds(Some("1m")), Ok(60));
        assert!(window_seconds(Some("2m")).is_err());
        let mut seconds = vec![Second::default(); SECONDS];
        seconds[SECONDS - 1] = Second {
            allowed: 10,
            denied: 20,
        };
        let (a, d) = series(&seconds, 90);
        assert_eq!((a.len(), d.len()), (90, 90));
        assert_eq!((a[89], d[89]), (1.0, 2.0));
        assert_eq!(series(&seconds, 900).1[899], 20.0);
    }
}
