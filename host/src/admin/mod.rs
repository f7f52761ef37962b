//! The admin room: everything an operator calls. [`router`] is all of it, for the server to mount:
//!
//! - the management API ([`management_router`]): CRUD for routes and their plugin configs,
//!   consumers and their keys, budgets, providers, upstreams with their keys, and upstream model
//!   mappings;
//!   RouteWise settings; the store's sync status; the request log ([`logs`]); and the OpenAPI
//!   document generated from these handlers. Writes go straight to the database; the request path sees them through its
//!   snapshot, which [`crate::store::Store::spawn_sync`] reloads on every change, in this process
//!   and in every other one sharing the database.
//! - runtime routing changes ([`weights`]): weight overrides and provider disables, in memory.
//! - the operator views `GET /routing` and `GET /health/deep` ([`views`]).
//! - the operator dashboard `GET /ui/` ([`dashboard`]): static files that call the views above
//!   with the admin token the operator types in.
//!
//! Who may call: one rule, stated in [`auth`] and applied by its [`auth::AdminCaller`] extractor.
//! Bodies are JSON; bad input is a 422 whose `param` is the path of the field at fault, unknown ids
//! 404, clashes 409, all in OpenAI's error shape, from one error type ([`error::ApiError`]).
//! Secrets are write-only: a consumer key's secret is in the creation response only, upstream key
//! secrets are always masked.

pub mod auth;
mod budgets;
mod consumers;
pub mod dashboard;
pub mod error;
pub mod logs;
mod provider_keys;
mod routes;
mod upstreams;
pub mod views;
pub mod weights;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::gateway::Gateway;
use crate::store::{SnapshotCounts, Store, SyncStatus};
use auth::AdminCaller;
use error::ApiError;

/// The gateway's store, or 503 when it runs without one.
pub(crate) fn store(gateway: &Gateway) -> Result<&Store, ApiError> {
    gateway.store.as_ref().ok_or(ApiError::NoStore)
}

/// `POST /admin/strategies/reload`: loads `strategies.dir` again, as the folder watcher does, and
/// answers when the result serves: each file (`loaded`, `unchanged`, `failed` with its reason and
/// what still serves, `removed`) and the models still waiting for their strategy.
async fn reload_strategies(
    _: AdminCaller,
    State(gateway): State<Arc<Gateway>>,
) -> Json<crate::gateway::ReloadReport> {
    Json(gateway.reload_strategies().await)
}

/// Every admin route: the management API, runtime routing changes and the operator views.
pub fn router() -> Router<Arc<Gateway>> {
    management_router()
        .route("/health/deep", get(views::health_deep))
        .route("/routing", get(views::routing))
        .route(
            "/admin/routing/weights",
            get(weights::get_weights).put(weights::put_weights),
        )
        .route(
            "/admin/routing/providers/{target}/{action}",
            post(weights::set_provider),
        )
        .route("/admin/strategies/reload", post(reload_strategies))
        .merge(dashboard::router())
}

/// The management API: the routes its OpenAPI document ([`ApiDoc`]) describes.
pub fn management_router() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/admin/openapi.json", get(openapi_json))
        .route("/admin/store/status", get(store_status))
        .route("/admin/logs", get(logs::list_logs))
        .route(
            "/admin/routes",
            get(routes::list_routes).post(routes::create_route),
        )
        .route(
            "/admin/routes/{id}",
            get(routes::get_route)
                .patch(routes::update_route)
                .delete(routes::delete_route),
        )
        .route(
            "/admin/routes/{id}/plugins",
            get(routes::list_plugins).post(routes::create_plugin),
        )
        .route(
            "/admin/routes/{id}/plugins/{plugin_id}",
            get(routes::get_plugin)
                .patch(routes::update_plugin)
                .delete(routes::delete_plugin),
        )
        .route(
            "/admin/consumers",
            get(consumers::list_consumers).post(consumers::create_consumer),
        )
        .route(
            "/admin/consumers/{id}",
            get(consumers::get_consumer)
                .patch(consumers::update_consumer)
                .delete(consumers::delete_consumer),
        )
        .route(
            "/admin/consumers/{id}/keys",
            get(consumers::list_keys).post(consumers::create_key),
        )
        .route(
            "/admin/consumers/{id}/keys/{key_id}",
            get(consumers::get_key)
                .patch(consumers::update_key)
                .delete(consumers::delete_key),
        )
        .route(
            "/admin/budgets",
            get(budgets::list_budgets).post(budgets::create_budget),
        )
        .route(
            "/admin/budgets/{id}",
            get(budgets::get_budget)
                .patch(budgets::update_budget)
                .delete(budgets::delete_budget),
        )
        .route(
            "/admin/providers",
            get(upstreams::list_providers).post(upstreams::create_provider),
        )
        .route(
            "/admin/providers/{id}",
            get(upstreams::get_provider)
                .patch(upstreams::update_provider)
                .delete(upstreams::delete_provider),
        )
        .route(
            "/admin/upstreams",
            get(upstreams::list_upstreams).post(upstreams::create_upstream),
        )
        .route(
            "/admin/upstreams/{id}",
            get(upstreams::get_upstream)
                .patch(upstreams::update_upstream)
                .delete(upstreams::delete_upstream),
        )
        .route(
            "/admin/upstreams/{id}/keys",
            get(upstreams::list_upstream_keys).post(upstreams::create_upstream_key),
        )
        .route(
            "/admin/upstreams/{id}/keys/{key_id}",
            get(upstreams::get_upstream_key)
                .patch(upstreams::update_upstream_key)
                .delete(upstreams::delete_upstream_key),
        )
        .route(
            "/admin/provider-keys",
            get(provider_keys::list).post(provider_keys::create),
        )
        .route(
            "/admin/provider-keys/min-role-env",
            post(provider_keys::reserve_env_key),
        )
        .route(
            "/admin/provider-keys/{key_id}/min-role",
            post(provider_keys::set_min_role),
        )
        .route(
            "/admin/upstream-models",
            get(upstreams::list_models).post(upstreams::create_model),
        )
        .route(
            "/admin/upstream-models/{id}",
            get(upstreams::get_model)
                .patch(upstreams::update_model)
                .delete(upstreams::delete_model),
        )
        // The RouteWise room's handlers (`/admin/routewise/*`).
        .merge(crate::routewise::admin::router())
}

/// How this process's configuration snapshot stands.
#[derive(Debug, Serialize, ToSchema)]
pub struct StoreStatus {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Versions, last load and last error of this process's snapshot.
    pub sync: SyncStatus,
    /// What the snapshot in use holds.
    pub snapshot: SnapshotCounts,
}

/// This process's view of the configuration: served from its in-memory snapshot, not the database,
/// so comparing it across processes shows whether they have caught up.
#[utoipa::path(get, path = "/admin/store/status", tag = "store",
    responses((status = 200, body = StoreStatus)))]
async fn store_status(
    _: AdminCaller,
    State(gateway): State<Arc<Gateway>>,
) -> Result<Json<StoreStatus>, ApiError> {
    let store = store(&gateway)?;
    Ok(Json(StoreStatus {
        backend: store.backend(),
        sync: store.sync_status(),
        snapshot: store.snapshot().counts(),
    }))
}

/// This document.
#[utoipa::path(get, path = "/admin/openapi.json", tag = "store",
    responses((status = 200, description = "The OpenAPI 3.1 document of the management API")))]
async fn openapi_json(_: AdminCaller) -> Json<utoipa::openapi::OpenApi> {
    Json(api_doc())
}

/// The management API's OpenAPI document: [`ApiDoc`] with the RouteWise room's operations
/// merged in, every operation given the common answers of [`CommonResponses`].
pub fn api_doc() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.merge(crate::routewise::admin::ApiDoc::openapi());
    CommonResponses.modify(&mut doc);
    doc
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Switchyard management API",
        description = "Routes, plugin configs, consumers and keys, budgets, providers, upstreams, upstream keys and model mappings, and the request log. Every endpoint needs `Authorization: Bearer <admin token>` or the API key of a consumer with role `admin`."
    ),
    paths(
        store_status,
        openapi_json,
        routes::list_routes,
        routes::create_route,
        routes::get_route,
        routes::update_route,
        routes::delete_route,
        routes::list_plugins,
        routes::create_plugin,
        routes::get_plugin,
        routes::update_plugin,
        routes::delete_plugin,
        consumers::list_consumers,
        consumers::create_consumer,
        consumers::get_consumer,
        consumers::update_consumer,
        consumers::delete_consumer,
        consumers::list_keys,
        consumers::create_key,
        consumers::get_key,
        consumers::update_key,
        consumers::delete_key,
        budgets::list_budgets,
        budgets::create_budget,
        budgets::get_budget,
        budgets::update_budget,
        budgets::delete_budget,
        upstreams::list_providers,
        upstreams::create_provider,
        upstreams::get_provider,
        upstreams::update_provider,
        upstreams::delete_provider,
        upstreams::list_upstreams,
        upstreams::create_upstream,
        upstreams::get_upstream,
        upstreams::update_upstream,
        upstreams::delete_upstream,
        upstreams::list_upstream_keys,
        upstreams::create_upstream_key,
        upstreams::get_upstream_key,
        upstreams::update_upstream_key,
        upstreams::delete_upstream_key,
        upstreams::list_models,
        upstreams::create_model,
        upstreams::get_model,
        upstreams::update_model,
        upstreams::delete_model,
        provider_keys::list,
        provider_keys::create,
        provider_keys::set_min_role,
        provider_keys::reserve_env_key,
        logs::list_logs,
    ),
    components(schemas(error::ErrorBody, error::ErrorDetail)),
    modifiers(&CommonResponses),
    tags(
        (name = "routes", description = "Routes and their plugin configs"),
        (name = "consumers", description = "Consumers and their API keys"),
        (name = "budgets", description = "Spending limits of consumers and consumer groups"),
        (name = "upstreams", description = "Providers, upstreams, upstream keys and model mappings"),
        (name = "store", description = "Sync status and this document"),
        (name = "logs", description = "The request log"),
    )
)]
pub struct ApiDoc;

/// What every operation shares, added once here instead of on each handler: the bearer security
/// scheme, the 401/403/503 answers, a 422 for operations with a body, and the error schema on
/// every error answer.
struct CommonResponses;

impl Modify for CommonResponses {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token, or the API key (sk-sy-…) of a consumer with role admin",
                    ))
                    .build(),
            ),
        );
        api.security = Some(vec![SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
        let error_content = Content::new(Some(Ref::from_schema_name("ErrorBody")));
        for item in api.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.patch,
                &mut item.put,
                &mut item.delete,
            ];
            for op in operations.into_iter().flatten() {
                let mut codes = vec![
                    ("401", "No admin credentials"),
                    (
                        "403",
                        "No admin token is configured and no admin consumer key was presented",
                    ),
                    ("503", "The database is unreachable"),
                ];
                if op.request_body.is_some() {
                    codes.push(("422", "Invalid body; `param` is the field's path"));
                }
                for (code, description) in codes {
                    op.responses
                        .responses
                        .entry(code.to_owned())
                        .or_insert_with(|| {
                            RefOr::T(
                                utoipa::openapi::ResponseBuilder::new()
                                    .description(description)
                                    .build(),
                            )
                        });
                }
                for (code, response) in op.responses.responses.iter_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    if code.starts_with('4') || code.starts_with('5') {
                        if response.content.is_empty() {
                            response
                                .content
                                .insert("application/json".to_owned(), error_content.clone());
                        }
                        if response.description.is_empty() {
                            response.description = match code.as_str() {
                                "404" => "No such id".to_owned(),
                                "409" => "Conflicts with existing configuration".to_owned(),
                                _ => "Error".to_owned(),
                            };
                        }
                    }
                }
            }
        }
    }
}
