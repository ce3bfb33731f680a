//! Test certificates (made with rcgen per test) and TLS clients: tonic over
//! TLS, a raw rustls handshake that reports the server's serial, and an
//! HTTPS GET.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A subject alternative name of a test certificate.
#[derive(Debug, Clone, Copy)]
pub enum San<'a> {
    /// A DNS name.
    Dns(&'a str),
    /// A URI (a SPIFFE id, say).
    Uri(&'a str),
    /// An IP address.
    Ip(std::net::IpAddr),
}

/// A test CA.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate (PEM).
    pub pem: String,
}

/// A certificate and its key (PEM).
#[derive(Clone)]
pub struct Pair {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A certificate signed by this CA with `sans` and serial `serial`.
    pub fn issue(&self, sans: &[San<'_>], serial: u64) -> Pair {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.serial_number = Some(serial.into());
        params
            .distinguished_name
            .push(DnType::CommonName, "divvy test");
        params.subject_alt_names = sans
            .iter()
            .map(|san| match san {
                San::Dns(name) => SanType::DnsName((*name).try_into().unwrap()),
                San::Uri(uri) => SanType::URI((*uri).try_into().unwrap()),
                San::Ip(ip) => SanType::IpAddress(*ip),
            })
            .collect();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for `localhost`.
    pub fn server(&self, serial: u64) -> Pair {
        self.issue(&[San::Dns("localhost")], serial)
    }
}

impl Pair {
    /// Writes `<name>.crt` and `<name>.key` into `dir`: their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        (
            write(dir, &format!("{name}.crt"), &self.cert),
            write(dir, &format!("{name}.key"), &self.key),
        )
    }
}

/// Writes `text` to `dir/name`: its path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Replaces `path` with `text` by writing a temporary file beside it and
/// renaming it over (what a careful writer does).
pub fn replace_by_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A gRPC client over TLS to `addr` (as `localhost`), trusting `ca`,
/// presenting `identity` when given.
pub async fn grpc_tls(
    addr: SocketAddr,
    ca: &str,
    identity: Option<&Pair>,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(pair) = identity {
        tls = tls.identity(Identity::from_pem(&pair.cert, &pair.key));
    }
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(RateLimitServiceClient::new(channel))
}

/// One ShouldRateLimit on `client`: its overall code, or the error.
pub async fn call(client: &mut RateLimitServiceClient<Channel>) -> Result<i32, String> {
    let request = super::request("edge", vec![super::desc(&[("generic_key", "tls")])]);
    client
        .should_rate_limit(request)
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|e| e.to_string())
}

/// Connects over TLS and makes one ShouldRateLimit: its overall code, or
/// why the connection or the call failed.
pub async fn ask_tls(addr: SocketAddr, ca: &str, identity: Option<&Pair>) -> Result<i32, String> {
    let mut client = grpc_tls(addr, ca, identity)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    call(&mut client).await
}

/// Connects in plaintext and makes one ShouldRateLimit: its overall code,
/// or why it failed.
pub async fn ask_plain(addr: SocketAddr) -> Result<i32, String> {
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    call(&mut client).await
}

/// A rustls client configuration trusting `cas`, offering `alpn`.
fn client_config(cas: &[&str], alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
            .unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// A TLS connection to `addr` (as `localhost`) trusting `cas`.
async fn connect(
    addr: SocketAddr,
    cas: &[&str],
    alpn: &[u8],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(client_config(cas, alpn));
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        connector.connect(name, tcp),
    )
    .await
    .map_err(|_| "handshake timed out".to_owned())?
    .map_err(|e| e.to_string())
}

/// The serial number of the certificate `addr` serves to a new
/// connection, trusting `cas`.
pub async fn served_serial(addr: SocketAddr, cas: &[&str]) -> Result<u64, String> {
    let conn = connect(addr, cas, b"h2").await?;
    let leaf = conn
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no server certificate")?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| e.to_string())?;
    Ok(cert.serial.iter_u64_digits().next().unwrap_or(0))
}

/// An HTTPS GET of `path` on `addr` trusting `ca`: `(status, body)`.
pub async fn https_get(addr: SocketAddr, ca: &str, path: &str) -> Result<(u16, String), String> {
    let mut conn = connect(addr, &[ca], b"http/1.1").await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    // A peer may close without TLS's close_notify; what was read counts.
    let _ = conn.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {raw:?}"))?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
