//! Write Switchyard routing strategies as WebAssembly components.
//!
//! A strategy orders the upstreams of one model (the entries of its `route:` list) for each request.
//! The host compiles it once, creates one router per canonical model with the model's `router_params`,
//! pushes the upstream table, and then calls [`Strategy::select`] on the hot path with numbers only. This crate hides the component-model
//! plumbing: implement [`Strategy`] on a plain Rust type and export it with [`export_strategy!`].
//!
//! ```
//! use switchyard_sdk::{Candidate, Decision, Request, Strategy, StrategyInfo, declared_order};
//!
//! /// Always the declared order.
//! pub struct InOrder;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! #[serde(deny_unknown_fields)]
//! pub struct InOrderParams {}
//!
//! impl Strategy for InOrder {
//!     type Params = InOrderParams;
//!
//!     fn info() -> StrategyInfo {
//!         StrategyInfo::new("in_order", env!("CARGO_PKG_VERSION"), "Routes in declared order.")
//!     }
//!
//!     fn create(_model_id: &str, _params: InOrderParams) -> Result<Self, String> {
//!         Ok(Self)
//!     }
//!
//!     fn select(&mut self, _request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
//!         Ok(Decision::new(declared_order(candidates)))
//!     }
//! }
//!
//! switchyard_sdk::export_strategy!(InOrder);
//! # fn main() {}
//! ```
//!
//! Build the crate as a `cdylib` for `wasm32-wasip2`; the result is a component the host can load.
//! Everything also compiles natively, so a strategy's logic is unit-tested with plain `cargo test`
//! (there [`log`] is a no-op).

mod order;
mod params;
mod prefill;
mod rng;
mod skips;

use std::cell::RefCell;
use std::marker::PhantomData;

pub use order::{
    affinity_first, affinity_pinned, declared_order, declared_positions, declared_positions_into,
    order_of_positions, primary_then_declared, priority_tiers, usable_weight, weighted_draw,
    weighted_shuffle,
};
pub use params::{NoParams, params_schema, parse_params};
pub use prefill::{least_loaded, p2c, prefill_aware_primary};
pub use rng::Rng;
pub use skips::Skips;

pub use __private::bindings::exports::switchyard::router::strategy::{
    Candidate, Decision, Observation, Request, StrategyInfo, Upstream,
};
pub use __private::bindings::switchyard::router::host::LogLevel;
pub use __private::bindings::switchyard::router::types::{
    CircuitState, HedgeRequest, Modalities, PrefillPolicy, Pricing,
};

/// Re-exported so strategies can build `status` JSON without depending on it themselves.
pub use serde_json;

/// Version of the `switchyard:router` WIT package this SDK implements.
///
/// [`export_strategy!`] stamps it into the component's `switchyard-router-api` custom section, so the
/// host can tell which API a component was built against before instantiating it. Components built
/// with an older SDK keep working: the host still runs every version it lists in the README.
pub const API_VERSION: &str = "0.2.0";

/// A routing strategy: one value per canonical model, owned by the host for the life of the model.
///
/// Calls on one router never overlap; `&mut self` is safe to use for any state. Only `info`,
/// `create` and `select` are required; the other methods default to doing nothing.
pub trait Strategy: Sized + 'static {
    /// The model's `router_params`. Use `#[serde(deny_unknown_fields)]` (the host requires
    /// `additionalProperties: false`, and [`params_schema`] enforces it anyway) and serde defaults
    /// for optional keys.
    type Params: serde::de::DeserializeOwned + schemars::JsonSchema;

    /// Calls this strategy does without, which the host then does not make ([`Skips`]). A strategy
    /// that keeps no state from `observe` or `tick`, or whose only order for one candidate is that
    /// candidate, saves the host a call into it per request.
    const SKIPS: Skips = Skips::NONE;

    /// Name, version and description, for discovery, logs and error messages.
    fn info() -> StrategyInfo;

    /// Builds the router for `model_id`. `params` were parsed from the host's `router_params` (an empty
    /// string counts as `{}`); parse failures never reach this method. An `Err` is shown to the
    /// operator and the model is not served by this strategy.
    fn create(model_id: &str, params: Self::Params) -> Result<Self, String>;

    /// The model's effective upstreams, in declared order. Called before the first `select` and after
    /// any change to them. Later calls replace the table.
    fn refresh_upstreams(&mut self, _upstreams: &[Upstream]) {}

    /// Orders `candidates` for one request: [`Decision::order`] lists declared indexes, primary first;
    /// [`Decision::with_hedge`] asks the host to race a backup when the primary is slow.
    ///
    /// The host admitted these candidates (a subset of the upstream table, any order); an order naming
    /// anything else, repeating an index, or empty makes the host fall back to declared order, as
    /// does an `Err`. Use [`Rng::for_request`] for randomness so a decision is reproducible.
    fn select(&mut self, request: &Request, candidates: &[Candidate]) -> Result<Decision, String>;

    /// One call per finished attempt of a request this router ordered.
    fn observe(&mut self, _observation: &Observation) {}

    /// JSON shown in the host's health and routing endpoints.
    fn status(&self) -> String {
        "{}".to_owned()
    }

    /// Called at the host's tick interval, for time-based state.
    fn tick(&mut self, _now_ms: u64) {}
}

/// Sends a message to the host's log, tagged with the strategy and model.
///
/// A no-op when not compiled for `wasm32`, so native tests can call code that logs.
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    __private::bindings::switchyard::router::host::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = (level, message);
}

impl StrategyInfo {
    /// `version` is usually `env!("CARGO_PKG_VERSION")`.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            description: description.into(),
        }
    }
}

impl Decision {
    /// A decision with the given order (declared indexes, primary first), no hedge and no metadata.
    pub fn new(order: Vec<u32>) -> Self {
        Self {
            order,
            hedge: None,
            strategy_metadata: String::new(),
        }
    }

    /// Asks the host to send the request to `backup` (a declared index other than the primary) too
    /// when the primary has not answered `after_ms` milliseconds after it was sent; the first answer
    /// wins and the other attempt is cancelled.
    #[must_use]
    pub fn with_hedge(mut self, after_ms: u32, backup: u32) -> Self {
        self.hedge = Some(HedgeRequest { after_ms, backup });
        self
    }

    /// Attaches metadata; the host hands it back in the [`Observation`]s of this request.
    #[must_use]
    pub fn with_metadata(mut self, metadata: impl Into<String>) -> Self {
        self.strategy_metadata = metadata.into();
        self
    }
}

impl Candidate {
    /// A healthy candidate (closed circuit, full availability, no backlog, no latency estimates) with
    /// priority 0. Meant for tests; the host fills in every field.
    pub fn new(index: u32, weight: f64) -> Self {
        Self {
            index,
            weight,
            priority: 0,
            availability: 1.0,
            circuit: CircuitState::Closed,
            prefill_backlog_tokens: 0,
            inflight_elephants: 0,
            uncached_prompt_tokens: 0,
            ttft_ms: None,
            latency_ms: None,
            inflight_requests: 0,
            affinity_pinned: false,
        }
    }
}

impl Upstream {
    /// An upstream with the given declared index and weight, priority 0, empty strings, no modalities, no
    /// pricing and `{}` metadata. Meant for tests; the host fills in every field.
    pub fn new(index: u32, weight: f64) -> Self {
        Self {
            index,
            endpoint_id: String::new(),
            provider: String::new(),
            base_url: String::new(),
            provider_model_id: String::new(),
            weight,
            priority: 0,
            input_modalities: Vec::new(),
            pricing: None,
            metadata_json: "{}".to_owned(),
        }
    }
}

impl Request {
    /// A text-only request with the given seed and every other field zero. Meant for tests.
    pub fn with_seed(seed: u64) -> Self {
        Self {
            caller_hash: 0,
            prompt_tokens: 0,
            max_tokens: None,
            stream: false,
            modalities: Modalities::empty(),
            seed,
            now_ms: 0,
            prefill: PrefillPolicy::DEFAULT,
            remaining_budget_usd: None,
        }
    }
}

impl PrefillPolicy {
    /// The host's defaults: enabled, intervene at 50 000 pending tokens, elephants from 200 000
    /// uncached tokens, one elephant per endpoint.
    pub const DEFAULT: PrefillPolicy = PrefillPolicy {
        enabled: true,
        intervene_tokens: 50_000,
        elephant_tokens: 200_000,
        elephant_limit: 1,
    };
}

/// Exports a [`Strategy`] implementation as the crate's component. Use it once, in a `cdylib` crate.
///
/// On `wasm32` it emits the component exports and stamps [`API_VERSION`] into a custom section named
/// `switchyard-router-api` (UTF-8, no terminator) inside the component's core module, and
/// [`Strategy::SKIPS`] into `switchyard-router-skips`. On other targets
/// it only checks that the type implements [`Strategy`], so the crate's tests run natively.
#[macro_export]
macro_rules! export_strategy {
    ($strategy:ty) => {
        // Native builds only check the type: the export symbols (`pkg/iface#func`) are not valid
        // symbol names for native linkers, and nothing natively would call them.
        const _: fn() = || $crate::__private::assert_strategy::<$strategy>();

        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code)]
        const _: () = {
            type SwitchyardComponent = $crate::__private::Component<$strategy>;

            $crate::__private::bindings::__export_strategy_component!(
                SwitchyardComponent with_types_in $crate::__private::bindings
            );

            #[used]
            #[unsafe(link_section = "switchyard-router-api")]
            static SWITCHYARD_ROUTER_API: [u8; $crate::API_VERSION.len()] =
                $crate::__private::API_VERSION_BYTES;

            #[used]
            #[unsafe(link_section = "switchyard-router-skips")]
            static SWITCHYARD_ROUTER_SKIPS: [u8; <$strategy as $crate::Strategy>::SKIPS
                .section_len()] = <$strategy as $crate::Strategy>::SKIPS.section();
        };
    };
}

#[doc(hidden)]
pub mod __private {
    //! Glue between [`Strategy`](crate::Strategy) and the generated bindings. Not a public API.

    use super::{PhantomData, RefCell, Strategy};

    #[allow(
        unsafe_code,
        clippy::all,
        clippy::unwrap_used,
        clippy::expect_used,
        missing_docs
    )]
    pub mod bindings {
        wit_bindgen::generate!({
            path: "../wit/since_v0.2.0",
            world: "strategy-component",
            pub_export_macro: true,
            export_macro_name: "__export_strategy_component",
            default_bindings_module: "$crate::__private::bindings",
            additional_derives: [PartialEq],
        });
    }

    use bindings::exports::switchyard::router::strategy::{
        Candidate, Decision, Guest, GuestRouter, Observation, Request, Router, StrategyInfo,
        Upstream,
    };

    /// [`crate::API_VERSION`] as the bytes of the `switchyard-router-api` custom section.
    pub const API_VERSION_BYTES: [u8; crate::API_VERSION.len()] = {
        let version = crate::API_VERSION.as_bytes();
        let mut bytes = [0; crate::API_VERSION.len()];
        let mut i = 0;
        while i < version.len() {
            bytes[i] = version[i];
            i += 1;
        }
        bytes
    };

    /// Compile-time check used by [`export_strategy!`](crate::export_strategy) on every target.
    pub const fn assert_strategy<S: Strategy>() {}

    /// Implements the `strategy` interface for `S`.
    pub struct Component<S>(PhantomData<fn() -> S>);

    /// The `router` resource: the author's value behind a `RefCell`, since guest resources are
    /// called through `&self`. Calls never overlap (the only import, `log`, cannot call back).
    pub struct RouterCell<S>(RefCell<S>);

    impl<S: Strategy> Guest for Component<S> {
        type Router = RouterCell<S>;

        fn info() -> StrategyInfo {
            S::info()
        }

        fn params_schema() -> String {
            crate::params_schema::<S::Params>().to_string()
        }
    }

    impl<S: Strategy> GuestRouter for RouterCell<S> {
        fn create(model_id: String, params_json: String) -> Result<Router, String> {
            let params = crate::parse_params::<S::Params>(&params_json)?;
            let strategy = S::create(&model_id, params)?;
            Ok(Router::new(RouterCell(RefCell::new(strategy))))
        }

        fn refresh_upstreams(&self, upstreams: Vec<Upstream>) {
            self.0.borrow_mut().refresh_upstreams(&upstreams);
        }

        fn select(&self, request: Request, candidates: Vec<Candidate>) -> Result<Decision, String> {
            self.0.borrow_mut().select(&request, &candidates)
        }

        fn observe(&self, observation: Observation) {
            self.0.borrow_mut().observe(&observation);
        }

        fn status(&self) -> String {
            self.0.borrow().status()
        }

        fn tick(&self, now_ms: u64) {
            self.0.borrow_mut().tick(now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_version_matches_the_wit_package() {
        let wit = include_str!("../../wit/since_v0.2.0/router.wit");
        assert!(wit.contains(&format!("package switchyard:router@{API_VERSION};")));
        assert_eq!(&__private::API_VERSION_BYTES, API_VERSION.as_bytes());
    }

    #[test]
    fn the_python_and_javascript_sdks_ship_this_wit_and_version() {
        let wit = include_str!("../../wit/since_v0.2.0/router.wit");
        assert_eq!(
            include_str!("../python/switchyard_strategy/wit/router.wit"),
            wit
        );
        assert_eq!(include_str!("../js/wit/router.wit"), wit);
        let python = include_str!("../python/switchyard_strategy/__init__.py");
        assert!(python.contains(&format!("API_VERSION = \"{API_VERSION}\"")));
        let js = include_str!("../js/src/index.js");
        assert!(js.contains(&format!("export const API_VERSION = \"{API_VERSION}\";")));
    }

    #[test]
    fn log_is_a_no_op_natively() {
        log(LogLevel::Info, "hello");
    }

    #[test]
    fn decision_builders() {
        let decision = Decision::new(vec![2, 0]).with_metadata("m");
        assert_eq!(decision.order, vec![2, 0]);
        assert_eq!(decision.strategy_metadata, "m");
        assert_eq!(decision.hedge, None);
        let hedged = decision.with_hedge(250, 0);
        assert_eq!(
            hedged.hedge,
            Some(HedgeRequest {
                after_ms: 250,
                backup: 0
            })
        );
    }
}
