//! Registering one metric of each kind (a definition that fails is a bug
//! in a static name, caught by every test that builds the registry).

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

pub(super) fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric name");
    g
}

pub(super) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric name");
    c
}

/// A counter of one label whose `values` are all exported from the start (at 0).
pub(super) fn counter_vec_of(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
    values: &[&str],
) -> IntCounterVec {
    let c = counter_vec(registry, name, help, &[label]);
    for v in values {
        c.with_label_values(&[v]);
    }
    c
}

pub(super) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric name");
    c
}

pub(super) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric name");
    g
}

pub(super) fn histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let buckets = vec![
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    ];
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("static metric definition");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric name");
    h
}
