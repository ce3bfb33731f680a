//! `GET /counters?rule=LABEL&actor=VALUE` and `DELETE /counters?...`
//! (see [`crate::counters`] and docs/counters.md).
//!
//! Reading is a read like any other (the read or admin token when a read
//! token is set). A reset needs the admin token, as a knob change does; it
//! is logged with the caller's address, the rule, the actor and the keys
//! (never the token) and counted in `divvy_counter_resets_total{result}`.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::auth::{count_failure, Caller};
use super::render::limit_json;
use super::state::AdminState;
use crate::counters::resets::ResetError;
use crate::counters::{find, CounterQuery, QueryError, Target};
use crate::store::{CounterOp, Store};

fn count(s: &AdminState, result: &str) {
    s.limiter
        .telemetry()
        .metrics
        .counters
        .resets
        .with_label_values(&[result])
        .inc();
}

fn error(code: StatusCode, message: String) -> Response {
    (code, Json(json!({"error": message}))).into_response()
}

fn query_error(e: &QueryError) -> Response {
    let code = match e {
        QueryError::UnknownRule(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::BAD_REQUEST,
    };
    error(code, e.to_string())
}

/// The counters the query names.
fn targets(s: &AdminState, query: Option<&str>) -> Result<(CounterQuery, Vec<Target>), QueryError> {
    let query = CounterQuery::parse(query.unwrap_or_default())?;
    let found = find(&s.limiter.rules(), s.limiter.knobs(), &query)?;
    Ok((query, found))
}

/// `GET /counters`: each counter's key, count, remaining, debt, reset and
/// whether this replica's over-limit cache holds a denial of it.
pub async fn get(State(s): State<AdminState>, RawQuery(query): RawQuery) -> Response {
    let (query, found) = match targets(&s, query.as_deref()) {
        Ok(t) => t,
        Err(e) => return query_error(&e),
    };
    let store = s.limiter.store();
    let mut counters = Vec::with_capacity(found.len());
    for t in &found {
        counters.push(counter_json(store.as_ref(), t).await);
    }
    Json(answer(&s, &query, counters)).into_response()
}

fn answer(s: &AdminState, query: &CounterQuery, counters: Vec<Value>) -> Value {
    json!({
        "rule": query.rule,
        "actor": query.actor,
        "store": s.limiter.store().name(),
        "shared": s.resets.is_shared(),
        "counters": counters,
    })
}

/// One counter as the store holds it now (nothing is charged).
async fn counter_json(store: &dyn Store, t: &Target) -> Value {
    let mut v = json!({
        "rule": t.rule,
        "limitLabel": t.limit_label,
        "limit": limit_json(&t.limit),
        "key": t.op.as_ref().map(|o| o.key.clone()),
    });
    let Some(op) = &t.op else {
        v["counted"] = json!(false);
        return v;
    };
    v["counted"] = json!(true);
    let (open, remaining, reset) = match store.peek(op).await {
        Ok(None) => (false, op.burst, 0.0),
        Ok(Some(st)) => (true, st.remaining, st.reset_after.as_secs_f64()),
        Err(e) => {
            v["error"] = json!(e.to_string());
            return v;
        }
    };
    v["open"] = json!(open);
    v["count"] = json!(op.burst.saturating_sub(remaining));
    v["remaining"] = json!(remaining);
    v["reset"] = json!(reset);
    v["debt"] = debt(store, op).await;
    v["overLimitCache"] = json!(store.cached_denial(&op.key));
    v
}

/// An overdraft limit's debt (0 for every other limit).
async fn debt(store: &dyn Store, op: &CounterOp) -> Value {
    if !op.overdraft {
        return json!(0);
    }
    let (probe, added) = crate::store::algorithm::debt_probe(op);
    match store.peek(&probe).await {
        Ok(None) => json!(0),
        Ok(Some(st)) => json!(added.saturating_sub(st.remaining)),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// `None` when the caller may reset counters, else the refusal.
fn authorize(s: &AdminState, headers: &HeaderMap) -> Option<Response> {
    if s.tokens.admin.is_none() {
        return Some(error(
            StatusCode::FORBIDDEN,
            "counter resets are disabled: start the server with --admin-token (or DIVVY_ADMIN_TOKEN) \
             and send it as `Authorization: Bearer <token>`"
                .to_owned(),
        ));
    }
    let (code, reason) = match s.tokens.caller(headers) {
        Caller::Admin => return None,
        Caller::Reader => (StatusCode::FORBIDDEN, "read_only"),
        Caller::Missing => (StatusCode::UNAUTHORIZED, "missing"),
        Caller::Wrong => (StatusCode::UNAUTHORIZED, "wrong"),
    };
    count_failure(&s.limiter.telemetry().metrics, reason);
    let mut refused = error(
        code,
        "a counter reset needs `Authorization: Bearer <token>` with the server's admin token"
            .to_owned(),
    );
    if code == StatusCode::UNAUTHORIZED {
        refused.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    Some(refused)
}

/// `DELETE /counters`: deletes each counter in the store and tells every
/// replica to drop its cached denials; answers the counters afterwards.
pub async fn delete(
    State(s): State<AdminState>,
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let raw = query.as_deref().unwrap_or_default();
    if let Some(refused) = authorize(&s, &headers) {
        count(&s, "refused");
        tracing::warn!(query = %raw, from = %from, "counter reset refused: not authorized");
        return refused;
    }
    let (query, found) = match targets(&s, query.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            count(&s, "invalid");
            tracing::warn!(query = %raw, from = %from, "counter reset refused: {e}");
            return query_error(&e);
        }
    };
    let keys: Vec<&str> = found
        .iter()
        .filter_map(|t| t.op.as_ref())
        .map(|o| o.key.as_str())
        .collect();
    let mut existed = Vec::with_capacity(keys.len());
    for key in &keys {
        match s.resets.reset(key).await {
            Ok(was) => existed.push(was),
            Err(e) => return failed(&s, &query, &keys, from, &e),
        }
    }
    count(&s, "reset");
    tracing::info!(
        rule = %query.rule,
        actor = ?query.actor,
        keys = ?keys,
        existed = ?existed,
        from = %from,
        by = "admin token",
        "counters reset"
    );
    let store = s.limiter.store();
    let mut counters = Vec::with_capacity(found.len());
    for t in &found {
        counters.push(counter_json(store.as_ref(), t).await);
    }
    let mut v = answer(&s, &query, counters);
    v["reset"] = json!(true);
    v["existed"] = json!(existed);
    Json(v).into_response()
}

fn failed(
    s: &AdminState,
    query: &CounterQuery,
    keys: &[&str],
    from: SocketAddr,
    e: &ResetError,
) -> Response {
    count(s, "failed");
    tracing::warn!(rule = %query.rule, actor = ?query.actor, keys = ?keys, from = %from, "counter reset failed: {e}");
    error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}
