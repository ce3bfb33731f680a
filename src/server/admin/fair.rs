//! `GET /fair?rule=LABEL`: a fairShare rule's active values, with each
//! one's demand, share and admitted rate, paged.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::state::AdminState;
use crate::fair::FairShares;

/// Values listed per page unless `perPage` says otherwise.
const PER_PAGE: usize = 100;
/// Most values listed per page.
const MOST_PER_PAGE: usize = 1000;

/// The query of `GET /fair`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FairQuery {
    /// The rule's label (or a `limits` entry's label, or the rule's name).
    pub rule: Option<String>,
    /// The page, from 1.
    pub page: Option<usize>,
    /// Values per page (100 by default, at most 1000).
    pub per_page: Option<usize>,
}

/// `GET /fair?rule=LABEL[&page=N][&perPage=M]`.
pub async fn list(State(s): State<AdminState>, Query(q): Query<FairQuery>) -> Response {
    let Some(rule) = q.rule.filter(|r| !r.is_empty()) else {
        return bad(
            StatusCode::BAD_REQUEST,
            "give the rule: /fair?rule=LABEL".to_owned(),
        );
    };
    let set = s.limiter.rules();
    let known = set.rules().iter().any(|r| {
        r.name() == rule
            || r.spec
                .limits
                .iter()
                .any(|l| l.label.as_deref() == Some(&rule))
    });
    if !known {
        return bad(
            StatusCode::NOT_FOUND,
            format!("no rule or limit named {rule:?} is in force"),
        );
    }
    let per_page = q.per_page.unwrap_or(PER_PAGE).clamp(1, MOST_PER_PAGE);
    let page = q.page.unwrap_or(1).max(1);
    Json(page_json(s.limiter.fair(), &rule, page, per_page)).into_response()
}

fn bad(code: StatusCode, error: String) -> Response {
    (code, Json(json!({ "error": error }))).into_response()
}

/// One page of the rule's values, over every counter of the rule.
pub(super) fn page_json(fair: &FairShares, rule: &str, page: usize, per_page: usize) -> Value {
    let counters = fair.view(rule);
    let total: usize = counters.iter().map(|c| c.actors.len()).sum();
    let rows = counters.iter().flat_map(|c| {
        c.actors.iter().map(move |a| {
            json!({
                "counter": c.key,
                "limit": c.limit,
                "value": a.value,
                "demandRate": round(a.demand),
                "shareRate": round(a.share),
                "admittedRate": round(a.admitted),
            })
        })
    });
    let values: Vec<Value> = rows
        .skip((page - 1).saturating_mul(per_page))
        .take(per_page)
        .collect();
    json!({
        "rule": rule,
        "counters": counters.iter().map(|c| json!({
            "counter": c.key,
            "limit": c.limit,
            "rate": round(c.rate),
            "active": c.actors.len(),
        })).collect::<Vec<_>>(),
        "active": total,
        "page": page,
        "perPage": per_page,
        "pages": total.div_ceil(per_page),
        "values": values,
    })
}

/// Rates to a thousandth (what a reader can use).
fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
