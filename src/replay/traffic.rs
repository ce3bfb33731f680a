//! Recorded traffic, one request a line: the line protocol's text
//! (`HIT k=v ...`) or a `POST /json` body on one line, either optionally
//! preceded by a timestamp in ms since the epoch and a space (what
//! `serve --record` writes: `1764330000123 HIT path=/a ip=10.0.0.1`).

use crate::limiter::Hit;
use crate::observe::metrics::Metrics;
use crate::rules::OperationBuilder;
use crate::server::json::parse_request;
use crate::server::line::parse::parse_hit;

/// One recorded request.
#[derive(Debug)]
pub struct Recorded {
    /// When it came, in ms since the epoch, if the line says.
    pub at_ms: Option<u64>,
    /// What it asked.
    pub request: Asked,
}

/// A recorded request's shape: how the server took it decides how it is charged.
#[derive(Debug)]
pub enum Asked {
    /// A line-protocol HIT (domain-less rules, charged on its own).
    Line(Hit),
    /// An Envoy request (`POST /json` or gRPC): its domain and descriptors.
    Envoy {
        /// The Envoy domain.
        domain: String,
        /// Its descriptors, as hits.
        hits: Vec<Hit>,
    },
}

/// Why a line of traffic was skipped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrafficError {
    /// Not a HIT: the line parser's `ERR` line.
    #[error("not a line-protocol HIT: {0}")]
    Line(String),
    /// Not a `POST /json` body.
    #[error("not a POST /json request: {0}")]
    Json(String),
}

/// Parses one line of traffic; `Ok(None)` for a blank line or a `#` comment.
pub fn parse_line(line: &str, metrics: &Metrics) -> Result<Option<Recorded>, TrafficError> {
    let line = line.trim_end_matches(['\r', '\n']);
    let trimmed = line.trim_start();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Ok(None);
    }
    let (at_ms, rest) = split_timestamp(trimmed);
    let request = if rest.starts_with('{') {
        envoy(rest, metrics)?
    } else {
        let mut op = OperationBuilder::with_capacity(4);
        parse_hit(rest, |k, v| op.push(k, v)).map_err(|e| TrafficError::Line(e.to_string()))?;
        Asked::Line(Hit::one(op.finish()))
    };
    Ok(Some(Recorded { at_ms, request }))
}

/// A leading run of digits and a space is the timestamp; anything else is
/// the request itself (a HIT's first word is never all digits).
fn split_timestamp(line: &str) -> (Option<u64>, &str) {
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || line.as_bytes().get(digits) != Some(&b' ') {
        return (None, line);
    }
    match line[..digits].parse() {
        Ok(ms) => (Some(ms), line[digits + 1..].trim_start()),
        Err(_) => (None, line),
    }
}

/// A `POST /json` body as the server validates it.
fn envoy(body: &str, metrics: &Metrics) -> Result<Asked, TrafficError> {
    let request = parse_request(body.as_bytes()).map_err(TrafficError::Json)?;
    let domain = request.domain.clone();
    let hits = crate::server::rls::to_hits(request, metrics)
        .map_err(|s| TrafficError::Json(s.message().to_owned()))?;
    Ok(Asked::Envoy { domain, hits })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Option<Recorded>, TrafficError> {
        parse_line(line, &Metrics::new())
    }

    #[test]
    fn hits_with_and_without_timestamps() {
        let r = parse("1700000000123 HIT path=/a ip=1").unwrap().unwrap();
        assert_eq!(r.at_ms, Some(1_700_000_000_123));
        let Asked::Line(hit) = r.request else {
            panic!("a HIT")
        };
        assert_eq!(hit.operation.get("path"), Some("/a"));
        let r = parse("HIT path=/b\n").unwrap().unwrap();
        assert_eq!(r.at_ms, None);
        assert!(parse("   ").unwrap().is_none());
        assert!(parse("# a comment").unwrap().is_none());
    }

    #[test]
    fn json_lines_are_post_json_bodies() {
        let line = r#"42 {"domain":"web","descriptors":[{"entries":[{"key":"path","value":"/x"}]}],"hitsAddend":3}"#;
        let r = parse(line).unwrap().unwrap();
        assert_eq!(r.at_ms, Some(42));
        let Asked::Envoy { domain, hits } = r.request else {
            panic!("an Envoy request")
        };
        assert_eq!((domain.as_str(), hits.len(), hits[0].cost), ("web", 1, 3));
    }

    #[test]
    fn malformed_lines_say_why() {
        assert!(matches!(parse("GET a=b"), Err(TrafficError::Line(_))));
        assert!(matches!(parse("HIT a"), Err(TrafficError::Line(_))));
        assert!(matches!(
            parse("12 {\"domain\":"),
            Err(TrafficError::Json(_))
        ));
        assert!(matches!(parse("{\"nope\":1}"), Err(TrafficError::Json(_))));
    }
}
