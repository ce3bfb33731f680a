//! A caller's deadline, from the headers it sent: gRPC's `grpc-timeout`
//! (Envoy sends its rate-limit filter's timeout there, 20 ms by default),
//! else Envoy's `x-envoy-expected-rq-timeout-ms`. The store may take the
//! timeout less a margin ([`store_budget`]); then the failure policy decides,
//! so the answer leaves before the caller gives up.

use std::time::Duration;

use http::{HeaderMap, HeaderName};
use tokio::time::Instant;

use crate::store::breaker::store_budget;

/// Time kept back from a caller's timeout to decide and answer, by default
/// (`--deadline-margin-ms`).
pub const DEFAULT_MARGIN: Duration = Duration::from_millis(5);

/// gRPC's header of the caller's timeout.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// Envoy's header of the timeout it expects the request to have.
pub const ENVOY_EXPECTED_TIMEOUT: &str = "x-envoy-expected-rq-timeout-ms";

/// A `grpc-timeout` value: 1 to 8 digits and a unit (`H`, `M`, `S`, `m`,
/// `u`, `n`); `None` when it is malformed.
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// An `x-envoy-expected-rq-timeout-ms` value: whole milliseconds.
pub fn parse_envoy_timeout(value: &[u8]) -> Option<Duration> {
    if value.is_empty() || value.len() > 10 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    Some(Duration::from_millis(ms))
}

/// The headers' names, made once: looking a header up by a `&str` parses
/// and checks the name on every call.
static GRPC_TIMEOUT_NAME: HeaderName = HeaderName::from_static(GRPC_TIMEOUT);
static ENVOY_EXPECTED_TIMEOUT_NAME: HeaderName = HeaderName::from_static(ENVOY_EXPECTED_TIMEOUT);

/// The caller's timeout from its headers (`grpc-timeout` first; a
/// malformed value counts as none).
pub fn caller_timeout(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(&GRPC_TIMEOUT_NAME)
        .and_then(|v| parse_grpc_timeout(v.as_bytes()))
        .or_else(|| {
            headers
                .get(&ENVOY_EXPECTED_TIMEOUT_NAME)
                .and_then(|v| parse_envoy_timeout(v.as_bytes()))
        })
}

/// When the store must have answered a request received at `received`
/// with `timeout`, keeping `margin` to answer.
pub fn store_deadline(received: Instant, timeout: Duration, margin: Duration) -> Instant {
    received + store_budget(timeout, margin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit_and_bad_ones_are_none() {
        let ms = Duration::from_millis;
        assert_eq!(parse_grpc_timeout(b"20m"), Some(ms(20)));
        assert_eq!(parse_grpc_timeout(b"1S"), Some(ms(1000)));
        assert_eq!(parse_grpc_timeout(b"2M"), Some(ms(120_000)));
        assert_eq!(parse_grpc_timeout(b"1H"), Some(ms(3_600_000)));
        assert_eq!(
            parse_grpc_timeout(b"250u"),
            Some(Duration::from_micros(250))
        );
        assert_eq!(
            parse_grpc_timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in [
            &b""[..],
            b"m",
            b"20",
            b"20x",
            b"123456789m",
            b"-5m",
            b"2 m",
            b"\xffm",
        ] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
        assert_eq!(parse_envoy_timeout(b"20"), Some(ms(20)));
        assert_eq!(parse_envoy_timeout(b""), None);
        assert_eq!(parse_envoy_timeout(b"20ms"), None);
    }

    #[test]
    fn grpc_timeout_comes_first_and_envoys_header_is_the_fallback() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for &(k, v) in pairs {
                h.insert(k, http::HeaderValue::from_static(v));
            }
            h
        };
        let ms = Duration::from_millis;
        let both = headers(&[(GRPC_TIMEOUT, "30m"), (ENVOY_EXPECTED_TIMEOUT, "20")]);
        assert_eq!(caller_timeout(&both), Some(ms(30)));
        let envoy_only = headers(&[(ENVOY_EXPECTED_TIMEOUT, "20")]);
        assert_eq!(caller_timeout(&envoy_only), Some(ms(20)));
        let bad_grpc = headers(&[(GRPC_TIMEOUT, "soon"), (ENVOY_EXPECTED_TIMEOUT, "20")]);
        assert_eq!(caller_timeout(&bad_grpc), Some(ms(20)));
        assert_eq!(caller_timeout(&headers(&[("x-other", "20")])), None);
    }

    #[test]
    fn envoys_default_timeout_leaves_the_store_15_ms() {
        // An injected "now": the arithmetic is relative to it.
        let received = Instant::now();
        let at = store_deadline(received, Duration::from_millis(20), DEFAULT_MARGIN);
        assert_eq!(at - received, Duration::from_millis(15));
    }
}
