//! Prefill-aware choice of a primary.
//!
//! Weighted random choice balances request counts, the wrong unit when one uncached 300k-token
//! prompt can hold a replica for minutes. These helpers let load win over weights only when it
//! matters, and keep the host's thresholds (they arrive in [`Request::prefill`](crate::Request)).

use crate::order::weighted_draw;
use crate::{Candidate, PrefillPolicy, Rng};

/// Power of two choices: two independent weighted draws over `positions`; the lighter backlog wins
/// only when the heavier draw's endpoint has at least `intervene_tokens` pending. Below that the
/// first draw stands, so weights decide (a 10× weight is still drawn about 10× as often).
///
/// Returns a position in `candidates`; `None` when no position has a usable weight.
pub fn p2c(
    candidates: &[Candidate],
    positions: &[usize],
    intervene_tokens: u64,
    rng: &mut Rng,
) -> Option<usize> {
    let weights: Vec<f64> = positions.iter().map(|&p| candidates[p].weight).collect();
    let first = positions[weighted_draw(&weights, rng)?];
    let second = positions[weighted_draw(&weights, rng)?];
    if first == second {
        return Some(first);
    }
    let (a, b) = (&candidates[first], &candidates[second]);
    let (heavier, lighter) = if a.prefill_backlog_tokens >= b.prefill_backlog_tokens {
        (first, second)
    } else {
        (second, first)
    };
    if candidates[heavier].prefill_backlog_tokens >= intervene_tokens
        && candidates[lighter].prefill_backlog_tokens < candidates[heavier].prefill_backlog_tokens
    {
        Some(lighter)
    } else {
        Some(first)
    }
}

/// The position with the smallest backlog (ties: fewest elephants, then declared order).
pub fn least_loaded(candidates: &[Candidate], positions: &[usize]) -> Option<usize> {
    positions.iter().copied().min_by_key(|&p| {
        let c = &candidates[p];
        (c.prefill_backlog_tokens, c.inflight_elephants, c.index)
    })
}

/// The primary under the host's prefill policy.
///
/// - Disabled: a plain weighted draw.
/// - An elephant (this request's uncached size on a candidate ≥ `elephant_tokens`) avoids endpoints
///   already prefilling `elephant_limit` elephants, so two elephants serialise across replicas. A warm
///   continuation is small on its warm endpoint and is not barred there. When every candidate is at
///   the cap the rule degrades to least-loaded, never to a refusal.
/// - Then [`p2c`] over what is left.
///
/// Falls back to least-loaded when no candidate has a usable weight (never divides by zero).
pub fn prefill_aware_primary(
    candidates: &[Candidate],
    policy: &PrefillPolicy,
    rng: &mut Rng,
) -> Option<usize> {
    if !policy.enabled {
        let weights: Vec<f64> = candidates.iter().map(|c| c.weight).collect();
        return weighted_draw(&weights, rng);
    }
    let open: Vec<usize> = (0..candidates.len())
        .filter(|&p| {
            let c = &candidates[p];
            c.uncached_prompt_tokens < policy.elephant_tokens
                || c.inflight_elephants < policy.elephant_limit
        })
        .collect();
    if open.is_empty() {
        let all: Vec<usize> = (0..candidates.len()).collect();
        return least_loaded(candidates, &all);
    }
    p2c(candidates, &open, policy.intervene_tokens, rng).or_else(|| least_loaded(candidates, &open))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(index: u32, weight: f64, backlog: u64) -> Candidate {
        Candidate {
            prefill_backlog_tokens: backlog,
            ..Candidate::new(index, weight)
        }
    }

    const POLICY: PrefillPolicy = PrefillPolicy::DEFAULT;

    fn share_of_first(cands: &[Candidate], draws: u64) -> f64 {
        let mut first = 0;
        for seed in 0..draws {
            if prefill_aware_primary(cands, &POLICY, &mut Rng::new(seed)) == Some(0) {
                first += 1;
            }
        }
        first as f64 / draws as f64
    }

    #[test]
    fn exactly_at_the_threshold_the_lighter_endpoint_wins() {
        let cands = [cand(0, 1.0, 50_000), cand(1, 1.0, 0)];
        // Whenever the two draws differ, the heavier (at the threshold) loses; when both draw the
        // same endpoint it stands. Over many seeds the lighter wins 3/4 of the time.
        let share = share_of_first(&cands, 4000);
        assert!((share - 0.25).abs() < 0.03, "{share}");
    }

    #[test]
    fn one_below_the_threshold_the_weighted_draw_stands() {
        let cands = [cand(0, 1.0, 49_999), cand(1, 1.0, 0)];
        let share = share_of_first(&cands, 4000);
        assert!((share - 0.5).abs() < 0.03, "{share}");
    }

    #[test]
    fn weights_still_decide_below_the_threshold() {
        let cands = [cand(0, 0.9, 10_000), cand(1, 0.1, 0)];
        let share = share_of_first(&cands, 2000);
        assert!(share > 3.0 * (1.0 - share), "{share}");
        let cands = [cand(0, 10.0, 0), cand(1, 1.0, 0)];
        let share = share_of_first(&cands, 4000);
        assert!(
            (share / (1.0 - share) - 10.0).abs() < 2.0,
            "a 10x weight is drawn ~10x: {share}"
        );
    }

    #[test]
    fn all_zero_weights_never_divide_by_zero() {
        let cands = [cand(0, 0.0, 5), cand(1, 0.0, 1)];
        assert_eq!(
            prefill_aware_primary(&cands, &POLICY, &mut Rng::new(1)),
            Some(1)
        );
    }

    fn elephant(index: u32, inflight: u32, backlog: u64) -> Candidate {
        Candidate {
            uncached_prompt_tokens: 300_000,
            inflight_elephants: inflight,
            ..cand(index, 1.0, backlog)
        }
    }

    #[test]
    fn elephants_avoid_endpoints_at_the_cap_and_degrade_to_least_loaded() {
        let cands = [elephant(0, 1, 0), elephant(1, 0, 400_000)];
        for seed in 0..200 {
            assert_eq!(
                prefill_aware_primary(&cands, &POLICY, &mut Rng::new(seed)),
                Some(1)
            );
        }
        let all_capped = [elephant(0, 1, 300_000), elephant(1, 1, 200_000)];
        for seed in 0..50 {
            assert_eq!(
                prefill_aware_primary(&all_capped, &POLICY, &mut Rng::new(seed)),
                Some(1)
            );
        }
    }

    #[test]
    fn a_warm_continuation_is_not_barred_by_the_elephant_limit() {
        // 500k-token prompt, but only 10k uncached on endpoint 0 where the session is warm.
        let warm = Candidate {
            uncached_prompt_tokens: 10_000,
            inflight_elephants: 1,
            ..cand(0, 1.0, 0)
        };
        let cold = elephant(1, 0, 0);
        let picks: Vec<_> = (0..400)
            .map(|seed| prefill_aware_primary(&[warm, cold], &POLICY, &mut Rng::new(seed)))
            .collect();
        assert!(picks.contains(&Some(0)), "the warm endpoint stays eligible");
    }

    #[test]
    fn disabled_means_plain_weighted_choice() {
        let policy = PrefillPolicy {
            enabled: false,
            ..POLICY
        };
        let cands = [elephant(0, 5, 10_000_000), elephant(1, 0, 0)];
        let picks = (0..1000)
            .filter(|&s| prefill_aware_primary(&cands, &policy, &mut Rng::new(s)) == Some(0))
            .count();
        assert!((400..600).contains(&picks), "{picks}");
    }
}
