//! An RLQS stream (`StreamRateLimitQuotas`, over the gRPC port's TLS) to
//! replica 1, reporting one bucket's usage every second as Envoy's filter
//! does; every answer is timed. The stream must stay open and answered
//! through every fault (replica 1 is never killed).

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::checks::Findings;
use crate::now;

/// The policy's rule for the stream's bucket.
pub const RULE: &str = "  - operation: {rule: rlqs}\n    algorithm: token_bucket\n    creditLimit: 100\n    resetSeconds: 1\n    label: rlqs\n";

/// The longest silence allowed between two answers: two reports' time.
const MAX_GAP: f64 = 3.0;

/// What the stream saw: the time of each answer, and how it ended (if
/// before the run did).
#[derive(Default)]
pub struct Seen {
    answers: Vec<f64>,
    ended: Option<String>,
}

/// A running stream; [`Stream::finish`] stops it.
pub struct Stream {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// Opens the stream to `grpc`, trusting `ca` (PEM) for `localhost`.
pub fn start(grpc: SocketAddr, ca: String) -> Stream {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let (s, st) = (seen.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        if let Err(e) = runtime.block_on(run(grpc, ca, s.clone(), st)) {
            s.lock().unwrap().ended = Some(e);
        }
    });
    Stream { seen, stop, thread }
}

/// Reports every second until `stop`; answers are timed as they come.
async fn run(
    grpc: SocketAddr,
    ca: String,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{grpc}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = RateLimitQuotaServiceClient::new(channel)
        .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|e| format!("stream: {e}"))?
        .into_inner();
    let reader_seen = seen.clone();
    tokio::spawn(async move {
        let why = loop {
            match answers.message().await {
                Ok(Some(_)) => reader_seen.lock().unwrap().answers.push(now()),
                Ok(None) => break "divvy ended the stream".to_owned(),
                Err(e) => break format!("stream error: {e}"),
            }
        };
        reader_seen.lock().unwrap().ended.get_or_insert(why);
    });
    while !stop.load(Ordering::Relaxed) {
        let usage = crate::common::rlqs::usage("rule", "rlqs", 5, 0);
        let reports = RateLimitQuotaUsageReports {
            domain: "soak".to_owned(),
            bucket_quota_usages: vec![usage],
        };
        if tx.send(reports).await.is_err() {
            return Err("the stream's sender closed".into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

impl Stream {
    /// Stops reporting; checks that answers came all along (from `from`
    /// to `to`, Unix seconds) and the stream never ended.
    pub fn finish(self, from: f64, to: f64, out: &mut Findings) {
        let seen = std::mem::take(&mut *self.seen.lock().unwrap());
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let mut times = vec![from];
        times.extend(
            seen.answers
                .iter()
                .copied()
                .filter(|t| *t >= from && *t <= to),
        );
        times.push(to);
        let gap = times.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        let _ = writeln!(
            out.report,
            "RLQS stream to replica 1: {} answers, longest silence {gap:.1} s{}",
            seen.answers.len(),
            seen.ended
                .as_deref()
                .map_or(String::new(), |e| format!(", ended: {e}"))
        );
        if let Some(why) = seen.ended {
            out.violations
                .push(format!("the RLQS stream ended during the run: {why}"));
        }
        if gap > MAX_GAP {
            out.violations
                .push(format!("the RLQS stream went {gap:.1} s without an answer"));
        }
    }
}
