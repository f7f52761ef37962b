//! `test-echo-inputs`: answers `select` with declared order and, as its metadata, every field of the
//! request and the candidates exactly as the guest received them (JSON).
//!
//! The host writes `select`'s arguments into guest memory with its own lowering code rather than
//! wasmtime's generic one (it is the hot path); this strategy lets a test prove that what arrives is
//! what the host meant, field by field. The JSON is the shape of the host's recordings, so the test
//! compares it with the host's own encoding of what it sent.

use switchyard_sdk::serde_json::{Value, json};
use switchyard_sdk::{
    Candidate, CircuitState, Decision, Modalities, NoParams, Request, Strategy, StrategyInfo,
    declared_order,
};

/// Echoes its inputs.
#[derive(Debug)]
pub struct EchoInputs;

/// The request in the shape the host records it (`switchyard::strategy::record::request_json`).
fn request_json(r: &Request) -> Value {
    let modalities: Vec<&str> = [
        (Modalities::IMAGE, "image"),
        (Modalities::AUDIO, "audio"),
        (Modalities::VIDEO, "video"),
    ]
    .into_iter()
    .filter(|(flag, _)| r.modalities.contains(*flag))
    .map(|(_, name)| name)
    .collect();
    json!({
        "prompt_tokens": r.prompt_tokens,
        "max_tokens": r.max_tokens,
        "stream": r.stream,
        "seed": r.seed,
        "now_ms": r.now_ms,
        "caller_hash": r.caller_hash,
        "modalities": modalities,
        "prefill": {
            "enabled": r.prefill.enabled,
            "intervene_tokens": r.prefill.intervene_tokens,
            "elephant_tokens": r.prefill.elephant_tokens,
            "elephant_limit": r.prefill.elephant_limit,
        },
        "remaining_budget_usd": r.remaining_budget_usd,
    })
}

/// A candidate in the shape the host records it.
fn candidate_json(c: &Candidate) -> Value {
    json!({
        "index": c.index,
        "weight": c.weight,
        "priority": c.priority,
        "availability": c.availability,
        "circuit": match c.circuit {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        },
        "prefill_backlog_tokens": c.prefill_backlog_tokens,
        "inflight_elephants": c.inflight_elephants,
        "uncached_prompt_tokens": c.uncached_prompt_tokens,
        "ttft_ms": c.ttft_ms,
        "latency_ms": c.latency_ms,
        "inflight_requests": c.inflight_requests,
        "affinity_pinned": c.affinity_pinned,
    })
}

impl Strategy for EchoInputs {
    type Params = NoParams;

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "test-echo-inputs",
            env!("CARGO_PKG_VERSION"),
            "Test only: select answers declared order with its inputs, as JSON, in the metadata.",
        )
    }

    fn create(_model_id: &str, _params: NoParams) -> Result<Self, String> {
        Ok(Self)
    }

    fn select(&mut self, request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
        let echo = json!({
            "request": request_json(request),
            "candidates": candidates.iter().map(candidate_json).collect::<Vec<_>>(),
        });
        Ok(Decision::new(declared_order(candidates)).with_metadata(echo.to_string()))
    }
}

switchyard_sdk::export_strategy!(EchoInputs);
