//! A fleet: three `switchyard serve` replicas on one PostgreSQL schema and one Redis, behind a real
//! nginx on loopback, as an operator would run them. What one replica learns (an open breaker, a
//! session pin) reaches the others; capacity that every replica spends (a quota, concurrency
//! slots) is never over-admitted, counted at the upstream; a replica killed mid-load costs the
//! clients nothing but the requests it was serving, and a replacement picks up the shared state.
//!
//! Needs Redis at 127.0.0.1:6379 (`redis-server --daemonize yes`) and PostgreSQL as the other
//! PostgreSQL tests do; nginx is installed from Debian's packages when missing.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, PgSchema, chat_body};

const TOKEN: &str = "fleet-admin-token";
const REDIS_URL: &str = "redis://127.0.0.1:6379";
const REPLICAS: usize = 3;

/// Generous bound for anything the fleet does "within milliseconds": the test machine is small
/// and shared, and the point is that it happens at all, not a latency figure (which is printed).
const PROPAGATION_BOUND: Duration = Duration::from_secs(5);

/// An nginx in front of the replicas, with its config, logs and temp files in its own folder.
struct Nginx {
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

/// nginx's binary, installed from Debian's packages (as `bench/run.py` does) when missing. One
/// test installs at a time.
fn nginx_binary() -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let installed = PathBuf::from("/usr/sbin/nginx");
    if installed.exists() {
        return installed;
    }
    let apt = |args: &[&str]| {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("apt-get is needed to install nginx for the fleet tests");
        assert!(status.success(), "apt-get {args:?} failed: {status}");
    };
    apt(&["update", "-qq"]);
    apt(&["install", "-y", "-qq", "nginx"]);
    assert!(
        installed.exists(),
        "nginx was installed but is not at {installed:?}"
    );
    installed
}

/// A loopback port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

impl Nginx {
    fn start(backends: &[u16]) -> Nginx {
        let binary = nginx_binary();
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let d = dir.path().display();
        let servers: String = backends
            .iter()
            .map(|p| format!("    server 127.0.0.1:{p} max_fails=0;\n"))
            .collect();
        // One process in the foreground, so the test owns it. `proxy_next_upstream error
        // timeout` retries on the next replica only what never reached one: nginx does not pass
        // a POST on once it was sent (that needs `non_idempotent`), and 5xx answers are not in
        // the list, so a replica's error reaches the client as it would without nginx.
        // `max_fails=0` keeps nginx offering requests to a replica that stopped answering
        // instead of resting it, so a dead replica's share of the load goes through that retry.
        // No `keepalive` to the replicas: a POST written to a cached connection that the kill
        // had closed (nginx not having noticed yet) fails as if the replica had taken it, since
        // nginx never passes on a POST it has written; that is nginx's, not the fleet's, and
        // would blur what this test counts.
        // The access log ties each client request (its `x-test-id`) to the replicas it was sent
        // to.
        let config = format!(
            "daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 1024; }}
http {{
  log_format fleet '$http_x_test_id $status $upstream_addr $upstream_status';
  access_log {d}/access.log fleet;
  client_body_temp_path {d}/client_body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  upstream fleet {{
{servers}  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://fleet;
      proxy_http_version 1.1;
      proxy_next_upstream error timeout;
      proxy_next_upstream_tries 3;
      proxy_connect_timeout 2s;
      proxy_read_timeout 60s;
    }}
  }}
}}
"
        );
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, config).expect("write nginx.conf");
        let child = Command::new(binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            // The startup log, before the config's `error_log` applies, stays in the folder too.
            .arg("-e")
            .arg(dir.path().join("startup.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        let mut nginx = Nginx { port, child, dir };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = nginx.child.try_wait().expect("wait for nginx") {
                panic!("nginx exited at startup ({status}):\n{}", nginx.logs());
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "nginx did not listen within 10 s:\n{}",
                nginx.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        nginx
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    fn logs(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "--- nginx startup.log ---\n{}--- nginx error.log ---\n{}",
            read("startup.log"),
            read("error.log")
        )
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// Three replicas sharing one schema and one Redis prefix, and the nginx in front of them.
/// Fields drop in order: nginx, then the replicas, then the schema they use.
struct Fleet {
    nginx: Nginx,
    replicas: Vec<Gateway>,
    /// What every replica (and a replacement) is started with.
    body: String,
    env: Vec<(String, String)>,
    schema: PgSchema,
}

impl Fleet {
    /// Starts the fleet with `models_yaml` (the config after `server:` and `fleet:`) and waits
    /// until every replica shares state: one that has not joined yet would drop what it learns.
    async fn start(models_yaml: &str, env: &[(&str, &str)]) -> Fleet {
        let schema = PgSchema::create().await;
        let prefix = format!("sy-e2e-{:016x}", rand::random::<u64>());
        let body = format!(
            "server:
  admin_token: {TOKEN}
fleet:
  redis_url: {REDIS_URL}
  key_prefix: {prefix}
  deadline_ms: 200
  backlog_publish_ms: 100
{models_yaml}"
        );
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut replicas = Vec::new();
        // One at a time: the first one migrates the schema.
        for _ in 0..REPLICAS {
            replicas.push(start_replica(&schema, &body, &env));
        }
        let ports: Vec<u16> = replicas.iter().map(|g| g.port).collect();
        let fleet = Fleet {
            nginx: Nginx::start(&ports),
            replicas,
            body,
            env,
            schema,
        };
        for replica in &fleet.replicas {
            joined(replica, REPLICAS as u64).await;
        }
        fleet
    }

    /// Another replica on the same schema and Redis prefix (not behind nginx).
    fn start_replica(&self) -> Gateway {
        start_replica(&self.schema, &self.body, &self.env)
    }

    /// Sends a chat request through nginx, tagged so nginx's access log can name it; the status,
    /// or `None` when no HTTP answer came.
    async fn chat(&self, client: &reqwest::Client, model: &str, id: &str) -> Option<u16> {
        client
            .post(self.nginx.url("/v1/chat/completions"))
            .header("x-test-id", id)
            .json(&chat_body(model, false))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// The sum over the replicas of a counter in `/health/deep`'s `fleet` section, by its JSON
    /// pointer (`/events/received`).
    async fn fleet_counter(&self, pointer: &str) -> u64 {
        let mut sum = 0;
        for replica in &self.replicas {
            let deep = replica.deep(TOKEN).await;
            sum += deep["fleet"]
                .pointer(pointer)
                .and_then(Value::as_u64)
                .unwrap_or(0);
        }
        sum
    }
}

fn start_replica(schema: &PgSchema, body: &str, env: &[(String, String)]) -> Gateway {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Gateway::start_on(Some(&schema.url), body, &env)
}

/// Polls `probe` every 10 ms until it gives `Ok`, for at most `within`; the value and how long it
/// took. An `Err` describes what the probe saw, for the failure message.
async fn wait_for<T, F, Fut>(within: Duration, what: &str, mut probe: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match probe().await {
            Ok(value) => return (value, start.elapsed()),
            Err(state) => assert!(
                start.elapsed() < within,
                "{what}: not within {within:?}; last seen: {state}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `replica` is connected to Redis and sees `replicas` fresh replicas (itself
/// included).
async fn joined(replica: &Gateway, replicas: u64) {
    wait_for(
        Duration::from_secs(20),
        "the replica joins the fleet",
        || async {
            let fleet = replica.deep(TOKEN).await["fleet"].clone();
            if fleet["connected"] == true
                && fleet["state"] == "shared"
                && fleet["replicas_seen"].as_u64() >= Some(replicas)
            {
                Ok(())
            } else {
                Err(fleet.to_string())
            }
        },
    )
    .await;
}

/// The endpoint id of a YAML route at `mock`.
fn endpoint(model: &str, mock: &Mock) -> String {
    format!("{model}:local-{}", mock.port)
}

/// `endpoint`'s breaker state in `replica`'s `/health/deep` (`None` before it has one).
async fn circuit(replica: &Gateway, endpoint: &str) -> Option<String> {
    let deep = replica.deep(TOKEN).await;
    deep["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["endpoint_id"] == endpoint)
        .and_then(|e| e["circuit"].as_str())
        .map(str::to_owned)
}

/// Waits until `replica` reports `endpoint`'s breaker open; how long that took.
async fn open_in(replica: &Gateway, endpoint: &str, what: &str) -> Duration {
    wait_for(PROPAGATION_BOUND, what, || async {
        match circuit(replica, endpoint).await {
            Some(c) if c == "open" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .1
}

/// Two routes, the one at `first` tried first; a breaker that opens after three failures and
/// stays open for `cooldown_seconds`.
fn primary_and_fallback(first: &Mock, fallback: &Mock, cooldown_seconds: u32) -> String {
    format!(
        "health:
  failure_threshold: 3
  cooldown_seconds: {cooldown_seconds}
models:
  - id: m
    route:
      - kind: openai_compat
        base_url: {}
        priority: 1
      - kind: openai_compat
        base_url: {}
",
        first.base_url(),
        fallback.base_url()
    )
}

/// Fails `primary` and sends requests straight to `replica` until its breaker for it opens; every
/// request is still answered (by the fallback).
async fn trip_breaker(replica: &Gateway, primary: &Mock) {
    primary.behave(json!({ "fail_status": 500 })).await;
    let id = endpoint("m", primary);
    for _ in 0..20 {
        let (status, answer) = replica.chat(chat_body("m", false)).await;
        assert_eq!(status, 200, "the fallback answers: {answer}");
        if circuit(replica, &id).await.as_deref() == Some("open") {
            return;
        }
    }
    panic!(
        "the breaker for {id} did not open: {:?}",
        circuit(replica, &id).await
    );
}

const NO_AFFINITY: &[(&str, &str)] = &[("ROUTING_AFFINITY_ENABLED", "0")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_opened_by_one_replica_is_open_in_all() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let fleet = Fleet::start(&primary_and_fallback(&a, &b, 60), NO_AFFINITY).await;
    let a_id = endpoint("m", &a);

    trip_breaker(&fleet.replicas[0], &a).await;
    let opened = Instant::now();
    for (i, replica) in fleet.replicas.iter().enumerate().skip(1) {
        open_in(
            replica,
            &a_id,
            &format!("replica {i} sees A's breaker open"),
        )
        .await;
        println!(
            "breaker propagation: replica {i} reports A open {} ms after replica 0 did",
            opened.elapsed().as_millis()
        );
    }
    let a_before = a.chat_requests().await;
    assert!(a_before >= 3, "A was tried until its breaker opened");

    // Whichever replica nginx picks skips A without trying it.
    let client = reqwest::Client::new();
    for i in 0..30 {
        let status = fleet.chat(&client, "m", &format!("after-{i}")).await;
        assert_eq!(status, Some(200), "request {i} through nginx");
    }
    assert_eq!(
        a.chat_requests().await,
        a_before,
        "no replica sent a request to A while its breaker is open"
    );
    assert!(b.chat_requests().await >= 30);
    let received = fleet.fleet_counter("/events/received").await;
    assert!(
        received >= 2,
        "the others heard of it from replica 0 ({received} events received)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_pool_is_never_over_admitted_across_replicas() {
    let quota = Mock::start(&[]);
    let fallback = Mock::start(&[]);
    let fleet = Fleet::start(
        &format!(
            "models:
  - id: m
    route:
      - kind: openai_compat
        base_url: {}
        priority: 1
        metadata: {{ provider_type: quota, quota: {{ limit: 10 }} }}
      - kind: openai_compat
        base_url: {}
",
            quota.base_url(),
            fallback.base_url()
        ),
        NO_AFFINITY,
    )
    .await;

    // Every replica races for the same ten units at once.
    const REQUESTS: u64 = 60;
    let client = reqwest::Client::new();
    let fleet = Arc::new(fleet);
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let (fleet, client) = (fleet.clone(), client.clone());
            tokio::spawn(async move { fleet.chat(&client, "m", &format!("q-{i}")).await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        assert_eq!(task.await.unwrap(), Some(200), "request {i}");
    }
    let (sent_to_quota, sent_to_fallback) =
        (quota.chat_requests().await, fallback.chat_requests().await);
    let timeouts = fleet.fleet_counter("/admission_timeouts").await;
    let fallbacks = fleet.fleet_counter("/local_fallbacks").await;
    println!(
        "quota pool of 10: the quota upstream received {sent_to_quota}, the fallback \
         {sent_to_fallback} (admission timeouts {timeouts}, local fallbacks {fallbacks})"
    );
    assert_eq!(fallbacks, 0, "Redis answered throughout");
    assert!(
        sent_to_quota <= 10,
        "over-admission: {sent_to_quota} requests reached a pool of 10"
    );
    assert_eq!(sent_to_quota + sent_to_fallback, REQUESTS);
    // An admission that timed out may still have been counted in Redis: under-use is the
    // documented price of a slow Redis, never overspending.
    if timeouts == 0 {
        assert_eq!(sent_to_quota, 10, "the whole pool was used");
    }

    // The pool stays spent.
    for i in 0..5 {
        assert_eq!(
            fleet.chat(&client, "m", &format!("later-{i}")).await,
            Some(200)
        );
    }
    assert_eq!(quota.chat_requests().await, sent_to_quota);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_is_one_limit_for_the_whole_fleet() {
    let upstream = Mock::start(&[]);
    // Six a minute: one every 10 s after the burst, so a burst that takes seconds admits six.
    let fleet = Fleet::start(
        &format!(
            "routes:
  - name: open
    path_prefix: /
    disable_auth: true
    plugins:
      rate-limit:
        limits:
          - scope: route
            requests_per_minute: 6
models:
  - id: m
    route:
      - kind: openai_compat
        base_url: {}
",
            upstream.base_url()
        ),
        NO_AFFINITY,
    )
    .await;
    const REQUESTS: usize = 30;
    let client = reqwest::Client::new();
    let fleet = Arc::new(fleet);
    let started = Instant::now();
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let (fleet, client) = (fleet.clone(), client.clone());
            tokio::spawn(async move { fleet.chat(&client, "m", &format!("rl-{i}")).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    let served = statuses.iter().filter(|s| **s == Some(200)).count() as u64;
    let refused = statuses.iter().filter(|s| **s == Some(429)).count();
    assert_eq!(served as usize + refused, REQUESTS, "{statuses:?}");
    let received = upstream.chat_requests().await;
    let timeouts = fleet.fleet_counter("/admission_timeouts").await;
    let fallbacks = fleet.fleet_counter("/local_fallbacks").await;
    println!(
        "rpm 6 on three replicas: {served} served, {refused} refused in {elapsed:?}; the upstream \
         received {received} (timeouts {timeouts}, local fallbacks {fallbacks})"
    );
    assert_eq!(
        received, served,
        "every admitted request, and only those, reached the upstream"
    );
    assert_eq!(fallbacks, 0, "Redis answered throughout");
    // Per replica the limit would admit 18; the fleet admits the limit, plus what GCRA gives back
    // while the burst lasts (one every 10 s).
    let allowed = 6 + elapsed.as_secs() / 10;
    assert!(served <= allowed, "over-admission: {served} > {allowed}");
    if timeouts == 0 {
        assert!(served >= 6, "the limit was used: {served}");
    }
}

/// A stand-in upstream that answers Chat Completions after `delay` and records the most requests
/// it ever had in flight at once (the mock does not count that).
struct SlowUpstream {
    port: u16,
    in_flight: Arc<AtomicU64>,
    max_in_flight: Arc<AtomicU64>,
    served: Arc<AtomicU64>,
}

impl SlowUpstream {
    async fn start(delay: Duration) -> SlowUpstream {
        let in_flight = Arc::new(AtomicU64::new(0));
        let max_in_flight = Arc::new(AtomicU64::new(0));
        let served = Arc::new(AtomicU64::new(0));
        let handler = {
            let (in_flight, max_in_flight, served) =
                (in_flight.clone(), max_in_flight.clone(), served.clone());
            move || {
                let (in_flight, max_in_flight, served) =
                    (in_flight.clone(), max_in_flight.clone(), served.clone());
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    max_in_flight.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    served.fetch_add(1, Ordering::SeqCst);
                    axum::Json(json!({
                        "id": "chatcmpl-slow",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "m",
                        "choices": [{
                            "index": 0,
                            "message": { "role": "assistant", "content": "slow hello" },
                            "finish_reason": "stop"
                        }],
                        "usage": { "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5 }
                    }))
                }
            }
        };
        let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        SlowUpstream {
            port,
            in_flight,
            max_in_flight,
            served,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_pool_never_has_more_in_flight_than_its_slots() {
    let slow = SlowUpstream::start(Duration::from_millis(400)).await;
    let fallback = Mock::start(&[]);
    let fleet = Fleet::start(
        &format!(
            "models:
  - id: m
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:{}/v1
        priority: 1
        metadata: {{ provider_type: concurrency, concurrency: {{ limit: 2 }} }}
      - kind: openai_compat
        base_url: {}
",
            slow.port,
            fallback.base_url()
        ),
        NO_AFFINITY,
    )
    .await;

    // Three waves of twelve at once: each wave finds the slots the previous one gave back.
    let client = reqwest::Client::new();
    let fleet = Arc::new(fleet);
    for wave in 0..3 {
        let tasks: Vec<_> = (0..12)
            .map(|i| {
                let (fleet, client) = (fleet.clone(), client.clone());
                tokio::spawn(
                    async move { fleet.chat(&client, "m", &format!("c-{wave}-{i}")).await },
                )
            })
            .collect();
        for (i, task) in tasks.into_iter().enumerate() {
            assert_eq!(task.await.unwrap(), Some(200), "wave {wave}, request {i}");
        }
    }
    let (max, served) = (
        slow.max_in_flight.load(Ordering::SeqCst),
        slow.served.load(Ordering::SeqCst),
    );
    println!(
        "concurrency pool of 2: at most {max} in flight at the upstream, {served} served there, \
         {} by the fallback",
        fallback.chat_requests().await
    );
    assert!(max <= 2, "{max} requests in flight at a pool of 2 slots");
    assert!(served >= 2, "the slotted route was used ({served})");
    assert_eq!(slow.in_flight.load(Ordering::SeqCst), 0);
    assert_eq!(served + fallback.chat_requests().await, 36);
}

/// Which mock answered (its reply names its port).
fn served_by(answer: &Value, mocks: &[&Mock]) -> Option<u16> {
    let text = answer["choices"][0]["message"]["content"].as_str()?;
    mocks
        .iter()
        .map(|m| m.port)
        .find(|port| text.contains(&format!("port {port}.")))
}

async fn chat_as(url: &str, key: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(key)
        .json(&chat_body("m", false))
        .send()
        .await
        .expect("reachable");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_agrees_on_a_callers_pinned_endpoint() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let fleet = Fleet::start(
        &format!(
            "models:
  - id: m
    route:
      - kind: openai_compat
        base_url: {}
      - kind: openai_compat
        base_url: {}
",
            a.base_url(),
            b.base_url()
        ),
        &[("ROUTING_AFFINITY_ENABLED", "1")],
    )
    .await;

    // Several callers, so that replicas choosing on their own would disagree on some of them
    // (equal weights: each replica's own draw is a coin toss).
    const CALLERS: usize = 8;
    let keys: Vec<String> = (0..CALLERS)
        .map(|i| format!("sk-fleet-caller-{i}"))
        .collect();
    let mut pinned = Vec::new();
    for key in &keys {
        let (status, answer) = chat_as(&fleet.replicas[0].url("/v1/chat/completions"), key).await;
        assert_eq!(status, 200, "{answer}");
        pinned.push(served_by(&answer, &[&a, &b]).expect("a mock answered"));
    }
    println!("first requests through replica 0 pinned the callers to {pinned:?}");

    // The pins are announced, not read on the request path: wait until they have arrived
    // before asking the others, or a replica would choose (and pin) on its own.
    for (i, replica) in fleet.replicas.iter().enumerate().skip(1) {
        wait_for(PROPAGATION_BOUND, "the pins reach the replica", || async {
            let records = replica.deep(TOKEN).await["affinity_records"]
                .as_u64()
                .unwrap_or(0);
            if records >= CALLERS as u64 {
                Ok(())
            } else {
                Err(format!("replica {i}: {records} affinity records"))
            }
        })
        .await;
    }

    for (key, &port) in keys.iter().zip(&pinned) {
        for (i, replica) in fleet.replicas.iter().enumerate().skip(1) {
            for _ in 0..3 {
                let (status, answer) = chat_as(&replica.url("/v1/chat/completions"), key).await;
                assert_eq!(status, 200, "{answer}");
                assert_eq!(
                    served_by(&answer, &[&a, &b]),
                    Some(port),
                    "replica {i} sends {key} where replica 0 pinned it"
                );
            }
        }
        // And through nginx, whichever replica takes each request.
        for _ in 0..6 {
            let (status, answer) = chat_as(&fleet.nginx.url("/v1/chat/completions"), key).await;
            assert_eq!(status, 200, "{answer}");
            assert_eq!(served_by(&answer, &[&a, &b]), Some(port), "{key} via nginx");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_replica_mid_load_costs_only_its_in_flight_requests() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    // The breaker stays open far longer than the test, so the replacement can only know of it
    // from the fleet's kept record.
    let mut fleet = Fleet::start(&primary_and_fallback(&a, &b, 600), NO_AFFINITY).await;
    let a_id = endpoint("m", &a);
    trip_breaker(&fleet.replicas[0], &a).await;
    for replica in &fleet.replicas {
        open_in(replica, &a_id, "every replica sees A's breaker open").await;
    }
    let a_before = a.chat_requests().await;

    // Four clients loop through nginx until told to stop; each failure keeps its request id and
    // when it was sent.
    let nginx_url = fleet.nginx.url("/v1/chat/completions");
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (url, stop) = (nginx_url.clone(), stop.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let (mut ok, mut failed) = (0u64, Vec::new());
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = format!("load-{c}-{n}");
                    n += 1;
                    let sent = Instant::now();
                    let status = client
                        .post(&url)
                        .header("x-test-id", &id)
                        .json(&chat_body("m", false))
                        .send()
                        .await
                        .map(|r| r.status().as_u16());
                    match status {
                        Ok(200) => ok += 1,
                        other => failed.push((id, sent, format!("{other:?}"))),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut victim = fleet.replicas.remove(2);
    let victim_addr = format!("127.0.0.1:{}", victim.port);
    let status = Command::new("kill")
        .args(["-KILL", &victim.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    // Until the process is reaped its listening socket may still take connections (the kernel
    // closes it while tearing the process down), so a request is known not to have reached the
    // replica only if it was sent after that.
    let reaped = tokio::task::block_in_place(|| victim.wait_exit(Duration::from_secs(10)));
    assert!(reaped.is_some(), "the killed replica did not exit");
    let gone = Instant::now();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for client in clients {
        let (o, f) = client.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    drop(victim);

    // A request may fail only if the killed replica had it: sent before the replica was gone,
    // by nginx to that replica and nowhere else (a POST that reached a replica is not passed
    // on). One that nginx could not hand to the dead replica was passed on to another (two
    // addresses in the access log).
    let access = fleet.nginx.access_log();
    let upstreams_of = |line: &str| line.split(' ').skip(2).collect::<Vec<_>>().join(" ");
    let passed_on = access
        .lines()
        .filter(|l| upstreams_of(l).starts_with(&format!("{victim_addr}, ")))
        .count();
    // How nginx lost each of them, for the record.
    let lost: Vec<String> = fleet
        .nginx
        .error_log()
        .lines()
        .filter(|l| l.contains(&victim_addr) && !l.contains("connect() failed"))
        .map(|l| l.split('*').nth(1).unwrap_or(l).to_owned())
        .collect();
    println!(
        "load through nginx: {ok} answered 200, {} failed ({:?}); {passed_on} passed on by \
         nginx from the dead replica to a live one; nginx on the failures: {lost:#?}",
        failed.len(),
        failed.iter().map(|f| (&f.0, &f.2)).collect::<Vec<_>>(),
    );
    for (id, sent, outcome) in &failed {
        let line = access
            .lines()
            .find(|l| l.split(' ').next() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id} ({outcome}) is not in nginx's access log:\n{access}"));
        assert!(
            *sent < gone,
            "{id} failed ({outcome}) though it was sent after the replica was gone: {line}"
        );
        assert_eq!(
            line.split(' ').nth(2),
            Some(victim_addr.as_str()),
            "{id} failed ({outcome}) without having been in flight at the killed replica: {line}"
        );
    }
    assert!(ok > 100, "the load ran ({ok} answers)");
    assert!(
        passed_on > 0,
        "nginx offered requests to the dead replica and passed them on"
    );
    assert_eq!(a.chat_requests().await, a_before, "A stayed skipped");

    // A replacement joins and learns the open breaker from the fleet's kept record.
    let replacement = fleet.start_replica();
    joined(&replacement, REPLICAS as u64).await;
    let took = open_in(
        &replacement,
        &a_id,
        "the replacement reports A's breaker open",
    )
    .await;
    println!(
        "the replacement reported A open {} ms after joining",
        took.as_millis()
    );
    for _ in 0..5 {
        let (status, _) = replacement.chat(chat_body("m", false)).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        a.chat_requests().await,
        a_before,
        "the replacement never tried A either"
    );
    fleet.replicas.push(replacement);
}
