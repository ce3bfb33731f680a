//! The fred client's configuration and its error log.

use super::*;

/// The client's configuration: topology, credentials and TLS.
pub(super) fn fred_config(options: &RedisOptions) -> Result<Config, StoreError> {
    let t = &options.target;
    let server_config = match &t.topology {
        Topology::Single { server: s, .. } => ServerConfig::Centralized { server: server(s) },
        Topology::Cluster { seeds } => ServerConfig::Clustered {
            hosts: seeds.iter().map(server).collect(),
            policy: ClusterDiscoveryPolicy::default(),
        },
        Topology::Sentinel { sentinels, master } => {
            let (username, password) = t.sentinel_credentials();
            ServerConfig::Sentinel {
                hosts: sentinels.iter().map(server).collect(),
                service_name: master.clone(),
                username,
                password,
            }
        }
    };
    let tls = if t.tls {
        let config = match &options.tls {
            Some(config) => ClientConfig::clone(config),
            None => RedisTls::default()
                .client_config()
                .map_err(|e| StoreError::Unavailable(e.to_string()))?,
        };
        Some(TlsConnector::from(config).into())
    } else {
        None
    };
    Ok(Config {
        server: server_config,
        username: t.username.clone(),
        password: t.password.clone(),
        database: match &t.topology {
            Topology::Single { db, .. } => *db,
            _ => None,
        },
        // Keep trying when Redis is down at startup too.
        fail_fast: false,
        tls,
        ..Config::default()
    })
}

/// The target as logs name it: its first address.
pub(super) fn first_address(t: &RedisTarget) -> String {
    let first = match &t.topology {
        Topology::Single { server, .. } => Some(server),
        Topology::Cluster { seeds } => seeds.first(),
        Topology::Sentinel { sentinels, .. } => sentinels.first(),
    };
    first.map_or_else(String::new, |h| format!("{}:{}", h.host, h.port))
}

/// What to check when a connection error names a certificate: the client
/// reports a refused TLS handshake only as an I/O error's text.
pub(super) fn tls_hint(message: &str) -> &'static str {
    if message.contains("ertificate") {
        "; the TLS handshake failed: check --redis-tls-ca (the CA that signs Redis's certificate), \
         the names in that certificate (--redis-tls-skip-hostname-verification), and \
         --redis-tls-cert/--redis-tls-key if Redis requires client certificates"
    } else {
        ""
    }
}

/// Logs the client's connection errors, a refused TLS handshake among
/// them, which no command reports (commands only time out meanwhile): a
/// new error at once, the same one again after [`ERROR_LOG_EVERY`]. The task
/// ends with the client.
pub(super) fn spawn_error_log(client: &Client, target: &RedisTarget) {
    let mut errors = client.error_rx();
    let (address, tls) = (first_address(target), target.tls);
    tokio::spawn(async move {
        let mut last: Option<(String, Instant)> = None;
        loop {
            let (error, server) = match errors.recv().await {
                Ok(event) => event,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => break,
            };
            let message = error.to_string();
            let repeat = last
                .as_ref()
                .is_some_and(|(m, at)| *m == message && at.elapsed() < ERROR_LOG_EVERY);
            if !repeat {
                tracing::error!(
                    redis = %server.map_or_else(|| address.clone(), |s| s.to_string()),
                    tls,
                    "Redis connection failed: {message}{}; the failure policy decides until it connects",
                    tls_hint(&message)
                );
                last = Some((message, Instant::now()));
            }
        }
    });
}
