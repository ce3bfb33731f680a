//! What divvy tells about itself: Prometheus [`metrics`] and the [`statsd`]
//! mirror of divvy's own names; the dashboard's 15 minutes of [`history`]
//! per rule and top [`offenders`], kept by the [`recorder`]; the
//! [`traffic`] recorder of `serve --record`; OpenTelemetry traces over
//! OTLP ([`tracing_otlp`]).

pub mod history;
pub mod metrics;
pub mod offenders;
pub mod ratelimit_names;
pub mod recorder;
pub mod statsd;
pub mod statsd_mapper;
pub mod telemetry;
pub mod tracing_otlp;
pub mod traffic;
