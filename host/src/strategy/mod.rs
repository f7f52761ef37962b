//! The WebAssembly strategy host: one engine, a catalog of compiled strategies, one router instance
//! per model, and the contract every strategy must satisfy.
//!
//! The WIT bindings stay inside this module (`wit/`, one `bindgen!` per supported version of
//! `switchyard:router`); the rest of the host speaks the plain types re-exported here.

pub mod catalog;
pub mod compile_child;
pub mod contract;
pub mod engine;
pub mod imports;
pub mod offline;
pub mod record;
pub mod replay;
pub mod router;
pub mod shadow;
pub mod skips;
mod types;
mod wit;

use std::path::PathBuf;

pub use catalog::{
    BUILTIN_STRATEGIES, CatalogEntry, FileOutcome, LoadedStrategy, MissingStrategy, StrategyCatalog,
};
pub use engine::{StrategyEngine, StrategyLimits};
pub use router::ModelRouter;
pub use shadow::Shadow;
pub use skips::{SKIPS_SECTION, SkippedCalls};
pub use types::{
    Candidate, CircuitState, Decision, HedgeRequest, Modalities, Observation, PrefillPolicy,
    Pricing, Request, StrategyInfo, UpstreamInfo, upstream_table,
};
pub use wit::{API_VERSION_SECTION, ApiVersion, SUPPORTED_API_VERSIONS};

/// What can go wrong with a strategy. Errors raised by a guest carry the strategy's name and version.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// The wasm engine itself could not be set up.
    #[error("strategy engine: {0}")]
    Engine(String),
    /// The file could not be read, compiled, linked or introspected.
    #[error("strategy file {}: {reason}", path.display())]
    Load { path: PathBuf, reason: String },
    /// The component was built against a WIT API version this host does not run.
    #[error("strategy file {}: built against switchyard:router@{found}, this host runs {supported}", path.display())]
    UnsupportedApi {
        path: PathBuf,
        found: String,
        supported: String,
    },
    /// The guest trapped: a panic, its deadline, its memory cap.
    #[error("strategy {strategy}: {call} failed: {reason}")]
    Trap {
        strategy: String,
        call: &'static str,
        reason: String,
    },
    /// The guest returned an error value.
    #[error("strategy {strategy}: {call} returned an error: {message}")]
    Rejected {
        strategy: String,
        call: &'static str,
        message: String,
    },
    /// `select` returned an order that is not a valid ordering of the candidates.
    #[error("strategy {strategy}: select returned an invalid order: {reason}")]
    InvalidDecision { strategy: String, reason: String },
}
