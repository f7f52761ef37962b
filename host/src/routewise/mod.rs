//! The host's side of RouteWise: what the component cannot do from inside its sandbox. One room,
//! plugged into the gateway through one hook: [`RouteWiseHost`] implements
//! [`crate::gateway::extension::Extension`] (`extension.rs`), and nothing outside this folder uses
//! its parts except the binary's startup guards ([`quota::replica_guard`], [`quota::cold_start`],
//! [`quota::QuotaPlan::diagnostics`]), which run before a gateway exists.
//!
//! - [`settings`]: run-time `router_params` from the admin API (a global fallback layer and
//!   per-model overrides, stored in the database), layered onto each RouteWise model's params
//!   whenever a snapshot is applied. A combination the strategy rejects never takes a model down:
//!   the model keeps the params (and the router) it had, and the problem is logged once and shown
//!   in `/health/deep`.
//! - [`bootstrap`]: a new router with `db_bootstrap_enabled` replays recent `api_logs` rows of its
//!   model, so it starts with latency profiles, an output predictor and a cost envelope.
//! - [`probe`]: with `routewise_probe_enabled`, a one-token request now and then to an endpoint
//!   real traffic has left idle, reported as an observation.
//! - [`quota`]: quota sources, filling quota routes' `quota_snapshot`, and the local counter.
//! - [`store`]: the settings tables (`routewise_settings`, `routewise_model_settings`), a part of
//!   every [`crate::store::ConfigStore`].
//! - [`admin`]: `/admin/routewise/*`, merged into the admin room's management API.

pub mod admin;
pub mod bootstrap;
mod extension;
pub mod probe;
pub mod quota;
pub mod settings;
pub mod store;

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::routing::table::ModelTable;
use crate::store::{Snapshot, Store};
use crate::strategy::{CatalogEntry, LoadedStrategy, ModelRouter, StrategyCatalog, StrategyEngine};
use bootstrap::{BootstrapReport, BootstrapSettings};

/// The strategy whose models this module serves.
pub const STRATEGY: &str = "routewise";

/// What the host knows of one RouteWise model's params.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelParams {
    /// The params from the config (`router_params:` or `routing.database_models`), before any
    /// admin setting.
    pub config: Value,
    /// The params its router was last given.
    pub served: Value,
    /// Why the settings in the database are not what it is served with.
    pub problem: Option<String>,
}

/// Shared host-side RouteWise state. Cheap to share; one per process.
#[derive(Debug, Default)]
pub struct RouteWiseHost {
    models: Mutex<BTreeMap<String, ModelParams>>,
    /// The problems last logged, so each distinct set is logged once.
    logged: Mutex<Vec<String>>,
    /// Routers the bootstrap has already considered (each router is bootstrapped once, when new).
    bootstrapped: Mutex<Vec<Weak<ModelRouter>>>,
    /// The last bootstrap of each model.
    bootstraps: Mutex<BTreeMap<String, BootstrapReport>>,
    /// The prober's state per model ([`probe::spawn`]).
    pub probes: Arc<probe::ProbeBoard>,
    /// Quota snapshots and the local request counter ([`quota`]).
    pub quota: Arc<quota::QuotaBoard>,
}

/// A router param as the router got it: `params[key]`, else the `default` the strategy's schema
/// declares for it, else null.
pub fn param(
    params: &serde_json::Value,
    schema: &serde_json::Value,
    key: &str,
) -> serde_json::Value {
    params
        .get(key)
        .or_else(|| schema["properties"][key].get("default"))
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// The loaded `routewise` strategy, if the catalog has one.
pub fn strategy(catalog: &StrategyCatalog) -> Option<Arc<LoadedStrategy>> {
    match catalog.get(STRATEGY) {
        Some(CatalogEntry::Loaded(s)) => Some(s.clone()),
        _ => None,
    }
}

impl RouteWiseHost {
    pub fn new() -> Self {
        Self::default()
    }

    /// The room as the gateway holds it, if its extension is this one.
    pub fn of(gateway: &crate::gateway::Gateway) -> Option<&RouteWiseHost> {
        gateway.extension.as_any().downcast_ref()
    }

    /// Layers the snapshot's settings onto every RouteWise model of `models` (see [`settings`]).
    /// Params that change are checked first (schema, then the strategy's `create`); when the check
    /// fails, the model keeps the params it is served with in `current` (so `ModelTable::rebuild`
    /// keeps its router and learned state), or its config params if it is new.
    pub async fn apply_settings(
        &self,
        models: &mut [ModelConfig],
        snapshot: &Snapshot,
        current: &ModelTable,
        engine: &StrategyEngine,
        catalog: &StrategyCatalog,
    ) {
        let strategy = strategy(catalog);
        let global = snapshot.routewise_global();
        let mut seen = BTreeMap::new();
        for model in models.iter_mut().filter(|m| m.router == STRATEGY) {
            let config = model.router_params.clone();
            let wanted = settings::layered(&config, &global, &snapshot.routewise_model(&model.id));
            let served_now = current
                .resolve(&model.id)
                .filter(|m| m.id() == model.id && m.config.router == STRATEGY)
                .map(|m| m.config.router_params.clone());
            let problem = if wanted == config || served_now.as_ref() == Some(&wanted) {
                None
            } else if let Some(strategy) = &strategy {
                settings::check_params(engine, strategy, &model.id, &wanted)
                    .await
                    .err()
            } else {
                // Without the strategy the rebuild reports the model; nothing to check here.
                None
            };
            let served = match &problem {
                None => wanted,
                Some(_) => served_now.unwrap_or_else(|| config.clone()),
            };
            model.router_params = served.clone();
            seen.insert(
                model.id.clone(),
                ModelParams {
                    config,
                    served,
                    problem,
                },
            );
        }
        let problems: Vec<String> = seen
            .iter()
            .filter_map(|(id, p)| {
                p.problem.as_ref().map(|e| {
                    format!("RouteWise settings of model `{id}` are not applied (it keeps its previous params): {e}")
                })
            })
            .collect();
        {
            let mut logged = self.logged.lock();
            if *logged != problems {
                for p in &problems {
                    tracing::error!("{p}");
                }
                *logged = problems;
            }
        }
        *self.models.lock() = seen;
    }

    /// Replays the request log into every RouteWise router of `table` that is new since the last
    /// call and enables the bootstrap (see [`bootstrap`]). Called after each table change, and so
    /// at startup before the gateway listens.
    pub async fn bootstrap_new_routers(&self, table: &ModelTable, store: Option<&Store>) {
        let fresh: Vec<_> = {
            let mut seen = self.bootstrapped.lock();
            seen.retain(|w| w.strong_count() > 0);
            let fresh: Vec<_> = table
                .models()
                .filter(|m| m.router.strategy.name == STRATEGY)
                .filter(|m| {
                    !seen
                        .iter()
                        .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&m.router)))
                })
                .cloned()
                .collect();
            seen.extend(fresh.iter().map(|m| Arc::downgrade(&m.router)));
            fresh
        };
        for model in fresh {
            let settings = BootstrapSettings::from_params(
                &model.config.router_params,
                &model.router.strategy.params_schema,
            );
            if !settings.enabled {
                continue;
            }
            let now = crate::clock::unix_ms();
            let mut report = BootstrapReport {
                at_ms: now,
                settings,
                rows: 0,
                replayed: 0,
                skipped: 0,
                error: None,
            };
            match store {
                None => report.error = Some("the gateway runs without a database".into()),
                Some(store) => {
                    let since = now.saturating_sub(settings.window_sec.saturating_mul(1_000));
                    match bootstrap::read_rows(
                        store.pool(),
                        model.id(),
                        i64::try_from(since).unwrap_or(i64::MAX),
                        i64::try_from(settings.max_rows).unwrap_or(i64::MAX),
                    )
                    .await
                    {
                        Ok(rows) => {
                            let (observations, skipped) =
                                bootstrap::observations(&rows, model.upstreams());
                            for o in &observations {
                                model.router.observe(o).await;
                            }
                            report.rows = rows.len();
                            report.replayed = observations.len();
                            report.skipped = skipped;
                        }
                        Err(e) => report.error = Some(format!("reading api_logs failed: {e}")),
                    }
                }
            }
            match &report.error {
                None => tracing::info!(
                    model = %model.id(),
                    rows = report.rows,
                    replayed = report.replayed,
                    skipped = report.skipped,
                    "routewise bootstrap: replayed the request log of the last {} s",
                    settings.window_sec
                ),
                Some(e) => tracing::warn!(model = %model.id(), "routewise bootstrap: {e}"),
            }
            self.bootstraps.lock().insert(model.id().to_owned(), report);
        }
    }

    /// The params of the canonical model `id`, if it is a RouteWise model the host has seen.
    pub fn model(&self, id: &str) -> Option<ModelParams> {
        self.models.lock().get(id).cloned()
    }

    /// The `routewise` section of `/health/deep`.
    pub fn report(&self) -> Value {
        let models = self.models.lock();
        let problems: Vec<Value> = models
            .iter()
            .filter_map(|(id, p)| {
                p.problem
                    .as_ref()
                    .map(|e| serde_json::json!({ "model": id, "problem": e }))
            })
            .collect();
        serde_json::json!({
            "settings_problems": problems,
            "bootstrap": *self.bootstraps.lock(),
            "probes": *self.probes.lock(),
        })
    }
}
