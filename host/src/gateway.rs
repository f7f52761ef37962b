//! Assembling the gateway from a validated config: strategy engine and catalog, route table, upstream
//! client, storage. Used by `serve` and `check`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use crate::config::Config;
use crate::routing::table::{RouteTable, RouteTableError};
use crate::store::Store;
use crate::store::api_log::ApiLog;
use crate::strategy::{StrategyCatalog, StrategyEngine, StrategyError, StrategyLimits};
use crate::upstream::UpstreamClient;

/// Why the gateway cannot be assembled.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The wasm engine could not be created.
    #[error(transparent)]
    Engine(#[from] StrategyError),
    /// Models reference unknown or broken strategies, or bad params.
    #[error("{0}")]
    Routes(#[from] RouteTableError),
    /// The upstream HTTP client could not be built.
    #[error("upstream client: {0}")]
    Http(#[from] reqwest::Error),
}

/// Strategies and the route table, without network or storage: what `check` validates.
pub struct Routing {
    pub engine: StrategyEngine,
    pub catalog: StrategyCatalog,
    pub table: RouteTable,
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
        let table = RouteTable::build(config, &engine, &catalog).await?;
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
    table: RwLock<Arc<RouteTable>>,
    upstreams: UpstreamClient,
    pub store: Option<Store>,
    pub api_log: Option<ApiLog>,
}

impl Gateway {
    pub fn new(
        config: Config,
        routing: Routing,
        store: Option<Store>,
    ) -> Result<Gateway, BuildError> {
        let upstreams = UpstreamClient::new(&config.upstream)?;
        let api_log = store.clone().map(ApiLog::start);
        Ok(Gateway {
            routing_engine: routing.engine,
            catalog: routing.catalog,
            table: RwLock::new(Arc::new(routing.table)),
            upstreams,
            store,
            api_log,
            config,
        })
    }

    /// The current route table; hold the `Arc`, not the lock.
    pub fn table(&self) -> Arc<RouteTable> {
        self.table.read().clone()
    }

    /// Queues a request-log row (never waits on the database).
    pub fn record(&self, mut row: crate::store::api_log::ApiLogRow) {
        if let Some(log) = &self.api_log {
            if row.created_at_ms == 0 {
                row.created_at_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(0);
            }
            log.record(row);
        }
    }

    pub fn upstreams(&self) -> &UpstreamClient {
        &self.upstreams
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
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0);
                for model in gateway.table().models() {
                    model.router.tick(now).await;
                }
            }
        });
    }
}
