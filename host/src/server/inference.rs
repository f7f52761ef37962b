//! The dispatching endpoints: Chat Completions, Responses and Anthropic Messages (one pipeline,
//! through the IR), embeddings, and Anthropic's token counting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::config::Capability;
use crate::gateway::Gateway;
use crate::protocol::inbound::Inbound;
use crate::protocol::{self, Dialect};
use crate::routing::dispatch::{self, Answer, AttemptLog, Attribution};
use crate::routing::select::{self, DecisionRecord, RequestFacts};
use crate::routing::table::ModelEntry;
use crate::store::api_log::ApiLogRow;
use crate::telemetry::metrics::{self, Operation};
use crate::telemetry::trace::{RequestTrace, Served};
use crate::upstream::upstream_dialect;

use super::answered::AnsweredBody;
use super::auth::{self, Principal};
use super::budget::BudgetCharge;
use super::rate_limit::{self, Admitted};
use super::{
    GatewayError, attributed_row, caller, clamp_i32, failed_attempts_json, log_request,
    with_attempts,
};
use crate::entity::{Budget, RateLimitConfig};
use crate::inbound_routes::{Endpoint, RouteMatch};

/// What authentication and the inbound route decided for one request.
struct Admission {
    principal: Principal,
    max_attempts: usize,
    route_name: String,
    route_id: String,
    /// The route's `rate-limit` plugin (see [`crate::inbound_routes::InboundRoute::rate_limit`]).
    rate_limit: Option<Result<Arc<RateLimitConfig>, String>>,
    /// The budgets of the caller's consumer (its own, then its groups'); empty without one.
    budgets: Arc<[Budget]>,
}

/// What a request admitted by its route's limits and its budgets carries to its end.
struct Cleared {
    /// The rate limits' reservation (`None`: the route has no `rate-limit` plugin).
    limits: Option<Admitted>,
    /// The charge to the caller's budgets, booked when dropped (`None`: no budgets).
    charge: Option<BudgetCharge>,
}

impl Admission {
    /// Routing facts common to every endpoint.
    fn facts(&self, gateway: &Gateway, caller: &caller::Caller, call: Capability) -> RequestFacts {
        RequestFacts {
            remaining_budget_usd: gateway.budgets.remaining(&self.budgets),
            caller: caller.key.clone(),
            caller_hash: caller.hash,
            call,
            groups: Some(self.principal.groups.clone()),
            max_attempts: Some(self.max_attempts),
            role: self.principal.role,
            own_credential: self.principal.upstream_credential.is_some(),
            ..RequestFacts::default()
        }
    }

    /// The request-log fields that come from the route and the caller.
    fn log_row(&self) -> ApiLogRow {
        ApiLogRow {
            route: Some(self.route_name.clone()),
            consumer: self.principal.consumer_name.clone(),
            request_id: crate::telemetry::request_id::current().map(|id| id.as_str().to_owned()),
            ..ApiLogRow::default()
        }
    }

    fn credential(&self) -> Option<Arc<str>> {
        self.principal.upstream_credential.as_deref().map(Arc::from)
    }

    /// Admits one request to `model` before any upstream is contacted: the caller's budgets
    /// (a spent hard budget refuses with 402), then the route's rate limits (checked and
    /// reserved). A refusal is logged (request log, metrics) here; the caller only returns it.
    #[allow(clippy::too_many_arguments)]
    async fn admit(
        &self,
        gateway: &Gateway,
        caller: &caller::Caller,
        model: &ModelEntry,
        prompt_tokens: u32,
        started: Instant,
        dialect: Dialect,
        operation: Operation,
    ) -> Result<Cleared, GatewayError> {
        let admitted = match gateway.budgets.check(&self.budgets) {
            Ok(()) => self.limit(gateway, caller, model, prompt_tokens).await,
            Err(refused) => {
                metrics::budget_refused(refused.scope);
                Err(GatewayError::BudgetExceeded(Box::new(refused)))
            }
        };
        match admitted {
            Ok(limits) => Ok(Cleared {
                limits,
                charge: gateway.budgets.charge_on_drop(&self.budgets),
            }),
            Err(e) => {
                record_failure(
                    gateway,
                    self.log_row(),
                    model,
                    &e,
                    started,
                    dialect,
                    operation,
                );
                Err(e)
            }
        }
    }

    /// Checks and reserves the route's rate limits for one request to `model`, before any
    /// upstream is contacted; `None` when the route has no `rate-limit` plugin.
    async fn limit(
        &self,
        gateway: &Gateway,
        caller: &caller::Caller,
        model: &ModelEntry,
        prompt_tokens: u32,
    ) -> Result<Option<Admitted>, GatewayError> {
        let Some(config) = &self.rate_limit else {
            return Ok(None);
        };
        let config = config
            .as_ref()
            .map_err(|message| GatewayError::RateLimitMisconfigured {
                route: self.route_name.clone(),
                message: message.clone(),
            })?;
        let subject = rate_limit::Subject {
            route_id: &self.route_id,
            consumer_id: self.principal.consumer_id.as_deref(),
            key_id: self.principal.key_id.as_deref(),
            consumer_groups: &self.principal.consumer_groups,
            caller: caller.key.as_deref(),
            model: &model.config.id,
        };
        match rate_limit::admit(&gateway.limits, config, &subject, prompt_tokens).await {
            Ok(admitted) => Ok(Some(admitted)),
            Err(refused) => {
                metrics::rate_limited(&self.route_name, &refused.limit);
                Err(GatewayError::RateLimited(Box::new(refused)))
            }
        }
    }
}

/// A whole JSON answer whose request's bookkeeping, `after`, runs once it is written (see
/// [`AnsweredBody`]), in the request's scope: its access line names the request.
fn answered(
    body: bytes::Bytes,
    rate_headers: Option<rate_limit::RateHeaders>,
    after: impl FnOnce() + Send + Unpin + 'static,
) -> Response {
    let scope = crate::telemetry::request_id::current_scope();
    let after = move || match scope {
        Some(scope) => scope.run(after),
        None => after(),
    };
    let mut response = Response::new(Body::new(AnsweredBody::new(body, after)));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(headers) = rate_headers {
        headers.apply(h);
    }
    response
}

/// Every inference path: finds the inbound route by longest prefix, the endpoint by the rest of
/// the path, authenticates, and hands over to the endpoint. Errors come in the protocol of the
/// endpoint asked for (Anthropic's shape under `/messages`).
pub async fn handle(
    State(gateway): State<Arc<Gateway>>,
    request: axum::extract::Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let routes = gateway.inbound_routes();
    let path = parts.uri.path();
    let (route, endpoint) = match routes.lookup(path) {
        RouteMatch::Route { route, path: rest } => match Endpoint::of(rest) {
            Some(endpoint) => (route, endpoint),
            None => return GatewayError::NotFound(path.to_owned()).response_in(dialect_of(path)),
        },
        RouteMatch::Disabled(route) => {
            return GatewayError::RouteDisabled(route.name.clone()).response_in(dialect_of(path));
        }
        RouteMatch::None => {
            return GatewayError::NotFound(path.to_owned()).response_in(dialect_of(path));
        }
    };
    let dialect = match endpoint {
        Endpoint::Messages | Endpoint::CountTokens => Dialect::AnthropicMessages,
        Endpoint::Responses => Dialect::OpenAiResponses,
        _ => Dialect::OpenAiChat,
    };
    if parts.method.as_str() != endpoint.method() {
        return GatewayError::MethodNotAllowed {
            path: parts.uri.path().to_owned(),
            allowed: endpoint.method(),
        }
        .response_in(dialect);
    }
    let snapshot = gateway.snapshot();
    let principal = match auth::authenticate(
        route,
        &parts.headers,
        &snapshot,
        gateway.config.server.admin_token.as_deref(),
        crate::entity::now(),
    ) {
        Ok(p) => p,
        Err(e) => {
            tracing::info!(
                target: "switchyard::access",
                route = %route.name,
                status = 401,
                "authentication failed: {e}"
            );
            return GatewayError::from(e).response_in(dialect);
        }
    };
    let budgets: Arc<[Budget]> = match &principal.consumer_id {
        Some(id) => snapshot
            .budgets_of(id, &principal.consumer_groups)
            .cloned()
            .collect(),
        None => Arc::from([]),
    };
    let admission = Admission {
        principal,
        max_attempts: route.max_attempts,
        route_name: route.name.clone(),
        route_id: route.id.clone(),
        rate_limit: route.rate_limit.clone(),
        budgets,
    };
    drop(snapshot);
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let body = match read_body(&gateway, body, length).await {
        Ok(b) => b,
        Err(e) => return e.response_in(dialect),
    };
    let extensions = parts.extensions;
    let headers = parts.headers;
    let trace = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Responses | Endpoint::Messages => {
            RequestTrace::start(&headers, Operation::Chat)
        }
        Endpoint::Embeddings => RequestTrace::start(&headers, Operation::Embeddings),
        Endpoint::CountTokens | Endpoint::Models => RequestTrace::default(),
    };
    let serve = async {
        match endpoint {
            Endpoint::ChatCompletions | Endpoint::Responses | Endpoint::Messages => {
                // Boxed once here, so the handler's future (moved by axum and hyper) stays small.
                Box::pin(serve_chat(
                    &gateway,
                    dialect,
                    &admission,
                    &extensions,
                    &headers,
                    body,
                    &trace,
                ))
                .await
            }
            Endpoint::Embeddings => {
                Box::pin(serve_embeddings(
                    &gateway,
                    &admission,
                    &extensions,
                    &headers,
                    &body,
                    &trace,
                ))
                .await
            }
            Endpoint::CountTokens => count_tokens(&gateway, &admission, &body).await,
            Endpoint::Models => {
                Ok(super::list_models(&gateway, &admission.principal).into_response())
            }
        }
    };
    // Past the shutdown grace, a request still waiting for its upstream gets a 503 in its dialect.
    let served = tokio::select! {
        served = serve => served,
        () = gateway.drain.closing() => Err(shutting_down(&gateway)),
    };
    let response = served.unwrap_or_else(|e| {
        trace.answered(e.status().as_u16(), Some(e.error_type()));
        e.response_in(dialect)
    });
    if response.status().is_success() {
        trace.answered(response.status().as_u16(), None);
    }
    with_budget_header(response, &gateway, &admission.budgets)
}

/// Every answer to a caller with budgets says how much is left: the smallest remaining among
/// them, USD with 6 decimals (below 0 once a soft budget, or a hard one by the requests in
/// flight, was passed).
fn with_budget_header(mut response: Response, gateway: &Gateway, budgets: &[Budget]) -> Response {
    if let Some(remaining) = gateway.budgets.remaining(budgets)
        && let Ok(value) = HeaderValue::from_str(&format!("{remaining:.6}"))
    {
        response
            .headers_mut()
            .insert("x-switchyard-budget-remaining-usd", value);
    }
    response
}

/// The dialect a path's client speaks before an endpoint is known: a path with a `messages`
/// segment is an Anthropic client's (a disabled route or a typo under `/v1/messages` still answers
/// in Anthropic's error shape), one with `responses` a Responses client's, any other OpenAI's.
fn dialect_of(path: &str) -> Dialect {
    let mut segments = path.split('/');
    if segments.clone().any(|s| s == "messages") {
        Dialect::AnthropicMessages
    } else if segments.any(|s| s == "responses") {
        Dialect::OpenAiResponses
    } else {
        Dialect::OpenAiChat
    }
}

/// The whole body, within `server.max_body_mib` and `server.request_body_timeout_seconds`, in one
/// buffer sized from its `Content-Length`. Collecting the chunks and then joining them (as
/// `axum::body::to_bytes` does) held a large body twice.
pub(super) async fn read_body(
    gateway: &Gateway,
    body: Body,
    length: Option<usize>,
) -> Result<bytes::Bytes, GatewayError> {
    use futures::StreamExt;
    let server = &gateway.config.server;
    let limit = server.max_body_bytes;
    // A chunk that does not parse, or a stream that broke: reported as what it is (it was a 413
    // before, which sent clients looking for a size limit they had not reached).
    let unreadable = |e: axum::Error| GatewayError::BodyUnreadable(e.into_inner().to_string());
    let within = server.edge.request_body_timeout;
    let read = async {
        let mut chunks = body.into_data_stream();
        // A body read with its head (server/http1.rs) comes as one piece: it is the body, with
        // no copy.
        let first = match chunks.next().await {
            None => return Ok(bytes::Bytes::new()),
            Some(chunk) => chunk.map_err(unreadable)?,
        };
        if first.len() > limit {
            return Err(GatewayError::BodyTooLarge(limit >> 20));
        }
        let Some(second) = chunks.next().await else {
            return Ok(first);
        };
        let mut out = Vec::with_capacity(length.unwrap_or(0).min(limit));
        out.extend_from_slice(&first);
        let mut rest = futures::stream::iter([second]).chain(chunks);
        while let Some(chunk) = rest.next().await {
            let chunk = chunk.map_err(unreadable)?;
            if out.len() + chunk.len() > limit {
                return Err(GatewayError::BodyTooLarge(limit >> 20));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(bytes::Bytes::from(out))
    };
    match tokio::time::timeout(within, read).await {
        Ok(read) => read,
        Err(_) => Err(GatewayError::BodyTimeout(within.as_secs_f64())),
    }
}

fn shutting_down(gateway: &Gateway) -> GatewayError {
    GatewayError::ShuttingDown(gateway.config.server.edge.shutdown_grace.as_secs_f64())
}

/// A request between the choice of its model and its upstream's answer. Dropped before
/// [`Waiting::answered`] means the client went away (hyper drops the handler when the connection
/// closes) or the drain deadline cut it: it still gets its request-log row and access line, with
/// what it waited. The row is built only then: an answered request (nearly every one) built it
/// for nothing.
struct Waiting<'a> {
    gateway: &'a Gateway,
    admission: &'a Admission,
    model: &'a ModelEntry,
    /// The decision and the attempts sent so far, once the dispatch started.
    dispatch: Option<(DecisionRecord, AttemptLog)>,
    answered: bool,
    started: Instant,
    /// For the request metrics of an abandoned request.
    dialect: Dialect,
    operation: Operation,
}

impl<'a> Waiting<'a> {
    fn new(
        gateway: &'a Gateway,
        admission: &'a Admission,
        model: &'a ModelEntry,
        started: Instant,
        dialect: Dialect,
        operation: Operation,
    ) -> Self {
        Waiting {
            gateway,
            admission,
            model,
            dispatch: None,
            answered: false,
            started,
            dialect,
            operation,
        }
    }

    /// The dispatch starts: an abandoned request's row gets its decision and attempts too.
    fn dispatching(&mut self, decision: DecisionRecord, attempts: &AttemptLog) {
        self.dispatch = Some((decision, attempts.clone()));
    }

    /// The upstream answered (or the attempts failed): the normal path logs the request, with the
    /// decision handed back.
    fn answered(mut self) -> Option<DecisionRecord> {
        self.answered = true;
        self.dispatch.take().map(|(decision, _)| decision)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let (decision, attempts) = self.dispatch.take().unzip();
        let row = with_decision(
            ApiLogRow {
                model: self.model.config.id.clone(),
                ..self.admission.log_row()
            },
            decision.as_ref(),
            self.model,
        );
        let waited = self.started.elapsed();
        // 499: the client closed the request (nginx's code); 503 when the shutdown cut it.
        let closing = self.gateway.drain.is_closing();
        let (status, error): (u16, _) = if closing {
            (503, shutting_down(self.gateway).to_string())
        } else {
            (
                499,
                "the client closed the connection before the upstream answered".to_owned(),
            )
        };
        // Nobody hears this answer, but it is one the gateway gave up on: counted like the others,
        // with no upstream (the attempt in flight was cancelled, so it has no outcome).
        metrics::request_done(&metrics::RequestDone {
            model: &row.model,
            operation: self.operation,
            inbound_protocol: self.dialect.as_str(),
            upstream_protocol: "none",
            endpoint: "none",
            status,
            duration: waited,
            time_to_first_token: None,
            output_tokens: 0,
            attempts: 0,
        });
        // The 503 is an answer `handle` still sends (and counts as an error there); the 499 is not.
        if !closing {
            metrics::request_error("caller_disconnected", self.dialect.as_str(), status);
        }
        tracing::info!(
            target: "switchyard::access",
            model = %row.model,
            status,
            latency_ms = waited.as_millis() as u64,
            "{error}"
        );
        let row = match &attempts {
            Some(attempts) => with_attempts(row, attempts),
            None => row,
        };
        self.gateway.record(ApiLogRow {
            status: i32::from(status),
            latency_ms: waited.as_secs_f64() * 1000.0,
            error: Some(error),
            ..row
        });
    }
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

/// A published model with routes, by id or alias, that has a route in one of the caller's groups.
/// A model waiting for its strategy waits while strategies load (`strategies.load_wait_ms`).
async fn published_model(
    gateway: &Gateway,
    name: &str,
    principal: &Principal,
) -> Result<Arc<ModelEntry>, GatewayError> {
    let model = gateway
        .model(name)
        .await
        .map_err(|pending| GatewayError::StrategyLoading {
            model: name.to_owned(),
            strategy: pending.strategy.clone(),
            reason: pending.reason.clone(),
        })?
        .filter(|m| m.config.published && !m.upstreams().is_empty())
        .ok_or_else(|| GatewayError::ModelNotFound(name.to_owned()))?;
    if !model
        .upstreams()
        .iter()
        .any(|r| principal.groups.contains(&r.group))
    {
        return Err(GatewayError::ModelNotInGroups {
            model: name.to_owned(),
            groups: if principal.groups.is_empty() {
                "none: the route, consumer and key groups have nothing in common".into()
            } else {
                principal.groups.join(", ")
            },
        });
    }
    Ok(model)
}

/// The operator's route pin (`X-Route-Pin`), looked up on every request.
const X_ROUTE_PIN: axum::http::HeaderName = axum::http::HeaderName::from_static("x-route-pin");

/// Who is calling and whether an operator pinned a route.
fn caller_and_pin<'h>(
    gateway: &Gateway,
    admission: &Admission,
    extensions: &axum::http::Extensions,
    headers: &'h HeaderMap,
) -> (caller::Caller, Option<&'h str>) {
    // X-Route-Pin is an operator's debugging tool: honoured for admin callers only.
    let pin = headers
        .get(&X_ROUTE_PIN)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter(|_| {
            admission.principal.admin
                || auth::presents_admin_token(gateway.config.server.admin_token.as_deref(), headers)
        });
    let caller = caller::identify(
        headers,
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| *addr),
        &gateway.config.server.trusted_proxies,
    );
    (caller, pin)
}

async fn serve_chat(
    gateway: &Arc<Gateway>,
    dialect: Dialect,
    admission: &Admission,
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
    body: bytes::Bytes,
    trace: &RequestTrace,
) -> Result<Response, GatewayError> {
    let started = Instant::now();
    // The IR is read from the body without a tree of the whole of it, within the configured
    // limits; `Inbound::new` keeps the bytes for upstreams of the same dialect, which get them
    // nearly verbatim, and the IR's messages for the others.
    let (request, fields) = dialect
        .parse_request_fields(&body, gateway.config.server.request_limits)
        .map_err(|e| GatewayError::InvalidBody(e.to_string()))?;
    trace.model(&request.model);
    let model = published_model(gateway, &request.model, &admission.principal).await?;
    let (caller, pin) = caller_and_pin(gateway, admission, extensions, headers);
    let modalities = request.modalities();
    let upstreams = model.upstreams().iter().map(|u| upstream_dialect(u.kind));
    let inbound = Inbound::new(dialect, request, body, fields, upstreams);
    let facts = RequestFacts {
        prompt_tokens: inbound.prompt_tokens,
        max_tokens: inbound.request.max_output_tokens,
        stream: inbound.request.stream,
        modalities,
        ..admission.facts(gateway, &caller, capability(dialect))
    };
    let Cleared { limits, mut charge } = admission
        .admit(
            gateway,
            &caller,
            &model,
            inbound.prompt_tokens,
            started,
            dialect,
            Operation::Chat,
        )
        .await?;
    let mut waiting = Waiting::new(
        gateway,
        admission,
        &model,
        started,
        dialect,
        Operation::Chat,
    );
    let mut plan = match select::select(&model, &facts, &gateway.routing, pin).await {
        Ok(plan) => plan,
        Err(e) => {
            waiting.answered();
            // Nothing was sent: the prompt's tokens are given back.
            if let Some(l) = limits {
                l.refund();
            }
            return Err(e.into());
        }
    };
    plan.credential = admission.credential();
    traced_decision(trace, &model, &plan);
    let strategy_error = plan.strategy_error.clone();
    let attempts = AttemptLog::default();
    if let Some(charge) = &mut charge {
        charge.track(&attempts);
    }
    waiting.dispatching(plan.decision_record(), &attempts);
    let result = Box::pin(dispatch::chat(
        gateway.upstreams(),
        &gateway.routing,
        caller.key,
        &model,
        &inbound,
        plan,
        &attempts,
        trace,
    ))
    .await;
    // The decision's JSON is written with the row: after the answer, when there is one.
    let decision = waiting.answered();
    let base = admission.log_row();
    let public = inbound.request.model.as_str();
    match result {
        Ok(Answer::Complete {
            body,
            attribution,
            prompt_tokens,
            completion_tokens,
        }) => {
            let elapsed = started.elapsed();
            let rate_headers = limits.as_ref().map(|l| l.headers);
            // What the answer's bytes do not wait for runs once they are written (see
            // `answered`).
            let gateway = gateway.clone();
            let trace = trace.clone();
            let after = move || {
                let latency_ms = elapsed.as_secs_f64() * 1000.0;
                log_request(
                    &inbound.request.model,
                    &attribution,
                    started,
                    strategy_error.as_deref(),
                );
                trace.served(&served_by(&attribution));
                trace.usage(prompt_tokens, completion_tokens, Some(elapsed));
                served_metrics(
                    &model,
                    Operation::Chat,
                    dialect,
                    &attribution,
                    elapsed,
                    Some(elapsed),
                    completion_tokens,
                );
                let row = ApiLogRow {
                    model: model.config.id.clone(),
                    status: 200,
                    // Without streaming the whole answer is the first token.
                    ttft_ms: Some(latency_ms),
                    latency_ms,
                    prompt_tokens: Some(clamp_i32(prompt_tokens)),
                    completion_tokens: Some(clamp_i32(completion_tokens)),
                    ..attributed_row(&attribution, with_decision(base, decision.as_ref(), &model))
                };
                gateway.record(with_attempts(row, &attempts));
                if let Some(l) = limits {
                    l.settle(prompt_tokens, completion_tokens);
                }
            };
            Ok(answered(body, rate_headers, after))
        }
        Ok(Answer::Stream {
            events,
            attribution,
            summary,
        }) => {
            log_request(public, &attribution, started, strategy_error.as_deref());
            // The first event is in hand: that is the client's first token.
            let first_event = started.elapsed();
            trace.served(&served_by(&attribution));
            // The span ends with the stream, when the summary task lets go of it.
            let trace = trace.clone();
            metrics::gateway_overhead(
                model.id(),
                dialect.as_str(),
                first_event.saturating_sub(attribution.upstream_time),
            );
            let row = ApiLogRow {
                model: model.config.id.clone(),
                status: 200,
                ..attributed_row(&attribution, with_decision(base, decision.as_ref(), &model))
            };
            let logger = gateway.clone();
            let model = model.clone();
            let headers = limits.as_ref().map(|l| l.headers);
            // The stream's limits go with its summary: settled by its usage when it ends, and
            // its concurrency released then (also when the client leaves: the relay is dropped
            // and the summary resolves).
            tokio::spawn(async move {
                let Ok(s) = summary.await else { return };
                if let Some(l) = limits {
                    l.settle(s.prompt_tokens, s.completion_tokens);
                }
                request_metrics(
                    &model,
                    Operation::Chat,
                    dialect,
                    &attribution,
                    started.elapsed(),
                    Some(first_event),
                    s.completion_tokens,
                );
                trace.usage(s.prompt_tokens, s.completion_tokens, Some(first_event));
                if let Some(error) = &s.error {
                    // The client already has a 200; the failure is in the stream.
                    let error_type = if error == "client disconnected" {
                        "caller_disconnected"
                    } else {
                        "upstream_stream_failed"
                    };
                    metrics::request_error(error_type, dialect.as_str(), 200);
                    trace.stream_ended(Some(error_type));
                }
                // The relay told the attempt's ledger how it ended before it sent the summary.
                let row = ApiLogRow {
                    ttft_ms: s.ttft_ms,
                    latency_ms: s.latency_ms,
                    prompt_tokens: Some(clamp_i32(s.prompt_tokens)),
                    completion_tokens: Some(clamp_i32(s.completion_tokens)),
                    error: s.error,
                    ..row
                };
                logger.record(with_attempts(row, &attempts));
                // The stream is over: its cost goes to the caller's budgets.
                drop(charge);
            });
            let events = end_at_drain_deadline(gateway, events, dialect, public);
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
            if let Some(headers) = headers {
                headers.apply(h);
            }
            Ok(response)
        }
        Err(e) => {
            // No upstream served it: its tokens are given back.
            if let Some(l) = limits {
                l.refund();
            }
            let err = GatewayError::from(e);
            record_failure(
                gateway,
                with_attempts(with_decision(base, decision.as_ref(), &model), &attempts),
                &model,
                &err,
                started,
                dialect,
                Operation::Chat,
            );
            Err(err)
        }
    }
}

/// `row` with the routing decision written out (see [`DecisionRecord`]).
fn with_decision(
    row: ApiLogRow,
    decision: Option<&DecisionRecord>,
    model: &ModelEntry,
) -> ApiLogRow {
    ApiLogRow {
        decision: decision.map(|d| d.to_json(model)),
        ..row
    }
}

/// The routing decision, on the request's span.
fn traced_decision(trace: &RequestTrace, model: &ModelEntry, plan: &select::Plan) {
    let upstreams = model.upstreams();
    let strategy = &model.router.strategy;
    trace.decision(
        &strategy.name,
        &strategy.version,
        plan.order
            .iter()
            .filter_map(|&p| upstreams.get(p))
            .map(|u| u.endpoint_id.as_str()),
        plan.seed,
    );
}

/// Who served, for the request's span.
fn served_by(attribution: &Attribution) -> Served<'_> {
    Served {
        endpoint: &attribution.endpoint_id,
        attempts: attribution.failed_attempts.len() + 1,
    }
}

/// The request metrics of an answer that was served, and the gateway's overhead for an answer
/// that is complete when dispatch returns.
fn served_metrics(
    model: &ModelEntry,
    operation: Operation,
    dialect: Dialect,
    attribution: &Attribution,
    elapsed: Duration,
    time_to_first_token: Option<Duration>,
    output_tokens: u32,
) {
    metrics::gateway_overhead(
        model.id(),
        dialect.as_str(),
        elapsed.saturating_sub(attribution.upstream_time),
    );
    request_metrics(
        model,
        operation,
        dialect,
        attribution,
        elapsed,
        time_to_first_token,
        output_tokens,
    );
}

fn request_metrics(
    model: &ModelEntry,
    operation: Operation,
    dialect: Dialect,
    attribution: &Attribution,
    duration: Duration,
    time_to_first_token: Option<Duration>,
    output_tokens: u32,
) {
    metrics::request_done(&metrics::RequestDone {
        model: model.id(),
        operation,
        inbound_protocol: dialect.as_str(),
        upstream_protocol: attribution.provider,
        endpoint: &attribution.endpoint_id,
        status: 200,
        duration,
        time_to_first_token,
        output_tokens,
        attempts: attribution.failed_attempts.len() + 1,
    });
}

/// The client's stream, ended with an error event in its dialect if the shutdown grace runs out
/// before the upstream finishes.
fn end_at_drain_deadline(
    gateway: &Gateway,
    events: impl futures::Stream<Item = bytes::Bytes> + Send + 'static,
    dialect: Dialect,
    public_model: &str,
) -> impl futures::Stream<Item = bytes::Bytes> + Send + 'static {
    use futures::StreamExt;
    // Polled by the server after the handler returned, outside the id's task-local.
    let request_id = crate::telemetry::request_id::current();
    let state = (
        Box::pin(events),
        Box::pin(gateway.drain.closing()),
        public_model.to_owned(),
        request_id,
    );
    futures::stream::unfold(Some(state), move |state| async move {
        let (mut events, mut closing, public_model, request_id) = state?;
        tokio::select! {
            biased;
            next = events.next() => {
                next.map(|b| (b, Some((events, closing, public_model, request_id))))
            }
            () = &mut closing => {
                // Dropping the relay ends the upstream request.
                drop(events);
                let event = protocol::ir::StreamEvent::Error {
                    status: 503,
                    message: "the gateway is shutting down: the stream did not finish within the shutdown grace".into(),
                };
                let mut frames = dialect.encoder(&public_model).encode(&event);
                if let Some(id) = &request_id {
                    frames = frames
                        .into_iter()
                        .map(|f| protocol::sse::with_error_field(f, "request_id", id.as_str()))
                        .collect();
                }
                Some((bytes::Bytes::from(frames.concat()), None))
            }
        }
    })
}

/// `base`: the row's route, caller, decision and attempts.
fn record_failure(
    gateway: &Gateway,
    base: ApiLogRow,
    model: &ModelEntry,
    err: &GatewayError,
    started: Instant,
    dialect: Dialect,
    operation: Operation,
) {
    let status = err.status().as_u16();
    let rate_limited_by = err.rate_limited_by();
    match &rate_limited_by {
        Some(budget) if budget.starts_with("budget:") => tracing::info!(
            target: "switchyard::access",
            model = %model.config.id,
            status,
            rate_limited_by = %budget,
            "refused by a budget"
        ),
        Some(limit) => tracing::info!(
            target: "switchyard::access",
            model = %model.config.id,
            status,
            rate_limited_by = %limit,
            "refused by a rate limit"
        ),
        None => tracing::info!(
            target: "switchyard::access",
            model = %model.config.id,
            status,
            latency_ms = started.elapsed().as_millis() as u64,
            "all attempts failed"
        ),
    }
    let (attempts, failed_attempts) = match err {
        GatewayError::AllAttemptsFailed(d) => (d.attempts.len(), failed_attempts_json(&d.attempts)),
        _ => (0, None),
    };
    metrics::request_done(&metrics::RequestDone {
        model: model.id(),
        operation,
        inbound_protocol: dialect.as_str(),
        upstream_protocol: "none",
        endpoint: "none",
        status,
        duration: started.elapsed(),
        time_to_first_token: None,
        output_tokens: 0,
        attempts,
    });
    gateway.record(ApiLogRow {
        model: model.config.id.clone(),
        endpoint_id: None,
        attempts: attempts as i32,
        status: i32::from(status),
        latency_ms: started.elapsed().as_secs_f64() * 1000.0,
        error: Some(err.to_string()),
        failed_attempts,
        rate_limited_by,
        ..base
    });
}

/// `POST /v1/embeddings`: OpenAI-compatible routes only, forwarded without translation.
async fn serve_embeddings(
    gateway: &Arc<Gateway>,
    admission: &Admission,
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
    body: &[u8],
    trace: &RequestTrace,
) -> Result<Response, GatewayError> {
    let started = Instant::now();
    let (model_name, chars) = protocol::parse_embeddings_request(body)
        .map_err(|e| GatewayError::InvalidBody(e.to_string()))?;
    trace.model(&model_name);
    let raw = json_object(body)?;
    let model = published_model(gateway, &model_name, &admission.principal).await?;
    let (caller, pin) = caller_and_pin(gateway, admission, extensions, headers);
    let facts = RequestFacts {
        prompt_tokens: u32::try_from(chars / 4).unwrap_or(u32::MAX),
        ..admission.facts(gateway, &caller, Capability::Embeddings)
    };
    let Cleared { limits, mut charge } = admission
        .admit(
            gateway,
            &caller,
            &model,
            facts.prompt_tokens,
            started,
            Dialect::OpenAiChat,
            Operation::Embeddings,
        )
        .await?;
    let mut waiting = Waiting::new(
        gateway,
        admission,
        &model,
        started,
        Dialect::OpenAiChat,
        Operation::Embeddings,
    );
    let mut plan = match select::select(&model, &facts, &gateway.routing, pin).await {
        Ok(plan) => plan,
        Err(e) => {
            waiting.answered();
            if let Some(l) = limits {
                l.refund();
            }
            return Err(e.into());
        }
    };
    plan.credential = admission.credential();
    traced_decision(trace, &model, &plan);
    let attempts = AttemptLog::default();
    if let Some(charge) = &mut charge {
        charge.track(&attempts);
    }
    waiting.dispatching(plan.decision_record(), &attempts);
    let result = dispatch::embeddings(
        gateway.upstreams(),
        &gateway.routing,
        &model,
        &raw,
        plan,
        &attempts,
        trace,
    )
    .await;
    // The decision's JSON is written with the row: after the answer, when there is one.
    let decision = waiting.answered();
    let base = admission.log_row();
    match result {
        Ok((body, attribution)) => {
            let elapsed = started.elapsed();
            let rate_headers = limits.as_ref().map(|l| l.headers);
            // As for chat: what the answer's bytes do not wait for runs once they are written.
            let gateway = gateway.clone();
            let trace = trace.clone();
            let after = move || {
                log_request(&model_name, &attribution, started, None);
                trace.served(&served_by(&attribution));
                served_metrics(
                    &model,
                    Operation::Embeddings,
                    Dialect::OpenAiChat,
                    &attribution,
                    elapsed,
                    None,
                    0,
                );
                let row = ApiLogRow {
                    model: model.config.id.clone(),
                    status: 200,
                    latency_ms: elapsed.as_secs_f64() * 1000.0,
                    ..attributed_row(&attribution, with_decision(base, decision.as_ref(), &model))
                };
                gateway.record(with_attempts(row, &attempts));
                // An embeddings answer reports no usage here: the estimate stands; the limits'
                // concurrency is released with them.
                drop(limits);
            };
            Ok(answered(body, rate_headers, after))
        }
        Err(e) => {
            if let Some(l) = limits {
                l.refund();
            }
            let err = GatewayError::from(e);
            record_failure(
                gateway,
                with_attempts(with_decision(base, decision.as_ref(), &model), &attempts),
                &model,
                &err,
                started,
                Dialect::OpenAiChat,
                Operation::Embeddings,
            );
            Err(err)
        }
    }
}

/// `POST /v1/messages/count_tokens`, answered from the gateway's estimator (characters / 4, a flat
/// 85 per image), with nothing sent upstream.
async fn count_tokens(
    gateway: &Gateway,
    admission: &Admission,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let request = protocol::anthropic_messages::parse_count_tokens_request(
        body,
        gateway.config.server.request_limits,
    )
    .map_err(|e| GatewayError::InvalidBody(e.to_string()))?;
    published_model(gateway, &request.model, &admission.principal).await?;
    Ok(
        axum::Json(serde_json::json!({ "input_tokens": request.prompt_token_estimate() }))
            .into_response(),
    )
}
