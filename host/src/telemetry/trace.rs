//! OpenTelemetry traces: one span per inference request and one child span per attempt against an
//! upstream (fallbacks and hedges included), with the GenAI semantic conventions' attributes and
//! Switchyard's own (`switchyard.*`), exported over OTLP/HTTP (protobuf) by a batch processor.
//! The W3C trace context (`traceparent`, `tracestate`) a client sends becomes the request span's
//! parent, and every attempt sends its own context upstream.
//!
//! Off unless an endpoint is configured (`telemetry.otlp_endpoint`, `OTEL_EXPORTER_OTLP_ENDPOINT`).
//! Off, no span is created and no attribute is built: [`RequestTrace::start`] looks for a client
//! `traceparent` (one header lookup) and, when there is a valid one, passes it on to the upstreams
//! unchanged; without one nothing is sent upstream.
//!
//! The spans are `tracing` spans with the target [`TARGET`], turned into OpenTelemetry spans by
//! `tracing-opentelemetry`; only that target reaches the OpenTelemetry layer, so log events and
//! the log-only `request` span of every HTTP request never become span data. They are never
//! entered: parents are explicit, and the context sent upstream is taken from the attempt's span
//! itself, so what a log line is "in" does not change when tracing is turned on. Spans carry no
//! prompt, answer or upstream error text: only ids, names, numbers and closed vocabularies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Status, TraceContextExt, TracerProvider as _};
use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::metrics::{self, Operation};
use crate::config::TelemetryConfig;

/// The `tracing` target of the spans that are exported; nothing else reaches the exporter.
pub const TARGET: &str = "switchyard::trace";

/// Spans waiting for export at most; more are dropped (and counted) rather than held, so a slow
/// or unreachable collector costs a bounded amount of memory and never delays a request.
pub const QUEUE_SPANS: usize = 2048;

/// One export (a batch of spans, its retries included) gives up after this long.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes of a collector's answer read at most (it is a small protobuf message).
const RESPONSE_LIMIT: usize = 64 << 10;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (set once, at startup, by [`Tracing::install`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The OTLP exporter refused its configuration.
    #[error("the OTLP trace exporter for {endpoint}: {message}")]
    Exporter { endpoint: String, message: String },
    /// Its HTTP client could not be built.
    #[error("the OTLP trace exporter's HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The installed pipeline: the tracer provider whose batch processor exports the spans.
pub struct Tracing {
    provider: SdkTracerProvider,
    endpoint: String,
}

impl Tracing {
    /// Builds the exporter when `config` names an endpoint (`None` otherwise: tracing stays off).
    /// Exports run on `runtime` (the gateway's), driven by the batch processor's own thread.
    pub fn install(
        config: &TelemetryConfig,
        runtime: tokio::runtime::Handle,
    ) -> Result<Option<Tracing>, TraceError> {
        let Some(endpoint) = config.otlp_traces_endpoint.clone() else {
            return Ok(None);
        };
        let client = ExportClient {
            http: reqwest::Client::builder()
                .connect_timeout(EXPORT_TIMEOUT)
                .timeout(EXPORT_TIMEOUT)
                .build()?,
            runtime,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(endpoint.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TraceError::Exporter {
                endpoint: endpoint.clone(),
                message: e.to_string(),
            })?;
        let backlog = Arc::new(AtomicUsize::new(0));
        let exporter = CountingExporter {
            inner: exporter,
            backlog: backlog.clone(),
            failing: AtomicBool::new(false),
            endpoint: endpoint.clone(),
        };
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(QUEUE_SPANS)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BoundedQueue {
                inner: batch,
                backlog,
            })
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                    .build(),
            )
            .build();
        ENABLED.store(true, Ordering::Relaxed);
        Ok(Some(Tracing { provider, endpoint }))
    }

    /// Where the spans go (`…/v1/traces`), for the startup log.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The layer that turns this module's spans (and only them) into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("switchyard"))
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(TARGET, tracing::Level::TRACE),
            )
    }

    /// Exports what is still queued, waiting at most `within`; called once, at exit.
    pub async fn shutdown(self, within: Duration) {
        ENABLED.store(false, Ordering::Relaxed);
        let provider = self.provider;
        // Blocking: the processor's thread exports on this runtime meanwhile.
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(within)).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("exporting the last spans failed: {e}"),
            Err(e) => tracing::warn!("exporting the last spans failed: {e}"),
        }
    }
}

/// `traceparent` and `tracestate` for one upstream request.
#[derive(Debug, Clone)]
pub struct TraceHeaders {
    traceparent: HeaderValue,
    tracestate: Option<HeaderValue>,
}

impl TraceHeaders {
    /// The headers to add to the upstream request.
    pub fn iter(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        std::iter::once((TRACEPARENT, self.traceparent.clone()))
            .chain(self.tracestate.iter().map(|v| (TRACESTATE, v.clone())))
    }

    /// The W3C form of `cx`'s span, when it has a valid one.
    fn of(cx: &opentelemetry::Context) -> Option<TraceHeaders> {
        let mut headers = HeaderMap::new();
        TraceContextPropagator::new()
            .inject_context(cx, &mut opentelemetry_http::HeaderInjector(&mut headers));
        Some(TraceHeaders {
            traceparent: headers.remove(TRACEPARENT)?,
            tracestate: headers.remove(TRACESTATE).filter(|v| !v.is_empty()),
        })
    }
}

/// The client's trace context, when its `traceparent` is valid.
fn client_context(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    let cx = TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    cx.span().span_context().is_valid().then_some(cx)
}

/// One inference request's trace: its span when tracing is on; when it is off, only the client's
/// trace context (if it sent one), which every attempt passes on unchanged. Cheap to clone.
#[derive(Clone)]
pub struct RequestTrace {
    /// `Span::none()` when tracing is off.
    span: tracing::Span,
    operation: Option<Operation>,
    /// Tracing off: what the client sent, for the upstreams.
    client: Option<TraceHeaders>,
}

impl Default for RequestTrace {
    /// No span and nothing to pass on: an untraced request.
    fn default() -> Self {
        RequestTrace {
            span: tracing::Span::none(),
            operation: None,
            client: None,
        }
    }
}

/// Who served a request, for its span.
pub struct Served<'a> {
    pub endpoint: &'a str,
    /// Attempts made, the serving one included.
    pub attempts: usize,
}

/// What an upstream attempt is, for its span.
pub struct AttemptFacts<'a> {
    pub endpoint: &'a str,
    /// The upstream's kind (`openai_compat`, `openai_responses`, `anthropic`).
    pub kind: &'a str,
    /// The model name sent to the upstream.
    pub model: &'a str,
    pub base_url: &'a str,
    /// A hedge's backup, sent while the primary was still running.
    pub hedge: bool,
}

impl RequestTrace {
    /// The trace of a request that has just arrived with `headers`.
    pub fn start(headers: &HeaderMap, operation: Operation) -> RequestTrace {
        let has_parent = headers.contains_key(TRACEPARENT);
        if !enabled() {
            if !has_parent {
                return RequestTrace::default();
            }
            return RequestTrace {
                client: client_context(headers).and_then(|cx| TraceHeaders::of(&cx)),
                ..RequestTrace::default()
            };
        }
        let span = tracing::info_span!(
            target: TARGET,
            parent: None,
            "request",
            otel.name = operation.as_str(),
            otel.kind = "server",
        );
        if let Some(cx) = has_parent.then(|| client_context(headers)).flatten() {
            let _ = span.set_parent(cx);
        }
        span.set_attribute("gen_ai.operation.name", operation.as_str());
        if let Some(id) = super::request_id::current() {
            span.set_attribute("switchyard.request_id", id.to_string());
        }
        RequestTrace {
            span,
            operation: Some(operation),
            client: None,
        }
    }

    fn on(&self) -> bool {
        !self.span.is_none()
    }

    /// The model the client asked for: names the span (`chat <model>`, as the GenAI conventions
    /// name it) and records the trace and span ids in the request's scope, so that every JSON
    /// log line of the request can be joined with its trace.
    pub fn model(&self, model: &str) {
        if !self.on() {
            return;
        }
        let operation = self.operation.map_or("chat", Operation::as_str);
        self.span
            .record("otel.name", format!("{operation} {model}").as_str());
        self.span
            .set_attribute("gen_ai.request.model", model.to_owned());
        // Starts the span (its name is now final).
        let cx = self.span.context();
        let span = cx.span();
        let ids = span.span_context();
        super::request_id::record_trace(super::request_id::TraceIds {
            trace_id: ids.trace_id().to_string(),
            span_id: ids.span_id().to_string(),
        });
    }

    /// The routing decision: the strategy (name and version), the order it put the upstreams in
    /// (endpoint ids) and the seed it was given (`None` when no strategy ran: a pinned request).
    pub fn decision<'a>(
        &self,
        strategy: &str,
        version: &str,
        order: impl Iterator<Item = &'a str>,
        seed: Option<u64>,
    ) {
        if !self.on() {
            return;
        }
        self.span
            .set_attribute("switchyard.strategy", strategy.to_owned());
        self.span
            .set_attribute("switchyard.strategy.version", version.to_owned());
        let order: Vec<StringValue> = order.map(|e| StringValue::from(e.to_owned())).collect();
        self.span.set_attribute(
            "switchyard.decision.order",
            Value::Array(Array::String(order)),
        );
        if let Some(seed) = seed {
            // A string: OpenTelemetry integers are signed 64-bit, the seed is unsigned.
            self.span
                .set_attribute("switchyard.decision.seed", seed.to_string());
        }
    }

    /// The child span of one attempt, and the trace context it sends upstream.
    pub fn attempt(&self, facts: &AttemptFacts<'_>) -> AttemptTrace {
        if !self.on() {
            return AttemptTrace {
                span: tracing::Span::none(),
                headers: self.client.clone(),
                ended: false,
            };
        }
        let operation = self.operation.map_or("chat", Operation::as_str);
        let name = format!("{operation} {}", facts.model);
        let span = tracing::info_span!(
            target: TARGET,
            parent: &self.span,
            "attempt",
            otel.name = name.as_str(),
            otel.kind = "client",
        );
        span.set_attribute("gen_ai.operation.name", operation);
        span.set_attribute("gen_ai.request.model", facts.model.to_owned());
        span.set_attribute("gen_ai.provider.name", provider_name(facts.kind));
        span.set_attribute("switchyard.upstream.kind", facts.kind.to_owned());
        span.set_attribute("switchyard.endpoint", facts.endpoint.to_owned());
        span.set_attribute("switchyard.hedge", facts.hedge);
        if let Ok(url) = url::Url::parse(facts.base_url) {
            if let Some(host) = url.host_str() {
                span.set_attribute("server.address", host.to_owned());
            }
            if let Some(port) = url.port_or_known_default() {
                span.set_attribute("server.port", i64::from(port));
            }
        }
        let headers = TraceHeaders::of(&span.context());
        AttemptTrace {
            span,
            headers,
            ended: false,
        }
    }

    /// The upstream that served the request.
    pub fn served(&self, served: &Served<'_>) {
        if !self.on() {
            return;
        }
        self.span
            .set_attribute("switchyard.endpoint", served.endpoint.to_owned());
        self.span
            .set_attribute("switchyard.attempts", served.attempts as i64);
    }

    /// Tokens of the answer and the time to its first token (a whole answer: to the answer).
    pub fn usage(
        &self,
        input_tokens: u32,
        output_tokens: u32,
        time_to_first_token: Option<Duration>,
    ) {
        if !self.on() {
            return;
        }
        set_usage(&self.span, input_tokens, output_tokens, time_to_first_token);
    }

    /// The answer's status, and its error type (`switchyard_errors_total`'s vocabulary) when it
    /// is an error. The span's status is an error unless the caller's request was at fault
    /// (`caller_*`), as the HTTP conventions leave 4xx server spans unset.
    pub fn answered(&self, status: u16, error_type: Option<&str>) {
        if !self.on() {
            return;
        }
        self.span
            .set_attribute("http.response.status_code", i64::from(status));
        if let Some(error_type) = error_type {
            self.span.set_attribute("error.type", error_type.to_owned());
            if !error_type.starts_with("caller_") {
                self.span.set_status(Status::error(error_type.to_owned()));
            }
        }
    }

    /// A relayed stream ended: `error` is its failure's type when it failed after the client had
    /// its 200 (the client closing it is not the gateway's failure).
    pub fn stream_ended(&self, error: Option<&str>) {
        if !self.on() {
            return;
        }
        if let Some(error) = error {
            self.span.set_attribute("error.type", error.to_owned());
            if error != "caller_disconnected" {
                self.span.set_status(Status::error(error.to_owned()));
            }
        }
    }
}

/// `gen_ai.provider.name` for an upstream kind: the API it speaks (an `openai_compat` upstream
/// may be any server that speaks OpenAI's API; `switchyard.upstream.kind` says which kind).
fn provider_name(kind: &str) -> &'static str {
    match kind {
        "anthropic" => "anthropic",
        _ => "openai",
    }
}

fn set_usage(
    span: &tracing::Span,
    input_tokens: u32,
    output_tokens: u32,
    time_to_first_token: Option<Duration>,
) {
    span.set_attribute("gen_ai.usage.input_tokens", i64::from(input_tokens));
    span.set_attribute("gen_ai.usage.output_tokens", i64::from(output_tokens));
    if let Some(ttft) = time_to_first_token {
        span.set_attribute("switchyard.time_to_first_token", ttft.as_secs_f64());
    }
}

/// How an attempt ended, for its span.
pub struct AttemptOutcome<'a> {
    /// The upstream's HTTP status; 0 when there was none.
    pub status: u16,
    /// The attempt's error type (`gen_ai_client_operation_duration_seconds`' vocabulary).
    pub error_type: Option<&'a str>,
    pub time_to_first_token: Option<Duration>,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// The model the upstream said answered, when known.
    pub response_model: Option<&'a str>,
}

/// One attempt's span (when tracing is on) and the trace context it sends upstream (the span's
/// own, or, tracing off, the client's). Dropped without [`AttemptTrace::end`], the attempt was
/// cancelled (a hedge that lost, a client that left) and its span says so.
pub struct AttemptTrace {
    span: tracing::Span,
    headers: Option<TraceHeaders>,
    ended: bool,
}

impl AttemptTrace {
    /// The `traceparent`/`tracestate` to send, if any.
    pub fn headers(&self) -> Option<&TraceHeaders> {
        self.headers.as_ref()
    }

    pub fn end(&mut self, outcome: &AttemptOutcome<'_>) {
        if self.span.is_none() {
            return;
        }
        self.ended = true;
        let span = &self.span;
        if outcome.status != 0 {
            span.set_attribute("http.response.status_code", i64::from(outcome.status));
        }
        if let Some(model) = outcome.response_model {
            span.set_attribute("gen_ai.response.model", model.to_owned());
        }
        match outcome.error_type {
            Some(error_type) => {
                span.set_attribute("error.type", error_type.to_owned());
                span.set_status(Status::error(error_type.to_owned()));
            }
            None => set_usage(
                span,
                outcome.input_tokens,
                outcome.output_tokens,
                outcome.time_to_first_token,
            ),
        }
    }
}

impl Drop for AttemptTrace {
    fn drop(&mut self) {
        if !self.ended && !self.span.is_none() {
            self.span.set_attribute("switchyard.cancelled", true);
        }
    }
}

/// The exporter's HTTP client: the gateway's reqwest (opentelemetry-otlp's own client is a newer
/// reqwest that would be a second copy in the build). The batch processor exports from its own
/// thread, outside the runtime, so each request is sent as a task on the gateway's runtime.
#[derive(Debug)]
struct ExportClient {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for ExportClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<bytes::Bytes>,
    ) -> Result<opentelemetry_http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let sent = self
            .http
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body);
        // `send` starts the request's timer, which needs the runtime: it runs inside the task.
        let answer = async move {
            let mut response = sent.send().await?;
            let status = response.status();
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                let room = RESPONSE_LIMIT.saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if room <= chunk.len() {
                    break;
                }
            }
            Ok::<_, reqwest::Error>((status, body))
        };
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, answer).await });
        let (status, body) = match task.await {
            Ok(Ok(answer)) => answer?,
            Ok(Err(_)) => {
                return Err(format!("no answer within {}s", EXPORT_TIMEOUT.as_secs()).into());
            }
            Err(e) => return Err(Box::new(e)),
        };
        Ok(opentelemetry_http::Response::builder()
            .status(status)
            .body(bytes::Bytes::from(body))?)
    }
}

/// The batch processor behind a bound this module can see: spans over [`QUEUE_SPANS`] waiting
/// are dropped and counted (`switchyard_trace_spans_total{outcome="dropped"}`). The processor's
/// own queue has the same size and holds a subset of these, so it never drops one silently.
#[derive(Debug)]
struct BoundedQueue {
    inner: BatchSpanProcessor,
    /// Spans handed to the processor whose export has not finished.
    backlog: Arc<AtomicUsize>,
}

impl SpanProcessor for BoundedQueue {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.backlog.fetch_add(1, Ordering::AcqRel) >= QUEUE_SPANS {
            self.backlog.fetch_sub(1, Ordering::AcqRel);
            metrics::trace_spans("dropped", 1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting what it exported or failed to, and logging when the collector
/// stops (and starts again) taking spans, once per change rather than per batch.
#[derive(Debug)]
struct CountingExporter<E> {
    inner: E,
    backlog: Arc<AtomicUsize>,
    failing: AtomicBool,
    endpoint: String,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        self.backlog.fetch_sub(n, Ordering::AcqRel);
        match &result {
            Ok(()) => {
                metrics::trace_spans("exported", n as u64);
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.endpoint, "exporting spans works again");
                }
            }
            Err(e) => {
                metrics::trace_spans("failed", n as u64);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        endpoint = %self.endpoint,
                        "exporting spans failed, they are dropped until it works again (switchyard_trace_spans_total): {e}"
                    );
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, Tracer as _};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("a header value"));
        }
        map
    }

    #[test]
    fn a_client_trace_context_is_passed_on_only_when_valid() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let kept = client_context(&headers(&[
            ("traceparent", parent),
            ("tracestate", "vendor=opaque,other=1"),
        ]))
        .and_then(|cx| TraceHeaders::of(&cx))
        .expect("a valid context");
        let sent: Vec<(HeaderName, HeaderValue)> = kept.iter().collect();
        assert_eq!(
            sent,
            vec![
                (TRACEPARENT, HeaderValue::from_static(parent)),
                (
                    TRACESTATE,
                    HeaderValue::from_static("vendor=opaque,other=1")
                ),
            ]
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "not a traceparent",
        ] {
            assert!(
                client_context(&headers(&[("traceparent", bad)])).is_none(),
                "{bad} was accepted"
            );
        }
        // Tracing off and no client context: nothing goes upstream.
        let off = RequestTrace::start(&HeaderMap::new(), Operation::Chat);
        let attempt = off.attempt(&AttemptFacts {
            endpoint: "m:local-1",
            kind: "openai_compat",
            model: "sim",
            base_url: "http://127.0.0.1:1/v1",
            hedge: false,
        });
        assert!(attempt.headers().is_none());
    }

    /// An exporter that holds every export until the test lets go.
    #[derive(Debug)]
    struct Stuck(parking_lot::Mutex<std::sync::mpsc::Receiver<()>>);

    impl SpanExporter for Stuck {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            let _ = self.0.lock().recv();
            Ok(())
        }
    }

    #[test]
    fn spans_over_the_queue_are_dropped_and_counted_without_waiting_for_the_exporter() {
        let (release, held) = std::sync::mpsc::channel();
        let backlog = Arc::new(AtomicUsize::new(0));
        let exporter = CountingExporter {
            inner: Stuck(parking_lot::Mutex::new(held)),
            backlog: backlog.clone(),
            failing: AtomicBool::new(false),
            endpoint: "test".into(),
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BoundedQueue {
                inner: BatchSpanProcessor::builder(exporter)
                    .with_batch_config(
                        BatchConfigBuilder::default()
                            .with_max_queue_size(QUEUE_SPANS)
                            .build(),
                    )
                    .build(),
                backlog: backlog.clone(),
            })
            .build();
        let tracer = provider.tracer("test");
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            for _ in 0..QUEUE_SPANS + 100 {
                tracer.start("span").end();
            }
        });
        // The exporter holds its first batch: every span handed over is still waiting.
        assert_eq!(backlog.load(Ordering::Acquire), QUEUE_SPANS);
        let text = handle.render();
        assert!(
            text.contains("switchyard_trace_spans_total{outcome=\"dropped\"} 100"),
            "{text}"
        );
        drop(release);
        provider
            .shutdown_with_timeout(Duration::from_secs(30))
            .expect("shutdown");
        assert_eq!(backlog.load(Ordering::Acquire), 0);
    }
}
