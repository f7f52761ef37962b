//! `round_robin`: rotate the primary through the routes in declared order.
//!
//! Each router keeps a cursor: the declared index to try next. A select makes the first candidate
//! at or after the cursor, in cyclic declared order, the primary; the other candidates follow
//! cyclically after it; the cursor moves to the route after the primary in the route table (or, before
//! any table was pushed, to the next index, wrapping over the candidates).
//!
//! Candidates whose weight is zero, negative or non-finite are never the primary while one with a
//! positive weight exists (the route contract: weight 0 means never chosen). With
//! `skip_open_circuits` (the default), a candidate whose circuit is not closed (the host may admit
//! half-open ones as probes) is not the primary while a closed one exists. Skipped candidates keep
//! their place in the fallback list.
//!
//! Session affinity (`affinity_pinned`) is ignored: rotating every request is the point of this
//! strategy, and a caller pinned to one route would never rotate.

use schemars::JsonSchema;
use serde::Deserialize;
use switchyard_sdk::serde_json::json;
use switchyard_sdk::{
    Candidate, CircuitState, Decision, Request, Skips, Strategy, StrategyInfo, Upstream,
    declared_positions, usable_weight,
};

/// `router_params` of `round_robin`.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoundRobinParams {
    /// Do not make a candidate whose circuit is not closed the primary while a closed one exists.
    #[serde(default = "default_skip_open_circuits")]
    pub skip_open_circuits: bool,
}

fn default_skip_open_circuits() -> bool {
    true
}

impl Default for RoundRobinParams {
    fn default() -> Self {
        Self {
            skip_open_circuits: default_skip_open_circuits(),
        }
    }
}

/// One rotation per model.
#[derive(Debug)]
pub struct RoundRobin {
    skip_open_circuits: bool,
    /// Declared indexes of the route table, ascending; empty until a table is pushed.
    table: Vec<u32>,
    /// The declared index to try first on the next select.
    cursor: u32,
}

impl RoundRobin {
    /// How suitable a candidate is as primary; the first of the highest rank in cyclic order wins.
    fn rank(&self, candidate: &Candidate) -> u8 {
        let weighted = usable_weight(candidate.weight);
        let circuit_ok = !self.skip_open_circuits || candidate.circuit == CircuitState::Closed;
        u8::from(weighted) * 2 + u8::from(circuit_ok)
    }

    /// The declared index after `index`: the next route of the table, cyclically, or simply
    /// `index + 1` before a table was pushed (the next select wraps over its candidates).
    fn successor(&self, index: u32) -> u32 {
        match self.table.iter().find(|&&i| i > index) {
            Some(&next) => next,
            None => self
                .table
                .first()
                .copied()
                .unwrap_or_else(|| index.wrapping_add(1)),
        }
    }
}

impl Strategy for RoundRobin {
    type Params = RoundRobinParams;

    // Its state is the cursor, which `select` moves even for one candidate: only `observe` and
    // `tick` are skipped.
    const SKIPS: Skips = Skips::NONE.observe().tick();

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "round_robin",
            env!("CARGO_PKG_VERSION"),
            "Rotates the primary through the routes in declared order; fallbacks follow cyclically.",
        )
    }

    fn create(_model_id: &str, params: RoundRobinParams) -> Result<Self, String> {
        Ok(Self {
            skip_open_circuits: params.skip_open_circuits,
            table: Vec::new(),
            cursor: 0,
        })
    }

    fn refresh_upstreams(&mut self, routes: &[Upstream]) {
        let mut table: Vec<u32> = routes.iter().map(|r| r.index).collect();
        table.sort_unstable();
        table.dedup();
        self.table = table;
        // The cursor is an index, so it stays meaningful; past the end it wraps to the start.
        if let (Some(&first), Some(&last)) = (self.table.first(), self.table.last())
            && self.cursor > last
        {
            self.cursor = first;
        }
    }

    fn select(&mut self, _request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
        let mut cycle = declared_positions(candidates);
        if cycle.is_empty() {
            return Ok(Decision::new(Vec::new()));
        }
        // Cyclic declared order starting at the cursor.
        let start = cycle
            .iter()
            .position(|&p| candidates[p].index >= self.cursor)
            .unwrap_or(0);
        cycle.rotate_left(start);

        let mut primary = 0;
        let mut best = self.rank(&candidates[cycle[0]]);
        for (k, &p) in cycle.iter().enumerate().skip(1) {
            let rank = self.rank(&candidates[p]);
            if rank > best {
                primary = k;
                best = rank;
            }
        }
        cycle.rotate_left(primary);

        let chosen = candidates[cycle[0]].index;
        self.cursor = self.successor(chosen);
        Ok(Decision::new(
            cycle.into_iter().map(|p| candidates[p].index).collect(),
        ))
    }

    fn status(&self) -> String {
        json!({
            "cursor": self.cursor,
            "routes": self.table.len(),
            "skip_open_circuits": self.skip_open_circuits,
        })
        .to_string()
    }
}

switchyard_sdk::export_strategy!(RoundRobin);

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_sdk::{params_schema, parse_params, serde_json};

    fn router(params: &str, table: Option<&[u32]>) -> Result<RoundRobin, String> {
        let mut router = RoundRobin::create("m", parse_params(params)?)?;
        if let Some(table) = table {
            let routes: Vec<Upstream> = table.iter().map(|&i| Upstream::new(i, 1.0)).collect();
            router.refresh_upstreams(&routes);
        }
        Ok(router)
    }

    fn closed(indexes: &[u32]) -> Vec<Candidate> {
        indexes.iter().map(|&i| Candidate::new(i, 1.0)).collect()
    }

    fn with_circuit(index: u32, circuit: CircuitState) -> Candidate {
        Candidate {
            circuit,
            ..Candidate::new(index, 1.0)
        }
    }

    fn orders(
        router: &mut RoundRobin,
        candidates: &[Candidate],
        n: usize,
    ) -> Result<Vec<Vec<u32>>, String> {
        (0..n)
            .map(|seed| {
                Ok(router
                    .select(&Request::with_seed(seed as u64), candidates)?
                    .order)
            })
            .collect()
    }

    #[test]
    fn info_names_the_strategy() {
        assert_eq!(RoundRobin::info().name, "round_robin");
    }

    #[test]
    fn cycles_through_the_table() -> Result<(), String> {
        let mut rr = router("{}", Some(&[0, 1, 2]))?;
        let got = orders(&mut rr, &closed(&[0, 1, 2]), 4)?;
        assert_eq!(
            got,
            vec![vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1], vec![0, 1, 2]]
        );
        Ok(())
    }

    #[test]
    fn cycles_over_candidates_without_a_table() -> Result<(), String> {
        let mut rr = router("{}", None)?;
        // Passed out of declared order on purpose.
        let got = orders(&mut rr, &closed(&[8, 3, 5]), 4)?;
        assert_eq!(
            got,
            vec![vec![3, 5, 8], vec![5, 8, 3], vec![8, 3, 5], vec![3, 5, 8]]
        );
        Ok(())
    }

    #[test]
    fn cursor_follows_the_table_when_candidates_are_a_subset() -> Result<(), String> {
        let mut rr = router("{}", Some(&[0, 1, 2, 3]))?;
        let got = orders(&mut rr, &closed(&[1, 3]), 3)?;
        assert_eq!(got, vec![vec![1, 3], vec![3, 1], vec![1, 3]]);
        // Everything admitted again: the cursor stands at 2 (after 1), so 2, 3, then 0.
        let got = orders(&mut rr, &closed(&[0, 1, 2, 3]), 3)?;
        assert_eq!(
            got,
            vec![vec![2, 3, 0, 1], vec![3, 0, 1, 2], vec![0, 1, 2, 3]]
        );
        Ok(())
    }

    #[test]
    fn skips_non_closed_circuits_as_primary_but_keeps_them_as_fallbacks() -> Result<(), String> {
        let candidates = [
            with_circuit(0, CircuitState::Closed),
            with_circuit(1, CircuitState::HalfOpen),
            with_circuit(2, CircuitState::Closed),
        ];
        let mut rr = router("{}", Some(&[0, 1, 2]))?;
        let got = orders(&mut rr, &candidates, 3)?;
        assert_eq!(got, vec![vec![0, 1, 2], vec![2, 0, 1], vec![0, 1, 2]]);

        let mut rr = router(r#"{"skip_open_circuits": false}"#, Some(&[0, 1, 2]))?;
        let got = orders(&mut rr, &candidates, 3)?;
        assert_eq!(got, vec![vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1]]);
        Ok(())
    }

    #[test]
    fn all_non_closed_still_rotates() -> Result<(), String> {
        let candidates = [
            with_circuit(0, CircuitState::HalfOpen),
            with_circuit(1, CircuitState::Open),
        ];
        let mut rr = router("{}", None)?;
        assert_eq!(
            orders(&mut rr, &candidates, 3)?,
            vec![vec![0, 1], vec![1, 0], vec![0, 1]]
        );
        Ok(())
    }

    #[test]
    fn zero_weight_never_primary_while_a_weighted_one_exists() -> Result<(), String> {
        let candidates = [
            Candidate::new(0, 1.0),
            Candidate::new(1, 0.0),
            Candidate::new(2, 1.0),
        ];
        let mut rr = router("{}", Some(&[0, 1, 2]))?;
        let got = orders(&mut rr, &candidates, 3)?;
        assert_eq!(got, vec![vec![0, 1, 2], vec![2, 0, 1], vec![0, 1, 2]]);

        let all_zero = [Candidate::new(0, 0.0), Candidate::new(1, 0.0)];
        assert_eq!(
            orders(&mut router("{}", None)?, &all_zero, 2)?,
            vec![vec![0, 1], vec![1, 0]]
        );
        Ok(())
    }

    #[test]
    fn orders_are_permutations_and_deterministic() -> Result<(), String> {
        let candidates = [
            with_circuit(4, CircuitState::Closed),
            with_circuit(0, CircuitState::HalfOpen),
            with_circuit(7, CircuitState::Closed),
            Candidate::new(2, 0.0),
        ];
        let mut a = router("{}", Some(&[0, 1, 2, 3, 4, 5, 6, 7]))?;
        let mut b = router("{}", Some(&[0, 1, 2, 3, 4, 5, 6, 7]))?;
        for (x, y) in
            orders(&mut a, &candidates, 50)?
                .into_iter()
                .zip(orders(&mut b, &candidates, 50)?)
        {
            assert_eq!(x, y);
            let mut sorted = x.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 2, 4, 7]);
            assert!(x[0] == 4 || x[0] == 7, "{x:?}");
        }
        assert!(a.select(&Request::with_seed(0), &[])?.order.is_empty());
        Ok(())
    }

    #[test]
    fn status_reports_the_cursor() -> Result<(), String> {
        let mut rr = router("{}", Some(&[0, 1, 2]))?;
        rr.select(&Request::with_seed(0), &closed(&[0, 1, 2]))?;
        let status: serde_json::Value =
            serde_json::from_str(&rr.status()).map_err(|e| e.to_string())?;
        assert_eq!(status["cursor"], 1);
        assert_eq!(status["routes"], 3);
        assert_eq!(status["skip_open_circuits"], true);
        Ok(())
    }

    #[test]
    fn shrinking_the_table_wraps_the_cursor() -> Result<(), String> {
        let mut rr = router("{}", Some(&[0, 1, 2, 3]))?;
        orders(&mut rr, &closed(&[0, 1, 2, 3]), 3)?;
        rr.refresh_upstreams(&[Upstream::new(0, 1.0), Upstream::new(1, 1.0)]);
        assert_eq!(
            rr.select(&Request::with_seed(0), &closed(&[0, 1]))?.order,
            vec![0, 1]
        );
        Ok(())
    }

    #[test]
    fn params_default_and_reject_unknown_keys() -> Result<(), String> {
        assert!(parse_params::<RoundRobinParams>("{}")?.skip_open_circuits);
        assert!(
            !parse_params::<RoundRobinParams>(r#"{"skip_open_circuits": false}"#)?
                .skip_open_circuits
        );
        let schema = params_schema::<RoundRobinParams>();
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["skip_open_circuits"]["default"], true);
        let error = parse_params::<RoundRobinParams>(r#"{"skip_open_circuit": false}"#)
            .err()
            .unwrap_or_default();
        assert!(
            error.contains("unknown field `skip_open_circuit`"),
            "{error}"
        );
        let error = parse_params::<RoundRobinParams>(r#"{"skip_open_circuits": 1}"#)
            .err()
            .unwrap_or_default();
        assert!(
            error.contains("skip_open_circuits: invalid type"),
            "{error}"
        );
        Ok(())
    }
}
