//! The host's own view of what a strategy is told and answers: plain Rust types that the rest of the
//! host (routing, the CLI, benches) uses. The WIT records of each API version are converted to and
//! from these in `wit/`, and nowhere else, so a new WIT version touches this module only.
//!
//! The types follow the newest WIT version (0.2.0); older versions are adapted to them.

use crate::config::ModelUpstream;

/// The non-text inputs a request carries (the protocol layer's type; converted to the WIT flags).
pub use crate::protocol::ir::Modalities;

/// The host's prefill-aware routing knobs, passed with every request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillPolicy {
    /// `ROUTING_PREFILL_AWARE_ENABLED`: when false, weights decide alone.
    pub enabled: bool,
    /// Pending uncached tokens on the heavier draw's endpoint at which load starts to win.
    pub intervene_tokens: u64,
    /// Uncached prompt size from which a request is an elephant.
    pub elephant_tokens: u64,
    /// Elephants an endpoint may prefill at once before new elephants avoid it.
    pub elephant_limit: u32,
}

/// What the host knows about one request, reduced to numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// Stable hash of the caller's affinity key; 0 for internal traffic with no caller.
    pub caller_hash: u64,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    pub stream: bool,
    pub modalities: Modalities,
    /// Randomness comes from the host, so a decision is reproducible from its inputs.
    pub seed: u64,
    /// Milliseconds since the Unix epoch.
    pub now_ms: u64,
    pub prefill: PrefillPolicy,
    /// What the caller may still spend in the current budget period (USD); `None` without a budget.
    /// Not seen by 0.1.0 strategies.
    pub remaining_budget_usd: Option<f64>,
}

/// The breaker state of a candidate's endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

/// An upstream the host admitted for one request, with the live signals it knows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The upstream's declared index.
    pub index: u32,
    pub weight: f64,
    pub priority: i32,
    /// EWMA of the endpoint's success rate, 0..1.
    pub availability: f64,
    pub circuit: CircuitState,
    /// Uncached prompt tokens currently in prefill on this endpoint.
    pub prefill_backlog_tokens: u64,
    /// Elephant prompts currently in prefill on this endpoint.
    pub inflight_elephants: u32,
    /// This request's estimated uncached prompt tokens on this endpoint.
    pub uncached_prompt_tokens: u64,
    pub ttft_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    /// Attempts in flight on this endpoint in this process. Not seen by 0.1.0 strategies.
    pub inflight_requests: u32,
    /// Session affinity pins the caller to this candidate. Not seen by 0.1.0 strategies.
    pub affinity_pinned: bool,
}

/// A strategy's request to race a backup when the primary is slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HedgeRequest {
    /// Send the backup when the primary has not answered this many milliseconds after it was sent.
    pub after_ms: u32,
    /// Declared index of the backup.
    pub backup: u32,
}

/// A strategy's answer to `select`.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Declared indexes, primary first (checked by the router before it is returned).
    pub order: Vec<u32>,
    /// For 0.1.0 strategies, parsed from the legacy `;hedge=<ms>@<index>` metadata suffix.
    pub hedge: Option<HedgeRequest>,
    /// Opaque; handed back unchanged in the observations of this request.
    pub strategy_metadata: String,
}

/// What happened to one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub index: u32,
    pub success: bool,
    /// Milliseconds to the first token (or to the whole answer when not streamed).
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens the upstream reported as read from its cache.
    pub cached_prompt_tokens: u32,
    /// HTTP status of the upstream answer; 0 for a transport error or timeout.
    pub status: u16,
    pub strategy_metadata: String,
    pub now_ms: u64,
}

/// Prices in USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pricing {
    pub prompt: f64,
    pub completion: f64,
    pub input_cache_reads: f64,
    pub input_cache_writes: f64,
}

/// One upstream of a model (one entry of its `route:` list) as its strategy is told about it
/// through `refresh-upstreams` (0.1.0: `refresh-route-table`).
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamInfo {
    /// Position in the model's declared `route:` list.
    pub index: u32,
    /// `{model_id}:{location}`.
    pub endpoint_id: String,
    /// Provider protocol (`openai_compat`, `anthropic`, ...).
    pub provider: String,
    pub base_url: String,
    pub provider_model_id: String,
    /// Effective weight after overrides.
    pub weight: f64,
    pub priority: i32,
    pub input_modalities: Vec<String>,
    pub pricing: Option<Pricing>,
    /// Resource metadata as a JSON object; `{}` when none.
    pub metadata_json: String,
}

/// What a strategy says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrategyInfo {
    pub name: String,
    pub version: String,
    pub description: String,
}

/// A model's upstreams as its strategy sees them, built from the host's config.
pub fn upstream_table(routes: &[ModelUpstream]) -> Vec<UpstreamInfo> {
    routes
        .iter()
        .map(|r| UpstreamInfo {
            index: r.index,
            endpoint_id: r.endpoint_id.clone(),
            provider: r.kind.as_str().to_owned(),
            // Strategies route by host and path; a password in the URL is none of theirs (and their
            // status is shown by `/routing`).
            base_url: crate::entity::mask_url_password(&r.base_url).into_owned(),
            provider_model_id: r.provider_model_id.clone(),
            weight: r.weight,
            priority: r.priority,
            input_modalities: r.input_modalities.clone(),
            pricing: r.pricing.map(|p| Pricing {
                prompt: p.prompt,
                completion: p.completion,
                input_cache_reads: p.input_cache_reads.unwrap_or(0.0),
                input_cache_writes: p.input_cache_writes.unwrap_or(0.0),
            }),
            metadata_json: serde_json::Value::Object(r.metadata.clone()).to_string(),
        })
        .collect()
}
