//! What divvy tells about itself: Prometheus [`metrics`] and the [`statsd`]
//! mirror of divvy's own names.

pub mod metrics;
pub mod ratelimit_names;
pub mod statsd;
