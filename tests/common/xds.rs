//! A small xDS control plane for the tests: an ADS server (state of the
//! world) that sends the current set of `RateLimitConfig` resources on each
//! stream and again whenever the test changes it, and records every request
//! (subscriptions, ACKs and NACKs) it receives.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// The control plane's TLS: its certificate, and its clients' CA.
pub struct Tls {
    /// Its certificate and key.
    pub cert: super::pki::Pair,
    /// PEM CA its clients' certificates must chain to.
    pub client_ca: String,
}

/// The resource type divvy subscribes to.
pub const TYPE: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// A version of the configuration and its resources.
pub type Snapshot = (String, Vec<RateLimitConfig>);

#[derive(Clone)]
struct Ads {
    snapshot: watch::Sender<Snapshot>,
    requests: Arc<Mutex<Vec<DiscoveryRequest>>>,
    /// Set on kill: every stream ends with an error.
    killed: watch::Sender<bool>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(self.clone().serve_stream(incoming, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

impl Ads {
    fn record(&self, r: DiscoveryRequest) {
        self.requests.lock().unwrap().push(r);
    }

    /// Sends the snapshot after the first request, and again on each change,
    /// recording every request the client sends meanwhile.
    async fn serve_stream(
        self,
        mut incoming: Streaming<DiscoveryRequest>,
        tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    ) {
        let mut snapshots = self.snapshot.subscribe();
        let mut killed = self.killed.subscribe();
        match incoming.message().await {
            Ok(Some(r)) => self.record(r),
            _ => return,
        }
        let mut nonce = 0u64;
        loop {
            let (version, configs) = snapshots.borrow_and_update().clone();
            nonce += 1;
            if tx
                .send(Ok(response(&version, &configs, nonce)))
                .await
                .is_err()
            {
                return;
            }
            loop {
                tokio::select! {
                    m = incoming.message() => match m {
                        Ok(Some(r)) => self.record(r),
                        _ => return,
                    },
                    changed = snapshots.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        break;
                    }
                    _ = killed.changed() => {
                        let _ = tx.send(Err(Status::unavailable("control plane stopped"))).await;
                        return;
                    }
                }
            }
        }
    }
}

fn response(version: &str, configs: &[RateLimitConfig], nonce: u64) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.to_owned(),
        type_url: TYPE.to_owned(),
        nonce: format!("n{nonce}"),
        resources: configs
            .iter()
            .map(|c| Any {
                type_url: TYPE.to_owned(),
                value: c.encode_to_vec(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A running control plane; dropping it (or [`ControlPlane::kill`]) closes
/// its port and every stream at once.
pub struct ControlPlane {
    /// Where it listens.
    pub addr: SocketAddr,
    ads: Ads,
    task: tokio::task::JoinHandle<()>,
}

impl ControlPlane {
    /// Serves `snapshot` on `addr` (port 0: a free one).
    pub async fn start(addr: SocketAddr, snapshot: Snapshot) -> ControlPlane {
        ControlPlane::serve(addr, snapshot, None).await
    }

    /// [`ControlPlane::start`] over mutual TLS: its certificate, and the CA
    /// its clients' certificates must chain to.
    pub async fn start_tls(addr: SocketAddr, snapshot: Snapshot, tls: Tls) -> ControlPlane {
        ControlPlane::serve(addr, snapshot, Some(tls)).await
    }

    async fn serve(addr: SocketAddr, snapshot: Snapshot, tls: Option<Tls>) -> ControlPlane {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let ads = Ads {
            snapshot: watch::Sender::new(snapshot),
            requests: Arc::default(),
            killed: watch::Sender::new(false),
        };
        let service = AggregatedDiscoveryServiceServer::new(ads.clone());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            let config = ServerTlsConfig::new()
                .identity(Identity::from_pem(&tls.cert.cert, &tls.cert.key))
                .client_ca_root(Certificate::from_pem(&tls.client_ca));
            builder = builder.tls_config(config).expect("TLS config");
        }
        let task = tokio::spawn(async move {
            let _ = builder
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        ControlPlane { addr, ads, task }
    }

    /// Replaces the configuration; every open stream gets it.
    pub fn set(&self, snapshot: Snapshot) {
        self.ads.snapshot.send_replace(snapshot);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        self.ads.requests.lock().unwrap().clone()
    }

    /// Stops serving: the port closes and open streams break.
    pub fn kill(self) {
        self.ads.killed.send_replace(true);
        self.task.abort();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.ads.killed.send_replace(true);
        self.task.abort();
    }
}
