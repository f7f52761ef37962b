//! `switchyard mock-upstream`: a simulated upstream for demos, tests and benchmarks.
//!
//! It speaks the three chat protocols — OpenAI Chat Completions, OpenAI Responses and Anthropic
//! Messages — plus OpenAI embeddings, as JSON and as SSE with each protocol's real framing and
//! usage, after a configurable time to first token and token rate. It fails on command, can answer
//! with a tool call, and counts what it received so tests can assert what reached each upstream.
//! Answers are rendered by the same `protocol` builders and encoders the gateway uses for clients.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::protocol::ir::{self, FinishReason, Output, Role, StreamEvent, ToolChoice, Usage};
use crate::protocol::{Dialect, ids};

mod embeddings;

/// Start-up options (the CLI flags).
#[derive(Debug, Clone)]
pub struct MockOptions {
    pub listen: SocketAddr,
    pub ttft_ms: u64,
    /// 0 means as fast as possible.
    pub tokens_per_s: f64,
    /// The first token goes out at `ttft_ms`, without waiting for its share of `tokens_per_s`: a
    /// stream that starts and then idles (what a held stream looks like to the gateway, which
    /// commits a stream to its client at the first token).
    pub first_token_at_once: bool,
    pub fail_rate: f64,
    pub model: String,
    pub completion_tokens: u32,
    /// Serve only this chat protocol (the others answer 404); all three when `None`.
    pub protocol: Option<Dialect>,
    /// Answer with a call of an offered tool (see [`TOOL_ARGUMENTS`]) instead of text.
    pub tool_call: bool,
}

impl MockOptions {
    /// Options with the CLI defaults, listening on `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            ttft_ms: 0,
            tokens_per_s: 0.0,
            first_token_at_once: false,
            fail_rate: 0.0,
            model: "sim".into(),
            completion_tokens: 16,
            protocol: None,
            tool_call: false,
        }
    }
}

/// The tool a `--tool-call` mock prefers when it is offered.
pub const TOOL_NAME: &str = "get_weather";
/// The arguments of every mock tool call, streamed in two pieces.
pub const TOOL_ARGUMENTS: [&str; 2] = ["{\"city\":", "\"Paris\"}"];

/// Behaviour that tests can change at run time through `POST /_mock/behaviour`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Behaviour {
    /// Answer chat and embedding requests with this status instead of a completion.
    pub fail_status: Option<u16>,
    /// How many requests `fail_status` applies to; unlimited when absent.
    pub fail_count: Option<u64>,
    /// Break streams (drop the connection) after this many SSE events.
    pub break_stream_after_events: Option<u32>,
    pub ttft_ms: Option<u64>,
    pub tokens_per_s: Option<f64>,
    /// `GET /health` answers 503 when true.
    pub unhealthy: bool,
    /// Credentials (the bearer token or `x-api-key`, without `Bearer `) answered with this status,
    /// as a provider rejects one key of a pool.
    pub fail_credentials: BTreeMap<String, u16>,
    /// Sent as `Retry-After` (seconds) with every failure on command.
    pub retry_after_seconds: Option<u64>,
    /// Report this many input tokens (cached ones included, as the IR counts) instead of the
    /// estimate from the request.
    pub input_tokens: Option<u32>,
    /// Report this many of the input tokens as read from a prompt cache.
    pub cached_input_tokens: Option<u32>,
    /// Report this many of the input tokens as written to a prompt cache (Anthropic's wire shape
    /// is the only one that carries them).
    pub cache_creation_input_tokens: Option<u32>,
}

/// What the mock received, for assertions.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// Requests to any chat endpoint this mock serves (Chat Completions, Responses, Messages).
    pub chat_requests: u64,
    pub embedding_requests: u64,
    pub failed_on_command: u64,
    pub streams_completed: u64,
    pub last_body: Option<Value>,
    /// The `Authorization` header, or else the `x-api-key` header, of the last request.
    pub last_authorization: Option<String>,
    /// Which header `last_authorization` came from: `authorization` or `x-api-key`.
    pub last_auth_header: Option<String>,
    pub last_anthropic_version: Option<String>,
    /// Every `Host` header of the last request (more than one is a client's bug).
    pub last_host: Vec<String>,
    /// The `x-request-id` header of the last request.
    pub last_request_id: Option<String>,
    /// Every `x-request-id` received, oldest first (the last 100).
    pub request_ids: Vec<String>,
    /// The W3C `traceparent` of each chat and embedding request (`null` without one), oldest
    /// first (the last 100), and the `tracestate` of the last request.
    pub traceparents: Vec<Option<String>>,
    pub last_tracestate: Option<String>,
    pub last_path: Option<String>,
    /// Requests per path, including ones answered 404 because of `--protocol`.
    pub paths: BTreeMap<String, u64>,
    /// Chat and embedding requests per credential (without `Bearer `; `none` without one).
    pub requests_by_credential: BTreeMap<String, u64>,
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
    // SSE frames are small separate writes: without TCP_NODELAY each one after the first waits
    // for the client's delayed ACK (~40 ms), which made streams from the mock crawl.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
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
    let mut router = Router::new();
    for dialect in Dialect::ALL {
        let handler = post(
            move |state: State<Arc<MockState>>, uri: Uri, headers: HeaderMap, body: Bytes| {
                chat(state, uri, headers, body, dialect)
            },
        );
        router = router
            .route(&format!("/v1{}", dialect.path()), handler.clone())
            .route(dialect.path(), handler);
    }
    router
        .route("/v1/embeddings", post(embeddings::handle))
        .route("/embeddings", post(embeddings::handle))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/_mock/behaviour", post(set_behaviour))
        .route("/_mock/stats", get(stats))
        .route("/_mock/reset", post(reset))
        // axum's default of 2 MB would refuse the large bodies a gateway forwards (its own limit
        // is 32 MiB, and a translated body can be larger than the client's).
        .layer(axum::extract::DefaultBodyLimit::max(256 << 20))
        .with_state(state)
}

async fn health(State(state): State<Arc<MockState>>) -> StatusCode {
    if state.behaviour.lock().unhealthy {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn models(State(state): State<Arc<MockState>>) -> Json<Value> {
    Json(json!({
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

async fn stats(State(state): State<Arc<MockState>>) -> Json<Value> {
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

/// An error in the shape of the protocol the request spoke.
fn error_response(dialect: Dialect, status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(dialect.error_body(status.as_u16(), message))).into_response()
}

/// Which request kind a call counts as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Embeddings,
}

/// Records the request and applies the failure behaviours; `Err` is the status and message of the
/// error to answer instead.
fn admit(
    state: &MockState,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    kind: Kind,
    dialect: Dialect,
) -> Result<Behaviour, (u16, String)> {
    let mut stats = state.stats.lock();
    let path = uri.path().to_owned();
    *stats.paths.entry(path.clone()).or_default() += 1;
    stats.last_path = Some(path);
    if kind == Kind::Chat
        && let Some(only) = state.options.protocol
        && only != dialect
    {
        return Err((
            404,
            format!(
                "this mock speaks only the {only} protocol (POST /v1{})",
                only.path()
            ),
        ));
    }
    let request: Value =
        serde_json::from_slice(body).map_err(|e| (400, format!("invalid JSON: {e}")))?;
    match kind {
        Kind::Chat => stats.chat_requests += 1,
        Kind::Embeddings => stats.embedding_requests += 1,
    }
    stats.last_body = Some(request);
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (auth, auth_header) = match (header("authorization"), header("x-api-key")) {
        (Some(a), _) => (Some(a), Some("authorization")),
        (None, Some(k)) => (Some(k), Some("x-api-key")),
        (None, None) => (None, None),
    };
    let credential = auth
        .as_deref()
        .map(|a| a.strip_prefix("Bearer ").unwrap_or(a).to_owned())
        .unwrap_or_else(|| "none".to_owned());
    *stats
        .requests_by_credential
        .entry(credential.clone())
        .or_default() += 1;
    stats.last_authorization = auth;
    stats.last_auth_header = auth_header.map(str::to_owned);
    stats.last_anthropic_version = header("anthropic-version");
    stats.last_host = headers
        .get_all(axum::http::header::HOST)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    stats.last_request_id = header("x-request-id");
    if let Some(id) = stats.last_request_id.clone() {
        if stats.request_ids.len() >= 100 {
            stats.request_ids.remove(0);
        }
        stats.request_ids.push(id);
    }
    if stats.traceparents.len() >= 100 {
        stats.traceparents.remove(0);
    }
    stats.traceparents.push(header("traceparent"));
    stats.last_tracestate = header("tracestate");
    let mut behaviour = state.behaviour.lock();
    if let Some(&status) = behaviour.fail_credentials.get(&credential) {
        stats.failed_on_command += 1;
        return Err((status, "this credential is rejected on command".to_owned()));
    }
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
            return Err((status, "failing on command".to_owned()));
        }
    }
    let behaviour = behaviour.clone();
    drop(stats);
    if state.options.fail_rate > 0.0 && rand::random::<f64>() < state.options.fail_rate {
        return Err((500, "simulated random failure".to_owned()));
    }
    Ok(behaviour)
}

/// The pacing of one answer.
struct Pace {
    ttft: Duration,
    per_token: Duration,
    /// `MockOptions::first_token_at_once`.
    first_at_once: bool,
}

impl Pace {
    fn new(state: &MockState, behaviour: &Behaviour) -> Self {
        let tps = behaviour.tokens_per_s.unwrap_or(state.options.tokens_per_s);
        Self {
            ttft: Duration::from_millis(behaviour.ttft_ms.unwrap_or(state.options.ttft_ms)),
            per_token: if tps > 0.0 {
                Duration::from_secs_f64(1.0 / tps)
            } else {
                Duration::ZERO
            },
            first_at_once: state.options.first_token_at_once,
        }
    }
}

/// What the mock will answer, before it is rendered in a protocol.
struct Answer {
    id: String,
    model: String,
    /// Text tokens, or the pieces of a tool call's arguments.
    pieces: Vec<String>,
    tool_call: Option<(String, String)>,
    finish: FinishReason,
    usage: Usage,
}

impl Answer {
    fn plan(state: &MockState, request: &ir::Request) -> Self {
        let options = &state.options;
        let reported = {
            let b = state.behaviour.lock();
            (
                b.input_tokens,
                b.cached_input_tokens,
                b.cache_creation_input_tokens,
            )
        };
        let usage = |output_tokens: usize| Usage {
            input_tokens: reported
                .0
                .unwrap_or_else(|| request.prompt_token_estimate()),
            output_tokens: u32::try_from(output_tokens).unwrap_or(u32::MAX),
            cached_input_tokens: reported.1.unwrap_or(0),
            cache_creation_input_tokens: reported.2.unwrap_or(0),
            ..Usage::default()
        };
        if let Some(name) = tool_to_call(options, request) {
            let pieces: Vec<String> = TOOL_ARGUMENTS.iter().map(|s| (*s).to_owned()).collect();
            return Answer {
                id: ids::random("mock"),
                model: request.model.clone(),
                usage: usage(pieces.len()),
                pieces,
                tool_call: Some((ids::random("call_mock"), name)),
                finish: FinishReason::ToolCalls,
            };
        }
        let n = request
            .max_output_tokens
            .unwrap_or(options.completion_tokens)
            .min(options.completion_tokens)
            .max(1);
        let pieces = reply_tokens(&options.model, state.port, n);
        let finish = if request
            .max_output_tokens
            .is_some_and(|m| m < options.completion_tokens)
        {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        Answer {
            id: ids::random("mock"),
            model: request.model.clone(),
            usage: usage(pieces.len()),
            pieces,
            tool_call: None,
            finish,
        }
    }

    fn response(&self) -> ir::Response {
        let output = match &self.tool_call {
            Some((id, name)) => vec![Output::ToolCall(ir::ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: self.pieces.concat(),
            })],
            None => vec![Output::Text(self.pieces.concat())],
        };
        ir::Response {
            id: self.id.clone(),
            model: self.model.clone(),
            created: Some(crate::clock::unix_secs()),
            output,
            finish: self.finish.clone(),
            stop_sequence: None,
            usage: self.usage,
        }
    }

    /// The answer as IR stream events, each with the pause before it.
    fn events(&self, pace: &Pace) -> Vec<(StreamEvent, Duration)> {
        let mut events = vec![(
            StreamEvent::Start {
                id: self.id.clone(),
                model: self.model.clone(),
            },
            pace.ttft,
        )];
        if let Some((id, name)) = &self.tool_call {
            events.push((
                StreamEvent::ToolCallStart {
                    index: 0,
                    id: id.clone(),
                    name: name.clone(),
                },
                Duration::ZERO,
            ));
        }
        for (i, piece) in self.pieces.iter().enumerate() {
            let pause = if i == 0 && pace.first_at_once {
                Duration::ZERO
            } else {
                pace.per_token
            };
            let event = match self.tool_call {
                Some(_) => StreamEvent::ToolCallDelta {
                    index: 0,
                    arguments: piece.clone(),
                },
                None => StreamEvent::TextDelta(piece.clone()),
            };
            events.push((event, pause));
        }
        events.push((
            StreamEvent::Finish {
                reason: self.finish.clone(),
                stop_sequence: None,
            },
            Duration::ZERO,
        ));
        events.push((StreamEvent::Usage(self.usage), Duration::ZERO));
        events.push((StreamEvent::Done, Duration::ZERO));
        events
    }
}

/// The tool a `--tool-call` mock calls: the one the client forces, else `get_weather` if offered,
/// else the first offered. None when no tool is offered, tools are switched off, or the last
/// message already carries tool results (so an agent loop ends with text).
fn tool_to_call(options: &MockOptions, request: &ir::Request) -> Option<String> {
    if !options.tool_call || !request.has_tools() {
        return None;
    }
    if request
        .messages
        .last()
        .is_some_and(|m| m.role == Role::Tool)
    {
        return None;
    }
    match &request.tool_choice {
        Some(ToolChoice::None) => None,
        Some(ToolChoice::Function(name)) => Some(name.clone()),
        _ => request
            .tools
            .iter()
            .find(|t| t.name == TOOL_NAME)
            .or_else(|| request.tools.first())
            .map(|t| t.name.clone()),
    }
}

async fn chat(
    State(state): State<Arc<MockState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    dialect: Dialect,
) -> Response {
    let behaviour = match admit(&state, &uri, &headers, &body, Kind::Chat, dialect) {
        Ok(b) => b,
        Err((status, message)) => {
            let mut response = error_response(dialect, status, &message);
            if let Some(seconds) = state.behaviour.lock().retry_after_seconds {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, seconds.into());
            }
            return response;
        }
    };
    let request = match dialect.parse_request(&body) {
        Ok(r) => r,
        Err(reason) => return error_response(dialect, 400, &reason.to_string()),
    };
    let pace = Pace::new(&state, &behaviour);
    let answer = Answer::plan(&state, &request);

    if !request.stream {
        let tokens = u32::try_from(answer.pieces.len()).unwrap_or(u32::MAX);
        let pause = pace.ttft + pace.per_token * tokens;
        // A zero sleep still waits for the timer's next tick (~1 ms): every answer of a mock
        // without delays took a millisecond, which hid what a proxy adds at low concurrency.
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let body = dialect.build_response(&answer.response(), &answer.model);
        return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    }

    // The encoder mirrors the request: Chat usage only when asked, Anthropic's input estimate.
    let mut encoder = dialect.encoder_for(&answer.model, &request);
    let mut frames: Vec<(Bytes, Duration)> = Vec::new();
    for (event, pause) in answer.events(&pace) {
        for (i, frame) in encoder.encode(&event).into_iter().enumerate() {
            frames.push((frame, if i == 0 { pause } else { Duration::ZERO }));
        }
    }
    if behaviour.break_stream_after_events.is_none() {
        frames = coalesce(frames);
    }
    stream_response(
        state,
        frames,
        behaviour.break_stream_after_events,
        pace.per_token,
    )
}

/// Joins each frame sent without a pause to the one before it, as a server writing into a buffered
/// socket would: one chunk per burst rather than per frame (a write each). Streams broken on
/// command keep their frames apart, since they count them.
fn coalesce(frames: Vec<(Bytes, Duration)>) -> Vec<(Bytes, Duration)> {
    let mut out: Vec<(Vec<u8>, Duration)> = Vec::new();
    for (frame, pause) in frames {
        match out.last_mut() {
            Some((joined, _)) if pause.is_zero() => joined.extend_from_slice(&frame),
            _ => out.push((frame.to_vec(), pause)),
        }
    }
    out.into_iter()
        .map(|(joined, pause)| (Bytes::from(joined), pause))
        .collect()
}

/// Sends `frames` with their pauses, breaking the connection after `break_after` frames.
fn stream_response(
    state: Arc<MockState>,
    frames: Vec<(Bytes, Duration)>,
    break_after: Option<u32>,
    per_token: Duration,
) -> Response {
    let frames = Arc::new(frames);
    let body = futures::stream::unfold(0usize, move |i| {
        let frames = frames.clone();
        let state = state.clone();
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
            let Some((frame, pause)) = frames.get(i) else {
                state.completed.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            if !pause.is_zero() {
                tokio::time::sleep(*pause).await;
            }
            Some((Ok::<_, std::io::Error>(frame.clone()), i + 1))
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| error_response(Dialect::OpenAiChat, 500, "cannot build stream"))
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

#[cfg(test)]
mod tests;
