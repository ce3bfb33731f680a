//! A client-certificate verifier that, after rustls's WebPKI chain check,
//! also requires a given subject alternative name (envoyproxy/ratelimit's
//! `GRPC_CLIENT_TLS_SAN`).

use std::net::IpAddr;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use x509_parser::extensions::GeneralName;

/// `inner` (chain verification), then the end-entity certificate must name
/// `san` among its DNS or URI subject alternative names.
#[derive(Debug)]
pub struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    san: String,
}

impl SanVerifier {
    /// Wraps `inner`, requiring `san`.
    pub fn new(inner: Arc<dyn ClientCertVerifier>, san: String) -> SanVerifier {
        SanVerifier { inner, san }
    }
}

/// Whether the DER certificate `cert` names `san`: as a DNS name (without
/// case; a `*.` wildcard covers one label, as Go's check in
/// envoyproxy/ratelimit allows), as an IP address, or as a URI (exactly).
pub fn has_san(cert: &[u8], san: &str) -> bool {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return false;
    };
    let Ok(Some(names)) = parsed.subject_alternative_name() else {
        return false;
    };
    let ip = san.parse::<IpAddr>().ok();
    names.value.general_names.iter().any(|name| match name {
        GeneralName::DNSName(dns) => dns_matches(dns, san),
        GeneralName::URI(uri) => *uri == san,
        GeneralName::IPAddress(octets) => ip.is_some_and(|ip| ip_octets(ip) == *octets),
        _ => false,
    })
}

/// A DNS SAN `pattern` (maybe `*.suffix`) against the required name `host`.
fn dns_matches(pattern: &str, host: &str) -> bool {
    if pattern.eq_ignore_ascii_case(host) {
        return true;
    }
    match (pattern.strip_prefix("*."), host.split_once('.')) {
        (Some(suffix), Some((first, rest))) => {
            !first.is_empty() && rest.eq_ignore_ascii_case(suffix)
        }
        _ => false,
    }
}

fn ip_octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if !has_san(end_entity, &self.san) {
            return Err(Error::InvalidCertificate(CertificateError::NotValidForName));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
