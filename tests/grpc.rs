//! The real binary, driven over gRPC with tonic's client, as Envoy drives it.

mod common;

use common::{desc, request, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;
use tonic::Code as GrpcCode;

const POLICY: &str = r#"
overrides:
  - label: counted
    domain: test
    operation: {key: counted}
    creditLimit: 3
    resetSeconds: 1h
  - label: per-user
    domain: test
    operation: {key: per-user, user: "*"}
    creditLimit: 2
    resetSeconds: 1h
    actorField: user
  - label: canary
    domain: test
    matchPolicy: canary
    operation: {key: canary}
    creditLimit: 1
    resetSeconds: 1h
  - label: canary-decider
    domain: test
    operation: {key: canary}
    creditLimit: 100
    resetSeconds: 1h
  - label: free
    domain: test
    operation: {key: free}
    creditLimit: 5
    resetSeconds: 0
  - label: blocked
    domain: test
    operation: {key: blocked}
    creditLimit: 0
  - label: addend
    domain: test
    operation: {key: addend}
    creditLimit: 10
    resetSeconds: 1h
  - label: odd-window
    domain: test
    operation: {key: odd}
    creditLimit: 4
    resetSeconds: 90s
  - label: short
    domain: test
    operation: {key: short}
    creditLimit: 1
    resetSeconds: 1
  - label: team
    domain: "team-*"
    operation: {key: counted}
    creditLimit: 1
    resetSeconds: 1h
default:
  label: fallback
  creditLimit: 2
  resetSeconds: 1h
"#;

/// Sends one descriptor with `entries` in domain `test`.
async fn ask_test(
    client: &mut RateLimitServiceClient<Channel>,
    entries: &[(&str, &str)],
) -> RateLimitResponse {
    common::ask(client, request("test", vec![desc(entries)])).await
}

fn codes(r: &RateLimitResponse) -> Vec<(i32, u32)> {
    r.statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn counts_to_the_limit_and_past_it() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        let r = ask_test(&mut client, &[("key", "counted")]).await;
        seen.push((r.overall_code, codes(&r)[0]));
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, Unit::Hour as i32)
        );
        assert_eq!(limit.name, "counted");
        let reset = s.duration_until_reset.as_ref().unwrap();
        assert!(reset.seconds > 3500 && reset.seconds <= 3600, "{reset:?}");
    }
    assert_eq!(
        seen,
        vec![
            (OK, (OK, 2)),
            (OK, (OK, 1)),
            (OK, (OK, 0)),
            (OVER, (OVER, 0)),
            (OVER, (OVER, 0)),
        ]
    );
}

#[tokio::test]
async fn per_actor_counters() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let hit = |user: &'static str| {
        let mut c = client.clone();
        async move {
            let r = ask_test(&mut c, &[("key", "per-user"), ("user", user)]).await;
            codes(&r)[0]
        }
    };
    assert_eq!(hit("alice").await, (OK, 1));
    assert_eq!(hit("alice").await, (OK, 0));
    assert_eq!(hit("alice").await, (OVER, 0));
    assert_eq!(hit("bob").await, (OK, 1));
    // Without the user entry, the per-user rule does not match: the default decides.
    let r = ask_test(&mut client, &[("key", "per-user")]).await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "fallback"
    );
}

#[tokio::test]
async fn canary_consumes_but_never_decides() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    for i in 0..3u32 {
        let r = ask_test(&mut client, &[("key", "canary")]).await;
        // The canary (1 per hour) is exhausted after the first hit, yet the
        // decider (100 per hour) keeps allowing and is the one reported.
        assert_eq!(codes(&r), vec![(OK, 99 - i)]);
        assert_eq!(
            r.statuses[0].current_limit.as_ref().unwrap().name,
            "canary-decider"
        );
    }
}

#[tokio::test]
async fn always_allow_and_always_deny() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    for _ in 0..10 {
        let r = ask_test(&mut client, &[("key", "free")]).await;
        assert_eq!(codes(&r), vec![(OK, 5)]);
        assert!(r.statuses[0].current_limit.is_none());
        assert!(r.statuses[0].duration_until_reset.is_none());
    }
    let r = ask_test(&mut client, &[("key", "blocked")]).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
}

#[tokio::test]
async fn hits_addend_request_and_descriptor_level() {
    let server = Server::with_policy(POLICY, "yaml");
    let client = server.client().await;
    let send = |addend: u32| {
        let mut c = client.clone();
        async move {
            let mut req = request("test", vec![desc(&[("key", "addend")])]);
            req.hits_addend = addend;
            codes(&common::ask(&mut c, req).await)[0]
        }
    };
    assert_eq!(send(3).await, (OK, 7));
    assert_eq!(send(7).await, (OK, 0));
    assert_eq!(send(1).await, (OVER, 0));

    // Per-descriptor addend overrides the request's; 0 checks without consuming.
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let mut d = desc(&[("key", "addend")]);
    d.hits_addend = Some(UInt64Value { value: 4 });
    let mut check = desc(&[("key", "addend")]);
    check.hits_addend = Some(UInt64Value { value: 0 });
    let mut req = request("test", vec![d.clone(), check.clone(), check.clone()]);
    req.hits_addend = 100;
    let r = common::ask(&mut client, req).await;
    assert_eq!(codes(&r), vec![(OK, 6), (OK, 6), (OK, 6)]);
    // A hit larger than what is left is denied and not charged.
    let mut big = desc(&[("key", "addend")]);
    big.hits_addend = Some(UInt64Value { value: 7 });
    let r = common::ask(&mut client, request("test", vec![big, d, check])).await;
    assert_eq!(codes(&r), vec![(OVER, 6), (OK, 2), (OK, 2)]);
    assert_eq!(r.overall_code, OVER);
}

#[tokio::test]
async fn several_descriptors_with_mixed_results() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let r = common::ask(
        &mut client,
        request(
            "test",
            vec![
                desc(&[("key", "free")]),
                desc(&[("key", "blocked")]),
                desc(&[("key", "counted")]),
                desc(&[("key", "counted")]),
            ],
        ),
    )
    .await;
    // In order, each decided and charged on its own.
    assert_eq!(codes(&r), vec![(OK, 5), (OVER, 0), (OK, 2), (OK, 1)]);
    assert_eq!(r.overall_code, OVER);
    let r = common::ask(
        &mut client,
        request(
            "test",
            vec![desc(&[("key", "counted")]), desc(&[("key", "counted")])],
        ),
    )
    .await;
    assert_eq!(codes(&r), vec![(OK, 0), (OVER, 0)]);
}

#[tokio::test]
async fn domains_select_rules_and_unknown_domains_fall_to_the_default() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let name = |r: &RateLimitResponse| r.statuses[0].current_limit.as_ref().unwrap().name.clone();
    // A domain glob.
    let r = common::ask(
        &mut client,
        request("team-blue", vec![desc(&[("key", "counted")])]),
    )
    .await;
    assert_eq!((name(&r), codes(&r)[0]), ("team".to_owned(), (OK, 0)));
    // An unknown domain: only domain-less rules apply, here the default (2 per hour).
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = common::ask(
            &mut client,
            request("nowhere", vec![desc(&[("key", "counted")])]),
        )
        .await;
        assert_eq!(name(&r), "fallback");
        seen.push(codes(&r)[0]);
    }
    assert_eq!(seen, vec![(OK, 1), (OK, 0), (OVER, 0)]);
}

#[tokio::test]
async fn odd_windows_and_overrides() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let r = ask_test(&mut client, &[("key", "odd")]).await;
    let limit = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!(limit.unit, Unit::Unknown as i32);
    assert_eq!(limit.name, "odd-window per 90s");
    assert!(r.statuses[0].duration_until_reset.unwrap().seconds <= 90);

    // A descriptor's limit override has its own counter.
    let mut d = desc(&[("key", "counted")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Minute as i32,
    });
    let r = common::ask(&mut client, request("test", vec![d.clone(), d.clone()])).await;
    assert_eq!(codes(&r), vec![(OK, 0), (OVER, 0)]);
    let limit = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Minute as i32)
    );
    let r = ask_test(&mut client, &[("key", "counted")]).await;
    assert_eq!(codes(&r), vec![(OK, 2)]);
    // An override with no unit is refused.
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Unknown as i32,
    });
    let err = client
        .should_rate_limit(request("test", vec![d]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
}

#[tokio::test]
async fn window_resets_after_reset_seconds() {
    let server = Server::with_policy(POLICY, "yaml");
    let client = server.client().await;
    let send = || {
        let mut c = client.clone();
        async move { codes(&ask_test(&mut c, &[("key", "short")]).await)[0] }
    };
    assert_eq!(send().await, (OK, 0));
    assert_eq!(send().await, (OVER, 0));
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    assert_eq!(send().await, (OK, 0));
}

#[tokio::test]
async fn invalid_arguments() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let cases = vec![
        (request("", vec![desc(&[("key", "counted")])]), "domain"),
        (request("test", vec![]), "descriptor"),
        (request("test", vec![desc(&[])]), "no entries"),
        (
            request(
                "test",
                vec![desc(&[("key", "counted")]), desc(&[("", "x")])],
            ),
            "empty key",
        ),
    ];
    for (req, needle) in cases {
        let err = client.should_rate_limit(req).await.unwrap_err();
        assert_eq!(err.code(), GrpcCode::InvalidArgument);
        assert!(err.message().contains(needle), "{:?}", err.message());
    }
    // Nothing was charged by the refused requests.
    let r = ask_test(&mut client, &[("key", "counted")]).await;
    assert_eq!(codes(&r), vec![(OK, 2)]);
}

#[tokio::test]
async fn health_service_reports_serving() {
    let server = Server::with_policy(POLICY, "yaml");
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let status = server.grpc_health(service).await;
        assert_eq!(status, 1, "service {service:?} is SERVING");
    }
}

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

#[tokio::test]
async fn rate_limit_headers_draft_and_legacy() {
    let server = Server::with_policy_args(POLICY, "yaml", &["--rate-limit-headers", "draft"]);
    let mut client = server.client().await;
    let odd = request(
        "test",
        vec![desc(&[("key", "odd")]), desc(&[("key", "free")])],
    );
    let r = common::ask(&mut client, odd.clone()).await;
    let h = headers(&r);
    assert_eq!(
        h[0],
        ("RateLimit-Policy".into(), "\"odd-window\";q=4;w=90".into())
    );
    assert_eq!(h[1].0, "RateLimit");
    assert!(h[1].1.starts_with("\"odd-window\";r=3;t="), "{h:?}");
    assert_eq!(h.len(), 2);
    for _ in 0..3 {
        client.should_rate_limit(odd.clone()).await.unwrap();
    }
    let r = common::ask(&mut client, odd).await;
    let h = headers(&r);
    assert!(h[1].1.starts_with("\"odd-window\";r=0;t="), "{h:?}");
    assert_eq!(h[2].0, "Retry-After");
    let wait: u64 = h[2].1.parse().unwrap();
    assert!((1..=90).contains(&wait), "{h:?}");

    let server = Server::with_policy_args(POLICY, "yaml", &["--rate-limit-headers", "legacy"]);
    let mut client = server.client().await;
    // The most restrictive descriptor decides the headers.
    let req = request(
        "test",
        vec![desc(&[("key", "addend")]), desc(&[("key", "counted")])],
    );
    let r = common::ask(&mut client, req).await;
    let h = headers(&r);
    assert_eq!(h[0], ("X-RateLimit-Limit".into(), "3".into()));
    assert_eq!(h[1], ("X-RateLimit-Remaining".into(), "2".into()));
    assert_eq!(h[2].0, "X-RateLimit-Reset");
    let reset: u64 = h[2].1.parse().unwrap();
    assert!((3590..=3600).contains(&reset));
    // Several denied descriptors: Retry-After is the longest wait.
    let both = request(
        "test",
        vec![desc(&[("key", "short")]), desc(&[("key", "counted")])],
    );
    client.should_rate_limit(both.clone()).await.unwrap();
    client.should_rate_limit(both.clone()).await.unwrap();
    let r = common::ask(&mut client, both).await;
    let h = headers(&r);
    let retry: u64 = h
        .iter()
        .find(|(k, _)| k == "Retry-After")
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!(retry > 3000, "{h:?}");
    // Without the flag, no headers.
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let r = ask_test(&mut client, &[("key", "counted")]).await;
    assert!(r.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn negative_hits_give_credit_back_up_to_the_limit() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    let with = |addend: u64, negative: bool| {
        let mut d = desc(&[("key", "addend")]);
        d.hits_addend = Some(UInt64Value { value: addend });
        d.is_negative_hits = negative;
        request("test", vec![d])
    };
    // No open window: a refund changes nothing and opens nothing.
    let r = common::ask(&mut client, with(5, true)).await;
    assert_eq!(codes(&r), vec![(OK, 10)]);
    let r = common::ask(&mut client, with(7, false)).await;
    assert_eq!(codes(&r), vec![(OK, 3)]);
    let r = common::ask(&mut client, with(4, true)).await;
    assert_eq!(codes(&r), vec![(OK, 7)]);
    let r = common::ask(&mut client, with(100, true)).await;
    assert_eq!(codes(&r), vec![(OK, 10)]);
    let r = common::ask(&mut client, with(10, false)).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
}

/// With one worker thread divvy runs on the single-threaded scheduler, with
/// more on the multi-threaded one; either way concurrent calls on several
/// connections, and the line protocol beside them, are counted exactly.
#[tokio::test]
async fn serves_on_one_worker_thread_or_several() {
    for (threads, scheduler) in [("1", "single-threaded"), ("3", "multi-threaded")] {
        let server = Server::with_policy_args(POLICY, "yaml", &["--worker-threads", threads]);
        let said = server
            .startup
            .iter()
            .find(|l| l.contains("async runtime"))
            .unwrap_or_else(|| panic!("no runtime line in {:?}", server.startup));
        assert!(
            said.contains(&format!("worker_threads={threads} ")) && said.contains(scheduler),
            "{said}"
        );
        // 24 calls at once over 4 connections against a limit of 3.
        let mut calls = Vec::new();
        for _ in 0..4 {
            let client = server.client().await;
            for _ in 0..6 {
                let mut client = client.clone();
                calls.push(tokio::spawn(async move {
                    ask_test(&mut client, &[("key", "counted")])
                        .await
                        .overall_code
                }));
            }
        }
        let mut allowed = 0;
        for call in calls {
            let code = call.await.unwrap();
            if code == OK {
                allowed += 1;
            } else {
                assert_eq!(code, OVER);
            }
        }
        assert_eq!(allowed, 3, "with {threads} worker thread(s)");
        // The line protocol is served beside it (divvy's default rule).
        let answer = server.line_exchange(b"HIT\nHIT\n");
        assert_eq!(answer.lines().count(), 2, "{answer:?}");
        assert!(answer.starts_with("OK "), "{answer:?}");
    }
}

#[test]
fn a_worker_thread_count_out_of_range_is_refused() {
    for bad in ["0", "1025", "many", ""] {
        let by_flag = std::process::Command::new(common::binary())
            .args([
                "serve",
                "--config",
                "/nonexistent.yaml",
                "--worker-threads",
                bad,
            ])
            .output()
            .unwrap();
        let by_env = std::process::Command::new(common::binary())
            .args(["serve", "--config", "/nonexistent.yaml"])
            .env("DIVVY_WORKER_THREADS", bad)
            .output()
            .unwrap();
        for out in [by_flag, by_env] {
            assert!(!out.status.success());
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("not a thread count from 1 to 1024"),
                "{bad:?}: {err}"
            );
        }
    }
}
