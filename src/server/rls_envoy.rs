//! Answers for domains defined by envoyproxy/ratelimit files, shaped as
//! that project shapes them: statuses, the overall code (quota mode),
//! `SHADOW_MODE`, its rate-limit headers and dynamic metadata; with
//! `--denied-body problem-json`, divvy's problem body on a denial.

use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

use super::problem::{self, Violation};
use crate::config::envoy_ratelimit::EnvoyUnit;
use crate::config::DeniedBody;
use crate::limiter::envoy::{EnvoySettings, EnvoyStatus};

fn unit_of(u: EnvoyUnit) -> Unit {
    match u {
        EnvoyUnit::Second => Unit::Second,
        EnvoyUnit::Minute => Unit::Minute,
        EnvoyUnit::Hour => Unit::Hour,
        EnvoyUnit::Day => Unit::Day,
        EnvoyUnit::Week => Unit::Week,
        EnvoyUnit::Month => Unit::Month,
        EnvoyUnit::Year => Unit::Year,
    }
}

fn status(s: &EnvoyStatus) -> DescriptorStatus {
    if s.unlimited {
        return DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        };
    }
    DescriptorStatus {
        code: if s.over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: s.current.as_ref().map(|c| RateLimit {
            name: c.name.clone(),
            requests_per_unit: c.requests_per_unit,
            unit: unit_of(c.unit) as i32,
        }),
        limit_remaining: s.remaining,
        duration_until_reset: s
            .reset
            .map(|d| envoy_types::pb::google::protobuf::Duration {
                seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: 0,
            }),
        quota: None,
    }
}

/// The response for `statuses` of `request`; a denial carries a problem
/// body when `denied_body` asks for one.
pub fn response(
    request: &RateLimitRequest,
    statuses: &[EnvoyStatus],
    settings: &EnvoySettings,
    denied_body: DeniedBody,
) -> RateLimitResponse {
    let mut failed = 0;
    let (mut quota_total, mut quota_failed) = (0, 0);
    let mut min: Option<&EnvoyStatus> = None;
    let mut passed = Vec::new();
    for (i, s) in statuses.iter().enumerate() {
        if settings.headers.is_some()
            && s.current.is_some()
            && min.is_none_or(|m| s.remaining < m.remaining)
        {
            min = Some(s);
        }
        if s.unlimited {
            continue;
        }
        // Under QUOTA_MODE a descriptor without a limit counts as a quota
        // descriptor within its quota, as in envoyproxy/ratelimit.
        let quota = s.quota || settings.quota_mode;
        if s.over {
            if quota {
                quota_failed += 1;
            } else {
                failed += 1;
                min = Some(s);
            }
        } else {
            passed.push(i);
        }
        if quota {
            quota_total += 1;
        }
    }
    let over = failed > 0 || (quota_total > 0 && quota_total == quota_failed);
    let mut response = RateLimitResponse {
        overall_code: if over && !settings.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses: statuses.iter().map(status).collect(),
        ..Default::default()
    };
    if let (Some([limit, remaining, reset]), Some(m)) = (&settings.headers, min) {
        if let Some(c) = &m.current {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let u = c.unit.seconds();
            let header = |key: &str, value: String| HeaderValue {
                key: key.to_owned(),
                value,
                ..Default::default()
            };
            response.response_headers_to_add = vec![
                header(limit, c.requests_per_unit.to_string()),
                header(remaining, m.remaining.to_string()),
                header(reset, (u - now % u).to_string()),
            ];
        }
    }
    if settings.dynamic_metadata {
        response.dynamic_metadata = Some(metadata(request, statuses, &passed));
    }
    if response.overall_code == Code::OverLimit as i32 && denied_body == DeniedBody::ProblemJson {
        add_problem(&mut response, request, statuses);
    }
    response
}

/// Sets the problem body naming each denied descriptor's policy: its
/// limit's `name` if the file gives one, else its keys joined by `.` (the
/// descriptor path of the file, without the client's values).
fn add_problem(
    response: &mut RateLimitResponse,
    request: &RateLimitRequest,
    statuses: &[EnvoyStatus],
) {
    let mut violations = Vec::new();
    for (s, d) in statuses.iter().zip(&request.descriptors) {
        let Some(current) = s.current.as_ref().filter(|_| s.over) else {
            continue;
        };
        let policy = if current.name.is_empty() {
            let keys: Vec<&str> = d.entries.iter().map(|e| e.key.as_str()).collect();
            keys.join(".").into()
        } else {
            current.name.as_str().into()
        };
        let reset = s.reset.map(|r| r.as_secs());
        problem::add(
            &mut violations,
            Violation {
                policy,
                remaining: u64::from(s.remaining),
                reset,
            },
        );
    }
    if let Some(body) = problem::body(&violations) {
        response.raw_body = body;
        response.response_headers_to_add.push(HeaderValue {
            key: "content-type".to_owned(),
            value: problem::CONTENT_TYPE.to_owned(),
            ..Default::default()
        });
    }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn from_json(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(from_json).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

/// `RESPONSE_DYNAMIC_METADATA`: the domain, the descriptors' entries, the
/// request's hits_addend, and the merged metadata of the descriptors that
/// passed.
fn metadata(request: &RateLimitRequest, statuses: &[EnvoyStatus], passed: &[usize]) -> Struct {
    let mut fields = std::collections::HashMap::new();
    fields.insert("domain".to_owned(), string(request.domain.clone()));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let entries = d
                .entries
                .iter()
                .map(|e| string(format!("{}={}", e.key, e.value)))
                .collect();
            let mut f = std::collections::HashMap::new();
            f.insert(
                "entries".to_owned(),
                Value {
                    kind: Some(Kind::ListValue(ListValue { values: entries })),
                },
            );
            if let Some(l) = &d.limit {
                let unit = RateLimitUnit::try_from(l.unit)
                    .unwrap_or(RateLimitUnit::Unknown)
                    .as_str_name();
                f.insert(
                    "limit".to_owned(),
                    string(format!(
                        "requests_per_unit:{} unit:{unit}",
                        l.requests_per_unit
                    )),
                );
            }
            if let Some(h) = &d.hits_addend {
                f.insert(
                    "hitsAddend".to_owned(),
                    Value {
                        kind: Some(Kind::NumberValue(h.value as f64)),
                    },
                );
            }
            Value {
                kind: Some(Kind::StructValue(Struct { fields: f })),
            }
        })
        .collect();
    fields.insert(
        "descriptors".to_owned(),
        Value {
            kind: Some(Kind::ListValue(ListValue {
                values: descriptors,
            })),
        },
    );
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            Value {
                kind: Some(Kind::NumberValue(f64::from(request.hits_addend))),
            },
        );
    }
    let mut merged = serde_json::Map::new();
    for &i in passed {
        if let Some(serde_json::Value::Object(m)) =
            statuses.get(i).and_then(|s| s.metadata.as_ref())
        {
            merge(&mut merged, m);
        }
    }
    if !merged.is_empty() {
        fields.insert(
            "metadata".to_owned(),
            from_json(&serde_json::Value::Object(merged)),
        );
    }
    Struct { fields }
}

/// Merges `src` into `dest` as envoyproxy/ratelimit does: a key already
/// there keeps its value (maps on both sides merge recursively).
fn merge(
    dest: &mut serde_json::Map<String, serde_json::Value>,
    src: &serde_json::Map<String, serde_json::Value>,
) {
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (Some(serde_json::Value::Object(d)), serde_json::Value::Object(s)) => merge(d, s),
            (Some(_), _) => {}
            (None, _) => {
                dest.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The answer when no divvy policy is loaded and no file defines the
/// domain: every descriptor "no limit".
pub fn no_limit(request: &RateLimitRequest) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: request
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

    use super::*;
    use crate::limiter::envoy::EnvoyCurrent;

    fn descriptor(keys: &[&str]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: keys
                .iter()
                .map(|k| Entry {
                    key: (*k).to_owned(),
                    value: "client value".to_owned(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn over(name: &str, over: bool) -> EnvoyStatus {
        EnvoyStatus {
            over,
            current: Some(EnvoyCurrent {
                requests_per_unit: 5,
                unit: EnvoyUnit::Minute,
                name: name.to_owned(),
            }),
            remaining: 0,
            reset: Some(Duration::from_secs(42)),
            unlimited: false,
            quota: false,
            metadata: None,
        }
    }

    #[test]
    fn a_denial_names_the_limit_or_the_descriptor_keys() {
        let request = RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: vec![
                descriptor(&["remote_address", "path"]),
                descriptor(&["user"]),
                descriptor(&["ok"]),
            ],
            hits_addend: 0,
        };
        let statuses = [over("", true), over("per-user", true), over("", false)];
        let settings = EnvoySettings::default();
        let r = response(&request, &statuses, &settings, DeniedBody::ProblemJson);
        let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
        assert_eq!(
            body["violated-policies"],
            serde_json::json!(["remote_address.path", "per-user"])
        );
        assert_eq!(body["policies"][1]["reset"], 42);
        let content_type = &r.response_headers_to_add[0];
        assert_eq!(
            (content_type.key.as_str(), content_type.value.as_str()),
            ("content-type", problem::CONTENT_TYPE)
        );
        let r = response(&request, &statuses, &settings, DeniedBody::None);
        assert!(r.raw_body.is_empty() && r.response_headers_to_add.is_empty());
    }

    /// QUOTA_MODE: over only when every counted descriptor is over; a
    /// descriptor without a limit counts as within its quota.
    #[test]
    fn quota_mode_is_over_only_when_every_descriptor_is() {
        let request = RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: vec![descriptor(&["a"]), descriptor(&["b"])],
            hits_addend: 0,
        };
        let code = |statuses: &[EnvoyStatus], quota_mode: bool| {
            let settings = EnvoySettings {
                quota_mode,
                ..EnvoySettings::default()
            };
            response(&request, statuses, &settings, DeniedBody::None).overall_code
        };
        let (ok, over_limit) = (Code::Ok as i32, Code::OverLimit as i32);
        let one_over = [over("", true), over("", false)];
        assert_eq!(code(&one_over, false), over_limit);
        assert_eq!(code(&one_over, true), ok);
        let both_over = [over("", true), over("", true)];
        assert_eq!(code(&both_over, true), over_limit);
        let with_no_limit = [over("", true), EnvoyStatus::no_limit()];
        assert_eq!(code(&with_no_limit, false), over_limit);
        assert_eq!(code(&with_no_limit, true), ok);
    }
}
