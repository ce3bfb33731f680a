//! Reading a governor's load from Prometheus (HTTP API `/api/v1/query`,
//! through the `prometheus-http-query` client).
//!
//! A reading is one number: a scalar, or a vector of exactly one sample.
//! Prometheus stamps an instant query's samples with the evaluation time,
//! and drops a series whose target stopped answering (its staleness
//! handling), so a dead exporter shows as an empty result; a sample stamped
//! more than `stale_after` before now (a Prometheus serving old data, or a
//! clock far off) is refused too.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_http_query::response::Data;
use prometheus_http_query::Client;
use thiserror::Error;

/// Why a query gave no usable number.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum ReadError {
    /// The URL is not one the client can use.
    #[error("cannot use the Prometheus URL `{0}`: {1}")]
    Url(String, String),
    /// Prometheus did not answer in time.
    #[error("Prometheus did not answer within {0:?}")]
    Timeout(Duration),
    /// Prometheus could not be reached or refused the query.
    #[error("query failed: {0}")]
    Failed(String),
    /// The query matched no series.
    #[error("the query returned no sample")]
    Empty,
    /// The query matched several series.
    #[error("the query returned {0} series; it must give one number (wrap it in max() or sum())")]
    Several(usize),
    /// The query gave a range, not an instant value.
    #[error("the query returned a range vector; use an instant query")]
    Range,
    /// The value is NaN or infinite.
    #[error("the query returned {0}, not a number")]
    NotANumber(f64),
    /// The sample is older than allowed.
    #[error("the sample is {0:.1} s old")]
    Stale(f64),
}

impl ReadError {
    /// The `result` label of `divvy_governor_queries_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            ReadError::Empty => "empty",
            ReadError::Stale(_) => "stale",
            ReadError::NotANumber(_) => "nan",
            _ => "error",
        }
    }
}

/// A Prometheus server to query.
#[derive(Clone)]
pub struct Prometheus {
    client: Client,
}

impl Prometheus {
    /// A client for `url` (`http://host:port`).
    pub fn new(url: &str) -> Result<Prometheus, ReadError> {
        Client::try_from(url)
            .map(|client| Prometheus { client })
            .map_err(|e| ReadError::Url(url.to_owned(), e.to_string()))
    }

    /// Evaluates `query` now and returns its one number.
    pub async fn read(
        &self,
        query: &str,
        timeout: Duration,
        stale_after: Duration,
    ) -> Result<f64, ReadError> {
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let asked = self.client.query(query).timeout(timeout_ms).get();
        let answer = tokio::time::timeout(timeout, asked)
            .await
            .map_err(|_| ReadError::Timeout(timeout))?
            .map_err(|e| ReadError::Failed(e.to_string()))?;
        let sample = match answer.data() {
            Data::Scalar(s) => *s,
            Data::Vector(v) => match v.as_slice() {
                [] => return Err(ReadError::Empty),
                [one] => *one.sample(),
                many => return Err(ReadError::Several(many.len())),
            },
            Data::Matrix(_) => return Err(ReadError::Range),
        };
        let value = sample.value();
        if !value.is_finite() {
            return Err(ReadError::NotANumber(value));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let age = now - sample.timestamp();
        if age > stale_after.as_secs_f64() {
            return Err(ReadError::Stale(age));
        }
        Ok(value)
    }
}
