//! Configuration storage across gateways: two gateways sharing one database (PostgreSQL schema or
//! SQLite file), each with its own pool, change feed and snapshot, like two processes of a fleet.
//! A change made through one gateway's management API must show in the other's snapshot within
//! 2 s.
//!
//! PostgreSQL is expected at `postgres://postgres@127.0.0.1:5432/test` (or
//! `SWITCHYARD_TEST_PG_URL`); each test gets its own schema. An unreachable server fails the test.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;
use switchyard::config::Config;
use switchyard::gateway::{Gateway, Routing};
use switchyard::store::Store;

use crate::harness::PgSchema;

const TOKEN: &str = "e2e-admin-token";

/// One gateway with its own store on `url`, serving the management API on loopback.
struct Node {
    base: String,
    store: Store,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Node {
    async fn start(url: &str) -> Node {
        let store = Store::open(url).await.unwrap();
        store.spawn_sync();
        let yaml = format!(
            "strategies:\n  builtin_dir: {}\nserver:\n  admin_token: {TOKEN}\n",
            crate::harness::target_dir().join("strategies").display()
        );
        let config = Config::from_yaml(Path::new("store-e2e.yaml"), &yaml, &|_| None).unwrap();
        let routing = Routing::build(&config, switchyard::gateway::DirLoad::Now)
            .await
            .unwrap();
        let gateway = Arc::new(Gateway::new(config, routing, Some(store.clone())).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = switchyard::admin::management_router().with_state(gateway);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Node {
            base: format!("http://{addr}"),
            store,
            task,
        }
    }
}

async fn call(
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("gateway reachable");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Polls `base`'s `/admin/store/status` until `check` holds; fails after `within`.
async fn wait_status(base: &str, within: Duration, check: impl Fn(&Value) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let (status, body) = call(base, reqwest::Method::GET, "/admin/store/status", None).await;
        assert_eq!(status, 200, "{body}");
        if check(&body) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "not seen within {within:?}; last status: {body}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn changes_cross_gateways_within_two_seconds(url: &str) {
    let a = Node::start(url).await;
    let b = Node::start(url).await;
    wait_status(&b.base, Duration::from_secs(2), |s| {
        s["sync"]["snapshot_version"].is_i64()
    })
    .await;

    let (status, route) = call(
        &a.base,
        reqwest::Method::POST,
        "/admin/routes",
        Some(json!({"name": "shared", "path_prefix": "/shared"})),
    )
    .await;
    assert_eq!(status, 201, "{route}");
    let took = wait_status(&b.base, Duration::from_secs(2), |s| {
        s["snapshot"]["routes"] == 1
    })
    .await;
    println!("gateway B saw A's route after {took:?}");
    let id = route["id"].as_str().unwrap();
    assert!(b.store.snapshot().route(id).is_some());

    // And back: B disables it, A's snapshot follows.
    let (status, _) = call(
        &b.base,
        reqwest::Method::PATCH,
        &format!("/admin/routes/{id}"),
        Some(json!({"disabled": true})),
    )
    .await;
    assert_eq!(status, 200);
    let version = b.store.config().version().await.unwrap();
    wait_status(&a.base, Duration::from_secs(2), |s| {
        s["sync"]["snapshot_version"] == version
    })
    .await;
    assert!(a.store.snapshot().route(id).unwrap().disabled_at.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_changes_reach_another_gateway_within_two_seconds() {
    let schema = PgSchema::create().await;
    changes_cross_gateways_within_two_seconds(&schema.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_changes_reach_another_gateway_within_two_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    changes_cross_gateways_within_two_seconds(&url).await;
}

/// `switchyard migrate` creates the configuration tables in PostgreSQL.
#[tokio::test]
async fn migrate_creates_the_configuration_tables_in_postgres() {
    let schema = PgSchema::create().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, format!("database:\n  url: \"{}\"\n", schema.url)).unwrap();
    let out = Command::new(crate::harness::binary())
        .args(["migrate", "--config"])
        .arg(&config)
        .env_remove("SWITCHYARD_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut conn = sqlx::PgConnection::connect(&schema.url).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    for t in [
        "api_logs",
        "config_version",
        "consumer_api_keys",
        "consumers",
        "plugin_configs",
        "providers",
        "routes",
        "upstream_api_keys",
        "upstream_models",
        "upstreams",
    ] {
        assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
    }
}

/// A running `switchyard serve` on a config file of our own (the harness's always uses SQLite).
struct Serve {
    port: u16,
    child: Child,
}

impl Serve {
    fn start(dir: &Path, name: &str, database_url: &str) -> Serve {
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &config,
            format!("database:\n  url: \"{database_url}\"\nserver:\n  admin_token: {TOKEN}\n"),
        )
        .unwrap();
        let target = crate::harness::target_dir();
        // Kept in a file: a process that exits before it announces itself says why there.
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(crate::harness::binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .env("SWITCHYARD_CACHE_DIR", target.join("wasmtime-cache"))
            .env("SWITCHYARD_BUILTIN_STRATEGIES", target.join("strategies"))
            .env_remove("SWITCHYARD_CONFIG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "{name} did not announce its address: {line:?} ({status:?}); its log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        Serve { port, child }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two real `switchyard serve` processes on one PostgreSQL schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_share_configuration_through_postgres() {
    let schema = PgSchema::create().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Serve::start(dir.path(), "a", &schema.url);
    let b = Serve::start(dir.path(), "b", &schema.url);
    wait_status(&b.base(), Duration::from_secs(5), |s| {
        s["sync"]["snapshot_version"].is_i64()
    })
    .await;
    let (status, body) = call(
        &a.base(),
        reqwest::Method::POST,
        "/admin/routes",
        Some(json!({"name": "fleet", "path_prefix": "/fleet"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    wait_status(&b.base(), Duration::from_secs(2), |s| {
        s["snapshot"]["routes"] == 1
    })
    .await;
}
