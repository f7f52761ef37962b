//! The HTTP edge: routes, request parsing, and turning answers and errors into responses.

pub mod admin;
pub mod caller;
pub mod error;

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::net::SocketAddr;

use crate::gateway::Gateway;
use crate::protocol::openai_chat;
use crate::routing::dispatch::{self, Answer, Attribution};
use crate::routing::select::{self, RequestFacts};
use crate::store::api_log::ApiLogRow;

pub use error::GatewayError;

/// The gateway's HTTP routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
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

async fn chat_completions(
    State(gateway): State<Arc<Gateway>>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, GatewayError> {
    let started = Instant::now();
    let request = openai_chat::parse(&body).map_err(GatewayError::InvalidBody)?;
    let table = gateway.table();
    let model = table
        .resolve(&request.model)
        .filter(|m| m.config.published && !m.routes().is_empty())
        .ok_or_else(|| GatewayError::ModelNotFound(request.model.clone()))?
        .clone();
    drop(table);
    // X-Route-Pin is an operator's debugging tool: honoured for admin callers only.
    let pin = headers
        .get("x-route-pin")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter(|_| admin::is_admin(&gateway, &headers));
    let caller = caller::identify(
        &headers,
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| *addr),
        &gateway.config.server.trusted_proxies,
    );
    let facts = RequestFacts {
        caller: caller.key.clone(),
        caller_hash: caller.hash,
        prompt_tokens: request.prompt_tokens,
        max_tokens: request.max_tokens,
        stream: request.stream,
        modalities: request.modalities,
    };
    let plan = select::select(&model, &facts, &gateway.routing, pin).await?;
    let strategy_error = plan.strategy_error.clone();
    let result = dispatch::chat_completions(
        gateway.upstreams(),
        &gateway.routing,
        caller.key,
        &model,
        &request,
        plan,
    )
    .await;
    match result {
        Ok(Answer::Complete {
            body,
            attribution,
            prompt_tokens,
            completion_tokens,
        }) => {
            log_request(
                &request.model,
                &attribution,
                started,
                strategy_error.as_deref(),
            );
            let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
            gateway.record(ApiLogRow {
                model: model.config.id.clone(),
                status: 200,
                // Without streaming the whole answer is the first token.
                ttft_ms: Some(latency_ms),
                latency_ms,
                prompt_tokens: Some(clamp_i32(prompt_tokens)),
                completion_tokens: Some(clamp_i32(completion_tokens)),
                ..attributed_row(&attribution)
            });
            Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
        }
        Ok(Answer::Stream {
            events,
            attribution,
            summary,
        }) => {
            log_request(
                &request.model,
                &attribution,
                started,
                strategy_error.as_deref(),
            );
            let row = ApiLogRow {
                model: model.config.id.clone(),
                status: 200,
                ..attributed_row(&attribution)
            };
            let logger = gateway.clone();
            tokio::spawn(async move {
                let Ok(s) = summary.await else { return };
                logger.record(ApiLogRow {
                    ttft_ms: s.ttft_ms,
                    latency_ms: s.latency_ms,
                    prompt_tokens: Some(clamp_i32(s.prompt_tokens)),
                    completion_tokens: Some(clamp_i32(s.completion_tokens)),
                    error: s.error,
                    ..row
                });
            });
            let mut response = Response::new(Body::from_stream(futures::StreamExt::map(
                events,
                Ok::<_, std::convert::Infallible>,
            )));
            let h = response.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            // Tell buffering proxies (nginx) to pass events through as they come.
            h.insert("x-accel-buffering", HeaderValue::from_static("no"));
            Ok(response)
        }
        Err(e) => {
            let err = GatewayError::from(e);
            let status = err.status().as_u16();
            tracing::info!(
                target: "switchyard::access",
                model = %request.model,
                status,
                latency_ms = started.elapsed().as_millis() as u64,
                "all attempts failed"
            );
            let attempts = match &err {
                GatewayError::AllAttemptsFailed(d) => d.attempts.len(),
                _ => 0,
            };
            gateway.record(ApiLogRow {
                model: model.config.id.clone(),
                endpoint_id: None,
                attempts: attempts as i32,
                status: i32::from(status),
                latency_ms: started.elapsed().as_secs_f64() * 1000.0,
                error: Some(err.to_string()),
                ..ApiLogRow::default()
            });
            Err(err)
        }
    }
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
