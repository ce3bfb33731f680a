//! TLS on the replicas' gRPC port, Envoy trusting the soak's own CA, and
//! the rotation fault: a broken pair (refused, the old certificate still
//! served), then a good one (served by both replicas).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::common::pki::{self, Ca, San};
use crate::faults::{wait_every, wait_until, Event, Kind};
use crate::now;
use crate::rig::{self, Rig};

/// The replicas' certificate and key files, Envoy's client pair and the
/// CA that signs them all.
pub struct Tls {
    ca: Ca,
    /// The CA certificate (PEM).
    pub ca_pem: String,
    /// The CA certificate (PEM) Envoy trusts.
    pub ca_path: PathBuf,
    /// The replicas' certificate and key (shared; rotated in place).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// Envoy's client certificate and key.
    pub envoy: (PathBuf, PathBuf),
    /// The serial of the pair in the files.
    pub serial: u64,
    _dir: tempfile::TempDir,
}

impl Tls {
    /// A CA, a server pair for `localhost` (serial 16) and Envoy's pair.
    pub fn generate() -> Tls {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::new("soak-ca");
        let ca_path = pki::write(dir.path(), "ca.crt", &ca.pem);
        let (cert, key) = ca.server(16).write(dir.path(), "server");
        let envoy = ca.issue(&[San::Dns("envoy")], 2).write(dir.path(), "envoy");
        Tls {
            ca_pem: ca.pem.clone(),
            ca,
            ca_path,
            cert,
            key,
            envoy,
            serial: 16,
            _dir: dir,
        }
    }

    /// The serial the next good pair gets.
    fn next(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }
}

/// The serial of the certificate served on `addr`, read with `openssl
/// s_client` (SNI `localhost`).
fn served_serial(addr: SocketAddr) -> Option<u64> {
    let script = format!(
        "openssl s_client -connect {addr} -servername localhost </dev/null 2>/dev/null | openssl x509 -noout -serial"
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    u64::from_str_radix(text.trim().strip_prefix("serial=")?, 16).ok()
}

/// Each replica's `metric{port="grpc"}`.
fn grpc_counts(rig: &Rig, metric: &str) -> Vec<Option<f64>> {
    let name = format!("{metric}{{port=\"grpc\"}}");
    rig.replicas
        .iter()
        .map(|r| rig::metric(r.http(), &name))
        .collect()
}

/// Writes `text` over `path` by renaming a full file over it.
fn replace(path: &Path, text: &str) {
    pki::replace_by_rename(path, text);
}

/// A broken pair (a new certificate with the old key), then a good one.
/// Files are checked every 2 s and applied when seen unchanged twice
/// (docs/tls.md, "Rotation"): each must be seen by both replicas within 5 s.
pub fn rotation(rig: &mut Rig) -> Vec<Event> {
    let grpc: Vec<SocketAddr> = rig
        .replicas
        .iter()
        .map(|r| SocketAddr::from(([127, 0, 0, 1], r.ports[0])))
        .collect();
    let old = rig.tls.serial;
    let mut broken = Event::new("broken certificate pair refused", Kind::Tls, now(), 5.0);
    let errors = grpc_counts(rig, "divvy_tls_reload_errors_total");
    let mismatched = rig.tls.ca.server(old + 1000);
    replace(&rig.tls.cert, &mismatched.cert);
    broken.healed = now();
    broken.recovered = wait_until(15.0, || {
        grpc_counts(rig, "divvy_tls_reload_errors_total")
            .iter()
            .zip(&errors)
            .all(|(a, b)| a > b)
    });
    let served: Vec<Option<u64>> = grpc.iter().map(|a| served_serial(*a)).collect();
    broken.note = format!("serials served after it: {served:?}");
    if served.iter().any(|s| *s != Some(old)) {
        broken.problem = Some(format!(
            "the old certificate {old} is not what is served: {served:?}"
        ));
    }
    let serial = rig.tls.next();
    let mut good = Event::new("certificate rotated", Kind::Tls, now(), 5.0);
    let pair = rig.tls.ca.server(serial);
    replace(&rig.tls.key, &pair.key);
    replace(&rig.tls.cert, &pair.cert);
    good.healed = now();
    // Each poll runs openssl twice: 10 polls a second, not 50.
    good.recovered = wait_every(15.0, 0.1, || {
        grpc.iter().all(|a| served_serial(*a) == Some(serial))
    });
    good.note = format!("serial {old} → {serial}");
    vec![broken, good]
}
