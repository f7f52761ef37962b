//! Executing a plan: try routes in order until one answers, keep attribution, report observations.
//!
//! When the client and the upstream speak the same dialect, bodies and events pass through with only
//! the model name changed; otherwise they are translated through the IR (`protocol::ir`).
//!
//! A stream is locked to its route at its first event: splicing a second provider into an SSE stream
//! would duplicate role events and corrupt usage, so after that point a failure ends the stream with
//! an error event instead of falling back.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::config::{ProviderKind, RouteConfig};
use crate::protocol::ir::{self, StreamEvent};
use crate::protocol::rename::ModelRename;
use crate::protocol::sse::{self, SseEvent};
use crate::protocol::{Decoder, Dialect, Encoder};
use crate::strategy::{ModelRouter, Observation};
use crate::upstream::{AttemptError, UpstreamAuth, UpstreamClient};

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

impl FailedAttempt {
    fn new(route: &RouteConfig, e: &AttemptError) -> Self {
        Self {
            provider: route.kind.as_str().to_owned(),
            endpoint_id: route.endpoint_id.clone(),
            error_type: e.error_type(),
            error: e.to_string(),
            status: e.status(),
        }
    }
}

impl Attribution {
    /// Served by `route` after the `failed` attempts.
    fn new(route: &RouteConfig, failed: Vec<FailedAttempt>) -> Self {
        Self {
            provider: route.kind.as_str().to_owned(),
            base_url: route.base_url.clone(),
            endpoint_id: route.endpoint_id.clone(),
            fell_back: !failed.is_empty(),
            failed_attempts: failed,
        }
    }
}

/// Every step consults the breaker, so a circuit that opened since selection is skipped here too
/// (and recorded as excluded); a pinned request goes where the operator said.
fn admit(
    ctx: &RoutingContext,
    route: &RouteConfig,
    plan: &Plan,
    excluded: &mut Vec<Exclusion>,
) -> Option<Ticket> {
    if plan.pinned {
        return Some(Ticket::Normal);
    }
    let ticket = ctx.health.claim(&route.endpoint_id, Instant::now());
    if ticket.is_none() {
        excluded.push(Exclusion {
            endpoint_id: route.endpoint_id.clone(),
            reason: "circuit open".into(),
        });
    }
    ticket
}

/// Records the routes left untried because the inbound route's `max_attempts` ran out.
fn not_tried(excluded: &mut Vec<Exclusion>, routes: &[RouteConfig], rest: &[usize], max: usize) {
    for &p in rest {
        if let Some(route) = routes.get(p) {
            excluded.push(Exclusion {
                endpoint_id: route.endpoint_id.clone(),
                reason: format!("not tried: max_attempts ({max}) reached"),
            });
        }
    }
}

/// Key affinity: a caller served by a pool key keeps that key, unless it already has a live
/// binding in the pool (a binding to a key that is merely quieted survives; the pool walks around
/// it until it is back).
fn bind_key(ctx: &RoutingContext, caller: Option<&Arc<str>>, route: &RouteConfig, plan: &Plan) {
    let (Some(caller), Some(key)) = (caller, route.key.as_ref()) else {
        return;
    };
    if plan.credential.is_some() {
        return;
    }
    let now = Instant::now();
    if ctx
        .keys
        .binding(caller, &key.pool, plan.role, now)
        .is_none()
    {
        ctx.keys.bind(
            caller,
            &key.pool,
            &key.fingerprint,
            plan.role,
            plan.key_generation,
            now,
        );
    }
}

/// A key rejected by the upstream (401/402/403/429) is quieted; the rejection is the key's, so the
/// endpoint's health hears nothing (`Neutral`). `None` when the attempt used no pool key.
fn key_outcome(
    ctx: &RoutingContext,
    route: &RouteConfig,
    plan: &Plan,
    e: &AttemptError,
) -> Option<Outcome> {
    let key = route.key.as_ref().filter(|_| plan.credential.is_none())?;
    let AttemptError::Status {
        status,
        retry_after,
        ..
    } = e
    else {
        return None;
    };
    if !crate::upstream::key_pool::is_key_rejection(*status) {
        return None;
    }
    ctx.keys.quiet(key, *status, *retry_after, Instant::now());
    Some(Outcome::Neutral)
}

/// What a failed attempt says about the endpoint's health.
fn outcome_of(e: &AttemptError) -> Outcome {
    match e {
        AttemptError::Status { status, .. } => Outcome::from_status(*status),
        _ => Outcome::Failure,
    }
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

/// A chat request as it arrived: its dialect, its IR, and the parsed body for pass-through.
#[derive(Debug, Clone)]
pub struct Inbound {
    pub dialect: Dialect,
    pub request: ir::Request,
    pub body: serde_json::Map<String, serde_json::Value>,
    pub prompt_tokens: u32,
}

/// The dialect an upstream of this kind speaks.
pub fn upstream_dialect(kind: ProviderKind) -> Dialect {
    match kind {
        ProviderKind::OpenaiCompat => Dialect::OpenAiChat,
        ProviderKind::OpenaiResponses => Dialect::OpenAiResponses,
        ProviderKind::Anthropic => Dialect::AnthropicMessages,
    }
}

/// The URL and credential of a call to `route` in `dialect`; `credential` (a pass-through
/// route's client key) replaces the route's own key.
pub(crate) fn endpoint<'a>(
    route: &'a RouteConfig,
    dialect: Dialect,
    credential: Option<&'a str>,
) -> (String, UpstreamAuth<'a>) {
    let key = credential.or(route.api_key.as_deref());
    match dialect {
        // Anthropic base URLs conventionally stop before `/v1`.
        Dialect::AnthropicMessages => {
            let base = route.base_url.trim_end_matches('/');
            let url = if base.ends_with("/v1") {
                format!("{base}/messages")
            } else {
                format!("{base}/v1/messages")
            };
            (url, UpstreamAuth::Anthropic(key))
        }
        other => (
            format!("{}{}", route.base_url, other.path()),
            UpstreamAuth::Bearer(key),
        ),
    }
}

/// The body for `route`: the client's own JSON with the upstream's model name when the dialects
/// match (fields the IR does not model reach the upstream untouched), else built from the IR.
fn upstream_body(inbound: &Inbound, route: &RouteConfig, dialect: Dialect) -> Vec<u8> {
    if dialect != inbound.dialect {
        return dialect.build_request(&inbound.request, &route.provider_model_id);
    }
    let body = PassThroughBody {
        body: &inbound.body,
        model: &route.provider_model_id,
        // Usage on Chat streams lets the gateway account tokens; the extra chunk is valid for clients.
        include_usage: dialect == Dialect::OpenAiChat && inbound.request.stream,
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The client's body as it goes to a same-dialect upstream, written straight from the parsed
/// request: the model swapped, `stream_options.include_usage` added when asked for. Serialising
/// it this way spares a copy of the whole body (messages and all) per attempt.
struct PassThroughBody<'a> {
    body: &'a serde_json::Map<String, serde_json::Value>,
    model: &'a str,
    include_usage: bool,
}

impl serde::Serialize for PassThroughBody<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        // Absent, or not an object (not usable as the client sent it): options of our own.
        let no_options = serde_json::Map::new();
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.body {
            match key.as_str() {
                "model" => map.serialize_entry(key, self.model)?,
                "stream_options" if self.include_usage => {
                    let options = value.as_object().unwrap_or(&no_options);
                    map.serialize_entry(key, &WithIncludeUsage(options))?;
                }
                _ => map.serialize_entry(key, value)?,
            }
        }
        if !self.body.contains_key("model") {
            map.serialize_entry("model", self.model)?;
        }
        if self.include_usage && !self.body.contains_key("stream_options") {
            map.serialize_entry("stream_options", &WithIncludeUsage(&no_options))?;
        }
        map.end()
    }
}

/// `stream_options` with `include_usage: true` unless the client set it.
struct WithIncludeUsage<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl serde::Serialize for WithIncludeUsage<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.0 {
            map.serialize_entry(key, value)?;
        }
        if !self.0.contains_key("include_usage") {
            map.serialize_entry("include_usage", &true)?;
        }
        map.end()
    }
}

/// Everything one chat attempt needs besides its route.
struct AttemptContext<'a> {
    client: &'a UpstreamClient,
    ctx: &'a RoutingContext,
    caller: &'a Option<Arc<str>>,
    model: &'a Arc<ModelEntry>,
    inbound: &'a Inbound,
    plan: &'a Plan,
}

impl AttemptContext<'_> {
    /// Sends the request to `route` and waits for the whole answer, or for a stream's first
    /// event. Returns when it started.
    async fn attempt(
        &self,
        route: &RouteConfig,
        ticket: Ticket,
    ) -> (Result<Partial, AttemptError>, Instant) {
        let (ctx, caller, inbound) = (self.ctx, self.caller, self.inbound);
        ctx.quota.count_request(&route.endpoint_id); // local quota counter (routing::quota)
        let started = Instant::now();
        // The lease is released at the first token, or wherever this attempt ends (drop).
        let uncached = ctx.prefill.uncached_estimate(
            caller.as_deref(),
            &route.endpoint_id,
            u64::from(inbound.prompt_tokens),
            started,
        );
        let lease = ctx
            .prefill
            .acquire(caller.clone(), &route.endpoint_id, uncached);
        let dialect = upstream_dialect(route.kind);
        let (url, auth) = endpoint(route, dialect, self.plan.credential.as_deref());
        let body = upstream_body(inbound, route, dialect);
        let result = match self.client.post_json(&url, auth, body).await {
            Ok(response) if inbound.request.stream => {
                let accounting = StreamAccounting {
                    ctx: ctx.clone(),
                    caller: caller.clone(),
                    endpoint_id: route.endpoint_id.clone(),
                    ticket,
                    lease,
                    prompt_tokens: u64::from(inbound.prompt_tokens),
                };
                open_stream(
                    response, self.model, route, dialect, inbound, self.plan, started, accounting,
                )
                .await
            }
            Ok(response) => {
                let answer = complete(self.client, response, route, dialect, inbound).await;
                drop(lease);
                answer
            }
            Err(e) => Err(e),
        };
        (result, started)
    }

    /// Books a failed attempt: health (or the key pool), affinity, the strategy's observation.
    fn failed(&self, route: &RouteConfig, ticket: Ticket, started: Instant, e: &AttemptError) {
        let ctx = self.ctx;
        let outcome = key_outcome(ctx, route, self.plan, e).unwrap_or_else(|| outcome_of(e));
        ctx.health
            .record(&route.endpoint_id, ticket, outcome, Some(&e.to_string()));
        // An error from the affinity endpoint drops the pin; the next request re-pins.
        if let Some(c) = self.caller {
            ctx.affinity.drop_if(c, self.model.id(), &route.endpoint_id);
        }
        report(
            &self.model.router,
            observation(
                route,
                self.plan,
                self.inbound,
                false,
                None,
                started,
                ir::Usage::default(),
                e.status(),
            ),
        );
        tracing::debug!(endpoint = %route.endpoint_id, "attempt failed: {e}");
    }

    /// The primary attempt, hedged: if it has not answered (or sent its first event) by the
    /// strategy's hedge time, the backup is sent too and the first answer wins; the other attempt
    /// is cancelled. A side that fails first is booked and the other one awaited. Returns the
    /// deciding attempt and the failures booked on the way.
    async fn hedged<'r>(
        &self,
        primary: &'r RouteConfig,
        primary_ticket: Ticket,
        hedge: Hedge<'r>,
        excluded: &mut Vec<Exclusion>,
    ) -> HedgedOutcome<'r> {
        let first = self.attempt(primary, primary_ticket);
        tokio::pin!(first);
        let done = tokio::select! {
            done = &mut first => Some(done),
            () = tokio::time::sleep(hedge.after) => None,
        };
        if let Some((result, started)) = done {
            return HedgedOutcome::single(primary, primary_ticket, result, started);
        }
        let Some(backup_ticket) = admit(self.ctx, hedge.backup, self.plan, excluded) else {
            let (result, started) = first.await;
            return HedgedOutcome::single(primary, primary_ticket, result, started);
        };
        tracing::debug!(
            primary = %primary.endpoint_id,
            backup = %hedge.backup.endpoint_id,
            after_ms = hedge.after.as_millis() as u64,
            "hedging: the primary has not answered, sending the backup"
        );
        let second = self.attempt(hedge.backup, backup_ticket);
        tokio::pin!(second);
        let mut failures = Vec::new();
        let (winner, loser) = tokio::select! {
            (result, started) = &mut first => ((primary, primary_ticket, result, started), (hedge.backup, backup_ticket)),
            (result, started) = &mut second => ((hedge.backup, backup_ticket, result, started), (primary, primary_ticket)),
        };
        let decided = match winner {
            (route, ticket, Err(e), started) => {
                // The first to finish failed: the other one decides.
                self.failed(route, ticket, started, &e);
                failures.push(FailedAttempt::new(route, &e));
                let (result, started) = if std::ptr::eq(loser.0, primary) {
                    first.await
                } else {
                    second.await
                };
                (loser.0, loser.1, result, started)
            }
            ok => {
                // The loser is cancelled: it says nothing about its endpoint.
                self.ctx
                    .health
                    .record(&loser.0.endpoint_id, loser.1, Outcome::Neutral, None);
                ok
            }
        };
        HedgedOutcome {
            route: decided.0,
            ticket: decided.1,
            result: decided.2,
            started: decided.3,
            failures,
            hedged: Some(hedge.backup),
        }
    }
}

/// A hedge the strategy asked for: send `backup` too if the primary has not answered `after`.
#[derive(Clone, Copy)]
struct Hedge<'a> {
    after: std::time::Duration,
    backup: &'a RouteConfig,
}

/// The strategy's hedge request (typed since WIT 0.2.0; a 0.1.0 strategy's `;hedge=<ms>@<index>`
/// metadata suffix is turned into one by the strategy host). Never for pinned plans.
fn hedge_of<'a>(plan: &Plan, routes: &'a [RouteConfig]) -> Option<Hedge<'a>> {
    if plan.pinned || plan.max_attempts < 2 {
        return None;
    }
    let hedge = plan.hedge?;
    let backup = routes.iter().find(|r| r.index == hedge.backup)?;
    let first = plan.order.first().and_then(|&p| routes.get(p))?;
    if first.index == hedge.backup {
        return None;
    }
    Some(Hedge {
        after: std::time::Duration::from_millis(u64::from(hedge.after_ms)),
        backup,
    })
}

struct HedgedOutcome<'a> {
    route: &'a RouteConfig,
    ticket: Ticket,
    result: Result<Partial, AttemptError>,
    started: Instant,
    /// Failures booked while racing.
    failures: Vec<FailedAttempt>,
    /// The backup, when it was sent: it is not tried again.
    hedged: Option<&'a RouteConfig>,
}

impl<'a> HedgedOutcome<'a> {
    fn single(
        route: &'a RouteConfig,
        ticket: Ticket,
        result: Result<Partial, AttemptError>,
        started: Instant,
    ) -> Self {
        Self {
            route,
            ticket,
            result,
            started,
            failures: Vec::new(),
            hedged: None,
        }
    }
}

/// Tries the plan's routes in order for a chat request in any dialect.
pub async fn chat(
    client: &UpstreamClient,
    ctx: &RoutingContext,
    caller: Option<Arc<str>>,
    model: &Arc<ModelEntry>,
    inbound: &Inbound,
    plan: Plan,
) -> Result<Answer, DispatchError> {
    let health = &ctx.health;
    let mut failed: Vec<FailedAttempt> = Vec::new();
    let mut excluded = plan.excluded.clone();
    let routes = model.routes();
    let attempts = AttemptContext {
        client,
        ctx,
        caller: &caller,
        model,
        inbound,
        plan: &plan,
    };
    let mut hedge = hedge_of(&plan, routes);
    let mut sent_backup: Option<u32> = None;
    for (n, &position) in plan.order.iter().enumerate() {
        if failed.len() >= plan.max_attempts {
            not_tried(&mut excluded, routes, &plan.order[n..], plan.max_attempts);
            break;
        }
        let Some(route) = routes.get(position) else {
            continue;
        };
        if sent_backup == Some(route.index) {
            continue;
        }
        let Some(ticket) = admit(ctx, route, &plan, &mut excluded) else {
            continue;
        };
        let outcome = match hedge.take() {
            Some(h) => attempts.hedged(route, ticket, h, &mut excluded).await,
            None => {
                let (result, started) = attempts.attempt(route, ticket).await;
                HedgedOutcome::single(route, ticket, result, started)
            }
        };
        failed.extend(outcome.failures);
        sent_backup = outcome.hedged.map(|r| r.index);
        let (route, ticket, started) = (outcome.route, outcome.ticket, outcome.started);
        match outcome.result {
            Ok(answer) => {
                if let Partial::Complete { usage, .. } = &answer {
                    health.record(&route.endpoint_id, ticket, Outcome::Success, None);
                    let prompt = if usage.input_tokens > 0 {
                        u64::from(usage.input_tokens)
                    } else {
                        u64::from(inbound.prompt_tokens)
                    };
                    ctx.prefill.remember(
                        caller.as_deref(),
                        &route.endpoint_id,
                        prompt,
                        Instant::now(),
                    );
                    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
                    report(
                        &model.router,
                        observation(
                            route,
                            &plan,
                            inbound,
                            true,
                            Some(elapsed),
                            started,
                            *usage,
                            200,
                        ),
                    );
                }
                bind_key(ctx, caller.as_ref(), route, &plan);
                let attribution = Attribution::new(route, failed);
                return Ok(match answer {
                    Partial::Complete { body, usage } => Answer::Complete {
                        body,
                        attribution,
                        prompt_tokens: usage.input_tokens,
                        completion_tokens: usage.output_tokens,
                    },
                    Partial::Stream { events, summary } => Answer::Stream {
                        events,
                        attribution,
                        summary,
                    },
                });
            }
            Err(e) => {
                attempts.failed(route, ticket, started, &e);
                failed.push(FailedAttempt::new(route, &e));
            }
        }
    }
    Err(DispatchError {
        attempts: failed,
        excluded,
    })
}

/// Tries the plan's routes for an embeddings request (OpenAI-compatible upstreams, no streaming,
/// no translation).
pub async fn embeddings(
    client: &UpstreamClient,
    ctx: &RoutingContext,
    model: &Arc<ModelEntry>,
    body: &serde_json::Map<String, serde_json::Value>,
    plan: Plan,
) -> Result<(Bytes, Attribution), DispatchError> {
    let mut failed = Vec::new();
    let mut excluded = plan.excluded.clone();
    for (n, &position) in plan.order.iter().enumerate() {
        if failed.len() >= plan.max_attempts {
            not_tried(
                &mut excluded,
                model.routes(),
                &plan.order[n..],
                plan.max_attempts,
            );
            break;
        }
        let Some(route) = model.routes().get(position) else {
            continue;
        };
        let Some(ticket) = admit(ctx, route, &plan, &mut excluded) else {
            continue;
        };
        ctx.quota.count_request(&route.endpoint_id); // local quota counter (routing::quota)
        let mut upstream = body.clone();
        upstream.insert(
            "model".into(),
            serde_json::Value::String(route.provider_model_id.clone()),
        );
        let url = format!("{}/embeddings", route.base_url);
        let sent = client
            .post_json(
                &url,
                UpstreamAuth::Bearer(plan.credential.as_deref().or(route.api_key.as_deref())),
                serde_json::to_vec(&upstream).unwrap_or_default(),
            )
            .await;
        let result = match sent {
            Ok(response) => client.read_body(response).await.and_then(|b| {
                serde_json::from_slice::<serde_json::Value>(&b)
                    .ok()
                    .filter(|v| v.get("data").is_some_and(|d| d.is_array()))
                    .map(|_| b)
                    .ok_or_else(|| AttemptError::InvalidResponse("no `data` array".into()))
            }),
            Err(e) => Err(e),
        };
        match result {
            Ok(bytes) => {
                ctx.health
                    .record(&route.endpoint_id, ticket, Outcome::Success, None);
                // No key binding: embeddings have no prompt cache to keep warm.
                let attribution = Attribution::new(route, failed);
                let model_name = body
                    .get("model")
                    .and_then(|m| m.as_str())
                    .unwrap_or_default();
                return Ok((
                    rename_model(bytes, &route.provider_model_id, model_name),
                    attribution,
                ));
            }
            Err(e) => {
                let outcome = key_outcome(ctx, route, &plan, &e).unwrap_or_else(|| outcome_of(&e));
                ctx.health
                    .record(&route.endpoint_id, ticket, outcome, Some(&e.to_string()));
                failed.push(FailedAttempt::new(route, &e));
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
        usage: ir::Usage,
    },
    Stream {
        events: EventStream,
        summary: tokio::sync::oneshot::Receiver<StreamSummary>,
    },
}

async fn complete(
    client: &UpstreamClient,
    response: reqwest::Response,
    route: &RouteConfig,
    dialect: Dialect,
    inbound: &Inbound,
) -> Result<Partial, AttemptError> {
    let body = client.read_body(response).await?;
    let parsed = dialect
        .parse_response(&body)
        .map_err(AttemptError::InvalidResponse)?;
    let usage = parsed.usage;
    let body = if dialect == inbound.dialect {
        rename_model(body, &route.provider_model_id, &inbound.request.model)
    } else {
        Bytes::from(
            inbound
                .dialect
                .build_response(&parsed, &inbound.request.model),
        )
    };
    Ok(Partial::Complete { body, usage })
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

#[allow(clippy::too_many_arguments)]
async fn open_stream(
    response: reqwest::Response,
    model: &Arc<ModelEntry>,
    route: &RouteConfig,
    dialect: Dialect,
    inbound: &Inbound,
    plan: &Plan,
    started: Instant,
    accounting: StreamAccounting,
) -> Result<Partial, AttemptError> {
    let mut events = sse::events(Box::pin(response.bytes_stream()));
    // Until the first event nothing has reached the client, so a failure here can still fall back.
    let first = match events.next().await {
        Some(Ok(event)) => event,
        Some(Err(e)) => return Err(AttemptError::EmptyStream(e.to_string())),
        None => return Err(AttemptError::EmptyStream("no events".into())),
    };
    let passthrough = dialect == inbound.dialect;
    let (summary_tx, summary) = tokio::sync::oneshot::channel();
    let mut relay = StreamRelay {
        upstream: Box::pin(events),
        decoder: dialect.decoder(),
        encoder: (!passthrough).then(|| {
            inbound
                .dialect
                .encoder_for(&inbound.request.model, &inbound.request)
        }),
        client_dialect: inbound.dialect,
        pending: std::collections::VecDeque::new(),
        router: model.router.clone(),
        route_index: route.index,
        rename: ModelRename::new(&route.provider_model_id, &inbound.request.model),
        public_model: inbound.request.model.clone(),
        strategy_metadata: plan.strategy_metadata.clone(),
        prompt_tokens: inbound.prompt_tokens,
        started,
        first_token: None,
        usage: ir::Usage::default(),
        upstream_error: None,
        finished: false,
        summary: Some(summary_tx),
        outcome: Some(accounting),
        accounting: None,
    };
    relay.relay(first);
    Ok(Partial::Stream {
        events: Box::pin(relay),
        summary,
    })
}

/// Largest chunk the relay gathers from frames that are ready together.
const BATCH_BYTES: usize = 16 * 1024;

type UpstreamEvents = Pin<Box<dyn Stream<Item = Result<SseEvent, reqwest::Error>> + Send>>;

/// Relays upstream SSE events to the client as they come — verbatim (model renamed) when the
/// dialects match, else re-encoded — decoding each one to note the first token, usage and errors,
/// and reporting the observation when the stream ends.
struct StreamRelay {
    upstream: UpstreamEvents,
    decoder: Decoder,
    /// `None` when the client speaks the upstream's dialect (pass-through).
    encoder: Option<Encoder>,
    client_dialect: Dialect,
    pending: std::collections::VecDeque<Bytes>,
    router: Arc<ModelRouter>,
    route_index: u32,
    /// The upstream's model name to the public one, in every verbatim frame.
    rename: ModelRename,
    public_model: String,
    strategy_metadata: String,
    prompt_tokens: u32,
    started: Instant,
    first_token: Option<f64>,
    usage: ir::Usage,
    /// Set when the upstream's stream reported an error event.
    upstream_error: Option<String>,
    finished: bool,
    summary: Option<tokio::sync::oneshot::Sender<StreamSummary>>,
    /// Health outcome not yet reported.
    outcome: Option<StreamAccounting>,
    /// Kept after the health outcome, to remember the prompt when the stream completes.
    accounting: Option<StreamAccounting>,
}

impl StreamRelay {
    /// Queues what one upstream event becomes for the client.
    fn relay(&mut self, event: SseEvent) {
        if self.encoder.is_none()
            && self.first_token.is_some()
            && self
                .decoder
                .may_skip_after_first_token(&event.event, &event.data)
        {
            let frame = self.verbatim(event);
            self.pending.push_back(frame);
            return;
        }
        let decoded = self.decoder.decode(&event.event, &event.data);
        self.account(&decoded);
        match &mut self.encoder {
            Some(encoder) => self.pending.extend(encoder.encode_all(&decoded)),
            None => self.pending.push_back(self.verbatim(event)),
        }
    }

    /// The upstream's own frame, with the public model name, written in one buffer.
    fn verbatim(&self, event: SseEvent) -> Bytes {
        let mut out = Vec::with_capacity(event.data.len() + event.event.len() + 48);
        if !event.event.is_empty() && event.event != "message" {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(event.event.as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(b"data: ");
        self.rename.apply_into(event.data.as_bytes(), &mut out);
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    fn account(&mut self, events: &[StreamEvent]) {
        for event in events {
            match event {
                StreamEvent::TextDelta(_)
                | StreamEvent::ReasoningDelta(_)
                | StreamEvent::ToolCallStart { .. }
                | StreamEvent::ToolCallDelta { .. }
                    if self.first_token.is_none() =>
                {
                    self.first_token = Some(self.started.elapsed().as_secs_f64() * 1000.0);
                    // A content or tool-call delta makes the stream a success; a role delta
                    // does not.
                    if let Some(mut o) = self.outcome.take() {
                        o.ctx
                            .health
                            .record(&o.endpoint_id, o.ticket, Outcome::Success, None);
                        // Prefill is over once tokens flow; a long decode is not prefill pressure.
                        o.lease.release();
                        self.accounting = Some(o);
                    }
                }
                StreamEvent::Usage(u) => self.usage = *u,
                StreamEvent::Error { message, .. } => {
                    self.upstream_error = Some(message.clone());
                }
                _ => {}
            }
        }
    }

    /// The client's error frame for a stream that broke after its first event.
    fn error_frames(&mut self, message: String) -> Vec<Bytes> {
        let event = StreamEvent::Error {
            status: 502,
            message,
        };
        match &mut self.encoder {
            Some(encoder) => encoder.encode(&event),
            None => self
                .client_dialect
                .encoder(&self.public_model)
                .encode(&event),
        }
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
        if let Some(a) = self.accounting.take()
            && success
        {
            // Only a completed prompt becomes a warm-continuation hint.
            let prompt = if self.usage.input_tokens > 0 {
                u64::from(self.usage.input_tokens)
            } else {
                a.prompt_tokens
            };
            a.ctx
                .prefill
                .remember(a.caller.as_deref(), &a.endpoint_id, prompt, Instant::now());
        }
        let latency = self.started.elapsed().as_secs_f64() * 1000.0;
        if let Some(tx) = self.summary.take() {
            let _ = tx.send(StreamSummary {
                ttft_ms: self.first_token,
                latency_ms: latency,
                prompt_tokens: self.usage.input_tokens,
                completion_tokens: self.usage.output_tokens,
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
                prompt_tokens: if self.usage.input_tokens > 0 {
                    self.usage.input_tokens
                } else {
                    self.prompt_tokens
                },
                completion_tokens: self.usage.output_tokens,
                cached_prompt_tokens: self.usage.cached_input_tokens,
                status: 200,
                strategy_metadata: std::mem::take(&mut self.strategy_metadata),
                now_ms: super::unix_ms(),
            },
        );
    }
}

impl Stream for StreamRelay {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        // Frames that are ready together leave as one chunk (up to BATCH_BYTES); nothing waits
        // to fill a batch, so a slow upstream's tokens still go out one by one.
        let mut batch = sse::FrameBatch::default();
        loop {
            while let Some(frame) = self.pending.pop_front() {
                batch.push(frame);
            }
            if self.finished || batch.len() >= BATCH_BYTES {
                break;
            }
            match self.upstream.as_mut().poll_next(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Ok(event))) => self.relay(event),
                Poll::Ready(None) => {
                    // The decoder knows whether the answer was complete.
                    let closing = self.decoder.finish();
                    self.account(&closing);
                    if let Some(encoder) = &mut self.encoder {
                        let frames = encoder.encode_all(&closing);
                        self.pending.extend(frames);
                    } else if let Some(StreamEvent::Error { message, .. }) = closing
                        .iter()
                        .find(|e| matches!(e, StreamEvent::Error { .. }))
                    {
                        // Cut off without its terminal event: say so in the client's dialect.
                        let frames = self.error_frames(message.clone());
                        self.pending.extend(frames);
                    }
                    let error = self.upstream_error.clone();
                    self.finish(error);
                }
                Poll::Ready(Some(Err(e))) => {
                    // Bytes already reached the client: end with an error event, never fall back.
                    tracing::warn!("upstream stream broke after its first event: {e}");
                    let message = format!("upstream stream failed: {e}");
                    let frames = self.error_frames(message.clone());
                    self.pending.extend(frames);
                    self.finish(Some(message));
                }
            }
        }
        match batch.take() {
            Some(bytes) => Poll::Ready(Some(bytes)),
            None if self.finished => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

impl Drop for StreamRelay {
    fn drop(&mut self) {
        // The lease is released by its own Drop; the probe claim must be given back.
        if let Some(o) = self.outcome.take() {
            o.ctx.health.release(&o.endpoint_id, o.ticket);
        }
        // Dropped before the upstream finished: the client went away. Not the upstream's fault,
        // so the strategy is not told; the request log is.
        if !self.finished
            && let Some(tx) = self.summary.take()
        {
            let _ = tx.send(StreamSummary {
                ttft_ms: self.first_token,
                latency_ms: self.started.elapsed().as_secs_f64() * 1000.0,
                prompt_tokens: self.usage.input_tokens,
                completion_tokens: self.usage.output_tokens,
                error: Some("client disconnected".into()),
            });
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn observation(
    route: &RouteConfig,
    plan: &Plan,
    inbound: &Inbound,
    success: bool,
    ttft_ms: Option<f64>,
    started: Instant,
    usage: ir::Usage,
    status: u16,
) -> Observation {
    Observation {
        index: route.index,
        success,
        ttft_ms,
        latency_ms: started.elapsed().as_secs_f64() * 1000.0,
        prompt_tokens: if usage.input_tokens > 0 {
            usage.input_tokens
        } else {
            inbound.prompt_tokens
        },
        completion_tokens: usage.output_tokens,
        cached_prompt_tokens: usage.cached_input_tokens,
        status,
        strategy_metadata: plan.strategy_metadata.clone(),
        now_ms: super::unix_ms(),
    }
}

/// Replaces the upstream's model name with the public one without re-serialising the JSON: the
/// client asked for the public name and should not learn which deployment answered.
pub fn rename_model(body: Bytes, provider_model_id: &str, public_model: &str) -> Bytes {
    ModelRename::new(provider_model_id, public_model).apply(body)
}

/// Hands an observation to the strategy. `observe` is a short synchronous wasm call that almost
/// always completes in its first poll, so it runs here; only when it has to wait (another call
/// holds the model's instance, or a guest waits on host I/O) does it become a task of its own.
/// A task per request was a wake-up of another worker thread on every request.
fn report(router: &Arc<ModelRouter>, observation: Observation) {
    let router = router.clone();
    let mut call = Box::pin(async move { router.observe(&observation).await });
    let mut cx = Context::from_waker(std::task::Waker::noop());
    if call.as_mut().poll(&mut cx).is_pending() {
        tokio::spawn(call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_through_body_swaps_the_model_and_asks_for_usage() {
        let body = |json: serde_json::Value, include_usage: bool| {
            let serde_json::Value::Object(map) = json else {
                panic!("test bodies are objects");
            };
            let out = serde_json::to_vec(&PassThroughBody {
                body: &map,
                model: "up/model",
                include_usage,
            })
            .expect("serialises");
            serde_json::from_slice::<serde_json::Value>(&out).expect("valid JSON")
        };
        let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
        assert_eq!(
            body(
                serde_json::json!({"model": "pub", "messages": messages, "x_vendor": {"k": 1}}),
                false
            ),
            serde_json::json!({"model": "up/model", "messages": messages, "x_vendor": {"k": 1}})
        );
        assert_eq!(
            body(serde_json::json!({"model": "pub", "stream": true}), true),
            serde_json::json!({"model": "up/model", "stream": true, "stream_options": {"include_usage": true}})
        );
        // The client's own choice stands; other options are kept.
        assert_eq!(
            body(
                serde_json::json!({"model": "pub", "stream_options": {"include_usage": false, "other": 1}}),
                true
            ),
            serde_json::json!({"model": "up/model", "stream_options": {"include_usage": false, "other": 1}})
        );
        assert_eq!(
            body(
                serde_json::json!({"model": "pub", "stream_options": null}),
                true
            ),
            serde_json::json!({"model": "up/model", "stream_options": {"include_usage": true}})
        );
    }

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
}
