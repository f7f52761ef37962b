//! The HTTP edge: routes, request parsing, and turning answers and errors into responses.

pub mod admin;
pub mod caller;
pub mod error;
mod inference;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::gateway::Gateway;
use crate::routing::dispatch::Attribution;
use crate::store::api_log::ApiLogRow;

pub use error::GatewayError;

/// The gateway's HTTP routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(inference::chat_completions))
        .route("/v1/responses", post(inference::responses))
        .route("/v1/messages", post(inference::messages))
        .route("/v1/messages/count_tokens", post(inference::count_tokens))
        .route("/v1/embeddings", post(inference::embeddings))
        .route("/v1/models", get(list_models))
        .route("/health", get(health))
        .route("/health/deep", get(admin::health_deep))
        .route("/routing", get(admin::routing))
        .route(
            "/admin/routing/weights",
            get(admin::get_weights).put(admin::put_weights),
        )
        .route(
            "/admin/routing/providers/{target}/{action}",
            post(admin::set_provider),
        )
        .merge(crate::admin::management_router())
        .fallback(not_found)
        .with_state(gateway)
}

async fn health(State(gateway): State<Arc<Gateway>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "status": "ok",
        "routes_configured": gateway.table().routes_configured(),
    }))
}

async fn list_models(State(gateway): State<Arc<Gateway>>) -> Json<serde_json::Value> {
    let table = gateway.table();
    let data: Vec<_> = table
        .models()
        .filter(|m| m.config.published && !m.config.routes.is_empty())
        .flat_map(|m| std::iter::once(m.config.id.clone()).chain(m.config.aliases.iter().cloned()))
        .map(|id| {
            serde_json::json!({
                "id": id,
                "object": "model",
                "created": 0,
                "owned_by": "switchyard",
            })
        })
        .collect();
    Json(serde_json::json!({ "object": "list", "data": data }))
}

fn clamp_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The parts of a log row that come from where the request went.
fn attributed_row(attribution: &Attribution) -> ApiLogRow {
    ApiLogRow {
        endpoint_id: Some(attribution.endpoint_id.clone()),
        attempts: attribution.failed_attempts.len() as i32 + 1,
        fell_back: attribution.fell_back,
        ..ApiLogRow::default()
    }
}

fn log_request(
    model: &str,
    attribution: &Attribution,
    started: Instant,
    strategy_error: Option<&str>,
) {
    tracing::info!(
        target: "switchyard::access",
        model,
        endpoint_id = %attribution.endpoint_id,
        provider = %attribution.provider,
        fell_back = attribution.fell_back,
        failed_attempts = attribution.failed_attempts.len(),
        strategy_error,
        status = 200,
        latency_ms = started.elapsed().as_millis() as u64,
        "served"
    );
}

/// A JSON 404 for unknown paths, in OpenAI's error shape.
pub async fn not_found() -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({
            "error": { "message": "no such endpoint", "type": "invalid_request_error", "param": null, "code": "not_found" }
        })),
    )
}
