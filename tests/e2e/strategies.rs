//! The wasm strategy host against real components: the contract suite on the built-ins, and the
//! deliberately bad components proving the deadline, the memory cap and the fallback to declared order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard::strategy::{
    Candidate, CircuitState, Modalities, ModelRouter, PrefillPolicy, Request, StrategyEngine,
    StrategyError, StrategyLimits, catalog, contract, record,
};

use crate::harness::{Gateway, Mock, chat_body, component};

/// Deadline tests need a short deadline; the contract checks behaviour, not speed, and runs beside
/// many other tests on two cores, so it gets a generous one.
fn engine() -> StrategyEngine {
    engine_with(Duration::from_millis(20))
}

fn engine_with(call_timeout: Duration) -> StrategyEngine {
    StrategyEngine::new(StrategyLimits {
        call_timeout,
        memory_limit_bytes: 64 << 20,
    })
    .unwrap()
}

async fn router(engine: &StrategyEngine, name: &str) -> ModelRouter {
    let strategy = Arc::new(
        catalog::load(engine, &component("strategies-testing", name))
            .await
            .unwrap(),
    );
    ModelRouter::new(engine, strategy, "m", &serde_json::json!({}), vec![])
        .await
        .unwrap()
}

fn request() -> Request {
    Request {
        caller_hash: 1,
        prompt_tokens: 10,
        max_tokens: None,
        stream: false,
        modalities: Modalities::empty(),
        seed: 42,
        now_ms: 0,
        prefill: PrefillPolicy {
            enabled: true,
            intervene_tokens: 50_000,
            elephant_tokens: 200_000,
            elephant_limit: 1,
        },
        remaining_budget_usd: None,
    }
}

fn candidates() -> Vec<Candidate> {
    (0..2)
        .map(|i| Candidate {
            index: i,
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
        })
        .collect()
}

#[tokio::test]
async fn builtin_strategies_pass_the_contract() {
    let engine = engine_with(Duration::from_millis(500));
    for name in ["fixed", "round_robin"] {
        let report = contract::run(
            &engine,
            &component("strategies", name),
            &serde_json::json!({}),
        )
        .await;
        assert!(report.passed(), "{name}: {report:#?}");
    }
}

/// The host writes `select`'s arguments into guest memory with its own lowering (the
/// `switchyard-select-abi` crate), not wasmtime's generic one: every field, each option both ways,
/// every enum case and flag, must reach a real guest as the host meant it.
#[tokio::test]
async fn select_arguments_reach_the_guest_exactly() {
    let engine = engine_with(Duration::from_millis(500));
    let r = router(&engine, "echo_inputs").await;
    let modalities = [
        Modalities::IMAGE | Modalities::VIDEO,
        Modalities::AUDIO,
        Modalities::empty(),
    ];
    // Each option present in one round and absent in the next.
    for (round, modalities) in modalities.into_iter().enumerate() {
        let (budget, max_tokens) = if round % 2 == 0 {
            (None, Some(4_000_000_000))
        } else {
            (Some(0.125), None)
        };
        let request = Request {
            caller_hash: u64::MAX - 3,
            prompt_tokens: 123_456,
            max_tokens,
            stream: round == 0,
            modalities,
            seed: 0x0123_4567_89ab_cdef,
            now_ms: 1_780_000_000_123,
            prefill: PrefillPolicy {
                enabled: round == 1,
                intervene_tokens: 50_001,
                elephant_tokens: 1 << 40,
                elephant_limit: 7,
            },
            remaining_budget_usd: budget,
        };
        let circuits = [
            CircuitState::Closed,
            CircuitState::Open,
            CircuitState::HalfOpen,
        ];
        let candidates: Vec<Candidate> = (0..5u32)
            .map(|i| Candidate {
                index: 10 + i,
                weight: 0.5 + f64::from(i),
                priority: -2 + i as i32,
                availability: 1.0 / f64::from(i + 2),
                circuit: circuits[i as usize % 3],
                prefill_backlog_tokens: (1u64 << 33) + u64::from(i),
                inflight_elephants: 100 + i,
                uncached_prompt_tokens: 7 * u64::from(i),
                ttft_ms: (i % 2 == 0).then_some(12.5 * f64::from(i)),
                latency_ms: (i % 2 == 1).then_some(1e6 + f64::from(i)),
                inflight_requests: u32::MAX - i,
                affinity_pinned: i == 3,
            })
            .collect();
        let decision = r.select(&request, &candidates).await.unwrap();
        let echo: serde_json::Value = serde_json::from_str(&decision.strategy_metadata).unwrap();
        let expected = serde_json::json!({
            "request": record::request_json(&request),
            "candidates": candidates.iter().map(record::candidate_json).collect::<Vec<_>>(),
        });
        assert_eq!(echo, expected, "round {round}");
        assert_eq!(decision.order, vec![10, 11, 12, 13, 14]);
    }
}

#[tokio::test]
async fn the_contract_catches_a_broken_strategy() {
    let report = contract::run(
        &engine(),
        &component("strategies-testing", "trap_on_select"),
        &serde_json::json!({}),
    )
    .await;
    assert!(!report.passed());
    let failed: Vec<_> = report
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name)
        .collect();
    assert!(
        failed.contains(&"select never fails on valid input"),
        "{failed:?}"
    );
}

#[tokio::test]
async fn an_endless_loop_hits_the_deadline_and_the_instance_recovers() {
    let engine = engine();
    let r = router(&engine, "spin_forever").await;
    let started = Instant::now();
    let err = r.select(&request(), &candidates()).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, StrategyError::Trap { .. }), "{err}");
    assert!(
        err.to_string().contains("exceeded its deadline of 20 ms"),
        "{err}"
    );
    assert!(
        err.to_string().contains("test-spin-forever"),
        "errors name the strategy: {err}"
    );
    assert!(
        took < Duration::from_secs(2),
        "the deadline cut the loop off ({took:?})"
    );
    // The dead instance is replaced on the next call.
    let _ = r.select(&request(), &candidates()).await;
    assert_eq!(r.stats.resets.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(
        r.stats.failures.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test]
async fn an_endless_loop_after_a_quiet_spell_still_hits_the_deadline() {
    let engine = engine();
    let r = router(&engine, "spin_forever").await;
    // With no guest code running, the epoch ticker parks; the call must wake it.
    let until = Instant::now() + Duration::from_secs(30);
    while !engine.epoch_ticker_parked() {
        assert!(Instant::now() < until, "the ticker never parked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let err = r.select(&request(), &candidates()).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        err.to_string().contains("exceeded its deadline of 20 ms"),
        "{err}"
    );
    // Woken, the ticker stops the loop after ~20 ms of wall and 20 ms of CPU time; left parked,
    // it would tick every 100 ms and take 2 s to count the deadline's 20 ticks.
    assert!(
        took < Duration::from_secs(1),
        "the call did not wake the ticker ({took:?})"
    );
}

#[tokio::test]
async fn a_gigabyte_allocation_hits_the_memory_cap() {
    let engine = engine();
    let r = router(&engine, "allocate_gigabyte").await;
    let err = r.select(&request(), &candidates()).await.unwrap_err();
    assert!(matches!(err, StrategyError::Trap { .. }), "{err}");
    assert!(err.to_string().contains("memory cap of 64 MiB"), "{err}");
}

#[tokio::test]
async fn a_panic_is_a_trap_with_the_guest_message() {
    let engine = engine();
    let r = router(&engine, "trap_on_select").await;
    let err = r
        .select(&request(), &candidates())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("select failed"), "{err}");
    assert!(
        err.contains("panicked"),
        "the guest's panic message is kept: {err}"
    );
}

#[tokio::test]
async fn core_modules_and_garbage_are_rejected_with_a_clear_reason() {
    let engine = engine();
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"not wasm at all").unwrap();
    let err = catalog::load(&engine, &garbage)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad magic number"), "{err}");
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let err = catalog::load(&engine, &core).await.unwrap_err().to_string();
    assert!(err.contains("not a component"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_strategy_falls_back_to_declared_order_and_spares_other_models() {
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
    let routes = format!(
        "    route:\n      - kind: openai_compat\n        base_url: {}\n      - kind: openai_compat\n        base_url: {}\n",
        a.base_url(),
        b.base_url()
    );
    let gw = Gateway::start(&format!(
        "strategies:\n  dir: {}\n  call_timeout_ms: 10\nmodels:\n  - id: broken\n    router: test-trap-on-select\n{routes}  - id: looping\n    router: test-spin-forever\n{routes}  - id: healthy\n    router: round_robin\n{routes}",
        gw_dir.path().display()
    ));
    for _ in 0..5 {
        let (status, body) = gw.chat(chat_body("broken", false)).await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = gw.chat(chat_body("looping", false)).await;
        assert_eq!(status, 200, "{body}");
    }
    // Declared order: the first route is the primary every time.
    assert_eq!(a.chat_requests().await, 10);
    assert_eq!(b.chat_requests().await, 0);
    for _ in 0..4 {
        assert_eq!(gw.chat(chat_body("healthy", false)).await.0, 200);
    }
    assert_eq!(a.chat_requests().await, 12, "round robin alternates");
    assert_eq!(b.chat_requests().await, 2);
    let log = gw.log();
    assert!(log.contains("strategy failure"), "{log}");
    assert!(log.contains("exceeded its deadline"), "{log}");
}
