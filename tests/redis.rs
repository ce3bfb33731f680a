//! The Redis store against real redis-server processes that each test starts
//! on free loopback ports and kills: decisions, exactness across replicas,
//! failures under each policy, Cluster and a Sentinel failover.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::{Cluster, Redis};
use common::{desc, request, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

const POLICY: &str = r#"
overrides:
  - operation: {k: n}
    creditLimit: 1000
    resetSeconds: 1h
  - operation: {k: ten, who: "*"}
    creditLimit: 10
    resetSeconds: 1h
    actorField: who
  - operation: {k: hundred}
    creditLimit: 100
    resetSeconds: 1h
  - operation: {k: canary}
    matchPolicy: canary
    creditLimit: 1
    resetSeconds: 1h
  - operation: {k: free}
    creditLimit: 5
    resetSeconds: 0
  - operation: {k: blocked}
    creditLimit: 0
default:
  creditLimit: 3
  resetSeconds: 1h
"#;

fn serve(redis_url: Option<&str>, extra: &[&str]) -> Server {
    let mut args: Vec<&str> = Vec::new();
    if let Some(url) = redis_url {
        args.extend(["--redis-url", url]);
    }
    args.extend(extra);
    Server::with_policy_args(POLICY, "yaml", &args)
}

/// One line-protocol connection that sends a line and reads its answer.
struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(server: &Server) -> Conn {
        let stream = TcpStream::connect(server.line).expect("connect");
        // A hang detector, not a timing assertion.
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Conn { stream, reader }
    }

    fn hit(&mut self, line: &str) -> String {
        self.stream
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        let mut answer = String::new();
        self.reader
            .read_line(&mut answer)
            .expect("answered, not hung");
        answer.trim_end().to_owned()
    }
}

/// `(allowed, credits)` of an `OK` answer.
fn parse(answer: &str) -> (bool, u64) {
    let (allowed, credits, _) = common::parse_ok(answer);
    (allowed, credits)
}

fn transcript(server: &Server) -> Vec<String> {
    let mut conn = Conn::open(server);
    let mut out = Vec::new();
    for line in [
        "HIT k=ten who=a",
        "HIT k=ten who=a",
        "HIT k=ten who=b",
        "HIT k=canary",
        "HIT k=canary",
        "HIT k=free",
        "HIT k=blocked",
        "HIT",
        "HIT",
        "HIT",
        "HIT",
        "HIT x=y",
    ] {
        let answer = conn.hit(line);
        // Seconds to reset can differ by one across a second boundary: keep
        // decisions and credits, and the reset's sign.
        let t: Vec<&str> = answer.split(' ').collect();
        let reset = t[3].parse::<i64>().unwrap();
        out.push(format!("{} {} {} {}", t[0], t[1], t[2], reset.signum()));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut client = rt.block_on(server.client());
    let mut descriptor = desc(&[("k", "ten"), ("who", "c")]);
    descriptor.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 4 });
    // Credit given back (Envoy's is_negative_hits), capped at the limit.
    let mut refund = desc(&[("k", "ten"), ("who", "a")]);
    refund.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 5 });
    refund.is_negative_hits = true;
    let r: RateLimitResponse = rt
        .block_on(client.should_rate_limit(request("d", vec![refund.clone(), refund])))
        .unwrap()
        .into_inner();
    out.push(format!(
        "refund {:?}",
        r.statuses
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect::<Vec<_>>()
    ));
    for _ in 0..3 {
        let r: RateLimitResponse = rt
            .block_on(client.should_rate_limit(request(
                "d",
                vec![
                    descriptor.clone(),
                    desc(&[("k", "hundred")]),
                    desc(&[("k", "free")]),
                ],
            )))
            .unwrap()
            .into_inner();
        out.push(format!(
            "{} {:?}",
            r.overall_code,
            r.statuses
                .iter()
                .map(|s| (s.code, s.limit_remaining))
                .collect::<Vec<_>>()
        ));
    }
    out
}

#[test]
fn redis_gives_the_same_decisions_as_the_memory_store() {
    let redis = Redis::start();
    let memory = transcript(&serve(None, &[]));
    let shared = transcript(&serve(Some(&redis.url()), &[]));
    assert_eq!(memory, shared);
    // The counters are in Redis, in divvy's layout: credits left, TTL = window.
    assert_eq!(redis.cli(&["GET", "divvy:k=ten who=*:a:10:3600"]), "10");
    let ttl: i64 = redis
        .cli(&["TTL", "divvy:k=ten who=*:a:10:3600"])
        .parse()
        .unwrap();
    assert!((3590..=3600).contains(&ttl), "{ttl}");
    assert_eq!(redis.cli(&["GET", "divvy:::3:3600"]), "0");
}

#[test]
fn counters_written_by_the_original_layout_are_shared() {
    let redis = Redis::start();
    let server = serve(Some(&redis.url()), &[]);
    let mut conn = Conn::open(&server);
    // An existing divvy deployment left this counter: 2 credits, 100 s left.
    redis.cli(&["SET", "divvy:k=ten who=*:z:10:3600", "2", "EX", "100"]);
    assert_eq!(conn.hit("HIT k=ten who=z"), "OK true 1 100");
    assert_eq!(conn.hit("HIT k=ten who=z"), "OK true 0 100");
    assert_eq!(conn.hit("HIT k=ten who=z"), "OK false 0 100");
}

#[test]
fn a_charge_keeps_the_counters_expiry_and_mends_odd_values() {
    let redis = Redis::start();
    let server = serve(Some(&redis.url()), &[]);
    let mut conn = Conn::open(&server);
    // Charged in place (the TTL Redis holds is kept, not rewritten).
    redis.cli(&["SET", "divvy:k=ten who=*:kept:10:3600", "5", "PX", "100000"]);
    assert_eq!(conn.hit("HIT k=ten who=kept"), "OK true 4 100");
    assert_eq!(redis.cli(&["GET", "divvy:k=ten who=*:kept:10:3600"]), "4");
    let ttl: u64 = redis
        .cli(&["PTTL", "divvy:k=ten who=*:kept:10:3600"])
        .parse()
        .unwrap();
    assert!((90_000..=100_000).contains(&ttl), "PTTL {ttl}");
    // A counter without a TTL gets the window's on its next charge.
    redis.cli(&["SET", "divvy:k=ten who=*:forever:10:3600", "5"]);
    assert_eq!(conn.hit("HIT k=ten who=forever"), "OK true 4 3600");
    let ttl: u64 = redis
        .cli(&["PTTL", "divvy:k=ten who=*:forever:10:3600"])
        .parse()
        .unwrap();
    assert!((3_590_000..=3_600_000).contains(&ttl), "PTTL {ttl}");
    // A number Redis cannot count with is written whole, keeping its expiry.
    redis.cli(&[
        "SET",
        "divvy:k=ten who=*:float:10:3600",
        "5.0",
        "PX",
        "100000",
    ]);
    assert_eq!(conn.hit("HIT k=ten who=float"), "OK true 4 100");
    assert_eq!(redis.cli(&["GET", "divvy:k=ten who=*:float:10:3600"]), "4");
    let ttl: u64 = redis
        .cli(&["PTTL", "divvy:k=ten who=*:float:10:3600"])
        .parse()
        .unwrap();
    assert!((90_000..=100_000).contains(&ttl), "PTTL {ttl}");
}

#[test]
fn a_flushed_script_cache_is_loaded_again() {
    let redis = Redis::start();
    let server = serve(Some(&redis.url()), &["--on-store-failure", "deny"]);
    let mut conn = Conn::open(&server);
    assert_eq!(conn.hit("HIT k=ten who=f"), "OK true 9 3600");
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]), "OK");
    // NOSCRIPT, then the script is loaded again and the call retried once.
    assert_eq!(conn.hit("HIT k=ten who=f"), "OK true 8 3600");
    assert_eq!(redis.cli(&["GET", "divvy:k=ten who=*:f:10:3600"]), "8");
}

#[test]
fn a_foreign_value_under_a_counter_key_harms_nothing_else() {
    let redis = Redis::start();
    // Something else wrote a hash where a counter would live, and a string.
    redis.cli(&["HSET", "divvy:k=ten who=*:h:10:3600", "f", "v"]);
    redis.cli(&["SET", "divvy:k=ten who=*:s:10:3600", "abc"]);
    let server = serve(Some(&redis.url()), &["--on-store-failure", "deny"]);
    // Pipelined with good counters: one script call for the whole batch.
    let answers = server
        .line_exchange(b"HIT k=ten who=ok\nHIT k=ten who=h\nHIT k=ten who=s\nHIT k=ten who=ok\n");
    let got: Vec<(bool, u64)> = answers.lines().map(parse).collect();
    assert_eq!(got, vec![(true, 9), (true, 9), (true, 9), (true, 8)]);
    assert_eq!(redis.cli(&["GET", "divvy:k=ten who=*:ok:10:3600"]), "8");
}

/// `--redis-batches-in-flight` (and its environment variable) takes 1 to
/// 64: anything else stops `divvy serve` with an error naming the range.
#[test]
fn batches_in_flight_outside_1_to_64_is_refused() {
    let refused = |args: &[&str], env: Option<&str>| {
        let mut cmd = std::process::Command::new(common::binary());
        cmd.args(["serve", "--config", "/nonexistent/policy.yaml"])
            .args(args)
            .env_remove("DIVVY_REDIS_BATCHES_IN_FLIGHT");
        if let Some(v) = env {
            cmd.env("DIVVY_REDIS_BATCHES_IN_FLIGHT", v);
        }
        let out = cmd.output().expect("run divvy");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} {env:?} accepted");
        err
    };
    for bad in ["0", "65"] {
        let err = refused(&["--redis-batches-in-flight", bad], None);
        assert!(
            err.contains("--redis-batches-in-flight") && err.contains("1..=64"),
            "{err}"
        );
        let err = refused(&[], Some(bad));
        assert!(err.contains("1..=64"), "{err}");
    }
    // In range, the flag parses: what stops this run is the missing policy.
    let err = refused(&["--redis-batches-in-flight", "64"], None);
    assert!(!err.contains("1..=64"), "{err}");
}

#[test]
fn two_replicas_sharing_redis_allow_exactly_the_limit() {
    let redis = Redis::start();
    // Exactness is Redis's to keep: a hit Redis does not answer within
    // `--redis-timeout-ms` is decided by the failure policy, and `local`
    // (the default) grants up to half the limit on each replica; a loaded
    // machine once starved a replica past the default 100 ms and got 150.
    // A generous timeout keeps the policy out; the metrics show it stayed out.
    let timeout = ["--redis-timeout-ms", "10000"];
    // One script call out at a time on one replica (the default), several
    // on the other, whose calls may reach Redis in any order.
    let a = serve(Some(&redis.url()), &timeout);
    let b = serve(
        Some(&redis.url()),
        &[&timeout[..], &["--redis-batches-in-flight", "4"]].concat(),
    );
    a.wait_for_breaker_closed();
    b.wait_for_breaker_closed();
    let allowed = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..40)
        .map(|i| {
            let addr = if i % 2 == 0 { a.line } else { b.line };
            let allowed = allowed.clone();
            let answered = answered.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                // 50 pipelined hits per connection.
                s.write_all("HIT k=hundred\n".repeat(50).as_bytes())
                    .unwrap();
                let mut reader = BufReader::new(s);
                for _ in 0..50 {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    answered.fetch_add(1, Ordering::SeqCst);
                    if parse(line.trim_end()).0 {
                        allowed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let allowed = allowed.load(Ordering::SeqCst);
    assert_eq!(answered.load(Ordering::SeqCst), 2000);
    let (by_policy_a, by_policy_b) = (a.policy_decisions(), b.policy_decisions());
    assert!(
        by_policy_a.is_empty() && by_policy_b.is_empty(),
        "not an exactness failure: Redis did not decide every hit (slower than \
         --redis-timeout-ms {}, or failing), so the failure policy did; \
         {allowed} allowed of 100; replica a: {by_policy_a:?}, replica b: {by_policy_b:?}",
        timeout[1]
    );
    assert_eq!(
        allowed, 100,
        "an exactness bug: Redis decided every hit (no failure-policy decision), \
         yet {allowed} were allowed for a limit of 100"
    );
    assert_eq!(redis.cli(&["GET", "divvy:k=hundred::100:3600"]), "0");
}

/// Hits `k=n` continuously on one connection until `stop`; every answer must
/// be an `OK` line (none lost, none hung). Returns how many were answered.
fn background_load(server: &Server, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    let addr = server.line;
    std::thread::spawn(move || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            w.write_all(b"HIT k=n\n").unwrap();
            let mut line = String::new();
            reader
                .read_line(&mut line)
                .expect("answered under load, not hung");
            assert!(line.starts_with("OK "), "{line:?}");
            n += 1;
        }
        n
    })
}

/// Polls until `server` decides from Redis again: a fresh counter shows up there.
fn wait_for_recovery(server: &Server, redis_port: u16, probe: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut conn = Conn::open(server);
    loop {
        conn.hit(&format!("HIT k=ten who={probe}"));
        if common::redis::cli(
            redis_port,
            &["EXISTS", &format!("divvy:k=ten who=*:{probe}:10:3600")],
        ) == "1"
        {
            return;
        }
        assert!(Instant::now() < deadline, "no recovery within 15 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn outage(pause: bool) {
    let mut redis = Redis::start();
    let url = redis.url();
    let servers: Vec<(&str, Server)> = ["allow", "deny", "local"]
        .into_iter()
        .map(|p| {
            (
                p,
                serve(
                    Some(&url),
                    &["--on-store-failure", p, "--redis-timeout-ms", "100"],
                ),
            )
        })
        .collect();
    for (policy, s) in &servers {
        let mut c = Conn::open(s);
        assert_eq!(
            c.hit(&format!("HIT k=ten who=before-{policy}")),
            "OK true 9 3600"
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = servers
        .iter()
        .map(|(_, s)| background_load(s, stop.clone()))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    if pause {
        redis.pause();
    } else {
        redis.kill();
    }
    for (policy, s) in &servers {
        let mut c = Conn::open(s);
        let line = format!("HIT k=ten who=during-{policy}");
        let got: Vec<(bool, u64)> = (0..8).map(|_| parse(&c.hit(&line))).collect();
        let allowed: Vec<bool> = got.iter().map(|g| g.0).collect();
        match *policy {
            "allow" => assert_eq!(allowed, vec![true; 8], "{policy}"),
            "deny" => assert_eq!(allowed, vec![false; 8], "{policy}"),
            // Limit 10 at the default share 0.5: 5 local credits.
            _ => assert_eq!(
                allowed,
                [vec![true; 5], vec![false; 3]].concat(),
                "{policy}: {got:?}"
            ),
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    if pause {
        redis.resume();
    } else {
        redis.restart();
    }
    for (i, (_, s)) in servers.iter().enumerate() {
        wait_for_recovery(s, redis.port, &format!("after{i}"));
    }
    stop.store(true, Ordering::SeqCst);
    for l in loads {
        assert!(l.join().unwrap() > 0);
    }
    if pause {
        // The data survived the pause: the first counter continues.
        let mut c = Conn::open(&servers[0].1);
        assert_eq!(parse(&c.hit("HIT k=ten who=before-allow")), (true, 8));
    }
}

#[test]
fn redis_killed_under_load_then_restarted_empty() {
    outage(false);
}

#[test]
fn redis_paused_under_load_then_resumed() {
    outage(true);
}

#[test]
fn a_dead_redis_at_startup_does_not_stop_the_service() {
    let port = common::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let server = serve(Some(&url), &["--on-store-failure", "deny"]);
    let mut c = Conn::open(&server);
    assert_eq!(parse(&c.hit("HIT k=ten who=x")), (false, 0));
    // Then Redis appears on that port, and the service uses it.
    let redis = Redis::start_with_port(port);
    wait_for_recovery(&server, redis.port, "late");
}

#[test]
fn cluster_of_three_masters() {
    let cluster = Cluster::start(3);
    let server = serve(Some(&cluster.url()), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut client = rt.block_on(server.client());
    let actors: Vec<String> = (0..30).map(|i| format!("actor{i}")).collect();
    let descriptors: Vec<_> = actors
        .iter()
        .map(|a| desc(&[("k", "ten"), ("who", a.as_str())]))
        .collect();
    for round in 1..=3u32 {
        let r = rt
            .block_on(client.should_rate_limit(request("d", descriptors.clone())))
            .unwrap()
            .into_inner();
        assert_eq!(r.statuses.len(), 30);
        for s in &r.statuses {
            assert_eq!((s.code, s.limit_remaining), (1, 10 - round));
        }
    }
    // The counters are spread over the masters.
    let holding = cluster
        .nodes
        .iter()
        .filter(|n| n.cli(&["DBSIZE"]).parse::<u64>().unwrap_or(0) > 0)
        .count();
    assert!(holding >= 2, "counters on {holding} node(s)");
    let mut c = Conn::open(&server);
    assert_eq!(parse(&c.hit("HIT k=ten who=actor7")), (true, 6));
    // Requests on one counter arriving together go out batched (per hash
    // slot): 30 connections, 3 HITs each, on one limit of 100, at once.
    let calls = |c: &Cluster| -> u64 {
        c.nodes
            .iter()
            .flat_map(|n| {
                let info = n.cli(&["INFO", "commandstats"]);
                info.lines()
                    .filter(|l| l.starts_with("cmdstat_evalsha:"))
                    .filter_map(|l| {
                        l.split("calls=")
                            .nth(1)?
                            .split(',')
                            .next()?
                            .parse::<u64>()
                            .ok()
                    })
                    .collect::<Vec<_>>()
            })
            .sum()
    };
    let before = calls(&cluster);
    let go = std::sync::Arc::new(std::sync::Barrier::new(30));
    let threads: Vec<_> = (0..30)
        .map(|_| {
            let (go, mut c) = (go.clone(), Conn::open(&server));
            std::thread::spawn(move || {
                go.wait();
                (0..3)
                    .map(|_| parse(&c.hit("HIT k=hundred")))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut left: Vec<u64> = Vec::new();
    for t in threads {
        for (allowed, remaining) in t.join().unwrap() {
            assert!(allowed);
            left.push(remaining);
        }
    }
    left.sort_unstable();
    assert_eq!(
        left,
        (10..100).collect::<Vec<u64>>(),
        "each credit taken once"
    );
    println!(
        "90 HITs on one counter from 30 connections at once: {} script calls over the cluster",
        calls(&cluster) - before
    );
}

#[test]
fn sentinel_failover_is_followed() {
    let master = Redis::start();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let sentinel = Redis::sentinel(master.port, "divvymaster");
    // Wait until the replica is in sync and the sentinel knows it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !replica
        .cli(&["INFO", "replication"])
        .contains("master_link_status:up")
        || !sentinel
            .cli(&["SENTINEL", "replicas", "divvymaster"])
            .contains(&replica.port.to_string())
    {
        assert!(
            Instant::now() < deadline,
            "replication or sentinel not ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let url = format!("redis+sentinel://127.0.0.1:{}/divvymaster", sentinel.port);
    let server = serve(Some(&url), &["--on-store-failure", "deny"]);
    let mut c = Conn::open(&server);
    assert_eq!(c.hit("HIT k=ten who=s"), "OK true 9 3600");
    assert_eq!(c.hit("HIT k=ten who=s"), "OK true 8 3600");
    master.cli(&["WAIT", "1", "2000"]);
    let mut master = master;
    master.kill();
    // The sentinel promotes the replica; the service follows it.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (allowed, left) = parse(&c.hit("HIT k=ten who=s"));
        if allowed {
            assert_eq!(left, 7, "the counter continued on the promoted replica");
            break;
        }
        assert!(Instant::now() < deadline, "no failover within 40 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(replica.cli(&["GET", "divvy:k=ten who=*:s:10:3600"]), "7");
    assert!(replica
        .cli(&["INFO", "replication"])
        .contains("role:master"));
}

/// Sentinel nodes with a password of their own and a master with another:
/// the URL's `sentinelPassword` reaches the Sentinel and its user password
/// the master. Without `sentinelPassword` the master's password is offered
/// to the Sentinel, which refuses it: the store is failing.
#[test]
fn a_sentinel_with_a_password_of_its_own() {
    let master = Redis::start_with_password("master-pw");
    let sentinel =
        Redis::sentinel_with_password(master.port, "mm", "master-pw", Some("sentinel+pw"));
    let url = format!(
        "redis+sentinel://:master-pw@127.0.0.1:{}/mm?sentinelPassword=sentinel%2Bpw",
        sentinel.port
    );
    let server = serve(Some(&url), &["--on-store-failure", "deny"]);
    let mut c = Conn::open(&server);
    assert_eq!(c.hit("HIT k=ten who=s"), "OK true 9 3600");
    assert_eq!(master.cli(&["GET", "divvy:k=ten who=*:s:10:3600"]), "9");
    let without = format!("redis+sentinel://:master-pw@127.0.0.1:{}/mm", sentinel.port);
    let server = serve(
        Some(&without),
        &["--on-store-failure", "deny", "--redis-timeout-ms", "200"],
    );
    // Time enough to connect, were the credentials right (the first
    // server answered from Redis at once).
    std::thread::sleep(Duration::from_secs(1));
    let mut c = Conn::open(&server);
    assert!(!parse(&c.hit("HIT k=ten who=s")).0, "denied: no store");
    assert_eq!(master.cli(&["GET", "divvy:k=ten who=*:s:10:3600"]), "9");
}

/// The common layout: a master with a password behind Sentinels without
/// one. The URL's password is offered to the Sentinel too, which refuses it;
/// the client goes on unauthenticated there and reaches the master.
#[test]
fn an_open_sentinel_in_front_of_a_master_with_a_password() {
    let master = Redis::start_with_password("master-pw");
    let sentinel = Redis::sentinel_with_password(master.port, "mm", "master-pw", None);
    let url = format!("redis+sentinel://:master-pw@127.0.0.1:{}/mm", sentinel.port);
    let server = serve(Some(&url), &["--on-store-failure", "deny"]);
    let mut c = Conn::open(&server);
    assert_eq!(c.hit("HIT k=ten who=s"), "OK true 9 3600");
    assert_eq!(master.cli(&["GET", "divvy:k=ten who=*:s:10:3600"]), "9");
}
