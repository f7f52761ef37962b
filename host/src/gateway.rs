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
use crate::routing::table::{Absent, ModelEntry, ModelTable, ModelTableError, PendingModel};
use crate::store::api_log::ApiLog;
use crate::store::{Snapshot, Store};
use crate::strategy::{
    FileOutcome, LoadedStrategy, StrategyCatalog, StrategyEngine, StrategyError, StrategyLimits,
};
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
    Http(#[from] crate::upstream::ClientBuildError),
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

/// When the files of `strategies.dir` are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirLoad {
    /// Before the table is built; a model naming an absent strategy is an error (`check`).
    Now,
    /// After the gateway listens ([`Gateway::spawn_strategy_loader`]); until then, and for
    /// strategies not deployed yet, their models wait as pending (`serve`).
    Later,
}

impl Routing {
    pub async fn build(config: &Config, dir: DirLoad) -> Result<Routing, BuildError> {
        let mut engine = StrategyEngine::new(StrategyLimits {
            call_timeout: config.strategies.call_timeout,
            memory_limit_bytes: config.strategies.memory_limit_bytes,
        })?;
        engine.set_max_call_timeout(config.strategies.max_call_timeout);
        let builtin_dir = builtin_strategies_dir(config);
        let extra_dir = strategies_dir(config);
        let (catalog, absent) = match dir {
            DirLoad::Now => (
                StrategyCatalog::discover(&engine, Some(&builtin_dir), extra_dir.as_deref()).await,
                Absent::IsAnError,
            ),
            DirLoad::Later => (
                StrategyCatalog::builtins(&engine, Some(&builtin_dir)).await,
                Absent::Waits,
            ),
        };
        let table = ModelTable::build(config, &engine, &catalog, absent).await?;
        Ok(Routing {
            engine,
            catalog,
            table,
            builtin_dir,
        })
    }
}

/// `strategies.dir`, resolved against the config file's folder.
pub fn strategies_dir(config: &Config) -> Option<PathBuf> {
    config
        .strategies
        .dir
        .as_deref()
        .map(|d| config.resolve_path(d))
}

/// What a reload of the strategies did: each file of `strategies.dir`, and the models still
/// waiting for their strategy afterwards.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReloadReport {
    pub files: Vec<FileOutcome>,
    pub pending_models: Vec<PendingModel>,
}

/// How long the watcher waits for a folder to settle after a change before reloading: a copy of a
/// 12 MB component fires many events. A reload that still catches a half-written file fails it,
/// and the write's last event brings another reload.
const WATCH_DEBOUNCE: Duration = Duration::from_millis(300);

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
    /// The strategies served now; a reload swaps in a new catalog whole.
    catalog: RwLock<Arc<StrategyCatalog>>,
    /// True while strategies load (the first pass over `strategies.dir`, or a reload): requests
    /// for a pending model wait for it to turn false, up to `strategies.load_wait_ms`.
    strategies_loading: tokio::sync::watch::Sender<bool>,
    /// One reload at a time (the watcher and `POST /admin/strategies/reload` both start them).
    reload_serial: tokio::sync::Mutex<()>,
    /// The last reload's report, for `/health/deep`.
    last_reload: Mutex<Option<ReloadReport>>,
    /// Pending models already warned about, so each is logged once per reason.
    pending_warned: Mutex<Vec<String>>,
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
        let api_log = store
            .clone()
            .map(|store| ApiLog::start(store, config.request_log_retention_days));
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
            catalog: RwLock::new(Arc::new(routing.catalog)),
            // `spawn_strategy_loader` raises it until its first pass over `strategies.dir` is done.
            strategies_loading: tokio::sync::watch::Sender::new(false),
            reload_serial: tokio::sync::Mutex::new(()),
            last_reload: Mutex::new(None),
            pending_warned: Mutex::new(Vec::new()),
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

    /// The strategies served now; hold the `Arc`, not the lock.
    pub fn catalog(&self) -> Arc<StrategyCatalog> {
        self.catalog.read().clone()
    }

    /// Whether strategies are being loaded now.
    pub fn strategies_loading(&self) -> bool {
        *self.strategies_loading.borrow()
    }

    /// Watches strategy loading across a read of several parts of the gateway: a view that reads
    /// the catalog and then the table can meet a reload between the two (the new catalog beside
    /// the old routers), so it reports loading when any load ran while it read.
    pub fn loading_window(&self) -> LoadingWindow {
        LoadingWindow::open(self.strategies_loading.subscribe())
    }

    /// The last reload's report (the first pass over `strategies.dir` included).
    pub fn last_reload(&self) -> Option<ReloadReport> {
        self.last_reload.lock().clone()
    }

    /// The served model `name` (id or alias). A model waiting for its strategy waits while
    /// strategies load, up to `strategies.load_wait_ms`, and is `Err` when it still waits then.
    /// `Ok(None)`: no such model.
    pub async fn model(&self, name: &str) -> Result<Option<Arc<ModelEntry>>, Arc<PendingModel>> {
        let deadline = tokio::time::Instant::now() + self.config.strategies.load_wait;
        let mut loading = self.strategies_loading.subscribe();
        loop {
            let table = self.table();
            if let Some(model) = table.resolve(name) {
                return Ok(Some(model.clone()));
            }
            let Some(pending) = table.pending(name) else {
                return Ok(None);
            };
            if !*loading.borrow_and_update() {
                return Err(pending.clone());
            }
            // The loader swaps the table before it clears the flag: the next look finds the model.
            match tokio::time::timeout_at(deadline, loading.wait_for(|l| !*l)).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(self.table().pending(name).unwrap_or(pending).clone());
                }
            }
        }
    }

    /// Loads `strategies.dir` again and serves the result: unchanged files keep their strategy
    /// (and their models their routers), new and changed ones load off the request path and must
    /// pass the router contract, then every model whose strategy changed gets a new router in a
    /// new table, swapped in whole. Requests in flight finish on the routers they started with.
    /// A file that fails leaves what it served before serving.
    pub async fn reload_strategies(&self) -> ReloadReport {
        self.load_strategies(true).await
    }

    async fn load_strategies(&self, verify: bool) -> ReloadReport {
        let _one = self.reload_serial.lock().await;
        let Some(dir) = strategies_dir(&self.config) else {
            // Without a folder there is nothing to load; models naming unknown strategies wait.
            self.strategies_loading.send_replace(false);
            let report = ReloadReport {
                files: Vec::new(),
                pending_models: self
                    .table()
                    .pending_models()
                    .map(|p| (**p).clone())
                    .collect(),
            };
            *self.last_reload.lock() = Some(report.clone());
            return report;
        };
        self.strategies_loading.send_replace(true);
        let current = self.catalog();
        // The contract checks behaviour, not speed: its calls get the host's maximum deadline
        // (CPU time, so a busy machine does not fail a good strategy), at least 200 ms for a
        // guest's first calls. It runs with the params of a model that names the strategy.
        let contract_engine = self.routing_engine.with_call_timeout(
            self.routing_engine
                .max_call_timeout()
                .max(Duration::from_millis(200)),
        );
        let table = self.table();
        let params_for = |name: &str| -> serde_json::Value {
            table
                .models()
                .find(|m| m.config.router == name)
                .map(|m| m.config.router_params.clone())
                .or_else(|| {
                    self.config
                        .models
                        .iter()
                        .find(|m| m.router == name)
                        .map(|m| m.router_params.clone())
                })
                .unwrap_or_else(|| serde_json::json!({}))
        };
        let check = |strategy: Arc<LoadedStrategy>| {
            let engine = contract_engine.clone();
            let params = params_for(&strategy.name);
            let run: futures::future::BoxFuture<'static, Result<(), String>> =
                Box::pin(async move {
                    let report =
                        crate::strategy::contract::run_loaded_strategy(&engine, &strategy, &params)
                            .await;
                    if report.passed() {
                        Ok(())
                    } else {
                        Err(report
                            .checks
                            .iter()
                            .filter(|c| !c.passed)
                            .map(|c| format!("{} ({})", c.name, c.detail))
                            .collect::<Vec<_>>()
                            .join("; "))
                    }
                });
            run
        };
        let (next, files) = current
            .reload(
                &self.routing_engine,
                &dir,
                verify.then_some(&check as crate::strategy::catalog::Verify<'_>),
            )
            .await;
        drop(table);
        *self.catalog.write() = Arc::new(next);
        {
            let _serial = self.rebuild.lock().await;
            self.rebuild_models(&self.snapshot()).await;
        }
        // After the table: a request woken by this finds its model in it.
        self.strategies_loading.send_replace(false);
        let report = ReloadReport {
            files,
            pending_models: self
                .table()
                .pending_models()
                .map(|p| (**p).clone())
                .collect(),
        };
        self.warn_pending();
        *self.last_reload.lock() = Some(report.clone());
        report
    }

    /// Logs each pending model once per reason, when strategies are not loading (while they are,
    /// every model of a strategy still compiling is pending, and that is no news).
    fn warn_pending(&self) {
        if self.strategies_loading() {
            return;
        }
        let now: Vec<String> = self
            .table()
            .pending_models()
            .map(|p| {
                format!(
                    "{}; requests for model `{}` answer 503 strategy_loading until it loads",
                    p.reason, p.model
                )
            })
            .collect();
        let mut warned = self.pending_warned.lock();
        for line in &now {
            if !warned.contains(line) {
                tracing::warn!("{line}");
            }
        }
        *warned = now;
    }

    /// Loads `strategies.dir` off the listening path (files compile in parallel, on blocking
    /// threads), then keeps watching it: a `.wasm` added, changed or removed is reloaded after
    /// the folder settles. Without `strategies.dir` there is nothing to load or watch.
    pub fn spawn_strategy_loader(self: &Arc<Self>) {
        // Raised before the task starts: no request can see "not loading" before the first pass.
        self.strategies_loading.send_replace(true);
        let weak = Arc::downgrade(self);
        let dir = strategies_dir(&self.config);
        tokio::spawn(async move {
            let Some(gateway) = weak.upgrade() else {
                return;
            };
            let started = std::time::Instant::now();
            let report = gateway.load_strategies(false).await;
            let loaded = report.files.iter().filter(|f| f.state == "loaded").count();
            tracing::info!(
                files = report.files.len(),
                loaded,
                seconds = started.elapsed().as_secs_f64(),
                "strategies.dir loaded"
            );
            drop(gateway);
            let Some(dir) = dir else {
                return;
            };
            // A channel of one: a change arriving while one is queued is the same reload.
            let (changed, mut changes) = tokio::sync::mpsc::channel::<()>(1);
            let watcher =
                notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                    let relevant = event.is_ok_and(|e| {
                        e.paths
                            .iter()
                            .any(|p| p.extension().is_some_and(|x| x == "wasm"))
                    });
                    if relevant {
                        let _ = changed.try_send(());
                    }
                })
                .and_then(|mut w| {
                    use notify::Watcher;
                    w.watch(&dir, notify::RecursiveMode::NonRecursive)
                        .map(|()| w)
                });
            let _watcher = match watcher {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(
                        "cannot watch strategies.dir {}: {e}; POST /admin/strategies/reload picks up changes",
                        dir.display()
                    );
                    return;
                }
            };
            while changes.recv().await.is_some() {
                // Let the folder settle: events of one copy or rename arrive in a burst.
                loop {
                    tokio::time::sleep(WATCH_DEBOUNCE).await;
                    if changes.try_recv().is_err() {
                        break;
                    }
                }
                let Some(gateway) = weak.upgrade() else {
                    return;
                };
                let report = gateway.reload_strategies().await;
                for f in report.files.iter().filter(|f| f.state != "unchanged") {
                    tracing::info!(path = %f.path.display(), strategy = %f.strategy, state = f.state, "strategies.dir changed");
                }
            }
        });
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
        self.rebuild_models(&snapshot).await;
        *self.inbound_routes.write() = Arc::new(RouteSet::build(&self.config, &snapshot));
        // Before the snapshot is served: no budget is enforced before its spend is known.
        if let Some(store) = &self.store {
            self.budgets.seed(&snapshot, store).await;
        }
        *self.snapshot.write() = snapshot;
    }

    /// Builds and serves the table of `snapshot`'s models with the catalog served now. The caller
    /// holds the rebuild lock.
    async fn rebuild_models(&self, snapshot: &Snapshot) {
        let catalog = self.catalog();
        let mut models = crate::routing::db_models::merged_models(&self.config, snapshot);
        // Extensions may change the models first (RouteWise layers its run-time settings).
        self.extension
            .on_snapshot(
                &mut models,
                snapshot,
                &self.table(),
                &self.routing_engine,
                &catalog,
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
                &catalog,
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
        self.warn_pending();
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

/// What [`Gateway::loading_window`] returns: open it before reading, close it after.
pub struct LoadingWindow {
    watch: tokio::sync::watch::Receiver<bool>,
    at_start: bool,
}

impl LoadingWindow {
    fn open(mut watch: tokio::sync::watch::Receiver<bool>) -> LoadingWindow {
        let at_start = *watch.borrow_and_update();
        LoadingWindow { watch, at_start }
    }

    /// Whether strategies were loading at any moment since the window opened: loading then, or a
    /// load started or ended since (every change of the flag is a new value of the watch; with
    /// none, the flag is still what it was at the start).
    pub fn loaded_while_open(&self) -> bool {
        self.at_start || self.watch.has_changed().unwrap_or(true)
    }
}

#[cfg(test)]
mod loading_window_tests {
    use super::LoadingWindow;

    #[test]
    fn a_load_that_began_or_ended_while_the_window_was_open_reads_as_loading() {
        let flag = tokio::sync::watch::Sender::new(false);
        let quiet = LoadingWindow::open(flag.subscribe());
        assert!(!quiet.loaded_while_open(), "nothing loaded");

        let whole_load = LoadingWindow::open(flag.subscribe());
        flag.send_replace(true);
        flag.send_replace(false);
        assert!(
            whole_load.loaded_while_open(),
            "a load began and ended inside"
        );

        flag.send_replace(true);
        let during = LoadingWindow::open(flag.subscribe());
        flag.send_replace(false);
        assert!(
            during.loaded_while_open(),
            "opened during a load that has ended"
        );

        let after = LoadingWindow::open(flag.subscribe());
        assert!(!after.loaded_while_open(), "opened after the load ended");
        flag.send_replace(true);
        assert!(after.loaded_while_open(), "a load is running now");
    }
}
