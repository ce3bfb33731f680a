//! Envoy's `RateLimitRequest` and `RateLimitResponse` in protobuf's JSON
//! mapping, for `POST /json` (as envoyproxy/ratelimit's `/json` endpoint).
//!
//! Field names are accepted in lowerCamelCase and in their proto snake_case;
//! 64-bit integers as numbers or strings; enums by name or number. Unknown
//! fields are errors, so a typo is reported rather than ignored. Responses
//! use lowerCamelCase, enum names, and durations as `"1.5s"`.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Map, Value};

type Fields = Map<String, Value>;

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Fields, String> {
    v.as_object()
        .ok_or_else(|| format!("{what} must be a JSON object"))
}

/// Checks that every field of `obj` is one of `known` (camelCase, snake_case).
fn only(obj: &Fields, what: &str, known: &[(&str, &str)]) -> Result<(), String> {
    for k in obj.keys() {
        if !known.iter().any(|(camel, snake)| k == camel || k == snake) {
            let names: Vec<&str> = known.iter().map(|(c, _)| *c).collect();
            return Err(format!(
                "{what}: unknown field `{k}` (expected one of {})",
                names.join(", ")
            ));
        }
    }
    Ok(())
}

fn field<'a>(obj: &'a Fields, camel: &str, snake: &str) -> Option<&'a Value> {
    obj.get(camel)
        .or_else(|| obj.get(snake))
        .filter(|v| !v.is_null())
}

fn string(v: Option<&Value>, what: &str) -> Result<String, String> {
    match v {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("{what} must be a string")),
    }
}

fn unsigned(v: Option<&Value>, what: &str, max: u64) -> Result<u64, String> {
    let n = match v {
        None => return Ok(0),
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        Some(_) => None,
    };
    n.filter(|n| *n <= max)
        .ok_or_else(|| format!("{what} must be an integer from 0 to {max}"))
}

fn unit(v: Option<&Value>, what: &str) -> Result<i32, String> {
    match v {
        None => Ok(0),
        Some(Value::String(s)) => RateLimitUnit::from_str_name(s)
            .map(|u| u as i32)
            .ok_or_else(|| format!("{what}: unknown unit `{s}`")),
        Some(Value::Number(n)) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| format!("{what}: unknown unit {n}")),
        Some(_) => Err(format!("{what} must be a unit name such as \"MINUTE\"")),
    }
}

fn descriptor(v: &Value, i: usize) -> Result<RateLimitDescriptor, String> {
    let what = format!("descriptors[{i}]");
    let obj = object(v, &what)?;
    only(
        obj,
        &what,
        &[
            ("entries", "entries"),
            ("limit", "limit"),
            ("hitsAddend", "hits_addend"),
            ("isNegativeHits", "is_negative_hits"),
        ],
    )?;
    let mut entries = Vec::new();
    if let Some(list) = field(obj, "entries", "entries") {
        let list = list
            .as_array()
            .ok_or_else(|| format!("{what}.entries must be an array"))?;
        for (j, e) in list.iter().enumerate() {
            let ewhat = format!("{what}.entries[{j}]");
            let eobj = object(e, &ewhat)?;
            only(eobj, &ewhat, &[("key", "key"), ("value", "value")])?;
            entries.push(Entry {
                key: string(field(eobj, "key", "key"), &format!("{ewhat}.key"))?,
                value: string(field(eobj, "value", "value"), &format!("{ewhat}.value"))?,
            });
        }
    }
    let limit = match field(obj, "limit", "limit") {
        None => None,
        Some(l) => {
            let lwhat = format!("{what}.limit");
            let lobj = object(l, &lwhat)?;
            only(
                lobj,
                &lwhat,
                &[("requestsPerUnit", "requests_per_unit"), ("unit", "unit")],
            )?;
            Some(RateLimitOverride {
                requests_per_unit: unsigned(
                    field(lobj, "requestsPerUnit", "requests_per_unit"),
                    &format!("{lwhat}.requestsPerUnit"),
                    u64::from(u32::MAX),
                )? as u32,
                unit: unit(field(lobj, "unit", "unit"), &format!("{lwhat}.unit"))?,
            })
        }
    };
    let hits_addend = match field(obj, "hitsAddend", "hits_addend") {
        None => None,
        Some(v) => Some(UInt64Value {
            value: unsigned(Some(v), &format!("{what}.hitsAddend"), u64::MAX)?,
        }),
    };
    let is_negative_hits = match field(obj, "isNegativeHits", "is_negative_hits") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(format!("{what}.isNegativeHits must be true or false")),
    };
    Ok(RateLimitDescriptor {
        entries,
        limit,
        hits_addend,
        is_negative_hits,
    })
}

/// Parses a `RateLimitRequest` from protobuf JSON.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let obj = object(&v, "the request")?;
    only(
        obj,
        "the request",
        &[
            ("domain", "domain"),
            ("descriptors", "descriptors"),
            ("hitsAddend", "hits_addend"),
        ],
    )?;
    let mut descriptors = Vec::new();
    if let Some(list) = field(obj, "descriptors", "descriptors") {
        let list = list
            .as_array()
            .ok_or_else(|| "descriptors must be an array".to_owned())?;
        for (i, d) in list.iter().enumerate() {
            descriptors.push(descriptor(d, i)?);
        }
    }
    Ok(RateLimitRequest {
        domain: string(field(obj, "domain", "domain"), "domain")?,
        descriptors,
        hits_addend: unsigned(
            field(obj, "hitsAddend", "hits_addend"),
            "hitsAddend",
            u64::from(u32::MAX),
        )? as u32,
    })
}

/// A `RateLimitRequest` as the `POST /json` body [`parse_request`] reads
/// back, on one line (what `serve --record` writes for gRPC and JSON).
pub fn format_request(r: &RateLimitRequest) -> String {
    let descriptors: Vec<Value> = r
        .descriptors
        .iter()
        .map(|d| {
            let entries: Vec<Value> = d
                .entries
                .iter()
                .map(|e| json!({"key": e.key, "value": e.value}))
                .collect();
            let mut o = Map::new();
            o.insert("entries".into(), Value::Array(entries));
            if let Some(l) = &d.limit {
                let unit = RateLimitUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name());
                o.insert(
                    "limit".into(),
                    json!({"requestsPerUnit": l.requests_per_unit, "unit": unit}),
                );
            }
            if let Some(h) = &d.hits_addend {
                o.insert("hitsAddend".into(), json!(h.value));
            }
            if d.is_negative_hits {
                o.insert("isNegativeHits".into(), json!(true));
            }
            Value::Object(o)
        })
        .collect();
    let mut o = Map::new();
    o.insert("domain".into(), json!(r.domain));
    o.insert("descriptors".into(), Value::Array(descriptors));
    if r.hits_addend != 0 {
        o.insert("hitsAddend".into(), json!(r.hits_addend));
    }
    Value::Object(o).to_string()
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// Formats a `RateLimitResponse` as protobuf JSON.
pub fn format_response(r: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut o = Map::new();
            o.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                o.insert(
                    "currentLimit".into(),
                    json!({
                        "name": l.name,
                        "requestsPerUnit": l.requests_per_unit,
                        "unit": Unit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name()),
                    }),
                );
            }
            o.insert("limitRemaining".into(), json!(s.limit_remaining));
            if let Some(d) = &s.duration_until_reset {
                let secs = d.seconds as f64 + f64::from(d.nanos) / 1e9;
                o.insert("durationUntilReset".into(), json!(format!("{secs:.3}s")));
            }
            Value::Object(o)
        })
        .collect();
    json!({
        "overallCode": code_name(r.overall_code),
        "statuses": statuses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_spellings() {
        let r = parse_request(
            br#"{"domain":"d","hits_addend":2,"descriptors":[{"entries":[{"key":"a","value":"b"}],"limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":"3"}]}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 2);
        let d = &r.descriptors[0];
        assert_eq!(d.entries[0].key, "a");
        assert_eq!(d.limit.unwrap().unit, RateLimitUnit::Minute as i32);
        assert_eq!(d.hits_addend.unwrap().value, 3);
    }

    #[test]
    fn bad_bodies_are_explained() {
        for (body, needle) in [
            (&b"nope"[..], "not valid JSON"),
            (b"[]", "must be a JSON object"),
            (br#"{"domian":"x"}"#, "unknown field `domian`"),
            (
                br#"{"descriptors":[{"entries":[{"key":1}]}]}"#,
                "descriptors[0].entries[0].key must be a string",
            ),
            (br#"{"hitsAddend":-1}"#, "hitsAddend must be an integer"),
            (
                br#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#,
                "unknown unit `FORTNIGHT`",
            ),
        ] {
            let e = parse_request(body).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }
}
