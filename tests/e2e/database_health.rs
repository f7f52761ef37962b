//! The database as `/health/deep` reports it, on the real binary: the request-log writer and the
//! configuration sync say when they fail, a deleted SQLite file is noticed, and a write that
//! failed once does not break later admin writes.
//!
//! SQLite is made unwritable with `chattr +i` (the tests run as root, where `chmod` stops nothing;
//! the immutable flag also stops writes through descriptors already open). PostgreSQL is made
//! unreachable for one gateway only, through a TCP proxy the test cuts, so other tests sharing
//! the server see nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, PgSchema, chat_body};

const ADMIN: &str = "db-health-admin";

fn config(mock: &Mock) -> String {
    format!(
        "server:\n  admin_token: {ADMIN}\n  default_auth: disabled\nmodels:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
        mock.base_url()
    )
}

/// `/health/deep`, with the admin token (it may be behind it).
async fn deep(gw: &Gateway) -> Value {
    reqwest::Client::new()
        .get(gw.url("/health/deep"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Polls `/health/deep` until `done` holds, for at most 30 s; with `traffic`, sends a request
/// before each look (the request log writes only when there are rows).
async fn wait_deep(
    gw: &Gateway,
    what: &str,
    traffic: bool,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if traffic {
            gw.chat(chat_body("m", false)).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let value = deep(gw).await;
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {value:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn create_consumer(gw: &Gateway, name: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(gw.url("/admin/consumers"))
        .bearer_auth(ADMIN)
        .json(&json!({ "name": name, "role": "pro" }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Sets the immutable flag on the database files while alive; clears it on drop (also when the
/// test panics, so the temporary folder can be removed).
struct Immutable(Vec<PathBuf>);

impl Immutable {
    /// `None` when `chattr` is unavailable or refused (not root, or a file system without the
    /// flag): the caller then skips, saying so.
    fn set(db: &Path) -> Option<Immutable> {
        // Not the `-shm` index: SQLite maps it into memory, and a write fault on a mapping of an
        // immutable file could kill the process instead of failing a write.
        let files: Vec<PathBuf> = ["", "-wal"]
            .iter()
            .map(|suffix| PathBuf::from(format!("{}{suffix}", db.display())))
            .filter(|p| p.exists())
            .collect();
        let ok = Command::new("chattr")
            .arg("+i")
            .args(&files)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Immutable(files))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").args(&self.0).status();
    }
}

fn request_log_failing(v: &Value) -> bool {
    v["database"]["request_log"]["consecutive_failures"]
        .as_u64()
        .unwrap_or(0)
        > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writes_recover_after_the_file_was_unwritable_and_health_says_so_meanwhile() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&config(&mock));
    let (status, body) = create_consumer(&gw, "before").await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = gw.chat(chat_body("m", false)).await;
    assert_eq!(status, 200);
    let healthy = wait_deep(&gw, "a written request log", false, |v| {
        v["database"]["request_log"]["last_success_at_ms"].is_i64()
    })
    .await;
    assert_eq!(healthy["status"], "ok", "{healthy:#}");
    assert_eq!(healthy["database"]["status"], "ok", "{healthy:#}");

    let db = gw.dir.path().join("switchyard.db");
    let Some(immutable) = Immutable::set(&db) else {
        eprintln!(
            "SKIPPED: chattr +i is not available here, the database cannot be made unwritable"
        );
        return;
    };
    // Admin writes fail while the file is unwritable...
    let mut failed = 0;
    for i in 0..3 {
        let (status, body) = create_consumer(&gw, &format!("during-{i}")).await;
        if status != 201 {
            assert!(status >= 500, "{status} {body}");
            failed += 1;
        }
    }
    assert!(failed > 0, "chattr +i did not make the database unwritable");
    // ...and so does the request log, which /health/deep must say.
    let (status, _) = gw.chat(chat_body("m", false)).await;
    assert_eq!(status, 200, "a request does not depend on its log row");
    let degraded = wait_deep(&gw, "the failing request log", false, request_log_failing).await;
    assert_eq!(degraded["status"], "degraded", "{degraded:#}");
    assert_eq!(degraded["database"]["status"], "failing", "{degraded:#}");
    let problems = degraded["database"]["problems"].to_string();
    assert!(
        problems.contains("writing the request log failed"),
        "{problems}"
    );
    assert!(
        degraded["database"]["request_log"]["last_error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{degraded:#}"
    );

    drop(immutable);
    // Every connection of the pool must be usable again: more writes than connections, each
    // through whichever connection the pool hands out.
    for i in 0..10 {
        let (status, body) = create_consumer(&gw, &format!("after-{i}")).await;
        assert_eq!(
            status, 201,
            "write {i} after the file became writable: {body}"
        );
    }
    let (status, _) = gw.chat(chat_body("m", false)).await;
    assert_eq!(status, 200);
    let recovered = wait_deep(&gw, "the request log writing again", true, |v| {
        !request_log_failing(v) && v["status"] == "ok"
    })
    .await;
    assert_eq!(
        recovered["database"]["problems"],
        json!([]),
        "{recovered:#}"
    );
    let listed: Value = reqwest::Client::new()
        .get(gw.url("/admin/consumers"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names = listed.to_string();
    assert!(
        names.contains("before") && names.contains("after-9"),
        "{names}"
    );
    assert!(
        !gw.log().contains("non-zero transaction depth"),
        "{}",
        gw.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_sqlite_file_is_reported() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&config(&mock));
    let before = deep(&gw).await;
    assert_eq!(before["status"], "ok", "{before:#}");
    assert_eq!(before["database"]["file"]["state"], "ok", "{before:#}");

    let db = gw.dir.path().join("switchyard.db");
    std::fs::remove_file(&db).unwrap();
    let after = wait_deep(&gw, "the deleted file", false, |v| {
        v["database"]["file"]["state"] == "missing"
    })
    .await;
    assert_eq!(after["status"], "degraded", "{after:#}");
    assert_eq!(after["database"]["status"], "failing", "{after:#}");
    let problems = after["database"]["problems"].to_string();
    assert!(
        problems.contains(&format!("the database file {} was deleted", db.display())),
        "{problems}"
    );
    assert!(gw.log().contains("is missing"), "{}", gw.log());
}

/// A TCP proxy to the PostgreSQL server that the test can cut: while cut, connections are closed
/// at once and new ones refused by closing them.
struct PgProxy {
    addr: std::net::SocketAddr,
    cut: Arc<AtomicBool>,
    /// Live connections' tasks, aborted by `cut`.
    conns: Arc<parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl PgProxy {
    async fn start(upstream: String) -> PgProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let accept = tokio::spawn({
            let (cut, conns) = (cut.clone(), conns.clone());
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        continue;
                    }
                    let upstream = upstream.clone();
                    conns.lock().push(tokio::spawn(async move {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    }));
                }
            }
        });
        PgProxy {
            addr,
            cut,
            conns,
            accept,
        }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            for task in self.conns.lock().drain(..) {
                task.abort();
            }
        }
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.set_cut(true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_postgres_turns_health_degraded_and_back() {
    let schema = PgSchema::create().await;
    let url = url::Url::parse(&schema.url).unwrap();
    let upstream = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let proxy = PgProxy::start(upstream).await;
    let mut proxied = url.clone();
    proxied.set_host(Some("127.0.0.1")).unwrap();
    proxied.set_port(Some(proxy.addr.port())).unwrap();

    let mock = Mock::start(&[]);
    let gw = Gateway::start_on(
        Some(proxied.as_str()),
        &config(&mock),
        &[("ROUTING_AFFINITY_ENABLED", "0")],
    );
    let (status, _) = gw.chat(chat_body("m", false)).await;
    assert_eq!(status, 200);
    let healthy = wait_deep(&gw, "a healthy start", false, |v| {
        v["database"]["request_log"]["last_success_at_ms"].is_i64()
            && v["database"]["sync"]["change_feed"]["last_success_at_ms"].is_i64()
    })
    .await;
    assert_eq!(healthy["status"], "ok", "{healthy:#}");

    proxy.set_cut(true);
    let (status, _) = gw.chat(chat_body("m", false)).await;
    assert_eq!(status, 200, "requests do not need the database");
    let degraded = wait_deep(&gw, "the outage in /health/deep", false, |v| {
        request_log_failing(v)
            && v["database"]["sync"]["change_feed"]["consecutive_failures"]
                .as_u64()
                .unwrap_or(0)
                > 0
    })
    .await;
    assert_eq!(degraded["status"], "degraded", "{degraded:#}");
    assert_eq!(degraded["database"]["status"], "failing", "{degraded:#}");
    let problems = degraded["database"]["problems"].to_string();
    assert!(
        problems.contains("watching for configuration changes failed")
            && problems.contains("writing the request log failed"),
        "{problems}"
    );

    proxy.set_cut(false);
    let (status, _) = gw.chat(chat_body("m", false)).await;
    assert_eq!(status, 200);
    let recovered = wait_deep(&gw, "recovery", true, |v| v["status"] == "ok").await;
    assert_eq!(
        recovered["database"]["problems"],
        json!([]),
        "{recovered:#}"
    );
    drop(gw);
    drop(schema);
}
