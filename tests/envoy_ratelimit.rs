//! divvy as a drop-in for envoyproxy/ratelimit: the real binary serving
//! that project's config files as they are (issue "Drop-in for
//! envoyproxy/ratelimit"), driven over gRPC and through a real Envoy.
//!
//! Config files live in `tests/envoy_ratelimit/`: `example/example.yaml`
//! (envoyproxy/ratelimit's `examples/ratelimit/config/example.yaml`,
//! verbatim), `own/` (divvy's own: `matching.yaml`, `units.yml`), `mixed/`
//! (their `examples/ratelimit/config/config.yaml` next to a divvy policy),
//! `bad/`, `bad_set/`, `duplicate_domain/` (their `test/config` bad files,
//! verbatim, plus two of ours). The real-Envoy tests use
//! `examples/envoyproxy-ratelimit/` (their `examples/envoy/proxy.yaml`
//! pointed at divvy, and their `examples/ratelimit/config` directory).
//!
//! What is tested, with exact statuses (code, current_limit requests_per_unit
//! / unit / name, limit_remaining; duration_until_reset equal to
//! `unit - now % unit` whenever a limit applies, absent otherwise):
//! 1. The example config (domain `rl`): their `replaces.sh` sequence, replaces
//!    across descriptors and in either order (replaced limits not charged),
//!    quota mode (`service_1` / `service_2`, mixed with non-quota and
//!    unlimited descriptors), `foo`/`bar` (`banned` with rpu 0, `bkthomps`),
//!    shadow `baz=shady` never over, `bay` and `qux` unlimited, `unspec`
//!    (detailed metric), `baz` per second, request-level `hits_addend`,
//!    requests deeper than the tree or matching nothing; `divvy check` counts
//!    its 17 limits.
//! 2. Own configs: nested keys, whitelisting (value node without limit),
//!    depth (deeper request, walk stopping early), wildcards (`foo*`,
//!    `bar*b`, `foo*bar*baz`, exact value first, file order, nested, no
//!    backtracking), `share_threshold` (one counter for the pattern, at the
//!    limit's level and above it) against a plain wildcard (a counter per
//!    value), every unit second..year (any case, `.yml` file), names,
//!    requests_per_unit 0, unlimited, descriptor limit overrides.
//! 3. Environment settings: `SHADOW_MODE`, `LIMIT_RESPONSE_HEADERS_ENABLED`
//!    (default and custom header names), `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`
//!    (against the default), `RESPONSE_DYNAMIC_METADATA` (the quota example;
//!    overlapping metadata keeps the first value; descriptor `hitsAddend`),
//!    `NEAR_LIMIT_RATIO`; a descriptor `hits_addend` of 0 checking a counter
//!    exactly at its limit (their `/tokenquota` flow).
//! 4. A domain no file defines: a divvy policy in the directory decides it;
//!    without one, the no-limit shape; a file's domain ignores the policy.
//! 5. `divvy check` rejects each config error class naming the file; a
//!    directory with one bad file, or two files with one domain, is rejected
//!    whole, and `divvy serve` on it exits non-zero.
//! 6. Hot reload of the directory under continuous gRPC load: a file dropped
//!    in, changed, a bad file (the set in force stays), the file removed;
//!    zero failed calls; dotfiles and non-YAML files ignored.
//! 7. A real Envoy with their route actions: their integration scripts
//!    (simple-get, trigger-ratelimit, shadow mode, detailed metric, quota,
//!    replaces) as 200s and 429s, `x-ratelimit-*` headers; their
//!    `/tokenquota` and `/multiservice-tokenquota` routes.
//! 8. `/healthcheck`, `/rlconfig`, and `divvy_ratelimit_stats_total`
//!    (total_hits, over_limit, near_limit, within_limit, shadow_mode).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::envoy::{self, get, header, upstream, Envoy};
use common::{desc, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value::Kind, UInt64Value, Value};
use tonic::transport::Channel;

use Unit::{Day, Hour, Minute, Month, Second, Week, Year};

// ---------------------------------------------------------------------------
// Paths, time, descriptors.

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A directory or file under `tests/envoy_ratelimit/`.
fn data(rel: &str) -> PathBuf {
    root().join("tests/envoy_ratelimit").join(rel)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// How long to wait until at least `need` seconds are left in the current
/// epoch-aligned window of `unit` seconds (a window of minute or longer
/// ends at a minute boundary, so `unit` 60 covers them all).
fn room_wait(unit: u64, need: f64) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let left = unit as f64 - now % unit as f64;
    if left < need {
        Duration::from_secs_f64(left + 0.05)
    } else {
        Duration::ZERO
    }
}

/// Sleeps as [`room_wait`] says.
async fn leave_room(unit: u64, need: f64) {
    tokio::time::sleep(room_wait(unit, need)).await;
}

/// Sleeps until just after the next whole second.
async fn next_second() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = 1.0 - f64::from(now.subsec_nanos()) / 1e9;
    tokio::time::sleep(Duration::from_secs_f64(left + 0.02)).await;
}

/// A descriptor from entries, in order.
fn d(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    desc(entries)
}

/// A descriptor with a `limit` override.
fn d_override(entries: &[(&str, &str)], rpu: u32, unit: RateLimitUnit) -> RateLimitDescriptor {
    let mut x = desc(entries);
    x.limit = Some(RateLimitOverride {
        requests_per_unit: rpu,
        unit: unit as i32,
    });
    x
}

/// A descriptor with its own `hits_addend`.
fn d_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    let mut x = desc(entries);
    x.hits_addend = Some(UInt64Value { value: hits });
    x
}

fn unit_seconds(u: Unit) -> u64 {
    match u {
        Second => 1,
        Minute => 60,
        Hour => 3600,
        Day => 86_400,
        Week => 7 * 86_400,
        Month => 30 * 86_400,
        Year => 365 * 86_400,
        Unit::Unknown => panic!("a limit with unit UNKNOWN"),
    }
}

// ---------------------------------------------------------------------------
// Expected statuses.

/// An expected descriptor status.
#[derive(Debug, Clone, Copy, PartialEq)]
struct W {
    code: Code,
    /// requests_per_unit, unit, name.
    limit: Option<(u32, Unit, &'static str)>,
    remaining: u32,
}

/// No limit applies: OK, no current_limit, remaining 0, no reset.
const NO_LIMIT: W = W {
    code: Code::Ok,
    limit: None,
    remaining: 0,
};

/// An unlimited limit: OK, no current_limit, remaining u32::MAX, no reset.
const UNLIMITED: W = W {
    code: Code::Ok,
    limit: None,
    remaining: u32::MAX,
};

fn ok(rpu: u32, unit: Unit, name: &'static str, remaining: u32) -> W {
    W {
        code: Code::Ok,
        limit: Some((rpu, unit, name)),
        remaining,
    }
}

fn over(rpu: u32, unit: Unit, name: &'static str) -> W {
    W {
        code: Code::OverLimit,
        limit: Some((rpu, unit, name)),
        remaining: 0,
    }
}

const OK: Code = Code::Ok;
const OVER: Code = Code::OverLimit;

fn code_of(c: i32) -> Code {
    Code::try_from(c).unwrap_or_else(|_| panic!("unknown code {c}"))
}

/// A status, readable.
fn show_status(s: &DescriptorStatus) -> String {
    let limit = s.current_limit.as_ref().map(|l| {
        format!(
            "{}/{:?} {:?}",
            l.requests_per_unit,
            Unit::try_from(l.unit).unwrap_or(Unit::Unknown),
            l.name
        )
    });
    format!(
        "{:?} limit={limit:?} remaining={} reset={:?}",
        code_of(s.code),
        s.limit_remaining,
        s.duration_until_reset.as_ref().map(|d| d.seconds)
    )
}

fn show_request(domain: &str, descriptors: &[RateLimitDescriptor]) -> String {
    let ds: Vec<String> = descriptors
        .iter()
        .map(|x| {
            let e: Vec<String> = x
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            let extra = match (&x.limit, &x.hits_addend) {
                (Some(l), _) => format!(" (override {} unit {})", l.requests_per_unit, l.unit),
                (None, Some(h)) => format!(" (hits_addend {})", h.value),
                _ => String::new(),
            };
            format!("[{}]{extra}", e.join(", "))
        })
        .collect();
    format!("{domain}: {}", ds.join(" "))
}

/// Whether `s` is `w`.
fn matches(s: &DescriptorStatus, w: &W) -> bool {
    let limit = s.current_limit.as_ref().map(|l| {
        (
            l.requests_per_unit,
            Unit::try_from(l.unit).unwrap_or(Unit::Unknown),
            l.name.as_str(),
        )
    });
    code_of(s.code) == w.code
        && limit == w.limit
        && s.limit_remaining == w.remaining
        && s.duration_until_reset.is_some() == w.limit.is_some()
        && s.quota.is_none()
}

/// Checks every status's duration_until_reset against the epoch-aligned
/// window of its unit, between `t0` and `t1` (seconds).
fn check_resets(resp: &RateLimitResponse, t0: u64, t1: u64, what: &str) {
    for s in &resp.statuses {
        let (Some(l), Some(d)) = (&s.current_limit, &s.duration_until_reset) else {
            continue;
        };
        let u = unit_seconds(Unit::try_from(l.unit).unwrap_or(Unit::Unknown));
        assert_eq!(d.nanos, 0, "{what}: whole seconds: {}", show_status(s));
        let secs = u64::try_from(d.seconds).expect("non-negative reset");
        let fits = if t1 - t0 <= 1 {
            secs == u - t0 % u || secs == u - t1 % u
        } else {
            (1..=u).contains(&secs)
        };
        assert!(
            fits,
            "{what}: duration_until_reset {secs}s is not {u} - now % {u} (now {t0}..{t1}): {}",
            show_status(s)
        );
    }
}

/// A gRPC client of one server.
struct Rl {
    client: RateLimitServiceClient<Channel>,
}

impl Rl {
    async fn new(server: &Server) -> Rl {
        Rl {
            client: server.client().await,
        }
    }

    /// One ShouldRateLimit, any answer shape.
    async fn raw(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(req)
            .await
            .expect("ShouldRateLimit")
            .into_inner()
    }

    /// A request of a domain an envoyproxy/ratelimit file defines (or none
    /// does): resets are checked against the epoch-aligned windows.
    async fn ask_req(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        let what = show_request(&req.domain, &req.descriptors);
        let t0 = now_secs();
        let resp = self.raw(req).await;
        let t1 = now_secs();
        check_resets(&resp, t0, t1, &what);
        resp
    }

    async fn ask(&mut self, domain: &str, ds: Vec<RateLimitDescriptor>) -> RateLimitResponse {
        self.ask_req(common::request(domain, ds)).await
    }

    /// Asks and asserts the overall code and every status.
    async fn expect(
        &mut self,
        domain: &str,
        ds: Vec<RateLimitDescriptor>,
        overall: Code,
        want: &[W],
    ) -> RateLimitResponse {
        let req = common::request(domain, ds);
        self.expect_req(req, overall, want).await
    }

    async fn expect_req(
        &mut self,
        req: RateLimitRequest,
        overall: Code,
        want: &[W],
    ) -> RateLimitResponse {
        let what = show_request(&req.domain, &req.descriptors);
        let resp = self.ask_req(req).await;
        let got: Vec<String> = resp.statuses.iter().map(show_status).collect();
        let all = resp.statuses.len() == want.len()
            && resp.statuses.iter().zip(want).all(|(s, w)| matches(s, w));
        assert!(
            code_of(resp.overall_code) == overall && all,
            "{what}\n  expected overall {overall:?}, statuses {want:?}\n  got overall {:?}, statuses {got:#?}",
            code_of(resp.overall_code)
        );
        resp
    }
}

// ---------------------------------------------------------------------------
// 1. The example config (domain rl).

fn example() -> Server {
    Server::start(&data("example"), &[])
}

/// `/twoheader` with only foo and bar: one descriptor.
fn two(f: &str, b: &str) -> Vec<RateLimitDescriptor> {
    vec![d(&[("foo", f), ("bar", b)])]
}

/// `/fourheader`: (foo, bar), (source_cluster, destination_cluster).
fn four(f: &str, b: &str, src: &str, dst: &str) -> Vec<RateLimitDescriptor> {
    vec![
        d(&[("foo", f), ("bar", b)]),
        d(&[("source_cluster", src), ("destination_cluster", dst)]),
    ]
}

/// `/fiveheader`: `four` and (category: account).
fn five(f: &str, b: &str, src: &str, dst: &str) -> Vec<RateLimitDescriptor> {
    let mut v = four(f, b, src, dst);
    v.push(d(&[("category", "account")]));
    v
}

#[test]
fn example_config_is_theirs_and_check_counts_its_limits() {
    let theirs = std::fs::read(data("example/example.yaml")).unwrap();
    let for_envoy =
        std::fs::read(root().join("examples/envoyproxy-ratelimit/config/example.yaml")).unwrap();
    assert_eq!(theirs, for_envoy, "the two copies of example.yaml differ");
    let out = Command::new(common::binary())
        .arg("check")
        .arg(data("example"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    common::assert_has(
        &stdout,
        &[&format!(
            "envoyproxy/ratelimit domain rl ({}): 17 limits",
            data("example").join("example.yaml").display()
        )],
    );
    // Their examples/ratelimit/config directory: two files, two domains.
    let out = Command::new(common::binary())
        .arg("check")
        .arg(root().join("examples/envoyproxy-ratelimit/config"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    common::assert_has(
        &stdout,
        &[
            "domain mongo_cps (",
            "config.yaml): 2 limits",
            "domain rl (",
        ],
    );
}

/// Their integration-test/scripts/replaces.sh, descriptor by descriptor.
#[tokio::test]
async fn example_replaces_as_their_replaces_script() {
    let server = example();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    replaces_increases_the_limit(&mut rl).await;
    replaces_leaves_the_original_limit(&mut rl).await;
    one_limit_replaces_several(&mut rl).await;
}

/// replaces increases the limit: (foo, bar=banned) is banned (rpu 0)
/// unless (proxy, override) replaces banned_limit.
async fn replaces_increases_the_limit(rl: &mut Rl) {
    const M: Unit = Minute;
    rl.expect(
        "rl",
        two("bkthomps", "banned"),
        OVER,
        &[over(0, M, "banned_limit")],
    )
    .await;
    rl.expect(
        "rl",
        four("bkthomps", "banned", "proxy", "mock"),
        OVER,
        &[over(0, M, "banned_limit"), ok(1, M, "", 0)],
    )
    .await;
    for remaining in [1, 0] {
        rl.expect(
            "rl",
            four("bkthomps", "banned", "proxy", "override"),
            OK,
            &[NO_LIMIT, ok(2, M, "", remaining)],
        )
        .await;
    }
    rl.expect(
        "rl",
        four("bkthomps", "banned", "proxy", "override"),
        OVER,
        &[NO_LIMIT, over(2, M, "")],
    )
    .await;
}

/// replaces does not touch the original limit: bkthomps (1/min) is
/// dropped while (proxy, bkthomps) replaces it, and not charged.
async fn replaces_leaves_the_original_limit(rl: &mut Rl) {
    const M: Unit = Minute;
    for remaining in [1, 0] {
        rl.expect(
            "rl",
            four("my_foo", "bkthomps", "proxy", "bkthomps"),
            OK,
            &[NO_LIMIT, ok(2, M, "", remaining)],
        )
        .await;
    }
    rl.expect(
        "rl",
        four("my_foo", "bkthomps", "proxy", "bkthomps"),
        OVER,
        &[NO_LIMIT, over(2, M, "")],
    )
    .await;
    rl.expect(
        "rl",
        four("my_foo", "bkthomps", "proxy", "not_bkthomps"),
        OK,
        &[ok(1, M, "bkthomps", 0), NO_LIMIT],
    )
    .await;
    rl.expect(
        "rl",
        four("my_foo", "bkthomps", "proxy", "not_bkthomps"),
        OVER,
        &[over(1, M, "bkthomps"), NO_LIMIT],
    )
    .await;
    rl.expect(
        "rl",
        four("my_foo", "bkthomps", "proxy", "bkthomps"),
        OVER,
        &[NO_LIMIT, over(2, M, "")],
    )
    .await;
}

/// One limit replaces several: category=account replaces bkthomps and
/// fake_name, whose counter is fresh afterwards.
async fn one_limit_replaces_several(rl: &mut Rl) {
    const M: Unit = Minute;
    for remaining in [3, 2, 1, 0] {
        rl.expect(
            "rl",
            five("my_foo", "bkthomps", "proxy", "fake"),
            OK,
            &[NO_LIMIT, NO_LIMIT, ok(4, M, "", remaining)],
        )
        .await;
    }
    rl.expect(
        "rl",
        five("my_foo", "bkthomps", "proxy", "fake"),
        OVER,
        &[NO_LIMIT, NO_LIMIT, over(4, M, "")],
    )
    .await;
    rl.expect(
        "rl",
        two("foo_2", "bkthomps"),
        OK,
        &[ok(1, M, "bkthomps", 0)],
    )
    .await;
    rl.expect(
        "rl",
        two("foo_2", "bkthomps"),
        OVER,
        &[over(1, M, "bkthomps")],
    )
    .await;
    // fake_name was replaced above, so its counter is fresh.
    rl.expect(
        "rl",
        four("foo_3", "bar_3", "proxy", "fake"),
        OK,
        &[ok(3, M, "", 2), ok(2, M, "fake_name", 1)],
    )
    .await;
    rl.expect(
        "rl",
        four("foo_3", "bar_3", "proxy", "fake"),
        OK,
        &[ok(3, M, "", 1), ok(2, M, "fake_name", 0)],
    )
    .await;
    rl.expect(
        "rl",
        four("foo_3", "bar_3", "proxy", "fake"),
        OVER,
        &[ok(3, M, "", 0), over(2, M, "fake_name")],
    )
    .await;
    rl.expect(
        "rl",
        five("my_foo", "bkthomps", "proxy", "fake"),
        OVER,
        &[NO_LIMIT, NO_LIMIT, over(4, M, "")],
    )
    .await;
}

/// replaces drops only the limits it names, in whichever order the
/// descriptors come, and a dropped limit is not charged.
#[tokio::test]
async fn example_replaces_drops_only_named_limits_in_any_order() {
    let server = example();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    const M: Unit = Minute;
    // (proxy, bkthomps) has no name: category=account does not replace it.
    rl.expect(
        "rl",
        vec![
            d(&[("category", "account")]),
            d(&[
                ("source_cluster", "proxy"),
                ("destination_cluster", "bkthomps"),
            ]),
        ],
        OK,
        &[ok(4, M, "", 3), ok(2, M, "", 1)],
    )
    .await;
    // The replacing descriptor after the replaced one.
    rl.expect(
        "rl",
        vec![
            d(&[("foo", "x"), ("bar", "bkthomps")]),
            d(&[("category", "account")]),
        ],
        OK,
        &[NO_LIMIT, ok(4, M, "", 2)],
    )
    .await;
    rl.expect(
        "rl",
        vec![
            d(&[("foo", "x"), ("bar", "bkthomps")]),
            d(&[("source_cluster", "proxy"), ("destination_cluster", "fake")]),
            d(&[("category", "account")]),
        ],
        OK,
        &[NO_LIMIT, NO_LIMIT, ok(4, M, "", 1)],
    )
    .await;
    // Neither bkthomps nor fake_name was charged while replaced.
    rl.expect("rl", two("x", "bkthomps"), OK, &[ok(1, M, "bkthomps", 0)])
        .await;
    rl.expect(
        "rl",
        vec![d(&[
            ("source_cluster", "proxy"),
            ("destination_cluster", "fake"),
        ])],
        OK,
        &[ok(2, M, "fake_name", 1)],
    )
    .await;
    // The replacing descriptor before the replaced one.
    rl.expect(
        "rl",
        vec![
            d(&[
                ("source_cluster", "proxy"),
                ("destination_cluster", "override"),
            ]),
            d(&[("foo", "x"), ("bar", "banned")]),
        ],
        OK,
        &[ok(2, M, "", 1), NO_LIMIT],
    )
    .await;
    // Alone, banned is banned again.
    rl.expect(
        "rl",
        two("x", "banned"),
        OVER,
        &[over(0, M, "banned_limit")],
    )
    .await;
    // Banned for every foo value.
    rl.expect(
        "rl",
        two("y", "banned"),
        OVER,
        &[over(0, M, "banned_limit")],
    )
    .await;
}

/// quota_mode: the request is over only when every quota descriptor is
/// (their quota.sh), or when any non-quota descriptor is.
#[tokio::test]
async fn example_quota_mode() {
    let server = example();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    const M: Unit = Minute;
    let s1 = || d(&[("service", "service_1")]);
    let s2 = || d(&[("service", "service_2")]);
    // A quota descriptor within its quota and a non-quota one over: over.
    rl.expect(
        "rl",
        vec![s2(), d(&[("foo", "q"), ("bar", "banned")])],
        OVER,
        &[ok(2, M, "", 1), over(0, M, "banned_limit")],
    )
    .await;
    rl.expect(
        "rl",
        vec![s1(), s2()],
        OK,
        &[ok(1, M, "", 0), ok(2, M, "", 0)],
    )
    .await;
    rl.expect(
        "rl",
        vec![s1(), d(&[("foo", "q"), ("bar", "x")])],
        OVER,
        &[over(1, M, ""), ok(3, M, "", 2)],
    )
    .await;
    // One quota descriptor over, another within: OK.
    let server2 = example();
    let mut rl2 = Rl::new(&server2).await;
    rl2.expect(
        "rl",
        vec![s1(), s2()],
        OK,
        &[ok(1, M, "", 0), ok(2, M, "", 1)],
    )
    .await;
    rl2.expect(
        "rl",
        vec![s1(), s2()],
        OK,
        &[over(1, M, ""), ok(2, M, "", 0)],
    )
    .await;
    rl2.expect(
        "rl",
        vec![s1(), s2()],
        OVER,
        &[over(1, M, ""), over(2, M, "")],
    )
    .await;
    // The only quota descriptor over: over.
    rl2.expect("rl", vec![s1()], OVER, &[over(1, M, "")]).await;
    // Unlimited descriptors do not count as quota descriptors within quota.
    rl2.expect(
        "rl",
        vec![s1(), d(&[("qux", "x")])],
        OVER,
        &[over(1, M, ""), UNLIMITED],
    )
    .await;
    // An unknown service matches nothing.
    rl2.expect("rl", vec![d(&[("service", "service_3")])], OK, &[NO_LIMIT])
        .await;
}

/// foo/bar/baz/bay, qux, unspec, and requests the tree does not hold.
#[tokio::test]
async fn example_single_descriptors_shadow_unlimited_and_depth() {
    let server = example();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    foo_and_bar(&mut rl).await;
    shadow_and_unlimited(&mut rl).await;
    unspec_and_what_the_tree_lacks(&mut rl).await;
    several_descriptors_hits_addend_and_per_second(&mut rl).await;
}

/// foo alone, foo with any bar, bar=banned and bar=bkthomps.
async fn foo_and_bar(rl: &mut Rl) {
    const M: Unit = Minute;
    // foo alone: 2/min.
    rl.expect("rl", vec![d(&[("foo", "a")])], OK, &[ok(2, M, "", 1)])
        .await;
    rl.expect("rl", vec![d(&[("foo", "a")])], OK, &[ok(2, M, "", 0)])
        .await;
    rl.expect("rl", vec![d(&[("foo", "a")])], OVER, &[over(2, M, "")])
        .await;
    // foo + any bar: 3/min, its own counter.
    for remaining in [2, 1, 0] {
        rl.expect("rl", two("a", "x"), OK, &[ok(3, M, "", remaining)])
            .await;
    }
    rl.expect("rl", two("a", "x"), OVER, &[over(3, M, "")])
        .await;
    // bar=banned: requests_per_unit 0, always over.
    for _ in 0..2 {
        rl.expect(
            "rl",
            two("a", "banned"),
            OVER,
            &[over(0, M, "banned_limit")],
        )
        .await;
    }
    // bar=bkthomps: named, 1/min, a counter per foo value.
    rl.expect("rl", two("a", "bkthomps"), OK, &[ok(1, M, "bkthomps", 0)])
        .await;
    rl.expect("rl", two("a", "bkthomps"), OVER, &[over(1, M, "bkthomps")])
        .await;
    rl.expect("rl", two("b", "bkthomps"), OK, &[ok(1, M, "bkthomps", 0)])
        .await;
}

/// baz=shady (shadow mode), baz=not-so-shady, and the unlimited bay and
/// qux.
async fn shadow_and_unlimited(rl: &mut Rl) {
    const M: Unit = Minute;
    // baz=shady: shadow mode, counted but never over (their
    // trigger-shadow-mode-key.sh).
    let shady = || vec![d(&[("foo", "pelle"), ("baz", "shady")])];
    for remaining in [2, 1, 0, 0, 0] {
        rl.expect("rl", shady(), OK, &[ok(3, M, "", remaining)])
            .await;
    }
    // baz=not-so-shady: 3/min (their trigger-ratelimit.sh).
    let not_shady = || vec![d(&[("foo", "pelle"), ("baz", "not-so-shady")])];
    for remaining in [2, 1, 0] {
        rl.expect("rl", not_shady(), OK, &[ok(3, M, "", remaining)])
            .await;
    }
    rl.expect("rl", not_shady(), OVER, &[over(3, M, "")]).await;
    // bay: unlimited; qux: unlimited.
    for _ in 0..3 {
        rl.expect(
            "rl",
            vec![d(&[("foo", "a"), ("bay", "x")])],
            OK,
            &[UNLIMITED],
        )
        .await;
        rl.expect("rl", vec![d(&[("qux", "anything")])], OK, &[UNLIMITED])
            .await;
    }
}

/// unspec (a counter per value), and descriptors the tree does not hold.
async fn unspec_and_what_the_tree_lacks(rl: &mut Rl) {
    const M: Unit = Minute;
    // unspec: 2/min per value (their
    // value-included-in-stats-key-when-unspecified.sh).
    let unspec = |v: &str| vec![d(&[("unspec", v)])];
    rl.expect("rl", unspec("unspecified_value"), OK, &[ok(2, M, "", 1)])
        .await;
    rl.expect("rl", unspec("unspecified_value"), OK, &[ok(2, M, "", 0)])
        .await;
    rl.expect("rl", unspec("unspecified_value"), OVER, &[over(2, M, "")])
        .await;
    rl.expect("rl", unspec("other"), OK, &[ok(2, M, "", 1)])
        .await;
    // What the tree does not hold: no limit.
    for ds in [
        vec![d(&[("foo", "a"), ("bar", "x"), ("extra", "1")])],
        vec![d(&[("foo", "a"), ("nope", "1")])],
        vec![d(&[("foo", "a"), ("bar", "bkthomps"), ("baz", "z")])],
        vec![d(&[("nope", "1")])],
        vec![d(&[("bar", "x")])],
        vec![d(&[("source_cluster", "proxy")])],
        vec![d(&[("destination_cluster", "mock")])],
        vec![d(&[
            ("source_cluster", "other"),
            ("destination_cluster", "mock"),
        ])],
        vec![d(&[("category", "other")])],
    ] {
        rl.expect("rl", ds, OK, &[NO_LIMIT]).await;
    }
}

/// Several descriptors in one request, a request-level hits_addend, and
/// baz's 1 per second.
async fn several_descriptors_hits_addend_and_per_second(rl: &mut Rl) {
    const M: Unit = Minute;
    // Several descriptors at once, each with its own answer.
    let resp = rl
        .expect(
            "rl",
            vec![
                d(&[("foo", "c")]),
                d(&[("qux", "y")]),
                d(&[("nope", "z")]),
                d(&[("foo", "c"), ("bar", "banned")]),
            ],
            OVER,
            &[
                ok(2, M, "", 1),
                UNLIMITED,
                NO_LIMIT,
                over(0, M, "banned_limit"),
            ],
        )
        .await;
    // Without the settings: no headers, no dynamic metadata.
    assert!(resp.response_headers_to_add.is_empty(), "{resp:?}");
    assert!(resp.dynamic_metadata.is_none(), "{resp:?}");
    // Request-level hits_addend: 2 hits at once.
    let mut req = common::request("rl", vec![d(&[("foo", "h")])]);
    req.hits_addend = 2;
    rl.expect_req(req.clone(), OK, &[ok(2, M, "", 0)]).await;
    req.hits_addend = 1;
    rl.expect_req(req, OVER, &[over(2, M, "")]).await;
    // baz (any other value): 1 per second.
    next_second().await;
    let other_baz = || vec![d(&[("foo", "a"), ("baz", "other")])];
    rl.expect("rl", other_baz(), OK, &[ok(1, Second, "", 0)])
        .await;
    rl.expect("rl", other_baz(), OVER, &[over(1, Second, "")])
        .await;
    next_second().await;
    rl.expect("rl", other_baz(), OK, &[ok(1, Second, "", 0)])
        .await;
}

// ---------------------------------------------------------------------------
// 2. Own configs.

fn own() -> Server {
    Server::start(&data("own"), &[])
}

#[test]
fn own_configs_pass_check() {
    let out = Command::new(common::binary())
        .arg("check")
        .arg(data("own"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    common::assert_has(
        &stdout,
        &[
            &format!(
                "envoyproxy/ratelimit domain match ({}): 18 limits",
                data("own").join("matching.yaml").display()
            ),
            &format!(
                "envoyproxy/ratelimit domain units ({}): 7 limits",
                data("own").join("units.yml").display()
            ),
            "no divvy policy: domains no file defines get no limit",
        ],
    );
}

#[tokio::test]
async fn own_nested_keys_whitelisting_and_depth() {
    let server = own();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    const H: Unit = Hour;
    let m = "match";
    rl.expect(
        m,
        vec![d(&[("tenant", "t1")])],
        OK,
        &[ok(5, H, "per-tenant", 4)],
    )
    .await;
    let login = |t: &str| vec![d(&[("tenant", t), ("path", "/login")])];
    rl.expect(m, login("t1"), OK, &[ok(2, H, "login", 1)]).await;
    rl.expect(m, login("t1"), OK, &[ok(2, H, "login", 0)]).await;
    rl.expect(m, login("t1"), OVER, &[over(2, H, "login")])
        .await;
    // A counter per tenant value.
    rl.expect(m, login("t2"), OK, &[ok(2, H, "login", 1)]).await;
    // Whitelisted value under a limited key.
    for _ in 0..3 {
        rl.expect(
            m,
            vec![d(&[("tenant", "t1"), ("path", "/health")])],
            OK,
            &[NO_LIMIT],
        )
        .await;
    }
    // The key-only path: a counter per path value.
    rl.expect(
        m,
        vec![d(&[("tenant", "t1"), ("path", "/x")])],
        OK,
        &[ok(3, H, "", 2)],
    )
    .await;
    rl.expect(
        m,
        vec![d(&[("tenant", "t1"), ("path", "/y")])],
        OK,
        &[ok(3, H, "", 2)],
    )
    .await;
    // Third level.
    let post = || vec![d(&[("tenant", "t1"), ("path", "/x"), ("method", "POST")])];
    rl.expect(m, post(), OK, &[ok(1, H, "post", 0)]).await;
    rl.expect(m, post(), OVER, &[over(1, H, "post")]).await;
    // Depth: an unknown third-level value, a request deeper than the
    // tree, a walk stopping at an unknown key, a whitelisted value whose
    // walk stops at once, a second-level key asked at the top.
    for ds in [
        vec![d(&[("tenant", "t1"), ("path", "/x"), ("method", "GET")])],
        vec![d(&[
            ("tenant", "t1"),
            ("path", "/x"),
            ("method", "POST"),
            ("extra", "1"),
        ])],
        vec![d(&[("tenant", "t1"), ("path", "/login"), ("extra", "1")])],
        vec![d(&[("tenant", "t1"), ("nope", "1")])],
        vec![d(&[("tenant", "vip")])],
        vec![d(&[("tenant", "vip"), ("path", "/login")])],
        vec![d(&[("path", "/login")])],
    ] {
        rl.expect(m, ds, OK, &[NO_LIMIT]).await;
    }
    // Only a request ending at tenant charged the tenant's limit.
    rl.expect(
        m,
        vec![d(&[("tenant", "t1")])],
        OK,
        &[ok(5, H, "per-tenant", 3)],
    )
    .await;
    // requests_per_unit 0 and unlimited.
    for _ in 0..2 {
        rl.expect(
            m,
            vec![d(&[("banned", "x")])],
            OVER,
            &[over(0, H, "banned")],
        )
        .await;
        rl.expect(m, vec![d(&[("free", "x")])], OK, &[UNLIMITED])
            .await;
    }
}

#[tokio::test]
async fn own_wildcards_in_file_order_without_backtracking() {
    let server = own();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    const H: Unit = Hour;
    let m = "match";
    let w = |v: &str| vec![d(&[("w", v)])];
    // foo*bar*baz comes before foo* in the file.
    rl.expect(m, w("foo1bar2baz"), OK, &[ok(3, H, "foo-bar-baz", 2)])
        .await;
    rl.expect(m, w("foobarbaz"), OK, &[ok(3, H, "foo-bar-baz", 2)])
        .await;
    rl.expect(m, w("foo1bar2baz"), OK, &[ok(3, H, "foo-bar-baz", 1)])
        .await;
    // Not foo*bar*baz (no bar, or no baz at the end): foo*.
    rl.expect(m, w("foobaz"), OK, &[ok(1, H, "foo-star", 0)])
        .await;
    rl.expect(m, w("foobarbazz"), OK, &[ok(1, H, "foo-star", 0)])
        .await;
    // `*` matches the empty string; a counter per value.
    rl.expect(m, w("foo"), OK, &[ok(1, H, "foo-star", 0)]).await;
    rl.expect(m, w("foo"), OVER, &[over(1, H, "foo-star")])
        .await;
    rl.expect(m, w("foo2"), OK, &[ok(1, H, "foo-star", 0)])
        .await;
    // The exact value beats the wildcards before it.
    rl.expect(m, w("foobar"), OK, &[ok(4, H, "exact", 3)]).await;
    // A wildcard in the middle.
    rl.expect(m, w("barab"), OK, &[ok(2, H, "bar-star-b", 1)])
        .await;
    rl.expect(m, w("barb"), OK, &[ok(2, H, "bar-star-b", 1)])
        .await;
    rl.expect(m, w("barab"), OK, &[ok(2, H, "bar-star-b", 0)])
        .await;
    rl.expect(m, w("barab"), OVER, &[over(2, H, "bar-star-b")])
        .await;
    // No pattern matches: the key-only node.
    for v in ["bara", "xbarb", "fo", "bar"] {
        rl.expect(m, w(v), OK, &[ok(5, H, "any-w", 4)]).await;
    }
    // A nested wildcard.
    let region = |r: &str, u: &str| vec![d(&[("region", r), ("user", u)])];
    rl.expect(
        m,
        region("eu-west", "admin1"),
        OK,
        &[ok(1, H, "eu-admin", 0)],
    )
    .await;
    rl.expect(
        m,
        region("eu-west", "admin1"),
        OVER,
        &[over(1, H, "eu-admin")],
    )
    .await;
    rl.expect(
        m,
        region("eu-west", "admin2"),
        OK,
        &[ok(1, H, "eu-admin", 0)],
    )
    .await;
    rl.expect(m, region("eu-west", "bob"), OK, &[ok(2, H, "eu-user", 1)])
        .await;
    rl.expect(m, region("eu-", "bob"), OK, &[ok(2, H, "eu-user", 1)])
        .await;
    rl.expect(m, region("us-east", "bob"), OK, &[NO_LIMIT])
        .await;
    rl.expect(m, vec![d(&[("region", "eu-west")])], OK, &[NO_LIMIT])
        .await;
    // No backtracking: nb=xyz takes nb_x*, which has no leaf=b; the
    // key-only nb node (leaf 7/h) is not tried.
    let nb = |v: &str, leaf: &str| vec![d(&[("nb", v), ("leaf", leaf)])];
    rl.expect(m, nb("xyz", "b"), OK, &[NO_LIMIT]).await;
    rl.expect(m, nb("xyz", "a"), OK, &[ok(1, H, "x-leaf-a", 0)])
        .await;
    rl.expect(m, nb("other", "b"), OK, &[ok(7, H, "nb-leaf", 6)])
        .await;
    rl.expect(m, nb("other", "a"), OK, &[ok(7, H, "nb-leaf", 6)])
        .await;
}

#[tokio::test]
async fn own_share_threshold_shares_one_counter_per_pattern() {
    let server = own();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    const H: Unit = Hour;
    let m = "match";
    let shared = |v: &str| vec![d(&[("shared", v)])];
    let unshared = |v: &str| vec![d(&[("unshared", v)])];
    rl.expect(m, shared("files_a"), OK, &[ok(2, H, "shared-files", 1)])
        .await;
    rl.expect(m, shared("files_b"), OK, &[ok(2, H, "shared-files", 0)])
        .await;
    rl.expect(m, shared("files_c"), OVER, &[over(2, H, "shared-files")])
        .await;
    rl.expect(m, shared("files"), OVER, &[over(2, H, "shared-files")])
        .await;
    // Without share_threshold: a counter per value.
    rl.expect(m, unshared("files_a"), OK, &[ok(2, H, "unshared-files", 1)])
        .await;
    rl.expect(m, unshared("files_b"), OK, &[ok(2, H, "unshared-files", 1)])
        .await;
    rl.expect(m, unshared("files_a"), OK, &[ok(2, H, "unshared-files", 0)])
        .await;
    rl.expect(
        m,
        unshared("files_a"),
        OVER,
        &[over(2, H, "unshared-files")],
    )
    .await;
    rl.expect(m, unshared("files_b"), OK, &[ok(2, H, "unshared-files", 0)])
        .await;
    // share_threshold on the level above the limit: the region values
    // share, the user values do not.
    let sr = |r: &str, u: &str| vec![d(&[("shared_region", r), ("user", u)])];
    rl.expect(
        m,
        sr("eu-west", "bob"),
        OK,
        &[ok(2, H, "shared-region-user", 1)],
    )
    .await;
    rl.expect(
        m,
        sr("eu-north", "bob"),
        OK,
        &[ok(2, H, "shared-region-user", 0)],
    )
    .await;
    rl.expect(
        m,
        sr("eu-south", "bob"),
        OVER,
        &[over(2, H, "shared-region-user")],
    )
    .await;
    rl.expect(
        m,
        sr("eu-north", "alice"),
        OK,
        &[ok(2, H, "shared-region-user", 1)],
    )
    .await;
    // Stats: one key per pattern either way (the pattern, not the value).
    let stats = server.metric_samples();
    let stat = |key: &str, s: &str| {
        stats
            .get(&format!(
                "divvy_ratelimit_stats_total{{key=\"{key}\",stat=\"{s}\"}}"
            ))
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(stat("match.shared_files*", "total_hits"), 4.0, "{stats:#?}");
    assert_eq!(stat("match.shared_files*", "over_limit"), 2.0, "{stats:#?}");
    assert_eq!(
        stat("match.unshared_files*", "total_hits"),
        5.0,
        "{stats:#?}"
    );
    assert_eq!(
        stat("match.unshared_files*", "within_limit"),
        4.0,
        "{stats:#?}"
    );
}

#[tokio::test]
async fn own_units_second_to_year_and_duration_until_reset() {
    let server = own();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    let u = |v: &str| vec![d(&[("unit", v)])];
    // Each unit: its window, reset = unit - now % unit (checked by `expect`).
    for (value, unit) in [
        ("minute", Minute),
        ("hour", Hour),
        ("day", Day),
        ("week", Week),
        ("month", Month),
        ("year", Year),
    ] {
        rl.expect("units", u(value), OK, &[ok(2, unit, "", 1)])
            .await;
        rl.expect("units", u(value), OK, &[ok(2, unit, "", 0)])
            .await;
        rl.expect("units", u(value), OVER, &[over(2, unit, "")])
            .await;
    }
    // Per second: two per second, a fresh window the next second.
    next_second().await;
    rl.expect("units", u("second"), OK, &[ok(2, Second, "", 1)])
        .await;
    rl.expect("units", u("second"), OK, &[ok(2, Second, "", 0)])
        .await;
    let resp = rl
        .expect("units", u("second"), OVER, &[over(2, Second, "")])
        .await;
    assert_eq!(
        resp.statuses[0]
            .duration_until_reset
            .as_ref()
            .unwrap()
            .seconds,
        1
    );
    next_second().await;
    rl.expect("units", u("second"), OK, &[ok(2, Second, "", 1)])
        .await;
    // An unknown value of the key: no key-only node, no limit.
    rl.expect("units", u("fortnight"), OK, &[NO_LIMIT]).await;
}

/// A descriptor's `limit` replaces the file's limit (envoyproxy/ratelimit:
/// with no name, shadow or quota mode) for a domain the file defines, and
/// applies even where the tree has nothing.
#[tokio::test]
async fn descriptor_limit_override_replaces_the_files_limit() {
    let server = example();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    rl.expect(
        "rl",
        vec![d_override(&[("foo", "o1")], 1, RateLimitUnit::Minute)],
        OK,
        &[ok(1, Minute, "", 0)],
    )
    .await;
    rl.expect(
        "rl",
        vec![d_override(&[("foo", "o1")], 1, RateLimitUnit::Minute)],
        OVER,
        &[over(1, Minute, "")],
    )
    .await;
    // Over an unlimited node, a banned one, and nothing at all.
    rl.expect(
        "rl",
        vec![d_override(&[("qux", "o")], 3, RateLimitUnit::Hour)],
        OK,
        &[ok(3, Hour, "", 2)],
    )
    .await;
    rl.expect(
        "rl",
        vec![d_override(
            &[("foo", "o2"), ("bar", "banned")],
            5,
            RateLimitUnit::Hour,
        )],
        OK,
        &[ok(5, Hour, "", 4)],
    )
    .await;
    rl.expect(
        "rl",
        vec![d_override(&[("nomatch", "o")], 2, RateLimitUnit::Day)],
        OK,
        &[ok(2, Day, "", 1)],
    )
    .await;
    rl.expect(
        "rl",
        vec![d_override(&[("nomatch", "y")], 1, RateLimitUnit::Year)],
        OK,
        &[ok(1, Year, "", 0)],
    )
    .await;
    // The override is not in shadow mode, though the node is.
    let shady = || {
        vec![d_override(
            &[("foo", "o3"), ("baz", "shady")],
            1,
            RateLimitUnit::Hour,
        )]
    };
    rl.expect("rl", shady(), OK, &[ok(1, Hour, "", 0)]).await;
    rl.expect("rl", shady(), OVER, &[over(1, Hour, "")]).await;
    // Next to file limits in one request.
    rl.expect(
        "rl",
        vec![
            d(&[("foo", "o4")]),
            d_override(&[("foo", "o5")], 10, RateLimitUnit::Second),
        ],
        OK,
        &[ok(2, Minute, "", 1), ok(10, Second, "", 9)],
    )
    .await;
    // A domain no file defines, without a divvy policy: still no limit.
    rl.expect(
        "nofile",
        vec![d_override(&[("foo", "o")], 1, RateLimitUnit::Minute)],
        OK,
        &[NO_LIMIT],
    )
    .await;
}

// ---------------------------------------------------------------------------
// 3. Environment settings.

#[tokio::test]
async fn env_shadow_mode_keeps_statuses_and_answers_ok() {
    let server = Server::start_env(&data("example"), &[], &[("SHADOW_MODE", "true")]);
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    const M: Unit = Minute;
    rl.expect("rl", two("s", "banned"), OK, &[over(0, M, "banned_limit")])
        .await;
    let unspec = || vec![d(&[("unspec", "s")])];
    rl.expect("rl", unspec(), OK, &[ok(2, M, "", 1)]).await;
    rl.expect("rl", unspec(), OK, &[ok(2, M, "", 0)]).await;
    rl.expect("rl", unspec(), OK, &[over(2, M, "")]).await;
    let q = || {
        vec![
            d(&[("service", "service_1")]),
            d(&[("service", "service_2")]),
        ]
    };
    rl.expect("rl", q(), OK, &[ok(1, M, "", 0), ok(2, M, "", 1)])
        .await;
    rl.expect("rl", q(), OK, &[over(1, M, ""), ok(2, M, "", 0)])
        .await;
    rl.expect("rl", q(), OK, &[over(1, M, ""), over(2, M, "")])
        .await;
}

fn headers_of(resp: &RateLimitResponse) -> Vec<(String, String)> {
    resp.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

/// The three headers, with the reset checked against the status it came from.
fn assert_headers(resp: &RateLimitResponse, names: [&str; 3], limit: &str, remaining: &str) {
    let h = headers_of(resp);
    assert_eq!(h.len(), 3, "{h:?}");
    assert_eq!(h[0], (names[0].to_owned(), limit.to_owned()), "{h:?}");
    assert_eq!(h[1], (names[1].to_owned(), remaining.to_owned()), "{h:?}");
    assert_eq!(h[2].0, names[2], "{h:?}");
    let reset: u64 = h[2].1.parse().expect("reset seconds");
    assert!((1..=60).contains(&reset), "{h:?}");
}

#[tokio::test]
async fn env_limit_response_headers_default_and_custom_names() {
    let custom = Server::start_env(
        &data("example"),
        &[],
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_LIMIT_HEADER", "X-RL-Limit"),
            ("LIMIT_REMAINING_HEADER", "X-RL-Remaining"),
            ("LIMIT_RESET_HEADER", "X-RL-Reset"),
        ],
    );
    let default = Server::start_env(
        &data("example"),
        &[],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    );
    let names = ["X-RL-Limit", "X-RL-Remaining", "X-RL-Reset"];
    let mut rl = Rl::new(&custom).await;
    let mut rd = Rl::new(&default).await;
    leave_room(60, 15.0).await;
    const M: Unit = Minute;
    // The descriptor with the least remaining gives the headers.
    let both = || vec![d(&[("foo", "h"), ("bar", "x")]), d(&[("unspec", "h")])];
    let r = rl
        .expect("rl", both(), OK, &[ok(3, M, "", 2), ok(2, M, "", 1)])
        .await;
    assert_headers(&r, names, "2", "1");
    let r = rl
        .expect("rl", both(), OK, &[ok(3, M, "", 1), ok(2, M, "", 0)])
        .await;
    assert_headers(&r, names, "2", "0");
    // An over-limit descriptor gives them, whatever comes after it.
    let r = rl
        .expect(
            "rl",
            vec![d(&[("unspec", "h")]), d(&[("foo", "h"), ("bar", "x")])],
            OVER,
            &[over(2, M, ""), ok(3, M, "", 0)],
        )
        .await;
    assert_headers(&r, names, "2", "0");
    let r = rl
        .expect(
            "rl",
            vec![
                d(&[("foo", "h2"), ("bar", "x")]),
                d(&[("foo", "h2"), ("bar", "banned")]),
            ],
            OVER,
            &[ok(3, M, "", 2), over(0, M, "banned_limit")],
        )
        .await;
    assert_headers(&r, names, "0", "0");
    // No limit, unlimited: no headers.
    let r = rl
        .expect(
            "rl",
            vec![d(&[("qux", "h")]), d(&[("nope", "h")])],
            OK,
            &[UNLIMITED, NO_LIMIT],
        )
        .await;
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");
    // Default names.
    let r = rd
        .expect("rl", vec![d(&[("foo", "h")])], OK, &[ok(2, M, "", 1)])
        .await;
    assert_headers(
        &r,
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
        "2",
        "1",
    );
    // The reset header is the status's duration_until_reset.
    let r = rd
        .expect("rl", vec![d(&[("foo", "h")])], OK, &[ok(2, M, "", 0)])
        .await;
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds;
    let header: i64 = headers_of(&r)[2].1.parse().unwrap();
    // Computed a moment apart: the same second, or the next one.
    assert!(
        header == reset || header == reset - 1 || (reset == 1 && header == 60),
        "reset header {header}, status {reset}"
    );
}

/// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a request with a descriptor over
/// its limit charges none of its descriptors; by default the others are
/// charged.
#[tokio::test]
async fn env_stop_cache_key_increment_when_overlimit() {
    let stop = Server::start_env(
        &data("example"),
        &[],
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    );
    let plain = example();
    let mut rs = Rl::new(&stop).await;
    let mut rp = Rl::new(&plain).await;
    leave_room(60, 15.0).await;
    const M: Unit = Minute;
    for (rl, charged) in [(&mut rs, false), (&mut rp, true)] {
        let c = u32::from(charged);
        rl.expect("rl", two("s", "x"), OK, &[ok(3, M, "", 2)]).await;
        // Over because of requests_per_unit 0.
        rl.expect(
            "rl",
            vec![
                d(&[("foo", "s"), ("bar", "x")]),
                d(&[("foo", "s"), ("bar", "banned")]),
            ],
            OVER,
            &[ok(3, M, "", 2 - c), over(0, M, "banned_limit")],
        )
        .await;
        rl.expect("rl", two("s", "x"), OK, &[ok(3, M, "", 1 - c)])
            .await;
        // Over because a counter is spent.
        rl.expect("rl", vec![d(&[("unspec", "s")])], OK, &[ok(2, M, "", 1)])
            .await;
        rl.expect("rl", vec![d(&[("unspec", "s")])], OK, &[ok(2, M, "", 0)])
            .await;
        rl.expect(
            "rl",
            vec![d(&[("foo", "t"), ("bar", "x")]), d(&[("unspec", "s")])],
            OVER,
            &[ok(3, M, "", 3 - c), over(2, M, "")],
        )
        .await;
        rl.expect("rl", two("t", "x"), OK, &[ok(3, M, "", 2 - c)])
            .await;
        // Nothing over: everything charged as usual.
        rl.expect(
            "rl",
            vec![d(&[("foo", "u"), ("bar", "x")]), d(&[("unspec", "u")])],
            OK,
            &[ok(3, M, "", 2), ok(2, M, "", 1)],
        )
        .await;
    }
}

/// The dynamic metadata as JSON.
fn metadata_json(resp: &RateLimitResponse) -> serde_json::Value {
    fn conv(v: &Value) -> serde_json::Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
            Some(Kind::NumberValue(n)) => serde_json::json!(n),
            Some(Kind::StringValue(s)) => serde_json::json!(s),
            Some(Kind::BoolValue(b)) => serde_json::json!(b),
            Some(Kind::StructValue(s)) => serde_json::Value::Object(
                s.fields.iter().map(|(k, v)| (k.clone(), conv(v))).collect(),
            ),
            Some(Kind::ListValue(l)) => {
                serde_json::Value::Array(l.values.iter().map(conv).collect())
            }
        }
    }
    let s = resp.dynamic_metadata.as_ref().expect("dynamic_metadata");
    serde_json::Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), conv(v))).collect())
}

fn dynamic_metadata_server() -> Server {
    Server::start_env(
        &data("example"),
        &[],
        &[("RESPONSE_DYNAMIC_METADATA", "true")],
    )
}

/// RESPONSE_DYNAMIC_METADATA with the quota example (their
/// multiservice-tokenquota flow): the metadata of the descriptors that
/// passed; where two carry the same key, the first one's value stays
/// (envoyproxy/ratelimit's mergeMetadata, TestOverlappingMetadataReturnsTheFirstValue).
#[tokio::test]
async fn env_response_dynamic_metadata_quota_example() {
    let server = dynamic_metadata_server();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    const M: Unit = Minute;
    let q = || {
        vec![
            d(&[("service", "service_1")]),
            d(&[("service", "service_2")]),
        ]
    };
    let both_passed = rl
        .expect("rl", q(), OK, &[ok(1, M, "", 0), ok(2, M, "", 1)])
        .await;
    let r = rl
        .expect("rl", q(), OK, &[over(1, M, ""), ok(2, M, "", 0)])
        .await;
    assert_eq!(
        metadata_json(&r),
        serde_json::json!({
            "domain": "rl",
            "descriptors": [
                {"entries": ["service=service_1"]},
                {"entries": ["service=service_2"]},
            ],
            "metadata": {"service_with_quota": {"name": "service_2"}},
        })
    );
    let r = rl
        .expect("rl", q(), OVER, &[over(1, M, ""), over(2, M, "")])
        .await;
    assert_eq!(
        metadata_json(&r),
        serde_json::json!({
            "domain": "rl",
            "descriptors": [
                {"entries": ["service=service_1"]},
                {"entries": ["service=service_2"]},
            ],
        })
    );
    // Request hits_addend; entries in order; no metadata from unlimited or
    // unmatched descriptors.
    let mut req = common::request(
        "rl",
        vec![d(&[("qux", "x")]), d(&[("foo", "m"), ("bar", "y")])],
    );
    req.hits_addend = 2;
    let r = rl.expect_req(req, OK, &[UNLIMITED, ok(3, M, "", 1)]).await;
    assert_eq!(
        metadata_json(&r),
        serde_json::json!({
            "domain": "rl",
            "descriptors": [{"entries": ["qux=x"]}, {"entries": ["foo=m", "bar=y"]}],
            "hitsAddend": 2.0,
        })
    );
    // Both quota descriptors passed: service_1's name, the first, stays.
    assert_eq!(
        metadata_json(&both_passed),
        serde_json::json!({
            "domain": "rl",
            "descriptors": [
                {"entries": ["service=service_1"]},
                {"entries": ["service=service_2"]},
            ],
            "metadata": {"service_with_quota": {"name": "service_1"}},
        }),
        "overlapping metadata must keep the first passed descriptor's value"
    );
}

/// envoyproxy/ratelimit's descriptorToStruct lists a descriptor's own
/// hits_addend (Envoy sends one per descriptor for `hits_addend` actions).
#[tokio::test]
async fn env_response_dynamic_metadata_lists_descriptor_hits_addend() {
    let server = dynamic_metadata_server();
    let mut rl = Rl::new(&server).await;
    let r = rl
        .expect(
            "rl",
            vec![d_hits(&[("qux", "x")], 3), d(&[("nope", "y")])],
            OK,
            &[UNLIMITED, NO_LIMIT],
        )
        .await;
    assert_eq!(
        metadata_json(&r)["descriptors"],
        serde_json::json!([{"entries": ["qux=x"], "hitsAddend": 3.0}, {"entries": ["nope=y"]}])
    );
}

/// A descriptor hits_addend of 0 checks without charging; at exactly the
/// limit it is still OK in envoyproxy/ratelimit (count + 0 is not over the
/// limit). Their /tokenquota route: check with 0 on the request path,
/// charge 1 on stream done; 3 requests pass with 2 per minute, the 4th is
/// refused (integration-test/scripts/token-quota.sh).
#[tokio::test]
async fn token_quota_check_with_zero_hits_addend_at_the_limit_is_ok() {
    let server = example();
    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    const M: Unit = Minute;
    let check = || vec![d_hits(&[("service", "service_2")], 0)];
    let charge = || vec![d_hits(&[("service", "service_2")], 1)];
    rl.expect("rl", check(), OK, &[ok(2, M, "", 2)]).await;
    rl.expect("rl", charge(), OK, &[ok(2, M, "", 1)]).await;
    rl.expect("rl", check(), OK, &[ok(2, M, "", 1)]).await;
    rl.expect("rl", charge(), OK, &[ok(2, M, "", 0)]).await;
    // The counter is at the limit: a check of 0 more is still within it.
    rl.expect("rl", check(), OK, &[ok(2, M, "", 0)]).await;
    rl.expect("rl", charge(), OVER, &[over(2, M, "")]).await;
    rl.expect("rl", check(), OVER, &[over(2, M, "")]).await;
}

// ---------------------------------------------------------------------------
// 4. Domains no file defines.

#[tokio::test]
async fn domain_without_a_file_uses_the_divvy_policy_or_gets_no_limit() {
    let mixed = Server::start(&data("mixed"), &[]);
    let bare = example();
    let mut rm = Rl::new(&mixed).await;
    let mut rb = Rl::new(&bare).await;
    leave_room(60, 15.0).await;
    // With a divvy policy in the directory: divvy rules decide.
    let login = || common::request("edge", vec![d(&[("path", "/login")])]);
    let mut remaining = Vec::new();
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = rm.raw(login()).await;
        let s = &r.statuses[0];
        let l = s.current_limit.as_ref().expect("divvy rule's limit");
        assert_eq!(
            (l.requests_per_unit, l.unit, l.name.as_str()),
            (2, Hour as i32, "edge-login")
        );
        remaining.push(s.limit_remaining);
        codes.push((code_of(r.overall_code), code_of(s.code)));
    }
    assert_eq!(remaining, vec![1, 0, 0]);
    assert_eq!(codes, vec![(OK, OK), (OK, OK), (OVER, Code::OverLimit)]);
    let r = rm
        .raw(common::request("other", vec![d(&[("x", "y")])]))
        .await;
    let l = r.statuses[0]
        .current_limit
        .as_ref()
        .expect("the default rule");
    assert_eq!((l.requests_per_unit, l.unit), (100, Hour as i32), "{r:?}");
    assert_eq!(r.statuses[0].limit_remaining, 99);
    // Their config.yaml's domain: decided by the file alone.
    rm.expect(
        "mongo_cps",
        vec![d(&[("database", "users")])],
        OK,
        &[ok(500, Second, "", 499)],
    )
    .await;
    rm.expect(
        "mongo_cps",
        vec![d(&[("database", "nope")])],
        OK,
        &[NO_LIMIT],
    )
    .await;
    rm.expect("mongo_cps", vec![d(&[("path", "/login")])], OK, &[NO_LIMIT])
        .await;
    // Without a divvy policy: the no-limit shape, never counted.
    for _ in 0..3 {
        rb.expect(
            "edge",
            vec![d(&[("path", "/login")]), d(&[("foo", "a")])],
            OK,
            &[NO_LIMIT, NO_LIMIT],
        )
        .await;
    }
    let r = rb
        .raw(common::request("edge", vec![d(&[("path", "/login")])]))
        .await;
    assert!(r.response_headers_to_add.is_empty() && r.dynamic_metadata.is_none());
}

// ---------------------------------------------------------------------------
// 5. Config errors.

fn check(path: &Path) -> (bool, String, String) {
    let out = Command::new(common::binary())
        .arg("check")
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_rejects_each_config_error_class_naming_the_file() {
    let cases = [
        ("empty_domain.yaml", "config file cannot have empty domain"),
        ("empty_key.yaml", "descriptor has empty key"),
        (
            "duplicate_key.yaml",
            "duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        ("bad_limit_unit.yaml", "invalid rate limit unit 'foo'"),
        ("missing_unit.yaml", "invalid rate limit unit ''"),
        (
            "unlimited_with_unit.yaml",
            "should not specify rate limit unit when unlimited",
        ),
        ("misspelled_key.yaml", "config error, unknown key 'ratelimit'"),
        (
            "misspelled_key2.yaml",
            "config error, unknown key 'requestsperunit'",
        ),
        (
            "replaces_self.yaml",
            "replaces should not contain name of same descriptor",
        ),
        ("replaces_empty.yaml", "should not have an empty replaces entry"),
        (
            "non_string_key.yaml",
            "config error, key is not of type string: 0.25",
        ),
        (
            "non_map_list.yaml",
            "config error, yaml file contains list of type other than map: a",
        ),
        (
            "share_threshold_without_wildcard.yaml",
            "share_threshold can only be used with wildcard values (containing '*'), but found key 'files_plain'",
        ),
        ("bad_yaml.yaml", "found unexpected end of stream"),
    ];
    let listed: std::collections::BTreeSet<String> = std::fs::read_dir(data("bad"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let tested: std::collections::BTreeSet<String> =
        cases.iter().map(|(f, _)| (*f).to_owned()).collect();
    assert_eq!(listed, tested, "every file in bad/ has a case");
    for (file, message) in cases {
        let path = data("bad").join(file);
        let (success, stdout, stderr) = check(&path);
        assert!(!success, "{file}: accepted\n{stdout}");
        common::assert_has(&stderr, &[&path.display().to_string(), message]);
        assert!(!stdout.contains("limits"), "{file}: {stdout}");
    }
    // The whole directory is refused too.
    let (success, _, stderr) = check(&data("bad"));
    assert!(!success);
    assert!(
        stderr.contains(&data("bad").display().to_string()),
        "{stderr}"
    );
}

/// Runs `divvy serve` on `path` and returns its exit status and stderr once
/// it exits (it must, within 30 s).
fn serve_must_exit(path: &Path) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(common::binary())
        .arg("serve")
        .arg("--config")
        .arg(path)
        .args(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"])
        .args(["--http-addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("divvy serve {} kept running", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_directory_with_one_bad_file_or_a_duplicate_domain_is_rejected_whole() {
    // One bad file next to a good one.
    let bad = data("bad_set").join("replaces_self.yaml");
    let (success, stdout, stderr) = check(&data("bad_set"));
    assert!(!success, "{stdout}");
    common::assert_has(
        &stderr,
        &[
            &bad.display().to_string(),
            "replaces should not contain name of same descriptor",
        ],
    );
    assert!(!stdout.contains("domain good"), "{stdout}");
    let (status, stderr) = serve_must_exit(&data("bad_set"));
    assert!(!status.success(), "{status:?}");
    common::assert_has(
        &stderr,
        &[
            &bad.display().to_string(),
            "replaces should not contain name of same descriptor",
        ],
    );
    // Two files with one domain (their basic_config.yaml and
    // duplicate_domain.yaml).
    let dup = data("duplicate_domain").join("duplicate_domain.yaml");
    let (success, stdout, stderr) = check(&data("duplicate_domain"));
    assert!(!success, "{stdout}");
    common::assert_has(
        &stderr,
        &[
            &dup.display().to_string(),
            "duplicate domain 'test-domain' in config file",
        ],
    );
    let (status, stderr) = serve_must_exit(&data("duplicate_domain"));
    assert!(!status.success(), "{status:?}");
    common::assert_has(&stderr, &["duplicate domain 'test-domain' in config file"]);
    // Each file alone is fine.
    for f in ["basic_config.yaml", "duplicate_domain.yaml"] {
        let (success, stdout, stderr) = check(&data("duplicate_domain").join(f));
        assert!(success, "{f}: {stdout}{stderr}");
    }
}

// ---------------------------------------------------------------------------
// 6. Reload under load.

/// Writes `text` to `dir/name` atomically (a dotfile, renamed).
fn put(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// Asks until `pred` holds for the first status (10 s at most).
async fn poll(
    rl: &mut Rl,
    req: &RateLimitRequest,
    what: &str,
    pred: impl Fn(&DescriptorStatus) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = rl.raw(req.clone()).await;
        if pred(&r.statuses[0]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {} after 10 s",
            show_status(&r.statuses[0])
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn limit_is(s: &DescriptorStatus, code: Code, rpu: u32, name: &str) -> bool {
    code_of(s.code) == code
        && s.current_limit
            .as_ref()
            .is_some_and(|l| l.requests_per_unit == rpu && l.name == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_add_change_break_and_remove_a_file_under_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        data("example/example.yaml"),
        dir.path().join("example.yaml"),
    )
    .unwrap();
    // Never read: a dotfile and a non-YAML file (both invalid).
    std::fs::write(dir.path().join(".hidden.yaml"), "domain: rl\nbad: [\n").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "domain: [\n").unwrap();
    let server = Server::start(dir.path(), &[]);
    let mut rl = Rl::new(&server).await;

    let load = Load::start(&server).await;

    let req = common::request("reload", vec![d(&[("k", "v")])]);
    // Not defined yet: no limit.
    rl.expect("reload", vec![d(&[("k", "v")])], OK, &[NO_LIMIT])
        .await;
    // Dropped in (a .yml file): banned.
    put(
        dir.path(),
        "reload.yml",
        "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {name: v1, unit: hour, requests_per_unit: 0}\n",
    );
    poll(&mut rl, &req, "file added", |s| limit_is(s, OVER, 0, "v1")).await;
    rl.expect(
        "reload",
        vec![d(&[("k", "v")])],
        OVER,
        &[over(0, Hour, "v1")],
    )
    .await;
    // Changed: a large limit named v2.
    put(
        dir.path(),
        "reload.yml",
        "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {name: v2, unit: hour, requests_per_unit: 1000000}\n",
    );
    poll(&mut rl, &req, "file changed", |s| {
        limit_is(s, OK, 1_000_000, "v2")
    })
    .await;
    broken_file_keeps_the_set_in_force(dir.path(), &server, &mut rl, &req).await;
    // Removed: no limit again.
    std::fs::remove_file(dir.path().join("reload.yml")).unwrap();
    poll(&mut rl, &req, "file removed", |s| matches(s, &NO_LIMIT)).await;
    // A moment more of load on the final set.
    tokio::time::sleep(Duration::from_millis(300)).await;
    load.finish().await;
    // The rules the server ended with: example.yaml alone.
    let (status, body) = server.http("GET", "/rlconfig", "");
    assert_eq!(status, 200);
    assert!(
        body.contains("rl.foo.bar: ") && !body.contains("reload.k"),
        "{body}"
    );
}

/// Two clients, each asking rl (unlimited: the answer never changes) and
/// the reloaded domain, continuously, until [`Load::finish`].
struct Load {
    stop: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts the two clients on `server`.
    async fn start(server: &Server) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let mut client = server.client().await;
            let (stop, calls, failures) = (stop.clone(), calls.clone(), failures.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let req = common::request(
                        "rl",
                        vec![d(&[("qux", "load")]), d(&[("foo", "load"), ("bay", "x")])],
                    );
                    match client.should_rate_limit(req).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            let unlimited = r.statuses.len() == 2
                                && r.statuses.iter().all(|s| {
                                    s.limit_remaining == u32::MAX && s.current_limit.is_none()
                                });
                            if !unlimited {
                                failures.lock().unwrap().push(format!("rl answer {r:?}"));
                            }
                        }
                        Err(e) => failures.lock().unwrap().push(format!("rl: {e}")),
                    }
                    let req = common::request("reload", vec![d(&[("k", "v")])]);
                    if let Err(e) = client.should_rate_limit(req).await {
                        failures.lock().unwrap().push(format!("reload: {e}"));
                    }
                    calls.fetch_add(2, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
        Load {
            stop,
            calls,
            failures,
            tasks,
        }
    }

    /// Stops the clients: every answer was as expected, and there were
    /// more than 100 calls.
    async fn finish(self) {
        let Load {
            stop,
            calls,
            failures,
            tasks,
        } = self;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        let failures = failures.lock().unwrap();
        let calls = calls.load(Ordering::Relaxed);
        assert!(
            failures.is_empty(),
            "{} of {calls} calls failed: {:#?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        assert!(calls > 100, "only {calls} calls under load");
    }
}

/// A bad file dropped into `dir`: the reload fails (logged, naming it) and
/// the set in force stays (`req` still meets v2); the file is removed.
async fn broken_file_keeps_the_set_in_force(
    dir: &Path,
    server: &Server,
    rl: &mut Rl,
    req: &RateLimitRequest,
) {
    while server.log.try_recv().is_ok() {}
    put(
        dir,
        "broken.yaml",
        "domain: broken\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = String::new();
    while !seen.contains("policy reload failed") {
        assert!(
            Instant::now() < deadline,
            "no failed reload logged for broken.yaml:\n{seen}"
        );
        while let Ok(line) = server.log.try_recv() {
            seen.push_str(&line);
            seen.push('\n');
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen.contains("broken.yaml"), "{seen}");
    let r = rl.raw(req.clone()).await;
    let l = r.statuses[0].current_limit.as_ref().expect("v2 still");
    assert_eq!((l.name.as_str(), l.requests_per_unit), ("v2", 1_000_000));
    std::fs::remove_file(dir.join("broken.yaml")).unwrap();
}

// ---------------------------------------------------------------------------
// 7. A real Envoy with their route actions.

/// examples/envoyproxy-ratelimit/envoy.yaml with its ports moved: the
/// listener (8888), divvy's gRPC port, the "Service 1" upstream (mock, 9999)
/// and "Service 2" (10001); `--service-cluster proxy` as their
/// docker-compose sets the source_cluster action's value.
fn start_envoy(divvy_grpc: u16, service_1: u16, service_2: u16) -> Envoy {
    envoy::start(
        &root().join("examples/envoyproxy-ratelimit/envoy.yaml"),
        8001,
        &[8888],
        &[(8081, divvy_grpc), (9999, service_1), (10001, service_2)],
        &["--service-cluster", "proxy", "--service-node", "proxy"],
    )
}

/// divvy on their examples/ratelimit/config directory, as their
/// docker-compose runs their service (RESPONSE_DYNAMIC_METADATA=true).
fn divvy_for_envoy() -> Server {
    Server::start_env(
        &root().join("examples/envoyproxy-ratelimit/config"),
        &[],
        &[("RESPONSE_DYNAMIC_METADATA", "true")],
    )
}

/// One request of replaces.sh: path, headers, expected status.
type Step = (&'static str, Vec<(&'static str, &'static str)>, u16);

const SERVICE_1: &str = "Hello World from Service 1";
const SERVICE_2: &str = "Hello World from Service 2";

/// Their integration-test scripts through Envoy: which requests get 200
/// and which 429.
#[test]
fn envoy_with_their_route_actions_answers_as_their_integration_scripts() {
    let service = divvy_for_envoy();
    let envoy = start_envoy(
        service.grpc.port(),
        upstream(SERVICE_1),
        upstream(SERVICE_2),
    );
    std::thread::sleep(room_wait(60, 30.0));
    let port = envoy.ports[0];
    let status = |path: &str, headers: &[(&str, &str)]| {
        get(port, path, headers)
            .unwrap_or_else(|| panic!("no answer for {path} {headers:?}"))
            .0
    };
    let run = |what: &str, path: &str, headers: &[(&str, &str)], want: &[u16]| {
        let got: Vec<u16> = want.iter().map(|_| status(path, headers)).collect();
        assert_eq!(got, want, "{what}: {path} {headers:?}");
    };

    // simple-get.sh.
    run(
        "simple-get",
        "/twoheader",
        &[("foo", "test"), ("baz", "shady")],
        &[200],
    );
    // trigger-ratelimit.sh: (foo: *), (baz: not-so-shady), 3/min.
    run(
        "trigger-ratelimit",
        "/twoheader",
        &[("foo", "pelle"), ("baz", "not-so-shady")],
        &[200, 200, 200, 429, 429],
    );
    // trigger-shadow-mode-key.sh: shadow mode never refuses.
    run(
        "shadow mode",
        "/twoheader",
        &[("foo", "pelle"), ("baz", "shady")],
        &[200, 200, 200, 200, 200, 200],
    );
    // value-included-in-stats-key-when-unspecified.sh: 2/min.
    run(
        "unspec",
        "/unspec",
        &[("unspec", "unspecified_value")],
        &[200, 200, 429],
    );
    // quota.sh: both quota descriptors spent on the 3rd request.
    run("quota", "/quota", &[], &[200, 200, 429]);
    // /test: (source_cluster: proxy), (destination_cluster: mock), 1/min.
    run("source/destination cluster", "/test", &[], &[200, 429]);
    header_route_counts_down(port);
    // No header, no descriptor: no limit.
    run("no descriptor", "/header", &[], &[200, 200, 200]);

    // replaces.sh, in order.
    let steps = replaces_steps();
    let got: Vec<u16> = steps.iter().map(|(p, h, _)| status(p, h)).collect();
    let want: Vec<u16> = steps.iter().map(|(_, _, w)| *w).collect();
    assert_eq!(got, want, "replaces.sh, step by step");

    assert_script_stats(&service);
}

/// The /header route, (foo: *) 2 per minute through Envoy `port`: 200s
/// with x-ratelimit-* headers (draft 03) counting down, then a 429 with
/// its reset.
fn header_route_counts_down(port: u16) {
    let (s, h, body) = get(port, "/header", &[("foo", "hdr")]).unwrap();
    assert_eq!((s, body.as_str()), (200, SERVICE_1), "{h:?}");
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("1"), "{h:?}");
    assert!(
        header(&h, "x-ratelimit-limit").is_some_and(|v| v.starts_with('2')),
        "{h:?}"
    );
    let (s, h, _) = get(port, "/header", &[("foo", "hdr")]).unwrap();
    assert_eq!(s, 200);
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("0"), "{h:?}");
    let (s, h, _) = get(port, "/header", &[("foo", "hdr")]).unwrap();
    assert_eq!(s, 429, "{h:?}");
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("0"), "{h:?}");
    let reset: u64 = header(&h, "x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((1..=60).contains(&reset), "{h:?}");
}

/// Their replaces.sh: each request and the status it must get, in order.
fn replaces_steps() -> Vec<Step> {
    let h4 = |foo_v: &'static str, bar_v: &'static str, dst: &'static str| {
        vec![
            ("foo", foo_v),
            ("bar", bar_v),
            ("source_cluster", "proxy"),
            ("destination_cluster", dst),
        ]
    };
    let h5 = |foo_v: &'static str, bar_v: &'static str, dst: &'static str| {
        let mut v = h4(foo_v, bar_v, dst);
        v.push(("category", "account"));
        v
    };
    vec![
        (
            "/twoheader",
            vec![("foo", "bkthomps"), ("bar", "banned")],
            429,
        ),
        ("/fourheader", h4("bkthomps", "banned", "mock"), 429),
        ("/fourheader", h4("bkthomps", "banned", "override"), 200),
        ("/fourheader", h4("bkthomps", "banned", "override"), 200),
        ("/fourheader", h4("bkthomps", "banned", "override"), 429),
        ("/fourheader", h4("my_foo", "bkthomps", "bkthomps"), 200),
        ("/fourheader", h4("my_foo", "bkthomps", "bkthomps"), 200),
        ("/fourheader", h4("my_foo", "bkthomps", "bkthomps"), 429),
        ("/fourheader", h4("my_foo", "bkthomps", "not_bkthomps"), 200),
        ("/fourheader", h4("my_foo", "bkthomps", "not_bkthomps"), 429),
        ("/fourheader", h4("my_foo", "bkthomps", "bkthomps"), 429),
        ("/fiveheader", h5("my_foo", "bkthomps", "fake"), 200),
        ("/fiveheader", h5("my_foo", "bkthomps", "fake"), 200),
        ("/fiveheader", h5("my_foo", "bkthomps", "fake"), 200),
        ("/fiveheader", h5("my_foo", "bkthomps", "fake"), 200),
        ("/fiveheader", h5("my_foo", "bkthomps", "fake"), 429),
        (
            "/twoheader",
            vec![("foo", "foo_2"), ("bar", "bkthomps")],
            200,
        ),
        (
            "/twoheader",
            vec![("foo", "foo_2"), ("bar", "bkthomps")],
            429,
        ),
        ("/fourheader", h4("foo_3", "bar_3", "fake"), 200),
        ("/fourheader", h4("foo_3", "bar_3", "fake"), 200),
        ("/fourheader", h4("foo_3", "bar_3", "fake"), 429),
        ("/fiveheader", h5("my_foo", "bkthomps", "fake"), 429),
    ]
}

/// Envoy's requests of the scripts were counted under their stats keys.
fn assert_script_stats(service: &Server) {
    // Envoy's requests were counted under their keys.
    let stats = service.metric_samples();
    let stat = |key: &str, s: &str| {
        stats
            .get(&format!(
                "divvy_ratelimit_stats_total{{key=\"{key}\",stat=\"{s}\"}}"
            ))
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(stat("rl.foo.baz_shady", "shadow_mode"), 3.0, "{stats:#?}");
    assert_eq!(stat("rl.unspec_unspecified_value", "over_limit"), 1.0);
    assert_eq!(
        stat(
            "rl.source_cluster_proxy.destination_cluster_mock",
            "total_hits"
        ),
        3.0
    );
}

/// Their token-quota.sh: /tokenquota checks service_2 with hits_addend 0 and
/// charges 1 when the stream is done; with 2 per minute, 3 requests pass.
#[test]
fn envoy_token_quota_route_lets_three_requests_through() {
    let service = divvy_for_envoy();
    let envoy = start_envoy(
        service.grpc.port(),
        upstream(SERVICE_1),
        upstream(SERVICE_2),
    );
    std::thread::sleep(room_wait(60, 30.0));
    let mut got = Vec::new();
    for i in 1..=4 {
        let no = i.to_string();
        got.push(
            get(envoy.ports[0], "/tokenquota", &[("request-no", &no)])
                .unwrap()
                .0,
        );
        // Let the stream-done charge land before the next request.
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(got, vec![200, 200, 200, 429], "token-quota.sh");
}

/// Their multiservice-tokenquota.sh: the dynamic metadata of the quota
/// descriptors that passed picks the upstream (service_1 while it has
/// quota, then service_2), charged on stream done.
#[test]
fn envoy_multiservice_token_quota_routes_by_dynamic_metadata() {
    let service = divvy_for_envoy();
    let envoy = start_envoy(
        service.grpc.port(),
        upstream(SERVICE_1),
        upstream(SERVICE_2),
    );
    std::thread::sleep(room_wait(60, 30.0));
    let mut got = Vec::new();
    for i in 1..=6 {
        let no = i.to_string();
        let (status, _, body) = get(
            envoy.ports[0],
            "/multiservice-tokenquota",
            &[("request-no", &no)],
        )
        .unwrap();
        got.push(if status == 200 {
            body
        } else {
            status.to_string()
        });
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        got,
        vec![SERVICE_1, SERVICE_1, SERVICE_2, SERVICE_2, SERVICE_2, "429"],
        "multiservice-tokenquota.sh"
    );
}

// ---------------------------------------------------------------------------
// 8. Admin endpoints and stats.

#[tokio::test]
async fn healthcheck_rlconfig_and_stats() {
    let server = example();
    let (status, body) = server.http("GET", "/healthcheck", "");
    assert_eq!((status, body.trim()), (200, "OK"));
    rlconfig_lists_the_example(&server);

    let mut rl = Rl::new(&server).await;
    leave_room(60, 15.0).await;
    for _ in 0..2 {
        rl.ask("rl", two("m", "bkthomps")).await;
    }
    for _ in 0..5 {
        rl.ask("rl", vec![d(&[("foo", "m"), ("baz", "shady")])])
            .await;
    }
    for _ in 0..3 {
        rl.ask("rl", vec![d(&[("unspec", "unspecified_value")])])
            .await;
        rl.ask("rl", two("m", "x")).await;
        rl.ask("rl", vec![d(&[("qux", "m")])]).await;
    }
    stats_count_by_key(&server);
    near_limit_ratio_applies().await;
}

/// `GET /rlconfig` lists the example's limits as theirs does.
fn rlconfig_lists_the_example(server: &Server) {
    let (status, body) = server.http("GET", "/rlconfig", "");
    assert_eq!(status, 200);
    for line in [
        "rl.category_account: unit=MINUTE requests_per_unit=4, shadow_mode: false, quota_mode: false",
        "rl.source_cluster_proxy.destination_cluster_bkthomps: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false",
        "rl.foo: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false",
        "rl.foo.bar: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false",
        "rl.foo.bar_banned: unit=MINUTE requests_per_unit=0, shadow_mode: false, quota_mode: false",
        "rl.foo.baz: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false",
        "rl.foo.baz_shady: unit=MINUTE requests_per_unit=3, shadow_mode: true, quota_mode: false",
        "rl.foo.bay: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
        "rl.unspec: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false",
        "rl.qux: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
        "rl.service_service_1: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: true",
        "rl.service_service_2: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: true",
    ] {
        assert!(body.lines().any(|l| l == line), "{line:?} not in:\n{body}");
    }
    assert_eq!(
        body.lines().filter(|l| l.starts_with("rl.")).count(),
        17,
        "{body}"
    );
}

/// The stats of the healthcheck test's requests, by key, as theirs counts
/// them (unlimited limits and detailed_metric's bounded key not at all).
fn stats_count_by_key(server: &Server) {
    let stats = server.metric_samples();
    let stat = |key: &str, s: &str| {
        stats
            .get(&format!(
                "divvy_ratelimit_stats_total{{key=\"{key}\",stat=\"{s}\"}}"
            ))
            .copied()
    };
    let want = [
        ("rl.foo.bar_bkthomps", "total_hits", 2.0),
        ("rl.foo.bar_bkthomps", "within_limit", 1.0),
        ("rl.foo.bar_bkthomps", "over_limit", 1.0),
        ("rl.foo.bar_bkthomps", "near_limit", 1.0),
        ("rl.foo.baz_shady", "total_hits", 5.0),
        ("rl.foo.baz_shady", "within_limit", 3.0),
        ("rl.foo.baz_shady", "over_limit", 2.0),
        ("rl.foo.baz_shady", "shadow_mode", 2.0),
        ("rl.foo.baz_shady", "near_limit", 1.0),
        // detailed_metric: the request's own value.
        ("rl.unspec_unspecified_value", "total_hits", 3.0),
        ("rl.unspec_unspecified_value", "within_limit", 2.0),
        ("rl.unspec_unspecified_value", "over_limit", 1.0),
        ("rl.foo.bar", "total_hits", 3.0),
        ("rl.foo.bar", "within_limit", 3.0),
        ("rl.foo.bar", "near_limit", 1.0),
    ];
    for (key, s, n) in want {
        assert_eq!(stat(key, s), Some(n), "{key} {s}: {stats:#?}");
    }
    for (key, s) in [
        ("rl.foo.bar", "over_limit"),
        ("rl.foo.bar_bkthomps", "shadow_mode"),
        ("rl.unspec_unspecified_value", "shadow_mode"),
    ] {
        assert!(stat(key, s).unwrap_or(0.0) == 0.0, "{key} {s}: {stats:#?}");
    }
    // Unlimited limits are not counted; nor is the bounded key of detailed_metric.
    assert!(
        !stats
            .keys()
            .any(|k| k.contains("key=\"rl.qux") || k.contains("key=\"rl.unspec\"")),
        "{stats:#?}"
    );
}

/// NEAR_LIMIT_RATIO: 0.5 of 3 is 1, so the 2nd and 3rd hits are near.
async fn near_limit_ratio_applies() {
    let half = Server::start_env(&data("example"), &[], &[("NEAR_LIMIT_RATIO", "0.5")]);
    let mut rh = Rl::new(&half).await;
    for _ in 0..3 {
        rh.ask("rl", two("n", "x")).await;
    }
    let stats = half.metric_samples();
    assert_eq!(
        stats
            .get("divvy_ratelimit_stats_total{key=\"rl.foo.bar\",stat=\"near_limit\"}")
            .copied(),
        Some(2.0),
        "{stats:#?}"
    );
}

/// `POST /json` decides a domain an envoyproxy/ratelimit file defines by
/// that file, as gRPC does (`category=account`: 4 per minute in the
/// example), and a domain no file defines gets "no limit" without a divvy
/// policy.
#[test]
fn json_endpoint_answers_for_envoy_domains() {
    let server = example();
    let body =
        r#"{"domain":"rl","descriptors":[{"entries":[{"key":"category","value":"account"}]}]}"#;
    let (status, text) = server.http("POST", "/json", body);
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["overallCode"], "OK", "{text}");
    assert_eq!(
        v["statuses"][0]["currentLimit"]["requestsPerUnit"], 4,
        "{text}"
    );
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE", "{text}");
    let body = r#"{"domain":"nobody","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}"#;
    let (status, text) = server.http("POST", "/json", body);
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert!(v["statuses"][0].get("currentLimit").is_none(), "{text}");
    assert_eq!(v["statuses"][0]["limitRemaining"], 0, "{text}");
}

/// An envoyproxy/ratelimit domain's calls are timed as divvy rules' are:
/// each descriptor in `divvy_hit_duration_seconds`, each store call in
/// `divvy_store_duration_seconds`, and the dashboard overview's p99 comes
/// from them.
#[tokio::test]
async fn envoy_domains_are_timed_in_the_histograms_and_the_dashboard() {
    let server = example();
    let count = |name: &str| server.metric_samples().get(name).copied().unwrap_or(0.0);
    let (hits, store) = (
        count("divvy_hit_duration_seconds_count"),
        count("divvy_store_duration_seconds_count"),
    );
    let (_, overview) = server.http("GET", "/api/v1/overview", "");
    let overview: serde_json::Value = serde_json::from_str(&overview).expect("overview JSON");
    assert!(overview["p99DecisionSeconds"].is_null(), "{overview}");
    let mut rl = Rl::new(&server).await;
    for _ in 0..3 {
        rl.ask("rl", two("m", "mock")).await;
    }
    assert_eq!(count("divvy_hit_duration_seconds_count"), hits + 3.0);
    assert_eq!(count("divvy_store_duration_seconds_count"), store + 3.0);
    let (_, overview) = server.http("GET", "/api/v1/overview", "");
    let overview: serde_json::Value = serde_json::from_str(&overview).expect("overview JSON");
    let p99 = overview["p99DecisionSeconds"].as_f64();
    assert!(p99.is_some_and(|s| s > 0.0), "{overview}");
}
