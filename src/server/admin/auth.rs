//! Who may call the admin API.
//!
//! Two bearer tokens: `--admin-token` reads and changes knobs;
//! `--admin-read-token` only reads. With a read token set, every route needs
//! one of the two ([`gate`], one layer over the whole router), except the
//! explicit open list (health, readiness and the metrics path) that probes
//! and Prometheus call without credentials: a route added later is
//! protected unless it is put on that list. Without a read token, reads stay
//! open. Tokens are compared in constant time and never logged; refusals are
//! counted in `divvy_admin_auth_failures_total{reason}`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::observe::metrics::Metrics;

/// Paths answered without a token even when a read token is set (the
/// metrics path is added by [`Gate::new`]).
pub const OPEN_PATHS: [&str; 4] = ["/healthz", "/readyz", "/healthcheck", "/metrics"];

/// The admin API's tokens.
#[derive(Clone, Default)]
pub struct Tokens {
    /// Reads and changes knobs; `None`: knob changes are refused.
    pub admin: Option<Arc<str>>,
    /// Only reads; `None`: reads need no token.
    pub read: Option<Arc<str>>,
}

/// Who a request's `Authorization` header says the caller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// It carries the admin token.
    Admin,
    /// It carries the read token.
    Reader,
    /// It carries no bearer token.
    Missing,
    /// It carries a bearer token that is neither.
    Wrong,
}

impl Tokens {
    /// Classifies the caller of a request by its bearer token.
    pub fn caller(&self, headers: &HeaderMap) -> Caller {
        let Some(given) = bearer(headers) else {
            return Caller::Missing;
        };
        // Both comparisons always run, so the time taken does not tell
        // which token (if any) matched.
        let admin = self.admin.as_deref().is_some_and(|t| same(given, t));
        let read = self.read.as_deref().is_some_and(|t| same(given, t));
        match (admin, read) {
            (true, _) => Caller::Admin,
            (false, true) => Caller::Reader,
            (false, false) => Caller::Wrong,
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .filter(|t| !t.is_empty())
}

/// Hashes of equal length, compared in constant time: neither the token's
/// bytes nor its length show in the time taken.
fn same(given: &str, token: &str) -> bool {
    let digest = |t: &str| Sha256::digest(t.as_bytes());
    bool::from(digest(given).ct_eq(&digest(token)))
}

/// Counts one refusal by reason (one of [`crate::observe::metrics::AUTH_FAILURE_REASONS`]).
pub fn count_failure(metrics: &Metrics, reason: &str) {
    metrics
        .admin_auth_failures
        .with_label_values(&[reason])
        .inc();
}

/// What [`gate`] checks: the tokens and the open paths.
#[derive(Clone)]
pub struct Gate {
    tokens: Tokens,
    metrics_path: Arc<str>,
    metrics: Arc<Metrics>,
}

impl Gate {
    /// A gate for `tokens` that leaves [`OPEN_PATHS`] and `metrics_path`
    /// open, counting refusals in `metrics`.
    pub fn new(tokens: Tokens, metrics_path: &str, metrics: Arc<Metrics>) -> Gate {
        Gate {
            tokens,
            metrics_path: Arc::from(metrics_path),
            metrics,
        }
    }

    /// Whether `path` is answered without a token: the open list, the
    /// metrics path, and the dashboard's shell (`/ui` and its embedded
    /// assets, which hold no data: the page asks for a token to read the API).
    pub fn is_open(&self, path: &str) -> bool {
        OPEN_PATHS.contains(&path)
            || path == &*self.metrics_path
            || path == "/ui"
            || path.starts_with("/ui/")
    }
}

/// The layer over every admin route: with a read token set, a request to a
/// path off the open list needs the read or the admin token (missing: 401
/// with `WWW-Authenticate: Bearer`; wrong: 403).
pub async fn gate(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    if gate.tokens.read.is_none() || gate.is_open(request.uri().path()) {
        return next.run(request).await;
    }
    let reason = match gate.tokens.caller(request.headers()) {
        Caller::Admin | Caller::Reader => return next.run(request).await,
        Caller::Missing => "missing",
        Caller::Wrong => "wrong",
    };
    count_failure(&gate.metrics, reason);
    let from = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    tracing::debug!(path = %request.uri().path(), from = ?from, reason, "admin request refused");
    refusal(reason)
}

/// The answer to a refused read: 401 when no token was sent, 403 when a
/// wrong one was.
fn refusal(reason: &str) -> Response {
    if reason == "missing" {
        let mut response = (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "the admin API needs `Authorization: Bearer <token>` with the read or the admin token"})),
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        response
    } else {
        (
            StatusCode::FORBIDDEN,
            Json(json!({"error": "the bearer token is neither the read nor the admin token"})),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    #[test]
    fn callers_are_told_apart_by_their_token() {
        let tokens = Tokens {
            admin: Some(Arc::from("adm")),
            read: Some(Arc::from("rd")),
        };
        assert_eq!(tokens.caller(&headers(Some("Bearer adm"))), Caller::Admin);
        assert_eq!(tokens.caller(&headers(Some("bearer rd"))), Caller::Reader);
        assert_eq!(tokens.caller(&headers(Some("Bearer x"))), Caller::Wrong);
        assert_eq!(tokens.caller(&headers(Some("Basic rd"))), Caller::Missing);
        assert_eq!(tokens.caller(&headers(Some("Bearer "))), Caller::Missing);
        assert_eq!(tokens.caller(&headers(None)), Caller::Missing);
        let no_read = Tokens {
            admin: Some(Arc::from("adm")),
            read: None,
        };
        assert_eq!(no_read.caller(&headers(Some("Bearer rd"))), Caller::Wrong);
    }

    #[test]
    fn only_the_listed_paths_and_the_metrics_path_are_open() {
        let metrics = Arc::new(Metrics::new());
        let gate = Gate::new(Tokens::default(), "/prom", metrics);
        for open in [
            "/healthz",
            "/readyz",
            "/healthcheck",
            "/metrics",
            "/prom",
            "/ui",
            "/ui/app.js",
        ] {
            assert!(gate.is_open(open), "{open}");
        }
        for closed in [
            "/config",
            "/knobs",
            "/api/v1/x",
            "/api/v1/rules",
            "/uix",
            "/healthz/",
            "/",
        ] {
            assert!(!gate.is_open(closed), "{closed}");
        }
    }
}
