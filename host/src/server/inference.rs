//! The dispatching endpoints: Chat Completions, Responses and Anthropic Messages (one pipeline,
//! through the IR), embeddings, and Anthropic's token counting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::config::Capability;
use crate::gateway::Gateway;
use crate::protocol::{self, Dialect};
use crate::routing::dispatch::{self, Answer, Inbound};
use crate::routing::select::{self, RequestFacts};
use crate::routing::table::ModelEntry;
use crate::store::api_log::ApiLogRow;

use super::{GatewayError, admin, attributed_row, caller, clamp_i32, log_request};

pub async fn chat_completions(
    State(gateway): State<Arc<Gateway>>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat(gateway, Dialect::OpenAiChat, extensions, headers, body).await
}

pub async fn responses(
    State(gateway): State<Arc<Gateway>>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat(gateway, Dialect::OpenAiResponses, extensions, headers, body).await
}

pub async fn messages(
    State(gateway): State<Arc<Gateway>>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat(
        gateway,
        Dialect::AnthropicMessages,
        extensions,
        headers,
        body,
    )
    .await
}

fn capability(dialect: Dialect) -> Capability {
    match dialect {
        Dialect::OpenAiChat => Capability::ChatCompletions,
        Dialect::OpenAiResponses => Capability::Responses,
        Dialect::AnthropicMessages => Capability::Messages,
    }
}

/// The body as a JSON object, kept for upstreams that get it (nearly) verbatim.
fn json_object(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, GatewayError> {
    match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        _ => Err(GatewayError::InvalidBody(
            "the body must be a JSON object".into(),
        )),
    }
}

/// A published model with routes, by id or alias.
fn published_model(gateway: &Gateway, name: &str) -> Result<Arc<ModelEntry>, GatewayError> {
    gateway
        .table()
        .resolve(name)
        .filter(|m| m.config.published && !m.routes().is_empty())
        .cloned()
        .ok_or_else(|| GatewayError::ModelNotFound(name.to_owned()))
}

/// Who is calling and whether an operator pinned a route.
fn caller_and_pin<'h>(
    gateway: &Gateway,
    extensions: &axum::http::Extensions,
    headers: &'h HeaderMap,
) -> (caller::Caller, Option<&'h str>) {
    // X-Route-Pin is an operator's debugging tool: honoured for admin callers only.
    let pin = headers
        .get("x-route-pin")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter(|_| admin::is_admin(gateway, headers));
    let caller = caller::identify(
        headers,
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| *addr),
        &gateway.config.server.trusted_proxies,
    );
    (caller, pin)
}

async fn chat(
    gateway: Arc<Gateway>,
    dialect: Dialect,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match serve_chat(&gateway, dialect, &extensions, &headers, &body).await {
        Ok(response) => response,
        Err(e) => e.response_in(dialect),
    }
}

async fn serve_chat(
    gateway: &Arc<Gateway>,
    dialect: Dialect,
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let started = Instant::now();
    let request = dialect
        .parse_request(body)
        .map_err(GatewayError::InvalidBody)?;
    // The parsed body is kept for upstreams of the same dialect, which get it nearly verbatim.
    let raw = json_object(body)?;
    let model = published_model(gateway, &request.model)?;
    let (caller, pin) = caller_and_pin(gateway, extensions, headers);
    let inbound = Inbound {
        dialect,
        prompt_tokens: request.prompt_token_estimate(),
        request,
        body: raw,
    };
    let facts = RequestFacts {
        caller: caller.key.clone(),
        caller_hash: caller.hash,
        prompt_tokens: inbound.prompt_tokens,
        max_tokens: inbound.request.max_output_tokens,
        stream: inbound.request.stream,
        modalities: inbound.request.modalities(),
        call: capability(dialect),
    };
    let plan = select::select(&model, &facts, &gateway.routing, pin).await?;
    let strategy_error = plan.strategy_error.clone();
    let result = dispatch::chat(
        gateway.upstreams(),
        &gateway.routing,
        caller.key,
        &model,
        &inbound,
        plan,
    )
    .await;
    let public = inbound.request.model.as_str();
    match result {
        Ok(Answer::Complete {
            body,
            attribution,
            prompt_tokens,
            completion_tokens,
        }) => {
            log_request(public, &attribution, started, strategy_error.as_deref());
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
            log_request(public, &attribution, started, strategy_error.as_deref());
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
            record_failure(gateway, &model, &err, started);
            Err(err)
        }
    }
}

fn record_failure(gateway: &Gateway, model: &ModelEntry, err: &GatewayError, started: Instant) {
    let status = err.status().as_u16();
    tracing::info!(
        target: "switchyard::access",
        model = %model.config.id,
        status,
        latency_ms = started.elapsed().as_millis() as u64,
        "all attempts failed"
    );
    let attempts = match err {
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
}

/// `POST /v1/embeddings`: OpenAI-compatible routes only, forwarded without translation.
pub async fn embeddings(
    State(gateway): State<Arc<Gateway>>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let served = async {
        let started = Instant::now();
        let (model_name, chars) =
            protocol::parse_embeddings_request(&body).map_err(GatewayError::InvalidBody)?;
        let raw = json_object(&body)?;
        let model = published_model(&gateway, &model_name)?;
        let (caller, pin) = caller_and_pin(&gateway, &extensions, &headers);
        let facts = RequestFacts {
            caller: caller.key.clone(),
            caller_hash: caller.hash,
            prompt_tokens: u32::try_from(chars / 4).unwrap_or(u32::MAX),
            call: Capability::Embeddings,
            ..RequestFacts::default()
        };
        let plan = select::select(&model, &facts, &gateway.routing, pin).await?;
        match dispatch::embeddings(gateway.upstreams(), &gateway.routing, &model, &raw, plan).await
        {
            Ok((body, attribution)) => {
                log_request(&model_name, &attribution, started, None);
                gateway.record(ApiLogRow {
                    model: model.config.id.clone(),
                    status: 200,
                    latency_ms: started.elapsed().as_secs_f64() * 1000.0,
                    ..attributed_row(&attribution)
                });
                Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
            }
            Err(e) => {
                let err = GatewayError::from(e);
                record_failure(&gateway, &model, &err, started);
                Err(err)
            }
        }
    };
    match served.await {
        Ok(response) => response,
        Err(e) => e.response_in(Dialect::OpenAiChat),
    }
}

/// `POST /v1/messages/count_tokens`, answered from the gateway's estimator (characters / 4, a flat
/// 85 per image), with nothing sent upstream.
pub async fn count_tokens(State(gateway): State<Arc<Gateway>>, body: Bytes) -> Response {
    let dialect = Dialect::AnthropicMessages;
    // count_tokens bodies carry no max_tokens; the parser wants one.
    let mut value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return GatewayError::InvalidBody(format!("not valid JSON: {e}")).response_in(dialect);
        }
    };
    if let Some(map) = value.as_object_mut() {
        map.entry("max_tokens").or_insert(serde_json::json!(1));
    }
    let bytes = serde_json::to_vec(&value).unwrap_or_default();
    let request = match dialect.parse_request(&bytes) {
        Ok(r) => r,
        Err(e) => return GatewayError::InvalidBody(e).response_in(dialect),
    };
    if let Err(e) = published_model(&gateway, &request.model) {
        return e.response_in(dialect);
    }
    axum::Json(serde_json::json!({ "input_tokens": request.prompt_token_estimate() }))
        .into_response()
}
