//! Aux rules from a ZooKeeper node, as foxpass's divvy fork read them.
//!
//! The node's data is a JSON array of rules in divvy's JSON rule shape; they
//! go ahead of the policy file's rules in the node's order (foxpass
//! reversed them). The node is watched, so a change applies as soon as
//! ZooKeeper reports it; an invalid array (not JSON, an unknown field, an
//! unreachable rule) is refused with an error log and
//! `divvy_aux_rules_refused_total`, and the previous aux rules stay. A
//! missing node means no aux rules. While ZooKeeper is down the last good
//! aux rules stay in force and the client reconnects with backoff
//! (0.5 s doubling to 10 s); readiness does not depend on it.

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client as zk;

use super::content_hash;
use super::RuleSources;
use crate::config::schema::RawRule;
use crate::observe::metrics::Metrics;

/// Where the aux rules are.
#[derive(Debug, Clone)]
pub struct ZkOptions {
    /// `host:port[,host:port...]`.
    pub hosts: String,
    /// The node holding the JSON array.
    pub path: String,
}

/// Watches the node and installs its rules until the runtime stops.
pub fn spawn(options: ZkOptions, sources: Arc<RuleSources>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(500);
        let mut applied: Option<String> = None;
        loop {
            let connect = zk::Client::connector()
                .with_session_timeout(Duration::from_secs(6))
                .connect(&options.hosts);
            match tokio::time::timeout(Duration::from_secs(10), connect).await {
                Ok(Ok(client)) => {
                    backoff = Duration::from_millis(500);
                    follow_session(&client, sources.telemetry().metrics.clone());
                    tracing::info!(hosts = %options.hosts, path = %options.path, "watching ZooKeeper for aux rules");
                    watch(&client, &options.path, &sources, &mut applied).await;
                    sources
                        .telemetry()
                        .metrics
                        .sources
                        .aux_rules_source_up
                        .set(0);
                }
                Ok(Err(e)) => {
                    tracing::warn!(hosts = %options.hosts, "ZooKeeper unreachable ({e}); keeping the last aux rules, retrying in {backoff:?}");
                }
                Err(_) => {
                    tracing::warn!(hosts = %options.hosts, "ZooKeeper did not answer within 10 s; keeping the last aux rules, retrying in {backoff:?}");
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    })
}

/// Keeps `divvy_aux_rules_source_up` following the session: 0 while
/// disconnected, 1 while connected, until the session ends.
fn follow_session(client: &zk::Client, metrics: Arc<Metrics>) {
    let mut states = client.state_watcher();
    tokio::spawn(async move {
        loop {
            let state = states.changed().await;
            let up = matches!(
                state,
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
            );
            metrics.sources.aux_rules_source_up.set(i64::from(up));
            if !up {
                tracing::warn!(%state, "ZooKeeper connection lost; keeping the last aux rules");
            }
            if state.is_terminated() {
                return;
            }
        }
    });
}

/// Reads and watches the node until the session breaks.
async fn watch(
    client: &zk::Client,
    path: &str,
    sources: &RuleSources,
    applied: &mut Option<String>,
) {
    loop {
        let (stat, watcher) = match client.check_and_watch_stat(path).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(path, "cannot watch the aux rules node: {e}");
                return;
            }
        };
        let data = match stat {
            None => Some(Vec::new()),
            Some(_) => match client.get_data(path).await {
                Ok((data, _)) => Some(data),
                // Deleted in between: the watch fires, read again.
                Err(zk::Error::NoNode) => None,
                Err(e) => {
                    tracing::warn!(path, "cannot read the aux rules node: {e}");
                    return;
                }
            },
        };
        sources
            .telemetry()
            .metrics
            .sources
            .aux_rules_source_up
            .set(1);
        if let Some(data) = data {
            apply(&data, stat.is_some(), sources, applied);
        }
        // A safety net: read again now and then even without an event.
        match tokio::time::timeout(Duration::from_secs(30), watcher.changed()).await {
            Ok(event) if event.event_type == zk::EventType::Session => {
                tracing::warn!(state = ?event.session_state, "ZooKeeper session ended; reconnecting");
                return;
            }
            _ => {}
        }
    }
}

/// Parses the node's data and installs it, unless it is what is in force.
fn apply(data: &[u8], exists: bool, sources: &RuleSources, applied: &mut Option<String>) {
    let hash = content_hash(data);
    if applied.as_deref() == Some(hash.as_str()) {
        return;
    }
    let parsed: Result<Vec<RawRule>, String> = if !exists
        || data.iter().all(u8::is_ascii_whitespace)
    {
        Ok(Vec::new())
    } else {
        serde_json::from_slice(data).map_err(|e| format!("not a JSON array of divvy rules: {e}"))
    };
    let result = parsed.and_then(|rules| {
        let n = rules.len();
        sources.install_aux(rules).map(|total| (n, total))
    });
    match result {
        Ok((n, total)) => {
            tracing::info!(
                aux_rules = n,
                rules = total,
                node_exists = exists,
                "aux rules installed ahead of the policy file's"
            );
            *applied = Some(hash);
        }
        Err(e) => {
            sources.telemetry().metrics.sources.aux_rules_refused.inc();
            tracing::error!("aux rules from ZooKeeper refused; the previous ones stay: {e}");
            // The same bad data is reported once, not at every safety-net
            // read; a new policy file tries it again (RuleSources).
            *applied = Some(hash);
        }
    }
}
