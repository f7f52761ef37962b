//! `/admin/routewise/*`: RouteWise `router_params` changed at run time, stored in the database and
//! applied by every process without a restart (see `routewise`).
//!
//! - `GET|PATCH /admin/routewise/settings`: the global fallback layer, used by every RouteWise
//!   model for keys that neither a model override nor its config sets. PATCH is a JSON merge
//!   patch: `{"budget_alpha": 0.5, "fallback_mode": null}` sets one key and removes another.
//! - `GET /admin/routewise/model-settings?model_id=…`, `PATCH|DELETE
//!   /admin/routewise/model-settings/{key}?model_id=…`: one model's overrides. The model id is a
//!   query parameter because ids may contain `/`; aliases resolve to the canonical model.
//!
//! Keys must be keys of the strategy's params schema and values must satisfy it (422 naming the
//! key); the resulting params of every affected model must also pass the strategy's own `create`,
//! so a combination it would refuse (percentiles out of order, a removed key) is refused here
//! rather than found later. Writes answer once this process serves them (at most a few seconds);
//! other processes follow through the configuration feed.
//!
//! [`router`] and [`ApiDoc`] are merged into the admin room's management API in one place
//! (`admin::management_router`, `admin::api_doc`), so auth and errors are the admin room's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::routing::{get, patch};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::admin::auth::AdminCaller;
use crate::admin::error::{ApiError, Body};
use crate::admin::store;
use crate::gateway::Gateway;
use crate::routewise::settings::{self, Explained};
use crate::routewise::store::RouteWiseSetting;
use crate::routewise::{self as rw, RouteWiseHost, STRATEGY};
use crate::store::StoreError;
use crate::strategy::LoadedStrategy;

/// The `/admin/routewise/*` routes.
pub fn router() -> Router<Arc<Gateway>> {
    Router::new()
        .route(
            "/admin/routewise/settings",
            get(get_settings).patch(patch_settings),
        )
        .route("/admin/routewise/model-settings", get(get_model_settings))
        .route(
            "/admin/routewise/model-settings/{key}",
            patch(patch_model_setting).delete(delete_model_setting),
        )
}

/// The OpenAPI document of [`router`]'s operations, merged into the management API's.
#[derive(OpenApi)]
#[openapi(
    paths(
        get_settings,
        patch_settings,
        get_model_settings,
        patch_model_setting,
        delete_model_setting,
    ),
    tags(
        (name = "routewise", description = "RouteWise router_params changed at run time: a global fallback layer and per-model overrides"),
    )
)]
pub struct ApiDoc;

/// How long a write waits for this process to serve it before answering anyway.
const APPLY_WAIT: Duration = Duration::from_secs(3);

/// Names the model.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ModelQuery {
    /// The model id or one of its aliases; may contain `/`.
    pub model_id: Option<String>,
}

/// `PATCH /admin/routewise/model-settings/{key}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingValue {
    /// The new value, of the type the strategy's params schema gives the key.
    #[schema(value_type = Object)]
    pub value: Value,
}

/// One RouteWise model's settings.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelSettings {
    /// The canonical model id.
    pub model_id: String,
    /// Every key of the strategy's params: its effective value and whether it comes from a
    /// `model` override, the `config`, the `global` layer or the strategy's `default`.
    pub params: BTreeMap<String, Explained>,
    /// This model's overrides.
    #[schema(value_type = Object)]
    pub overrides: Map<String, Value>,
    /// The `router_params` these settings give the strategy (defaults are left to it).
    #[schema(value_type = Object)]
    pub router_params: Value,
    /// What this process's router of the model runs with.
    pub serving: Serving,
}

/// The params a model's router was created with, in this process.
#[derive(Debug, Serialize, ToSchema)]
pub struct Serving {
    #[schema(value_type = Object)]
    pub router_params: Value,
    /// Whether that is `router_params` above (false while a change is on its way, or when it was
    /// refused).
    pub applied: bool,
    /// Why the stored settings are not served (the model keeps its previous params).
    pub problem: Option<String>,
}

/// The global fallback layer.
#[derive(Debug, Serialize, ToSchema)]
pub struct GlobalSettings {
    /// The keys set in this layer.
    #[schema(value_type = Object)]
    pub settings: Map<String, Value>,
    /// Every key of the strategy's params with the value this layer gives a model that sets it
    /// nowhere else (`global`), or the strategy's `default`.
    pub params: BTreeMap<String, Explained>,
    /// The RouteWise models served in this process (the layer applies to each of them).
    pub models: Vec<String>,
}

fn invalid(field: &str, message: String) -> ApiError {
    ApiError::Store(StoreError::Invalid {
        field: field.to_owned(),
        message,
    })
}

fn routewise_strategy(g: &Gateway) -> Result<Arc<LoadedStrategy>, ApiError> {
    rw::strategy(&g.catalog()).ok_or_else(|| {
        ApiError::Store(StoreError::NotFound {
            entity: "loaded strategy",
            id: STRATEGY.to_owned(),
        })
    })
}

/// The canonical id of a RouteWise model, and its config params.
fn routewise_model(g: &Gateway, query: &ModelQuery) -> Result<(String, Value), ApiError> {
    let Some(name) = query.model_id.as_deref().filter(|m| !m.is_empty()) else {
        return Err(invalid("model_id", "the model id is required".into()));
    };
    let table = g.table();
    let entry = table.resolve(name).ok_or_else(|| StoreError::NotFound {
        entity: "model",
        id: name.to_owned(),
    })?;
    if entry.config.router != STRATEGY {
        return Err(invalid(
            "model_id",
            format!(
                "model `{}` is routed by `{}`, not {STRATEGY}",
                entry.id(),
                entry.config.router
            ),
        ));
    }
    let config = RouteWiseHost::of(g)
        .and_then(|rw| rw.model(entry.id()))
        .map(|p| p.config)
        .unwrap_or_else(|| entry.config.router_params.clone());
    Ok((entry.id().to_owned(), config))
}

fn check_key(strategy: &LoadedStrategy, key: &str) -> Result<(), ApiError> {
    if settings::is_known_key(strategy, key) {
        return Ok(());
    }
    let known: Vec<&str> = strategy.params_schema["properties"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    Err(invalid(
        key,
        format!(
            "not a parameter of {}; its parameters: {}",
            strategy.label(),
            known.join(", ")
        ),
    ))
}

/// The layers as stored: global, and per model.
struct Layers {
    global: Map<String, Value>,
    models: BTreeMap<String, Map<String, Value>>,
}

impl Layers {
    fn from_rows(rows: Vec<RouteWiseSetting>) -> Layers {
        let mut layers = Layers {
            global: Map::new(),
            models: BTreeMap::new(),
        };
        for row in rows {
            match row.model_id {
                None => {
                    layers.global.insert(row.key, row.value);
                }
                Some(model) => {
                    layers
                        .models
                        .entry(model)
                        .or_default()
                        .insert(row.key, row.value);
                }
            }
        }
        layers
    }

    fn model(&self, id: &str) -> Map<String, Value> {
        self.models.get(id).cloned().unwrap_or_default()
    }
}

fn borrowed(map: &Map<String, Value>) -> BTreeMap<&str, &Value> {
    map.iter().map(|(k, v)| (k.as_str(), v)).collect()
}

async fn layers(g: &Gateway) -> Result<Layers, ApiError> {
    Ok(Layers::from_rows(
        store(g)?.config().list_routewise_settings().await?,
    ))
}

fn model_view(
    g: &Gateway,
    strategy: &LoadedStrategy,
    id: String,
    config: &Value,
    layers: &Layers,
) -> ModelSettings {
    let overrides = layers.model(&id);
    let (global, model) = (borrowed(&layers.global), borrowed(&overrides));
    let router_params = settings::layered(config, &global, &model);
    let served = g
        .table()
        .resolve(&id)
        .map(|m| m.config.router_params.clone())
        .unwrap_or(Value::Null);
    ModelSettings {
        params: settings::explain(&strategy.params_schema, config, &global, &model),
        serving: Serving {
            applied: served == router_params,
            router_params: served,
            problem: RouteWiseHost::of(g)
                .and_then(|rw| rw.model(&id))
                .and_then(|p| p.problem),
        },
        overrides,
        router_params,
        model_id: id,
    }
}

fn global_view(g: &Gateway, strategy: &LoadedStrategy, layers: &Layers) -> GlobalSettings {
    let global = borrowed(&layers.global);
    GlobalSettings {
        params: settings::explain(
            &strategy.params_schema,
            &Value::Null,
            &global,
            &BTreeMap::new(),
        ),
        settings: layers.global.clone(),
        models: g
            .table()
            .models()
            .filter(|m| m.config.router == STRATEGY)
            .map(|m| m.id().to_owned())
            .collect(),
    }
}

/// Waits until this process serves the configuration version the write produced, so that a read
/// of `/routing` right after the answer sees the change.
async fn settle(g: &Gateway) -> Result<(), ApiError> {
    let version = store(g)?.config().version().await?;
    let started = Instant::now();
    while g.snapshot().version < version && started.elapsed() < APPLY_WAIT {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Checks `params` for model `id`; a refusal is a 422 on `field`.
async fn check_combination(
    g: &Gateway,
    strategy: &Arc<LoadedStrategy>,
    id: &str,
    params: &Value,
    field: &str,
) -> Result<(), ApiError> {
    settings::check_params(&g.routing_engine, strategy, id, params)
        .await
        .map_err(|e| {
            invalid(
                field,
                format!("model `{id}` would reject its resulting router_params {params}: {e}"),
            )
        })
}

#[utoipa::path(get, path = "/admin/routewise/model-settings", tag = "routewise",
    params(ModelQuery),
    responses((status = 200, body = ModelSettings), (status = 404, description = "No such model"),
        (status = 422, description = "`model_id` is missing or the model is not routed by routewise")))]
pub async fn get_model_settings(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Query(query): Query<ModelQuery>,
) -> Result<Json<ModelSettings>, ApiError> {
    let strategy = routewise_strategy(&g)?;
    let (id, config) = routewise_model(&g, &query)?;
    let layers = layers(&g).await?;
    Ok(Json(model_view(&g, &strategy, id, &config, &layers)))
}

#[utoipa::path(patch, path = "/admin/routewise/model-settings/{key}", tag = "routewise",
    params(("key" = String, Path, description = "A key of the routewise params schema"), ModelQuery),
    request_body = SettingValue,
    responses((status = 200, body = ModelSettings), (status = 404, description = "No such model"),
        (status = 422, description = "Unknown key, a value the schema rejects, or params the strategy refuses; `param` is the key")))]
pub async fn patch_model_setting(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(key): Path<String>,
    Query(query): Query<ModelQuery>,
    Body(body): Body<SettingValue>,
) -> Result<Json<ModelSettings>, ApiError> {
    let strategy = routewise_strategy(&g)?;
    let (id, config) = routewise_model(&g, &query)?;
    check_key(&strategy, &key)?;
    settings::check_value(&strategy, &key, &body.value).map_err(|e| invalid(&key, e))?;
    let layers = layers(&g).await?;
    let mut overrides = layers.model(&id);
    overrides.insert(key.clone(), body.value.clone());
    let params = settings::layered(&config, &borrowed(&layers.global), &borrowed(&overrides));
    check_combination(&g, &strategy, &id, &params, &key).await?;
    store(&g)?
        .config()
        .write_routewise_settings(Some(&id), vec![(key, Some(body.value))])
        .await?;
    settle(&g).await?;
    let layers = self::layers(&g).await?;
    Ok(Json(model_view(&g, &strategy, id, &config, &layers)))
}

#[utoipa::path(delete, path = "/admin/routewise/model-settings/{key}", tag = "routewise",
    params(("key" = String, Path, description = "A key of the routewise params schema"), ModelQuery),
    responses((status = 200, body = ModelSettings, description = "The override is gone (or was never set); the key has its inherited value"),
        (status = 404, description = "No such model"), (status = 422, description = "Unknown key")))]
pub async fn delete_model_setting(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(key): Path<String>,
    Query(query): Query<ModelQuery>,
) -> Result<Json<ModelSettings>, ApiError> {
    let strategy = routewise_strategy(&g)?;
    let (id, config) = routewise_model(&g, &query)?;
    check_key(&strategy, &key)?;
    let changed = store(&g)?
        .config()
        .write_routewise_settings(Some(&id), vec![(key, None)])
        .await?;
    if changed {
        settle(&g).await?;
    }
    let layers = layers(&g).await?;
    Ok(Json(model_view(&g, &strategy, id, &config, &layers)))
}

#[utoipa::path(get, path = "/admin/routewise/settings", tag = "routewise",
    responses((status = 200, body = GlobalSettings)))]
pub async fn get_settings(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
) -> Result<Json<GlobalSettings>, ApiError> {
    let strategy = routewise_strategy(&g)?;
    let layers = layers(&g).await?;
    Ok(Json(global_view(&g, &strategy, &layers)))
}

#[utoipa::path(patch, path = "/admin/routewise/settings", tag = "routewise",
    request_body(content = Object, description = "A JSON merge patch of the global layer: `{key: value}` sets a key, `{key: null}` removes it"),
    responses((status = 200, body = GlobalSettings),
        (status = 422, description = "Unknown key, a value the schema rejects, or params a model's strategy refuses; `param` is the key")))]
pub async fn patch_settings(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(patch): Body<Map<String, Value>>,
) -> Result<Json<GlobalSettings>, ApiError> {
    let strategy = routewise_strategy(&g)?;
    for (key, value) in &patch {
        check_key(&strategy, key)?;
        if !value.is_null() {
            settings::check_value(&strategy, key, value).map_err(|e| invalid(key, e))?;
        }
    }
    let layers = layers(&g).await?;
    let mut global = layers.global.clone();
    for (key, value) in &patch {
        match value {
            Value::Null => global.remove(key),
            v => global.insert(key.clone(), v.clone()),
        };
    }
    // Every RouteWise model must accept what the new layer gives it.
    let first_key = patch.keys().next().cloned().unwrap_or_default();
    for entry in g.table().models().filter(|m| m.config.router == STRATEGY) {
        let id = entry.id();
        let config = RouteWiseHost::of(&g)
            .and_then(|rw| rw.model(id))
            .map(|p| p.config)
            .unwrap_or_else(|| entry.config.router_params.clone());
        let overrides = layers.model(id);
        let params = settings::layered(&config, &borrowed(&global), &borrowed(&overrides));
        if params == entry.config.router_params {
            continue;
        }
        if let Err(e) = settings::check_params(&g.routing_engine, &strategy, id, &params).await {
            let field = patch
                .keys()
                .find(|k| e.contains(k.as_str()))
                .cloned()
                .unwrap_or_else(|| first_key.clone());
            return Err(invalid(
                &field,
                format!("model `{id}` would reject its resulting router_params {params}: {e}"),
            ));
        }
    }
    let changes = patch
        .into_iter()
        .map(|(k, v)| (k, (!v.is_null()).then_some(v)))
        .collect();
    if store(&g)?
        .config()
        .write_routewise_settings(None, changes)
        .await?
    {
        settle(&g).await?;
    }
    let layers = self::layers(&g).await?;
    Ok(Json(global_view(&g, &strategy, &layers)))
}
