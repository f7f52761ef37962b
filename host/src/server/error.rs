//! Request errors: each knows its HTTP status and renders itself in the client's protocol.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::protocol::Dialect;
use crate::routing::dispatch::{DispatchError, FailedAttempt};
use crate::routing::select::{Exclusion, SelectionError, describe};

/// Everything a request can fail with at the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body failed to parse or validate for its inbound protocol; nothing was sent upstream.
    #[error("invalid chat request body: {0}")]
    InvalidBody(String),
    /// The model id is neither a published model nor an alias of one.
    #[error("The model `{0}` does not exist or is not served here")]
    ModelNotFound(String),
    /// The model's strategy is not loaded: still compiling after `strategies.load_wait_ms`, not
    /// deployed to `strategies.dir` yet, or its file failed to load.
    #[error("The model `{model}` waits for its strategy `{strategy}`: {reason}")]
    StrategyLoading {
        model: String,
        strategy: String,
        reason: String,
    },
    /// No route could take the request (all excluded before any attempt).
    #[error(transparent)]
    NoRoute(#[from] SelectionError),
    /// Every attempted route failed.
    #[error(transparent)]
    AllAttemptsFailed(#[from] DispatchError),
    /// The route checks credentials and the request's did not pass.
    #[error(transparent)]
    Unauthorized(#[from] super::auth::AuthError),
    /// No route serves this path, or the path names no endpoint.
    #[error("no such endpoint: {0}")]
    NotFound(String),
    /// The longest matching route is disabled.
    #[error("the route `{0}` is disabled")]
    RouteDisabled(String),
    /// The endpoint exists but not for this method.
    #[error("{path} accepts {allowed} only")]
    MethodNotAllowed { path: String, allowed: &'static str },
    /// The body is larger than `server.max_body_mib`.
    #[error("the request body exceeds the {0} MiB limit")]
    BodyTooLarge(usize),
    /// The body's framing is broken (a chunk that does not parse) or its stream failed: what
    /// arrived is not the body the client meant, so nothing was sent upstream.
    #[error("the request body could not be read: {0}")]
    BodyUnreadable(String),
    /// The client did not send its whole body within `server.request_body_timeout_seconds`.
    #[error("the request body did not arrive within {0} s")]
    BodyTimeout(f64),
    /// The gateway is shutting down and its drain deadline (`server.shutdown_grace_seconds`)
    /// passed before the request finished.
    #[error(
        "the gateway is shutting down: the request did not finish within the {0} s shutdown grace"
    )]
    ShuttingDown(f64),
    /// The model exists, but none of its upstreams is in a group this caller may use.
    #[error("The model `{model}` is not available to this API key (its upstream groups: {groups})")]
    ModelNotInGroups { model: String, groups: String },
    /// A limit of the route's `rate-limit` plugin refused the request; nothing was sent upstream.
    #[error("{}", .0.message)]
    RateLimited(Box<super::rate_limit::RateLimited>),
    /// A hard budget of the caller's consumer (its own or a group's) is spent; nothing was sent
    /// upstream. 402, not 429: the SDKs retry 429 by themselves, and waiting does not help.
    #[error("{}", .0.message)]
    BudgetExceeded(Box<super::budget::BudgetExceeded>),
    /// The route's stored `rate-limit` config does not read, so its requests are refused rather
    /// than served unlimited.
    #[error("the route `{route}` has a rate-limit config that does not read: {message}")]
    RateLimitMisconfigured { route: String, message: String },
}

impl GatewayError {
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::InvalidBody(_) => StatusCode::BAD_REQUEST,
            GatewayError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            GatewayError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            GatewayError::NotFound(_)
            | GatewayError::RouteDisabled(_)
            | GatewayError::ModelNotInGroups { .. } => StatusCode::NOT_FOUND,
            GatewayError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
            GatewayError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            GatewayError::ShuttingDown(_) => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::StrategyLoading { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::BudgetExceeded(_) => StatusCode::PAYMENT_REQUIRED,
            GatewayError::RateLimitMisconfigured { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            GatewayError::NoRoute(SelectionError::PinNotFound { .. }) => StatusCode::BAD_REQUEST,
            GatewayError::NoRoute(_) => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::AllAttemptsFailed(e) => match e.primary() {
                // Nothing was attempted: every route was skipped (open circuits).
                None => StatusCode::SERVICE_UNAVAILABLE,
                // The client's own mistake (bad params, context too long) keeps its status; anything
                // else is the upstream's failure as seen from the client: a bad gateway.
                Some(a) if (400..500).contains(&a.status) && a.status != 408 && a.status != 429 => {
                    StatusCode::from_u16(a.status).unwrap_or(StatusCode::BAD_GATEWAY)
                }
                Some(a) if a.status == 429 => StatusCode::TOO_MANY_REQUESTS,
                Some(a)
                    if matches!(
                        a.error_type,
                        "timeout" | "first_token_timeout" | "idle_timeout" | "total_timeout"
                    ) =>
                {
                    StatusCode::GATEWAY_TIMEOUT
                }
                _ => StatusCode::BAD_GATEWAY,
            },
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            GatewayError::NoRoute(_)
                | GatewayError::AllAttemptsFailed(_)
                | GatewayError::ShuttingDown(_)
                | GatewayError::StrategyLoading { .. }
                | GatewayError::RateLimited(_)
        ) && !matches!(self.status().as_u16(), 400..=407 | 409..=428)
    }

    /// Which limit refused the request (`consumer:rpm`, or a budget: `budget:consumer:<id>`),
    /// for the request log.
    pub fn rate_limited_by(&self) -> Option<String> {
        match self {
            GatewayError::RateLimited(r) => Some(r.limit.clone()),
            GatewayError::BudgetExceeded(b) => Some(b.refused_by.clone()),
            _ => None,
        }
    }

    fn openai_type(&self) -> &'static str {
        match self {
            GatewayError::InvalidBody(_)
            | GatewayError::ModelNotFound(_)
            | GatewayError::NotFound(_)
            | GatewayError::RouteDisabled(_)
            | GatewayError::MethodNotAllowed { .. }
            | GatewayError::BodyTooLarge(_)
            | GatewayError::BodyUnreadable(_)
            | GatewayError::BodyTimeout(_)
            | GatewayError::ModelNotInGroups { .. } => "invalid_request_error",
            GatewayError::ShuttingDown(_) | GatewayError::StrategyLoading { .. } => {
                "service_unavailable"
            }
            // OpenAI's own rate-limit 429s: `requests` or `tokens`, code `rate_limit_exceeded`.
            GatewayError::RateLimited(r) if r.limit.ends_with(":tpm") => "tokens",
            GatewayError::RateLimited(_) => "requests",
            GatewayError::BudgetExceeded(_) => "budget_exceeded",
            GatewayError::RateLimitMisconfigured { .. } => "server_error",
            // OpenAI's own 401s are `invalid_request_error` with code `invalid_api_key`.
            GatewayError::Unauthorized(_) => "invalid_request_error",
            GatewayError::NoRoute(SelectionError::PinNotFound { .. }) => "invalid_request_error",
            GatewayError::NoRoute(_) => "service_unavailable",
            GatewayError::AllAttemptsFailed(_) => "upstream_error",
        }
    }

    fn code(&self) -> &'static str {
        match self {
            GatewayError::InvalidBody(_) => "invalid_body",
            GatewayError::ModelNotFound(_) | GatewayError::ModelNotInGroups { .. } => {
                "model_not_found"
            }
            GatewayError::Unauthorized(super::auth::AuthError::Missing) => "missing_api_key",
            GatewayError::Unauthorized(_) => "invalid_api_key",
            GatewayError::NotFound(_) => "not_found",
            GatewayError::RouteDisabled(_) => "route_disabled",
            GatewayError::MethodNotAllowed { .. } => "method_not_allowed",
            GatewayError::BodyTooLarge(_) => "request_too_large",
            GatewayError::BodyUnreadable(_) => "unreadable_body",
            GatewayError::BodyTimeout(_) => "request_timeout",
            GatewayError::ShuttingDown(_) => "shutting_down",
            GatewayError::StrategyLoading { .. } => "strategy_loading",
            GatewayError::RateLimited(_) => "rate_limit_exceeded",
            GatewayError::BudgetExceeded(_) => "budget_exceeded",
            GatewayError::RateLimitMisconfigured { .. } => "rate_limit_misconfigured",
            GatewayError::NoRoute(SelectionError::PinNotFound { .. }) => "pin_not_found",
            GatewayError::NoRoute(SelectionError::MissingModality { .. }) => "unsupported_modality",
            GatewayError::NoRoute(_) => "no_available_route",
            GatewayError::AllAttemptsFailed(_) => "all_attempts_failed",
        }
    }

    /// The error's type in the closed vocabulary of `switchyard_errors_total`, prefixed by whose
    /// fault it is: `caller_` (the request), `gateway_` (nothing could be tried) or `upstream_`
    /// (every attempt failed; named after the first attempt's failure, which sets the status).
    pub fn error_type(&self) -> &'static str {
        match self {
            GatewayError::InvalidBody(_) => "caller_invalid_body",
            GatewayError::ModelNotFound(_) | GatewayError::ModelNotInGroups { .. } => {
                "caller_model_not_found"
            }
            GatewayError::Unauthorized(_) => "caller_unauthorized",
            GatewayError::NotFound(_) => "caller_not_found",
            GatewayError::RouteDisabled(_) => "caller_route_disabled",
            GatewayError::MethodNotAllowed { .. } => "caller_method_not_allowed",
            GatewayError::BodyTooLarge(_) => "caller_body_too_large",
            GatewayError::BodyUnreadable(_) => "caller_body_unreadable",
            GatewayError::BodyTimeout(_) => "caller_body_timeout",
            GatewayError::ShuttingDown(_) => "gateway_shutting_down",
            GatewayError::StrategyLoading { .. } => "gateway_strategy_loading",
            GatewayError::RateLimited(_) => "caller_rate_limited",
            GatewayError::BudgetExceeded(_) => "caller_budget_exceeded",
            GatewayError::RateLimitMisconfigured { .. } => "gateway_rate_limit_misconfigured",
            GatewayError::NoRoute(SelectionError::PinNotFound { .. }) => "caller_pin_not_found",
            GatewayError::NoRoute(SelectionError::MissingModality { .. }) => {
                "caller_unsupported_modality"
            }
            GatewayError::NoRoute(_) => "gateway_no_available_upstream",
            GatewayError::AllAttemptsFailed(e) => match e.primary() {
                None => "gateway_all_circuits_open",
                Some(a) if a.status == 429 => "upstream_rate_limited",
                Some(a) if (400..500).contains(&a.status) && a.status != 408 => {
                    "caller_rejected_by_upstream"
                }
                Some(a) => match a.error_type {
                    "timeout" => "upstream_timeout",
                    "first_token_timeout" => "upstream_first_token_timeout",
                    "idle_timeout" => "upstream_idle_timeout",
                    "total_timeout" => "upstream_total_timeout",
                    "response_too_large" => "upstream_response_too_large",
                    "transport" => "upstream_transport",
                    "invalid_response" => "upstream_invalid_response",
                    "empty_stream" => "upstream_empty_stream",
                    "stream_failed" => "upstream_stream_failed",
                    _ => "upstream_http_status",
                },
            },
        }
    }

    /// The error in OpenAI's JSON shape, with the attempts or exclusions that explain it.
    pub fn openai_body(&self) -> serde_json::Value {
        let mut error = serde_json::json!({
            "message": self.to_string(),
            "type": self.openai_type(),
            "param": serde_json::Value::Null,
            "code": self.code(),
        });
        match self {
            GatewayError::AllAttemptsFailed(e) => {
                error["message"] = if e.attempts.is_empty() {
                    format!("no upstream could be attempted: {}", describe(&e.excluded))
                } else {
                    primary_message(&e.attempts)
                }
                .into();
                error["attempts"] = serde_json::to_value(&e.attempts).unwrap_or_default();
                error["excluded"] = serde_json::to_value(&e.excluded).unwrap_or_default();
            }
            GatewayError::NoRoute(
                SelectionError::NoAdmissibleUpstream { excluded, .. }
                | SelectionError::MissingModality { excluded, .. },
            ) => {
                error["excluded"] =
                    serde_json::to_value::<&Vec<Exclusion>>(excluded).unwrap_or_default();
            }
            GatewayError::NoRoute(SelectionError::PinNotFound { endpoints, .. }) => {
                error["endpoints"] = serde_json::to_value(endpoints).unwrap_or_default();
            }
            GatewayError::ModelNotFound(_) | GatewayError::ModelNotInGroups { .. } => {
                error["param"] = "model".into()
            }
            _ => {}
        }
        serde_json::json!({ "error": error })
    }
}

fn primary_message(attempts: &[FailedAttempt]) -> String {
    match attempts.first() {
        Some(primary) => format!(
            "{} (endpoint {}); {} attempt(s) failed",
            primary.error,
            primary.endpoint_id,
            attempts.len()
        ),
        None => "no upstream was attempted".into(),
    }
}

impl GatewayError {
    /// The error as a response in the client's own dialect: OpenAI's shape for Chat Completions
    /// and Responses, Anthropic's for Messages, both carrying the attempts or exclusions.
    pub fn response_in(self, dialect: Dialect) -> Response {
        let status = self.status();
        // A refusal by a limit says when to come back and where each limit stands.
        let rate_limited = match &self {
            GatewayError::RateLimited(r) => Some((r.retry_after_seconds, r.headers)),
            _ => None,
        };
        // A spent budget says when its period ends (a `never` budget: no Retry-After).
        let budget_retry = match &self {
            GatewayError::BudgetExceeded(b) => b.retry_after_seconds,
            _ => None,
        };
        let budget_exceeded = matches!(self, GatewayError::BudgetExceeded(_));
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), "request failed: {self}");
        }
        crate::telemetry::metrics::request_error(
            self.error_type(),
            dialect.as_str(),
            status.as_u16(),
        );
        let request_id = crate::telemetry::request_id::current();
        let mut openai = self.openai_body();
        if let Some(id) = &request_id {
            openai["error"]["request_id"] = id.as_str().into();
        }
        let body = match dialect {
            Dialect::AnthropicMessages => {
                let message = openai["error"]["message"].as_str().unwrap_or_default();
                let mut body = dialect.error_body(status.as_u16(), message);
                if budget_exceeded {
                    // Anthropic's envelope, with a type of its own (Anthropic's 402 is a
                    // `billing_error` about the account, not a gateway's budget).
                    body["error"]["type"] = "budget_exceeded_error".into();
                }
                if let (Some(from), Some(to)) = (
                    openai["error"].as_object(),
                    body.get_mut("error").and_then(|e| e.as_object_mut()),
                ) {
                    for key in ["attempts", "excluded", "endpoints", "request_id"] {
                        if let Some(v) = from.get(key) {
                            to.insert(key.into(), v.clone());
                        }
                    }
                }
                body
            }
            Dialect::OpenAiChat | Dialect::OpenAiResponses => openai,
        };
        // Anthropic's own errors carry the id at the top level too.
        let mut body = body;
        if let (Dialect::AnthropicMessages, Some(id), Some(object)) =
            (dialect, &request_id, body.as_object_mut())
        {
            object.insert("request_id".into(), id.as_str().into());
        }
        let mut response = (status, axum::Json(body)).into_response();
        if let Some((retry_after, headers)) = rate_limited {
            let h = response.headers_mut();
            h.insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(retry_after),
            );
            headers.apply(h);
        }
        if let Some(retry_after) = budget_retry {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(retry_after),
            );
        }
        response
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        self.response_in(Dialect::OpenAiChat)
    }
}
