//! gRPC reflection (`--grpc-reflection`): tonic's reflection services fed
//! the descriptors of Envoy's `RateLimitService`, so `grpcurl` can list and
//! call it without Envoy's proto files. envoy-types ships no descriptor
//! set, so the messages the service uses are declared here with Envoy's
//! names and field numbers (validation options and deprecated fields left
//! out: they change nothing on the wire).

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    FileDescriptorProto, FileDescriptorSet, MessageOptions, MethodDescriptorProto,
    OneofDescriptorProto, ServiceDescriptorProto,
};

/// A field's type: a scalar, or a message or enum by full name.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Bytes,
    U32,
    U64,
    I32,
    I64,
    Bool,
    Double,
    Msg(&'static str),
    Enum(&'static str),
}

/// A field: name, number, type, repeated, and its oneof's index.
fn field(
    name: &str,
    number: i32,
    ty: Ty,
    repeated: bool,
    oneof: Option<i32>,
) -> FieldDescriptorProto {
    let (kind, type_name) = match ty {
        Ty::Str => (Type::String, None),
        Ty::Bytes => (Type::Bytes, None),
        Ty::U32 => (Type::Uint32, None),
        Ty::U64 => (Type::Uint64, None),
        Ty::I32 => (Type::Int32, None),
        Ty::I64 => (Type::Int64, None),
        Ty::Bool => (Type::Bool, None),
        Ty::Double => (Type::Double, None),
        Ty::Msg(n) => (Type::Message, Some(format!(".{n}"))),
        Ty::Enum(n) => (Type::Enum, Some(format!(".{n}"))),
    };
    let label = if repeated {
        Label::Repeated
    } else {
        Label::Optional
    };
    FieldDescriptorProto {
        name: Some(name.to_owned()),
        number: Some(number),
        label: Some(label as i32),
        r#type: Some(kind as i32),
        type_name,
        json_name: Some(json_name(name)),
        oneof_index: oneof,
        ..Default::default()
    }
}

/// Plain fields (not repeated, in no oneof).
fn f(name: &str, number: i32, ty: Ty) -> FieldDescriptorProto {
    field(name, number, ty, false, None)
}

/// protoc's JSON name: lowerCamelCase.
fn json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn message(name: &str, fields: Vec<FieldDescriptorProto>) -> DescriptorProto {
    DescriptorProto {
        name: Some(name.to_owned()),
        field: fields,
        ..Default::default()
    }
}

fn enumeration(name: &str, values: &[(&str, i32)]) -> EnumDescriptorProto {
    EnumDescriptorProto {
        name: Some(name.to_owned()),
        value: values
            .iter()
            .map(|&(n, v)| EnumValueDescriptorProto {
                name: Some(n.to_owned()),
                number: Some(v),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn file(
    name: &str,
    package: &str,
    deps: &[&str],
    messages: Vec<DescriptorProto>,
    enums: Vec<EnumDescriptorProto>,
) -> FileDescriptorProto {
    FileDescriptorProto {
        name: Some(name.to_owned()),
        package: Some(package.to_owned()),
        dependency: deps.iter().map(|d| (*d).to_owned()).collect(),
        message_type: messages,
        enum_type: enums,
        syntax: Some("proto3".to_owned()),
        ..Default::default()
    }
}

/// google/protobuf's types the service uses.
fn well_known() -> Vec<FileDescriptorProto> {
    let seconds_nanos = || vec![f("seconds", 1, Ty::I64), f("nanos", 2, Ty::I32)];
    let value = "google.protobuf.Value";
    let kind = |name: &str, n: i32, ty: Ty| field(name, n, ty, false, Some(0));
    let mut value_msg = message(
        "Value",
        vec![
            kind("null_value", 1, Ty::Enum("google.protobuf.NullValue")),
            kind("number_value", 2, Ty::Double),
            kind("string_value", 3, Ty::Str),
            kind("bool_value", 4, Ty::Bool),
            kind("struct_value", 5, Ty::Msg("google.protobuf.Struct")),
            kind("list_value", 6, Ty::Msg("google.protobuf.ListValue")),
        ],
    );
    value_msg.oneof_decl = vec![oneof("kind")];
    let mut entry = message(
        "FieldsEntry",
        vec![f("key", 1, Ty::Str), f("value", 2, Ty::Msg(value))],
    );
    entry.options = Some(MessageOptions {
        map_entry: Some(true),
        ..Default::default()
    });
    let mut structure = message(
        "Struct",
        vec![field(
            "fields",
            1,
            Ty::Msg("google.protobuf.Struct.FieldsEntry"),
            true,
            None,
        )],
    );
    structure.nested_type = vec![entry];
    let list = message(
        "ListValue",
        vec![field("values", 1, Ty::Msg(value), true, None)],
    );
    let pb = "google.protobuf";
    vec![
        file(
            "google/protobuf/duration.proto",
            pb,
            &[],
            vec![message("Duration", seconds_nanos())],
            vec![],
        ),
        file(
            "google/protobuf/timestamp.proto",
            pb,
            &[],
            vec![message("Timestamp", seconds_nanos())],
            vec![],
        ),
        file(
            "google/protobuf/wrappers.proto",
            pb,
            &[],
            vec![message("UInt64Value", vec![f("value", 1, Ty::U64)])],
            vec![],
        ),
        file(
            "google/protobuf/struct.proto",
            pb,
            &[],
            vec![structure, value_msg, list],
            vec![enumeration("NullValue", &[("NULL_VALUE", 0)])],
        ),
    ]
}

fn oneof(name: &str) -> OneofDescriptorProto {
    OneofDescriptorProto {
        name: Some(name.to_owned()),
        ..Default::default()
    }
}

/// Envoy's types the service uses: a header, a unit, a descriptor.
fn envoy_types() -> Vec<FileDescriptorProto> {
    let header = message(
        "HeaderValue",
        vec![
            f("key", 1, Ty::Str),
            f("value", 2, Ty::Str),
            f("raw_value", 3, Ty::Bytes),
        ],
    );
    let units = [
        ("UNKNOWN", 0),
        ("SECOND", 1),
        ("MINUTE", 2),
        ("HOUR", 3),
        ("DAY", 4),
        ("MONTH", 5),
        ("YEAR", 6),
    ];
    let mut descriptor = message(
        "RateLimitDescriptor",
        vec![
            field(
                "entries",
                1,
                Ty::Msg("envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry"),
                true,
                None,
            ),
            f(
                "limit",
                2,
                Ty::Msg(
                    "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride",
                ),
            ),
            f("hits_addend", 3, Ty::Msg("google.protobuf.UInt64Value")),
            f("is_negative_hits", 4, Ty::Bool),
        ],
    );
    descriptor.nested_type = vec![
        message("Entry", vec![f("key", 1, Ty::Str), f("value", 2, Ty::Str)]),
        message(
            "RateLimitOverride",
            vec![
                f("requests_per_unit", 1, Ty::U32),
                f("unit", 2, Ty::Enum("envoy.type.v3.RateLimitUnit")),
            ],
        ),
    ];
    vec![
        file(
            "envoy/config/core/v3/base.proto",
            "envoy.config.core.v3",
            &[],
            vec![header],
            vec![],
        ),
        file(
            "envoy/type/v3/ratelimit_unit.proto",
            "envoy.type.v3",
            &[],
            vec![],
            vec![enumeration("RateLimitUnit", &units)],
        ),
        file(
            "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
            "envoy.extensions.common.ratelimit.v3",
            &[
                "envoy/type/v3/ratelimit_unit.proto",
                "google/protobuf/wrappers.proto",
            ],
            vec![descriptor],
            vec![],
        ),
    ]
}

const RLS: &str = "envoy.service.ratelimit.v3";

/// RateLimitResponse, with its nested messages and enums.
fn rls_response() -> DescriptorProto {
    let code = "envoy.service.ratelimit.v3.RateLimitResponse.Code";
    let unit = "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit";
    let quota = "envoy.service.ratelimit.v3.RateLimitResponse.Quota";
    let header = "envoy.config.core.v3.HeaderValue";
    let mut limit = message(
        "RateLimit",
        vec![
            f("name", 3, Ty::Str),
            f("requests_per_unit", 1, Ty::U32),
            f("unit", 2, Ty::Enum(unit)),
        ],
    );
    let units = [
        ("UNKNOWN", 0),
        ("SECOND", 1),
        ("MINUTE", 2),
        ("HOUR", 3),
        ("DAY", 4),
        ("WEEK", 7),
        ("MONTH", 5),
        ("YEAR", 6),
    ];
    limit.enum_type = vec![enumeration("Unit", &units)];
    let mut quota_msg = message(
        "Quota",
        vec![
            f("requests", 1, Ty::U32),
            field(
                "valid_until",
                2,
                Ty::Msg("google.protobuf.Timestamp"),
                false,
                Some(0),
            ),
            f("id", 3, Ty::Str),
        ],
    );
    quota_msg.oneof_decl = vec![oneof("expiration_specifier")];
    let status = message(
        "DescriptorStatus",
        vec![
            f("code", 1, Ty::Enum(code)),
            f(
                "current_limit",
                2,
                Ty::Msg("envoy.service.ratelimit.v3.RateLimitResponse.RateLimit"),
            ),
            f("limit_remaining", 3, Ty::U32),
            f(
                "duration_until_reset",
                4,
                Ty::Msg("google.protobuf.Duration"),
            ),
            f("quota", 5, Ty::Msg(quota)),
        ],
    );
    let mut response = message(
        "RateLimitResponse",
        vec![
            f("overall_code", 1, Ty::Enum(code)),
            field(
                "statuses",
                2,
                Ty::Msg("envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus"),
                true,
                None,
            ),
            field("response_headers_to_add", 3, Ty::Msg(header), true, None),
            field("request_headers_to_add", 4, Ty::Msg(header), true, None),
            f("raw_body", 5, Ty::Bytes),
            f("dynamic_metadata", 6, Ty::Msg("google.protobuf.Struct")),
            f("quota", 7, Ty::Msg(quota)),
        ],
    );
    response.nested_type = vec![limit, quota_msg, status];
    response.enum_type = vec![enumeration(
        "Code",
        &[("UNKNOWN", 0), ("OK", 1), ("OVER_LIMIT", 2)],
    )];
    response
}

/// envoy/service/ratelimit/v3/rls.proto: the request, the response, the service.
fn rls() -> FileDescriptorProto {
    let request = message(
        "RateLimitRequest",
        vec![
            f("domain", 1, Ty::Str),
            field(
                "descriptors",
                2,
                Ty::Msg("envoy.extensions.common.ratelimit.v3.RateLimitDescriptor"),
                true,
                None,
            ),
            f("hits_addend", 3, Ty::U32),
        ],
    );
    let response = rls_response();
    let mut rls = file(
        "envoy/service/ratelimit/v3/rls.proto",
        RLS,
        &[
            "envoy/config/core/v3/base.proto",
            "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
            "google/protobuf/duration.proto",
            "google/protobuf/struct.proto",
            "google/protobuf/timestamp.proto",
        ],
        vec![request, response],
        vec![],
    );
    rls.service = vec![ServiceDescriptorProto {
        name: Some("RateLimitService".to_owned()),
        method: vec![MethodDescriptorProto {
            name: Some("ShouldRateLimit".to_owned()),
            input_type: Some(format!(".{RLS}.RateLimitRequest")),
            output_type: Some(format!(".{RLS}.RateLimitResponse")),
            ..Default::default()
        }],
        ..Default::default()
    }];
    rls
}

/// Every file the service's descriptors need, dependencies first.
pub fn descriptor_set() -> FileDescriptorSet {
    let mut files = well_known();
    files.extend(envoy_types());
    files.push(rls());
    FileDescriptorSet { file: files }
}

/// Why reflection could not be built.
#[derive(Debug, thiserror::Error)]
#[error("gRPC reflection: {0}")]
pub struct ReflectionError(String);

/// The v1 and v1alpha reflection services, describing the rate-limit
/// service and the health service (grpcurl asks v1alpha; newer clients v1).
pub fn services() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    ReflectionError,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_file_descriptor_set(descriptor_set())
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let v1 = builder()
        .build_v1()
        .map_err(|e| ReflectionError(e.to_string()))?;
    let v1alpha = builder()
        .build_v1alpha()
        .map_err(|e| ReflectionError(e.to_string()))?;
    Ok((v1, v1alpha))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_named_is_declared_and_every_dependency_served() {
        let set = descriptor_set();
        let mut declared = std::collections::HashSet::new();
        fn walk(prefix: &str, m: &DescriptorProto, out: &mut std::collections::HashSet<String>) {
            let name = format!("{prefix}.{}", m.name());
            for e in &m.enum_type {
                out.insert(format!("{name}.{}", e.name()));
            }
            for n in &m.nested_type {
                walk(&name, n, out);
            }
            out.insert(name);
        }
        for file in &set.file {
            let pkg = format!(".{}", file.package());
            for m in &file.message_type {
                walk(&pkg, m, &mut declared);
            }
            for e in &file.enum_type {
                declared.insert(format!("{pkg}.{}", e.name()));
            }
        }
        let names: Vec<&str> = set.file.iter().map(|f| f.name()).collect();
        for (i, file) in set.file.iter().enumerate() {
            for dep in &file.dependency {
                let at = names.iter().position(|n| n == dep);
                assert!(
                    at.is_some_and(|at| at < i),
                    "{} needs {dep} before it",
                    file.name()
                );
            }
        }
        let mut fields = Vec::new();
        fn fields_of<'a>(m: &'a DescriptorProto, out: &mut Vec<&'a FieldDescriptorProto>) {
            out.extend(&m.field);
            for n in &m.nested_type {
                fields_of(n, out);
            }
        }
        for file in &set.file {
            for m in &file.message_type {
                fields_of(m, &mut fields);
            }
        }
        for fd in fields {
            if let Some(t) = &fd.type_name {
                assert!(
                    declared.contains(t),
                    "{} names {t}, which is not declared",
                    fd.name()
                );
            }
        }
        assert!(services().is_ok());
    }

    #[test]
    fn json_names_are_lower_camel_case() {
        assert_eq!(json_name("hits_addend"), "hitsAddend");
        assert_eq!(json_name("domain"), "domain");
    }
}
