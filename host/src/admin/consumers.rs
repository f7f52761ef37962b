//! `/admin/consumers` and `/admin/consumers/{id}/keys`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::auth::AdminCaller;
use super::error::{ApiError, Body};
use super::store;
use crate::entity::*;
use crate::gateway::Gateway;

#[utoipa::path(get, path = "/admin/consumers", tag = "consumers",
    responses((status = 200, body = [Consumer])))]
pub async fn list_consumers(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
) -> Result<Json<Vec<Consumer>>, ApiError> {
    Ok(Json(store(&g)?.config().list_consumers().await?))
}

#[utoipa::path(post, path = "/admin/consumers", tag = "consumers", request_body = NewConsumer,
    responses((status = 201, body = Consumer), (status = 409, description = "The name is taken")))]
pub async fn create_consumer(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(new): Body<NewConsumer>,
) -> Result<(StatusCode, Json<Consumer>), ApiError> {
    let consumer = store(&g)?.config().create_consumer(new).await?;
    Ok((StatusCode::CREATED, Json(consumer)))
}

#[utoipa::path(get, path = "/admin/consumers/{id}", tag = "consumers",
    params(("id" = String, Path, description = "Consumer id")),
    responses((status = 200, body = Consumer), (status = 404)))]
pub async fn get_consumer(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Consumer>, ApiError> {
    Ok(Json(store(&g)?.config().get_consumer(&id).await?))
}

#[utoipa::path(patch, path = "/admin/consumers/{id}", tag = "consumers",
    request_body = ConsumerPatch,
    params(("id" = String, Path, description = "Consumer id")),
    responses((status = 200, body = Consumer), (status = 404), (status = 409)))]
pub async fn update_consumer(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(patch): Body<ConsumerPatch>,
) -> Result<Json<Consumer>, ApiError> {
    Ok(Json(store(&g)?.config().update_consumer(&id, patch).await?))
}

#[utoipa::path(delete, path = "/admin/consumers/{id}", tag = "consumers",
    params(("id" = String, Path, description = "Consumer id")),
    responses((status = 204, description = "Deleted, with its keys"), (status = 404)))]
pub async fn delete_consumer(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    store(&g)?.config().delete_consumer(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/admin/consumers/{id}/keys", tag = "consumers",
    params(("id" = String, Path, description = "Consumer id")),
    responses((status = 200, body = [ConsumerKey], description = "The keys, without their secrets"),
        (status = 404)))]
pub async fn list_keys(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Vec<ConsumerKey>>, ApiError> {
    Ok(Json(store(&g)?.config().list_consumer_keys(&id).await?))
}

#[utoipa::path(post, path = "/admin/consumers/{id}/keys", tag = "consumers",
    request_body = NewConsumerKey,
    params(("id" = String, Path, description = "Consumer id")),
    responses((status = 201, body = CreatedConsumerKey,
        description = "The key with its secret: the only time the secret is shown"), (status = 404)))]
pub async fn create_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    Body(new): Body<NewConsumerKey>,
) -> Result<(StatusCode, Json<CreatedConsumerKey>), ApiError> {
    let created = store(&g)?.config().create_consumer_key(&id, new).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

#[utoipa::path(get, path = "/admin/consumers/{id}/keys/{key_id}", tag = "consumers",
    params(("id" = String, Path, description = "Consumer id"),
        ("key_id" = String, Path, description = "Key id")),
    responses((status = 200, body = ConsumerKey), (status = 404)))]
pub async fn get_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<Json<ConsumerKey>, ApiError> {
    Ok(Json(
        store(&g)?.config().get_consumer_key(&id, &key_id).await?,
    ))
}

#[utoipa::path(patch, path = "/admin/consumers/{id}/keys/{key_id}", tag = "consumers",
    request_body = ConsumerKeyPatch,
    params(("id" = String, Path, description = "Consumer id"),
        ("key_id" = String, Path, description = "Key id")),
    responses((status = 200, body = ConsumerKey), (status = 404)))]
pub async fn update_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, key_id)): Path<(String, String)>,
    Body(patch): Body<ConsumerKeyPatch>,
) -> Result<Json<ConsumerKey>, ApiError> {
    Ok(Json(
        store(&g)?
            .config()
            .update_consumer_key(&id, &key_id, patch)
            .await?,
    ))
}

#[utoipa::path(delete, path = "/admin/consumers/{id}/keys/{key_id}", tag = "consumers",
    params(("id" = String, Path, description = "Consumer id"),
        ("key_id" = String, Path, description = "Key id")),
    responses((status = 204, description = "Deleted"), (status = 404)))]
pub async fn delete_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    store(&g)?
        .config()
        .delete_consumer_key(&id, &key_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
