//! `switchyard mock-upstream`: a simulated OpenAI-compatible upstream for demos, tests and benchmarks.
//!
//! It answers Chat Completions (JSON and SSE with realistic framing and usage) after a configurable
//! time to first token and token rate, fails on command, and counts what it received so tests can
//! assert what reached each upstream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Start-up options (the CLI flags).
#[derive(Debug, Clone)]
pub struct MockOptions {
    pub listen: SocketAddr,
    pub ttft_ms: u64,
    /// 0 means as fast as possible.
    pub tokens_per_s: f64,
    pub fail_rate: f64,
    pub model: String,
    pub completion_tokens: u32,
}

/// Behaviour that tests can change at run time through `POST /_mock/behaviour`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Behaviour {
    /// Answer chat requests with this status instead of a completion.
    pub fail_status: Option<u16>,
    /// How many requests `fail_status` applies to; unlimited when absent.
    pub fail_count: Option<u64>,
    /// Break streams (drop the connection) after this many events.
    pub break_stream_after_events: Option<u32>,
    pub ttft_ms: Option<u64>,
    pub tokens_per_s: Option<f64>,
    /// `GET /health` answers 503 when false.
    pub unhealthy: bool,
}

/// What the mock received, for assertions.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    pub chat_requests: u64,
    pub failed_on_command: u64,
    pub streams_completed: u64,
    pub last_body: Option<serde_json::Value>,
    pub last_authorization: Option<String>,
}

struct MockState {
    options: MockOptions,
    behaviour: Mutex<Behaviour>,
    stats: Mutex<Stats>,
    completed: AtomicU64,
    port: u16,
}

/// Binds and serves until the process ends. Prints `listening on http://ADDR` as its first line so a
/// parent process can learn the port when it asked for port 0.
pub async fn run(options: MockOptions) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    let addr = listener.local_addr()?;
    announce(addr)?;
    let state = Arc::new(MockState {
        behaviour: Mutex::new(Behaviour::default()),
        stats: Mutex::new(Stats::default()),
        completed: AtomicU64::new(0),
        port: addr.port(),
        options,
    });
    axum::serve(listener, router(state)).await
}

fn announce(addr: SocketAddr) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on http://{addr}")?;
    out.flush()
}

fn router(state: Arc<MockState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/_mock/behaviour", post(set_behaviour))
        .route("/_mock/stats", get(stats))
        .route("/_mock/reset", post(reset))
        .with_state(state)
}

async fn health(State(state): State<Arc<MockState>>) -> StatusCode {
    if state.behaviour.lock().unhealthy {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn models(State(state): State<Arc<MockState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "object": "list",
        "data": [{ "id": state.options.model, "object": "model", "created": 0, "owned_by": "mock" }]
    }))
}

async fn set_behaviour(
    State(state): State<Arc<MockState>>,
    Json(behaviour): Json<Behaviour>,
) -> StatusCode {
    *state.behaviour.lock() = behaviour;
    StatusCode::NO_CONTENT
}

async fn stats(State(state): State<Arc<MockState>>) -> Json<serde_json::Value> {
    let mut value = serde_json::to_value(&*state.stats.lock()).unwrap_or_default();
    value["streams_completed"] = state.completed.load(Ordering::Relaxed).into();
    value["port"] = state.port.into();
    Json(value)
}

async fn reset(State(state): State<Arc<MockState>>) -> StatusCode {
    *state.stats.lock() = Stats::default();
    state.completed.store(0, Ordering::Relaxed);
    *state.behaviour.lock() = Behaviour::default();
    StatusCode::NO_CONTENT
}

fn error_response(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        Json(serde_json::json!({
            "error": { "message": message, "type": "mock_error", "param": null, "code": status.as_u16() }
        })),
    )
        .into_response()
}

async fn chat(
    State(state): State<Arc<MockState>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error_response(400, &format!("invalid JSON: {e}")),
    };
    let behaviour = {
        let mut stats = state.stats.lock();
        stats.chat_requests += 1;
        stats.last_body = Some(request.clone());
        stats.last_authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut behaviour = state.behaviour.lock();
        if let Some(status) = behaviour.fail_status {
            let applies = match behaviour.fail_count.as_mut() {
                None => true,
                Some(0) => false,
                Some(n) => {
                    *n -= 1;
                    true
                }
            };
            if applies {
                stats.failed_on_command += 1;
                return error_response(status, "failing on command");
            }
        }
        behaviour.clone()
    };
    if state.options.fail_rate > 0.0 && rand::random::<f64>() < state.options.fail_rate {
        return error_response(500, "simulated random failure");
    }
    if request.get("messages").and_then(|m| m.as_array()).is_none() {
        return error_response(400, "`messages` is required");
    }

    let ttft = Duration::from_millis(behaviour.ttft_ms.unwrap_or(state.options.ttft_ms));
    let tps = behaviour.tokens_per_s.unwrap_or(state.options.tokens_per_s);
    let per_token = if tps > 0.0 {
        Duration::from_secs_f64(1.0 / tps)
    } else {
        Duration::ZERO
    };
    let max_tokens = request
        .get("max_completion_tokens")
        .or_else(|| request.get("max_tokens"))
        .and_then(|v| v.as_u64())
        .map(|n| n.min(u64::from(u32::MAX)) as u32);
    let n_tokens = max_tokens
        .unwrap_or(state.options.completion_tokens)
        .min(state.options.completion_tokens)
        .max(1);
    let tokens = reply_tokens(&state.options.model, state.port, n_tokens);
    let prompt_tokens = estimate_prompt_tokens(&request);
    let model = request
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or(&state.options.model)
        .to_owned();
    let finish_reason = if max_tokens.is_some_and(|m| m < state.options.completion_tokens) {
        "length"
    } else {
        "stop"
    };
    let id = format!("chatcmpl-mock{}", rand::random::<u32>());
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let usage = serde_json::json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": tokens.len(),
        "total_tokens": prompt_tokens + tokens.len() as u64,
    });

    let stream = request.get("stream").and_then(|s| s.as_bool()) == Some(true);
    if !stream {
        tokio::time::sleep(ttft + per_token * (tokens.len() as u32)).await;
        return Json(serde_json::json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": tokens.concat() },
                "finish_reason": finish_reason,
            }],
            "usage": usage,
        }))
        .into_response();
    }

    let include_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(|v| v.as_bool())
        == Some(true);
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        let c = serde_json::json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        });
        format!("data: {c}\n\n")
    };
    let mut events = Vec::with_capacity(tokens.len() + 4);
    events.push(chunk(
        serde_json::json!({ "role": "assistant", "content": "" }),
        None,
    ));
    for t in &tokens {
        events.push(chunk(serde_json::json!({ "content": t }), None));
    }
    events.push(chunk(serde_json::json!({}), Some(finish_reason)));
    if include_usage {
        let c = serde_json::json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage,
        });
        events.push(format!("data: {c}\n\n"));
    }
    events.push("data: [DONE]\n\n".to_owned());

    let break_after = behaviour.break_stream_after_events;
    let completed = state.clone();
    let body = futures::stream::unfold(0usize, move |i| {
        let events = events.clone();
        let completed = completed.clone();
        async move {
            if i == usize::MAX {
                return None;
            }
            if break_after.is_some_and(|n| i >= n as usize) {
                // Dropping the connection mid-stream, as a crashed replica would. The pause lets the
                // events already sent reach the client first, as they would in real time.
                if i > 0 {
                    tokio::time::sleep(per_token.max(Duration::from_millis(10))).await;
                }
                return Some((
                    Err(std::io::Error::other("mock stream broken on command")),
                    usize::MAX,
                ));
            }
            if i >= events.len() {
                completed.completed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            // The first event waits for "prefill"; content events for the token rate.
            if i == 0 {
                tokio::time::sleep(ttft).await;
            } else if i < events.len() - 2 && !per_token.is_zero() {
                tokio::time::sleep(per_token).await;
            }
            Some((Ok(Bytes::from(events[i].clone())), i + 1))
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| error_response(500, "cannot build stream"))
}

/// The answer text, one entry per token, naming the model and port so tests can tell who answered.
fn reply_tokens(model: &str, port: u16, n: u32) -> Vec<String> {
    let mut tokens = vec![
        "Hello".to_owned(),
        " from".to_owned(),
        format!(" {model}"),
        format!(" on port {port}."),
    ];
    let filler = [
        " The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog.",
    ];
    let mut i = 0;
    while tokens.len() < n as usize {
        tokens.push(filler[i % filler.len()].to_owned());
        i += 1;
    }
    tokens.truncate(n as usize);
    tokens
}

fn estimate_prompt_tokens(request: &serde_json::Value) -> u64 {
    let chars: usize = request
        .get("messages")
        .and_then(|m| m.as_array())
        .map(|messages| {
            messages
                .iter()
                .map(|m| match m.get("content") {
                    Some(serde_json::Value::String(s)) => s.chars().count(),
                    Some(serde_json::Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                        .map(|t| t.chars().count())
                        .sum(),
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0);
    (chars / 4) as u64
}
