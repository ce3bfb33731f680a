use std::convert::Infallible;
use std::future::poll_fn;
use std::time::Duration;

use http_body::Body as _;
use prometheus::IntCounter;

use super::*;

const MS: Duration = Duration::from_millis(1);

/// Fresh counters of shed calls.
fn counters() -> ShedCounters {
    ShedCounters {
        queue: IntCounter::new("queue", "queue").unwrap(),
        deadline: IntCounter::new("deadline", "deadline").unwrap(),
    }
}

/// Calls shed so far: (for their wait, past their deadline).
fn shed_counts(counted: &ShedCounters) -> (u64, u64) {
    (counted.queue.get(), counted.deadline.get())
}

#[test]
fn a_request_is_late_after_a_quarter_of_its_timeout_or_once_its_budget_is_spent() {
    // Injected instants: the arithmetic is relative to the arrival.
    let arrived = Instant::now();
    let margin = 5 * MS;
    let late = |timeout, waited| is_late(arrived, timeout, margin, arrived + waited);
    assert_eq!(late(20 * MS, Duration::ZERO), None);
    assert_eq!(late(20 * MS, 4 * MS), None);
    assert_eq!(late(20 * MS, 5 * MS), Some(Late::Queue));
    assert_eq!(late(20 * MS, 14 * MS), Some(Late::Queue));
    assert_eq!(late(20 * MS, 15 * MS), Some(Late::Deadline));
    assert_eq!(late(20 * MS, 40 * MS), Some(Late::Deadline));
    // A timeout under two margins keeps half of it as budget.
    assert_eq!(late(8 * MS, MS), None);
    assert_eq!(late(8 * MS, 2 * MS), Some(Late::Queue));
    assert_eq!(late(8 * MS, 4 * MS), Some(Late::Deadline));
    // A long timeout: a quarter of a second waiting is shed.
    assert_eq!(late(1000 * MS, 249 * MS), None);
    assert_eq!(late(1000 * MS, 250 * MS), Some(Late::Queue));
    // A caller that allows nothing is late at once.
    assert_eq!(late(Duration::ZERO, Duration::ZERO), Some(Late::Deadline));
}

#[test]
fn the_policies_shed_answers() {
    assert_eq!(
        ShedAnswer::of(FailurePolicy::Allow),
        Some(ShedAnswer::Allow)
    );
    assert_eq!(ShedAnswer::of(FailurePolicy::Deny), Some(ShedAnswer::Deny));
    assert_eq!(ShedAnswer::of(FailurePolicy::Local), None);
}

/// The inner service: answers with `x-inner: <arrival seen>` so a test
/// can tell it was called, and with which stamp.
fn inner() -> impl Service<
    http::Request<()>,
    Response = http::Response<tonic::body::Body>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    tower::service_fn(|request: http::Request<()>| async move {
        let stamped = request.extensions().get::<Arrived>().is_some();
        let mut response = http::Response::new(tonic::body::Body::empty());
        let seen = HeaderValue::from_static(if stamped { "stamped" } else { "bare" });
        response.headers_mut().insert("x-inner", seen);
        Ok::<_, Infallible>(response)
    })
}

fn request(path: &str, timeout: Option<&'static str>) -> http::Request<()> {
    let mut request = http::Request::new(());
    *request.uri_mut() = path.parse().unwrap();
    if let Some(t) = timeout {
        request
            .headers_mut()
            .insert("grpc-timeout", HeaderValue::from_static(t));
    }
    request
}

/// Calls the layered service with `request`, lets `wait` pass (paused
/// time) before the answer is polled, as a queued task's would.
async fn answer(
    policy: FailurePolicy,
    request: http::Request<()>,
    wait: Duration,
) -> (http::Response<tonic::body::Body>, (u64, u64)) {
    let counted = counters();
    let mut service = ArrivalLayer::new(5 * MS, policy, counted.clone()).layer(inner());
    poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
    let pending = service.call(request);
    tokio::time::advance(wait).await;
    let response = pending.await.unwrap();
    (response, shed_counts(&counted))
}

/// As hyper's glue does: the stack cloned as the headers are read, the
/// clone called once the request's task runs, `wait` later.
async fn answer_cloned(
    policy: FailurePolicy,
    request: http::Request<()>,
    wait: Duration,
) -> (http::Response<tonic::body::Body>, (u64, u64)) {
    let counted = counters();
    let service = ArrivalLayer::new(5 * MS, policy, counted.clone()).layer(inner());
    let mut per_request = service.clone();
    tokio::time::advance(wait).await;
    poll_fn(|cx| per_request.poll_ready(cx)).await.unwrap();
    let response = per_request.call(request).await.unwrap();
    (response, shed_counts(&counted))
}

async fn frames(mut body: tonic::body::Body) -> (Vec<u8>, Option<HeaderMap>) {
    let (mut data, mut trailers) = (Vec::new(), None);
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.unwrap();
        if let Some(d) = frame.data_ref() {
            data.extend_from_slice(d);
        }
        if let Ok(t) = frame.into_trailers() {
            trailers = Some(t);
        }
    }
    (data, trailers)
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waited_past_its_budget_gets_the_policys_answer_at_once() {
    let late = request(SHOULD_RATE_LIMIT, Some("20m"));
    let (response, shed) = answer(FailurePolicy::Allow, late, 16 * MS).await;
    assert_eq!(shed, (0, 1));
    assert!(response.headers().get("x-inner").is_none());
    assert_eq!(response.headers()["content-type"], "application/grpc");
    let (data, trailers) = frames(response.into_body()).await;
    assert_eq!(data, [0, 0, 0, 0, 2, 0x08, 1]);
    assert_eq!(trailers.unwrap()["grpc-status"], "0");

    let late = request(SHOULD_RATE_LIMIT, Some("20m"));
    let (response, shed) = answer(FailurePolicy::Deny, late, 15 * MS).await;
    assert_eq!(shed, (0, 1));
    let (data, _) = frames(response.into_body()).await;
    assert_eq!(data, [0, 0, 0, 0, 2, 0x08, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waited_a_quarter_of_its_timeout_is_shed_for_its_wait() {
    let behind = request(SHOULD_RATE_LIMIT, Some("20m"));
    let (response, shed) = answer(FailurePolicy::Deny, behind, 5 * MS).await;
    assert_eq!(shed, (1, 0));
    assert!(response.headers().get("x-inner").is_none());
    let (data, _) = frames(response.into_body()).await;
    assert_eq!(data, [0, 0, 0, 0, 2, 0x08, 2]);
}

#[tokio::test(start_paused = true)]
async fn calls_in_time_without_a_deadline_or_under_local_are_decided() {
    let cases = [
        (FailurePolicy::Allow, SHOULD_RATE_LIMIT, Some("20m"), 4 * MS),
        (FailurePolicy::Allow, SHOULD_RATE_LIMIT, None, 10_000 * MS),
        (
            FailurePolicy::Local,
            SHOULD_RATE_LIMIT,
            Some("20m"),
            100 * MS,
        ),
        (
            FailurePolicy::Deny,
            "/grpc.health.v1.Health/Check",
            Some("20m"),
            100 * MS,
        ),
    ];
    for (policy, path, timeout, wait) in cases {
        let (response, shed) = answer(policy, request(path, timeout), wait).await;
        let what = format!("{policy:?} {path} {timeout:?} after {wait:?}");
        assert_eq!(shed, (0, 0), "{what}");
        // The inner service saw the arrival stamp.
        assert_eq!(response.headers()["x-inner"], "stamped", "{what}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_wait_counts_from_the_per_request_copy_not_from_the_call() {
    let late = request(SHOULD_RATE_LIMIT, Some("20m"));
    let (response, shed) = answer_cloned(FailurePolicy::Allow, late, 16 * MS).await;
    assert_eq!(shed, (0, 1));
    assert!(response.headers().get("x-inner").is_none());
    let in_time = request(SHOULD_RATE_LIMIT, Some("20m"));
    let (response, shed) = answer_cloned(FailurePolicy::Allow, in_time, 4 * MS).await;
    assert_eq!(shed, (0, 0));
    assert_eq!(response.headers()["x-inner"], "stamped");
}

#[tokio::test(start_paused = true)]
async fn a_copy_stamps_its_first_call_only() {
    let counted = counters();
    let layer = ArrivalLayer::new(5 * MS, FailurePolicy::Allow, counted.clone());
    let mut copy = layer.layer(inner()).clone();
    tokio::time::advance(16 * MS).await;
    copy.call(request(SHOULD_RATE_LIMIT, Some("20m")))
        .await
        .unwrap();
    assert_eq!(shed_counts(&counted), (0, 1));
    // A second call on the same copy counts from itself.
    tokio::time::advance(16 * MS).await;
    let response = copy
        .call(request(SHOULD_RATE_LIMIT, Some("20m")))
        .await
        .unwrap();
    assert_eq!(shed_counts(&counted), (0, 1));
    assert_eq!(response.headers()["x-inner"], "stamped");
}
