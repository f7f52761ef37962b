//! Assembling the gateway from a validated config: strategy engine and catalog, route table, upstream
//! client, storage. Used by `serve` and `check`. Rooms beside the request path plug in through
//! one hook, [`extension::Extension`].

pub mod extension;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashSet;

use parking_lot::{Mutex, RwLock};

use crate::routing::RoutingContext;
use crate::routing::policy::Overrides;

use crate::config::Config;
use crate::inbound_routes::RouteSet;
use crate::routing::table::{ModelTable, ModelTableError};
use crate::store::api_log::ApiLog;
use crate::store::{Snapshot, Store};
use crate::strategy::{StrategyCatalog, StrategyEngine, StrategyError, StrategyLimits};
use crate::upstream::UpstreamClient;

/// Why the gateway cannot be assembled.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// `fleet.redis_url` cannot be used.
    #[error(transparent)]
    Fleet(#[from] crate::fleet::FleetError),
    /// The wasm engine could not be created.
    #[error(transparent)]
    Engine(#[from] StrategyError),
    /// Models reference unknown or broken strategies, or bad params.
    #[error("{0}")]
    Routes(#[from] ModelTableError),
    /// The upstream HTTP client could not be built.
    #[error("upstream client: {0}")]
    Http(#[from] reqwest::Error),
    /// `strategies.record` cannot write its file.
    #[error(transparent)]
    Record(#[from] crate::strategy::record::RecordError),
}

/// Strategies and the route table, without network or storage: what `check` validates.
pub struct Routing {
    pub engine: StrategyEngine,
    pub catalog: StrategyCatalog,
    pub table: ModelTable,
    pub builtin_dir: PathBuf,
}

impl Routing {
    pub async fn build(config: &Config) -> Result<Routing, BuildError> {
        let engine = StrategyEngine::new(StrategyLimits {
            call_timeout: config.strategies.call_timeout,
            memory_limit_bytes: config.strategies.memory_limit_bytes,
        })?;
        let builtin_dir = builtin_strategies_dir(config);
        let extra_dir = config
            .strategies
            .dir
            .as_deref()
            .map(|d| config.resolve_path(d));
        let catalog =
            StrategyCatalog::discover(&engine, Some(&builtin_dir), extra_dir.as_deref()).await;
        let table = ModelTable::build(config, &engine, &catalog).await?;
        Ok(Routing {
            engine,
            catalog,
            table,
            builtin_dir,
        })
    }
}

/// Where the built-in strategies are: `strategies.builtin_dir`, else `$SWITCHYARD_BUILTIN_STRATEGIES`,
/// else the build output beside the binary (`target/strategies` for `target/debug/switchyard`).
pub fn builtin_strategies_dir(config: &Config) -> PathBuf {
    if let Some(dir) = &config.strategies.builtin_dir {
        return config.resolve_path(dir);
    }
    if let Some(dir) = std::env::var_os("SWITCHYARD_BUILTIN_STRATEGIES") {
        return PathBuf::from(dir);
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_owned))
        .unwrap_or_else(|| PathBuf::from("."));
    let candidates = [exe_dir.join("strategies"), exe_dir.join("../strategies")];
    candidates
        .iter()
        .find(|d| d.is_dir())
        .cloned()
        .unwrap_or_else(|| exe_dir.join("../strategies"))
}

/// The running gateway's shared state.
pub struct Gateway {
    pub config: Config,
    pub routing_engine: StrategyEngine,
    pub catalog: StrategyCatalog,
    pub routing: RoutingContext,
    /// The gateway's one extension: RouteWise's host support (`crate::routewise`).
    pub extension: Arc<dyn extension::Extension>,
    /// Runtime weight overrides and disables from the admin API.
    overrides: Mutex<Overrides>,
    /// Origins of local deployments whose `/health` check is failing.
    unhealthy_origins: Mutex<HashSet<String>>,
    /// Serialises table rebuilds so two admin changes cannot interleave their pushes.
    rebuild: tokio::sync::Mutex<()>,
    table: RwLock<Arc<ModelTable>>,
    /// Inbound routes (prefixes and auth) of the config file and the database.
    inbound_routes: RwLock<Arc<RouteSet>>,
    /// The database snapshot the table and routes were last built from.
    snapshot: RwLock<Arc<Snapshot>>,
    /// The last problems a snapshot rebuild reported, so each distinct set is logged once.
    rebuild_problems: Mutex<Vec<String>>,
    upstreams: UpstreamClient,
    pub store: Option<Store>,
    pub api_log: Option<ApiLog>,
    /// Shutdown state: `/health` and in-flight streams watch it.
    pub drain: Arc<crate::server::listener::Drain>,
    /// The counters of the `rate-limit` plugin: the fleet's (Redis) with `fleet:`, else this
    /// process's own.
    pub limits: Arc<dyn crate::server::rate_limit::LimitStore>,
    /// The fleet this replica belongs to (`fleet:`); `None`: its routing state is its own.
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
    /// Budgets' spend: the fleet's ledger (Redis) with `fleet:`, else this process's own.
    pub budgets: Arc<crate::server::budget::Budgets>,
}

impl Gateway {
    pub fn new(
        config: Config,
        routing: Routing,
        store: Option<Store>,
    ) -> Result<Gateway, BuildError> {
        let upstreams = UpstreamClient::new(&config.upstream)?;
        let api_log = store.clone().map(ApiLog::start);
        let snapshot = Arc::new(Snapshot::empty());
        let inbound_routes = RouteSet::build(&config, &snapshot);
        let extension: Arc<dyn extension::Extension> =
            Arc::new(crate::routewise::RouteWiseHost::new());
        let mut routing_context = RoutingContext::new(&config);
        routing_context.attempts = extension.clone();
        if let Some(record) = &config.strategies.record {
            let path = config.resolve_path(&record.path);
            let recorder = crate::strategy::record::Recorder::start(record, path)?;
            routing_context.recorder = Some(Arc::new(recorder));
        }
        routing_context
            .keys
            .update_declarations(routing.table.models().flat_map(|m| m.upstreams().iter()));
        let fleet = match &config.fleet {
            Some(fleet) => Some(crate::fleet::Fleet::join(
                fleet.clone(),
                &mut routing_context,
            )?),
            None => None,
        };
        if let Some(fleet) = &fleet {
            extension.on_fleet(fleet);
        }
        let mut table = routing.table;
        table.set_key_generation(routing_context.keys.generation());
        Ok(Gateway {
            inbound_routes: RwLock::new(Arc::new(inbound_routes)),
            snapshot: RwLock::new(snapshot),
            rebuild_problems: Mutex::new(Vec::new()),
            routing: routing_context,
            extension,
            overrides: Mutex::new(Overrides::default()),
            unhealthy_origins: Mutex::new(HashSet::new()),
            rebuild: tokio::sync::Mutex::new(()),
            routing_engine: routing.engine,
            catalog: routing.catalog,
            table: RwLock::new(Arc::new(table)),
            upstreams,
            store,
            api_log,
            drain: Arc::default(),
            limits: match &fleet {
                Some(fleet) => Arc::new(crate::fleet::limits::FleetLimits::new(fleet.clone())),
                None => Arc::new(crate::server::rate_limit::InProcessLimits::default()),
            },
            budgets: Arc::new(crate::server::budget::Budgets::new(match &fleet {
                Some(fleet) => crate::fleet::budgets::FleetLedger::start(fleet.clone()),
                None => Arc::new(crate::server::budget::InProcessLedger::default()),
            })),
            fleet,
            config,
        })
    }

    /// The current route table; hold the `Arc`, not the lock.
    pub fn table(&self) -> Arc<ModelTable> {
        self.table.read().clone()
    }

    /// The inbound routes in force.
    pub fn inbound_routes(&self) -> Arc<RouteSet> {
        self.inbound_routes.read().clone()
    }

    /// The database configuration the gateway serves from (empty without a database).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().clone()
    }

    /// Serves `snapshot`: the YAML models plus the database's, and the inbound routes of both.
    /// Routers of unchanged models keep their state. Models that cannot be built are skipped and
    /// logged; the rest are served.
    pub async fn apply_snapshot(&self, snapshot: Arc<Snapshot>) {
        let _serial = self.rebuild.lock().await;
        let mut models = crate::routing::db_models::merged_models(&self.config, &snapshot);
        // Extensions may change the models first (RouteWise layers its run-time settings).
        self.extension
            .on_snapshot(
                &mut models,
                &snapshot,
                &self.table(),
                &self.routing_engine,
                &self.catalog,
            )
            .await;
        let overrides = self.overrides.lock().clone();
        let unhealthy = self.unhealthy_origins.lock().clone();
        let local_fraction = self.config.routing.local_fraction;
        let (table, problems) = self
            .table()
            .rebuild(
                models,
                &self.routing_engine,
                &self.catalog,
                |m| crate::routing::policy::apply(m, &overrides, &unhealthy, local_fraction),
                |routes| crate::strategy::upstream_table(&self.extension.upstream_metadata(routes)),
            )
            .await;
        {
            let mut last = self.rebuild_problems.lock();
            if *last != problems {
                for p in &problems {
                    tracing::error!("database configuration version {}: {p}", snapshot.version);
                }
                *last = problems;
            }
        }
        let mut table = table;
        let dropped = self
            .routing
            .keys
            .update_declarations(table.models().flat_map(|m| m.upstreams().iter()));
        if dropped > 0 {
            tracing::info!("key pool declarations changed: {dropped} key bindings dropped");
        }
        // After the bump: requests holding the old table carry the old generation and bind nothing.
        table.set_key_generation(self.routing.keys.generation());
        *self.table.write() = Arc::new(table);
        // New RouteWise routers start from the request log when their params ask for it.
        self.extension
            .on_table(&self.table(), self.store.as_ref())
            .await;
        *self.inbound_routes.write() = Arc::new(RouteSet::build(&self.config, &snapshot));
        // Before the snapshot is served: no budget is enforced before its spend is known.
        if let Some(store) = &self.store {
            self.budgets.seed(&snapshot, store).await;
        }
        *self.snapshot.write() = snapshot;
    }

    /// Rebuilds whenever the store's snapshot changes (LISTEN/NOTIFY or the version poll).
    pub fn spawn_snapshot_sync(self: &Arc<Self>) {
        let Some(store) = &self.store else {
            return;
        };
        let mut changes = store.snapshots().subscribe();
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let snapshot = changes.borrow_and_update().clone();
                let Some(gateway) = weak.upgrade() else {
                    return;
                };
                if !Arc::ptr_eq(&snapshot, &gateway.snapshot()) {
                    gateway.apply_snapshot(snapshot).await;
                }
                drop(gateway);
                if changes.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Queues a request-log row (never waits on the database).
    pub fn record(&self, mut row: crate::store::api_log::ApiLogRow) {
        if let Some(log) = &self.api_log {
            if row.created_at_ms == 0 {
                row.created_at_ms = crate::clock::unix_ms() as i64;
            }
            log.record(row);
        }
    }

    pub fn upstreams(&self) -> &UpstreamClient {
        &self.upstreams
    }

    /// The current runtime overrides.
    pub fn overrides(&self) -> Overrides {
        self.overrides.lock().clone()
    }

    /// Applies `change` to the runtime overrides, rebuilds the effective table and pushes the new
    /// route tables to every strategy whose routes changed. No restart.
    pub async fn update_overrides(&self, change: impl FnOnce(&mut Overrides)) {
        let _serial = self.rebuild.lock().await;
        change(&mut self.overrides.lock());
        self.rebuild_table().await;
    }

    /// Marks a local deployment's origin healthy or not; rebuilds when that changes anything.
    pub async fn set_origin_health(&self, origin: &str, healthy: bool) {
        let _serial = self.rebuild.lock().await;
        let changed = {
            let mut unhealthy = self.unhealthy_origins.lock();
            if healthy {
                unhealthy.remove(origin)
            } else {
                unhealthy.insert(origin.to_owned())
            }
        };
        if changed {
            self.rebuild_table().await;
        }
    }

    async fn rebuild_table(&self) {
        let overrides = self.overrides.lock().clone();
        let unhealthy = self.unhealthy_origins.lock().clone();
        let old = self.table();
        let new =
            Arc::new(old.with_policy(&overrides, &unhealthy, self.config.routing.local_fraction));
        *self.table.write() = new.clone();
        for (before, after) in old.models().zip(new.models()) {
            let weights = |m: &crate::routing::table::ModelEntry| {
                m.upstreams().iter().map(|r| r.weight).collect::<Vec<_>>()
            };
            if weights(before) != weights(after) {
                let routes = crate::strategy::upstream_table(
                    &self.extension.upstream_metadata(after.upstreams()), // quota snapshots survive
                );
                if let Some(shadow) = &after.shadow {
                    shadow.refresh_upstreams(routes.clone());
                }
                if let Err(e) = after.router.refresh_upstreams(routes).await {
                    tracing::warn!(model = %after.id(), "pushing the new upstream table failed: {e}");
                }
            }
        }
    }

    /// Polls each local deployment's origin `/health` (any `/v1` path is dropped) at the configured
    /// interval. A failing deployment gets weight 0 until it passes again; never-probed counts as
    /// healthy. Five failures in a row log one warning and a recovery after that logs once, so a
    /// healthy fleet logs nothing.
    pub fn spawn_health_checks(self: &Arc<Self>) {
        let Some(check) = self.config.routing.health_check else {
            return;
        };
        let mut origins: Vec<String> = self
            .table()
            .models()
            .flat_map(|m| m.upstreams().iter())
            .filter(|r| r.local_deployment)
            .filter_map(|r| crate::routing::policy::origin(&r.base_url))
            .collect();
        origins.sort();
        origins.dedup();
        if origins.is_empty() {
            return;
        }
        let client = match reqwest::Client::builder().timeout(check.timeout).build() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("health checks disabled: {e}");
                return;
            }
        };
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            const WARN_AFTER: u32 = 5;
            let mut failures: std::collections::HashMap<String, u32> = Default::default();
            let mut timer = tokio::time::interval(check.interval);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                timer.tick().await;
                let Some(gateway) = weak.upgrade() else {
                    return;
                };
                let probes = origins.iter().map(|origin| {
                    let client = client.clone();
                    async move {
                        let ok = client
                            .get(format!("{origin}/health"))
                            .send()
                            .await
                            .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
                        (origin, ok)
                    }
                });
                for (origin, ok) in futures::future::join_all(probes).await {
                    let run = failures.entry(origin.clone()).or_insert(0);
                    if ok {
                        if *run >= WARN_AFTER {
                            tracing::info!(origin = %origin, "local deployment passes its health check again");
                        }
                        *run = 0;
                    } else {
                        *run += 1;
                        if *run == WARN_AFTER {
                            tracing::warn!(origin = %origin, "local deployment failed its health check {WARN_AFTER} times in a row; it gets no traffic until it passes");
                        }
                    }
                    gateway.set_origin_health(origin, ok).await;
                }
            }
        });
    }

    /// Starts the extension's background tasks (RouteWise: the quota refresh and the prober).
    pub fn spawn_extension_tasks(self: &Arc<Self>) {
        self.extension.spawn_tasks(self);
    }

    /// Calls every router's `tick` at the configured interval, for strategies with time-based state.
    pub fn spawn_ticker(self: &Arc<Self>) {
        let Some(interval) = self.config.strategies.tick_interval else {
            return;
        };
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut timer = tokio::time::interval(interval.max(Duration::from_millis(10)));
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                timer.tick().await;
                let Some(gateway) = weak.upgrade() else {
                    return;
                };
                let now = crate::clock::unix_ms();
                for model in gateway.table().models() {
                    model.router.tick(now).await;
                    if let Some(shadow) = &model.shadow {
                        shadow.tick(now);
                    }
                }
            }
        });
    }
}
