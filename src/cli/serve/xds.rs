//! `divvy serve`'s xDS flags: envoyproxy/ratelimit domains from a control
//! plane, and the options of its client.

use std::path::PathBuf;
use std::time::Duration;

use divvy::sources::xds::{XdsOptions, XdsTls};

use super::parse_wait;

/// envoyproxy/ratelimit domains from an xDS control plane (Envoy Gateway's).
#[derive(clap::Args, Clone)]
pub struct XdsArgs {
    /// The control plane's address (`host:port` or a URL): an ADS stream of
    /// `RateLimitConfig` resources, added to the policy file's domains.
    #[arg(long, env = "DIVVY_XDS_SERVER")]
    pub xds_server: Option<String>,
    /// The node id this service gives the control plane.
    #[arg(long, env = "DIVVY_XDS_NODE_ID", default_value = "divvy")]
    pub xds_node_id: String,
    /// PEM CA bundle for the control plane's certificate (turns TLS on).
    #[arg(long, env = "DIVVY_XDS_TLS_CA")]
    pub xds_tls_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS to the control plane (turns TLS on).
    #[arg(long, env = "DIVVY_XDS_TLS_CERT", requires = "xds_tls_key")]
    pub xds_tls_cert: Option<PathBuf>,
    /// PEM private key of --xds-tls-cert.
    #[arg(long, env = "DIVVY_XDS_TLS_KEY", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,
    /// The name the control plane's certificate must carry (default: its host).
    #[arg(long, env = "DIVVY_XDS_TLS_SAN")]
    pub xds_tls_san: Option<String>,
    /// Node metadata for the control plane, `key=value[,key=value...]`.
    #[arg(long, env = "DIVVY_XDS_NODE_METADATA", default_value = "")]
    pub xds_node_metadata: String,
    /// Extra headers on the xDS stream, `key:value[,key:value...]`.
    #[arg(long, env = "DIVVY_XDS_HEADERS", default_value = "")]
    pub xds_headers: String,
    /// First wait before reconnecting to the control plane (`500ms`, `10s`).
    #[arg(long, env = "DIVVY_XDS_BACKOFF_INITIAL", default_value = "500ms", value_parser = parse_wait)]
    pub xds_backoff_initial: Duration,
    /// Longest wait before reconnecting to the control plane.
    #[arg(long, env = "DIVVY_XDS_BACKOFF_MAX", default_value = "30s", value_parser = parse_wait)]
    pub xds_backoff_max: Duration,
}

/// `k=v,k2=v2` (or with `sep` `:`) as pairs; items without `sep` are skipped,
/// as envoyproxy/ratelimit skips them.
fn pairs(text: &str, sep: char) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|item| item.split_once(sep))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

impl XdsArgs {
    /// The client's options, when a control plane is set.
    pub fn options(&self) -> Option<XdsOptions> {
        let server = self.xds_server.clone()?;
        let tls_on = self.xds_tls_ca.is_some() || self.xds_tls_cert.is_some();
        Some(XdsOptions {
            server,
            node_id: self.xds_node_id.clone(),
            node_metadata: pairs(&self.xds_node_metadata, '='),
            headers: pairs(&self.xds_headers, ':'),
            tls: tls_on.then(|| XdsTls {
                ca: self.xds_tls_ca.clone(),
                cert: self.xds_tls_cert.clone(),
                key: self.xds_tls_key.clone(),
                san: self.xds_tls_san.clone(),
            }),
            backoff_initial: self.xds_backoff_initial,
            backoff_max: self.xds_backoff_max.max(self.xds_backoff_initial),
        })
    }
}
