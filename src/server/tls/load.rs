//! Reads a port's PEM files and builds its rustls server configuration.

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::verify::SanVerifier;
use super::{Port, TlsError, TlsFiles};

/// A configuration built from the files, and what the watcher needs.
pub struct Loaded {
    /// The server configuration for new handshakes.
    pub config: Arc<ServerConfig>,
    /// The served certificate's notAfter, in Unix seconds.
    pub not_after: i64,
    /// A hash of the files' contents, to tell when they change.
    pub fingerprint: u64,
}

/// The files' contents, read once so the hash and the parse see the same bytes.
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_all(files: &TlsFiles) -> Result<Contents, TlsError> {
    Ok(Contents {
        cert: read(&files.cert)?,
        key: read(&files.key)?,
        client_ca: files.client_ca.as_deref().map(read).transpose()?,
    })
}

fn hash_of(contents: &Contents) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    contents.cert.hash(&mut h);
    contents.key.hash(&mut h);
    contents.client_ca.hash(&mut h);
    h.finish()
}

/// A hash of the files' current contents: it changes when any of them is
/// rewritten, renamed over or reached through a swapped symlink.
pub fn fingerprint(files: &TlsFiles) -> Result<u64, TlsError> {
    read_all(files).map(|c| hash_of(&c))
}

/// Reads `files` and builds `port`'s configuration: TLS 1.2 and 1.3 with
/// ring, the port's ALPN, and a client verifier when a client CA is given.
pub fn load(files: &TlsFiles, port: Port) -> Result<Loaded, TlsError> {
    let contents = read_all(files)?;
    let certs = certs(&files.cert, &contents.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| TlsError::Pem {
        path: files.key.clone(),
        what: format!("no private key found ({e})"),
    })?;
    let not_after = not_after(&files.cert, &certs[0])?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| TlsError::Rustls {
            path: files.cert.clone(),
            source,
        })?;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            builder.with_client_cert_verifier(client_verifier(path, pem, files, provider)?)
        }
        _ => builder.with_no_client_auth(),
    };
    // rustls checks here that the key belongs to the certificate.
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|source| TlsError::Rustls {
            path: files.key.clone(),
            source,
        })?;
    config.alpn_protocols = port.alpn();
    Ok(Loaded {
        config: Arc::new(config),
        not_after,
        fingerprint: hash_of(&contents),
    })
}

/// The certificates of a PEM chain, at least one.
fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            what: format!("unparsable PEM ({e})"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "no certificate found".into(),
        });
    }
    Ok(certs)
}

/// The leaf's notAfter, in Unix seconds.
fn not_after(path: &Path, leaf: &CertificateDer<'_>) -> Result<i64, TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        what: format!("the first certificate is not X.509 ({e})"),
    })?;
    Ok(cert.validity().not_after.timestamp())
}

/// WebPKI verification against the CAs of `pem`, wrapped in the SAN check
/// when `files.client_san` is set.
fn client_verifier(
    path: &Path,
    pem: &[u8],
    files: &TlsFiles,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(path, pem)? {
        roots.add(cert).map_err(|source| TlsError::Rustls {
            path: path.to_owned(),
            source,
        })?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::ClientCa {
            path: path.to_owned(),
            what: e.to_string(),
        })?;
    Ok(match &files.client_san {
        Some(san) => Arc::new(SanVerifier::new(verifier, san.clone())),
        None => verifier,
    })
}
