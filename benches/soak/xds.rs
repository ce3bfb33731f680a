//! The xDS control plane of the tests serving an envoyproxy/ratelimit
//! domain, and the fault of it going away and coming back with a new
//! version.

use std::net::SocketAddr;

use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

use crate::common::xds::{ControlPlane, Snapshot};
use crate::faults::{wait_until, Event, Kind};
use crate::now;
use crate::rig::{self, Rig};

/// The domain the control plane serves; the soak's gRPC load
/// (`grpc_load.rs`) asks it.
pub const DOMAIN: &str = "soak-xds";

/// The key-only descriptor of every version: one counter per value (per
/// actor of the gRPC load), [`LIMIT`] calls per epoch second.
pub const KEY: &str = "soak_actor";

/// The key's `requests_per_unit` (per second): below what the gRPC load
/// asks of each actor, so that some calls are OVER_LIMIT; no other limit
/// of the soak is 7, so an answer carrying it was decided by this domain.
pub const LIMIT: u32 = 7;

/// The control plane, on a fixed port so that it comes back where the
/// replicas look for it, on a runtime of its own.
pub struct Plane {
    runtime: tokio::runtime::Runtime,
    plane: Option<ControlPlane>,
    /// Its address.
    pub addr: SocketAddr,
    /// The version it serves.
    pub version: u32,
}

/// Version `version` of the domain: one descriptor named after it (so a
/// new version is seen to replace the old), and the same [`KEY`] in each
/// (so the load's counters outlive every version change).
fn snapshot(version: u32) -> Snapshot {
    let per_actor = RateLimitDescriptor {
        key: KEY.to_owned(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Second as i32,
            requests_per_unit: LIMIT,
            ..Default::default()
        }),
        ..Default::default()
    };
    let descriptor = RateLimitDescriptor {
        key: "generic_key".to_owned(),
        value: format!("route-{version}"),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Second as i32,
            requests_per_unit: 100,
            ..Default::default()
        }),
        ..Default::default()
    };
    let config = RateLimitConfig {
        name: DOMAIN.to_owned(),
        domain: DOMAIN.to_owned(),
        descriptors: vec![descriptor, per_actor],
    };
    (format!("v{version}"), vec![config])
}

impl Plane {
    /// Serves version 1 on a fixed free port.
    pub fn start() -> Plane {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let addr = SocketAddr::from(([127, 0, 0, 1], crate::common::stable_port()));
        let plane = runtime.block_on(ControlPlane::start(addr, snapshot(1)));
        Plane {
            runtime,
            plane: Some(plane),
            addr,
            version: 1,
        }
    }

    /// `xds:<domain>@v<version>`, as `/config` names the source.
    pub fn source(&self) -> String {
        format!("xds:{DOMAIN}@v{}", self.version)
    }
}

/// Whether both replicas' `/config` shows `source`.
fn both_show(rig: &Rig, source: &str) -> bool {
    rig.replicas
        .iter()
        .all(|r| rig::get(r.http(), "/config").is_some_and(|(_, body)| body.contains(source)))
}

/// The control plane stopped for `hold` (streams broken, port closed),
/// then serving the next version on the same port: meanwhile both
/// replicas keep the last version; recovered when both show the new one.
/// The bound is the soak's: the replicas reconnect with a backoff doubling
/// from 500 ms (`--xds-backoff-initial`), at most 4 s after a hold of 4 s.
pub fn plane_down(rig: &mut Rig, hold: std::time::Duration) -> Event {
    let mut event = Event::new(
        "xds control plane down, new version",
        Kind::Xds,
        now(),
        10.0,
    );
    let kept = rig.xds.source();
    if let Some(plane) = rig.xds.plane.take() {
        plane.kill();
    }
    std::thread::sleep(hold);
    let up: Vec<Option<f64>> = rig
        .replicas
        .iter()
        .map(|r| rig::metric(r.http(), "divvy_xds_stream_up"))
        .collect();
    event.note = format!("stream up while it was down: {up:?}");
    if !both_show(rig, &kept) {
        event.problem = Some(format!(
            "{kept} was not kept while the control plane was down"
        ));
    }
    rig.xds.version += 1;
    let (addr, next) = (rig.xds.addr, snapshot(rig.xds.version));
    rig.xds.plane = Some(rig.xds.runtime.block_on(ControlPlane::start(addr, next)));
    event.healed = now();
    let source = rig.xds.source();
    event.recovered = wait_until(30.0, || both_show(rig, &source));
    event
}
