//! The HTTP edge: routes, request parsing, and turning answers and errors into responses.

mod answered;
pub mod auth;
pub mod budget;
pub mod caller;
pub mod error;
mod http1;
mod inference;
pub mod listener;
pub mod metrics;
pub mod rate_limit;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};

use crate::gateway::Gateway;
use crate::routing::dispatch::Attribution;
use crate::store::api_log::ApiLogRow;

pub use error::GatewayError;

/// Where every route the router knows by path lives. A path under none of them reaches the
/// router's fallback, the inference handler: a new fixed route outside these prefixes must be
/// added here, or [`Edge`] would hand its requests to inference.
const FIXED_ROUTE_PREFIXES: [&str; 5] = ["/admin", "/health", "/metrics", "/routing", "/ui"];

/// Whether `path` is one the router would hand to its fallback ([`inference::handle`]).
fn reaches_inference(path: &str) -> bool {
    !FIXED_ROUTE_PREFIXES
        .iter()
        .any(|prefix| path.starts_with(prefix))
}

/// What a listener serves: a router, and for the gateway's own listener a direct way to the
/// inference handler. A request whose path no fixed route can match goes to
/// [`inference::handle`] inside the same request-id scope and span the router's middleware gives
/// it, without the router: its match, its fallback's and its middleware's boxed futures and
/// service clones cost ~6,000 instructions of a request's ~99,000 (issue #18).
#[derive(Clone)]
pub struct Edge {
    router: Router,
    inference: Option<Arc<Gateway>>,
}

impl Edge {
    /// An edge that answers every request through `router`.
    pub fn routed(router: Router) -> Self {
        Self {
            router,
            inference: None,
        }
    }

    /// The gateway's edge: [`router`], with inference requests taken to their handler directly.
    pub fn gateway(gateway: Arc<Gateway>) -> Self {
        Self {
            router: router(gateway.clone()),
            inference: Some(gateway),
        }
    }

    /// Answers `request` as the router would. The future is made here, before it is awaited, so
    /// that it holds neither the request nor this edge: hyper keeps a box the size of its service's
    /// future for every connection, in flight or idle, and the inference handler's future, inline,
    /// made each idle connection ~3.8 KiB larger. It is boxed instead, as the router's are.
    pub fn answer(
        &self,
        request: axum::extract::Request,
    ) -> impl Future<Output = axum::response::Response> + Send + use<> {
        use futures::FutureExt;
        if let Some(gateway) = &self.inference
            && reaches_inference(request.uri().path())
        {
            let gateway = gateway.clone();
            return futures::future::Either::Left(Box::pin(crate::telemetry::request_id::within(
                request,
                |request| inference::handle(State(gateway), request),
            )));
        }
        let mut router = self.router.clone();
        futures::future::Either::Right(tower_service::Service::call(&mut router, request).map(
            |answered| match answered {
                Ok(response) => response,
                Err(never) => match never {},
            },
        ))
    }
}

/// The gateway's HTTP routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
    // Inference paths are matched by the inbound routes (longest path prefix), so they are the
    // fallback: fixed paths (health, and the admin room's `/admin/*`, `/routing`, `/health/deep`)
    // come first.
    let admin = crate::admin::router().layer(axum::middleware::from_fn_with_state(
        gateway.clone(),
        admin_body_deadline,
    ));
    // Every answer, whatever route gave it, carries the request's id (telemetry::request_id).
    Router::new()
        .route("/health", get(health))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics::scrape_as_admin))
        .merge(admin)
        .fallback(inference::handle)
        .layer(axum::middleware::from_fn(
            crate::telemetry::request_id::middleware,
        ))
        .with_state(gateway)
}

/// The admin API reads its bodies with axum's extractors: this reads them first, within the
/// same size limit and deadline as inference bodies.
async fn admin_body_deadline(
    State(gateway): State<Arc<Gateway>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = request.into_parts();
    match inference::read_body(&gateway, body, None).await {
        Ok(bytes) => {
            next.run(axum::extract::Request::from_parts(parts, bytes.into()))
                .await
        }
        Err(e) => e.into_response(),
    }
}

/// `GET /health`: 200 while serving; 503 from SIGTERM on, so a load balancer stops sending
/// while in-flight requests drain.
async fn health(State(gateway): State<Arc<Gateway>>) -> (StatusCode, Json<serde_json::Value>) {
    let (status, word) = if gateway.drain.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else {
        (StatusCode::OK, "ok")
    };
    (
        status,
        Json(serde_json::json!({
            "status": word,
            "routes_configured": gateway.table().upstreams_configured(),
        })),
    )
}

/// `GET /health/ready`: whether this process can serve inference now, for load balancers: 200
/// `ready` when at least one published model has an upstream it would try (weight above 0,
/// circuit not open), else 503 `not_ready`. Counts only: no endpoint ids, URLs or errors (those
/// are in `/health/deep`, behind the admin token).
async fn ready(State(gateway): State<Arc<Gateway>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let table = gateway.table();
    let health = &gateway.routing.health;
    let now = Instant::now();
    let (mut models, mut models_ready) = (0usize, 0usize);
    let mut endpoints = std::collections::HashSet::new();
    let mut open = std::collections::HashSet::new();
    for model in table.models().filter(|m| m.config.published) {
        models += 1;
        let mut serves = false;
        for upstream in model.upstreams() {
            endpoints.insert(upstream.endpoint_id.as_str());
            if health.admits(&upstream.endpoint_id, now).is_none() {
                open.insert(upstream.endpoint_id.as_str());
            } else if upstream.weight > 0.0 {
                serves = true;
            }
        }
        models_ready += usize::from(serves);
    }
    let is_ready = models_ready > 0;
    let status = if is_ready {
        axum::http::StatusCode::OK
    } else {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({
        "status": if is_ready { "ready" } else { "not_ready" },
        "models": models,
        "models_ready": models_ready,
        "endpoints": endpoints.len(),
        "endpoints_circuit_open": open.len(),
    });
    (status, Json(body)).into_response()
}

/// `GET /v1/models`: every model the caller can reach under its route's groups, with aliases,
/// de-duplicated and sorted; no upstream is asked.
fn list_models(gateway: &Gateway, principal: &auth::Principal) -> Json<serde_json::Value> {
    let table = gateway.table();
    let mut ids: Vec<&str> = table
        .models()
        .filter(|m| m.config.published)
        .filter(|m| {
            m.upstreams()
                .iter()
                .any(|r| principal.groups.contains(&r.group))
        })
        .flat_map(|m| {
            std::iter::once(m.config.id.as_str()).chain(m.config.aliases.iter().map(String::as_str))
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let data: Vec<_> = ids
        .into_iter()
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
fn attributed_row(attribution: &Attribution, base: ApiLogRow) -> ApiLogRow {
    ApiLogRow {
        endpoint_id: Some(attribution.endpoint_id.clone()),
        attempts: attribution.failed_attempts.len() as i32 + 1,
        fell_back: attribution.fell_back,
        failed_attempts: failed_attempts_json(&attribution.failed_attempts),
        ..base
    }
}

/// The parts of a log row that come from the attempts: each of them, what they cost, and the
/// answering attempt's prompt-cache tokens.
fn with_attempts(row: ApiLogRow, attempts: &crate::routing::dispatch::AttemptLog) -> ApiLogRow {
    let summary = attempts.summary();
    ApiLogRow {
        attempt_log: summary.json,
        cost_usd: summary.cost_usd,
        cached_tokens: summary.cached_tokens.map(clamp_i32),
        cache_write_tokens: summary.cache_write_tokens.map(clamp_i32),
        ..row
    }
}

/// The request log's `failed_attempts`: `None` when nothing failed.
fn failed_attempts_json(failed: &[crate::routing::dispatch::FailedAttempt]) -> Option<String> {
    (!failed.is_empty())
        .then(|| serde_json::to_string(failed).ok())
        .flatten()
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

#[cfg(test)]
mod tests {
    use super::reaches_inference;

    #[test]
    fn no_fixed_route_reaches_inference_directly() {
        let mut paths: Vec<String> = crate::admin::api_doc().paths.paths.into_keys().collect();
        // Fixed routes outside the management API's document.
        paths.extend(
            [
                "/health",
                "/health/ready",
                "/health/deep",
                "/metrics",
                "/routing",
                "/ui",
                "/ui/",
                "/ui/app.js",
                "/admin/routing/weights",
                "/admin/routing/providers/{target}/{action}",
                "/admin/strategies/reload",
            ]
            .map(String::from),
        );
        assert!(paths.len() > 30, "{paths:?}");
        for path in &paths {
            assert!(!reaches_inference(path), "{path}");
        }
        for path in [
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/responses",
            "/v1/embeddings",
            "/v1/models",
            "/team-a/v1/chat/completions",
            "/",
        ] {
            assert!(reaches_inference(path), "{path}");
        }
    }
}
