//! The admin API's routes and their handlers (the knob changes are in `knobs.rs`).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::UNIX_EPOCH;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::auth;
use super::render::{knob_json, limit_json};
use super::state::AdminState;
use crate::limiter::{counter_op, knob_for};
use crate::rules::Operation;
use crate::server::json::{format_response, parse_request};
use crate::server::readiness::{Readiness, Verdict};
use crate::store::Charge;

/// The admin routes; `metrics_path` is where Prometheus scrapes. With a
/// read token, one layer ([`auth::gate`]) protects every route, present and
/// future, but the open list.
pub fn router(state: AdminState, metrics_path: &str) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/config", get(config))
        .route("/explain", get(explain))
        .route("/json", post(json_check))
        .route("/global", get(global))
        .route("/governors", get(governors))
        .route("/rlqs", get(super::rlqs::list))
        .route("/fair", get(super::fair::list))
        .route("/healthcheck", get(healthcheck))
        .route("/rlconfig", get(rlconfig))
        .route("/knobs", get(super::knobs::list))
        .route(
            "/knobs/{label}",
            axum::routing::put(super::knobs::set).delete(super::knobs::delete),
        )
        .route(
            "/counters",
            get(super::counters::get).delete(super::counters::delete),
        )
        .route("/metrics", get(prometheus))
        .route("/api/v1/overview", get(super::api::overview))
        .route("/api/v1/rules", get(super::api::rules))
        .route("/api/v1/rules/{name}", get(super::api::rule))
        .route("/api/v1/offenders", get(super::api::offenders))
        .route("/api/v1/knobs", get(super::knobs::list))
        .route("/api/v1/global", get(global))
        .route("/api/v1/rlqs", get(super::rlqs::list))
        .route("/api/v1/fair", get(super::fair::list))
        .route("/api/v1/governors", get(governors))
        .route("/ui", get(super::ui::page))
        .route("/ui/{asset}", get(super::ui::asset));
    if metrics_path != "/metrics" {
        router = router.route(metrics_path, get(prometheus));
    }
    let protect = state.tokens.read.is_some();
    let gate = auth::Gate::new(
        state.tokens.clone(),
        metrics_path,
        state.limiter.telemetry().metrics.clone(),
    );
    let router = router.with_state(state);
    // Without a read token the layer would pass everything: leave it out.
    if protect {
        router.layer(axum::middleware::from_fn_with_state(gate, auth::gate))
    } else {
        router
    }
}

/// Serves the admin API on `listener` until `shutdown` completes.
pub async fn serve_http(
    listener: TcpListener,
    state: AdminState,
    metrics_path: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router(state, metrics_path).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// Serves the admin API over TLS (with `tls`, its certificate rotating) on
/// `listener` until `shutdown` completes.
pub async fn serve_https(
    listener: TcpListener,
    tls: crate::server::tls::ServerTls,
    state: AdminState,
    metrics_path: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // tap_io: axum gives `ConnectInfo<SocketAddr>` (the knob changes log
    // it) for a listener of its own type or a tapped one.
    let listener = crate::server::tls::TlsListener::new(listener, tls)?.tap_io(|_| {});
    axum::serve(
        listener,
        router(state, metrics_path).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

async fn readyz(State(s): State<AdminState>) -> Response {
    let shutting_down = s.shutting_down.load(Ordering::Acquire);
    match s.readiness.check(&s.limiter, shutting_down) {
        Verdict::Ready => "ready\n".into_response(),
        Verdict::Degraded(why) => format!("ready ({why})\n").into_response(),
        Verdict::NotReady(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// `GET /global`: this region's leases of global limits and the world's shares.
async fn global(State(s): State<AdminState>) -> Json<Value> {
    Json(match s.limiter.global() {
        Some(g) => g.describe(),
        None => {
            json!({"enabled": false, "message": "no --global-url: global limits count as local token buckets"})
        }
    })
}

async fn prometheus(State(s): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.limiter.telemetry().metrics.render(),
    )
        .into_response()
}

async fn config(State(s): State<AdminState>) -> Json<Value> {
    let rules = s.limiter.rules();
    let status = s.status.snapshot();
    let list: Vec<Value> = rules
        .rules()
        .iter()
        .map(|r| {
            let spec = &r.spec;
            let operation: serde_json::Map<String, Value> = spec
                .operation
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            let first = spec.first_limit();
            let knobs = s.limiter.knobs();
            let limits: Vec<Value> = spec
                .limits
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let mut v = limit_json(l);
                    let knob = knob_for(knobs, spec, i);
                    v["effective"] =
                        limit_json(&knob.as_ref().map_or_else(|| l.clone(), |k| k.apply(l)));
                    v["knob"] = knob.map_or(Value::Null, |k| knob_json(&k));
                    v
                })
                .collect();
            json!({
                "position": spec.position,
                "aux": spec.aux,
                "default": spec.is_default,
                "label": spec.label,
                "domain": spec.domain,
                "operation": operation,
                "creditLimit": first.credit_limit,
                "resetSeconds": first.reset_seconds,
                "algorithm": first.algorithm.as_str(),
                "burst": first.burst,
                "actorField": first.actor_field,
                "limits": limits,
                "matchPolicy": spec.match_policy.as_str(),
                "comment": spec.comment,
            })
        })
        .collect();
    Json(json!({
        "source": rules.source(),
        "hash": status.hash,
        "generation": status.generation,
        "loadedAt": status.loaded_at.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs_f64()),
        "lastReloadError": status.last_error,
        "reloads": {"succeeded": status.successes, "failed": status.failures},
        "store": s.limiter.store().name(),
        "charge": match rules.charge() {
            Charge::AllOrNothing => "all-or-nothing",
            _ => "each",
        },
        "rules": list,
        "domains": rules
            .envoy_domains()
            .iter()
            .map(|t| json!({"domain": t.domain(), "source": t.config.file}))
            .collect::<Vec<_>>(),
    }))
}

async fn explain(State(s): State<AdminState>, RawQuery(query): RawQuery) -> Response {
    let query = query.unwrap_or_default();
    let mut domain = None;
    let mut pairs = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "domain" {
            if v.is_empty() {
                return (
                    StatusCode::BAD_REQUEST,
                    Json(json!({"error": "domain must not be empty (omit it to explain a line-protocol HIT)"})),
                )
                    .into_response();
            }
            domain = Some(v.into_owned());
        } else {
            pairs.push((k, v));
        }
    }
    let op = Operation::from_pairs(pairs);
    let rules = s.limiter.rules();
    let plan = rules.plan(domain.as_deref(), &op);
    let mut describe = Vec::new();
    for (i, role) in plan
        .canaries
        .iter()
        .map(|&c| (c, "canary"))
        .chain(std::iter::once((plan.decider, "decider")))
    {
        let rule = rules.rule(i);
        let mut limits = Vec::with_capacity(rule.spec.limits.len());
        for (i, own) in rule.spec.limits.iter().enumerate() {
            limits.push(limit_explained(&s, rule, &op, i, own).await);
        }
        describe.push(rule_explained(rule, role, limits));
    }
    let decider = describe.pop().unwrap_or(Value::Null);
    Json(json!({
        "domain": domain,
        "request": op.pairs().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "decider": decider,
        "canaries": describe,
    }))
    .into_response()
}

/// Limit `i` (`own`, as written) of `rule` for request `op`: knobs
/// applied, its kind, its counter key and what the store holds of it, and
/// a fairShare limit's share.
async fn limit_explained(
    s: &AdminState,
    rule: &crate::rules::Rule,
    op: &Operation,
    i: usize,
    own: &crate::config::LimitSpec,
) -> Value {
    let spec = &rule.spec;
    let knob = knob_for(s.limiter.knobs(), spec, i);
    let effective = knob.as_ref().map_or_else(|| own.clone(), |k| k.apply(own));
    let limit = &effective;
    let mut v = limit_json(limit);
    v["knob"] = knob.map_or(Value::Null, |k| knob_json(&k));
    let fair_value = limit
        .fair_share
        .as_ref()
        .map(|f| op.get(&f.by).unwrap_or(""));
    let (kind, op) = match (limit.credit_limit, limit.reset_seconds) {
        (0, _) => ("always deny", None),
        (_, 0) => ("always allow", None),
        _ => ("counted", Some(counter_op(rule, op, own, limit))),
    };
    v["kind"] = json!(kind);
    v["counterKey"] = json!(op.as_ref().map(|o| o.key.clone()));
    if let (Some(f), Some(value), Some(o)) = (&limit.fair_share, fair_value, &op) {
        v["fairShare"] = fair_json(s, f, limit, &o.key, value);
    }
    v["counter"] = match &op {
        None => Value::Null,
        Some(o) => counter_json(s.limiter.store().as_ref(), o, limit).await,
    };
    v
}

/// A rule of the plan, as `role` (decider or canary), with its `limits`
/// explained: its first limit's figures repeated at the top.
fn rule_explained(rule: &crate::rules::Rule, role: &str, limits: Vec<Value>) -> Value {
    let spec = &rule.spec;
    let first = limits.first().cloned().unwrap_or(Value::Null);
    // What the next hit would meet (a shadow rule still never denies it).
    let would_deny = limits
        .iter()
        .any(|v| v["kind"] == "always deny" || v["counter"]["remaining"] == json!(0));
    json!({
        "role": role,
        "matchPolicy": spec.match_policy.as_str(),
        "shadow": rule.is_shadow(),
        "wouldDeny": would_deny,
        "rule": spec.to_string(),
        "position": spec.position,
        "label": spec.label,
        "comment": spec.comment,
        "kind": first["kind"],
        "creditLimit": first["creditLimit"],
        "resetSeconds": first["resetSeconds"],
        "algorithm": first["algorithm"],
        "counterKey": first["counterKey"],
        "counter": first["counter"],
        "limits": limits,
    })
}

/// What the store holds of `op`'s counter (a check: nothing is charged);
/// for an `overdraft` limit, its debt too.
async fn counter_json(
    store: &dyn crate::store::Store,
    op: &crate::store::CounterOp,
    limit: &crate::config::LimitSpec,
) -> Value {
    let mut v = match store.peek(op).await {
        Ok(None) => json!({"open": false, "remaining": limit.burst}),
        Ok(Some(st)) => json!({
            "open": true,
            "remaining": st.remaining,
            "resetSeconds": st.reset_after.as_secs_f64(),
        }),
        Err(e) => return json!({"error": e.to_string()}),
    };
    if limit.overdraft {
        v["debt"] = super::debts::debt_of(store, op).await;
    }
    v
}

/// A fairShare limit's key, the request's value and its current share and
/// demand (credits per second) on this replica, if the value is active.
fn fair_json(
    s: &AdminState,
    f: &crate::config::FairShareSpec,
    limit: &crate::config::LimitSpec,
    key: &str,
    value: &str,
) -> Value {
    // A global limit's counter is the region's lease of it.
    let counter = match (limit.global, s.limiter.global()) {
        (true, Some(_)) => format!("{key}:global"),
        _ => key.to_owned(),
    };
    let live = s.limiter.fair().share_of(&counter, value);
    json!({
        "by": f.by,
        "value": value,
        "active": live.is_some(),
        "shareRate": live.map(|(share, _)| share),
        "demandRate": live.map(|(_, demand)| demand),
        "idleSeconds": f.idle.as_secs_f64(),
        "maxActors": f.max_actors,
        "shareCounterKey": format!("{counter}:fair:{value}"),
    })
}

async fn json_check(State(s): State<AdminState>, headers: HeaderMap, body: Bytes) -> Response {
    let deadline = crate::server::deadline::caller_timeout(&headers).map(|timeout| {
        crate::server::deadline::store_deadline(
            tokio::time::Instant::now(),
            timeout,
            s.deadline_margin,
        )
    });
    let bad = |message: String| {
        s.limiter.telemetry().metrics.error("invalid-argument");
        (StatusCode::BAD_REQUEST, Json(json!({"error": message}))).into_response()
    };
    let request = match parse_request(&body) {
        Ok(r) => r,
        Err(e) => return bad(e),
    };
    let style = crate::server::rls::ResponseStyle::default();
    match crate::server::rls::respond(&s.limiter, style, request, deadline).await {
        Ok(response) => {
            let code = if response.overall_code == 2 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (code, Json(format_response(&response))).into_response()
        }
        Err(status) if status.code() == tonic::Code::InvalidArgument => {
            bad(status.message().to_owned())
        }
        Err(status) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": status.message()})),
        )
            .into_response(),
    }
}

/// `GET /governors`: each governor's lease, last measurement, terms and output.
async fn governors(State(s): State<AdminState>) -> Json<Value> {
    Json(json!({
        "replica": s.governors.replica(),
        "governors": s.governors.states(),
    }))
}

/// `GET /healthcheck` (envoyproxy/ratelimit's): 200 `OK` while ready, 500 otherwise.
async fn healthcheck(State(s): State<AdminState>) -> Response {
    // envoyproxy/ratelimit's health: a configuration is needed only with
    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, unlike /readyz.
    let health = Readiness {
        needs_config: s.healthy_needs_config,
        ..s.readiness
    };
    let ready = health
        .check(&s.limiter, s.shutting_down.load(Ordering::Acquire))
        .is_ready();
    if ready {
        "OK".into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK").into_response()
    }
}

/// `GET /rlconfig` (envoyproxy/ratelimit's): the limits in force as text,
/// one line per limit of each envoyproxy/ratelimit domain, then the divvy
/// rules.
async fn rlconfig(State(s): State<AdminState>) -> String {
    let rules = s.limiter.rules();
    let mut out = String::new();
    for tree in rules.envoy_domains() {
        // Where it came from: a file, or `xds:<resource>@<version>`.
        out.push_str(&format!("# {} from {}\n", tree.domain(), tree.config.file));
        out.push_str(&tree.dump());
    }
    if rules.has_divvy_rules() {
        for r in rules.rules() {
            out.push_str(&format!("divvy {}\n", r.spec));
        }
    }
    out
}
