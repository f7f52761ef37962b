//! The budget LP: minimise mean TTFT subject to an expected-cost budget.
//!
//! Over a mixture `π` of `n` routes:
//!
//! ```text
//! minimise    Σ π_j · obj_j
//! subject to  Σ π_j · c_j ≤ B,   Σ π_j = 1,   π_j ≥ 0
//! ```
//!
//! One inequality plus the simplex means a basic optimal solution has at most two non-zero weights:
//! either a pure route within budget or a two-route mixture exactly on the budget line. [`solve`]
//! enumerates those `O(n²)` vertices and keeps the best, which is exact and needs no LP library.
//! Every slice here is indexed by *position* (the caller's declared order), which is also the last
//! tie-break.

use std::cmp::Ordering;

/// Absolute tolerance on costs and weights (costs are USD per request).
pub const LP_EPS: f64 = 1e-9;

/// Size, in milliseconds, of the cost tie-break added to the objective (see [`tiebroken_objective`]).
pub const COST_TIEBREAK_MS: f64 = 1e-3;

/// How a plan came about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LpStatus {
    /// No route was feasible (none passed, or all excluded by quota/concurrency state).
    NoFeasibleCandidates,
    /// Exactly one feasible route: it gets all the mass.
    SingleProvider,
    /// The LP was solved.
    Optimal,
    /// No vertex met the budget (only possible with an explicit budget below the cheapest cost, or
    /// non-finite inputs): all mass on the cheapest route.
    CheapestFallback,
}

impl LpStatus {
    /// The name used in `status()` and the docs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoFeasibleCandidates => "no_feasible_candidates",
            Self::SingleProvider => "single_provider",
            Self::Optimal => "optimal",
            Self::CheapestFallback => "cheapest_fallback",
        }
    }
}

/// The solved mixture for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub status: LpStatus,
    /// One weight per input position; sums to 1 (empty for no candidates). At most two are non-zero.
    pub weights: Vec<f64>,
    pub budget: f64,
    pub c_min: f64,
    pub c_max: f64,
    /// `Σ π_j c_j`.
    pub expected_cost: f64,
    /// `Σ π_j ttft_j` (without the tie-break term).
    pub mean_ttft_ms: f64,
}

/// `B = c_min + α (c_max − c_min)`, `α` clamped to `[0, 1]` (NaN counts as 1). 0 for no costs.
pub fn budget(costs: &[f64], alpha: f64) -> f64 {
    let Some((c_min, c_max)) = cost_range(costs) else {
        return 0.0;
    };
    let alpha = if alpha.is_nan() {
        1.0
    } else {
        alpha.clamp(0.0, 1.0)
    };
    c_min + alpha * (c_max - c_min)
}

/// Budget pressure: the `α` a plan uses when the caller may still spend `remaining` USD and
/// `budget` is the per-request budget `B` at `alpha`. With `r` remaining and `N = requests`,
/// `α' = α · clamp(r / (N · B), 0, 1)`: unchanged while `r` covers `N` requests at `B`, then
/// linearly down to 0 (the cheapest feasible route) as `r` goes to 0; `r ≤ 0` gives 0.
/// `α` is returned unchanged without a remaining budget (`None` or NaN), with `requests` 0
/// (pressure disabled) or when `B ≤ 0` (nothing to save: every feasible route is free).
pub fn pressured_alpha(alpha: f64, budget: f64, remaining: Option<f64>, requests: u32) -> f64 {
    let Some(remaining) = remaining.filter(|r| !r.is_nan()) else {
        return alpha;
    };
    if requests == 0 {
        return alpha;
    }
    if remaining <= 0.0 {
        return 0.0;
    }
    if !(budget > 0.0 && budget.is_finite()) {
        return alpha;
    }
    alpha * (remaining / (f64::from(requests) * budget)).clamp(0.0, 1.0)
}

/// The smallest and largest cost, ignoring non-finite values; `None` when there is none.
pub fn cost_range(costs: &[f64]) -> Option<(f64, f64)> {
    costs
        .iter()
        .copied()
        .filter(|c| c.is_finite())
        .fold(None, |range, c| match range {
            None => Some((c, c)),
            Some((lo, hi)) => Some((f64::min(lo, c), f64::max(hi, c))),
        })
}

/// `obj_j = ttft_j + 1e-3 · (c_j − c_min) / (c_max − c_min)`: equal latencies prefer the cheaper
/// route. The term is below a microsecond, so it never outweighs a real latency difference, and it
/// vanishes when the cost span is within [`LP_EPS`].
pub fn tiebroken_objective(ttft_ms: &[f64], costs: &[f64]) -> Vec<f64> {
    let Some((c_min, c_max)) = cost_range(costs) else {
        return ttft_ms.to_vec();
    };
    let span = c_max - c_min;
    if span <= LP_EPS {
        return ttft_ms.to_vec();
    }
    ttft_ms
        .iter()
        .zip(costs)
        .map(|(&t, &c)| t + COST_TIEBREAK_MS * ((c - c_min) / span))
        .collect()
}

/// One LP vertex: a pure route or a two-route mixture on the budget line.
#[derive(Clone, Copy, Debug)]
struct Vertex {
    first: usize,
    second: Option<(usize, f64)>,
    first_weight: f64,
    value: f64,
    cost: f64,
}

impl Vertex {
    fn support(&self) -> usize {
        usize::from(self.first_weight > LP_EPS)
            + usize::from(self.second.is_some_and(|(_, w)| w > LP_EPS))
    }

    /// Positions with mass, ascending.
    fn positions(&self) -> [Option<usize>; 2] {
        let first = (self.first_weight > LP_EPS).then_some(self.first);
        let second = self.second.filter(|&(_, w)| w > LP_EPS).map(|(p, _)| p);
        match (first, second) {
            (None, s) => [s, None],
            (f, s) => [f, s],
        }
    }

    /// Objective, then expected cost, then support size, then positions (declared order).
    fn better_than(&self, other: &Vertex) -> bool {
        let key = |a: f64, b: f64| a.partial_cmp(&b).unwrap_or(Ordering::Equal);
        key(self.value, other.value)
            .then(key(self.cost, other.cost))
            .then(self.support().cmp(&other.support()))
            .then(self.positions().cmp(&other.positions()))
            == Ordering::Less
    }
}

/// Solves the LP exactly. Returns normalised weights (one per position, at most two non-zero), or
/// `None` when the input is empty, has mismatched lengths or non-finite values, or no vertex meets
/// `budget` (within [`LP_EPS`]).
pub fn solve(objective: &[f64], costs: &[f64], budget: f64) -> Option<Vec<f64>> {
    let n = objective.len();
    if n == 0 || n != costs.len() || !budget.is_finite() {
        return None;
    }
    if objective.iter().chain(costs).any(|v| !v.is_finite()) {
        return None;
    }
    let mut best: Option<Vertex> = None;
    let mut consider = |vertex: Vertex| {
        if vertex.cost > budget + LP_EPS {
            return;
        }
        if best.is_none_or(|b| vertex.better_than(&b)) {
            best = Some(vertex);
        }
    };
    for (j, (&o, &c)) in objective.iter().zip(costs).enumerate() {
        consider(Vertex {
            first: j,
            second: None,
            first_weight: 1.0,
            value: o,
            cost: c,
        });
    }
    for i in 0..n {
        for j in i + 1..n {
            let span = costs[i] - costs[j];
            if span.abs() <= LP_EPS {
                continue;
            }
            // π_i c_i + (1 − π_i) c_j = B.
            let wi = (budget - costs[j]) / span;
            let wj = 1.0 - wi;
            if wi < -LP_EPS || wj < -LP_EPS {
                continue;
            }
            let wi = wi.clamp(0.0, 1.0);
            let wj = wj.clamp(0.0, 1.0);
            consider(Vertex {
                first: i,
                second: Some((j, wj)),
                first_weight: wi,
                value: wi * objective[i] + wj * objective[j],
                cost: wi * costs[i] + wj * costs[j],
            });
        }
    }
    let best = best?;
    let mut weights = vec![0.0; n];
    weights[best.first] = best.first_weight;
    if let Some((j, w)) = best.second {
        weights[j] = w;
    }
    for w in &mut weights {
        if *w <= LP_EPS {
            *w = 0.0;
        }
    }
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return None;
    }
    for w in &mut weights {
        *w /= total;
    }
    Some(weights)
}

/// The plan for feasible routes with these costs and TTFT estimates at budget level `alpha`.
pub fn plan(costs: &[f64], ttft_ms: &[f64], alpha: f64) -> Plan {
    plan_with_budget(costs, ttft_ms, budget(costs, alpha))
}

/// The plan for an explicit budget (the strategy always passes one derived from `α`, which the
/// cheapest route meets; an explicit lower one exercises [`LpStatus::CheapestFallback`]).
pub fn plan_with_budget(costs: &[f64], ttft_ms: &[f64], budget: f64) -> Plan {
    let n = costs.len().min(ttft_ms.len());
    let (costs, ttft_ms) = (&costs[..n], &ttft_ms[..n]);
    let (c_min, c_max) = cost_range(costs).unwrap_or((0.0, 0.0));
    let finish = |status: LpStatus, weights: Vec<f64>| {
        let dot = |values: &[f64]| -> f64 {
            weights
                .iter()
                .zip(values)
                .filter(|(w, _)| **w > 0.0)
                .fold(0.0, |sum, (w, v)| sum + w * v)
        };
        Plan {
            status,
            expected_cost: dot(costs),
            mean_ttft_ms: dot(ttft_ms),
            weights,
            budget,
            c_min,
            c_max,
        }
    };
    match n {
        0 => return finish(LpStatus::NoFeasibleCandidates, Vec::new()),
        1 => return finish(LpStatus::SingleProvider, vec![1.0]),
        _ => {}
    }
    let objective = tiebroken_objective(ttft_ms, costs);
    if let Some(weights) = solve(&objective, costs, budget) {
        return finish(LpStatus::Optimal, weights);
    }
    let cheapest = (0..n)
        .min_by(|&a, &b| {
            let key = |p: usize| {
                let c = if costs[p].is_finite() {
                    costs[p]
                } else {
                    f64::INFINITY
                };
                let o = if objective[p].is_finite() {
                    objective[p]
                } else {
                    f64::INFINITY
                };
                (c, o)
            };
            let (ca, oa) = key(a);
            let (cb, ob) = key(b);
            ca.partial_cmp(&cb)
                .unwrap_or(Ordering::Equal)
                .then(oa.partial_cmp(&ob).unwrap_or(Ordering::Equal))
                .then(a.cmp(&b))
        })
        .unwrap_or(0);
    let mut weights = vec![0.0; n];
    weights[cheapest] = 1.0;
    finish(LpStatus::CheapestFallback, weights)
}

/// Draws a position from `weights` with one uniform `u ∈ [0, 1)`: a cumulative walk in position
/// order. `None` when no weight is positive.
pub fn sample(weights: &[f64], u: f64) -> Option<usize> {
    let total: f64 = weights.iter().filter(|w| **w > 0.0).sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let target = u * total;
    let mut cumulative = 0.0;
    let mut last = None;
    for (p, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            cumulative += w;
            last = Some(p);
            if target < cumulative {
                return Some(p);
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_sdk::Rng;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9
    }

    #[test]
    fn hand_solved_half_half_mixture() {
        // (cost 1, 10 s) vs (cost 3, 1 s) at α 0.5: B = 2, π = (0.5, 0.5).
        let plan = plan(&[1.0, 3.0], &[10_000.0, 1_000.0], 0.5);
        assert_eq!(plan.status, LpStatus::Optimal);
        assert!(close(plan.budget, 2.0));
        assert!(close(plan.weights[0], 0.5) && close(plan.weights[1], 0.5));
        assert!(close(plan.expected_cost, 2.0));
        assert!(close(plan.mean_ttft_ms, 5_500.0));
    }

    #[test]
    fn mixture_weights_follow_the_budget_line() {
        // α 0.25: B = 1.5 → π_fast = 0.25.
        let plan = plan(&[1.0, 3.0], &[10_000.0, 1_000.0], 0.25);
        assert!(close(plan.weights[0], 0.75) && close(plan.weights[1], 0.25));
        // α 1: everything on the fast one.
        let plan = super::plan(&[1.0, 3.0], &[10_000.0, 1_000.0], 1.0);
        assert_eq!(plan.weights, vec![0.0, 1.0]);
        // α 0: everything on the cheap one.
        let plan = super::plan(&[1.0, 3.0], &[10_000.0, 1_000.0], 0.0);
        assert_eq!(plan.weights, vec![1.0, 0.0]);
    }

    #[test]
    fn equal_latencies_go_to_the_cheaper_route() {
        let plan = plan(&[3.0, 1.0, 2.0], &[800.0, 800.0, 800.0], 1.0);
        assert_eq!(plan.status, LpStatus::Optimal);
        assert_eq!(plan.weights, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn equal_costs_and_latencies_go_to_the_first_declared() {
        let plan = plan(&[1.0, 1.0], &[500.0, 500.0], 0.5);
        assert_eq!(plan.weights, vec![1.0, 0.0]);
    }

    #[test]
    fn cheaper_and_faster_dominates() {
        let plan = plan(&[1.0, 2.0], &[100.0, 900.0], 0.9);
        assert_eq!(plan.weights, vec![1.0, 0.0]);
    }

    #[test]
    fn over_budget_everywhere_falls_back_to_the_cheapest() {
        let plan = plan_with_budget(&[2.0, 1.5, 3.0], &[100.0, 900.0, 50.0], 1.0);
        assert_eq!(plan.status, LpStatus::CheapestFallback);
        assert_eq!(plan.weights, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn non_finite_input_falls_back_to_the_cheapest_finite() {
        let plan = plan(&[2.0, 1.0], &[f64::NAN, 10.0], 0.5);
        assert_eq!(plan.status, LpStatus::CheapestFallback);
        assert_eq!(plan.weights, vec![0.0, 1.0]);
    }

    #[test]
    fn single_route_and_no_route() {
        let plan = plan(&[5.0], &[100.0], 0.3);
        assert_eq!(plan.status, LpStatus::SingleProvider);
        assert_eq!(plan.weights, vec![1.0]);
        assert!(close(plan.budget, 5.0));
        let plan = super::plan(&[], &[], 0.3);
        assert_eq!(plan.status, LpStatus::NoFeasibleCandidates);
        assert!(plan.weights.is_empty());
    }

    #[test]
    fn alpha_is_clamped() {
        assert!(close(budget(&[1.0, 3.0], 7.0), 3.0));
        assert!(close(budget(&[1.0, 3.0], -2.0), 1.0));
        assert!(close(budget(&[1.0, 3.0], f64::NAN), 3.0));
    }

    #[test]
    fn pressure_slides_alpha_linearly_below_n_requests() {
        // B = 2, N = 10: r ≥ 20 leaves α alone, r = 2 (10 % of N·B) gives 0.1 α.
        assert!(close(pressured_alpha(0.5, 2.0, None, 10), 0.5));
        assert!(close(pressured_alpha(0.5, 2.0, Some(f64::NAN), 10), 0.5));
        assert!(close(pressured_alpha(0.5, 2.0, Some(1e9), 10), 0.5));
        assert!(close(
            pressured_alpha(0.5, 2.0, Some(f64::INFINITY), 10),
            0.5
        ));
        assert!(close(pressured_alpha(0.5, 2.0, Some(20.0), 10), 0.5));
        assert!(close(pressured_alpha(0.5, 2.0, Some(2.0), 10), 0.05));
        assert!(close(pressured_alpha(0.5, 2.0, Some(0.0), 10), 0.0));
        assert!(close(pressured_alpha(0.5, 2.0, Some(-3.0), 10), 0.0));
        // Disabled, or nothing to save.
        assert!(close(pressured_alpha(0.5, 2.0, Some(2.0), 0), 0.5));
        assert!(close(pressured_alpha(0.5, 0.0, Some(2.0), 10), 0.5));
    }

    #[test]
    fn tiebreak_vanishes_for_a_flat_cost_span() {
        assert_eq!(
            tiebroken_objective(&[1.0, 2.0], &[0.5, 0.5]),
            vec![1.0, 2.0]
        );
        let obj = tiebroken_objective(&[1.0, 1.0], &[0.0, 2.0]);
        assert!(close(obj[0], 1.0) && close(obj[1], 1.001));
    }

    #[test]
    fn sampling_walks_cumulatively() {
        let w = [0.0, 0.25, 0.0, 0.75];
        assert_eq!(sample(&w, 0.0), Some(1));
        assert_eq!(sample(&w, 0.2499), Some(1));
        assert_eq!(sample(&w, 0.25), Some(3));
        assert_eq!(sample(&w, 0.9999), Some(3));
        assert_eq!(sample(&[0.0, 0.0], 0.5), None);
        assert_eq!(sample(&[], 0.5), None);
    }

    /// Brute force over a fine grid of two-route mixtures (plus pure routes): the solver's value is
    /// never beaten by a feasible grid point.
    fn grid_optimum(obj: &[f64], costs: &[f64], budget: f64) -> f64 {
        let mut best = f64::INFINITY;
        for i in 0..obj.len() {
            for j in 0..obj.len() {
                for step in 0..=200 {
                    let w = f64::from(step) / 200.0;
                    let cost = w * costs[i] + (1.0 - w) * costs[j];
                    if cost <= budget + LP_EPS {
                        best = best.min(w * obj[i] + (1.0 - w) * obj[j]);
                    }
                }
            }
        }
        best
    }

    #[test]
    fn property_random_cases() {
        let mut rng = Rng::new(0x5eed);
        for case in 0..3_000 {
            let n = 1 + rng.below(7) as usize;
            let costs: Vec<f64> = (0..n)
                .map(|_| match rng.below(4) {
                    0 => 0.0,
                    1 => (rng.below(4) as f64) * 0.5,
                    _ => rng.next_f64() * 0.05,
                })
                .collect();
            let ttft: Vec<f64> = (0..n)
                .map(|_| match rng.below(3) {
                    0 => 1_000.0,
                    _ => 50.0 + rng.next_f64() * 20_000.0,
                })
                .collect();
            let alpha = match rng.below(4) {
                0 => 0.0,
                1 => 1.0,
                _ => rng.next_f64(),
            };
            let plan = plan(&costs, &ttft, alpha);
            let sum: f64 = plan.weights.iter().sum();
            assert!((sum - 1.0).abs() <= 1e-9, "case {case}: sum {sum}");
            assert!(plan.weights.iter().all(|w| *w >= 0.0), "case {case}");
            assert!(
                plan.expected_cost <= plan.budget + 1e-9,
                "case {case}: {} > {}",
                plan.expected_cost,
                plan.budget
            );
            let support = plan.weights.iter().filter(|w| **w > 0.0).count();
            assert!((1..=2).contains(&support), "case {case}: support {support}");
            if n > 1 {
                assert_eq!(plan.status, LpStatus::Optimal, "case {case}");
                let obj = tiebroken_objective(&ttft, &costs);
                let value: f64 = plan.weights.iter().zip(&obj).map(|(w, o)| w * o).sum();
                let grid = grid_optimum(&obj, &costs, plan.budget);
                assert!(value <= grid + 1e-6, "case {case}: {value} > grid {grid}");
            }
        }
    }
}
