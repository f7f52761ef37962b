//! Strategies the host did not build (#22): `strategies.dir` is watched, so a `.wasm` added,
//! replaced or removed serves without a restart; a broken file leaves what served before serving
//! and is reported; a model naming a strategy not deployed yet waits as pending (503
//! `strategy_loading`) instead of refusing start-up; imports are checked before compiling and
//! `strategies list` stays one line per entry.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{Gateway, Mock, binary, chat_body, component, with_section, write_config};

const ADMIN: &str = "hot-swap-admin";

/// Every wait in these tests: generous, for a busy two-core machine (a change is picked up after
/// the watcher's debounce, a compile and the contract suite).
const PATIENCE: Duration = Duration::from_secs(90);

/// Polls `probe` until it returns `Some`, or panics with `what` after [`PATIENCE`].
async fn until<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes `bytes` to `dir/name` the way a deployment should: a temporary name first, then one
/// rename, so the watcher never sees a half-written component.
fn deploy(dir: &Path, name: &str, bytes: &[u8]) {
    let tmp = dir.join(format!(".{name}.part"));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// `bytes` with a custom section appended: the same strategy, another content hash.
fn with_padding(bytes: &[u8]) -> Vec<u8> {
    let mut padded = bytes.to_vec();
    // id 0, size 5, name "pad" (length 3), payload "1".
    padded.extend_from_slice(&[0x00, 0x05, 0x03, b'p', b'a', b'd', b'1']);
    padded
}

/// A component that imports `wasi:http/types@0.2.10` (an empty instance) and nothing else: what a
/// componentize-js build with its default features looks like to the host.
fn http_importing_component() -> Vec<u8> {
    let name = b"wasi:http/types@0.2.10";
    let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
    // Type section: one instance type with no declarations.
    bytes.extend_from_slice(&[0x07, 0x03, 0x01, 0x42, 0x00]);
    // Import section: one import of that instance type.
    let mut import = vec![0x01, 0x00, name.len() as u8];
    import.extend_from_slice(name);
    import.extend_from_slice(&[0x05, 0x00]);
    bytes.push(0x0a);
    bytes.push(import.len() as u8);
    bytes.extend_from_slice(&import);
    bytes
}

/// A component whose nested core module parses but does not validate (a function of a type that
/// does not exist): it fails in the compile, whose report spans several lines.
fn invalid_core_module_component() -> Vec<u8> {
    let module = b"\0asm\x01\0\0\0\x03\x02\x01\x05";
    let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
    bytes.push(0x01);
    bytes.push(module.len() as u8);
    bytes.extend_from_slice(module);
    bytes
}

async fn deep(gw: &Gateway) -> serde_json::Value {
    gw.deep(ADMIN).await
}

/// The router of model `m` as `/health/deep` lists it.
fn router_of<'a>(deep: &'a serde_json::Value, model: &str) -> Option<&'a serde_json::Value> {
    deep["routers"]
        .as_array()?
        .iter()
        .find(|r| r["model"] == model)
}

async fn reload(gw: &Gateway) -> serde_json::Value {
    let response = reqwest::Client::new()
        .post(gw.url("/admin/strategies/reload"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strategy_dropped_replaced_broken_and_removed_without_a_restart() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let strategies = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN}\nstrategies:\n  dir: {}\nmodels:\n  - id: m\n    router: test-v0-1-fixture\n    route:\n      - kind: openai_compat\n        base_url: {}\n      - kind: openai_compat\n        base_url: {}\n  - id: steady\n    router: round_robin\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
        strategies.path().display(),
        a.base_url(),
        b.base_url(),
        a.base_url(),
    ));

    // Deployed before its strategy: the gateway starts, the model waits, the others serve.
    let (status, body) = gw.chat(chat_body("m", false)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "strategy_loading", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown strategy `test-v0-1-fixture`"),
        "{body}"
    );
    assert_eq!(gw.chat(chat_body("steady", false)).await.0, 200);
    let d = deep(&gw).await;
    assert_eq!(d["pending_models"][0]["model"], "m", "{d}");
    assert!(gw.log().contains("unknown strategy `test-v0-1-fixture`"));
    let a_before = a.chat_requests().await;

    // Dropped in: served without a restart. The fixture orders the highest index first: `b`.
    let fixture = std::fs::read(component("strategies-testing", "v0_1_fixture")).unwrap();
    deploy(strategies.path(), "mine.wasm", &fixture);
    until("the dropped strategy serves model m", async || {
        let (status, _) = gw.chat(chat_body("m", false)).await;
        (status == 200).then_some(())
    })
    .await;
    for _ in 0..3 {
        assert_eq!(gw.chat(chat_body("m", false)).await.0, 200);
    }
    assert_eq!(
        b.chat_requests().await,
        4,
        "m routes by the dropped strategy"
    );
    assert_eq!(a.chat_requests().await, a_before);
    let d = deep(&gw).await;
    assert_eq!(router_of(&d, "m").unwrap()["selects"], 4, "{d}");
    let first_hash = d["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "test-v0-1-fixture")
        .unwrap()["sha256"]
        .clone();

    // Replaced by new content: a new router (its counters start again), traffic goes on.
    deploy(strategies.path(), "mine.wasm", &with_padding(&fixture));
    let d = until("the replaced file serves", async || {
        let d = deep(&gw).await;
        let hash = d["strategies"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == "test-v0-1-fixture")?["sha256"]
            .clone();
        // The catalog is swapped before the models' routers are rebuilt from it: only once
        // loading is over is the router the new file's.
        (hash != first_hash && d["strategies_loading"] == false && router_of(&d, "m").is_some())
            .then_some(d)
    })
    .await;
    assert_eq!(
        router_of(&d, "m").unwrap()["selects"],
        0,
        "a replaced file gets a new router: {d}"
    );
    assert_eq!(gw.chat(chat_body("m", false)).await.0, 200);
    assert_eq!(b.chat_requests().await, 5);

    // Replaced by a strategy that fails the contract, and a file that is not wasm: both are
    // reported, and what served before goes on serving.
    deploy(
        strategies.path(),
        "mine.wasm",
        &std::fs::read(component("strategies-testing", "trap_on_select")).unwrap(),
    );
    deploy(strategies.path(), "garbage.wasm", b"not wasm at all");
    let report = reload(&gw).await;
    let file = |name: &str| {
        report["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("{name} missing from {report}"))
            .clone()
    };
    let mine = file("mine.wasm");
    assert_eq!(mine["state"], "failed", "{report}");
    assert_eq!(mine["strategy"], "test-trap-on-select", "{report}");
    assert!(
        mine["reason"]
            .as_str()
            .unwrap()
            .contains("fails the router contract"),
        "{report}"
    );
    assert!(
        mine["still_serving"]
            .as_str()
            .unwrap()
            .starts_with("test-v0-1-fixture"),
        "{report}"
    );
    let garbage = file("garbage.wasm");
    assert_eq!(garbage["state"], "failed", "{report}");
    assert!(
        garbage["reason"]
            .as_str()
            .unwrap()
            .contains("bad magic number"),
        "{report}"
    );
    for _ in 0..2 {
        assert_eq!(gw.chat(chat_body("m", false)).await.0, 200);
    }
    assert_eq!(b.chat_requests().await, 7, "the old strategy still serves");
    let d = deep(&gw).await;
    assert_eq!(d["status"], "degraded", "{d}");
    assert_eq!(
        d["strategy_files_failed"].as_array().unwrap().len(),
        2,
        "{d}"
    );

    // Removed: the model waits again; the others never noticed.
    std::fs::remove_file(strategies.path().join("mine.wasm")).unwrap();
    std::fs::remove_file(strategies.path().join("garbage.wasm")).unwrap();
    until(
        "model m waits again after its file is removed",
        async || {
            let (status, body) = gw.chat(chat_body("m", false)).await;
            (status == 503 && body["error"]["code"] == "strategy_loading").then_some(())
        },
    )
    .await;
    assert_eq!(gw.chat(chat_body("steady", false)).await.0, 200);
    let d = deep(&gw).await;
    assert_eq!(d["status"], "ok", "{d}");
}

#[test]
fn strategies_list_is_one_line_per_entry_with_imports() {
    let dir = tempfile::tempdir().unwrap();
    let strategies = dir.path().join("strategies");
    std::fs::create_dir(&strategies).unwrap();
    std::fs::copy(
        component("strategies-testing", "v0_1_fixture"),
        strategies.join("fixture.wasm"),
    )
    .unwrap();
    std::fs::write(strategies.join("http.wasm"), http_importing_component()).unwrap();
    std::fs::write(
        strategies.join("invalid.wasm"),
        invalid_core_module_component(),
    )
    .unwrap();
    let config = write_config(dir.path(), "strategies:\n  dir: strategies\n");
    let out = Command::new(binary())
        .args(["strategies", "list", "--config"])
        .arg(&config)
        .env(
            "SWITCHYARD_BUILTIN_STRATEGIES",
            crate::harness::target_dir().join("strategies"),
        )
        .env(
            "SWITCHYARD_CACHE_DIR",
            crate::harness::target_dir().join("wasmtime-cache"),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    // Three built-ins and three files, one line each, six tab-separated fields.
    assert_eq!(lines.len(), 6, "{stdout}");
    for line in &lines {
        assert_eq!(line.split('\t').count(), 6, "{line}");
    }
    let line = |name: &str| {
        *lines
            .iter()
            .find(|l| l.starts_with(&format!("{name}\t")))
            .unwrap_or_else(|| panic!("no line for {name}: {stdout}"))
    };
    let fixture = line("test-v0-1-fixture");
    assert!(fixture.contains("\tloaded\t"), "{fixture}");
    assert!(
        fixture.contains("\timports: switchyard:router/types@0.1.0, ")
            && fixture.contains("wasi:io/streams@0.2.6"),
        "{fixture}"
    );
    let http = line("http");
    assert!(http.contains("\tmissing\t"), "{http}");
    assert!(
        http.contains(
            "imports wasi:http/types@0.2.10: strategies get no network; for componentize-js build with -d http fetch-event"
        ),
        "{http}"
    );
    assert!(http.ends_with("imports: wasi:http/types@0.2.10"), "{http}");
    let invalid = line("invalid");
    assert!(invalid.contains("not a valid component"), "{invalid}");
}

#[tokio::test]
async fn a_relative_sqlite_file_is_beside_the_config_file() {
    let mock = Mock::start(&[]);
    // The gateway runs from the test's working folder; the database must land in the config's.
    let gw = Gateway::start_on(
        Some("sqlite://relative.db"),
        &format!(
            "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
            mock.base_url()
        ),
        &[],
    );
    assert_eq!(gw.chat(chat_body("m", false)).await.0, 200);
    assert!(
        gw.dir.path().join("relative.db").is_file(),
        "the database is beside config.yaml"
    );
    assert!(!Path::new("relative.db").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strategy_declares_its_deadline_and_a_model_may_set_its_own() {
    let mock = Mock::start(&[]);
    let strategies = tempfile::tempdir().unwrap();
    let section = "switchyard-router-deadline-ms";
    let read = |name: &str| std::fs::read(component("strategies-testing", name)).unwrap();
    deploy(
        strategies.path(),
        "spin.wasm",
        &with_section(&read("spin_forever"), section, "30"),
    );
    // More than the host's maximum (50 ms by default): capped.
    deploy(
        strategies.path(),
        "trap.wasm",
        &with_section(&read("trap_on_select"), section, "500"),
    );
    let route = format!(
        "    route:\n      - kind: openai_compat\n        base_url: {}\n",
        mock.base_url()
    );
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN}\nstrategies:\n  dir: {}\n  call_timeout_ms: 5\nmodels:\n  - id: declared\n    router: test-spin-forever\n{route}  - id: capped\n    router: test-trap-on-select\n{route}  - id: own\n    router: round_robin\n    router_deadline_ms: 12\n{route}  - id: default\n    router: fixed\n{route}",
        strategies.path().display()
    ));
    // The first request waits for strategies.dir to load, then falls back to declared order.
    let (status, body) = gw.chat(chat_body("declared", false)).await;
    assert_eq!(status, 200, "{body}");
    let d = deep(&gw).await;
    let deadline = |model: &str| {
        router_of(&d, model).unwrap()["deadline_ms"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(deadline("declared"), 30.0, "{d}");
    assert_eq!(deadline("capped"), 50.0, "{d}");
    assert_eq!(deadline("own"), 12.0, "{d}");
    assert_eq!(deadline("default"), 5.0, "{d}");
    let failure = router_of(&d, "declared").unwrap()["last_failure"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        failure.contains("exceeded its deadline of 30 ms"),
        "{failure}"
    );
}

#[test]
fn a_model_deadline_above_the_host_maximum_is_refused() {
    let out = crate::harness::check(
        "strategies:\n  max_call_timeout_ms: 20\nmodels:\n  - id: m\n    router_deadline_ms: 25\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "models[0] (m).router_deadline_ms: must be between 1 and strategies.max_call_timeout_ms (20)"
        ),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_finishes_on_the_router_it_started_with() {
    // Answers take 8 s: long enough for the swap to happen while one is in flight on a machine
    // that is not overloaded (nothing here asserts that it did; only what must hold either way).
    let slow = Mock::start(&["--ttft-ms", "8000"]);
    let strategies = tempfile::tempdir().unwrap();
    let fixture = std::fs::read(component("strategies-testing", "v0_1_fixture")).unwrap();
    deploy(strategies.path(), "mine.wasm", &fixture);
    let gw = std::sync::Arc::new(Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN}\nstrategies:\n  dir: {}\nmodels:\n  - id: m\n    router: test-v0-1-fixture\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
        strategies.path().display(),
        slow.base_url()
    )));
    let in_flight = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.chat(chat_body("m", false)).await })
    };
    // Once the upstream has it, its `select` ran on the first router.
    until("the first request reaches its upstream", async || {
        (slow.chat_requests().await == 1).then_some(())
    })
    .await;
    let old_hash = deep(&gw).await["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "test-v0-1-fixture")
        .unwrap()["sha256"]
        .clone();
    deploy(strategies.path(), "mine.wasm", &with_padding(&fixture));
    until("the replaced file serves with a new router", async || {
        let d = deep(&gw).await;
        let hash = d["strategies"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == "test-v0-1-fixture")?["sha256"]
            .clone();
        (hash != old_hash && router_of(&d, "m")?["selects"] == 0).then_some(())
    })
    .await;
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, 200, "the request in flight finishes: {body}");
    let d = deep(&gw).await;
    assert_eq!(
        router_of(&d, "m").unwrap()["selects"],
        0,
        "the request in flight never touched the new router: {d}"
    );
}
