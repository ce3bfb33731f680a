//! Loading, the SAN check and the watcher's reload rules, on certificates
//! made by rcgen.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rcgen::{CertificateParams, KeyPair, SanType};
use rustls::pki_types::pem::PemObject;

use super::verify::has_san;
use super::watch::State;
use super::{load, Port, TlsError, TlsFiles};

/// A self-signed certificate with `sans` and serial `serial`, and its key (PEM).
fn pair(sans: Vec<SanType>, serial: u64) -> (String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = sans;
    params.serial_number = Some(serial.into());
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn dns(name: &str) -> SanType {
    SanType::DnsName(name.try_into().unwrap())
}

fn files(dir: &Path, cert: &str, key: &str) -> TlsFiles {
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.join("tls.key"), key).unwrap();
    TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        client_ca: None,
        client_san: None,
    }
}

#[test]
fn a_good_pair_loads_with_the_port_alpn_and_its_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pair(vec![dns("localhost")], 1);
    let f = files(dir.path(), &cert, &key);
    let grpc = load(&f, Port::Grpc).unwrap();
    assert_eq!(grpc.config.alpn_protocols, vec![b"h2".to_vec()]);
    let http = load(&f, Port::Http).unwrap();
    assert_eq!(http.config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    // rcgen's default notAfter is far in the future.
    assert!(grpc.not_after > 4_000_000_000);
    assert_eq!(grpc.fingerprint, http.fingerprint);
}

#[test]
fn bad_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pair(vec![dns("localhost")], 1);
    let (_, other_key) = pair(vec![dns("localhost")], 2);

    let f = files(dir.path(), "garbage", &key);
    let e = load(&f, Port::Grpc).err().unwrap();
    assert!(
        matches!(&e, TlsError::Pem { path, .. } if *path == f.cert),
        "{e}"
    );

    let f = files(dir.path(), &cert, &other_key);
    let e = load(&f, Port::Grpc).err().unwrap();
    assert!(
        matches!(&e, TlsError::Rustls { path, .. } if *path == f.key),
        "{e}"
    );

    let f = files(dir.path(), &cert, "garbage");
    let e = load(&f, Port::Grpc).err().unwrap();
    assert!(
        matches!(&e, TlsError::Pem { path, .. } if *path == f.key),
        "{e}"
    );

    let mut f = files(dir.path(), &cert, &key);
    f.client_ca = Some(dir.path().join("absent.crt"));
    let e = load(&f, Port::Grpc).err().unwrap();
    assert!(e.to_string().contains("absent.crt"), "{e}");
}

#[test]
fn the_san_check_takes_dns_without_case_and_uris_exactly() {
    let uri = SanType::URI("spiffe://cluster.local/ns/a/sa/envoy".try_into().unwrap());
    let (cert, _) = pair(vec![dns("Envoy.Example"), uri], 1);
    let der = rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
    assert!(has_san(&der, "envoy.example"));
    assert!(has_san(&der, "spiffe://cluster.local/ns/a/sa/envoy"));
    assert!(!has_san(&der, "SPIFFE://cluster.local/ns/a/sa/envoy"));
    assert!(!has_san(&der, "other.example"));
    assert!(!has_san(b"not der", "envoy.example"));

    let ip = SanType::IpAddress("10.0.0.7".parse().unwrap());
    let (cert, _) = pair(vec![dns("*.ratelimit.svc"), ip], 2);
    let der = rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
    assert!(has_san(&der, "envoy.ratelimit.svc"));
    assert!(!has_san(&der, "a.envoy.ratelimit.svc"));
    assert!(!has_san(&der, "ratelimit.svc"));
    assert!(has_san(&der, "10.0.0.7"));
    assert!(!has_san(&der, "10.0.0.8"));
}

#[test]
fn the_watcher_swaps_settled_changes_and_keeps_the_pair_on_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pair(vec![dns("localhost")], 1);
    let f = files(dir.path(), &cert, &key);
    let first = load(&f, Port::Grpc).unwrap();
    let current = ArcSwap::new(first.config.clone());
    let metrics = Arc::new(crate::observe::metrics::Metrics::new());
    let mut state = State::new(
        f.clone(),
        Port::Grpc,
        first.fingerprint,
        first.not_after,
        metrics.clone(),
    );
    let in_force = || Arc::as_ptr(&current.load_full());
    let before = in_force();
    state.poll(&current);
    assert_eq!(in_force(), before, "nothing changed");

    let (cert2, key2) = pair(vec![dns("localhost")], 2);
    files(dir.path(), &cert2, &key2);
    state.poll(&current);
    assert_eq!(in_force(), before, "seen once: not yet settled");
    state.poll(&current);
    assert_ne!(in_force(), before, "seen twice: swapped");

    let errors = || metrics.tls.reload_errors.with_label_values(&["grpc"]).get();
    let (errors_before, swapped) = (errors(), in_force());
    files(dir.path(), "garbage", &key2);
    state.poll(&current);
    state.poll(&current);
    assert_eq!(in_force(), swapped, "the last good pair stays");
    assert_eq!(errors(), errors_before + 1);
    state.poll(&current);
    assert_eq!(errors(), errors_before + 1, "counted once");
}
