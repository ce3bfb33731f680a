//! The caller's trace, from the headers Envoy sends on the rate-limit call
//! when its tracing is on: W3C `traceparent`, else B3 (single `b3` header,
//! else `x-b3-traceid` / `x-b3-spanid` / `x-b3-sampled`). A malformed header
//! is ignored (the call is then a root of its own), never an error.

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// The remote parent named by the headers `get` returns (by lower-case
/// name), if any names a valid one.
pub fn parent_from_headers<'h>(get: impl Fn(&str) -> Option<&'h str>) -> Option<SpanContext> {
    if let Some(cx) = get("traceparent").and_then(traceparent) {
        return Some(cx);
    }
    if let Some(cx) = get("b3").and_then(b3_single) {
        return Some(cx);
    }
    let trace = get("x-b3-traceid")?;
    let span = get("x-b3-spanid")?;
    let flags = get("x-b3-flags");
    let sampled = flags == Some("1") || matches!(get("x-b3-sampled"), Some("1" | "true"));
    remote(b3_trace_id(trace)?, span_id(span)?, sampled)
}

/// `version-traceid-spanid-flags` (W3C Trace Context, version 00; a later
/// version's first four fields are read as the standard asks).
fn traceparent(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let version = parts.next()?;
    let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
    let extra = parts.next();
    if version.len() != 2 || version.eq_ignore_ascii_case("ff") || !is_hex(version) {
        return None;
    }
    if version == "00" && extra.is_some() {
        return None;
    }
    if trace.len() != 32 || flags.len() != 2 || !is_hex(flags) {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    remote(trace_id(trace)?, span_id(span)?, flags & 1 == 1)
}

/// `traceid-spanid[-sampled[-parentspanid]]`; a lone `0`/`1`/`d` (a
/// sampling decision alone) names no parent.
fn b3_single(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let (trace, span) = (parts.next()?, parts.next()?);
    let sampled = match parts.next() {
        None => true,
        Some("1" | "d") => true,
        Some("0") => false,
        Some(_) => return None,
    };
    remote(b3_trace_id(trace)?, span_id(span)?, sampled)
}

/// A 64- or 128-bit B3 trace id (a 64-bit one is the low half).
fn b3_trace_id(text: &str) -> Option<TraceId> {
    match text.len() {
        16 => trace_id(&format!("{:0>32}", text)),
        32 => trace_id(text),
        _ => None,
    }
}

fn trace_id(text: &str) -> Option<TraceId> {
    if text.len() != 32 || !is_hex(text) {
        return None;
    }
    let id = TraceId::from_hex(text).ok()?;
    (id != TraceId::INVALID).then_some(id)
}

fn span_id(text: &str) -> Option<SpanId> {
    if text.len() != 16 || !is_hex(text) {
        return None;
    }
    let id = SpanId::from_hex(text).ok()?;
    (id != SpanId::INVALID).then_some(id)
}

fn is_hex(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn remote(trace: TraceId, span: SpanId, sampled: bool) -> Option<SpanContext> {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    Some(SpanContext::new(
        trace,
        span,
        flags,
        true,
        TraceState::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(headers: &[(&str, &str)]) -> Option<SpanContext> {
        parent_from_headers(|name| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v))
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn traceparent_names_the_parent_and_its_sampling() {
        let cx = parse(&[("traceparent", &format!("00-{TRACE}-{SPAN}-01"))]).unwrap();
        assert_eq!(cx.trace_id().to_string(), TRACE);
        assert_eq!(cx.span_id().to_string(), SPAN);
        assert!(cx.is_sampled() && cx.is_remote());
        let cx = parse(&[("traceparent", &format!("00-{TRACE}-{SPAN}-00"))]).unwrap();
        assert!(!cx.is_sampled());
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        let zeros = "0".repeat(32);
        for bad in [
            String::new(),
            "garbage".into(),
            format!("00-{TRACE}-{SPAN}"),
            format!("00-{TRACE}-{SPAN}-zz"),
            format!("00-{}-{SPAN}-01", &TRACE[1..]),
            format!("00-{zeros}-{SPAN}-01"),
            format!("00-{TRACE}-0000000000000000-01"),
            format!("ff-{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-01-extra"),
            format!("00-{}-{SPAN}-01", TRACE.replace('4', "g")),
            format!("00-{TRACE}-{SPAN}é-01"),
        ] {
            assert!(parse(&[("traceparent", &bad)]).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_malformed_traceparent_falls_back_to_b3() {
        let b3 = format!("{TRACE}-{SPAN}-1");
        let cx = parse(&[("traceparent", "nonsense"), ("b3", &b3)]).unwrap();
        assert_eq!(cx.span_id().to_string(), SPAN);
    }

    #[test]
    fn b3_single_and_multi_headers() {
        let cx = parse(&[("b3", &format!("{TRACE}-{SPAN}-0"))]).unwrap();
        assert!(!cx.is_sampled());
        let cx = parse(&[("b3", &format!("a3ce929d0e0e4736-{SPAN}"))]).unwrap();
        assert_eq!(
            cx.trace_id().to_string(),
            "0000000000000000a3ce929d0e0e4736"
        );
        let cx = parse(&[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", SPAN),
            ("x-b3-sampled", "1"),
        ])
        .unwrap();
        assert!(cx.is_sampled());
        assert_eq!(cx.trace_id().to_string(), TRACE);
    }

    #[test]
    fn malformed_b3_is_ignored() {
        for bad in ["1", "0", "d", "xyz-abc", &format!("{TRACE}-{SPAN}-7")] {
            assert!(parse(&[("b3", bad)]).is_none(), "{bad}");
        }
        assert!(parse(&[("x-b3-traceid", TRACE)]).is_none());
        assert!(parse(&[("x-b3-traceid", "short"), ("x-b3-spanid", SPAN)]).is_none());
        assert!(parse(&[]).is_none());
    }
}
