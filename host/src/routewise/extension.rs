//! RouteWise's side of the gateway's hook: where each point of [`Extension`] lands in the room.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::{RouteWiseHost, probe, quota};
use crate::config::{ModelConfig, ModelUpstream};
use crate::gateway::Gateway;
use crate::gateway::extension::Extension;
use crate::routing::table::ModelTable;
use crate::store::{Snapshot, Store};
use crate::strategy::{StrategyCatalog, StrategyEngine};

#[async_trait]
impl Extension for RouteWiseHost {
    /// Run-time settings from the database, layered onto the config's params.
    async fn on_snapshot(
        &self,
        models: &mut [ModelConfig],
        snapshot: &Snapshot,
        current: &ModelTable,
        engine: &StrategyEngine,
        catalog: &StrategyCatalog,
    ) {
        self.apply_settings(models, snapshot, current, engine, catalog)
            .await;
    }

    /// New routers start from the request log when their params ask for it.
    async fn on_table(&self, table: &ModelTable, store: Option<&Store>) {
        self.bootstrap_new_routers(table, store).await;
    }

    /// Quota upstreams get their latest `quota_snapshot`, so a rebuilt table keeps them.
    fn upstream_metadata(&self, upstreams: &[ModelUpstream]) -> Vec<ModelUpstream> {
        self.quota.with_snapshots(upstreams)
    }

    /// The quota refresh (now and then every `quota_snapshot_refresh_interval_sec`) and the prober
    /// of idle endpoints.
    fn spawn_tasks(&self, gateway: &Arc<Gateway>) {
        let weak = Arc::downgrade(gateway);
        quota::spawn_refresh(self.quota.clone(), move || {
            weak.upgrade().map(|g| g.table())
        });
        let weak = Arc::downgrade(gateway);
        probe::spawn(
            self.probes.clone(),
            gateway.upstreams().clone(),
            self.quota.clone(),
            move || weak.upgrade().map(|g| g.table()),
        );
    }

    /// The local quota counter reads the fleet's count of each pool (the fleet's gate counts
    /// every replica's requests).
    fn on_fleet(&self, fleet: &Arc<crate::fleet::Fleet>) {
        self.quota.share_counts(fleet.clone());
    }

    /// Each quota route's headroom, where its snapshot states a limit.
    fn refresh_metrics(&self) {
        for (model, endpoint, headroom) in self.quota.headroom() {
            crate::telemetry::metrics::state::quota_headroom(&model, &endpoint, headroom as f64);
        }
    }

    fn health(&self) -> Vec<(&'static str, Value)> {
        vec![("quota", self.quota.report()), ("routewise", self.report())]
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl crate::routing::AttemptObserver for RouteWiseHost {
    /// The local quota counter: +1 per attempt to a counted route's pool.
    fn on_attempt(&self, endpoint_id: &str) {
        self.quota.count_request(endpoint_id);
    }
}
