//! `GET /knobs`, `PUT /knobs/{label}`, `DELETE /knobs/{label}`.
//!
//! Changes need `Authorization: Bearer <token>` equal to `--admin-token`
//! (compared in constant time): a wrong or missing token gets 401, the read
//! token (`--admin-read-token`) 403; a server started without an admin token
//! refuses every change with 403. Reading needs a token only when a read
//! token is set (see [`super::auth`]). Every change is logged with the
//! label, old and new values and the caller's address (never the token) and
//! counted in `divvy_knob_changes_total{action}`.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::auth::{count_failure, Caller};
use super::render::{knob_json, limit_json};
use super::state::AdminState;
use crate::clock::now_ms;
use crate::knobs::body::target;
use crate::knobs::{KnobBody, KnobError};
use crate::observe::metrics::Metrics;

fn refuse(metrics: &Metrics, code: StatusCode, message: String) -> Response {
    metrics.knob_changes.with_label_values(&["refused"]).inc();
    let mut response = (code, Json(json!({"error": message}))).into_response();
    if code == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// `None` when the caller may change knobs, else the refusal.
fn authorize(state: &AdminState, headers: &HeaderMap) -> Option<Response> {
    if state.tokens.admin.is_none() {
        return Some(refuse(
            &state.limiter.telemetry().metrics,
            StatusCode::FORBIDDEN,
            "knob changes are disabled: start the server with --admin-token (or DIVVY_ADMIN_TOKEN) \
             and send it as `Authorization: Bearer <token>`"
                .to_owned(),
        ));
    }
    let (code, reason, message) = match state.tokens.caller(headers) {
        Caller::Admin => return None,
        // Known, but only allowed to read.
        Caller::Reader => (
            StatusCode::FORBIDDEN,
            "read_only",
            "the read token can not change knobs; send the admin token",
        ),
        Caller::Missing => (
            StatusCode::UNAUTHORIZED,
            "missing",
            "a knob change needs `Authorization: Bearer <token>` with the server's admin token",
        ),
        Caller::Wrong => (
            StatusCode::UNAUTHORIZED,
            "wrong",
            "a knob change needs `Authorization: Bearer <token>` with the server's admin token",
        ),
    };
    count_failure(&state.limiter.telemetry().metrics, reason);
    Some(refuse(
        &state.limiter.telemetry().metrics,
        code,
        message.to_owned(),
    ))
}

fn status_of(e: &KnobError) -> StatusCode {
    match e {
        KnobError::Invalid(_) => StatusCode::BAD_REQUEST,
        KnobError::UnknownLabel(_) | KnobError::NoKnob(_) => StatusCode::NOT_FOUND,
        KnobError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// `GET /knobs`: every knob in force.
pub async fn list(State(s): State<AdminState>) -> Json<Value> {
    let rules = s.limiter.rules();
    let knobs: Vec<Value> = s
        .limiter
        .knobs()
        .list()
        .into_iter()
        .map(|(label, k)| {
            let mut v = knob_json(&k);
            v["label"] = json!(label);
            // A knob whose label left the policy is kept, but does nothing.
            v["active"] = json!(target(&rules, &label).is_ok());
            v
        })
        .collect();
    Json(json!({
        "shared": s.limiter.knobs().is_shared(),
        "knobs": knobs,
    }))
}

/// `PUT /knobs/{label}`: sets a knob.
pub async fn set(
    State(s): State<AdminState>,
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    Path(label): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = authorize(&s, &headers) {
        tracing::warn!(label = %label, from = %from, "knob change refused: not authorized");
        return refused;
    }
    let rules = s.limiter.rules();
    let knobs = s.limiter.knobs();
    let knob = match KnobBody::parse(&body)
        .and_then(|b| b.knob_for(&rules, &label, knobs.replica(), now_ms()))
    {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(label = %label, from = %from, "knob change refused: {e}");
            return refuse(&s.limiter.telemetry().metrics, status_of(&e), e.to_string());
        }
    };
    match knobs.set(&label, knob.clone()).await {
        Ok(old) => {
            s.limiter
                .telemetry()
                .metrics
                .knob_changes
                .with_label_values(&["set"])
                .inc();
            tracing::info!(
                label = %label,
                old = %old.as_ref().map_or_else(|| "(rule's own values)".to_owned(), |k| k.fields()),
                new = %knob.fields(),
                ttl_seconds = ?knob.expires_at_ms.map(|t| t.saturating_sub(knob.set_at_ms) / 1000),
                from = %from,
                "knob set"
            );
            let effective = target(&rules, &label).map(|l| limit_json(&knob.apply(l)));
            let mut v = knob_json(&knob);
            v["label"] = json!(label);
            v["effective"] = effective.unwrap_or(Value::Null);
            (StatusCode::OK, Json(v)).into_response()
        }
        Err(e) => {
            tracing::warn!(label = %label, from = %from, "knob change failed: {e}");
            refuse(&s.limiter.telemetry().metrics, status_of(&e), e.to_string())
        }
    }
}

/// `DELETE /knobs/{label}`: the rule's own values again.
pub async fn delete(
    State(s): State<AdminState>,
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    Path(label): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = authorize(&s, &headers) {
        tracing::warn!(label = %label, from = %from, "knob delete refused: not authorized");
        return refused;
    }
    match s.limiter.knobs().delete(&label).await {
        Ok(old) => {
            s.limiter
                .telemetry()
                .metrics
                .knob_changes
                .with_label_values(&["delete"])
                .inc();
            tracing::info!(label = %label, old = %old.fields(), new = "(rule's own values)", from = %from, "knob deleted");
            let mut v = knob_json(&old);
            v["label"] = json!(label);
            v["deleted"] = json!(true);
            (StatusCode::OK, Json(v)).into_response()
        }
        Err(e) => refuse(&s.limiter.telemetry().metrics, status_of(&e), e.to_string()),
    }
}
