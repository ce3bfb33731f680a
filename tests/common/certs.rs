//! Certificate files for the Redis TLS tests, made with [`super::pki`] in
//! a temporary directory: a CA, leaves it signs, and a second CA that signs
//! nothing of these.

use std::path::PathBuf;

use super::pki::{self, Ca, San};

/// A certificate and its private key (PEM files).
#[derive(Clone)]
pub struct Pair {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// A test PKI, as files.
pub struct Certs {
    /// The CA that signs every leaf below.
    pub ca: PathBuf,
    /// A CA that signs none of them.
    pub other_ca: PathBuf,
    /// A server certificate for 127.0.0.1 and localhost.
    pub server: Pair,
    /// A server certificate for `redis.elsewhere.invalid` only.
    pub wrong_name: Pair,
    /// A client certificate.
    pub client: Pair,
    _dir: tempfile::TempDir,
}

impl Certs {
    /// Generates the CAs and leaves.
    pub fn generate() -> Certs {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let ca = Ca::new("test-ca");
        let other = Ca::new("other-ca");
        let leaf = |name: &str, sans: &[San<'_>], serial| {
            let (cert, key) = ca.issue(sans, serial).write(d, name);
            Pair { cert, key }
        };
        let loopback = San::Ip(std::net::Ipv4Addr::LOCALHOST.into());
        Certs {
            ca: pki::write(d, "test-ca.crt", &ca.pem),
            other_ca: pki::write(d, "other-ca.crt", &other.pem),
            server: leaf("server", &[loopback, San::Dns("localhost")], 1),
            wrong_name: leaf("wrong-name", &[San::Dns("redis.elsewhere.invalid")], 2),
            client: leaf("client", &[San::Dns("divvy-client")], 3),
            _dir: dir,
        }
    }
}
