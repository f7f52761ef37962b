//! The pooled HTTP client every attempt sends through, with its timeouts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;

use crate::config::{StreamDeadlines, UpstreamClientConfig};

use super::AttemptError;

/// Bytes of an upstream error body kept for the attempt record.
const ERROR_BODY_LIMIT: usize = 2048;

/// How an upstream expects its credential.
#[derive(Debug, Clone, Copy)]
pub enum UpstreamAuth<'a> {
    /// `Authorization: Bearer <key>` (OpenAI and compatible servers).
    Bearer(Option<&'a str>),
    /// `x-api-key: <key>` plus `anthropic-version`.
    Anthropic(Option<&'a str>),
}

/// The Anthropic API version the gateway speaks.
const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Parsed upstream URLs kept before the cache is cleared (routes change rarely; this only bounds it).
const URL_CACHE_LIMIT: usize = 1024;

/// The shared upstream HTTP client: a connection pool per upstream host and per thread.
#[derive(Clone)]
pub struct UpstreamClient {
    /// One client (and so one connection pool) per thread that sends. A pooled connection is driven
    /// by a task on the runtime that opened it: shared between the per-core serving threads, every
    /// reuse from another thread would cost two cross-thread wake-ups per request.
    http: Arc<thread_local::ThreadLocal<reqwest::Client>>,
    /// Built at start (so a bad setting fails there); the clients of the threads are its twins.
    template: reqwest::Client,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
    request_timeout: Duration,
    /// Stream deadlines of upstreams that set none of their own.
    pub(super) stream_deadlines: StreamDeadlines,
    /// Largest whole answer read (`upstream.max_body_mib`).
    pub(super) max_body_bytes: usize,
    /// Largest event of a stream (`upstream.max_event_kib`).
    pub(super) max_event_bytes: usize,
    /// Upstream URLs already parsed: a route's URL is the same string on every call, and parsing
    /// it showed in profiles under load.
    urls: Arc<RwLock<HashMap<String, reqwest::Url>>>,
}

impl UpstreamClient {
    pub fn new(config: &UpstreamClientConfig) -> Result<Self, reqwest::Error> {
        let template = build_http(config.connect_timeout)?;
        Ok(Self {
            http: Arc::default(),
            template,
            connect_timeout: config.connect_timeout,
            first_byte_timeout: config.first_byte_timeout,
            request_timeout: config.request_timeout,
            stream_deadlines: config.stream_deadlines,
            max_body_bytes: config.max_body_bytes,
            max_event_bytes: config.max_event_bytes,
            urls: Arc::default(),
        })
    }

    /// This thread's client.
    fn http(&self) -> &reqwest::Client {
        self.http.get_or(|| {
            // The template's settings built once already; should this thread's copy fail anyway
            // (out of file descriptors for its resolver, say), it shares the template's pool.
            build_http(self.connect_timeout).unwrap_or_else(|_| self.template.clone())
        })
    }

    /// `url` parsed, from the cache when it was seen before. `None` when it does not parse; the
    /// caller then hands reqwest the string, which reports the error as before.
    fn parsed(&self, url: &str) -> Option<reqwest::Url> {
        if let Some(parsed) = self.urls.read().get(url) {
            return Some(parsed.clone());
        }
        let parsed = reqwest::Url::parse(url).ok()?;
        let mut urls = self.urls.write();
        if urls.len() >= URL_CACHE_LIMIT {
            urls.clear();
        }
        urls.insert(url.to_owned(), parsed.clone());
        Some(parsed)
    }

    /// POSTs a JSON body and waits for the response headers. A non-2xx answer is an error carrying
    /// the start of its body. `trace` is the W3C trace context to send, if any.
    pub async fn post_json(
        &self,
        url: &str,
        auth: UpstreamAuth<'_>,
        body: Vec<u8>,
        trace: Option<&crate::telemetry::trace::TraceHeaders>,
    ) -> Result<reqwest::Response, AttemptError> {
        let request = match self.parsed(url) {
            Some(parsed) => self.http().post(parsed),
            None => self.http().post(url),
        };
        let mut request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        // The upstream's logs can then be joined with ours.
        if let Some(value) =
            crate::telemetry::request_id::current().and_then(|id| id.header_value())
        {
            request = request.header(crate::telemetry::request_id::HEADER, value);
        }
        for (name, value) in trace.into_iter().flat_map(|t| t.iter()) {
            request = request.header(name, value);
        }
        match auth {
            UpstreamAuth::Bearer(Some(key)) => request = request.bearer_auth(key),
            UpstreamAuth::Anthropic(key) => {
                request = request.header("anthropic-version", ANTHROPIC_VERSION);
                if let Some(key) = key {
                    request = request.header("x-api-key", key);
                }
            }
            UpstreamAuth::Bearer(None) => {}
        }
        let response = tokio::time::timeout(self.first_byte_timeout, request.send())
            .await
            .map_err(|_| AttemptError::Timeout(self.first_byte_timeout))?
            .map_err(|e| AttemptError::Transport(describe(&e)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        // Only as much as is kept: an error body can be as large as the upstream likes.
        let body = tokio::time::timeout(
            Duration::from_secs(5),
            read_limited(response, ERROR_BODY_LIMIT, true),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
        Err(AttemptError::Status {
            status: status.as_u16(),
            body: truncate(&body),
            retry_after,
        })
    }

    /// Reads a whole (non-streaming) body within the request timeout and the body limit.
    pub async fn read_body(&self, response: reqwest::Response) -> Result<Bytes, AttemptError> {
        tokio::time::timeout(
            self.request_timeout,
            read_limited(response, self.max_body_bytes, false),
        )
        .await
        .map_err(|_| AttemptError::Timeout(self.request_timeout))?
    }
}

fn build_http(connect_timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .build()
}

/// The body chunk by chunk, stopping at `limit` bytes: past it, the first `limit` bytes when
/// `keep_head`, else a [`AttemptError::ResponseTooLarge`]. A declared length past the limit fails
/// before anything is read.
async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
    keep_head: bool,
) -> Result<Bytes, AttemptError> {
    let too_large = AttemptError::ResponseTooLarge {
        what: "the answer (upstream.max_body_mib)",
        limit,
    };
    let declared = response.content_length().unwrap_or(0);
    if !keep_head && declared > limit as u64 {
        return Err(too_large);
    }
    // A body that arrives in one chunk is returned without a copy; more are joined as they come
    // (kept apart, a body sent in tiny chunks would cost far more than its size).
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut len = 0;
    while let Some(mut chunk) = response
        .chunk()
        .await
        .map_err(|e| AttemptError::Transport(describe(&e)))?
    {
        let full = len + chunk.len() > limit;
        if full {
            if !keep_head {
                return Err(too_large);
            }
            chunk.truncate(limit - len);
        }
        len += chunk.len();
        match first.take() {
            None if joined.is_empty() => first = Some(chunk),
            held => {
                if let Some(held) = held {
                    joined.reserve_exact((declared as usize).clamp(held.len(), limit));
                    joined.extend_from_slice(&held);
                }
                // Doubling, but never past the limit: a body just under 64 MiB must not cost a
                // 128 MiB buffer.
                let needed = joined.len() + chunk.len();
                if needed > joined.capacity() {
                    let grown = (joined.capacity() * 2).clamp(needed, limit.max(needed));
                    joined.reserve_exact(grown - joined.len());
                }
                joined.extend_from_slice(&chunk);
            }
        }
        if full {
            break;
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(joined)))
}

/// `Retry-After` as delay-seconds or an HTTP date (RFC 9110 §10.2.3); a date in the past is 0.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

/// reqwest's Display hides the cause ("error sending request"); the chain says what happened.
pub(super) fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn truncate(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_LIMIT)]);
    text.trim().to_owned()
}
