//! The wasm strategy host against real components: the contract suite on the built-ins, and the
//! deliberately bad components proving the deadline, the memory cap and the fallback to declared order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard::strategy::{
    Candidate, CircuitState, Modalities, ModelRouter, PrefillPolicy, Request, StrategyEngine,
    StrategyError, StrategyLimits, catalog, contract, record,
};

use crate::harness::{Gateway, Mock, chat_body, component, with_section};

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

/// Name of the contract check of a `select-single` declaration (it begins so).
const SELECT_SINGLE_CHECK: &str = "declared select-single holds";

#[tokio::test]
async fn builtin_strategies_pass_the_contract() {
    let engine = engine_with(Duration::from_millis(500));
    for (name, declares_select_single) in [("fixed", true), ("round_robin", false)] {
        let report = contract::run(
            &engine,
            &component("strategies", name),
            &serde_json::json!({}),
        )
        .await;
        assert!(report.passed(), "{name}: {report:#?}");
        let checked = report
            .checks
            .iter()
            .any(|c| c.name.starts_with(SELECT_SINGLE_CHECK));
        assert_eq!(checked, declares_select_single, "{name}: {report:#?}");
    }
}

/// The calls each built-in declares it does without (`Strategy::SKIPS`, stamped by the SDK).
#[tokio::test]
async fn builtin_strategies_declare_the_calls_they_do_without() {
    let engine = engine();
    for (name, words) in [
        ("fixed", vec!["observe", "tick", "select-single"]),
        ("round_robin", vec!["observe", "tick"]),
        ("routewise", vec![]),
    ] {
        let loaded = catalog::load(&engine, &component("strategies", name))
            .await
            .unwrap();
        assert_eq!(loaded.skips.words(), words, "{name}");
    }
}

/// A strategy that declares `select-single` but answers one candidate with metadata, or whose
/// single-candidate select changes its state, is caught by the contract suite (which calls the
/// guest itself), and a word the host does not know is refused
/// when the file loads, naming it.
#[tokio::test]
async fn a_false_or_misspelt_skip_declaration_is_caught() {
    let engine = engine_with(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    // `echo_inputs` answers every select with its inputs as metadata.
    let echo = std::fs::read(component("strategies-testing", "echo_inputs")).unwrap();
    // The check of a `select-single` declaration added to `bytes`; the report must fail.
    let claimed = async |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            with_section(bytes, "switchyard-router-skips", "select-single"),
        )
        .unwrap();
        let report = contract::run(&engine, &path, &serde_json::json!({})).await;
        assert!(!report.passed());
        report
            .checks
            .into_iter()
            .find(|c| c.name.starts_with(SELECT_SINGLE_CHECK))
            .unwrap_or_else(|| panic!("{name}: no {SELECT_SINGLE_CHECK} check"))
    };
    let check = claimed("false_claim.wasm", &echo).await;
    assert!(!check.passed, "{check:?}");
    assert!(check.detail.contains("metadata"), "{check:?}");

    // `round_robin` moves its cursor on every select, one candidate too: a single-candidate
    // select changes what it does next. Its own declaration is hidden (renamed) and replaced.
    let mut round_robin = std::fs::read(component("strategies", "round_robin")).unwrap();
    let own = round_robin
        .windows(23)
        .position(|w| w == b"switchyard-router-skips")
        .unwrap();
    round_robin[own + 22] = b'z';
    let check = claimed("stateful_claim.wasm", &round_robin).await;
    assert!(!check.passed, "{check:?}");
    assert!(
        check.detail.contains("after a single-candidate select"),
        "{check:?}"
    );

    let misspelt = dir.path().join("misspelt.wasm");
    std::fs::write(
        &misspelt,
        with_section(&echo, "switchyard-router-skips", "observe selct-single"),
    )
    .unwrap();
    let err = catalog::load(&engine, &misspelt).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("\"selct-single\""), "{text}");
    assert!(
        text.contains("known: observe, tick, select-single"),
        "{text}"
    );
}

/// With `select-single` declared, one candidate is ordered by the host: the same decision the
/// guest gives, without the call; with two candidates the guest is asked.
#[tokio::test]
async fn a_declared_select_single_is_answered_by_the_host() {
    let engine = engine();
    let strategy = Arc::new(
        catalog::load(&engine, &component("strategies", "fixed"))
            .await
            .unwrap(),
    );
    let r = ModelRouter::new(&engine, strategy, "m", &serde_json::json!({}), vec![])
        .await
        .unwrap();
    let all = candidates();
    let one = &all[1..2];
    let skipped = r.select(&request(), one).await.unwrap();
    assert_eq!(skipped.order, vec![one[0].index]);
    assert_eq!(skipped.hedge, None);
    assert_eq!(skipped.strategy_metadata, "");
    let stats = |r: &ModelRouter| {
        use std::sync::atomic::Ordering::Relaxed;
        (
            r.stats.selects.load(Relaxed),
            r.stats.selects_skipped.load(Relaxed),
        )
    };
    assert_eq!(stats(&r), (1, 1));
    r.select(&request(), &all).await.unwrap();
    assert_eq!(stats(&r), (2, 1));
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

/// Through the gateway: a `fixed` model with one upstream is ordered without calls into the
/// strategy (`/health/deep` counts them as skipped), one with two upstreams still asks it, and both
/// serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_skips_what_a_strategy_declares_it_does_without() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let route = |url: String| format!("      - kind: openai_compat\n        base_url: {url}\n");
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: admin-secret\nmodels:\n  - id: one\n    router: fixed\n    route:\n{}  - id: two\n    router: fixed\n    route:\n{}{}",
        route(a.base_url()),
        route(a.base_url()),
        route(b.base_url()),
    ));
    for _ in 0..3 {
        for model in ["one", "two"] {
            let (status, body) = gw.chat(chat_body(model, false)).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    let deep = gw.deep("admin-secret").await;
    let router = |model: &str| {
        deep["routers"]
            .as_array()
            .and_then(|routers| routers.iter().find(|r| r["model"] == model))
            .cloned()
            .unwrap_or_else(|| panic!("{model} in {deep}"))
    };
    let one = router("one");
    assert_eq!(one["selects"], 3, "{one}");
    assert_eq!(one["selects_skipped"], 3, "{one}");
    assert_eq!(
        one["skips"],
        serde_json::json!(["observe", "tick", "select-single"]),
        "{one}"
    );
    let two = router("two");
    assert_eq!(two["selects"], 3, "{two}");
    assert_eq!(two["selects_skipped"], 0, "{two}");
}
