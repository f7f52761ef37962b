//! The runtime route table: every model, its aliases, its routes and its strategy router.
//!
//! Built once from the validated config (and, later, the database); a rebuild produces a new table
//! that replaces the old one atomically, so a request always sees one consistent version.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::config::{Config, ModelConfig, ModelUpstream};
use crate::id_map::IdMap;
use crate::routing::policy::{self, Overrides};
use crate::strategy::{
    CatalogEntry, LoadedStrategy, ModelRouter, Shadow, StrategyCatalog, StrategyEngine,
    StrategyError, UpstreamInfo, upstream_table,
};

/// A model as served: its config and the strategy router that orders its routes.
#[derive(Debug, Clone)]
pub struct ModelEntry {
    pub config: ModelConfig,
    pub router: Arc<ModelRouter>,
    /// `router_shadow`: a second strategy handed every decided request, never acted on.
    pub shadow: Option<Arc<Shadow>>,
    /// The key-pool declarations' generation this entry's routes belong to
    /// ([`crate::routing::key_pools::KeyPools::generation`]). A request binds a caller to a key
    /// only while the declarations are still these: a request that resolved its model from an
    /// older table must not bind under newer declarations.
    pub key_generation: u64,
}

impl ModelEntry {
    pub fn id(&self) -> &str {
        &self.config.id
    }

    pub fn upstreams(&self) -> &[ModelUpstream] {
        &self.config.upstreams
    }
}

/// A model whose strategy is not in the catalog (not present yet, still compiling, or its file
/// failed to load): it is not served, and its requests answer 503 `strategy_loading` until a
/// reload of the strategies brings the strategy, when the next table serves it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PendingModel {
    pub model: String,
    pub strategy: String,
    /// Why the strategy cannot be used now.
    pub reason: String,
}

/// All served models, by canonical id, with aliases resolved to the canonical entry.
#[derive(Debug, Default)]
pub struct ModelTable {
    models: IdMap<String, Arc<ModelEntry>>,
    aliases: IdMap<String, String>,
    /// Canonical ids in config order, for listings.
    order: Vec<String>,
    /// Models waiting for their strategy, by id and by alias.
    pending: HashMap<String, Arc<PendingModel>>,
    pending_order: Vec<Arc<PendingModel>>,
    /// `strategies.shadow_queue`: calls waiting for each model's shadow.
    shadow_queue: usize,
}

/// Whether a model naming a strategy the catalog does not have (or cannot load) stops the build
/// (`check`) or waits as pending (`serve`, where strategies load after the gateway listens and
/// may be deployed after the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absent {
    IsAnError,
    Waits,
}

/// Why a config's models cannot be served with the strategies at hand. One entry per problem, each
/// naming the file, the model, the strategy and, for params, the key.
#[derive(Debug, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct ModelTableError {
    pub problems: Vec<String>,
}

impl ModelTable {
    /// Builds every model's router now, so bad strategy names or params fail at startup, not at the
    /// first request. All problems are collected, not only the first.
    pub async fn build(
        config: &Config,
        engine: &StrategyEngine,
        catalog: &StrategyCatalog,
        absent: Absent,
    ) -> Result<ModelTable, ModelTableError> {
        let file = config.source.display();
        let mut problems = Vec::new();
        let mut table = ModelTable {
            shadow_queue: config.strategies.shadow_queue,
            ..ModelTable::default()
        };
        for (mi, model) in config.models.iter().enumerate() {
            // `{file}:{line}: models[0] (id).router`, the line being the key's.
            let at = |key: &str| {
                format!(
                    "{file}{}: models[{mi}] ({}).{key}",
                    Some(config.location_of(&format!("models[{mi}].{key}")))
                        .filter(|l| !l.is_empty())
                        .unwrap_or_else(|| config.location_of(&format!("models[{mi}]"))),
                    model.id
                )
            };
            let mut model = model.clone();
            policy::apply(
                &mut model,
                &Overrides::default(),
                &HashSet::new(),
                config.routing.local_fraction,
            );
            let strategy = match strategy_for(&model, &at, catalog) {
                Ok(strategy) => strategy,
                Err(reason) if absent == Absent::Waits => {
                    // Not warned about here: `strategies.dir` has not loaded yet. The gateway
                    // warns about the models still pending once it has.
                    table.insert_pending(&model, reason);
                    continue;
                }
                Err(reason) => {
                    problems.push(reason);
                    continue;
                }
            };
            let routes = upstream_table(&model.upstreams);
            let shadow = match &model.shadow {
                // A shadow from `strategies.dir`, which loads after the gateway listens: the
                // rebuild that follows the load starts it.
                Some(s)
                    if absent == Absent::Waits
                        && strategy_named(&s.router, "router_shadow", &at, catalog).is_err() =>
                {
                    Ok(None)
                }
                _ => {
                    let queue = table.shadow_queue;
                    new_shadow(&model, routes.clone(), &at, engine, catalog, queue).await
                }
            };
            match (
                new_router(&model, strategy, routes, &at, engine).await,
                shadow,
            ) {
                (Ok(router), Ok(shadow)) => table.insert(model, Arc::new(router), shadow),
                (router, shadow) => {
                    problems.extend(router.err().into_iter().flatten());
                    problems.extend(shadow.err().into_iter().flatten());
                }
            }
        }
        if problems.is_empty() {
            Ok(table)
        } else {
            Err(ModelTableError { problems })
        }
    }

    /// A table serving `models`, with `apply_policy` run on each. A model whose strategy and
    /// params are unchanged keeps its router (and its learned state); the router gets the new
    /// route list when that changed. `for_router` gives the routes as a router sees them (the
    /// host's live annotations, such as quota snapshots, added). A model whose strategy is absent
    /// from `catalog` is pending; a router is reused only while the catalog still has the very
    /// strategy it runs (a replaced file gets new routers). Other models that cannot be built are
    /// left out and described in the returned problems.
    pub async fn rebuild(
        &self,
        models: Vec<ModelConfig>,
        engine: &StrategyEngine,
        catalog: &StrategyCatalog,
        apply_policy: impl Fn(&mut ModelConfig),
        for_router: impl Fn(&[ModelUpstream]) -> Vec<UpstreamInfo>,
    ) -> (ModelTable, Vec<String>) {
        let mut problems = Vec::new();
        let shadow_queue = self.shadow_queue;
        let mut table = ModelTable {
            shadow_queue,
            ..ModelTable::default()
        };
        for mut model in models {
            apply_policy(&mut model);
            if table.resolve(&model.id).is_some() || table.pending(&model.id).is_some() {
                problems.push(format!(
                    "model `{}` is declared twice; the first one is served",
                    model.id
                ));
                continue;
            }
            let id = model.id.clone();
            let at = |key: &str| format!("model `{id}`.{key}");
            let strategy = match strategy_for(&model, &at, catalog) {
                Ok(strategy) => strategy,
                Err(reason) => {
                    table.insert_pending(&model, reason);
                    continue;
                }
            };
            let reusable = self.models.get(&model.id).filter(|old| {
                old.config.router == model.router
                    && old.config.router_params == model.router_params
                    && old.config.router_deadline == model.router_deadline
                    && Arc::ptr_eq(&old.router.strategy, &strategy)
            });
            let router = match reusable {
                Some(old) => {
                    if upstream_table(old.upstreams()) != upstream_table(&model.upstreams) {
                        old.router
                            .refresh_upstreams(for_router(&model.upstreams))
                            .await
                            .map_err(|e| {
                                tracing::warn!(model = %model.id, "pushing the new upstream table failed: {e}")
                            })
                            .ok();
                    }
                    old.router.clone()
                }
                None => {
                    let routes = for_router(&model.upstreams);
                    match new_router(&model, strategy, routes, &at, engine).await {
                        Ok(router) => Arc::new(router),
                        Err(mut p) => {
                            problems.append(&mut p);
                            continue;
                        }
                    }
                }
            };
            // The shadow is kept (with its state) on the same terms as the router.
            // A shadow that could not start before (its strategy was absent) is tried again.
            let same_shadow = self.models.get(&model.id).filter(|old| {
                old.config.shadow == model.shadow
                    && match &old.shadow {
                        Some(s) => {
                            strategy_named(&s.router.strategy.name, "router_shadow", &at, catalog)
                                .is_ok_and(|now| Arc::ptr_eq(&s.router.strategy, &now))
                        }
                        None => model.shadow.is_none(),
                    }
            });
            let shadow = match same_shadow {
                Some(old) => {
                    if let Some(s) = &old.shadow
                        && upstream_table(old.upstreams()) != upstream_table(&model.upstreams)
                    {
                        s.refresh_upstreams(for_router(&model.upstreams));
                    }
                    old.shadow.clone()
                }
                None => {
                    let routes = for_router(&model.upstreams);
                    match new_shadow(&model, routes, &at, engine, catalog, shadow_queue).await {
                        Ok(shadow) => shadow,
                        Err(mut p) => {
                            // The model is served without its shadow rather than not at all.
                            problems.append(&mut p);
                            None
                        }
                    }
                }
            };
            table.insert(model, router, shadow);
        }
        (table, problems)
    }

    /// The configs of every model, in order (what a rebuild starts from).
    pub fn model_configs(&self) -> Vec<ModelConfig> {
        self.models().map(|m| m.config.clone()).collect()
    }

    fn insert_pending(&mut self, model: &ModelConfig, reason: String) {
        let pending = Arc::new(PendingModel {
            model: model.id.clone(),
            strategy: model.router.clone(),
            reason,
        });
        for name in std::iter::once(&model.id).chain(&model.aliases) {
            self.pending.insert(name.clone(), pending.clone());
        }
        self.pending_order.push(pending);
    }

    /// The model `name` (id or alias) waits for its strategy, and why.
    pub fn pending(&self, name: &str) -> Option<&Arc<PendingModel>> {
        self.pending.get(name)
    }

    /// Every model waiting for its strategy, in config order.
    pub fn pending_models(&self) -> impl Iterator<Item = &Arc<PendingModel>> {
        self.pending_order.iter()
    }

    fn insert(
        &mut self,
        config: ModelConfig,
        router: Arc<ModelRouter>,
        shadow: Option<Arc<Shadow>>,
    ) {
        for alias in &config.aliases {
            self.aliases.insert(alias.clone(), config.id.clone());
        }
        self.order.push(config.id.clone());
        self.models.insert(
            config.id.clone(),
            Arc::new(ModelEntry {
                config,
                router,
                shadow,
                key_generation: 0,
            }),
        );
    }

    /// Stamps every entry with the key-pool declarations' generation they were built against,
    /// before the table is served.
    pub fn set_key_generation(&mut self, generation: u64) {
        for entry in self.models.values_mut() {
            Arc::make_mut(entry).key_generation = generation;
        }
    }

    /// A copy of this table with weights recomputed from `overrides`, failing health checks and
    /// the deployment policy. Routers are shared; the caller pushes changed tables to them.
    pub fn with_policy(
        &self,
        overrides: &Overrides,
        unhealthy_origins: &HashSet<String>,
        local_fraction: Option<f64>,
    ) -> ModelTable {
        let mut table = ModelTable {
            shadow_queue: self.shadow_queue,
            ..ModelTable::default()
        };
        for entry in self.models() {
            let mut config = entry.config.clone();
            policy::apply(&mut config, overrides, unhealthy_origins, local_fraction);
            table.insert(config, entry.router.clone(), entry.shadow.clone());
        }
        table.pending = self.pending.clone();
        table.pending_order = self.pending_order.clone();
        // Policy changes weights, never keys: the declarations are the ones this table had.
        table.set_key_generation(self.models().next().map_or(0, |m| m.key_generation));
        table
    }

    /// Finds a model by id or alias (aliases share the canonical model's router).
    pub fn resolve(&self, name: &str) -> Option<&Arc<ModelEntry>> {
        self.models.get(name).or_else(|| {
            self.aliases
                .get(name)
                .and_then(|canonical| self.models.get(canonical))
        })
    }

    /// Every model in config order.
    pub fn models(&self) -> impl Iterator<Item = &Arc<ModelEntry>> {
        self.order.iter().filter_map(|id| self.models.get(id))
    }

    /// Number of routes across published models.
    pub fn upstreams_configured(&self) -> usize {
        self.models()
            .filter(|m| m.config.published)
            .map(|m| m.config.upstreams.len())
            .sum()
    }
}

/// The loaded strategy `model` names; the error says why it cannot be used (unknown, or its file
/// failed to load), where `at(key)` is where the model's `key` is.
fn strategy_for(
    model: &ModelConfig,
    at: &(dyn Fn(&str) -> String + Sync),
    catalog: &StrategyCatalog,
) -> Result<Arc<LoadedStrategy>, String> {
    strategy_named(&model.router, "router", at, catalog)
}

/// The loaded strategy `name`, which the model's `key` names.
fn strategy_named(
    name: &str,
    key: &str,
    at: &(dyn Fn(&str) -> String + Sync),
    catalog: &StrategyCatalog,
) -> Result<Arc<LoadedStrategy>, String> {
    match catalog.get(name) {
        Some(CatalogEntry::Loaded(s)) => Ok(s.clone()),
        Some(CatalogEntry::Missing(m)) => Err(format!(
            "{}: strategy `{name}` is unavailable: {}",
            at(key),
            m.reason
        )),
        None => Err(format!(
            "{}: unknown strategy `{name}`; known strategies: {}",
            at(key),
            catalog.names().join(", ")
        )),
    }
}

/// Validates a model's params against `strategy` and instantiates its router; `at(key)` says
/// where a problem with the model's `key` is.
async fn new_router(
    model: &ModelConfig,
    strategy: Arc<LoadedStrategy>,
    routes: Vec<UpstreamInfo>,
    at: &(dyn Fn(&str) -> String + Sync),
    engine: &StrategyEngine,
) -> Result<ModelRouter, Vec<String>> {
    let params = (&model.router_params, "router", "router_params");
    start_router(
        model,
        strategy,
        params,
        model.router_deadline,
        routes,
        at,
        engine,
    )
    .await
}

/// The model's shadow (`router_shadow`, `shadow_params`), validated and started like its router;
/// `None` when it has none.
async fn new_shadow(
    model: &ModelConfig,
    routes: Vec<UpstreamInfo>,
    at: &(dyn Fn(&str) -> String + Sync),
    engine: &StrategyEngine,
    catalog: &StrategyCatalog,
    queue: usize,
) -> Result<Option<Arc<Shadow>>, Vec<String>> {
    let Some(shadow) = &model.shadow else {
        return Ok(None);
    };
    let strategy =
        strategy_named(&shadow.router, "router_shadow", at, catalog).map_err(|e| vec![e])?;
    let params = (&shadow.params, "router_shadow", "shadow_params");
    // The shadow runs off the request path: the strategy's own deadline, not the model's.
    let router = start_router(model, strategy, params, None, routes, at, engine).await?;
    Ok(Some(Arc::new(Shadow::start(router, queue))))
}

/// Validates `params` (the model's `params_key`) against `strategy` (which its `router_key` names)
/// and instantiates a router of it for the model.
async fn start_router(
    model: &ModelConfig,
    strategy: Arc<LoadedStrategy>,
    (params, router_key, params_key): (&serde_json::Value, &str, &str),
    deadline: Option<std::time::Duration>,
    routes: Vec<UpstreamInfo>,
    at: &(dyn Fn(&str) -> String + Sync),
    engine: &StrategyEngine,
) -> Result<ModelRouter, Vec<String>> {
    if let Err(errors) = strategy.validate_params(params) {
        return Err(errors
            .into_iter()
            .map(|e| {
                format!(
                    "{}: strategy `{}` rejects the params: {e}",
                    at(params_key),
                    strategy.name
                )
            })
            .collect());
    }
    // A model's calls get their own deadline (see `StrategyEngine::deadline_for`).
    let engine = engine.with_call_timeout(engine.deadline_for(deadline, &strategy));
    match ModelRouter::new(&engine, strategy.clone(), &model.id, params, routes).await {
        Ok(router) => Ok(router),
        Err(StrategyError::Rejected { message, .. }) => Err(vec![format!(
            "{}: strategy `{}` rejects the params: {message}",
            at(params_key),
            strategy.name
        )]),
        Err(e) => Err(vec![format!("{}: {e}", at(router_key))]),
    }
}
