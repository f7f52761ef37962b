//! Executing a plan: try routes in order until one answers, keep attribution, report observations.
//!
//! A stream is locked to its route at its first event: splicing a second provider into an SSE stream
//! would duplicate role events and corrupt usage, so after that point a failure ends the stream with
//! an error event instead of falling back.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use crate::config::RouteConfig;
use crate::protocol::openai_chat::{self, ChatRequest};
use crate::strategy::{ModelRouter, Observation};
use crate::upstream::{AttemptError, UpstreamClient};

use super::RoutingContext;
use super::health::{Outcome, Ticket};
use super::prefill::PrefillLease;
use super::select::{Exclusion, Plan};
use super::table::ModelEntry;

/// One failed attempt, as kept in the attribution and reported when every attempt fails.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FailedAttempt {
    pub provider: String,
    pub endpoint_id: String,
    pub error_type: &'static str,
    pub error: String,
    #[serde(skip)]
    pub status: u16,
}

/// Where a request went: kept server-side for logs and observations, never sent to the client.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Attribution {
    pub provider: String,
    pub base_url: String,
    pub endpoint_id: String,
    pub fell_back: bool,
    pub failed_attempts: Vec<FailedAttempt>,
}

/// Every route in the plan failed or was skipped.
#[derive(Debug, thiserror::Error)]
#[error("all {} attempts failed; first: {}", attempts.len(), attempts.first().map(|a| a.error.as_str()).unwrap_or("none"))]
pub struct DispatchError {
    pub attempts: Vec<FailedAttempt>,
    /// Routes left out before or during dispatch (open circuits, weight 0, modality).
    pub excluded: Vec<Exclusion>,
}

impl DispatchError {
    /// The primary (first) attempt's error decides the client's status.
    pub fn primary(&self) -> Option<&FailedAttempt> {
        self.attempts.first()
    }
}

pub type EventStream = Pin<Box<dyn Stream<Item = Bytes> + Send>>;

/// How a relayed stream ended, for the request log.
#[derive(Debug, Clone, Default)]
pub struct StreamSummary {
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Why the stream did not complete: an upstream failure or the client leaving.
    pub error: Option<String>,
}

/// A successful dispatch.
pub enum Answer {
    /// A whole JSON body.
    Complete {
        body: Bytes,
        attribution: Attribution,
        prompt_tokens: u32,
        completion_tokens: u32,
    },
    /// An SSE stream, already past its first event; `summary` resolves when it ends.
    Stream {
        events: EventStream,
        attribution: Attribution,
        summary: tokio::sync::oneshot::Receiver<StreamSummary>,
    },
}

/// Tries the plan's routes in order for a Chat Completions request.
pub async fn chat_completions(
    client: &UpstreamClient,
    ctx: &RoutingContext,
    caller: Option<Arc<str>>,
    model: &Arc<ModelEntry>,
    request: &ChatRequest,
    plan: Plan,
) -> Result<Answer, DispatchError> {
    let health = &ctx.health;
    let mut failed: Vec<FailedAttempt> = Vec::new();
    let mut excluded = plan.excluded.clone();
    let routes = model.routes();
    for &position in &plan.order {
        let Some(route) = routes.get(position) else {
            continue;
        };
        // Every step consults the breaker, so a circuit that opened since selection is skipped
        // here too; a pinned request goes where the operator said.
        let ticket = if plan.pinned {
            Ticket::Normal
        } else {
            match health.claim(&route.endpoint_id, Instant::now()) {
                Some(ticket) => ticket,
                None => {
                    excluded.push(Exclusion {
                        endpoint_id: route.endpoint_id.clone(),
                        reason: "circuit open".into(),
                    });
                    continue;
                }
            }
        };
        let started = Instant::now();
        // The lease is released at the first token, or wherever this attempt ends (drop).
        let uncached = ctx.prefill.uncached_estimate(
            caller.as_deref(),
            &route.endpoint_id,
            u64::from(request.prompt_tokens),
            started,
        );
        let lease = ctx
            .prefill
            .acquire(caller.clone(), &route.endpoint_id, uncached);
        let url = format!("{}/chat/completions", route.base_url);
        let body = openai_chat::upstream_body(request, &route.provider_model_id);
        let attempt = match client.post_json(&url, route.api_key.as_deref(), body).await {
            Ok(response) if request.stream => {
                let outcome = StreamAccounting {
                    ctx: ctx.clone(),
                    caller: caller.clone(),
                    endpoint_id: route.endpoint_id.clone(),
                    ticket,
                    lease,
                    prompt_tokens: u64::from(request.prompt_tokens),
                };
                open_stream(response, model, route, request, &plan, started, outcome).await
            }
            Ok(response) => complete(client, response, model, route, request, &plan, started).await,
            Err(e) => Err(e),
        };
        match attempt {
            Ok(answer) => {
                if let Partial::Complete { usage, .. } = &answer {
                    health.record(&route.endpoint_id, ticket, Outcome::Success, None);
                    let prompt = if usage.prompt > 0 {
                        u64::from(usage.prompt)
                    } else {
                        u64::from(request.prompt_tokens)
                    };
                    ctx.prefill.remember(
                        caller.as_deref(),
                        &route.endpoint_id,
                        prompt,
                        Instant::now(),
                    );
                }
                let attribution = Attribution {
                    provider: route.kind.as_str().to_owned(),
                    base_url: route.base_url.clone(),
                    endpoint_id: route.endpoint_id.clone(),
                    fell_back: !failed.is_empty(),
                    failed_attempts: failed,
                };
                return Ok(match answer {
                    Partial::Complete { body, usage } => Answer::Complete {
                        body,
                        attribution,
                        prompt_tokens: usage.prompt,
                        completion_tokens: usage.completion,
                    },
                    Partial::Stream { events, summary } => Answer::Stream {
                        events,
                        attribution,
                        summary,
                    },
                });
            }
            Err(e) => {
                let outcome = match &e {
                    AttemptError::Status { status, .. } => Outcome::from_status(*status),
                    _ => Outcome::Failure,
                };
                health.record(&route.endpoint_id, ticket, outcome, Some(&e.to_string()));
                // An error from the affinity endpoint drops the pin; the next request re-pins.
                if let Some(c) = &caller {
                    ctx.affinity.drop_if(c, model.id(), &route.endpoint_id);
                }
                observe(
                    &model.router,
                    route,
                    &plan,
                    request,
                    false,
                    None,
                    started,
                    Usage::default(),
                    e.status(),
                );
                tracing::debug!(endpoint = %route.endpoint_id, "attempt failed: {e}");
                failed.push(FailedAttempt {
                    provider: route.kind.as_str().to_owned(),
                    endpoint_id: route.endpoint_id.clone(),
                    error_type: e.error_type(),
                    error: e.to_string(),
                    status: e.status(),
                });
            }
        }
    }
    Err(DispatchError {
        attempts: failed,
        excluded,
    })
}

enum Partial {
    Complete {
        body: Bytes,
        usage: Usage,
    },
    Stream {
        events: EventStream,
        summary: tokio::sync::oneshot::Receiver<StreamSummary>,
    },
}

#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    prompt: u32,
    completion: u32,
    cached: u32,
}

fn usage_of(value: &serde_json::Value) -> Option<Usage> {
    let u = value.get("usage")?;
    let n = |v: Option<&serde_json::Value>| {
        v.and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
            .min(u64::from(u32::MAX)) as u32
    };
    Some(Usage {
        prompt: n(u.get("prompt_tokens")),
        completion: n(u.get("completion_tokens")),
        cached: n(u
            .get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens"))),
    })
}

async fn complete(
    client: &UpstreamClient,
    response: reqwest::Response,
    model: &Arc<ModelEntry>,
    route: &RouteConfig,
    request: &ChatRequest,
    plan: &Plan,
    started: Instant,
) -> Result<Partial, AttemptError> {
    let body = client.read_body(response).await?;
    let value: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| AttemptError::InvalidResponse(format!("body is not JSON: {e}")))?;
    if value.get("choices").is_none_or(|c| !c.is_array()) {
        return Err(AttemptError::InvalidResponse(
            "no `choices` array in the answer".into(),
        ));
    }
    let usage = usage_of(&value).unwrap_or_default();
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    observe(
        &model.router,
        route,
        plan,
        request,
        true,
        Some(elapsed),
        started,
        usage,
        200,
    );
    Ok(Partial::Complete {
        body: rename_model(body, &route.provider_model_id, &request.model),
        usage,
    })
}

/// What a stream owes the routing state: its health outcome (success at the first token, failure
/// if it breaks before one, nothing — the probe is released — if the client leaves first), its
/// prefill lease (released at the first token or whenever the stream ends), and a prompt hint
/// when it completes.
struct StreamAccounting {
    ctx: RoutingContext,
    caller: Option<Arc<str>>,
    endpoint_id: String,
    ticket: Ticket,
    lease: PrefillLease,
    prompt_tokens: u64,
}

async fn open_stream(
    response: reqwest::Response,
    model: &Arc<ModelEntry>,
    route: &RouteConfig,
    request: &ChatRequest,
    plan: &Plan,
    started: Instant,
    outcome: StreamAccounting,
) -> Result<Partial, AttemptError> {
    let mut events = response.bytes_stream().eventsource();
    // Until the first event nothing has reached the client, so a failure here can still fall back.
    let first = match events.next().await {
        Some(Ok(event)) => event,
        Some(Err(e)) => return Err(AttemptError::EmptyStream(stream_error(&e))),
        None => return Err(AttemptError::EmptyStream("no events".into())),
    };
    let (summary_tx, summary) = tokio::sync::oneshot::channel();
    let mut relay = StreamRelay {
        summary: Some(summary_tx),
        outcome: Some(outcome),
        accounting: None,
        upstream: Box::pin(events),
        pending_first: None,
        router: model.router.clone(),
        route_index: route.index,
        provider_model_id: route.provider_model_id.clone(),
        public_model: request.model.clone(),
        strategy_metadata: plan.strategy_metadata.clone(),
        prompt_tokens: request.prompt_tokens,
        started,
        first_token: None,
        usage: Usage::default(),
        finished: false,
    };
    relay.pending_first = relay.frame(first);
    Ok(Partial::Stream {
        events: Box::pin(relay),
        summary,
    })
}

fn stream_error<E: std::fmt::Display>(e: &EventStreamError<E>) -> String {
    e.to_string()
}

type UpstreamEvents =
    Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// Relays upstream SSE events to the client one by one, noting the first token and usage on the way
/// and reporting the observation when the stream ends.
struct StreamRelay {
    upstream: UpstreamEvents,
    pending_first: Option<Bytes>,
    router: Arc<ModelRouter>,
    route_index: u32,
    provider_model_id: String,
    public_model: String,
    strategy_metadata: String,
    prompt_tokens: u32,
    started: Instant,
    first_token: Option<f64>,
    usage: Usage,
    finished: bool,
    summary: Option<tokio::sync::oneshot::Sender<StreamSummary>>,
    /// Health outcome not yet reported.
    outcome: Option<StreamAccounting>,
    /// Kept after the health outcome, to remember the prompt when the stream completes.
    accounting: Option<StreamAccounting>,
}

impl StreamRelay {
    /// Frames one event for the client; `None` for events that carry nothing to relay.
    fn frame(&mut self, event: Event) -> Option<Bytes> {
        let data = event.data;
        if data.trim() == "[DONE]" {
            return Some(Bytes::from_static(b"data: [DONE]\n\n"));
        }
        // Only chunks that can change what we track are parsed: until the first token, and usage.
        if (self.first_token.is_none() || data.contains("\"usage\""))
            && let Ok(value) = serde_json::from_str::<serde_json::Value>(&data)
        {
            if self.first_token.is_none() && carries_token(&value) {
                self.first_token = Some(self.started.elapsed().as_secs_f64() * 1000.0);
                // A content or tool-call delta makes the stream a success; a role delta does not.
                if let Some(mut o) = self.outcome.take() {
                    o.ctx
                        .health
                        .record(&o.endpoint_id, o.ticket, Outcome::Success, None);
                    // Prefill is over once tokens flow; a long decode is not prefill pressure.
                    o.lease.release();
                    self.accounting = Some(o);
                }
            }
            if let Some(u) = usage_of(&value) {
                self.usage = u;
            }
        }
        let data = rename_model(
            Bytes::from(data),
            &self.provider_model_id,
            &self.public_model,
        );
        let mut out = Vec::with_capacity(data.len() + 8);
        if !event.event.is_empty() && event.event != "message" {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(event.event.as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&data);
        out.extend_from_slice(b"\n\n");
        Some(Bytes::from(out))
    }

    fn finish(&mut self, error: Option<String>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let success = error.is_none();
        if let Some(o) = self.outcome.take() {
            let outcome = if success {
                Outcome::Success
            } else {
                Outcome::Failure
            };
            o.ctx
                .health
                .record(&o.endpoint_id, o.ticket, outcome, error.as_deref());
            if !success && let Some(c) = &o.caller {
                o.ctx
                    .affinity
                    .drop_if(c, self.router.model_id.as_str(), &o.endpoint_id);
            }
            self.accounting = Some(o);
        }
        if let Some(a) = self.accounting.take() {
            // Only a completed prompt becomes a warm-continuation hint.
            if success {
                let prompt = if self.usage.prompt > 0 {
                    u64::from(self.usage.prompt)
                } else {
                    a.prompt_tokens
                };
                a.ctx
                    .prefill
                    .remember(a.caller.as_deref(), &a.endpoint_id, prompt, Instant::now());
            }
        }
        let latency = self.started.elapsed().as_secs_f64() * 1000.0;
        if let Some(tx) = self.summary.take() {
            let _ = tx.send(StreamSummary {
                ttft_ms: self.first_token,
                latency_ms: latency,
                prompt_tokens: self.usage.prompt,
                completion_tokens: self.usage.completion,
                error,
            });
        }
        report(
            &self.router,
            Observation {
                index: self.route_index,
                success,
                ttft_ms: self.first_token,
                latency_ms: latency,
                prompt_tokens: if self.usage.prompt > 0 {
                    self.usage.prompt
                } else {
                    self.prompt_tokens
                },
                completion_tokens: self.usage.completion,
                cached_prompt_tokens: self.usage.cached,
                status: 200,
                strategy_metadata: std::mem::take(&mut self.strategy_metadata),
                now_ms: now_ms(),
            },
        );
    }
}

impl Stream for StreamRelay {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if let Some(first) = self.pending_first.take() {
            return Poll::Ready(Some(first));
        }
        if self.finished {
            return Poll::Ready(None);
        }
        loop {
            match self.upstream.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.finish(None);
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Ok(event))) => {
                    if let Some(bytes) = self.frame(event) {
                        return Poll::Ready(Some(bytes));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    // Bytes already reached the client: end with an error event, never fall back.
                    tracing::warn!("upstream stream broke after its first event: {e}");
                    self.finish(Some(format!("upstream stream failed: {e}")));
                    let payload = serde_json::json!({
                        "error": {
                            "message": format!("upstream stream failed: {e}"),
                            "type": "upstream_error",
                            "code": "stream_interrupted",
                        }
                    });
                    return Poll::Ready(Some(Bytes::from(format!("data: {payload}\n\n"))));
                }
            }
        }
    }
}

impl Drop for StreamRelay {
    fn drop(&mut self) {
        // Dropped before the upstream finished: the client went away. Not the upstream's fault,
        // so the strategy is not told; the request log is.
        // The lease is released by its own Drop; the probe claim must be given back.
        if let Some(o) = self.outcome.take() {
            o.ctx.health.release(&o.endpoint_id, o.ticket);
        }
        if !self.finished
            && let Some(tx) = self.summary.take()
        {
            let _ = tx.send(StreamSummary {
                ttft_ms: self.first_token,
                latency_ms: self.started.elapsed().as_secs_f64() * 1000.0,
                prompt_tokens: self.usage.prompt,
                completion_tokens: self.usage.completion,
                error: Some("client disconnected".into()),
            });
        }
    }
}

/// A chunk carries a token when a choice's delta has content, reasoning or tool calls.
fn carries_token(value: &serde_json::Value) -> bool {
    value
        .get("choices")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|choices| {
            choices.iter().any(|c| {
                c.get("delta").is_some_and(|d| {
                    ["content", "reasoning_content", "reasoning"]
                        .iter()
                        .any(|k| {
                            d.get(*k)
                                .and_then(serde_json::Value::as_str)
                                .is_some_and(|s| !s.is_empty())
                        })
                        || d.get("tool_calls").is_some_and(|t| !t.is_null())
                })
            })
        })
}

/// Replaces the upstream's model name with the public one without re-serialising the JSON: the
/// client asked for the public name and should not learn which deployment answered.
pub fn rename_model(body: Bytes, provider_model_id: &str, public_model: &str) -> Bytes {
    if provider_model_id == public_model {
        return body;
    }
    let Ok(needle_value) = serde_json::to_string(provider_model_id) else {
        return body;
    };
    let Ok(replacement_value) = serde_json::to_string(public_model) else {
        return body;
    };
    for sep in ["\"model\":", "\"model\": "] {
        let needle = format!("{sep}{needle_value}");
        if let Some(at) = find(&body, needle.as_bytes()) {
            let mut out = Vec::with_capacity(body.len() + public_model.len());
            out.extend_from_slice(&body[..at]);
            out.extend_from_slice(sep.as_bytes());
            out.extend_from_slice(replacement_value.as_bytes());
            out.extend_from_slice(&body[at + needle.len()..]);
            return Bytes::from(out);
        }
    }
    body
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Hands an observation to the strategy off the response path.
fn report(router: &Arc<ModelRouter>, observation: Observation) {
    let router = router.clone();
    tokio::spawn(async move { router.observe(&observation).await });
}

#[allow(clippy::too_many_arguments)]
fn observe(
    router: &Arc<ModelRouter>,
    route: &RouteConfig,
    plan: &Plan,
    request: &ChatRequest,
    success: bool,
    ttft_ms: Option<f64>,
    started: Instant,
    usage: Usage,
    status: u16,
) {
    report(
        router,
        Observation {
            index: route.index,
            success,
            ttft_ms,
            latency_ms: started.elapsed().as_secs_f64() * 1000.0,
            prompt_tokens: if usage.prompt > 0 {
                usage.prompt
            } else {
                request.prompt_tokens
            },
            completion_tokens: usage.completion,
            cached_prompt_tokens: usage.cached,
            status,
            strategy_metadata: plan.strategy_metadata.clone(),
            now_ms: now_ms(),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_model_in_compact_and_spaced_json() {
        let out = rename_model(
            Bytes::from_static(br#"{"id":"x","model":"sim-small","choices":[]}"#),
            "sim-small",
            "demo-chat",
        );
        assert_eq!(&out[..], br#"{"id":"x","model":"demo-chat","choices":[]}"#);
        let out = rename_model(Bytes::from_static(br#"{"model": "a/b"}"#), "a/b", "pub");
        assert_eq!(&out[..], br#"{"model": "pub"}"#);
        let untouched = rename_model(Bytes::from_static(br#"{"model":"other"}"#), "sim", "pub");
        assert_eq!(&untouched[..], br#"{"model":"other"}"#);
    }

    #[test]
    fn role_only_delta_is_not_a_token() {
        let role: serde_json::Value =
            serde_json::from_str(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#)
                .unwrap();
        let content: serde_json::Value =
            serde_json::from_str(r#"{"choices":[{"delta":{"content":"Hi"}}]}"#).unwrap();
        assert!(!carries_token(&role));
        assert!(carries_token(&content));
    }
}
