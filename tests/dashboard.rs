//! The dashboard at `/ui` in a real browser: Debian's `chromium`, headless,
//! driven through `chromedriver` (WebDriver) by fantoccini, against the
//! real binary. tests/run-all.sh installs both packages. Screenshots go to
//! `target/dashboard/` (under the repository, whatever CARGO_TARGET_DIR).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{desc, free_port, http_request, parse_ok, request, Server};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

const ADMIN: &str = "dash-admin-5c1e";
const READ: &str = "dash-read-90ab";

const POLICY: &str = r#"
overrides:
  - label: login
    operation: {path: /login, ip: "*"}
    actorField: ip
    creditLimit: 5
    resetSeconds: 1h
  - label: search
    operation: {path: /search}
    creditLimit: 1000
    resetSeconds: 60
  - label: tokens
    domain: llm
    operation: {user: "*"}
    actorField: user
    creditLimit: 1000
    resetSeconds: 1h
    overdraft: true
  - label: beta
    operation: {path: /beta, ip: "*"}
    actorField: ip
    creditLimit: 2
    resetSeconds: 1h
    matchPolicy: shadow
default: {creditLimit: 100, resetSeconds: 60}
"#;

/// chromedriver on a free loopback port and one headless Chromium session
/// with a fresh profile; both end on drop.
struct Browser {
    client: Client,
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// Ends the session first (chromedriver then stops Chromium: killing
    /// chromedriver alone leaves the browser running), also after a failure.
    fn drop(&mut self) {
        let url = format!("http://127.0.0.1:{}/session/{}", self.port, self.session);
        let _ = ureq::delete(&url).call();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

async fn browser() -> Browser {
    let port = free_port();
    let driver = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver (Debian's chromium-driver; tests/run-all.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let profile = tempfile::tempdir().expect("profile dir");
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
    ];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.push(format!("--user-data-dir={}", profile.path().display()));
    let caps = json!({
        "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
        "goog:loggingPrefs": {"browser": "ALL"},
    });
    let Value::Object(caps) = caps else {
        unreachable!()
    };
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session");
    let session = client.session_id().await.unwrap().expect("session id");
    Browser {
        client,
        driver,
        port,
        session,
        _profile: profile,
    }
}

impl Browser {
    /// What the page logged at SEVERE level (chromedriver's browser log),
    /// and what its error collector caught.
    async fn errors(&self) -> Vec<String> {
        let url = format!(
            "http://127.0.0.1:{}/session/{}/se/log",
            self.port, self.session
        );
        // chromedriver keeps connections open: ureq reads by length.
        let body = ureq::post(&url)
            .header("Content-Type", "application/json")
            .send(r#"{"type":"browser"}"#)
            .expect("the browser's log")
            .body_mut()
            .read_to_string()
            .unwrap();
        let log: Value = serde_json::from_str(&body).unwrap();
        let mut errors: Vec<String> = log["value"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].to_string())
            .collect();
        let caught = self.js("return window.__errors;").await;
        let caught = caught.as_array().expect("the page's error collector ran");
        errors.extend(caught.iter().map(|e| e.to_string()));
        errors
    }

    async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.expect(script)
    }

    /// Waits up to `within` for `script` to return true.
    async fn until(&self, within: Duration, what: &str, script: &str) -> Duration {
        let started = Instant::now();
        loop {
            if self.js(script).await == Value::Bool(true) {
                return started.elapsed();
            }
            assert!(started.elapsed() < within, "{what}: not within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/dashboard");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// Opens `url` in the page.
    async fn open(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    async fn fill(&self, id: &str, text: &str) {
        let e = self.client.find(Locator::Id(id)).await.expect(id);
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    async fn click(&self, id: &str) {
        self.client
            .find(Locator::Id(id))
            .await
            .expect(id)
            .click()
            .await
            .unwrap();
    }
}

/// A line-protocol HIT on /login from `ip`: whether it was allowed.
fn hit(server: &Server, ip: &str) -> bool {
    parse_ok(&server.line_exchange(format!("HIT path=/login ip={ip}\n").as_bytes())).0
}

/// A script that sets `t` to the text of the limit cell of `rule`'s row
/// in the rules table (null without one), then runs `then`.
fn with_limit(rule: &str, then: &str) -> String {
    format!(
        "const c = document.querySelector('#rules-table tr[data-name=\"{rule}\"] td.limit'); const t = c ? c.textContent : null; {then}"
    )
}

#[tokio::test]
async fn the_page_shows_rules_traffic_offenders_and_changes_knobs() {
    let server = Server::with_policy_args(POLICY, "yaml", &["--admin-token", ADMIN]);
    let b = browser().await;
    let base = format!("http://{}", server.http);
    b.open(&format!("{base}/ui")).await;
    b.until(
        Duration::from_secs(5),
        "overview",
        "return document.body.dataset.ready === '1';",
    )
    .await;
    b.open(&format!("{base}/ui#rules")).await;
    b.until(
        Duration::from_secs(5),
        "the policy's rules",
        "return document.querySelectorAll('#rules-table tbody tr[data-name]').length === 5;",
    )
    .await;
    assert_eq!(
        b.js(&with_limit("login", "return t;")).await,
        json!("5 per 3600s")
    );

    offenders_show(&b, &server, &base).await;
    debts_show(&b, &server, &base).await;
    shadow_shows(&b, &server, &base).await;
    knob_form(&b, &server, &base).await;
    more_views(&b, &base).await;
    // Chromium logs the refused change (a 401 answer) as a failed load: that
    // one is expected, nothing else is.
    let errors: Vec<String> = b
        .errors()
        .await
        .into_iter()
        .filter(|e| !(e.contains("/knobs/login") && e.contains("401")))
        .collect();
    assert!(errors.is_empty(), "console errors: {errors:?}");
}

/// One actor over its limit: the denied rate rises, it leads the offenders;
/// an actor that spells markup is shown as text.
async fn offenders_show(b: &Browser, server: &Server, base: &str) {
    // One actor over its limit: the denied rate rises, it leads the offenders.
    let answers: Vec<bool> = (0..30).map(|_| hit(server, "6.6.6.6")).collect();
    assert_eq!(answers.iter().filter(|a| **a).count(), 5);
    let seen = b
        .until(Duration::from_secs(5), "denied/s on login", "const c = document.querySelector('#rules-table tr[data-name=\"login\"] td.denied'); return !!c && Number(c.textContent) > 0;")
        .await;
    println!("denied traffic shown after {seen:?}");
    b.open(&format!("{base}/ui#rule/login")).await;
    b.until(Duration::from_secs(5), "the actor first among login's offenders", "const r = document.querySelector('#rule-offenders-1m tbody tr'); return !!r && r.dataset.actor === '6.6.6.6' && r.querySelector('.count').textContent === '25';")
        .await;
    b.screenshot("rule").await;
    // Actors are what clients send: shown as text, never as markup.
    let evil = "<b>bold</b><img/src/onerror>";
    for _ in 0..7 {
        hit(server, evil);
    }
    b.until(Duration::from_secs(5), "the markup actor, as text", &format!("const r = document.querySelectorAll('#rule-offenders-1m tbody tr')[1]; return !!r && r.dataset.actor === {evil:?} && r.querySelector('.actor').textContent === {evil:?};"))
        .await;
    assert_eq!(
        b.js("return document.querySelectorAll('#view-rule img, #view-rule b').length;")
            .await,
        json!(0)
    );
    b.open(&format!("{base}/ui#overview")).await;
    b.until(Duration::from_secs(5), "overview offenders", "const r = document.querySelector('#ov-offenders tbody tr td.actor'); return !!r && r.textContent === '6.6.6.6';")
        .await;
    let p99 = b
        .js("return document.getElementById('ov-p99').textContent;")
        .await;
    assert!(p99.as_str().is_some_and(|t| t.ends_with(" µs")), "{p99}");
    b.screenshot("overview").await;
}

/// A usage of 2,500 on an overdraft budget of 1,000: the rule page shows
/// the counter and its debt of 1,500.
async fn debts_show(b: &Browser, server: &Server, base: &str) {
    let mut d = desc(&[("user", "ann")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 2500 });
    let mut client = server.client().await;
    client
        .should_rate_limit(request("llm", vec![d]))
        .await
        .expect("ShouldRateLimit");
    b.open(&format!("{base}/ui#rule/tokens")).await;
    b.until(Duration::from_secs(5), "ann's debt on the rule page", "const s = document.getElementById('rule-debts'); const r = document.querySelector('#rule-debts-table tbody tr'); return !!s && !s.hidden && !!r && r.cells[0].textContent.includes('ann') && r.cells[1].textContent === '1500';")
        .await;
    b.screenshot("rule-debts").await;
}

/// A shadow rule (`matchPolicy: shadow`) of 2 an hour hit 5 times: every
/// hit allowed; the rules table marks it with the shadow badge (and only
/// it), and its page tells the 3 hits that would have been denied.
async fn shadow_shows(b: &Browser, server: &Server, base: &str) {
    let answers: Vec<bool> = (0..5)
        .map(|_| parse_ok(&server.line_exchange(b"HIT path=/beta ip=7.7.7.7\n")).0)
        .collect();
    assert_eq!(answers, [true; 5], "a shadow rule denied a hit");
    b.open(&format!("{base}/ui#rules")).await;
    b.until(
        Duration::from_secs(5),
        "the shadow badge on beta",
        "const s = document.querySelector('#rules-table tr[data-name=\"beta\"] td.limit span.shadow'); return !!s && s.textContent === 'shadow';",
    )
    .await;
    let badged = b
        .js("return [...document.querySelectorAll('#rules-table tbody tr[data-name]')].filter((r) => r.querySelector('span.shadow')).map((r) => r.dataset.name);")
        .await;
    assert_eq!(badged, json!(["beta"]));
    b.open(&format!("{base}/ui#rule/beta")).await;
    b.until(
        Duration::from_secs(5),
        "beta's would-be denials on its page",
        "const t = document.getElementById('rule-limit').textContent; return document.getElementById('rule-name').textContent === 'beta' && t.includes('shadow: 3 hits would have been denied (none was)');",
    )
    .await;
    b.screenshot("rule-shadow").await;
    // A rule that is not shadow says nothing of it.
    b.open(&format!("{base}/ui#rule/login")).await;
    b.until(
        Duration::from_secs(5),
        "login's page",
        "return document.getElementById('rule-name').textContent === 'login' && document.getElementById('rule-limit').textContent.startsWith('limit ');",
    )
    .await;
    let text = b
        .js("return document.getElementById('rule-limit').textContent;")
        .await;
    assert!(
        !text.as_str().unwrap_or_default().contains("shadow"),
        "{text}"
    );
}

/// The knob form: a wrong token changes nothing, the admin token sets a
/// knob the next HIT obeys, and removing it restores the limit.
async fn knob_form(b: &Browser, server: &Server, base: &str) {
    // A wrong admin token: the error shows, nothing changes.
    b.open(&format!("{base}/ui#knobs/login")).await;
    b.fill("knob-credit", "50").await;
    b.fill("admin-token", "not-the-token").await;
    b.click("knob-set").await;
    b.until(
        Duration::from_secs(5),
        "the refusal",
        "return document.getElementById('knob-status').textContent.includes('refused (HTTP 401)');",
    )
    .await;
    let (_, knobs) = server.http("GET", "/knobs", "");
    assert!(knobs.contains(r#""knobs":[]"#), "{knobs}");
    assert!(!hit(server, "6.6.6.6"));

    // The admin token: the rule's row shows the new limit, the next HIT obeys it.
    b.fill("admin-token", ADMIN).await;
    b.click("knob-set").await;
    b.until(Duration::from_secs(5), "the knob set", "return document.getElementById('knob-status').textContent.startsWith('knob set on login');")
        .await;
    b.open(&format!("{base}/ui#rules")).await;
    b.until(
        Duration::from_secs(3),
        "the new limit",
        &with_limit(
            "login",
            "return !!t && t.startsWith('50 per 3600s') && t.includes('knob');",
        ),
    )
    .await;
    assert!(
        hit(server, "6.6.6.6"),
        "the knob's limit lets the next HIT through"
    );
    let stored = b
        .js("return sessionStorage.getItem('divvy.adminToken');")
        .await;
    assert_eq!(stored, json!(ADMIN));
    b.screenshot("rules-with-knob").await;

    // Removing the knob restores the rule's own limit.
    b.open(&format!("{base}/ui#knobs/login")).await;
    b.until(
        Duration::from_secs(3),
        "the knob listed",
        "return !!document.querySelector('#knobs-table tr[data-label=\"login\"]');",
    )
    .await;
    b.click("knob-remove").await;
    b.until(
        Duration::from_secs(5),
        "the knob removed",
        "return document.getElementById('knob-status').textContent === 'knob on login removed';",
    )
    .await;
    b.open(&format!("{base}/ui#rules")).await;
    b.until(
        Duration::from_secs(3),
        "the rule's own limit",
        &with_limit("login", "return t === '5 per 3600s';"),
    )
    .await;
    assert!(!hit(server, "6.6.6.6"));
}

/// Global, RLQS and governors.
async fn more_views(b: &Browser, base: &str) {
    // Global, RLQS and governors: this policy has none (the governors view
    // says so); a governor's state, as /governors gives it, is drawn over time.
    b.open(&format!("{base}/ui#more")).await;
    b.until(Duration::from_secs(5), "no governor", "return document.getElementById('more-governors').textContent === 'no governor in the policy';")
        .await;
    let state = |measurement: f64, breaker: bool| {
        json!({"replica": "r", "governors": [{"rule": "login", "role": "governing", "setpoint": 0.8,
            "measurement": measurement, "output": 40, "breakerOpen": breaker, "lastError": null}]})
    };
    let render = |v: Value| {
        format!("window.divvyRenderGovernors({v}); return document.querySelector('.governor[data-rule=\"login\"] h3').textContent;")
    };
    assert_eq!(
        b.js(&render(state(0.5, false))).await,
        json!("login · governing · breaker closed")
    );
    assert_eq!(
        b.js(&render(state(0.9, true))).await,
        json!("login · governing · breaker open")
    );
}

#[tokio::test]
async fn with_a_read_token_the_api_refuses_and_the_page_asks_for_one() {
    let server = Server::with_policy_args(
        POLICY,
        "yaml",
        &["--admin-token", ADMIN, "--admin-read-token", READ],
    );
    for path in [
        "/api/v1/overview",
        "/api/v1/rules",
        "/api/v1/offenders",
        "/api/v1/rules/login",
    ] {
        let (status, body) = server.http("GET", path, "");
        assert_eq!(status, 401, "{path}: {body}");
        let (status, body) = http_request(
            server.http,
            "GET",
            path,
            "",
            Some(&format!("Bearer {READ}")),
        );
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, page) = server.http("GET", "/ui", "");
    assert_eq!(status, 200);
    assert!(page.contains("A token is needed"), "{page}");

    let b = browser().await;
    b.open(&format!("http://{}/ui#rules", server.http)).await;
    b.until(Duration::from_secs(5), "the token prompt", "return document.body.dataset.ready === 'token' && !document.getElementById('token-prompt').hidden;")
        .await;
    assert_eq!(
        b.js("return document.querySelectorAll('#rules-table tbody tr').length;")
            .await,
        json!(0)
    );
    b.screenshot("token-prompt").await;
    b.fill("read-token", "wrong").await;
    b.click("read-token-save").await;
    b.until(
        Duration::from_secs(5),
        "the wrong token's error",
        "return document.getElementById('token-error').textContent.includes('neither');",
    )
    .await;
    b.fill("read-token", READ).await;
    b.click("read-token-save").await;
    b.until(Duration::from_secs(5), "the rules, read with the token", "return document.querySelectorAll('#rules-table tbody tr[data-name]').length === 5 && document.getElementById('token-prompt').hidden;")
        .await;
    // The refused reads were the page's own 401/403s (logged by Chromium as
    // failed loads); no script error.
    let caught = b.js("return window.__errors;").await;
    assert_eq!(caught, json!([]));
}

#[tokio::test]
async fn ten_thousand_rules_stay_interactive() {
    let mut policy = String::from("overrides:\n");
    for i in 0..10_000 {
        policy.push_str(&format!(
            "  - label: rule-{i:05}\n    operation: {{path: /p{i}}}\n    creditLimit: {}\n    resetSeconds: 60\n",
            i + 1
        ));
    }
    policy.push_str("default: {creditLimit: 100, resetSeconds: 60}\n");
    let server = Server::with_policy(&policy, "yaml");
    // Some traffic, so sparklines have something to draw.
    let hits: String = (0..200)
        .map(|i| format!("HIT path=/p{}\n", i % 7))
        .collect();
    server.line_exchange(hits.as_bytes());
    let b = browser().await;
    b.open(&format!("http://{}/ui#rules", server.http)).await;
    b.until(
        Duration::from_secs(10),
        "the first page of rules",
        "return document.querySelectorAll('#rules-table tbody tr[data-name]').length === 50;",
    )
    .await;
    // From navigation to the first page drawn, as the browser measured it.
    let shown = b.js("return performance.now();").await.as_f64().unwrap();
    println!("10,000 rules: first page shown {shown:.0} ms after navigation");
    b.screenshot("ten-thousand-rules").await;
    // Typing in the filter: rows for the filter's match only.
    let started = Instant::now();
    b.fill("rules-filter", "rule-09999").await;
    let filtered = b
        .until(Duration::from_secs(5), "the filtered rows", "const rows = document.querySelectorAll('#rules-table tbody tr[data-name]'); return rows.length === 1 && rows[0].dataset.name === 'rule-09999';")
        .await;
    println!(
        "10,000 rules: filtered in {:?} (typing included; {filtered:?} waiting)",
        started.elapsed()
    );
    assert!(shown < 1000.0, "first page after {shown} ms");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "filter took {:?}",
        started.elapsed()
    );
    // Sorting by limit, highest first: rule-09999 (10,000 credits) leads.
    b.fill("rules-filter", "").await;
    b.client
        .find(Locator::Css("th[data-sort=limit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.until(Duration::from_secs(3), "sorted by limit", "const r = document.querySelector('#rules-table tbody tr[data-name]'); return !!r && r.dataset.name === 'rule-09999';")
        .await;
    let errors = b.errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
}

/// The API without a browser: an envoyproxy/ratelimit limit's decisions
/// and offenders, sorting, filtering, paging, and refused queries.
#[test]
fn the_api_lists_envoyproxy_ratelimit_limits_sorts_filters_and_refuses_bad_queries() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rl.yaml"),
        "domain: rl\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 2\n",
    )
    .unwrap();
    let server = Server::start(dir.path(), &[]);
    let body = r#"{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"eve"}]}]}"#;
    let codes: Vec<u16> = (0..5)
        .map(|_| server.http("POST", "/json", body).0)
        .collect();
    assert_eq!(codes, [200, 200, 429, 429, 429]);
    let get = |path: &str| -> (u16, Value) {
        let (status, body) = server.http("GET", path, "");
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    };
    let (status, rules) = get("/api/v1/rules?sort=denied&points=90");
    assert_eq!(status, 200);
    let first = &rules["rules"][0];
    assert_eq!(first["kind"], "envoyproxy/ratelimit", "{rules}");
    assert_eq!(first["name"], "rl.user");
    assert_eq!(first["limit"], "2 per hour");
    assert_eq!(first["deniedPerSecond"], json!(0.3));
    assert_eq!(first["history"]["denied"].as_array().unwrap().len(), 90);
    let (_, offenders) = get("/api/v1/offenders?window=1m&rule=rl.user");
    assert_eq!(offenders["offenders"][0]["actor"], "user=eve");
    assert_eq!(offenders["offenders"][0]["count"], 3);
    let (_, one) = get("/api/v1/rules/rl.user");
    assert_eq!(one["offenders"]["15m"][0]["count"], 3);
    assert_eq!(one["history"]["denied"].as_array().unwrap().len(), 900);
    assert_eq!(get("/api/v1/rules/nothing").0, 404);
    let (_, page) = get("/api/v1/rules?filter=RL.&limit=1&offset=0");
    assert_eq!(
        (
            page["matched"].as_u64(),
            page["rules"].as_array().map(Vec::len)
        ),
        (Some(1), Some(1))
    );
    for bad in [
        "/api/v1/rules?sort=size",
        "/api/v1/rules?order=up",
        "/api/v1/offenders?window=2m",
    ] {
        let (status, answer) = get(bad);
        assert_eq!(status, 400, "{bad}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("must be"),
            "{answer}"
        );
    }
    let (_, overview) = get("/api/v1/overview");
    assert_eq!(overview["policy"]["domains"], json!(["rl"]));
    assert_eq!(overview["store"]["name"], "memory");
    assert_eq!(
        overview["configured"],
        json!({"global": false, "governors": false, "rlqsStreams": 0})
    );
    assert_eq!(overview["offenders"][0]["actor"], "user=eve");
    // The p99 is divvy_hit_duration_seconds', which times every engine's
    // decisions: these were envoyproxy/ratelimit's.
    let p99 = overview["p99DecisionSeconds"].as_f64();
    assert!(p99.is_some_and(|s| s > 0.0), "{overview}");
}

/// The overview's store: Redis up, then failing with the failure policy
/// acting, as `/readyz` says.
#[test]
fn the_overview_tells_when_redis_fails_and_which_policy_acts() {
    let mut redis = common::redis::Redis::start();
    let url = redis.url();
    let server = Server::with_policy_args(
        POLICY,
        "yaml",
        &["--redis-url", &url, "--on-store-failure", "local"],
    );
    let store = || -> Value {
        let (status, body) = server.http("GET", "/api/v1/overview", "");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["store"].clone()
    };
    assert!(hit(&server, "1.1.1.1"));
    assert_eq!(
        store(),
        json!({"name": "redis", "up": true, "failurePolicy": "local", "acting": null})
    );
    redis.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Decisions go on (the local policy), and open the breaker.
        hit(&server, "1.1.1.1");
        if store()["up"] == json!(false) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store never showed as failing"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        store(),
        json!({"name": "redis", "up": false, "failurePolicy": "local", "acting": "local"})
    );
}
