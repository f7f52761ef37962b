//! `/admin/routes` and `/admin/routes/{id}/plugins`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::auth::AdminCaller;
use super::error::{ApiError, Body};
use super::store;
use crate::entity::*;
use crate::gateway::Gateway;
use crate::store::StoreError;

#[utoipa::path(get, path = "/admin/routes", tag = "routes",
    responses((status = 200, body = [Route])))]
pub async fn list_routes(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
) -> Result<Json<Vec<Route>>, ApiError> {
    Ok(Json(store(&g)?.config().list_routes().await?))
}

#[utoipa::path(post, path = "/admin/routes", tag = "routes", request_body = NewRoute,
    responses((status = 201, body = Route), (status = 409, description = "An enabled route has this path_prefix")))]
pub async fn create_route(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(new): Body<NewRoute>,
) -> Result<(StatusCode, Json<Route>), ApiError> {
    let route = store(&g)?.config().create_route(new).await?;
    Ok((StatusCode::CREATED, Json(route)))
}

#[utoipa::path(get, path = "/admin/routes/{id}", tag = "routes",
    params(("id" = String, Path, description = "Route id")),
    responses((status = 200, body = Route), (status = 404)))]
pub async fn get_route(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Route>, ApiError> {
    Ok(Json(store(&g)?.config().get_route(&id).await?))
}

#[utoipa::path(patch, path = "/admin/routes/{id}", tag = "routes", request_body = RoutePatch,
    params(("id" = String, Path, description = "Route id")),
    responses((status = 200, body = Route), (status = 404), (status = 409)))]
pub async fn update_route(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(patch): Body<RoutePatch>,
) -> Result<Json<Route>, ApiError> {
    Ok(Json(store(&g)?.config().update_route(&id, patch).await?))
}

#[utoipa::path(delete, path = "/admin/routes/{id}", tag = "routes",
    params(("id" = String, Path, description = "Route id")),
    responses((status = 204, description = "Deleted, with its plugin configs"), (status = 404)))]
pub async fn delete_route(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    store(&g)?.config().delete_route(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/admin/routes/{id}/plugins", tag = "routes",
    params(("id" = String, Path, description = "Route id")),
    responses((status = 200, body = [PluginConfig]), (status = 404)))]
pub async fn list_plugins(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Vec<PluginConfig>>, ApiError> {
    Ok(Json(store(&g)?.config().list_plugin_configs(&id).await?))
}

#[utoipa::path(post, path = "/admin/routes/{id}/plugins", tag = "routes",
    request_body = NewPluginConfig,
    params(("id" = String, Path, description = "Route id")),
    responses((status = 201, body = PluginConfig), (status = 404),
        (status = 422, description = "Unknown plugin (the message lists the known ones) or bad config"),
        (status = 409, description = "The route already has a config for this plugin")))]
pub async fn create_plugin(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(new): Body<NewPluginConfig>,
) -> Result<(StatusCode, Json<PluginConfig>), ApiError> {
    require_known_plugin(&new.plugin).map_err(StoreError::from)?;
    let plugin = store(&g)?.config().create_plugin_config(&id, new).await?;
    Ok((StatusCode::CREATED, Json(plugin)))
}

#[utoipa::path(get, path = "/admin/routes/{id}/plugins/{plugin_id}", tag = "routes",
    params(("id" = String, Path, description = "Route id"),
        ("plugin_id" = String, Path, description = "Plugin config id")),
    responses((status = 200, body = PluginConfig), (status = 404)))]
pub async fn get_plugin(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, plugin_id)): Path<(String, String)>,
) -> Result<Json<PluginConfig>, ApiError> {
    Ok(Json(
        store(&g)?
            .config()
            .get_plugin_config(&id, &plugin_id)
            .await?,
    ))
}

#[utoipa::path(patch, path = "/admin/routes/{id}/plugins/{plugin_id}", tag = "routes",
    request_body = PluginConfigPatch,
    params(("id" = String, Path, description = "Route id"),
        ("plugin_id" = String, Path, description = "Plugin config id")),
    responses((status = 200, body = PluginConfig), (status = 404), (status = 409)))]
pub async fn update_plugin(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, plugin_id)): Path<(String, String)>,
    Body(patch): Body<PluginConfigPatch>,
) -> Result<Json<PluginConfig>, ApiError> {
    if let Some(name) = &patch.plugin {
        require_known_plugin(name).map_err(StoreError::from)?;
    }
    Ok(Json(
        store(&g)?
            .config()
            .update_plugin_config(&id, &plugin_id, patch)
            .await?,
    ))
}

#[utoipa::path(delete, path = "/admin/routes/{id}/plugins/{plugin_id}", tag = "routes",
    params(("id" = String, Path, description = "Route id"),
        ("plugin_id" = String, Path, description = "Plugin config id")),
    responses((status = 204, description = "Deleted"), (status = 404)))]
pub async fn delete_plugin(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, plugin_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    store(&g)?
        .config()
        .delete_plugin_config(&id, &plugin_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
