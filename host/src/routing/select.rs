//! The selection pipeline, in order: modality filter → explicit pin → weight and breaker admission
//! → the model's strategy. A strategy that cannot answer is replaced by declared order.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::config::RouteConfig;
use crate::strategy::{Candidate, CircuitState as WitCircuit, Modalities, Request};

use super::health::{CircuitState, HealthRegistry};
use super::policy::zero_reason;
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

/// A route left out before or during dispatch, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Exclusion {
    pub endpoint_id: String,
    pub reason: String,
}

/// Why a request cannot be routed at all.
#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    /// No route accepts the request's input modalities.
    #[error("no route of model `{model}` accepts {} input", missing.join(" and "))]
    MissingModality {
        model: String,
        missing: Vec<&'static str>,
        excluded: Vec<Exclusion>,
    },
    /// `X-Route-Pin` named nothing this model routes to.
    #[error("X-Route-Pin `{pin}` matches no route of model `{model}`; its endpoints: {}", endpoints.join(", "))]
    PinNotFound {
        model: String,
        pin: String,
        endpoints: Vec<String>,
    },
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

pub fn describe(excluded: &[Exclusion]) -> String {
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
    /// An operator pinned the route: no fallback, and the breaker is not consulted.
    pub pinned: bool,
    /// Routes excluded before the strategy ran.
    pub excluded: Vec<Exclusion>,
}

const MODALITIES: [(Modalities, &str); 3] = [
    (Modalities::IMAGE, "image"),
    (Modalities::AUDIO, "audio"),
    (Modalities::VIDEO, "video"),
];

/// The request's non-text modalities this route does not accept.
pub fn missing_modalities(route: &RouteConfig, wanted: Modalities) -> Vec<&'static str> {
    MODALITIES
        .iter()
        .filter(|(flag, name)| {
            wanted.contains(*flag) && !route.input_modalities.iter().any(|m| m == name)
        })
        .map(|(_, name)| *name)
        .collect()
}

/// Runs the pipeline for one request. `pin` is an admin caller's `X-Route-Pin`.
pub async fn select(
    model: &ModelEntry,
    facts: &RequestFacts,
    health: &HealthRegistry,
    pin: Option<&str>,
) -> Result<Plan, SelectionError> {
    let routes = model.routes();
    let mut excluded = Vec::new();

    // 1. Modalities.
    let mut admitted: Vec<&RouteConfig> = Vec::with_capacity(routes.len());
    let mut missing_everywhere: Vec<&'static str> = Vec::new();
    for route in routes {
        let missing = missing_modalities(route, facts.modalities);
        if missing.is_empty() {
            admitted.push(route);
        } else {
            for m in &missing {
                if !missing_everywhere.contains(m) {
                    missing_everywhere.push(m);
                }
            }
            excluded.push(Exclusion {
                endpoint_id: route.endpoint_id.clone(),
                reason: format!("does not accept {} input", missing.join(" and ")),
            });
        }
    }
    if admitted.is_empty() && !routes.is_empty() {
        return Err(SelectionError::MissingModality {
            model: model.id().to_owned(),
            missing: missing_everywhere,
            excluded,
        });
    }

    // 2. An operator's pin selects one route directly; weight 0 still means "not pinnable".
    if let Some(pin) = pin {
        let hit = admitted
            .iter()
            .find(|r| r.endpoint_id == pin)
            .or_else(|| admitted.iter().find(|r| r.kind.as_str() == pin));
        return match hit {
            Some(route) if route.weight > 0.0 => Ok(Plan {
                order: vec![position(routes, route.index)],
                strategy_metadata: String::new(),
                strategy_error: None,
                pinned: true,
                excluded,
            }),
            Some(route) => Err(SelectionError::NoAdmissibleRoute {
                model: model.id().to_owned(),
                excluded: vec![Exclusion {
                    endpoint_id: route.endpoint_id.clone(),
                    reason: format!("pinned, but {}", zero_reason(route)),
                }],
            }),
            None => Err(SelectionError::PinNotFound {
                model: model.id().to_owned(),
                pin: pin.to_owned(),
                endpoints: routes.iter().map(|r| r.endpoint_id.clone()).collect(),
            }),
        };
    }

    // 3. Weight and breaker admission.
    let now = Instant::now();
    let mut candidates = Vec::with_capacity(admitted.len());
    for route in admitted {
        if route.weight <= 0.0 {
            excluded.push(Exclusion {
                endpoint_id: route.endpoint_id.clone(),
                reason: zero_reason(route).to_owned(),
            });
            continue;
        }
        let circuit = match health.admits(&route.endpoint_id, now) {
            None => {
                excluded.push(Exclusion {
                    endpoint_id: route.endpoint_id.clone(),
                    reason: "circuit open".into(),
                });
                continue;
            }
            Some(CircuitState::HalfOpen) => WitCircuit::HalfOpen,
            Some(_) => WitCircuit::Closed,
        };
        candidates.push(Candidate {
            index: route.index,
            weight: route.weight,
            priority: route.priority,
            availability: health.availability(&route.endpoint_id),
            circuit,
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

    // 4. The strategy orders what is left.
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let request = Request {
        caller_hash: facts.caller_hash,
        prompt_tokens: facts.prompt_tokens,
        max_tokens: facts.max_tokens,
        stream: facts.stream,
        modalities: facts.modalities,
        seed: rand::random(),
        now_ms: unix.as_millis() as u64,
    };
    match model.router.select(&request, &candidates).await {
        Ok(decision) => Ok(Plan {
            order: decision
                .order
                .iter()
                .map(|&i| position(routes, i))
                .collect(),
            strategy_metadata: decision.strategy_metadata,
            strategy_error: None,
            pinned: false,
            excluded,
        }),
        // A broken strategy never fails the request: declared order keeps it served.
        Err(e) => Ok(Plan {
            order: candidates
                .iter()
                .map(|c| position(routes, c.index))
                .collect(),
            strategy_metadata: String::new(),
            strategy_error: Some(e.to_string()),
            pinned: false,
            excluded,
        }),
    }
}

/// Position of a declared index in the route list (they coincide for config-built tables).
fn position(routes: &[RouteConfig], index: u32) -> usize {
    routes
        .iter()
        .position(|r| r.index == index)
        .unwrap_or(index as usize)
}
