//! One `select` call through wasm, per built-in strategy, for 2, 8 and 64 candidates, and per SDK
//! language: the `least_backlog` example in Rust, Python and JavaScript (`least_backlog_rs`,
//! `_py`, `_js`), the same strategy in each.
//!
//! Needs the built strategies: `cargo xtask build-strategies && cargo bench -p switchyard --bench select`
//! (`-- least_backlog` for the languages only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use switchyard::strategy::{
    Candidate, CircuitState, Modalities, ModelRouter, PrefillPolicy, Request, StrategyEngine,
    StrategyLimits, UpstreamInfo as Route, catalog,
};

fn strategies_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SWITCHYARD_BUILTIN_STRATEGIES") {
        return dir.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("strategies")
}

fn routes(n: u32) -> Vec<Route> {
    (0..n)
        .map(|i| Route {
            index: i,
            endpoint_id: format!("m:local-{}", 9000 + i),
            provider: "openai_compat".into(),
            base_url: format!("http://127.0.0.1:{}/v1", 9000 + i),
            provider_model_id: "sim".into(),
            weight: 1.0 + f64::from(i % 3),
            priority: 0,
            input_modalities: vec!["text".into()],
            pricing: None,
            metadata_json: "{}".into(),
        })
        .collect()
}

fn candidates(n: u32) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            index: i,
            weight: 1.0 + f64::from(i % 3),
            priority: 0,
            availability: 1.0,
            circuit: CircuitState::Closed,
            prefill_backlog_tokens: 0,
            inflight_elephants: 0,
            uncached_prompt_tokens: 500,
            ttft_ms: Some(300.0),
            latency_ms: Some(2000.0),
            inflight_requests: 0,
            affinity_pinned: false,
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A generous deadline: the interpreted languages' 64-candidate calls come close to the
    // default 5 ms, and a timeout would end the benchmark instead of measuring it.
    let engine = StrategyEngine::new(StrategyLimits {
        call_timeout: std::time::Duration::from_secs(1),
        ..StrategyLimits::default()
    })
    .unwrap();
    let dir = strategies_dir();
    let mut group = c.benchmark_group("select");
    let examples = dir.with_file_name("strategies-examples");
    let components = ["fixed", "round_robin", "routewise"]
        .map(|name| (name, dir.join(format!("{name}.wasm"))))
        .into_iter()
        .chain(
            ["least_backlog_rs", "least_backlog_py", "least_backlog_js"]
                .map(|name| (name, examples.join(format!("{name}.wasm")))),
        );
    for (name, path) in components {
        let strategy = Arc::new(
            runtime
                .block_on(catalog::load(&engine, &path))
                .unwrap_or_else(|e| panic!("{e}")),
        );
        for n in [2u32, 8, 64] {
            let router = runtime
                .block_on(ModelRouter::new(
                    &engine,
                    strategy.clone(),
                    "m",
                    &serde_json::json!({}),
                    routes(n),
                ))
                .unwrap();
            let cands = candidates(n);
            let mut seed = 0u64;
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.to_async(&runtime).iter(|| {
                    seed = seed.wrapping_add(1);
                    let request = Request {
                        caller_hash: 7,
                        prompt_tokens: 500,
                        max_tokens: None,
                        stream: false,
                        modalities: Modalities::empty(),
                        seed,
                        now_ms: 1_700_000_000_000,
                        prefill: PrefillPolicy {
                            enabled: true,
                            intervene_tokens: 50_000,
                            elephant_tokens: 200_000,
                            elephant_limit: 1,
                        },
                        remaining_budget_usd: None,
                    };
                    let router = &router;
                    let cands = &cands;
                    async move { router.select(&request, cands).await.unwrap() }
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
