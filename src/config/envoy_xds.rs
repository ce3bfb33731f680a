//! envoyproxy/ratelimit's configuration as xDS delivers it
//! (`ratelimit.config.ratelimit.v3.RateLimitConfig`, one resource per
//! domain), turned into the same YAML document a file would hold and read
//! by the same loader, as envoyproxy/ratelimit does: a resource is valid
//! exactly when the equivalent file is, and `/rlconfig` shows that YAML.

use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use serde_norway::{Mapping, Value};

use super::envoy_ratelimit::{parse_value, EnvoyConfig};

/// The domain `config` defines, read as the file `name` would be (`name`
/// says where it came from: `xds:<resource>@<version>`).
pub fn from_proto(name: &str, config: &RateLimitConfig) -> Result<EnvoyConfig, String> {
    let mut root = Mapping::new();
    root.insert("domain".into(), config.domain.clone().into());
    if !config.descriptors.is_empty() {
        root.insert("descriptors".into(), descriptors(&config.descriptors));
    }
    let doc = Value::Mapping(root);
    let text = serde_norway::to_string(&doc).map_err(|e| format!("{name}: {e}"))?;
    parse_value(name, &text, &doc)
}

fn descriptors(list: &[RateLimitDescriptor]) -> Value {
    Value::Sequence(list.iter().map(descriptor).collect())
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut m = Mapping::new();
    m.insert("key".into(), d.key.clone().into());
    if !d.value.is_empty() {
        m.insert("value".into(), d.value.clone().into());
    }
    if let Some(p) = &d.rate_limit {
        m.insert("rate_limit".into(), policy(p));
    }
    if !d.descriptors.is_empty() {
        m.insert("descriptors".into(), descriptors(&d.descriptors));
    }
    for (flag, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            m.insert(flag.into(), true.into());
        }
    }
    if let Some(s) = &d.metadata {
        m.insert("metadata".into(), structure(s));
    }
    Value::Mapping(m)
}

/// A policy as its YAML: an unlimited limit needs no unit; any other
/// carries its unit, `UNKNOWN` included, so that the loader refuses it
/// with the file's message.
fn policy(p: &RateLimitPolicy) -> Value {
    let mut m = Mapping::new();
    let unit = RateLimitUnit::try_from(p.unit).unwrap_or(RateLimitUnit::Unknown);
    if !p.unlimited || unit != RateLimitUnit::Unknown {
        m.insert("unit".into(), unit.as_str_name().into());
    }
    if !p.unlimited {
        m.insert("requests_per_unit".into(), p.requests_per_unit.into());
    }
    if p.unlimited {
        m.insert("unlimited".into(), true.into());
    }
    if !p.name.is_empty() {
        m.insert("name".into(), p.name.clone().into());
    }
    if !p.replaces.is_empty() {
        let names = p
            .replaces
            .iter()
            .map(|r| {
                let mut n = Mapping::new();
                n.insert("name".into(), r.name.clone().into());
                Value::Mapping(n)
            })
            .collect();
        m.insert("replaces".into(), Value::Sequence(names));
    }
    Value::Mapping(m)
}

fn structure(s: &Struct) -> Value {
    let mut m = Mapping::new();
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    for k in keys {
        m.insert(k.clone().into(), value(&s.fields[k]));
    }
    Value::Mapping(m)
}

fn value(v: &PbValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => (*n).into(),
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => Value::Sequence(l.values.iter().map(value).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;

    fn limited(key: &str, value: &str, rpu: u32, unit: RateLimitUnit) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.to_owned(),
            value: value.to_owned(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: rpu,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_resource_reads_as_the_equivalent_file() {
        let mut nested = limited("generic_key", "route-a", 0, RateLimitUnit::Unknown);
        nested.rate_limit = None;
        nested.descriptors = vec![
            limited("header", "x", 4, RateLimitUnit::Week),
            RateLimitDescriptor {
                key: "unl".to_owned(),
                rate_limit: Some(RateLimitPolicy {
                    unlimited: true,
                    name: "free".to_owned(),
                    replaces: vec![RateLimitReplace {
                        name: "other".to_owned(),
                    }],
                    ..Default::default()
                }),
                shadow_mode: true,
                ..Default::default()
            },
        ];
        let config = RateLimitConfig {
            name: "gw".to_owned(),
            domain: "eg".to_owned(),
            descriptors: vec![nested],
        };
        let from_xds = from_proto("xds:gw@1", &config).expect("valid");
        let file = "domain: eg\ndescriptors:\n- key: generic_key\n  value: route-a\n  descriptors:\n  - key: header\n    value: x\n    rate_limit: {unit: WEEK, requests_per_unit: 4}\n  - key: unl\n    rate_limit: {unlimited: true, name: free, replaces: [{name: other}]}\n    shadow_mode: true\n";
        let from_file = super::super::envoy_ratelimit::parse("f", file).expect("valid");
        assert_eq!(from_xds.domain, "eg");
        assert_eq!(from_xds.descriptors, from_file.descriptors);
        assert_eq!(from_xds.file, "xds:gw@1");
    }

    #[test]
    fn an_invalid_resource_gets_the_files_message() {
        let config = RateLimitConfig {
            name: "gw".to_owned(),
            domain: "eg".to_owned(),
            descriptors: vec![limited("k", "v", 3, RateLimitUnit::Unknown)],
        };
        let err = from_proto("xds:gw@2", &config).expect_err("unknown unit");
        assert!(err.starts_with("xds:gw@2: "), "{err}");
        assert!(err.contains("UNKNOWN"), "{err}");
        let empty = RateLimitConfig::default();
        let err = from_proto("xds:x@1", &empty).expect_err("no domain");
        assert!(err.contains("empty domain"), "{err}");
    }
}
