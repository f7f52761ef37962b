//! `{{name}}`: a weighted, prefill-aware primary, the rest in declared order, and (by default) the
//! caller's affinity-pinned upstream first. Scaffolded by `switchyard strategies new`; change
//! `select` to route your way.

use schemars::JsonSchema;
use serde::Deserialize;
use switchyard_sdk::{
    Candidate, Decision, Request, Rng, Strategy, StrategyInfo, affinity_first, declared_order,
    prefill_aware_primary, primary_then_declared,
};

/// `router_params` of `{{name}}`. Unknown keys are rejected.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Put the caller's affinity-pinned upstream (its warm prompt cache) first.
    #[serde(default = "yes")]
    pub honour_affinity: bool,
}

fn yes() -> bool {
    true
}

pub struct Router {
    honour_affinity: bool,
}

impl Strategy for Router {
    type Params = Params;

    // Calls this strategy does without save the gateway a call into it per request; declare only
    // what stays true as you change it (`switchyard strategies test` checks `select_single`):
    // const SKIPS: switchyard_sdk::Skips = switchyard_sdk::Skips::NONE.observe().tick().select_single();

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "{{name}}",
            env!("CARGO_PKG_VERSION"),
            "Weighted prefill-aware primary, declared fallbacks.",
        )
    }

    fn create(_model_id: &str, params: Params) -> Result<Self, String> {
        Ok(Self {
            honour_affinity: params.honour_affinity,
        })
    }

    fn select(&mut self, request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
        let mut rng = Rng::for_request(request);
        let mut order = match prefill_aware_primary(candidates, &request.prefill, &mut rng) {
            Some(primary) => primary_then_declared(candidates, primary),
            None => declared_order(candidates),
        };
        if self.honour_affinity {
            affinity_first(candidates, &mut order);
        }
        Ok(Decision::new(order))
    }
}

switchyard_sdk::export_strategy!(Router);

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_sdk::parse_params;

    fn router(params: &str) -> Router {
        Router::create("m", parse_params(params).unwrap()).unwrap()
    }

    #[test]
    fn every_candidate_once_and_the_same_seed_the_same_order() {
        let candidates = [Candidate::new(2, 1.0), Candidate::new(0, 3.0), Candidate::new(1, 0.0)];
        for seed in 0..200 {
            let order = router("{}").select(&Request::with_seed(seed), &candidates).unwrap().order;
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2]);
            assert_ne!(order[0], 1, "weight 0 is never the primary");
            let again = router("{}").select(&Request::with_seed(seed), &candidates).unwrap().order;
            assert_eq!(order, again);
        }
    }

    #[test]
    fn the_pinned_upstream_leads_unless_told_otherwise() {
        let mut candidates = [Candidate::new(0, 1.0), Candidate::new(1, 1.0)];
        candidates[1].affinity_pinned = true;
        for seed in 0..50 {
            let order = router("{}").select(&Request::with_seed(seed), &candidates).unwrap().order;
            assert_eq!(order[0], 1);
        }
        let mut free = router(r#"{"honour_affinity": false}"#);
        let primaries: std::collections::HashSet<u32> = (0..50)
            .map(|seed| free.select(&Request::with_seed(seed), &candidates).unwrap().order[0])
            .collect();
        assert_eq!(primaries.len(), 2, "both are drawn when affinity is ignored");
    }
}
