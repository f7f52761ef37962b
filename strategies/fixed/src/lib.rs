//! `fixed`: priority tiers, a weighted random primary in the highest tier that can have one, then
//! the rest of that tier and each lower tier.
//!
//! **Tiers.** Candidates are grouped by `priority`, highest first. The primary's tier is the highest
//! tier with a usable weight (finite and positive); the order is the primary, the rest of its tier,
//! then the other tiers from the highest priority down. So a tier never precedes a tier of higher
//! priority, except that a higher tier without any usable weight follows the primary's tier instead
//! of pushing a route weighted 0 into the primary slot. When all candidates share one priority there
//! is one tier and `fixed` behaves exactly as it did before tiers.
//!
//! **Primary.** Drawn in the primary's tier with probability proportional to the weights,
//! renormalised over that tier's candidates, using the request's seed, and prefill-aware (see
//! `switchyard_sdk::prefill_aware_primary`): weights decide until an endpoint's pending prefill
//! passes the host's intervention threshold, and elephants avoid endpoints already prefilling one.
//! A zero, negative or non-finite weight is never drawn; such a candidate leads only when the tier
//! leaves nothing usable to draw from (no usable weight at all, or only elephant-capped ones): then
//! the least-loaded endpoint leads when the host's prefill policy is on, else the tier keeps
//! declared order. With no usable weight anywhere, the primary's tier is the top one.
//!
//! **Fallbacks** within a tier follow the `fallback_order` param: `declared` (the default) keeps
//! declared order; `weighted` draws them by weight without replacement with the request's seed, so a
//! lower tier's first entry is a weighted draw over that tier, and candidates without a usable
//! weight come last in declared order. A tier without usable weights is in declared order either
//! way.
//!
//! **Session affinity.** When the host marks a candidate `affinity_pinned` (the caller's prompt
//! cache is warm there), it goes first and the rest keep the order above: a conversation stays on
//! its endpoint while the host admits it, whatever the draw says. The draw still happens, so the
//! fallbacks are what they would have been.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use switchyard_sdk::{
    Candidate, Decision, Request, Rng, Skips, Strategy, StrategyInfo, affinity_first,
    order_of_positions, prefill_aware_primary, priority_tiers, usable_weight, weighted_shuffle,
};

/// How the fallbacks of a priority tier are ordered (the primary is always a weighted draw).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FallbackOrder {
    /// In declared order (the order of the model's `route` list).
    #[default]
    Declared,
    /// Weighted random without replacement, seeded by the request: each next fallback is drawn in
    /// proportion to its weight among those left. Routes without a usable weight come last, in
    /// declared order. A lower tier is shuffled as a whole, so its first route is a weighted draw.
    Weighted,
}

/// `router_params` of `fixed`. Every key is optional; unknown keys are rejected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FixedParams {
    /// How the fallbacks within each priority tier are ordered: `declared` or `weighted`.
    #[serde(default)]
    pub fallback_order: FallbackOrder,
}

/// Stateless: every decision depends only on the params, the request's seed and prefill policy,
/// and the candidates.
#[derive(Debug)]
pub struct Fixed {
    fallback_order: FallbackOrder,
}

impl Fixed {
    /// `positions` (declared order) arranged as fallbacks under `fallback_order`.
    fn arrange(&self, candidates: &[Candidate], positions: &[usize], rng: &mut Rng) -> Vec<usize> {
        match self.fallback_order {
            FallbackOrder::Declared => positions.to_vec(),
            FallbackOrder::Weighted => {
                let weights: Vec<f64> = positions.iter().map(|&p| candidates[p].weight).collect();
                weighted_shuffle(&weights, rng)
                    .into_iter()
                    .map(|i| positions[i])
                    .collect()
            }
        }
    }

    /// The primary's tier (`tier` in declared order): the primary, then the rest as fallbacks.
    fn primary_tier(
        &self,
        request: &Request,
        candidates: &[Candidate],
        tier: &[usize],
        rng: &mut Rng,
    ) -> Vec<usize> {
        // The draw sees the tier in the host's order, not declared order: with a single tier this
        // is the very slice (and so the very draw) `fixed` used before tiers existed.
        // A tier of every candidate (the common case) is the candidates themselves in host order:
        // no copies (each allocation in the guest shows in `select`'s time).
        let subset = (tier.len() != candidates.len()).then(|| {
            let mut host_order = tier.to_vec();
            host_order.sort_unstable();
            let members: Vec<Candidate> = host_order.iter().map(|&p| candidates[p]).collect();
            (host_order, members)
        });
        let members = subset.as_ref().map_or(candidates, |(_, members)| members);
        let Some(chosen) = prefill_aware_primary(members, &request.prefill, rng) else {
            // No usable weight and no prefill policy to pick by load.
            return self.arrange(candidates, tier, rng);
        };
        let primary = subset
            .as_ref()
            .map_or(chosen, |(host_order, _)| host_order[chosen]);
        let rest = tier.iter().copied().filter(|&p| p != primary);
        let mut order = Vec::with_capacity(tier.len());
        order.push(primary);
        match self.fallback_order {
            FallbackOrder::Declared => order.extend(rest),
            FallbackOrder::Weighted => {
                let rest: Vec<usize> = rest.collect();
                order.extend(self.arrange(candidates, &rest, rng));
            }
        }
        order
    }
}

impl Strategy for Fixed {
    type Params = FixedParams;

    // Stateless: nothing to learn or age, and one candidate can only be ordered one way.
    const SKIPS: Skips = Skips::NONE.observe().tick().select_single();

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "fixed",
            env!("CARGO_PKG_VERSION"),
            "Priority tiers; weighted random primary in the highest tier; fallbacks by tier, in \
             declared or weighted order.",
        )
    }

    fn create(_model_id: &str, params: FixedParams) -> Result<Self, String> {
        Ok(Self {
            fallback_order: params.fallback_order,
        })
    }

    fn select(&mut self, request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
        let mut rng = Rng::for_request(request);
        let tiers = priority_tiers(candidates);
        let has_usable =
            |tier: &Vec<usize>| tier.iter().any(|&p| usable_weight(candidates[p].weight));
        let first = tiers.iter().position(has_usable).unwrap_or(0);
        let mut positions = match tiers.get(first) {
            Some(tier) => self.primary_tier(request, candidates, tier, &mut rng),
            None => Vec::new(),
        };
        positions.reserve_exact(candidates.len() - positions.len());
        for (i, tier) in tiers.iter().enumerate() {
            if i != first {
                positions.extend(self.arrange(candidates, tier, &mut rng));
            }
        }
        let mut order = order_of_positions(candidates, &positions);
        affinity_first(candidates, &mut order);
        Ok(Decision::new(order))
    }
}

switchyard_sdk::export_strategy!(Fixed);

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_sdk::{
        CircuitState, declared_order, params_schema, parse_params, primary_then_declared,
    };

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
    fn the_affinity_pinned_candidate_leads_and_the_rest_keep_their_order() -> Result<(), String> {
        let mut candidates = tiered(&[(0, 9.0, 1), (1, 1.0, 1), (2, 1.0, 0)]);
        candidates[2].affinity_pinned = true;
        for seed in 0..500 {
            let unpinned = {
                let mut c = candidates.clone();
                c[2].affinity_pinned = false;
                order("{}", &c, seed)?
            };
            let pinned = order("{}", &candidates, seed)?;
            let mut expected = vec![2];
            expected.extend(unpinned.into_iter().filter(|&i| i != 2));
            assert_eq!(pinned, expected, "seed {seed}");
        }
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

    // --- priority tiers and `fallback_order` ---

    fn with(params: &str) -> Result<Fixed, String> {
        Fixed::create("m", parse_params(params)?)
    }

    const DECLARED: &str = r#"{"fallback_order": "declared"}"#;
    const WEIGHTED: &str = r#"{"fallback_order": "weighted"}"#;

    /// `(index, weight, priority)`.
    fn tiered(spec: &[(u32, f64, i32)]) -> Vec<Candidate> {
        spec.iter()
            .map(|&(index, weight, priority)| Candidate {
                priority,
                ..Candidate::new(index, weight)
            })
            .collect()
    }

    fn order(params: &str, candidates: &[Candidate], seed: u64) -> Result<Vec<u32>, String> {
        Ok(with(params)?
            .select(&Request::with_seed(seed), candidates)?
            .order)
    }

    fn priority_of(candidates: &[Candidate], index: u32) -> i32 {
        candidates
            .iter()
            .find(|c| c.index == index)
            .map_or(i32::MIN, |c| c.priority)
    }

    /// A random case from the SDK's generator: up to 8 candidates, passed in a shuffled order, with
    /// priorities in -1..=2, some unusable weights, some prefill backlog and elephants.
    fn random_case(rng: &mut Rng) -> (Request, Vec<Candidate>) {
        let n = 1 + rng.below(8) as u32;
        let mut candidates: Vec<Candidate> = (0..n)
            .map(|i| Candidate {
                index: i * 2 + rng.below(2) as u32,
                weight: match rng.below(10) {
                    0 => 0.0,
                    1 => f64::NAN,
                    _ => 0.1 + rng.next_f64() * 5.0,
                },
                priority: rng.below(4) as i32 - 1,
                prefill_backlog_tokens: rng.below(120_000),
                inflight_elephants: rng.below(2) as u32,
                uncached_prompt_tokens: rng.below(300_000),
                ..Candidate::new(0, 0.0)
            })
            .collect();
        for i in (1..candidates.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            candidates.swap(i, j);
        }
        let mut request = Request::with_seed(rng.next_u64());
        request.prefill.enabled = rng.below(4) != 0;
        (request, candidates)
    }

    #[test]
    fn params_default_to_declared_and_reject_unknown_orders() -> Result<(), String> {
        assert_eq!(
            parse_params::<FixedParams>("{}")?.fallback_order,
            FallbackOrder::Declared
        );
        assert_eq!(
            parse_params::<FixedParams>(WEIGHTED)?.fallback_order,
            FallbackOrder::Weighted
        );
        let error = parse_params::<FixedParams>(r#"{"fallback_order": "random"}"#)
            .err()
            .unwrap_or_default();
        assert!(error.contains("fallback_order"), "{error}");
        let schema = params_schema::<FixedParams>();
        let property = &schema["properties"]["fallback_order"];
        assert_eq!(property["default"], "declared");
        assert!(property["description"].is_string(), "{schema}");
        let text = schema.to_string();
        assert!(
            text.contains(r#""declared""#) && text.contains(r#""weighted""#),
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn one_priority_with_default_params_is_the_pre_tier_order() -> Result<(), String> {
        // The order `fixed` produced before tiers: a prefill-aware draw over the candidates as
        // passed, then the others in declared order.
        let mut rng = Rng::new(11);
        for _ in 0..3_000 {
            let (request, mut candidates) = random_case(&mut rng);
            let priority = candidates[0].priority;
            candidates.iter_mut().for_each(|c| c.priority = priority);
            let mut draw = Rng::for_request(&request);
            let expected = match prefill_aware_primary(&candidates, &request.prefill, &mut draw) {
                Some(primary) => primary_then_declared(&candidates, primary),
                None => declared_order(&candidates),
            };
            for params in ["{}", DECLARED] {
                let order = with(params)?.select(&request, &candidates)?.order;
                assert_eq!(order, expected, "{params} {candidates:?}");
            }
        }
        Ok(())
    }

    #[test]
    fn every_order_is_a_permutation_and_deterministic() -> Result<(), String> {
        let mut rng = Rng::new(12);
        for _ in 0..3_000 {
            let (request, candidates) = random_case(&mut rng);
            for params in [DECLARED, WEIGHTED] {
                let order = with(params)?.select(&request, &candidates)?.order;
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, declared_order(&candidates), "{params} {order:?}");
                let again = with(params)?.select(&request, &candidates)?.order;
                assert_eq!(order, again, "{params}: same seed, same order");
            }
        }
        Ok(())
    }

    #[test]
    fn a_lower_tier_never_precedes_a_higher_one() -> Result<(), String> {
        let mut rng = Rng::new(13);
        for _ in 0..3_000 {
            let (request, mut candidates) = random_case(&mut rng);
            // Usable weights everywhere, so no tier is passed over for the primary.
            for c in &mut candidates {
                if !usable_weight(c.weight) {
                    c.weight = 1.0;
                }
            }
            for params in [DECLARED, WEIGHTED] {
                let order = with(params)?.select(&request, &candidates)?.order;
                let priorities: Vec<i32> =
                    order.iter().map(|&i| priority_of(&candidates, i)).collect();
                assert!(
                    priorities.windows(2).all(|w| w[0] >= w[1]),
                    "{params}: {order:?} has priorities {priorities:?}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn the_primary_comes_from_the_top_tier_by_weight() -> Result<(), String> {
        let candidates = tiered(&[(0, 9.0, 0), (1, 1.0, 5), (2, 3.0, 5), (3, 9.0, 1)]);
        let mut three = 0u32;
        for seed in 0..10_000 {
            let order = order(DECLARED, &candidates, seed)?;
            match order[..] {
                [2, 1, 3, 0] => three += 1,
                [1, 2, 3, 0] => {}
                _ => panic!("{order:?}"),
            }
        }
        let share = f64::from(three) / 10_000.0;
        assert!((share - 0.75).abs() <= 0.02, "share {share}");
        Ok(())
    }

    #[test]
    fn a_tier_without_usable_weights_is_passed_over_for_the_primary() -> Result<(), String> {
        // Tier 5 has only unusable weights: the primary is drawn in tier 1; tier 5 follows tier 1 in
        // declared order, then tier 0.
        let candidates = tiered(&[
            (0, 1.0, 0),
            (1, 0.0, 5),
            (2, 1.0, 1),
            (3, f64::NAN, 5),
            (4, 3.0, 1),
        ]);
        for params in [DECLARED, WEIGHTED] {
            let mut four = 0u32;
            for seed in 0..4_000 {
                let order = order(params, &candidates, seed)?;
                assert!(order[0] == 2 || order[0] == 4, "{params}: {order:?}");
                assert_eq!(order[2..], [1, 3, 0], "{params}: {order:?}");
                four += u32::from(order[0] == 4);
            }
            let share = f64::from(four) / 4_000.0;
            assert!((share - 0.75).abs() <= 0.03, "{params}: share {share}");
        }
        // Nothing usable anywhere: the top tier leads, each tier in declared order.
        let nothing = tiered(&[(0, 0.0, 0), (1, 0.0, 5), (2, 0.0, 1), (3, 0.0, 5)]);
        for params in [DECLARED, WEIGHTED] {
            assert_eq!(order(params, &nothing, 3)?, vec![1, 3, 2, 0], "{params}");
        }
        Ok(())
    }

    #[test]
    fn declared_fallbacks_keep_declared_order_in_every_tier() -> Result<(), String> {
        // Passed out of declared order on purpose.
        let candidates = tiered(&[
            (6, 5.0, 0),
            (3, 1.0, 2),
            (1, 1.0, 2),
            (4, 1.0, 0),
            (5, 1.0, 2),
            (2, 0.5, 0),
        ]);
        for seed in 0..2_000 {
            let order = order(DECLARED, &candidates, seed)?;
            let mut top = vec![1, 3, 5];
            top.retain(|&i| i != order[0]);
            assert_eq!(order[1..3], top[..], "{order:?}");
            assert_eq!(order[3..], [2, 4, 6], "{order:?}");
        }
        Ok(())
    }

    #[test]
    fn weighted_fallbacks_follow_weights_within_the_primary_tier() -> Result<(), String> {
        // Given the primary is 0, fallbacks 1 and 2 (weights 1:3) take second place 25/75.
        let candidates = tiered(&[(0, 2.0, 0), (1, 1.0, 0), (2, 3.0, 0)]);
        let (mut given, mut two_second) = (0u32, 0u32);
        for seed in 0..30_000 {
            let order = order(WEIGHTED, &candidates, seed)?;
            if order[0] == 0 {
                given += 1;
                two_second += u32::from(order[1] == 2);
            }
        }
        let share = f64::from(two_second) / f64::from(given);
        assert!(given > 8_000, "{given}");
        assert!((share - 0.75).abs() <= 0.02, "share {share} of {given}");
        Ok(())
    }

    #[test]
    fn a_weighted_lower_tier_starts_with_a_weighted_draw() -> Result<(), String> {
        let candidates = tiered(&[(0, 1.0, 1), (1, 1.0, 0), (2, 3.0, 0), (3, 0.0, 0)]);
        let mut two_second = 0u32;
        for seed in 0..10_000 {
            let order = order(WEIGHTED, &candidates, seed)?;
            assert_eq!(order[0], 0, "{order:?}");
            assert_eq!(order[3], 3, "unusable weights last: {order:?}");
            two_second += u32::from(order[1] == 2);
        }
        let share = f64::from(two_second) / 10_000.0;
        assert!((share - 0.75).abs() <= 0.02, "share {share}");
        // Declared: the lower tier in declared order, whatever the weights.
        for seed in 0..500 {
            assert_eq!(order(DECLARED, &candidates, seed)?, vec![0, 1, 2, 3]);
        }
        Ok(())
    }

    #[test]
    fn weighted_fallbacks_are_not_all_declared() -> Result<(), String> {
        // Guards against `weighted` silently behaving like `declared`.
        let candidates = tiered(&[(0, 1.0, 0), (1, 1.0, 0), (2, 1.0, 0), (3, 1.0, 0)]);
        let shuffled = (0..200)
            .filter_map(|seed| order(WEIGHTED, &candidates, seed).ok())
            .filter(|order| order[1..].windows(2).any(|w| w[0] > w[1]))
            .count();
        assert!(shuffled > 100, "{shuffled}");
        Ok(())
    }
}
