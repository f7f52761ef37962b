//! `least_backlog` in Rust: the primary is the candidate with the least prefill backlog in the
//! highest priority tier; ties go to a weighted draw seeded by the request; the rest follow in
//! declared order. The same strategy as `../python/least_backlog.py` and `../js/least_backlog.js`:
//! the three SDKs share the helpers bit for bit, so for the same inputs all three decide the same
//! (tests/e2e/strategy_sdks.rs checks it).

use schemars::JsonSchema;
use serde::Deserialize;
use switchyard_sdk::{
    Candidate, Decision, Request, Rng, Strategy, StrategyInfo, primary_then_declared,
    priority_tiers, weighted_draw,
};

/// `router_params` of `least_backlog_rs`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Backlogs within this many tokens of the least tie.
    #[serde(default)]
    pub tolerance_tokens: u64,
}

pub struct LeastBacklog {
    tolerance: u64,
    selects: u64,
}

impl Strategy for LeastBacklog {
    type Params = Params;

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "least_backlog_rs",
            "0.1.0",
            "Least prefill backlog in the top tier; weight breaks ties.",
        )
    }

    fn create(_model_id: &str, params: Params) -> Result<Self, String> {
        Ok(Self {
            tolerance: params.tolerance_tokens,
            selects: 0,
        })
    }

    fn select(&mut self, request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
        self.selects += 1;
        let tiers = priority_tiers(candidates);
        let Some(top) = tiers.first() else {
            return Ok(Decision::new(Vec::new()));
        };
        let least = top
            .iter()
            .map(|&p| candidates[p].prefill_backlog_tokens)
            .min()
            .unwrap_or(0);
        let tied: Vec<usize> = top
            .iter()
            .copied()
            .filter(|&p| {
                candidates[p].prefill_backlog_tokens <= least.saturating_add(self.tolerance)
            })
            .collect();
        let weights: Vec<f64> = tied.iter().map(|&p| candidates[p].weight).collect();
        let primary = weighted_draw(&weights, &mut Rng::for_request(request))
            .map_or(tied[0], |drawn| tied[drawn]);
        Ok(Decision::new(primary_then_declared(candidates, primary)))
    }

    fn status(&self) -> String {
        format!("{{\"selects\": {}}}", self.selects)
    }
}

switchyard_sdk::export_strategy!(LeastBacklog);

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_sdk::parse_params;

    fn backlog(index: u32, weight: f64, tokens: u64) -> Candidate {
        Candidate {
            prefill_backlog_tokens: tokens,
            ..Candidate::new(index, weight)
        }
    }

    #[test]
    fn the_least_backlog_leads_and_ties_follow_weight() -> Result<(), String> {
        let mut router = LeastBacklog::create("m", parse_params("{}")?)?;
        let candidates = [
            backlog(0, 1.0, 900),
            backlog(1, 1.0, 100),
            backlog(2, 1.0, 500),
        ];
        for seed in 0..100 {
            let order = router.select(&Request::with_seed(seed), &candidates)?.order;
            assert_eq!(order, vec![1, 0, 2]);
        }
        let mut tolerant =
            LeastBacklog::create("m", parse_params(r#"{"tolerance_tokens": 500}"#)?)?;
        let tied = [backlog(0, 3.0, 600), backlog(1, 1.0, 100)];
        let zero_first = (0..4000)
            .filter(|&seed| {
                tolerant
                    .select(&Request::with_seed(seed), &tied)
                    .is_ok_and(|d| d.order[0] == 0)
            })
            .count();
        assert!((2800..3200).contains(&zero_first), "{zero_first}");
        Ok(())
    }
}
