//! The selection pipeline: admit routes, let the model's strategy order them, and fall back to
//! declared order when the strategy cannot answer.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::strategy::{Candidate, CircuitState, Modalities, Request};

use super::table::ModelEntry;

/// What the pipeline knows about a request before choosing, reduced to what routing needs.
#[derive(Debug, Clone, Default)]
pub struct RequestFacts {
    /// Stable hash of the caller's affinity key; 0 for internal traffic.
    pub caller_hash: u64,
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    pub stream: bool,
    pub modalities: Modalities,
}

/// A route left out before the strategy ran, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Exclusion {
    pub endpoint_id: String,
    pub reason: String,
}

/// Why a request cannot be routed at all.
#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    /// Every route was excluded; the list says which and why.
    #[error(
        "no route of model `{model}` can take this request: {}",
        describe(excluded)
    )]
    NoAdmissibleRoute {
        model: String,
        excluded: Vec<Exclusion>,
    },
}

fn describe(excluded: &[Exclusion]) -> String {
    if excluded.is_empty() {
        return "the model has no routes".into();
    }
    excluded
        .iter()
        .map(|e| format!("{} ({})", e.endpoint_id, e.reason))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The routes to try, in order, as positions in the model's route list.
#[derive(Debug, Clone)]
pub struct Plan {
    pub order: Vec<usize>,
    pub strategy_metadata: String,
    /// Set when the strategy failed and declared order was used instead.
    pub strategy_error: Option<String>,
}

/// Runs the pipeline for one request.
pub async fn select(model: &ModelEntry, facts: &RequestFacts) -> Result<Plan, SelectionError> {
    let routes = model.routes();
    let mut excluded = Vec::new();
    let mut candidates = Vec::with_capacity(routes.len());
    for route in routes {
        if route.weight <= 0.0 {
            excluded.push(Exclusion {
                endpoint_id: route.endpoint_id.clone(),
                reason: "weight 0".into(),
            });
            continue;
        }
        candidates.push(Candidate {
            index: route.index,
            weight: route.weight,
            priority: route.priority,
            availability: 1.0,
            circuit: CircuitState::Closed,
            prefill_backlog_tokens: 0,
            inflight_elephants: 0,
            uncached_prompt_tokens: u64::from(facts.prompt_tokens),
            ttft_ms: None,
            latency_ms: None,
        });
    }
    if candidates.is_empty() {
        return Err(SelectionError::NoAdmissibleRoute {
            model: model.id().to_owned(),
            excluded,
        });
    }

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let request = Request {
        caller_hash: facts.caller_hash,
        prompt_tokens: facts.prompt_tokens,
        max_tokens: facts.max_tokens,
        stream: facts.stream,
        modalities: facts.modalities,
        seed: rand::random(),
        now_ms: now.as_millis() as u64,
    };
    let position = |index: u32| routes.iter().position(|r| r.index == index);
    match model.router.select(&request, &candidates).await {
        Ok(decision) => Ok(Plan {
            order: decision.order.iter().filter_map(|&i| position(i)).collect(),
            strategy_metadata: decision.strategy_metadata,
            strategy_error: None,
        }),
        // A broken strategy never fails the request: declared order keeps it served.
        Err(e) => Ok(Plan {
            order: candidates
                .iter()
                .filter_map(|c| position(c.index))
                .collect(),
            strategy_metadata: String::new(),
            strategy_error: Some(e.to_string()),
        }),
    }
}
