//! `GET /admin/logs`: the request log, a page at a time, newest first, under filters.

use std::sync::Arc;

use axum::Json;
use axum::extract::{RawQuery, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::auth::AdminCaller;
use super::error::ApiError;
use super::store;
use crate::gateway::Gateway;
use crate::store::api_log_query::{self, LogFilter, MAX_LIMIT, StatusFilter, StoredRow};

/// The query parameters; each filters when given (for the OpenAPI document: the handler reads
/// the query itself, so that a bad value is a 422 naming its parameter).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// The model id (not an alias).
    pub model: Option<String>,
    /// The endpoint id that answered (`{model}:{location}`).
    pub endpoint: Option<String>,
    /// The consumer's name.
    pub consumer: Option<String>,
    /// The inbound route's name.
    pub route: Option<String>,
    /// The request's id (`x-request-id`).
    pub request_id: Option<String>,
    /// A status (`429`) or a class (`2xx`, `4xx`, `5xx`).
    pub status: Option<String>,
    /// Rows created at or after this time (unix ms).
    pub since: Option<i64>,
    /// Rows created before this time (unix ms).
    pub until: Option<i64>,
    /// Rows per page: 1 to 500, default 50.
    pub limit: Option<u32>,
    /// The previous page's `next_before`: the rows after that one.
    pub before: Option<i64>,
}

/// One page.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogsPage {
    pub rows: Vec<LogEntry>,
    /// Pass as `before` for the next page; `null` on the last one.
    pub next_before: Option<i64>,
}

/// One request.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogEntry {
    pub id: i64,
    pub created_at_ms: i64,
    pub request_id: Option<String>,
    pub route: Option<String>,
    pub consumer: Option<String>,
    pub model: String,
    /// The endpoint that answered; `null` when none did.
    pub endpoint_id: Option<String>,
    pub status: i32,
    pub attempts: i32,
    pub fell_back: bool,
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    /// Every input token, cached ones included.
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    /// Input tokens read from a prompt cache by the attempt that answered.
    pub cached_tokens: Option<i32>,
    /// What every attempt cost at its upstream's `pricing`; `null` when none has one.
    pub cost_usd: Option<f64>,
    pub error: Option<String>,
    /// Every attempt in the order sent: `{endpoint_id, provider, status, error_type, hedge,
    /// prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, cost_usd,
    /// latency_ms}`. Empty for rows written before the attempt log existed.
    #[schema(value_type = Vec<Object>)]
    pub attempt_log: Vec<Value>,
    /// `{strategy, order, seed}`; `null` when no upstream was chosen or for older rows.
    #[schema(value_type = Option<Object>)]
    pub decision: Option<Value>,
}

impl From<StoredRow> for LogEntry {
    fn from(r: StoredRow) -> Self {
        // Stored by the gateway as JSON text; a hand-edited value that is not JSON reads as none.
        let json = |text: Option<String>| text.and_then(|t| serde_json::from_str::<Value>(&t).ok());
        let attempt_log = match json(r.attempt_log) {
            Some(Value::Array(attempts)) => attempts,
            _ => Vec::new(),
        };
        LogEntry {
            id: r.id,
            created_at_ms: r.created_at_ms,
            request_id: r.request_id,
            route: r.route,
            consumer: r.consumer,
            model: r.model,
            endpoint_id: r.endpoint_id,
            status: r.status,
            attempts: r.attempts,
            fell_back: r.fell_back,
            ttft_ms: r.ttft_ms,
            latency_ms: r.latency_ms,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cached_tokens: r.cached_tokens,
            cost_usd: r.cost_usd,
            error: r.error,
            attempt_log,
            decision: json(r.decision).filter(Value::is_object),
        }
    }
}

/// Rows are written in batches every 250 ms, so a request shows here within about a second.
#[utoipa::path(get, path = "/admin/logs", tag = "logs", params(LogsQuery),
    responses((status = 200, body = LogsPage),
        (status = 422, description = "An unknown parameter or a bad value; `param` names it")))]
pub async fn list_logs(
    _: AdminCaller,
    State(gateway): State<Arc<Gateway>>,
    RawQuery(query): RawQuery,
) -> Result<Json<LogsPage>, ApiError> {
    let filter = parse_filter(query.as_deref().unwrap_or(""))?;
    let page = api_log_query::page(store(&gateway)?, &filter).await?;
    Ok(Json(LogsPage {
        rows: page.rows.into_iter().map(LogEntry::from).collect(),
        next_before: page.next_before,
    }))
}

fn invalid(param: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::Body {
        param: Some(param.to_owned()),
        message: format!("{param}: {message}"),
    }
}

/// Reads the query string into a filter; every problem names its parameter.
pub fn parse_filter(query: &str) -> Result<LogFilter, ApiError> {
    let mut filter = LogFilter::default();
    let mut seen: Vec<String> = Vec::new();
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let key = key.as_ref();
        if seen.iter().any(|k| k == key) {
            return Err(invalid(key, "given more than once"));
        }
        seen.push(key.to_owned());
        if value.is_empty() {
            return Err(invalid(key, "must not be empty"));
        }
        let text = || Some(value.clone().into_owned());
        match key {
            "model" => filter.model = text(),
            "endpoint" => filter.endpoint_id = text(),
            "consumer" => filter.consumer = text(),
            "route" => filter.route = text(),
            "request_id" => filter.request_id = text(),
            "status" => {
                filter.status = Some(status(&value).ok_or_else(|| {
                    invalid(
                        key,
                        format!(
                            "`{value}` is neither a status (100 to 599) nor a class (1xx to 5xx)"
                        ),
                    )
                })?)
            }
            "since" => filter.since_ms = Some(unix_ms(key, &value)?),
            "until" => filter.until_ms = Some(unix_ms(key, &value)?),
            "before" => {
                filter.before = Some(
                    value
                        .parse::<i64>()
                        .ok()
                        .filter(|id| *id > 0)
                        .ok_or_else(|| invalid(key, format!("`{value}` is not a row id")))?,
                );
            }
            "limit" => {
                filter.limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        invalid(
                            key,
                            format!("`{value}` is not a number from 1 to {MAX_LIMIT}"),
                        )
                    })?;
            }
            _ => {
                return Err(invalid(
                    key,
                    "unknown parameter; known: model, endpoint, consumer, route, request_id, \
                     status, since, until, limit, before",
                ));
            }
        }
    }
    if let (Some(since), Some(until)) = (filter.since_ms, filter.until_ms)
        && until <= since
    {
        return Err(invalid(
            "until",
            format!("{until} is not after since ({since})"),
        ));
    }
    Ok(filter)
}

/// `429` or `4xx`.
fn status(value: &str) -> Option<StatusFilter> {
    let bytes = value.as_bytes();
    if bytes.len() != 3 || !(b'1'..=b'5').contains(&bytes[0]) {
        return None;
    }
    let class = i32::from(bytes[0] - b'0');
    if value[1..].eq_ignore_ascii_case("xx") {
        return Some(StatusFilter::Class(class));
    }
    value.parse::<i32>().ok().map(StatusFilter::Exact)
}

fn unix_ms(key: &str, value: &str) -> Result<i64, ApiError> {
    value
        .parse::<i64>()
        .ok()
        .filter(|ms| *ms >= 0)
        .ok_or_else(|| invalid(key, format!("`{value}` is not a time in unix milliseconds")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(query: &str) -> (Option<String>, String) {
        match parse_filter(query).unwrap_err() {
            ApiError::Body { param, message } => (param, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_parameter_is_read() {
        let f = parse_filter(
            "model=m&endpoint=m%3Alocal-1&consumer=c&route=r&request_id=abc&status=5xx\
             &since=10&until=20&limit=500&before=7",
        )
        .unwrap();
        assert_eq!(
            f,
            LogFilter {
                model: Some("m".into()),
                endpoint_id: Some("m:local-1".into()),
                consumer: Some("c".into()),
                route: Some("r".into()),
                request_id: Some("abc".into()),
                status: Some(StatusFilter::Class(5)),
                since_ms: Some(10),
                until_ms: Some(20),
                before: Some(7),
                limit: 500,
            }
        );
        assert_eq!(
            parse_filter("status=429").unwrap().status,
            Some(StatusFilter::Exact(429))
        );
        assert_eq!(parse_filter("").unwrap(), LogFilter::default());
    }

    #[test]
    fn bad_values_name_their_parameter() {
        for (query, param, says) in [
            ("status=abc", "status", "neither a status"),
            ("status=600", "status", "neither a status"),
            ("status=6xx", "status", "neither a status"),
            ("status=42", "status", "neither a status"),
            ("limit=0", "limit", "from 1 to 500"),
            ("limit=100000", "limit", "from 1 to 500"),
            ("limit=-1", "limit", "from 1 to 500"),
            ("since=yesterday", "since", "unix milliseconds"),
            ("until=-5", "until", "unix milliseconds"),
            ("since=20&until=10", "until", "not after since"),
            ("before=0", "before", "not a row id"),
            ("model=", "model", "must not be empty"),
            ("model=a&model=b", "model", "more than once"),
            ("colour=red", "colour", "unknown parameter"),
        ] {
            let (p, message) = rejected(query);
            assert_eq!(p.as_deref(), Some(param), "{query}");
            assert!(
                message.starts_with(&format!("{param}: ")),
                "{query}: {message}"
            );
            assert!(message.contains(says), "{query}: {message}");
        }
    }
}
