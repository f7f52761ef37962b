//! The router contract: behaviour every strategy must show, checked against a compiled component.
//!
//! Run by the host's tests against every built-in strategy and by `switchyard strategies test FILE`
//! for authors. Checks are driven by a seeded generator, so a failure reproduces.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::catalog::{LoadedStrategy, load};
use super::engine::StrategyEngine;
use super::router::{ModelRouter, check_order};
use super::types::{
    Candidate, CircuitState, Modalities, Observation, PrefillPolicy, Request, UpstreamInfo,
};

/// One named check and what it found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ContractCheck {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

/// The outcome of the contract suite for one file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ContractReport {
    pub strategy: String,
    pub checks: Vec<ContractCheck>,
}

impl ContractReport {
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }
}

/// Number of generated `select` cases.
const CASES: usize = 300;
/// Failing `select` cases after which the suite stops: a strategy that loops until its deadline
/// on every call would otherwise hold a reload for 600 deadlines.
const MAX_FAILING_CASES: usize = 3;
/// Routes in the generated table.
const ROUTES: u32 = 6;

/// Loads `path` and runs every check; `params` are the router params to use (`{}` by default).
pub async fn run(
    engine: &StrategyEngine,
    path: &std::path::Path,
    params: &serde_json::Value,
) -> ContractReport {
    let mut checks = Vec::new();
    let strategy = match load(engine, path).await {
        Ok(s) => Arc::new(s),
        Err(e) => {
            checks.push(fail("loads", e.to_string()));
            return ContractReport {
                strategy: path.display().to_string(),
                checks,
            };
        }
    };
    checks.push(pass("loads", format!("as {}", strategy.label())));
    run_loaded(engine, &strategy, params, &mut checks).await;
    ContractReport {
        strategy: strategy.label(),
        checks,
    }
}

/// Runs every check on a strategy already loaded (a reload checks a file before it serves).
pub async fn run_loaded_strategy(
    engine: &StrategyEngine,
    strategy: &Arc<LoadedStrategy>,
    params: &serde_json::Value,
) -> ContractReport {
    let mut checks = vec![pass("loads", format!("as {}", strategy.label()))];
    run_loaded(engine, strategy, params, &mut checks).await;
    ContractReport {
        strategy: strategy.label(),
        checks,
    }
}

async fn run_loaded(
    engine: &StrategyEngine,
    strategy: &Arc<LoadedStrategy>,
    params: &serde_json::Value,
    checks: &mut Vec<ContractCheck>,
) {
    checks.push(check(
        "declares a name and version",
        !strategy.name.trim().is_empty() && !strategy.version.trim().is_empty(),
        format!("name `{}`, version `{}`", strategy.name, strategy.version),
    ));
    let typo = serde_json::json!({ "__contract_unknown_key__": 1 });
    checks.push(check(
        "schema rejects unknown keys",
        strategy.validate_params(&typo).is_err(),
        "params with an unknown key must fail validation".into(),
    ));
    if let Err(errors) = strategy.validate_params(params) {
        checks.push(fail("params validate", errors.join("; ")));
        return;
    }

    let table = route_table();
    let make = || {
        ModelRouter::new(
            engine,
            strategy.clone(),
            "contract-model",
            params,
            table.clone(),
        )
    };
    let (a, b) = match (make().await, make().await) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            checks.push(fail("create succeeds", e.to_string()));
            return;
        }
    };
    checks.push(pass("create succeeds", String::new()));

    // Two routers fed identical inputs must decide identically: decisions depend only on inputs,
    // the seed and the strategy's own state.
    let mut rng = StdRng::seed_from_u64(0x5EED);
    let mut invalid = Vec::new();
    let mut diverged = Vec::new();
    let mut errors = Vec::new();
    for case in 0..CASES {
        let (request, candidates) = random_case(&mut rng);
        let da = a.select(&request, &candidates).await;
        let db = b.select(&request, &candidates).await;
        match (da, db) {
            (Ok(da), Ok(db)) => {
                if let Err(reason) = check_order(&da.order, &candidates) {
                    invalid.push(format!("case {case}: {reason}"));
                }
                if da.order != db.order {
                    diverged.push(format!("case {case}: {:?} vs {:?}", da.order, db.order));
                }
                let index = da.order.first().copied().unwrap_or(0);
                let obs = Observation {
                    index,
                    success: rng.random_bool(0.8),
                    ttft_ms: Some(rng.random_range(1.0..5000.0)),
                    latency_ms: rng.random_range(1.0..20000.0),
                    prompt_tokens: request.prompt_tokens,
                    completion_tokens: rng.random_range(0..4096),
                    cached_prompt_tokens: 0,
                    status: 200,
                    strategy_metadata: da.strategy_metadata.clone(),
                    now_ms: request.now_ms,
                };
                a.observe(&obs).await;
                b.observe(&obs).await;
            }
            (Err(e), _) | (_, Err(e)) => errors.push(format!("case {case}: {e}")),
        }
        if errors.len() >= MAX_FAILING_CASES {
            errors.push(format!(
                "stopped after {MAX_FAILING_CASES} failing cases of {}",
                case + 1
            ));
            break;
        }
        if case % 50 == 0 {
            a.tick(request.now_ms).await;
            b.tick(request.now_ms).await;
        }
    }
    checks.push(summary("select never fails on valid input", &errors));
    checks.push(summary(
        "orders are valid (candidate indexes, no duplicates)",
        &invalid,
    ));
    checks.push(summary(
        "deterministic for equal inputs and seed",
        &diverged,
    ));

    // No candidates: the strategy may return an empty order or an error, but must not trap.
    let empty = a.select(&random_case(&mut rng).0, &[]).await;
    let trapped = matches!(empty, Err(super::StrategyError::Trap { .. }));
    checks.push(check(
        "select with no candidates does not trap",
        !trapped,
        empty.err().map(|e| e.to_string()).unwrap_or_default(),
    ));

    if strategy.skips.select_single {
        match (make().await, make().await) {
            (Ok(c), Ok(d)) => checks.push(select_single_holds(&c, &d, &mut rng).await),
            (Err(e), _) | (_, Err(e)) => checks.push(fail(SELECT_SINGLE_CHECK, e.to_string())),
        }
    }

    let failures_before = a.stats.failures.load(std::sync::atomic::Ordering::Relaxed);
    let status = a.status_text().await;
    a.tick(u64::MAX / 2).await;
    let failures_after = a.stats.failures.load(std::sync::atomic::Ordering::Relaxed);
    checks.push(check(
        "observe, tick and status never trap",
        failures_after == failures_before
            && a.stats.resets.load(std::sync::atomic::Ordering::Relaxed) == 0,
        String::new(),
    ));
    match status {
        Ok(text) => checks.push(check(
            "status is JSON",
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            text,
        )),
        Err(e) => checks.push(fail("status is JSON", e.to_string())),
    }
}

const SELECT_SINGLE_CHECK: &str = "declared select-single holds (one candidate: that candidate, no hedge, no metadata, no state changed)";

/// Checks a `select-single` declaration against the guest itself: `c` gets a single-candidate
/// `select` before each case that both it and `d` decide, so a single-candidate call that
/// changed the strategy's state shows as the two diverging.
async fn select_single_holds(c: &ModelRouter, d: &ModelRouter, rng: &mut StdRng) -> ContractCheck {
    let mut problems = Vec::new();
    for case in 0..CASES {
        let (request, candidates) = random_case(rng);
        let only = [candidates[rng.random_range(0..candidates.len())]];
        match c.select_in_guest(&request, &only).await {
            Ok(decision) => {
                if decision.order != [only[0].index]
                    || decision.hedge.is_some()
                    || !decision.strategy_metadata.is_empty()
                {
                    problems.push(format!(
                        "case {case}: one candidate ({}) gave order {:?}, hedge {:?}, metadata {:?}",
                        only[0].index, decision.order, decision.hedge, decision.strategy_metadata
                    ));
                }
            }
            Err(e) => problems.push(format!("case {case}: {e}")),
        }
        let after = c.select_in_guest(&request, &candidates).await;
        let unaffected = d.select_in_guest(&request, &candidates).await;
        if let (Ok(after), Ok(unaffected)) = (&after, &unaffected)
            && after.order != unaffected.order
        {
            problems.push(format!(
                "case {case}: after a single-candidate select the order was {:?}, without it {:?}",
                after.order, unaffected.order
            ));
        }
        if problems.len() >= MAX_FAILING_CASES {
            break;
        }
    }
    summary(SELECT_SINGLE_CHECK, &problems)
}

fn route_table() -> Vec<UpstreamInfo> {
    (0..ROUTES)
        .map(|i| UpstreamInfo {
            index: i,
            endpoint_id: format!("contract-model:local-{}", 9000 + i),
            provider: "openai_compat".into(),
            base_url: format!("http://127.0.0.1:{}/v1", 9000 + i),
            provider_model_id: "sim".into(),
            weight: 1.0 + f64::from(i),
            priority: (i % 2) as i32,
            input_modalities: vec!["text".into()],
            pricing: None,
            metadata_json: "{}".into(),
        })
        .collect()
}

fn random_case(rng: &mut StdRng) -> (Request, Vec<Candidate>) {
    let request = Request {
        caller_hash: rng.random(),
        prompt_tokens: rng.random_range(0..300_000),
        max_tokens: rng.random_bool(0.5).then(|| rng.random_range(1..8192)),
        stream: rng.random(),
        modalities: Modalities::empty(),
        seed: rng.random(),
        now_ms: 1_700_000_000_000 + rng.random_range(0..86_400_000),
        prefill: PrefillPolicy {
            enabled: rng.random_bool(0.8),
            intervene_tokens: 50_000,
            elephant_tokens: 200_000,
            elephant_limit: 1,
        },
        remaining_budget_usd: rng.random_bool(0.2).then(|| rng.random_range(0.0..100.0)),
    };
    let included: Vec<u32> = (0..ROUTES).filter(|_| rng.random_bool(0.7)).collect();
    let mut candidates: Vec<Candidate> = included
        .into_iter()
        .map(|i| Candidate {
            index: i,
            weight: if rng.random_bool(0.1) {
                0.0
            } else {
                rng.random_range(0.01..10.0)
            },
            priority: (i % 2) as i32,
            availability: rng.random_range(0.0..=1.0),
            circuit: if rng.random_bool(0.1) {
                CircuitState::HalfOpen
            } else {
                CircuitState::Closed
            },
            prefill_backlog_tokens: rng.random_range(0..400_000),
            inflight_elephants: rng.random_range(0..3),
            uncached_prompt_tokens: rng.random_range(0..300_000),
            ttft_ms: rng.random_bool(0.5).then(|| rng.random_range(10.0..5000.0)),
            latency_ms: rng
                .random_bool(0.5)
                .then(|| rng.random_range(10.0..50000.0)),
            inflight_requests: rng.random_range(0..8),
            affinity_pinned: false,
        })
        .collect();
    if candidates.is_empty() {
        candidates.push(Candidate {
            index: 0,
            weight: 1.0,
            priority: 0,
            availability: 1.0,
            circuit: CircuitState::Closed,
            prefill_backlog_tokens: 0,
            inflight_elephants: 0,
            uncached_prompt_tokens: 0,
            ttft_ms: None,
            latency_ms: None,
            inflight_requests: 0,
            affinity_pinned: false,
        });
    }
    (request, candidates)
}

fn check(name: &'static str, passed: bool, detail: String) -> ContractCheck {
    ContractCheck {
        name,
        passed,
        detail,
    }
}

fn pass(name: &'static str, detail: String) -> ContractCheck {
    check(name, true, detail)
}

fn fail(name: &'static str, detail: String) -> ContractCheck {
    check(name, false, detail)
}

fn summary(name: &'static str, problems: &[String]) -> ContractCheck {
    if problems.is_empty() {
        pass(name, format!("{CASES} cases"))
    } else {
        let shown: Vec<&str> = problems.iter().take(3).map(String::as_str).collect();
        fail(
            name,
            format!("{} of {CASES} cases: {}", problems.len(), shown.join("; ")),
        )
    }
}
