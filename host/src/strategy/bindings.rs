//! Host bindings of `switchyard:router@0.1.0` and the data every strategy `Store` carries.
//!
//! One `bindgen!` per supported WIT version lives here; when 0.2 ships, 0.1 gets its own module and its
//! host functions forward to the newest.

use wasmtime::StoreLimits;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

// Exports are async so that a guest's WASI calls which may block (stderr writes on panic, sleeps)
// are awaited on the caller's runtime instead of blocking it. The host import (`log`) stays sync.
wasmtime::component::bindgen!({
    path: "../wit/since_v0.1.0",
    world: "switchyard:router/strategy-component",
    exports: { default: async },
    // Route tables are compared to push only what changed.
    additional_derives: [PartialEq],
});

pub use self::switchyard::router::host::LogLevel;
pub use self::switchyard::router::types::{
    Candidate, CircuitState, Decision, Modalities, Observation, PrefillPolicy, Pricing, Request,
    Route, StrategyInfo,
};
pub use exports::switchyard::router::strategy::Guest as StrategyExports;

/// The API versions this host can run, oldest first.
pub const SUPPORTED_API_VERSIONS: &[&str] = &["0.1.0"];

/// Name of the custom section in which the SDK stamps the API version a strategy was built against.
pub const API_VERSION_SECTION: &str = "switchyard-router-api";

/// Everything one strategy instance's `Store` owns: WASI (no files, network or environment), the
/// resource table, the memory cap and a small buffer of the guest's stderr for error messages.
pub struct StoreState {
    pub(super) table: ResourceTable,
    pub(super) wasi: WasiCtx,
    pub(super) limits: StoreLimits,
    pub(super) stderr: MemoryOutputPipe,
    /// `name version` of the strategy, for the guest's log lines.
    pub(super) label: String,
    /// The budget of the call in progress, checked when the epoch deadline fires.
    pub(super) budget: super::engine::CallBudget,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl self::switchyard::router::host::Host for StoreState {
    fn log(&mut self, level: LogLevel, message: String) {
        let strategy = self.label.as_str();
        match level {
            LogLevel::Trace => {
                tracing::trace!(target: "switchyard::strategy", strategy, "{message}")
            }
            LogLevel::Debug => {
                tracing::debug!(target: "switchyard::strategy", strategy, "{message}")
            }
            LogLevel::Info => tracing::info!(target: "switchyard::strategy", strategy, "{message}"),
            LogLevel::Warn => tracing::warn!(target: "switchyard::strategy", strategy, "{message}"),
            LogLevel::Error => {
                tracing::error!(target: "switchyard::strategy", strategy, "{message}")
            }
        }
    }
}

impl self::switchyard::router::types::Host for StoreState {}
