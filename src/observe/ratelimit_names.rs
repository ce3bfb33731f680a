//! envoyproxy/ratelimit's Prometheus names, as its default statsd-exporter
//! mapping (and Envoy Gateway's) turns its stats into series: the
//! per-descriptor stats as `ratelimit_service_rate_limit_<stat>{domain,
//! key1[, key2]}`, service errors, config loads and calls. Rendered at
//! scrape time from divvy's own counters, so nothing is counted twice and
//! the cardinality is the drop-in's (at most `MAX_STATS_KEYS` keys).

use std::collections::BTreeMap;
use std::fmt::Write;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;

use super::metrics::Metrics;
use super::statsd_mapper::{EventKind, Mapper};

/// The gRPC method envoyproxy/ratelimit's call stats name.
const METHOD: &str = "ShouldRateLimit";

/// The exposition under `PROMETHEUS_MAPPER_YAML`'s mappings when one is
/// given, else under envoyproxy/ratelimit's default mapping.
pub fn render_with(metrics: &Metrics, mapper: Option<&Mapper>) -> String {
    match mapper {
        Some(m) => mapped(metrics, m),
        None => render(metrics),
    }
}

/// The exposition in Prometheus' text format, as envoyproxy/ratelimit's
/// default mapping names its stats.
pub fn render(metrics: &Metrics) -> String {
    let families = metrics.gather();
    let label_sum = |family: &str, label: &str, value: &str| -> f64 {
        samples(&families, family, label)
            .into_iter()
            .filter(|(v, _)| v == value)
            .map(|(_, n)| n)
            .sum()
    };
    let mut out = String::new();
    descriptor_stats(metrics, &mut out);
    counter(
        &mut out,
        "ratelimit_service_config_load_success",
        "Configurations loaded after start (file reloads and xDS updates)",
        label_sum("divvy_reloads_total", "result", "success")
            + label_sum("divvy_xds_updates_total", "result", "accepted"),
    );
    counter(
        &mut out,
        "ratelimit_service_config_load_error",
        "Configurations refused (files and xDS updates)",
        label_sum("divvy_reloads_total", "result", "failure")
            + label_sum("divvy_xds_updates_total", "result", "rejected"),
    );
    let errors = samples(&families, "divvy_errors_total", "code");
    let _ = writeln!(
        out,
        "# TYPE ratelimit_service_should_rate_limit_error counter"
    );
    for (code, n) in errors {
        let err_type = match code.as_str() {
            "unavailable" => "redis_error",
            _ => "service_error",
        };
        let _ = writeln!(
            out,
            "ratelimit_service_should_rate_limit_error{{err_type=\"{err_type}\"}} {n}"
        );
    }
    let calls = call_times(metrics);
    counter_with(
        &mut out,
        "ratelimit_service_total_requests",
        &[("grpc_method", METHOD)],
        calls.count,
    );
    histogram_with(
        &mut out,
        "ratelimit_service_response_time_seconds",
        &[("grpc_method", METHOD)],
        &calls,
    );
    out
}

/// A histogram's samples: cumulative bucket counts by upper bound, sum, count.
#[derive(Debug, Default)]
struct Times {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

/// The time divvy took to decide each request (`divvy_hit_duration_seconds`),
/// which envoyproxy/ratelimit reports as its calls' response time.
fn call_times(metrics: &Metrics) -> Times {
    let mut t = Times::default();
    for family in metrics.hit_duration.collect() {
        for m in family.get_metric() {
            let h = m.get_histogram();
            t.sum += h.get_sample_sum();
            t.count += h.get_sample_count() as f64;
            t.buckets = h
                .get_bucket()
                .iter()
                .map(|b| (b.upper_bound(), b.cumulative_count() as f64))
                .collect();
        }
    }
    t
}

fn labels_text(labels: &[(&str, &str)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect::<Vec<_>>()
        .join(",")
}

/// `name{labels}`, or `name` alone without labels.
fn series(name: &str, labels: &[(&str, &str)]) -> String {
    match labels_text(labels) {
        l if l.is_empty() => name.to_owned(),
        l => format!("{name}{{{l}}}"),
    }
}

fn counter_with(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    let _ = writeln!(
        out,
        "# TYPE {name} counter\n{} {value}",
        series(name, labels)
    );
}

fn histogram_with(out: &mut String, name: &str, labels: &[(&str, &str)], t: &Times) {
    let l = labels_text(labels);
    let sep = if l.is_empty() { "" } else { "," };
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (le, n) in &t.buckets {
        let _ = writeln!(out, "{name}_bucket{{{l}{sep}le=\"{le}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{{l}{sep}le=\"+Inf\"}} {}", t.count);
    let (sum, count) = (format!("{name}_sum"), format!("{name}_count"));
    let _ = writeln!(out, "{} {}", series(&sum, labels), t.sum);
    let _ = writeln!(out, "{} {}", series(&count, labels), t.count);
}

/// envoyproxy/ratelimit's stats under their statsd names, each with its value.
fn events(metrics: &Metrics) -> Vec<(String, EventKind, f64)> {
    let families = metrics.gather();
    let mut out = Vec::new();
    for (key, stat, value) in envoy_stats(metrics) {
        let name = format!("ratelimit.service.rate_limit.{key}.{stat}");
        out.push((name, EventKind::Counter, value));
    }
    for (code, n) in samples(&families, "divvy_errors_total", "code") {
        let err_type = if code == "unavailable" {
            "redis_error"
        } else {
            "service_error"
        };
        let name = format!("ratelimit.service.call.should_rate_limit.{err_type}");
        out.push((name, EventKind::Counter, n));
    }
    let sum = |family: &str, label: &str, value: &str| -> f64 {
        samples(&families, family, label)
            .into_iter()
            .filter(|(v, _)| v == value)
            .map(|(_, n)| n)
            .sum()
    };
    let loads = [
        ("config_load_success", "success", "accepted"),
        ("config_load_error", "failure", "rejected"),
    ];
    for (stat, reload, xds) in loads {
        let n = sum("divvy_reloads_total", "result", reload)
            + sum("divvy_xds_updates_total", "result", xds);
        out.push((format!("ratelimit.service.{stat}"), EventKind::Counter, n));
    }
    let calls = format!("ratelimit_server.{METHOD}.total_requests");
    out.push((calls, EventKind::Counter, call_times(metrics).count));
    out
}

/// The exposition under `mapper`: counters of one name and labels summed,
/// the response time a histogram; a name the mapper drops is left out.
fn mapped(metrics: &Metrics, mapper: &Mapper) -> String {
    type Series = BTreeMap<Vec<(String, String)>, f64>;
    let mut counters: BTreeMap<String, (Option<String>, Series)> = BTreeMap::new();
    for (name, kind, value) in events(metrics) {
        let Some(m) = mapper.map(&name, kind) else {
            continue;
        };
        let entry = counters
            .entry(m.name)
            .or_insert_with(|| (m.help, Series::new()));
        *entry.1.entry(m.labels).or_default() += value;
    }
    let mut out = String::new();
    for (name, (help, samples_of)) in &counters {
        if let Some(h) = help {
            let _ = writeln!(out, "# HELP {name} {h}");
        }
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, value) in samples_of {
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let _ = writeln!(out, "{} {value}", series(name, &pairs));
        }
    }
    let timer = format!("ratelimit_server.{METHOD}.response_time");
    if let Some(m) = mapper.map(&timer, EventKind::Timer) {
        if !counters.contains_key(&m.name) {
            let pairs: Vec<(&str, &str)> = m
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            histogram_with(&mut out, &m.name, &pairs, &call_times(metrics));
        }
    }
    out
}

/// One series: its labels in order, and its value.
type Sample = (Vec<(String, String)>, f64);

/// `divvy_ratelimit_stats_total{key, stat}` with `key` split into domain,
/// key1 and key2 (the mapping's first three dot-separated parts).
fn descriptor_stats(metrics: &Metrics, out: &mut String) {
    let mut by_stat: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for (key, stat, value) in envoy_stats(metrics) {
        let parts: Vec<&str> = key.splitn(4, '.').collect();
        let mut labels = vec![("domain".to_owned(), parts[0].to_owned())];
        for (name, part) in ["key1", "key2"].iter().zip(parts.iter().skip(1)) {
            labels.push(((*name).to_owned(), (*part).to_owned()));
        }
        by_stat.entry(stat).or_default().push((labels, value));
    }
    for (stat, samples_of) in by_stat {
        let name = format!("ratelimit_service_rate_limit_{stat}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, value) in samples_of {
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = writeln!(out, "{name}{{{}}} {value}", labels.join(","));
        }
    }
}

/// `divvy_ratelimit_stats_total`'s samples: the sanitised stats key, the
/// stat, the count.
fn envoy_stats(metrics: &Metrics) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for family in metrics.envoy_stats.collect() {
        for m in family.get_metric() {
            let label = |name: &str| {
                m.get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map(|l| l.value().to_owned())
                    .unwrap_or_default()
            };
            out.push((
                sanitize(&label("key")),
                label("stat"),
                m.get_counter().get_value(),
            ));
        }
    }
    out
}

/// envoyproxy/ratelimit's stat-name sanitising: `:` and `|` become `_`, and
/// so do the dots of each IPv4 address (so `10.0.0.1` stays one part).
fn sanitize(key: &str) -> String {
    let key = key.replace([':', '|'], "_");
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match ipv4_at(bytes, i) {
            Some(end) => {
                out.extend(
                    bytes[i..end]
                        .iter()
                        .map(|&b| if b == b'.' { b'_' } else { b }),
                );
                i = end;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or(key)
}

/// The end of `\d{1,3}(\.\d{1,3}){3}` starting at `i`, each run of digits
/// taken as long as it can be (as Go's regexp takes it).
fn ipv4_at(b: &[u8], i: usize) -> Option<usize> {
    fn digits(b: &[u8], mut i: usize) -> Option<usize> {
        let start = i;
        while i < b.len() && i - start < 3 && b[i].is_ascii_digit() {
            i += 1;
        }
        (i > start).then_some(i)
    }
    let mut end = digits(b, i)?;
    for _ in 0..3 {
        if b.get(end) != Some(&b'.') {
            return None;
        }
        end = digits(b, end + 1)?;
    }
    Some(end)
}

fn counter(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// Every sample of divvy's counter `family` in `families`, by the value of `label`.
fn samples(families: &[MetricFamily], family: &str, label: &str) -> Vec<(String, f64)> {
    families
        .iter()
        .filter(|f| f.name() == family)
        .flat_map(|f| {
            f.get_metric()
                .iter()
                .map(|m| {
                    let value = m
                        .get_label()
                        .iter()
                        .find(|l| l.name() == label)
                        .map(|l| l.value().to_owned())
                        .unwrap_or_default();
                    (value, m.get_counter().get_value())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_into_domain_key1_and_key2() {
        let m = Metrics::new();
        for (key, stat) in [
            (
                "rn-eg.generic_key_route-a.remote_address_10.0.0.1",
                "over_limit",
            ),
            ("rn-eg.header_x", "total_hits"),
        ] {
            m.envoy_stats.with_label_values(&[key, stat]).inc_by(2);
        }
        let text = render(&m);
        assert!(
            text.contains("ratelimit_service_rate_limit_over_limit{domain=\"rn-eg\",key1=\"generic_key_route-a\",key2=\"remote_address_10_0_0_1\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "ratelimit_service_rate_limit_total_hits{domain=\"rn-eg\",key1=\"header_x\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("ratelimit_service_config_load_success "),
            "{text}"
        );
    }

    #[test]
    fn addresses_keep_their_place_as_envoyproxy_ratelimit_writes_them() {
        assert_eq!(
            sanitize("eg.masked_remote_address_0.0.0.0/0"),
            "eg.masked_remote_address_0_0_0_0/0"
        );
        assert_eq!(sanitize("d.k_a:b|c.v1.2"), "d.k_a_b_c.v1.2");
        assert_eq!(sanitize("x.192.0.2.0/24.y"), "x.192_0_2_0/24.y");
        assert_eq!(sanitize("x.1234.5.6.7"), "x.1234_5_6_7");
    }
}
