//! Quota sources: where a quota route's `quota_snapshot` comes from, and the startup guards of
//! stateful providers.
//!
//! RouteWise prices a quota route (`metadata.provider_type: quota`) by how much of its quota is
//! left, and excludes it until the host hands it a `quota_snapshot: {used, limit, at_ms}` in the
//! route's metadata. This module fills it:
//!
//! - **Selectors.** `metadata.quota_source: {provider, usage_label, unit}` names one usage record
//!   of a registered fetcher, matched exactly on all three ([`fetch::Provider`]: `chutes`,
//!   `minimax`). The fetcher reads the provider's usage endpoint with the provider's own key.
//! - **Local counter.** `metadata.local_quota_fallback: true` replaces the fetcher with a
//!   gateway-side request counter ([`counter`]): per process, +1 per attempt dispatched to the
//!   route's pool, reset at server-local midnight and on restart; it counts requests only.
//! - **Pools.** Routes sharing a `quota_pool` share one snapshot; the first route of the pool (in
//!   config order) that declares a source decides where it comes from.
//! - **Refresh.** [`spawn_refresh`] reads every source at startup and then every
//!   `quota_snapshot_refresh_interval_sec` (router_params, default 60 s), keeps the latest snapshot
//!   per pool in the [`QuotaBoard`] and pushes the routes, snapshots applied, to the routers. A table
//!   rebuilt by the admin API re-applies them ([`QuotaBoard::with_snapshots`]).
//! - **Diagnostics.** A selector that cannot resolve is named with its model, endpoint and reason
//!   by `switchyard check` ([`QuotaPlan::diagnostics`]), once in the log, and in `/health/deep`
//!   ([`QuotaBoard::report`]), which adds failed fetches.
//! - **Guards** ([`guard`]): a RouteWise model whose routes are all quota routes cannot start
//!   uncalibrated ([`EnvelopeNotCalibratedError`]); quota and concurrency accounting is per process,
//!   so several processes are refused ([`SingleWorkerGuardError`]).

pub mod board;
pub mod counter;
pub mod fetch;
pub mod guard;
pub mod plan;
mod refresh;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use board::{QuotaBoard, SharedQuotaCounts};
pub use counter::{Clock, LocalCounter, SystemClock};
pub use fetch::{FetchError, Provider, UsageRecord};
pub use guard::{EnvelopeNotCalibratedError, SingleWorkerGuardError, cold_start, replica_guard};
pub use plan::{Diagnostic, FetchTarget, LocalWhy, QuotaPlan, Resolution, Selector, Unresolved};
pub use refresh::{push_snapshots, spawn_refresh};

/// `metadata.quota_snapshot` as RouteWise reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaSnapshot {
    /// Requests used in the current quota period.
    pub used: u64,
    /// The period's limit as the source reports it (0: RouteWise uses the route's `quota.limit`).
    pub limit: u64,
    /// When the host read it, in ms since the Unix epoch.
    pub at_ms: u64,
}

/// The route's `metadata.provider_type`, when it is a string.
pub fn provider_type(route: &crate::config::ModelUpstream) -> Option<&str> {
    route
        .metadata
        .get("provider_type")
        .and_then(serde_json::Value::as_str)
}

/// Whether the route is a quota route (`metadata.provider_type: quota`).
pub fn is_quota_route(route: &crate::config::ModelUpstream) -> bool {
    provider_type(route) == Some("quota")
}
