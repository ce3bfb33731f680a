//! envoyproxy/ratelimit domains from an xDS control plane (Envoy Gateway):
//! one ADS stream, state of the world, resource type
//! [`RATE_LIMIT_CONFIG_TYPE`] (one resource per domain).
//!
//! Each response is the whole set: it is read as files would be
//! ([`crate::config::envoy_xds`]) and installed with the other sources, then
//! ACKed; an invalid set is NACKed with the reason and the previous one
//! keeps applying. When the stream breaks, the last good set stays in force
//! and the client reconnects with exponential backoff, resubscribing.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::RuleSources;
use crate::config::envoy_xds;

/// The resource type of envoyproxy/ratelimit's configuration.
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Most bytes accepted in one response from the control plane.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Files of the client's TLS (mutual TLS when a certificate is given).
#[derive(Debug, Clone, Default)]
pub struct XdsTls {
    /// PEM CA bundle the control plane's certificate must chain to.
    pub ca: Option<std::path::PathBuf>,
    /// PEM client certificate (with `key`).
    pub cert: Option<std::path::PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<std::path::PathBuf>,
    /// The name the control plane's certificate must carry (default: the URL's host).
    pub san: Option<String>,
}

/// Where and how to reach the control plane.
#[derive(Debug, Clone)]
pub struct XdsOptions {
    /// `host:port` or a URL (`http://`, `https://`).
    pub server: String,
    /// The node id the control plane knows this service by.
    pub node_id: String,
    /// Node metadata, `key=value` pairs.
    pub node_metadata: Vec<(String, String)>,
    /// Extra headers on the stream (`key=value` pairs).
    pub headers: Vec<(String, String)>,
    /// TLS to the control plane, if any.
    pub tls: Option<XdsTls>,
    /// First wait before reconnecting.
    pub backoff_initial: Duration,
    /// Longest wait before reconnecting.
    pub backoff_max: Duration,
}

/// Why a stream to the control plane ended.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// The TLS files could not be read.
    #[error("xDS TLS file {file}: {source}")]
    TlsFile {
        /// The file.
        file: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The server address or TLS settings are not usable.
    #[error("xDS server {0}")]
    Endpoint(String),
    /// The connection or the stream failed.
    #[error("xDS stream: {0}")]
    Stream(String),
}

/// Runs the client until the process ends.
pub fn spawn(options: XdsOptions, sources: Arc<RuleSources>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut wait = options.backoff_initial;
        loop {
            let answered = match stream(&options, &sources).await {
                Ok(answered) => {
                    tracing::warn!(server = %options.server, "xDS stream closed by the control plane");
                    answered
                }
                Err((answered, e)) => {
                    tracing::warn!(server = %options.server, error = %e, "xDS stream failed; the last configuration stays in force");
                    answered
                }
            };
            sources.telemetry().metrics.sources.xds_stream_up.set(0);
            if answered {
                wait = options.backoff_initial;
            }
            tokio::time::sleep(jittered(wait)).await;
            wait = (wait * 2).min(options.backoff_max);
        }
    })
}

/// Up to a quarter less than `wait`, so that many replicas do not reconnect
/// in step.
fn jittered(wait: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let _ = getrandom::fill(&mut byte);
    wait.mul_f64(1.0 - f64::from(byte[0]) / 1024.0)
}

/// One stream: subscribes, then installs and acknowledges each response.
/// Says whether the control plane answered at least once.
async fn stream(options: &XdsOptions, sources: &RuleSources) -> Result<bool, (bool, XdsError)> {
    let channel = connect(options).await.map_err(|e| (false, e))?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(MAX_RESPONSE_BYTES);
    let (tx, rx) = mpsc::channel(4);
    let node = node(options);
    let _ = tx.send(request(&node, "", "", None)).await;
    let mut call = tonic::Request::new(ReceiverStream::new(rx));
    for (k, v) in &options.headers {
        if let (Ok(k), Ok(v)) = (
            k.parse::<MetadataKey<_>>(),
            MetadataValue::try_from(v.as_str()),
        ) {
            call.metadata_mut().insert(k, v);
        }
    }
    let stream_err =
        |answered: bool| move |e: tonic::Status| (answered, XdsError::Stream(e.to_string()));
    let mut responses = client
        .stream_aggregated_resources(call)
        .await
        .map_err(stream_err(false))?
        .into_inner();
    sources.telemetry().metrics.sources.xds_stream_up.set(1);
    tracing::info!(server = %options.server, node = %options.node_id, "xDS stream open");
    let mut accepted = String::new();
    let mut answered = false;
    while let Some(response) = responses.message().await.map_err(stream_err(answered))? {
        answered = true;
        let error = match install(&response, sources) {
            Ok(domains) => {
                sources
                    .telemetry()
                    .metrics
                    .sources
                    .xds_updates
                    .with_label_values(&["accepted"])
                    .inc();
                tracing::info!(version = %response.version_info, domains, "xDS configuration installed");
                accepted.clone_from(&response.version_info);
                None
            }
            Err(message) => {
                sources
                    .telemetry()
                    .metrics
                    .sources
                    .xds_updates
                    .with_label_values(&["rejected"])
                    .inc();
                tracing::warn!(version = %response.version_info, error = %message, "xDS configuration rejected; the previous one stays");
                Some(message)
            }
        };
        let reply = request(&node, &accepted, &response.nonce, error);
        if tx.send(reply).await.is_err() {
            break;
        }
    }
    Ok(answered)
}

/// Reads every resource of `response` and installs them as one set.
fn install(response: &DiscoveryResponse, sources: &RuleSources) -> Result<usize, String> {
    if response.type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(format!(
            "unexpected resource type {} (this client asks for {RATE_LIMIT_CONFIG_TYPE})",
            response.type_url
        ));
    }
    let mut domains = Vec::with_capacity(response.resources.len());
    for any in &response.resources {
        if any.type_url != RATE_LIMIT_CONFIG_TYPE {
            return Err(format!("a resource of type {} in the update", any.type_url));
        }
        let config = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("a resource does not decode: {e}"))?;
        let name = format!("xds:{}@{}", config.name, response.version_info);
        domains.push(Arc::new(envoy_xds::from_proto(&name, &config)?));
    }
    sources.install_xds(domains)
}

fn request(node: &Node, version: &str, nonce: &str, error: Option<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.to_owned(),
        node: Some(node.clone()),
        type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
        response_nonce: nonce.to_owned(),
        error_detail: error.map(|message| RpcStatus {
            // INVALID_ARGUMENT, as gRPC names a configuration that does not validate.
            code: 3,
            message,
            details: Vec::new(),
        }),
        ..Default::default()
    }
}

fn node(options: &XdsOptions) -> Node {
    let fields = options
        .node_metadata
        .iter()
        .map(|(k, v)| {
            let value = Value {
                kind: Some(Kind::StringValue(v.clone())),
            };
            (k.clone(), value)
        })
        .collect();
    Node {
        id: options.node_id.clone(),
        metadata: (!options.node_metadata.is_empty()).then_some(Struct { fields }),
        ..Default::default()
    }
}

async fn connect(options: &XdsOptions) -> Result<Channel, XdsError> {
    let tls = options.tls.as_ref();
    let url = match options.server.contains("://") {
        true => options.server.clone(),
        false if tls.is_some() => format!("https://{}", options.server),
        false => format!("http://{}", options.server),
    };
    let mut endpoint = Endpoint::from_shared(url)
        .map_err(|e| XdsError::Endpoint(format!("{}: {e}", options.server)))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls_config(tls)?)
            .map_err(|e| XdsError::Endpoint(e.to_string()))?;
    }
    endpoint
        .connect()
        .await
        .map_err(|e| XdsError::Stream(format!("connecting to {}: {e}", options.server)))
}

fn tls_config(tls: &XdsTls) -> Result<ClientTlsConfig, XdsError> {
    let read = |path: &std::path::PathBuf| {
        std::fs::read(path).map_err(|source| XdsError::TlsFile {
            file: path.display().to_string(),
            source,
        })
    };
    let mut config = ClientTlsConfig::new();
    if let Some(ca) = &tls.ca {
        config = config.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(san) = &tls.san {
        config = config.domain_name(san.clone());
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nack_carries_the_last_accepted_version_and_the_reason() {
        let options = XdsOptions {
            server: "127.0.0.1:1".to_owned(),
            node_id: "envoy-ratelimit".to_owned(),
            node_metadata: vec![("cluster".to_owned(), "eg".to_owned())],
            headers: Vec::new(),
            tls: None,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(8),
        };
        let n = node(&options);
        let r = request(&n, "v1", "nonce-2", Some("bad unit".to_owned()));
        assert_eq!(r.version_info, "v1");
        assert_eq!(r.response_nonce, "nonce-2");
        assert_eq!(r.type_url, RATE_LIMIT_CONFIG_TYPE);
        assert_eq!(
            r.error_detail.map(|e| e.message),
            Some("bad unit".to_owned())
        );
        let id = r.node.map(|n| n.id);
        assert_eq!(id.as_deref(), Some("envoy-ratelimit"));
    }

    #[test]
    fn jitter_takes_off_at_most_a_quarter() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(4));
            assert!(
                d <= Duration::from_secs(4) && d >= Duration::from_secs(3),
                "{d:?}"
            );
        }
    }
}
