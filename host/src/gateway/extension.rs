//! The one hook through which a room beside the request path (today RouteWise's host support,
//! [`crate::routewise`]) plugs into the gateway. The gateway calls these points and nothing else of
//! the room; every method has a do-nothing default, and `()` is the gateway without extensions.
//!
//! What the hook cannot carry, because it runs before a gateway exists or without one, stays with
//! the room's own functions: startup guards (`switchyard serve`, `check`) and the admin handlers,
//! which `admin::management_router` merges in one place so the OpenAPI document lists them.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::Gateway;
use crate::config::{ModelConfig, ModelUpstream};
use crate::routing::AttemptObserver;
use crate::routing::table::ModelTable;
use crate::store::{Snapshot, Store};
use crate::strategy::{StrategyCatalog, StrategyEngine};

/// What the gateway lets an extension see and change. The gateway holds it; routing reaches it only
/// as the [`AttemptObserver`] it also is (`RoutingContext::attempts`).
#[async_trait]
pub trait Extension: AttemptObserver {
    /// A snapshot is being applied: may change the models' config (their params) before the table
    /// is rebuilt from them. `current` is the table served until then.
    async fn on_snapshot(
        &self,
        _models: &mut [ModelConfig],
        _snapshot: &Snapshot,
        _current: &ModelTable,
        _engine: &StrategyEngine,
        _catalog: &StrategyCatalog,
    ) {
    }

    /// The table was rebuilt from a snapshot (at startup too, before the gateway listens).
    async fn on_table(&self, _table: &ModelTable, _store: Option<&Store>) {}

    /// A model's upstreams as they are pushed to its strategy: may add to their metadata.
    fn upstream_metadata(&self, upstreams: &[ModelUpstream]) -> Vec<ModelUpstream> {
        upstreams.to_vec()
    }

    /// Starts the extension's background tasks, once, after the first snapshot is applied. Tasks
    /// hold the gateway weakly and end when it is dropped.
    fn spawn_tasks(&self, _gateway: &Arc<Gateway>) {}

    /// The gateway joined a fleet: state the extension counts may be shared through it.
    fn on_fleet(&self, _fleet: &Arc<crate::fleet::Fleet>) {}

    /// A scrape of `/metrics` is about to render: set the extension's gauges
    /// (`crate::telemetry::metrics::state`) from its live state.
    fn refresh_metrics(&self) {}

    /// The extension's sections of `GET /health/deep`, by key.
    fn health(&self) -> Vec<(&'static str, Value)> {
        Vec::new()
    }

    /// The extension itself, for its own admin handlers to find their state.
    fn as_any(&self) -> &dyn Any;
}

/// No extension.
impl Extension for () {
    fn as_any(&self) -> &dyn Any {
        self
    }
}
