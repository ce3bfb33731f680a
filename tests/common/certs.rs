//! Certificates for TLS tests, made by the `openssl` command line in a
//! temporary directory: a CA, leaves it signs, and a second CA that signs
//! nothing of these.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate and its private key (PEM files).
#[derive(Clone)]
pub struct Pair {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// A test PKI.
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

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command must be installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed P-256 CA named `name`.
fn ca(dir: &Path, name: &str) -> PathBuf {
    let (key, cert) = (format!("{name}.key"), format!("{name}.crt"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &cert,
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    dir.join(cert)
}

/// A P-256 leaf `name` signed by the CA `ca`, with subject alternative
/// names `san` and extended key usage `eku`.
fn leaf(dir: &Path, ca: &str, name: &str, san: &str, eku: &str) -> Pair {
    let (key, csr, cert, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    std::fs::write(
        dir.join(&ext),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage={eku}\nsubjectAltName={san}\n"
        ),
    )
    .expect("write the extensions");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
    Pair {
        cert: dir.join(cert),
        key: dir.join(key),
    }
}

impl Certs {
    /// Generates the CAs and leaves.
    pub fn generate() -> Certs {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let ca_path = ca(d, "test-ca");
        let other_ca = ca(d, "other-ca");
        let server = leaf(
            d,
            "test-ca",
            "server",
            "IP:127.0.0.1,DNS:localhost",
            "serverAuth,clientAuth",
        );
        let wrong_name = leaf(
            d,
            "test-ca",
            "wrong-name",
            "DNS:redis.elsewhere.invalid",
            "serverAuth,clientAuth",
        );
        let client = leaf(d, "test-ca", "client", "DNS:divvy-client", "clientAuth");
        Certs {
            ca: ca_path,
            other_ca,
            server,
            wrong_name,
            client,
            _dir: dir,
        }
    }
}
