//! A steady gRPC load in the xDS domain (`xds::DOMAIN`), from the soak
//! straight to both replicas over the gRPC port's TLS (no Envoy between):
//! [`ACTORS`] actors, each asking each replica [`RATE`] times a second on
//! its own connection and schedule, every answer kept with its Unix times.
//! While the control plane is down the replicas keep its last version, so
//! these calls must be decided then too.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::checks::{self, Findings, KILL_GRACE};
use crate::faults::{Event, Kind};
use crate::now;

/// Actors of the domain's key (`a0`, `a1`, ...).
pub const ACTORS: usize = 2;

/// Calls per second of one actor to one replica: twice this per actor in
/// all, well above the domain's limit (`xds::LIMIT`).
pub const RATE: f64 = 10.0;

/// The deadline each call carries (`grpc-timeout`): a call not answered
/// within it is not decided. Generous, unlike Envoy's 20 ms: this load
/// checks decisions and counts, not latency, on a busy 2-core machine.
const DEADLINE: Duration = Duration::from_secs(1);

/// What became of one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// OK, decided on the domain's limit.
    Ok,
    /// OVER_LIMIT, decided on the domain's limit.
    OverLimit,
    /// Decided, but not on the domain's limit (a replica that has not
    /// loaded the domain yet): what it answered.
    Foreign(String),
    /// No decision: a gRPC error, a refused connection.
    Error(String),
    /// No answer within the call's deadline: what tonic said.
    Late(String),
}

/// One call of the load.
#[derive(Debug, Clone)]
pub struct Call {
    /// The actor, `0..ACTORS`.
    pub actor: usize,
    /// The replica it went to.
    pub replica: usize,
    /// When it was sent (Unix seconds).
    pub sent: f64,
    /// When its answer (or error) came back (Unix seconds).
    pub done: f64,
    /// The answer.
    pub answer: Answer,
}

/// Runs the load against the replicas' gRPC addresses `grpc` (trusting
/// `ca`, PEM, for `localhost`) for `seconds` on a thread of its own; the
/// calls accumulate in the returned vector as they come.
pub fn start(
    grpc: [SocketAddr; 2],
    ca: String,
    seconds: f64,
) -> (Arc<Mutex<Vec<Call>>>, std::thread::JoinHandle<()>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let shared = calls.clone();
    let handle = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let users = ACTORS * 2;
            let mut tasks = Vec::new();
            for actor in 0..ACTORS {
                for (replica, addr) in grpc.iter().enumerate() {
                    // Schedules spread evenly over each 1/RATE s.
                    let offset = tasks.len() as f64 / (users as f64 * RATE);
                    let target = (*addr, ca.clone());
                    let calls = shared.clone();
                    tasks.push(tokio::spawn(user(
                        target, actor, replica, offset, seconds, calls,
                    )));
                }
            }
            for task in tasks {
                let _ = task.await;
            }
        });
    });
    (calls, handle)
}

/// A lazily connected channel to `addr`: it connects again after a
/// replica restart (a call while it is down fails at once).
fn channel(addr: SocketAddr, ca: &str) -> Option<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .ok()?
        .connect_timeout(DEADLINE)
        .tls_config(tls)
        .ok()?;
    Some(endpoint.connect_lazy())
}

/// One actor's calls to one replica (`target`: its address and the CA to
/// trust), every 1/[`RATE`] s from `offset` for `seconds` (a tick missed
/// while a call was out is skipped). After an undecided call the channel
/// is built afresh, so that a restarted replica is reached again whatever
/// the old connection's state.
async fn user(
    target: (SocketAddr, String),
    actor: usize,
    replica: usize,
    offset: f64,
    seconds: f64,
    calls: Arc<Mutex<Vec<Call>>>,
) {
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut ticks = tokio::time::interval_at(
        start + Duration::from_secs_f64(offset),
        Duration::from_secs_f64(1.0 / RATE),
    );
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let connect = || channel(target.0, &target.1).map(RateLimitServiceClient::new);
    let mut client = connect();
    let value = format!("a{actor}");
    while ticks.tick().await < end {
        let sent = now();
        let answer = match client.as_mut() {
            Some(client) => ask(client, &value).await,
            None => Answer::Error("no channel (bad address or TLS settings)".into()),
        };
        let done = now();
        if matches!(answer, Answer::Error(_) | Answer::Late(_)) {
            client = connect();
        }
        calls.lock().unwrap().push(Call {
            actor,
            replica,
            sent,
            done,
            answer,
        });
    }
}

/// One `ShouldRateLimit` of `{KEY: value}` in the domain.
async fn ask(client: &mut RateLimitServiceClient<Channel>, value: &str) -> Answer {
    let descriptor = crate::common::desc(&[(crate::xds::KEY, value)]);
    let mut request =
        tonic::Request::new(crate::common::request(crate::xds::DOMAIN, vec![descriptor]));
    request.set_timeout(DEADLINE);
    match client.should_rate_limit(request).await {
        Ok(response) => classify(&response.into_inner()),
        Err(status) => {
            let why = format!("{:?}: {}", status.code(), status.message());
            // tonic's own deadline is `Cancelled: Timeout expired`; the
            // server's, `DeadlineExceeded`.
            let late = status.code() == tonic::Code::DeadlineExceeded
                || (status.code() == tonic::Code::Cancelled
                    && status.message().contains("Timeout expired"));
            if late {
                Answer::Late(why)
            } else {
                Answer::Error(why)
            }
        }
    }
}

/// OK or OVER_LIMIT when the answer carries the domain's limit (7 per
/// second); anything else is another decision.
fn classify(response: &RateLimitResponse) -> Answer {
    let limit = response
        .statuses
        .first()
        .and_then(|s| s.current_limit.as_ref());
    let ours = limit
        .is_some_and(|l| l.requests_per_unit == crate::xds::LIMIT && l.unit == Unit::Second as i32);
    match response.overall_code {
        c if ours && c == Code::Ok as i32 => Answer::Ok,
        c if ours && c == Code::OverLimit as i32 => Answer::OverLimit,
        c => Answer::Foreign(format!("code {c}, limit {limit:?}")),
    }
}

/// When a call to replica 0 may go undecided: from each kill of it to
/// [`KILL_GRACE`] after it was ready again (a direct client, unlike Envoy,
/// has no health check to steer it away meanwhile).
fn replica0_down(events: &[Event]) -> Vec<(f64, f64)> {
    events
        .iter()
        .filter(|e| e.kind == Kind::ReplicaKill)
        .map(|e| {
            (
                e.injected,
                e.recovered.unwrap_or(e.healed + e.bound) + KILL_GRACE,
            )
        })
        .collect()
}

/// Every call decided on the domain's limit (but calls to replica 0 while
/// it was down and just after), and, per actor and epoch second, the OKs
/// of calls sent and answered within it no more than the domain's limit
/// times the failure policy's allowance ([`checks::factor`], as for the
/// Envoy load). Up to `tolerated` calls past their deadline
/// (`SOAK_5XX_TOLERATED`, as for Envoy's timeouts: a machine short of CPU
/// for a second) are reported instead of failing the run.
pub fn check(
    calls: &[Call],
    events: &[Event],
    policy: &[(f64, f64)],
    tolerated: usize,
    out: &mut Findings,
) {
    let down = replica0_down(events);
    let start = crate::START.get().copied().unwrap_or(0.0);
    let (mut ok, mut over, mut excused_errors, mut excused_foreign) = (0, 0, 0, 0);
    // Each undecided or foreign answer: how many, and when the first was sent.
    let mut wrong: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    let mut late_calls: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    let mut windows: BTreeMap<(usize, i64), u64> = BTreeMap::new();
    for c in calls {
        let excused = c.replica == 0 && down.iter().any(|(a, b)| c.done >= *a && c.done <= *b);
        match &c.answer {
            Answer::Ok => {
                ok += 1;
                if c.sent.floor() == c.done.floor() {
                    *windows.entry((c.actor, c.sent.floor() as i64)).or_insert(0) += 1;
                }
            }
            Answer::OverLimit => over += 1,
            Answer::Error(_) | Answer::Late(_) if excused => excused_errors += 1,
            Answer::Foreign(_) if excused => excused_foreign += 1,
            Answer::Late(why) => {
                let what = format!("replica {}: {why}", c.replica);
                late_calls.entry(what).or_insert((0, c.sent - start)).0 += 1;
            }
            Answer::Error(why) | Answer::Foreign(why) => {
                let what = format!(
                    "replica {}: {}",
                    c.replica,
                    why.chars().take(120).collect::<String>()
                );
                wrong.entry(what).or_insert((0, c.sent - start)).0 += 1;
            }
        }
    }
    let _ = writeln!(
        out.report,
        "xDS domain {} over gRPC (TLS) to both replicas: {} calls (OK: {ok}, OVER_LIMIT: {over}, undecided while replica 0 was down: {excused_errors}, decided there by another limit: {excused_foreign}, anything else: {})",
        crate::xds::DOMAIN,
        calls.len(),
        wrong.values().chain(late_calls.values()).map(|(n, _)| n).sum::<usize>()
    );
    let late: usize = late_calls.values().map(|(n, _)| n).sum();
    if late > 0 && late <= tolerated {
        let _ = writeln!(
            out.report,
            "  calls past their 1 s deadline outside replica kills: {late}, tolerated (SOAK_5XX_TOLERATED={tolerated})"
        );
    } else {
        wrong.extend(late_calls);
    }
    for (what, (n, first)) in wrong {
        out.violations.push(format!(
            "xDS domain: {n} calls not decided on its limit: {what} (first at {first:.1} s)"
        ));
    }
    let limit = u64::from(crate::xds::LIMIT);
    let mut worst = (0u64, limit);
    let mut excess = Vec::new();
    for ((_, k), n) in windows {
        let bound = limit * checks::factor(k as f64, events, policy);
        if n * worst.1 > worst.0 * bound {
            worst = (n, bound);
        }
        if n > bound {
            excess.push(format!("{n} > {bound} at {:.0} s", k as f64 - start));
        }
    }
    let _ = writeln!(
        out.report,
        "  {} ({}/s per actor, fixed epoch windows): fullest window {} of {} allowed",
        crate::xds::KEY,
        limit,
        worst.0,
        worst.1
    );
    if !excess.is_empty() {
        out.violations.push(format!(
            "xDS domain: over-admitted in {} windows: {}",
            excess.len(),
            excess.join(", ")
        ));
    }
}
