//! Building blocks for ordering candidates.
//!
//! "Position" means a position in the `candidates` slice passed to `select`; "index" means an upstream's
//! declared index ([`Candidate::index`]), which is what a [`Decision`](crate::Decision) lists. The host
//! may pass candidates in any order, so helpers that speak of declared order sort by index.

use crate::{Candidate, Rng};

/// Whether `weight` takes part in weighted choices: finite and strictly positive.
pub fn usable_weight(weight: f64) -> bool {
    weight.is_finite() && weight > 0.0
}

/// Draws one position with probability proportional to its weight.
///
/// Weights are renormalised over the usable ones (see [`usable_weight`]); zero, negative, NaN and
/// infinite weights are never drawn. Returns `None`, consuming no randomness, when no weight is
/// usable (including an empty slice); otherwise consumes exactly one [`Rng::next_f64`]. Very large
/// weights cannot overflow the total.
pub fn weighted_draw(weights: &[f64], rng: &mut Rng) -> Option<usize> {
    let max = weights
        .iter()
        .copied()
        .filter(|&w| usable_weight(w))
        .fold(0.0, f64::max);
    if max <= 0.0 {
        return None;
    }
    // Scaled to (0, 1] so the sum is at most `weights.len()`.
    let total: f64 = weights
        .iter()
        .copied()
        .filter(|&w| usable_weight(w))
        .map(|w| w / max)
        .sum();
    let target = rng.next_f64() * total;
    let mut cumulative = 0.0;
    let mut last = None;
    for (position, &weight) in weights.iter().enumerate() {
        if !usable_weight(weight) {
            continue;
        }
        let share = weight / max;
        if share <= 0.0 {
            // Underflowed next to a huge weight: no mass left.
            continue;
        }
        cumulative += share;
        last = Some(position);
        if target < cumulative {
            return Some(position);
        }
    }
    // Only reachable through rounding in the running sum: the last entry with mass.
    last
}

/// A weighted random order without replacement: every position exactly once.
///
/// Positions with a usable weight come first, as repeated [`weighted_draw`]s over those not yet
/// drawn (so the first one is distributed exactly like, and with the same `rng` state equal to,
/// `weighted_draw(weights, rng)`); the others follow in their original order. Consumes one
/// [`Rng::next_f64`] per usable weight. Quadratic in the number of usable weights, which is fine for
/// route lists.
pub fn weighted_shuffle(weights: &[f64], rng: &mut Rng) -> Vec<usize> {
    let mut remaining: Vec<usize> = (0..weights.len())
        .filter(|&p| usable_weight(weights[p]))
        .collect();
    let mut order = Vec::with_capacity(weights.len());
    let mut pool: Vec<f64> = remaining.iter().map(|&p| weights[p]).collect();
    while let Some(drawn) = weighted_draw(&pool, rng) {
        order.push(remaining.remove(drawn));
        pool.remove(drawn);
    }
    // Entries whose share underflowed to nothing next to a huge weight, then the unusable ones.
    order.extend(remaining);
    order.extend((0..weights.len()).filter(|&p| !usable_weight(weights[p])));
    order
}

/// Candidate positions sorted by declared index (stable for equal indexes).
pub fn declared_positions(candidates: &[Candidate]) -> Vec<usize> {
    let mut positions = Vec::with_capacity(candidates.len());
    declared_positions_into(candidates, &mut positions);
    positions
}

/// [`declared_positions`] written into `positions` (cleared first), for a strategy that keeps the
/// buffer from call to call instead of allocating one per `select`.
pub fn declared_positions_into(candidates: &[Candidate], positions: &mut Vec<usize>) {
    positions.clear();
    positions.extend(0..candidates.len());
    positions.sort_by_key(|&p| candidates[p].index);
}

/// The candidates' declared indexes in declared (ascending) order: the host's default order.
pub fn declared_order(candidates: &[Candidate]) -> Vec<u32> {
    let mut order: Vec<u32> = candidates.iter().map(|c| c.index).collect();
    order.sort_unstable();
    order
}

/// The declared indexes of the candidates at `positions`, in that order. Panics on a position out
/// of range.
pub fn order_of_positions(candidates: &[Candidate], positions: &[usize]) -> Vec<u32> {
    positions.iter().map(|&p| candidates[p].index).collect()
}

/// The candidate at position `primary` first, then every other candidate in declared order.
/// Panics if `primary` is out of range.
pub fn primary_then_declared(candidates: &[Candidate], primary: usize) -> Vec<u32> {
    let first = candidates[primary].index;
    let mut order = Vec::with_capacity(candidates.len());
    order.push(first);
    order.extend(
        declared_positions(candidates)
            .into_iter()
            .filter(|&p| p != primary)
            .map(|p| candidates[p].index),
    );
    order
}

/// The declared index of the candidate session affinity pins the caller to, if any: the endpoint
/// where the caller's prompt cache is warm.
pub fn affinity_pinned(candidates: &[Candidate]) -> Option<u32> {
    candidates
        .iter()
        .find(|c| c.affinity_pinned)
        .map(|c| c.index)
}

/// Moves the affinity-pinned candidate (if any, and if `order` holds it) to the front of `order`,
/// leaving the rest as they were: what a strategy that honours session affinity does last.
pub fn affinity_first(candidates: &[Candidate], order: &mut Vec<u32>) {
    if let Some(pinned) = affinity_pinned(candidates)
        && let Some(at) = order.iter().position(|&i| i == pinned)
    {
        let index = order.remove(at);
        order.insert(0, index);
    }
}

/// Candidate positions grouped by priority, highest priority first; within a tier, declared order.
///
/// Every position appears exactly once; no tier is empty; an empty slice gives no tiers.
pub fn priority_tiers(candidates: &[Candidate]) -> Vec<Vec<usize>> {
    let mut positions = declared_positions(candidates);
    // Stable: declared order survives within a priority.
    positions.sort_by_key(|&p| std::cmp::Reverse(candidates[p].priority));
    let priority = |p: &usize| candidates[*p].priority;
    // One tier (every candidate at one priority) is the common case: `select` runs on every
    // request, and each allocation in the guest costs about as much as the rest of a small decision.
    if positions
        .windows(2)
        .all(|w| priority(&w[0]) == priority(&w[1]))
    {
        return if positions.is_empty() {
            Vec::new()
        } else {
            vec![positions]
        };
    }
    positions
        .chunk_by(|a, b| priority(a) == priority(b))
        .map(<[usize]>::to_vec)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_first_moves_only_the_pinned_candidate() {
        let mut candidates = vec![
            Candidate::new(0, 1.0),
            Candidate::new(1, 1.0),
            Candidate::new(2, 1.0),
        ];
        let mut order = vec![2, 0, 1];
        affinity_first(&candidates, &mut order);
        assert_eq!(order, vec![2, 0, 1], "no pin: unchanged");
        candidates[1].affinity_pinned = true;
        affinity_first(&candidates, &mut order);
        assert_eq!(order, vec![1, 2, 0]);
        assert_eq!(affinity_pinned(&candidates), Some(1));
    }

    fn shares(weights: &[f64], draws: u64) -> Vec<f64> {
        let mut counts = vec![0u64; weights.len()];
        for seed in 0..draws {
            if let Some(p) = weighted_draw(weights, &mut Rng::new(seed)) {
                counts[p] += 1;
            }
        }
        counts.iter().map(|&n| n as f64 / draws as f64).collect()
    }

    #[test]
    fn draw_follows_weights() {
        let s = shares(&[0.7, 0.3], 10_000);
        assert!((s[0] - 0.7).abs() < 0.03, "{s:?}");
        let s = shares(&[1.0, 2.0, 0.0, 1.0], 20_000);
        assert!(
            (s[0] - 0.25).abs() < 0.02 && (s[1] - 0.5).abs() < 0.02,
            "{s:?}"
        );
        assert_eq!(s[2], 0.0);
    }

    #[test]
    fn draw_ignores_unusable_weights() {
        let weights = [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 2.0];
        for seed in 0..1_000 {
            assert_eq!(weighted_draw(&weights, &mut Rng::new(seed)), Some(5));
        }
    }

    #[test]
    fn draw_none_without_usable_weights_and_no_randomness_used() {
        let mut rng = Rng::new(9);
        assert_eq!(weighted_draw(&[], &mut rng), None);
        assert_eq!(weighted_draw(&[0.0, 0.0], &mut rng), None);
        assert_eq!(weighted_draw(&[-1.0, f64::NAN], &mut rng), None);
        assert_eq!(rng, Rng::new(9));
    }

    #[test]
    fn draw_survives_huge_and_tiny_weights() {
        let s = shares(&[f64::MAX, f64::MAX], 4_000);
        assert!((s[0] - 0.5).abs() < 0.05, "{s:?}");
        for seed in 0..1_000 {
            let p = weighted_draw(&[f64::MAX, f64::MIN_POSITIVE], &mut Rng::new(seed));
            assert_eq!(p, Some(0));
        }
    }

    #[test]
    fn shuffle_is_a_permutation_with_unusable_last() {
        let weights = [0.0, 3.0, 1.0, f64::NAN, 2.0];
        for seed in 0..500 {
            let order = weighted_shuffle(&weights, &mut Rng::new(seed));
            assert_eq!(order.len(), 5);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
            assert_eq!(&order[3..], &[0, 3]);
        }
    }

    #[test]
    fn shuffle_starts_like_a_draw_and_is_deterministic() {
        let weights = [0.5, 1.5, 1.0];
        for seed in 0..500 {
            let order = weighted_shuffle(&weights, &mut Rng::new(seed));
            assert_eq!(Some(order[0]), weighted_draw(&weights, &mut Rng::new(seed)));
            assert_eq!(order, weighted_shuffle(&weights, &mut Rng::new(seed)));
        }
    }

    #[test]
    fn shuffle_second_place_follows_remaining_weights() {
        // With 0 drawn first (p = 0.5), 1 and 2 split second place 2:1.
        let weights = [2.0, 1.0, 1.0];
        let mut second = [0u32; 3];
        for seed in 0..20_000 {
            second[weighted_shuffle(&weights, &mut Rng::new(seed))[1]] += 1;
        }
        // P(second = 0) = 2 * (1/4 * 2/3) = 1/3; P(second = 1) = P(second = 2) = 1/3.
        for n in second {
            assert!(
                (f64::from(n) / 20_000.0 - 1.0 / 3.0).abs() < 0.02,
                "{second:?}"
            );
        }
    }

    fn candidate(index: u32, priority: i32) -> Candidate {
        Candidate {
            priority,
            ..Candidate::new(index, 1.0)
        }
    }

    #[test]
    fn declared_helpers_sort_by_index() {
        let candidates = [candidate(4, 0), candidate(1, 0), candidate(3, 0)];
        assert_eq!(declared_positions(&candidates), vec![1, 2, 0]);
        // The buffer form clears what it is given and writes the same.
        let mut positions = vec![7, 7, 7, 7];
        declared_positions_into(&candidates, &mut positions);
        assert_eq!(positions, [1, 2, 0]);
        assert_eq!(declared_order(&candidates), vec![1, 3, 4]);
        assert_eq!(order_of_positions(&candidates, &[2, 0]), vec![3, 4]);
        assert_eq!(primary_then_declared(&candidates, 2), vec![3, 1, 4]);
        assert_eq!(primary_then_declared(&candidates, 1), vec![1, 3, 4]);
        assert!(declared_order(&[]).is_empty());
    }

    #[test]
    fn tiers_high_to_low_in_declared_order() {
        let candidates = [
            candidate(5, 1),
            candidate(0, -2),
            candidate(2, 10),
            candidate(1, 1),
            candidate(3, 10),
        ];
        assert_eq!(
            priority_tiers(&candidates),
            vec![vec![2, 4], vec![3, 0], vec![1]]
        );
        assert!(priority_tiers(&[]).is_empty());
        assert_eq!(priority_tiers(&[candidate(7, 0)]), vec![vec![0]]);
    }
}
