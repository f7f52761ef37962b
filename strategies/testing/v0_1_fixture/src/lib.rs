//! `test-v0-1-fixture`: a strategy built against the frozen `switchyard:router@0.1.0` WIT
//! (`wit/since_v0.1.0`), without the SDK, to prove the host keeps running 0.1.0 components.
//!
//! It orders candidates by declared index, highest first (an order no other strategy produces), and
//! with `{"hedge_after_ms": N}` asks for a hedge the 0.1.0 way: a `;hedge=<ms>@<index>` suffix of
//! its metadata naming the second upstream of its order. `status` reports what came back through
//! `observe`, so a test can check the metadata was handed back unchanged.

/// The order this strategy chooses: declared indexes, highest first.
pub fn reversed(mut indexes: Vec<u32>) -> Vec<u32> {
    indexes.sort_unstable_by(|a, b| b.cmp(a));
    indexes
}

/// The metadata of one decision: a tag, then the legacy hedge suffix when a hedge is asked for.
pub fn metadata(seq: u64, order: &[u32], hedge_after_ms: Option<u64>) -> String {
    match (hedge_after_ms, order.get(1)) {
        (Some(ms), Some(backup)) => format!("v01:{seq};hedge={ms}@{backup}"),
        _ => format!("v01:{seq}"),
    }
}

/// `{"hedge_after_ms": N}` or `{}`; anything else is refused, as the schema says.
pub fn hedge_after_ms(params_json: &str) -> Result<Option<u64>, String> {
    let text = if params_json.trim().is_empty() {
        "{}"
    } else {
        params_json
    };
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let object = value.as_object().ok_or("params must be an object")?;
    if let Some(key) = object.keys().find(|k| *k != "hedge_after_ms") {
        return Err(format!("unknown key `{key}`"));
    }
    match object.get("hedge_after_ms") {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| "hedge_after_ms must be a non-negative integer".to_owned()),
    }
}

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod component {
    use std::cell::RefCell;

    #[allow(
        unsafe_code,
        clippy::all,
        clippy::unwrap_used,
        clippy::expect_used,
        missing_docs
    )]
    mod bindings {
        wit_bindgen::generate!({
            path: "../../../wit/since_v0.1.0",
            world: "strategy-component",
        });
    }

    use bindings::exports::switchyard::router::strategy::{
        Candidate, Decision, Guest, GuestRouter, Observation, Request, Route, Router, StrategyInfo,
    };

    /// What SDK 0.1.0 stamped: the host picks the 0.1.0 bindings from it.
    #[used]
    #[unsafe(link_section = "switchyard-router-api")]
    static SWITCHYARD_ROUTER_API: [u8; 5] = *b"0.1.0";

    struct Fixture;

    struct State {
        hedge_after_ms: Option<u64>,
        seq: u64,
        routes: usize,
        observations: u64,
        last_metadata: String,
    }

    struct FixtureRouter(RefCell<State>);

    impl Guest for Fixture {
        type Router = FixtureRouter;

        fn info() -> StrategyInfo {
            StrategyInfo {
                name: "test-v0-1-fixture".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                description:
                    "Test only: built against switchyard:router@0.1.0; highest index first.".into(),
            }
        }

        fn params_schema() -> String {
            r#"{"type":"object","additionalProperties":false,"properties":{"hedge_after_ms":{"type":"integer","minimum":0}}}"#
                .into()
        }
    }

    impl GuestRouter for FixtureRouter {
        fn create(_model_id: String, params_json: String) -> Result<Router, String> {
            Ok(Router::new(FixtureRouter(RefCell::new(State {
                hedge_after_ms: super::hedge_after_ms(&params_json)?,
                seq: 0,
                routes: 0,
                observations: 0,
                last_metadata: String::new(),
            }))))
        }

        fn refresh_route_table(&self, routes: Vec<Route>) {
            self.0.borrow_mut().routes = routes.len();
        }

        fn select(
            &self,
            _request: Request,
            candidates: Vec<Candidate>,
        ) -> Result<Decision, String> {
            let mut state = self.0.borrow_mut();
            state.seq += 1;
            let order = super::reversed(candidates.iter().map(|c| c.index).collect());
            let strategy_metadata = super::metadata(state.seq, &order, state.hedge_after_ms);
            Ok(Decision {
                order,
                strategy_metadata,
            })
        }

        fn observe(&self, observation: Observation) {
            let mut state = self.0.borrow_mut();
            state.observations += 1;
            state.last_metadata = observation.strategy_metadata;
        }

        fn status(&self) -> String {
            let state = self.0.borrow();
            serde_json::json!({
                "routes": state.routes,
                "decisions": state.seq,
                "observations": state.observations,
                "last_metadata": state.last_metadata,
            })
            .to_string()
        }

        fn tick(&self, _now_ms: u64) {}
    }

    bindings::export!(Fixture with_types_in bindings);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn highest_index_first_with_a_legacy_hedge_suffix() {
        let order = reversed(vec![0, 2, 1]);
        assert_eq!(order, vec![2, 1, 0]);
        assert_eq!(metadata(3, &order, Some(40)), "v01:3;hedge=40@1");
        assert_eq!(metadata(3, &order, None), "v01:3");
        assert_eq!(metadata(3, &[2], Some(40)), "v01:3");
    }

    #[test]
    fn params_are_checked() {
        assert_eq!(hedge_after_ms(""), Ok(None));
        assert_eq!(hedge_after_ms(r#"{"hedge_after_ms": 5}"#), Ok(Some(5)));
        assert!(hedge_after_ms(r#"{"other": 1}"#).is_err());
        assert!(hedge_after_ms(r#"{"hedge_after_ms": -1}"#).is_err());
    }
}
