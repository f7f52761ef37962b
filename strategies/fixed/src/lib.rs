//! `fixed`: a weighted random primary, then the other candidates in declared order.
//!
//! The primary is chosen prefill-aware (see `switchyard_sdk::prefill_aware_primary`): weights decide
//! until an endpoint's pending prefill passes the host's intervention threshold, and elephants avoid
//! endpoints already prefilling one.
//!
//! The primary is drawn with probability proportional to the candidates' weights, renormalised over
//! the candidates the host passed, using the request's seed. Candidates with a zero, negative or
//! non-finite weight are never the primary unless no candidate has a usable weight, in which case the
//! whole order is the declared order.

use schemars::JsonSchema;
use serde::Deserialize;
use switchyard_sdk::{
    Candidate, Decision, Request, Rng, Strategy, StrategyInfo, declared_order,
    prefill_aware_primary, primary_then_declared,
};

/// `fixed` takes no parameters.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FixedParams {}

/// Stateless: every decision depends only on the request's seed and the candidates.
#[derive(Debug)]
pub struct Fixed;

impl Strategy for Fixed {
    type Params = FixedParams;

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "fixed",
            env!("CARGO_PKG_VERSION"),
            "Weighted random primary by route weight; fallbacks in declared order.",
        )
    }

    fn create(_model_id: &str, _params: FixedParams) -> Result<Self, String> {
        Ok(Self)
    }

    fn select(&mut self, request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
        let mut rng = Rng::for_request(request);
        let order = match prefill_aware_primary(candidates, &request.prefill, &mut rng) {
            Some(primary) => primary_then_declared(candidates, primary),
            None => declared_order(candidates),
        };
        Ok(Decision::new(order))
    }
}

switchyard_sdk::export_strategy!(Fixed);

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_sdk::{CircuitState, params_schema, parse_params};

    fn fixed() -> Result<Fixed, String> {
        Fixed::create("m", parse_params("{}")?)
    }

    fn select(weights: &[(u32, f64)], seed: u64) -> Result<Vec<u32>, String> {
        let candidates: Vec<Candidate> =
            weights.iter().map(|&(i, w)| Candidate::new(i, w)).collect();
        Ok(fixed()?
            .select(&Request::with_seed(seed), &candidates)?
            .order)
    }

    #[test]
    fn info_names_the_strategy() {
        assert_eq!(Fixed::info().name, "fixed");
    }

    #[test]
    fn deterministic_for_equal_inputs() -> Result<(), String> {
        let weights = [(0, 1.0), (1, 2.0), (2, 3.0)];
        for seed in 0..200 {
            assert_eq!(select(&weights, seed)?, select(&weights, seed)?);
        }
        Ok(())
    }

    #[test]
    fn weighted_split_within_tolerance() -> Result<(), String> {
        let mut primary_zero = 0u32;
        for seed in 0..10_000 {
            if select(&[(0, 0.7), (1, 0.3)], seed)?[0] == 0 {
                primary_zero += 1;
            }
        }
        let share = f64::from(primary_zero) / 10_000.0;
        assert!((share - 0.7).abs() <= 0.03, "share {share}");
        Ok(())
    }

    #[test]
    fn weights_renormalise_over_the_candidates_passed() -> Result<(), String> {
        // Route 1 (weight 0.5) was not admitted: 2 and 5 split 1:3.
        let mut primary_five = 0u32;
        for seed in 0..10_000 {
            if select(&[(2, 0.1), (5, 0.3)], seed)?[0] == 5 {
                primary_five += 1;
            }
        }
        let share = f64::from(primary_five) / 10_000.0;
        assert!((share - 0.75).abs() <= 0.03, "share {share}");
        Ok(())
    }

    #[test]
    fn order_is_a_permutation_of_candidate_indexes_with_declared_fallbacks() -> Result<(), String> {
        // Passed out of declared order on purpose.
        let weights = [(7, 1.0), (2, 1.0), (4, 0.0), (9, 2.0)];
        for seed in 0..1_000 {
            let order = select(&weights, seed)?;
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![2, 4, 7, 9], "{order:?}");
            assert_ne!(order[0], 4, "zero weight chosen as primary");
            let mut rest = order[1..].to_vec();
            rest.sort_unstable();
            assert_eq!(rest, order[1..].to_vec(), "fallbacks not in declared order");
        }
        Ok(())
    }

    #[test]
    fn non_positive_weights_never_primary() -> Result<(), String> {
        let weights = [(0, 0.0), (1, -3.0), (2, f64::NAN), (3, 0.5)];
        for seed in 0..1_000 {
            assert_eq!(select(&weights, seed)?, vec![3, 0, 1, 2]);
        }
        Ok(())
    }

    #[test]
    fn all_zero_weights_give_declared_order() -> Result<(), String> {
        for seed in 0..100 {
            assert_eq!(
                select(&[(3, 0.0), (1, 0.0), (2, 0.0)], seed)?,
                vec![1, 2, 3]
            );
        }
        assert!(select(&[], 1)?.is_empty());
        Ok(())
    }

    #[test]
    fn ignores_circuit_state() -> Result<(), String> {
        let candidates = [
            Candidate {
                circuit: CircuitState::HalfOpen,
                ..Candidate::new(0, 1.0)
            },
            Candidate::new(1, 0.0),
        ];
        assert_eq!(
            fixed()?.select(&Request::with_seed(5), &candidates)?.order,
            vec![0, 1]
        );
        Ok(())
    }

    #[test]
    fn schema_rejects_unknown_keys() {
        let schema = params_schema::<FixedParams>();
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["type"], "object");
        let error = parse_params::<FixedParams>(r#"{"weights": [1]}"#)
            .err()
            .unwrap_or_default();
        assert!(error.contains("unknown field `weights`"), "{error}");
    }
}
