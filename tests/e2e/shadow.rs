//! Shadow mode (`router_shadow`) and decision recording with `strategies replay`, on the real
//! binary with mock upstreams.
//!
//! The numbers are exact, not sampled: requests go one after another with session affinity off,
//! `round_robin` alternates the primary between the two routes (its cursor starts at the first),
//! and `fixed` always puts the first route first because it alone is in the higher priority tier.
//! So `round_robin` shadowing `round_robin` agrees every time, and `fixed` against `round_robin`
//! agrees on every other request, in primary and in order.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{
    Gateway, Mock, binary, chat_body, check, component, serve_refuses, target_dir,
};

const ADMIN_TOKEN: &str = "shadow-admin-token";

/// Two routes: the first in priority tier 1, the second in tier 0.
fn routes(a: &Mock, b: &Mock) -> String {
    format!(
        "    route:\n      - kind: openai_compat\n        base_url: {}\n        priority: 1\n      - kind: openai_compat\n        base_url: {}\n",
        a.base_url(),
        b.base_url()
    )
}

/// `GET /routing` until `done` holds for the model's entry (the shadow decides off the request
/// path, so its numbers arrive shortly after the answers); panics after a generous deadline.
async fn routing_until(gw: &Gateway, model: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let routing: Value = reqwest::Client::new()
            .get(gw.url("/routing"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("gateway reachable")
            .json()
            .await
            .expect("/routing is JSON");
        let entry = routing["models"]
            .as_array()
            .and_then(|models| models.iter().find(|m| m["id"] == model))
            .cloned()
            .unwrap_or_else(|| panic!("no model {model} in /routing: {routing}"));
        if done(&entry) {
            return entry;
        }
        assert!(
            Instant::now() < deadline,
            "/routing never showed what was expected for {model}: {entry}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_agreement_shows_in_routing_and_metrics() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let routes = routes(&a, &b);
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN_TOKEN}\nmodels:\n  - id: twin\n    router: round_robin\n    router_shadow: round_robin\n{routes}  - id: rival\n    router: round_robin\n    router_shadow: fixed\n    shadow_params: {{fallback_order: declared}}\n{routes}"
    ));
    const N: u64 = 10;
    for _ in 0..N {
        for model in ["twin", "rival"] {
            let (status, body) = gw.chat(chat_body(model, false)).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    // The shadow was never acted on: round_robin alone decided, N/2 to each route per model.
    assert_eq!(a.chat_requests().await, N);
    assert_eq!(b.chat_requests().await, N);

    let twin = routing_until(&gw, "twin", |m| m["shadow"]["compared"] == N).await;
    let shadow = &twin["shadow"];
    assert_eq!(shadow["router"], "round_robin", "{twin}");
    assert_eq!(shadow["same_order"], N, "{twin}");
    assert_eq!(shadow["primary_agreement"], 1.0, "{twin}");
    assert_eq!(shadow["order_agreement"], 1.0, "{twin}");
    assert_eq!(shadow["failed"], 0, "{twin}");
    assert_eq!(shadow["dropped"], 0, "{twin}");
    assert!(
        shadow["select_latency"]["samples"].as_u64().unwrap() >= N,
        "{twin}"
    );

    let rival = routing_until(&gw, "rival", |m| m["shadow"]["compared"] == N).await;
    let shadow = &rival["shadow"];
    assert_eq!(shadow["router"], "fixed", "{rival}");
    assert_eq!(shadow["same_primary"], N / 2, "{rival}");
    assert_eq!(shadow["same_order"], N / 2, "{rival}");
    assert_eq!(shadow["primary_agreement"], 0.5, "{rival}");

    let metrics = gw.metrics(ADMIN_TOKEN).await;
    let line = |outcome: &str, model: &str, strategy: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("switchyard_shadow_selects_total{")
                    && l.contains(&format!("outcome=\"{outcome}\""))
                    && l.contains(&format!("model=\"{model}\""))
                    && l.contains(&format!("strategy=\"{strategy}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().to_owned())
    };
    assert_eq!(
        line("same_order", "twin", "round_robin").as_deref(),
        Some("10"),
        "{metrics}"
    );
    assert_eq!(
        line("same_order", "rival", "fixed").as_deref(),
        Some("5"),
        "{metrics}"
    );
    assert_eq!(
        line("different_primary", "rival", "fixed").as_deref(),
        Some("5"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "switchyard_shadow_select_duration_seconds_count{model=\"rival\",strategy=\"fixed\"} 10"
        ),
        "{metrics}"
    );
    // The model's own strategy series are the real strategy's alone.
    assert!(
        !metrics.lines().any(|l| l
            .starts_with("switchyard_strategy_select_duration_seconds_count")
            && l.contains("strategy=\"fixed\"")),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_or_endless_shadow_never_touches_a_request() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw_dir = tempfile::tempdir().unwrap();
    for name in ["trap_on_select", "spin_forever"] {
        std::fs::copy(
            component("strategies-testing", name),
            gw_dir.path().join(format!("{name}.wasm")),
        )
        .unwrap();
    }
    let routes = routes(&a, &b);
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN_TOKEN}\nstrategies:\n  dir: {}\n  call_timeout_ms: 10\nmodels:\n  - id: trapped\n    router: round_robin\n    router_shadow: test-trap-on-select\n{routes}  - id: looping\n    router: round_robin\n    router_shadow: test-spin-forever\n{routes}",
        gw_dir.path().display()
    ));
    // The shadows come from `strategies.dir`, which loads after the gateway listens.
    for model in ["trapped", "looping"] {
        routing_until(&gw, model, |m| m["shadow"].is_object()).await;
    }
    const N: u64 = 6;
    for _ in 0..N {
        for model in ["trapped", "looping"] {
            let (status, body) = gw.chat(chat_body(model, false)).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    // round_robin decided every request: the routes alternate as if there were no shadow.
    assert_eq!(a.chat_requests().await, N);
    assert_eq!(b.chat_requests().await, N);
    for model in ["trapped", "looping"] {
        let entry = routing_until(&gw, model, |m| m["shadow"]["failed"] == N).await;
        assert_eq!(entry["shadow"]["compared"], 0, "{entry}");
        assert_eq!(entry["shadow"]["primary_agreement"], Value::Null, "{entry}");
        let failure = entry["shadow"]["last_failure"].as_str().unwrap_or_default();
        let expected = if model == "looping" {
            "exceeded its deadline"
        } else {
            "select failed"
        };
        assert!(failure.contains(expected), "{entry}");
    }
    let metrics = gw.metrics(ADMIN_TOKEN).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("switchyard_shadow_selects_total{")
                && l.contains("outcome=\"failed\"")
                && l.contains("model=\"looping\"")
                && l.ends_with(" 6")),
        "{metrics}"
    );
    // A shadow's failures are not the model's: no fallback to declared order was counted.
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("switchyard_strategy_fallbacks_total{")),
        "{metrics}"
    );
}

#[test]
fn shadow_params_are_checked_against_the_shadow_strategy_at_startup() {
    let stderr = serve_refuses(
        "models:\n  - id: chat\n    router: fixed\n    router_shadow: round_robin\n    shadow_params: {skip_open_circuit: true}\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9/v1\n",
        &[],
    );
    assert!(
        stderr.contains("config.yaml:")
            && stderr.contains(
                "models[0] (chat).shadow_params: strategy `round_robin` rejects the params"
            )
            && stderr.contains("skip_open_circuit"),
        "{stderr}"
    );
    // A shadow strategy that is not there yet may come with `strategies.dir`, which loads after
    // the gateway listens: `serve` starts without it (like a pending model), `check` refuses.
    let out = check(
        "models:\n  - id: chat\n    router: fixed\n    router_shadow: no_such_strategy\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9/v1\n",
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("models[0] (chat).router_shadow: unknown strategy `no_such_strategy`"),
        "{stderr}"
    );
    let stderr = serve_refuses(
        "models:\n  - id: chat\n    shadow_params: {}\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9/v1\n",
        &[],
    );
    assert!(
        stderr.contains("models[0] (chat).shadow_params")
            && stderr.contains("`router_shadow` is not"),
        "{stderr}"
    );
}

fn replay(from: &Path, strategy: &str, extra: &[&str]) -> Value {
    let out = Command::new(binary())
        .args(["strategies", "replay", "--strategy"])
        .arg(component("strategies", strategy))
        .arg("--from")
        .arg(from)
        .args(extra)
        .env("SWITCHYARD_CACHE_DIR", target_dir().join("wasmtime-cache"))
        .env_remove("SWITCHYARD_CONFIG")
        .output()
        .expect("run switchyard strategies replay");
    assert!(
        out.status.success(),
        "strategies replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_decisions_replay_through_any_strategy() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let routes = routes(&a, &b);
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN_TOKEN}\nstrategies:\n  record:\n    sample_rate: 1\n    path: records/decisions.jsonl\nmodels:\n  - id: chat\n    router: round_robin\n{routes}"
    ));
    const N: usize = 8;
    for _ in 0..N {
        let (status, body) = gw.chat(chat_body("chat", false)).await;
        assert_eq!(status, 200, "{body}");
    }
    // Relative to the config file, like strategies.dir.
    let file = gw.dir.path().join("records/decisions.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if text.lines().count() >= N {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "{} has {} of {N} records",
            file.display(),
            text.lines().count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["model"], "chat", "{first}");
    assert_eq!(first["strategy"], "round_robin", "{first}");
    assert_eq!(
        first["served"]["order"],
        serde_json::json!([0, 1]),
        "{first}"
    );
    assert_eq!(first["input"]["candidates"].as_array().unwrap().len(), 2);
    assert!(first["input"]["request"]["seed"].is_u64(), "{first}");

    // The same component agrees on every decision.
    let same = replay(&file, "round_robin", &[]);
    let model = &same["models"][0];
    assert_eq!(same["records"], N, "{same}");
    assert_eq!(model["model"], "chat", "{same}");
    assert_eq!(model["compared"], N, "{same}");
    assert_eq!(model["same_order"], N, "{same}");
    assert_eq!(model["order_agreement"], 1.0, "{same}");
    assert_eq!(model["disagreements"], serde_json::json!([]), "{same}");

    // `fixed` keeps the first route first: it agrees on every other decision, and says where not.
    let other = replay(&file, "fixed", &["--examples", "2"]);
    let model = &other["models"][0];
    assert_eq!(model["compared"], N, "{other}");
    assert_eq!(model["same_primary"], N / 2, "{other}");
    assert_eq!(model["primary_agreement"], 0.5, "{other}");
    let shown = model["disagreements"].as_array().unwrap();
    assert_eq!(shown.len(), 2, "--examples bounds them: {other}");
    assert_eq!(shown[0]["served"][0], model_endpoint(&first, 1), "{other}");
    assert_eq!(
        shown[0]["replayed"][0],
        model_endpoint(&first, 0),
        "{other}"
    );
    assert!(
        shown[0]["record"].as_str().unwrap().ends_with(":2"),
        "{other}"
    );

    let routing: Value = reqwest::Client::new()
        .get(gw.url("/routing"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(routing["decision_recording"]["written"], N, "{routing}");
    assert_eq!(routing["decision_recording"]["dropped"], 0, "{routing}");
}

/// The endpoint id of the recorded route with `index`.
fn model_endpoint(record: &Value, index: u64) -> Value {
    record["input"]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["index"] == index)
        .map(|r| r["endpoint_id"].clone())
        .unwrap()
}

/// The request path never waits for a shadow: with the queue full, a call is dropped and counted.
/// On this single-threaded runtime the shadow's task cannot run before the test yields, so the
/// first call fills the one-slot queue and the other nine are dropped.
#[tokio::test]
async fn a_full_shadow_queue_drops_and_counts_instead_of_waiting() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use switchyard::strategy::{
        Candidate, CircuitState, Modalities, ModelRouter, PrefillPolicy, Request, Shadow,
        StrategyEngine, StrategyLimits, catalog,
    };

    let engine = StrategyEngine::new(StrategyLimits {
        call_timeout: Duration::from_millis(500),
        memory_limit_bytes: 64 << 20,
    })
    .unwrap();
    let strategy = Arc::new(
        catalog::load(&engine, &component("strategies-testing", "trap_on_select"))
            .await
            .unwrap(),
    );
    let router = ModelRouter::new(&engine, strategy, "m", &serde_json::json!({}), vec![])
        .await
        .unwrap();
    let shadow = Shadow::start(router, 1);
    let request = Request {
        caller_hash: 1,
        prompt_tokens: 10,
        max_tokens: None,
        stream: false,
        modalities: Modalities::empty(),
        seed: 42,
        now_ms: 0,
        prefill: PrefillPolicy {
            enabled: false,
            intervene_tokens: 0,
            elephant_tokens: 0,
            elephant_limit: 0,
        },
        remaining_budget_usd: None,
    };
    let candidate = Candidate {
        index: 0,
        weight: 1.0,
        priority: 0,
        availability: 1.0,
        circuit: CircuitState::Closed,
        prefill_backlog_tokens: 0,
        inflight_elephants: 0,
        uncached_prompt_tokens: 10,
        ttft_ms: None,
        latency_ms: None,
        inflight_requests: 0,
        affinity_pinned: false,
    };
    for _ in 0..10 {
        shadow.select(&request, &[candidate], &[0]);
    }
    assert_eq!(shadow.stats.dropped.load(Ordering::Relaxed), 9);
    let deadline = Instant::now() + Duration::from_secs(60);
    while shadow.stats.failed.load(Ordering::Relaxed) < 1 {
        assert!(Instant::now() < deadline, "{}", shadow.report());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = shadow.report();
    assert_eq!(report["failed"], 1, "{report}");
    assert_eq!(report["dropped"], 9, "{report}");
    assert_eq!(report["compared"], 0, "{report}");
}
