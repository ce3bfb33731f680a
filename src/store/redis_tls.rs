//! TLS to Redis (`rediss://`, `--redis-tls`): the rustls client
//! configuration that every Redis connection of the process uses (the
//! counters' Redis, its Sentinels or Cluster nodes, and the global store).
//!
//! Servers are verified against `--redis-tls-ca` when given, else against
//! the system's trust store. `--redis-tls-cert` and `--redis-tls-key` add a
//! client certificate (Redis's `tls-auth-clients yes`). Skipping hostname
//! verification still checks the chain: only the name is not compared, for
//! servers reached by an address their certificate does not name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use rustls::{Error as TlsError, SignatureScheme};
use thiserror::Error;

/// Where the TLS material comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM file of the certificate authorities that sign Redis's
    /// certificate; `None`: the system's trust store.
    pub ca: Option<PathBuf>,
    /// PEM file of the client certificate (chain), with `key`.
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key: Option<PathBuf>,
    /// Accept a certificate whose names do not include the host connected
    /// to (its chain is still verified).
    pub skip_hostname_verification: bool,
}

/// Why the TLS configuration could not be built.
#[derive(Debug, Error)]
pub enum RedisTlsError {
    /// A file could not be read.
    #[error("cannot read the Redis TLS file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no PEM item of the kind expected.
    #[error("the Redis TLS file {path} holds no {what} in PEM form")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What was looked for.
        what: &'static str,
    },
    /// A file's PEM or its content could not be used.
    #[error("the Redis TLS file {path} is not usable: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// Only one of the client certificate and its key was given.
    #[error("a Redis client certificate needs both --redis-tls-cert and --redis-tls-key (REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY)")]
    HalfClientCert,
    /// The system's trust store could not be read and no CA file was given.
    #[error(
        "no --redis-tls-ca given and the system's trust store has no usable certificates: {0}"
    )]
    NoSystemRoots(String),
    /// rustls refused the configuration.
    #[error("the Redis TLS configuration is refused: {0}")]
    Config(String),
}

/// ring, named rather than taken from the process default, so that another
/// provider compiled in elsewhere cannot make the choice ambiguous.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl RedisTls {
    /// The rustls client configuration; errors name the file at fault.
    pub fn client_config(&self) -> Result<ClientConfig, RedisTlsError> {
        let client_cert = match (&self.cert, &self.key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => return Err(RedisTlsError::HalfClientCert),
        };
        let provider = provider();
        let roots = Arc::new(self.roots()?);
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| RedisTlsError::Config(e.to_string()))?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| RedisTlsError::Config(e.to_string()))?;
        let builder = if self.skip_hostname_verification {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyHostname(webpki)))
        } else {
            builder.with_webpki_verifier(webpki)
        };
        let Some((cert, key)) = client_cert else {
            return Ok(builder.with_no_client_auth());
        };
        builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| RedisTlsError::Invalid {
                path: key.clone(),
                message: format!("the key does not fit the client certificate: {e}"),
            })
    }

    /// The CA file's certificates, else the system's.
    fn roots(&self) -> Result<RootCertStore, RedisTlsError> {
        let mut roots = RootCertStore::empty();
        if let Some(ca) = &self.ca {
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| RedisTlsError::Invalid {
                    path: ca.clone(),
                    message: e.to_string(),
                })?;
            }
            return Ok(roots);
        }
        let system = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(system.certs);
        if added == 0 {
            let why = system
                .errors
                .first()
                .map_or_else(|| "none found".to_owned(), ToString::to_string);
            return Err(RedisTlsError::NoSystemRoots(why));
        }
        Ok(roots)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, RedisTlsError> {
    std::fs::read(path).map_err(|source| RedisTlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every certificate of a PEM file (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, RedisTlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RedisTlsError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(RedisTlsError::Empty {
            path: path.to_owned(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, RedisTlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => RedisTlsError::Empty {
            path: path.to_owned(),
            what: "private key",
        },
        e => RedisTlsError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        },
    })
}

/// The webpki verifier, except that a certificate valid for another name
/// passes: only the name check is skipped, never the chain or signatures.
#[derive(Debug)]
struct AnyHostname(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyHostname {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        let verified =
            self.0
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        match verified {
            // webpki compares the name only after the chain verified.
            Err(TlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let tls = RedisTls {
            ca: Some(missing.clone()),
            ..RedisTls::default()
        };
        let e = tls.client_config().unwrap_err().to_string();
        assert!(e.contains(&missing.display().to_string()), "{e}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem\n").unwrap();
        let tls = RedisTls {
            ca: Some(empty.clone()),
            ..RedisTls::default()
        };
        let e = tls.client_config().unwrap_err().to_string();
        assert!(
            e.contains("empty.pem") && e.contains("no certificate"),
            "{e}"
        );
    }

    #[test]
    fn a_certificate_without_its_key_is_refused() {
        let tls = RedisTls {
            cert: Some(PathBuf::from("/nonexistent/client.pem")),
            ..RedisTls::default()
        };
        // The pairing is checked before any file is read.
        let e = tls.client_config();
        assert!(matches!(e, Err(RedisTlsError::HalfClientCert)), "{e:?}");
    }
}
