//! Old strategy components keep working: a component built against the frozen WIT 0.1.0 (the
//! `v0_1_fixture` test component, built without the SDK) loads beside 0.2.0 ones, routes real
//! traffic in the order it chose, and its legacy `;hedge=<ms>@<index>` metadata suffix still hedges.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchyard::strategy::{
    ApiVersion, Candidate, CircuitState, HedgeRequest, Modalities, ModelRouter, PrefillPolicy,
    Request, StrategyEngine, StrategyLimits, catalog, contract,
};

use crate::harness::{Gateway, Mock, chat_body, component};

fn engine() -> StrategyEngine {
    StrategyEngine::new(StrategyLimits {
        call_timeout: Duration::from_millis(500),
        memory_limit_bytes: 64 << 20,
    })
    .unwrap()
}

fn request() -> Request {
    Request {
        caller_hash: 1,
        prompt_tokens: 10,
        max_tokens: None,
        stream: false,
        modalities: Modalities::IMAGE,
        seed: 42,
        now_ms: 0,
        prefill: PrefillPolicy {
            enabled: true,
            intervene_tokens: 50_000,
            elephant_tokens: 200_000,
            elephant_limit: 1,
        },
        remaining_budget_usd: Some(3.0),
    }
}

fn candidates(indexes: &[u32]) -> Vec<Candidate> {
    indexes
        .iter()
        .map(|&index| Candidate {
            index,
            weight: 1.0,
            priority: 0,
            availability: 1.0,
            circuit: CircuitState::Closed,
            prefill_backlog_tokens: 0,
            inflight_elephants: 0,
            uncached_prompt_tokens: 10,
            ttft_ms: None,
            latency_ms: None,
            inflight_requests: 2,
            affinity_pinned: index == 0,
        })
        .collect()
}

/// A gateway whose strategy folder holds the 0.1.0 fixture.
fn gateway(models: &str) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        component("strategies-testing", "v0_1_fixture"),
        dir.path().join("v0_1_fixture.wasm"),
    )
    .unwrap();
    let gateway = Gateway::start(&format!(
        "server:\n  admin_token: deep-admin\nstrategies:\n  dir: {}\nmodels:\n{models}",
        dir.path().display()
    ));
    (gateway, dir)
}

#[tokio::test]
async fn a_0_1_0_component_is_run_with_the_0_1_0_bindings_and_adapted() {
    let engine = engine();
    let strategy = catalog::load(&engine, &component("strategies-testing", "v0_1_fixture"))
        .await
        .unwrap();
    assert_eq!(strategy.name, "test-v0-1-fixture");
    assert_eq!(strategy.api_version.as_deref(), Some("0.1.0"));
    assert_eq!(strategy.api, ApiVersion::V0_1);
    let built_in = catalog::load(&engine, &component("strategies", "fixed"))
        .await
        .unwrap();
    assert_eq!(built_in.api, ApiVersion::V0_2, "the SDK builds 0.2.0");

    let router = ModelRouter::new(
        &engine,
        Arc::new(strategy),
        "m",
        &json!({"hedge_after_ms": 75}),
        vec![],
    )
    .await
    .unwrap();
    // 0.2.0-only fields (in-flight counts, the pin, the budget) are dropped on the way in.
    let decision = router
        .select(&request(), &candidates(&[0, 2, 1]))
        .await
        .unwrap();
    assert_eq!(decision.order, vec![2, 1, 0]);
    // The legacy suffix became a typed hedge; the metadata is handed on unchanged.
    assert_eq!(
        decision.hedge,
        Some(HedgeRequest {
            after_ms: 75,
            backup: 1
        })
    );
    assert_eq!(decision.strategy_metadata, "v01:1;hedge=75@1");
}

#[tokio::test]
async fn a_0_1_0_component_passes_the_contract() {
    let report = contract::run(
        &engine(),
        &component("strategies-testing", "v0_1_fixture"),
        &json!({}),
    )
    .await;
    assert!(report.passed(), "{report:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_0_component_routes_real_traffic_in_its_order() {
    let mocks = [Mock::start(&[]), Mock::start(&[]), Mock::start(&[])];
    let routes: String = mocks
        .iter()
        .map(|m| {
            format!(
                "      - kind: openai_compat\n        base_url: {}\n",
                m.base_url()
            )
        })
        .collect();
    let (gateway, _dir) = gateway(&format!(
        "  - id: old\n    router: test-v0-1-fixture\n    route:\n{routes}  - id: new\n    router: round_robin\n    route:\n{routes}"
    ));
    for _ in 0..4 {
        let (status, body) = gateway.chat(chat_body("old", false)).await;
        assert_eq!(status, 200, "{body}");
    }
    // Highest declared index first, every time.
    assert_eq!(mocks[2].chat_requests().await, 4);
    assert_eq!(mocks[1].chat_requests().await, 0);
    assert_eq!(mocks[0].chat_requests().await, 0);
    // A 0.2.0 strategy serves beside it.
    for _ in 0..3 {
        assert_eq!(gateway.chat(chat_body("new", false)).await.0, 200);
    }
    assert_eq!(mocks[0].chat_requests().await, 1);
    assert_eq!(mocks[1].chat_requests().await, 1);

    let health: serde_json::Value = gateway.deep("deep-admin").await;
    let fixture = health["strategies"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == "test-v0-1-fixture")
        .cloned()
        .unwrap_or_default();
    assert_eq!(fixture["state"], "loaded", "{health}");
    assert_eq!(fixture["api_version"], "0.1.0", "{health}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_0_components_metadata_hedge_still_hedges() {
    let (backup, primary) = (Mock::start(&[]), Mock::start(&[]));
    // The fixture puts the highest index (the slow `primary`) first and names the other as the
    // backup after 200 ms.
    let (gateway, _dir) = gateway(&format!(
        "  - id: m\n    router: test-v0-1-fixture\n    router_params: {{hedge_after_ms: 200}}\n    route:\n      - kind: openai_compat\n        base_url: {}\n      - kind: openai_compat\n        base_url: {}\n",
        backup.base_url(),
        primary.base_url()
    ));
    primary.behave(json!({"ttft_ms": 2500})).await;
    let started = Instant::now();
    let (status, body) = gateway.chat(chat_body("m", false)).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        took < Duration::from_millis(2000),
        "the backup's answer should win, took {took:?}"
    );
    assert!(
        took >= Duration::from_millis(150),
        "hedged too early: {took:?}"
    );
    assert_eq!(primary.chat_requests().await, 1, "the primary was sent");
    assert_eq!(backup.chat_requests().await, 1, "exactly one backup");
    let log = gateway.log();
    assert_eq!(
        log.matches("hedging: the primary has not answered").count(),
        1,
        "{log}"
    );
}

#[tokio::test]
async fn an_unknown_api_version_is_refused_with_a_clear_error() {
    // A component preamble and one custom section stamping a version this host does not run.
    let name = b"switchyard-router-api";
    let payload = b"9.9.0";
    let mut body = vec![name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(payload);
    let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
    bytes.push(0);
    bytes.push(body.len() as u8);
    bytes.extend_from_slice(&body);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.wasm");
    std::fs::write(&path, bytes).unwrap();
    let err = catalog::load(&engine(), &path)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("built against switchyard:router@9.9.0, this host runs 0.1.0, 0.2.0"),
        "{err}"
    );
}
