//! `/admin/providers`, `/admin/upstreams`, `/admin/upstreams/{id}/keys` and
//! `/admin/upstream-models`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::auth::AdminCaller;
use super::error::{ApiError, Body};
use super::store;
use crate::entity::*;
use crate::gateway::Gateway;

#[utoipa::path(get, path = "/admin/providers", tag = "upstreams",
    responses((status = 200, body = [Provider])))]
pub async fn list_providers(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
) -> Result<Json<Vec<Provider>>, ApiError> {
    Ok(Json(store(&g)?.config().list_providers().await?))
}

#[utoipa::path(post, path = "/admin/providers", tag = "upstreams", request_body = NewProvider,
    responses((status = 201, body = Provider), (status = 409, description = "The name is taken")))]
pub async fn create_provider(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(new): Body<NewProvider>,
) -> Result<(StatusCode, Json<Provider>), ApiError> {
    let provider = store(&g)?.config().create_provider(new).await?;
    Ok((StatusCode::CREATED, Json(provider)))
}

#[utoipa::path(get, path = "/admin/providers/{id}", tag = "upstreams",
    params(("id" = String, Path, description = "Provider id")),
    responses((status = 200, body = Provider), (status = 404)))]
pub async fn get_provider(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Provider>, ApiError> {
    Ok(Json(store(&g)?.config().get_provider(&id).await?))
}

#[utoipa::path(patch, path = "/admin/providers/{id}", tag = "upstreams",
    request_body = ProviderPatch,
    params(("id" = String, Path, description = "Provider id")),
    responses((status = 200, body = Provider), (status = 404), (status = 409)))]
pub async fn update_provider(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(patch): Body<ProviderPatch>,
) -> Result<Json<Provider>, ApiError> {
    Ok(Json(store(&g)?.config().update_provider(&id, patch).await?))
}

#[utoipa::path(delete, path = "/admin/providers/{id}", tag = "upstreams",
    params(("id" = String, Path, description = "Provider id")),
    responses((status = 204, description = "Deleted"), (status = 404),
        (status = 409, description = "Upstreams still use the provider")))]
pub async fn delete_provider(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    store(&g)?.config().delete_provider(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/admin/upstreams", tag = "upstreams",
    responses((status = 200, body = [Upstream])))]
pub async fn list_upstreams(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
) -> Result<Json<Vec<Upstream>>, ApiError> {
    Ok(Json(store(&g)?.config().list_upstreams().await?))
}

#[utoipa::path(post, path = "/admin/upstreams", tag = "upstreams", request_body = NewUpstream,
    responses((status = 201, body = Upstream)))]
pub async fn create_upstream(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(new): Body<NewUpstream>,
) -> Result<(StatusCode, Json<Upstream>), ApiError> {
    let upstream = store(&g)?.config().create_upstream(new).await?;
    Ok((StatusCode::CREATED, Json(upstream)))
}

#[utoipa::path(get, path = "/admin/upstreams/{id}", tag = "upstreams",
    params(("id" = String, Path, description = "Upstream id")),
    responses((status = 200, body = Upstream), (status = 404)))]
pub async fn get_upstream(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Upstream>, ApiError> {
    Ok(Json(store(&g)?.config().get_upstream(&id).await?))
}

#[utoipa::path(patch, path = "/admin/upstreams/{id}", tag = "upstreams",
    request_body = UpstreamPatch,
    params(("id" = String, Path, description = "Upstream id")),
    responses((status = 200, body = Upstream), (status = 404)))]
pub async fn update_upstream(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(patch): Body<UpstreamPatch>,
) -> Result<Json<Upstream>, ApiError> {
    Ok(Json(store(&g)?.config().update_upstream(&id, patch).await?))
}

#[utoipa::path(delete, path = "/admin/upstreams/{id}", tag = "upstreams",
    params(("id" = String, Path, description = "Upstream id")),
    responses((status = 204, description = "Deleted, with its keys and model mappings"),
        (status = 404)))]
pub async fn delete_upstream(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    store(&g)?.config().delete_upstream(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/admin/upstreams/{id}/keys", tag = "upstreams",
    params(("id" = String, Path, description = "Upstream id")),
    responses((status = 200, body = [UpstreamKey], description = "The keys, secrets masked"),
        (status = 404)))]
pub async fn list_upstream_keys(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Vec<UpstreamKey>>, ApiError> {
    Ok(Json(store(&g)?.config().list_upstream_keys(&id).await?))
}

#[utoipa::path(post, path = "/admin/upstreams/{id}/keys", tag = "upstreams",
    request_body = NewUpstreamKey,
    params(("id" = String, Path, description = "Upstream id")),
    responses((status = 201, body = UpstreamKey, description = "The key, secret masked"),
        (status = 404)))]
pub async fn create_upstream_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(new): Body<NewUpstreamKey>,
) -> Result<(StatusCode, Json<UpstreamKey>), ApiError> {
    let key = store(&g)?.config().create_upstream_key(&id, new).await?;
    Ok((StatusCode::CREATED, Json(key)))
}

#[utoipa::path(get, path = "/admin/upstreams/{id}/keys/{key_id}", tag = "upstreams",
    params(("id" = String, Path, description = "Upstream id"),
        ("key_id" = String, Path, description = "Key id")),
    responses((status = 200, body = UpstreamKey), (status = 404)))]
pub async fn get_upstream_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<Json<UpstreamKey>, ApiError> {
    Ok(Json(
        store(&g)?.config().get_upstream_key(&id, &key_id).await?,
    ))
}

#[utoipa::path(patch, path = "/admin/upstreams/{id}/keys/{key_id}", tag = "upstreams",
    request_body = UpstreamKeyPatch,
    params(("id" = String, Path, description = "Upstream id"),
        ("key_id" = String, Path, description = "Key id")),
    responses((status = 200, body = UpstreamKey), (status = 404)))]
pub async fn update_upstream_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, key_id)): Path<(String, String)>,
    Body(patch): Body<UpstreamKeyPatch>,
) -> Result<Json<UpstreamKey>, ApiError> {
    Ok(Json(
        store(&g)?
            .config()
            .update_upstream_key(&id, &key_id, patch)
            .await?,
    ))
}

#[utoipa::path(delete, path = "/admin/upstreams/{id}/keys/{key_id}", tag = "upstreams",
    params(("id" = String, Path, description = "Upstream id"),
        ("key_id" = String, Path, description = "Key id")),
    responses((status = 204, description = "Deleted"), (status = 404)))]
pub async fn delete_upstream_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    store(&g)?
        .config()
        .delete_upstream_key(&id, &key_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/admin/upstream-models", tag = "upstreams",
    responses((status = 200, body = [UpstreamModel])))]
pub async fn list_models(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
) -> Result<Json<Vec<UpstreamModel>>, ApiError> {
    Ok(Json(store(&g)?.config().list_upstream_models().await?))
}

#[utoipa::path(post, path = "/admin/upstream-models", tag = "upstreams",
    request_body = NewUpstreamModel,
    responses((status = 201, body = UpstreamModel),
        (status = 409, description = "The model is already mapped to this upstream")))]
pub async fn create_model(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(new): Body<NewUpstreamModel>,
) -> Result<(StatusCode, Json<UpstreamModel>), ApiError> {
    let model = store(&g)?.config().create_upstream_model(new).await?;
    Ok((StatusCode::CREATED, Json(model)))
}

#[utoipa::path(get, path = "/admin/upstream-models/{id}", tag = "upstreams",
    params(("id" = String, Path, description = "Model mapping id")),
    responses((status = 200, body = UpstreamModel), (status = 404)))]
pub async fn get_model(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<UpstreamModel>, ApiError> {
    Ok(Json(store(&g)?.config().get_upstream_model(&id).await?))
}

#[utoipa::path(patch, path = "/admin/upstream-models/{id}", tag = "upstreams",
    request_body = UpstreamModelPatch,
    params(("id" = String, Path, description = "Model mapping id")),
    responses((status = 200, body = UpstreamModel), (status = 404), (status = 409)))]
pub async fn update_model(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(patch): Body<UpstreamModelPatch>,
) -> Result<Json<UpstreamModel>, ApiError> {
    Ok(Json(
        store(&g)?
            .config()
            .update_upstream_model(&id, patch)
            .await?,
    ))
}

#[utoipa::path(delete, path = "/admin/upstream-models/{id}", tag = "upstreams",
    params(("id" = String, Path, description = "Model mapping id")),
    responses((status = 204, description = "Deleted"), (status = 404)))]
pub async fn delete_model(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    store(&g)?.config().delete_upstream_model(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
