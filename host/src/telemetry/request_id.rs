//! Request ids: taken from the client's `x-request-id` when it is a sane token, generated
//! otherwise (UUID v7: time-ordered, so ids sort like the request log). The id is returned on
//! every answer (header, and in the error object's body), sent upstream, and named by every log
//! line of the request and by its request-log row.
//!
//! The id lives in a task-local for the duration of the request's handler ([`RequestScope`]): the
//! upstream client, the error renderer, the log formatter and the request's trace read it from
//! there instead of every stage passing it down.

use std::cell::OnceCell;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

/// The header that carries the id, in both directions and upstream.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-supplied id kept; a longer one is replaced by a generated id.
pub const MAX_LEN: usize = 128;

/// One request's id: cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(Arc<str>);

impl RequestId {
    /// A fresh UUID v7: the time in milliseconds, then 74 random bits from the thread's generator.
    /// (`Uuid::now_v7` asked the kernel for its random bits, two `getrandom` calls on every
    /// request; ids of one millisecond need not sort among themselves.)
    pub fn generate() -> RequestId {
        let random: [u8; 10] = rand::random();
        let id =
            uuid::Builder::from_unix_timestamp_millis(crate::clock::unix_ms(), &random).into_uuid();
        // Encoded in place: `to_string` went through `fmt` and a `String` copied into the `Arc`.
        let mut text = uuid::Uuid::encode_buffer();
        RequestId(Arc::from(&*id.hyphenated().encode_lower(&mut text)))
    }

    /// The client's id when it is 1..=[`MAX_LEN`] visible ASCII characters (no spaces or control
    /// characters, which would break log lines and header re-use); `None` otherwise.
    pub fn accept(value: &[u8]) -> Option<RequestId> {
        let ok = !value.is_empty()
            && value.len() <= MAX_LEN
            && value.iter().all(|b| b.is_ascii_graphic());
        ok.then(|| RequestId(Arc::from(String::from_utf8_lossy(value).as_ref())))
    }

    /// The client's id from `headers`, or a generated one.
    pub fn from_headers(headers: &axum::http::HeaderMap) -> RequestId {
        headers
            .get(&HEADER)
            .and_then(|v| RequestId::accept(v.as_bytes()))
            .unwrap_or_else(RequestId::generate)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// As a header value (always valid: visible ASCII by construction).
    pub fn header_value(&self) -> Option<HeaderValue> {
        HeaderValue::from_str(&self.0).ok()
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The request a task is serving: its id, and its trace's ids once it is traced. Log lines written
/// while it is current carry both (`super::logging`). It is a task-local rather than a `tracing`
/// span: a span cost ~3,800 instructions a request (made, its id formatted into its fields by the
/// log layer whether or not a line was ever logged, entered and left at every poll, closed), 5 % of
/// a relayed request's; the task-local costs a clone of the id, and the formatting happens only
/// for lines that are written.
#[derive(Debug, Clone)]
pub struct RequestScope {
    id: RequestId,
    trace: OnceCell<TraceIds>,
}

/// A traced request's trace id and the id of its span, as W3C hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceIds {
    pub trace_id: String,
    pub span_id: String,
}

impl RequestScope {
    pub fn new(id: RequestId) -> RequestScope {
        RequestScope {
            id,
            trace: OnceCell::new(),
        }
    }

    pub fn id(&self) -> &RequestId {
        &self.id
    }

    pub fn trace(&self) -> Option<&TraceIds> {
        self.trace.get()
    }

    /// Runs `f` with this scope current, outside any task (work that outlives the handler, such
    /// as the bookkeeping after a whole answer is written).
    pub fn run<R>(self, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(self, f)
    }
}

tokio::task_local! {
    static CURRENT: RequestScope;
}

/// The id of the request whose handler is running on this task, if any.
pub fn current() -> Option<RequestId> {
    CURRENT.try_with(|scope| scope.id.clone()).ok()
}

/// The current request's scope, to carry into work that runs after the handler ([`RequestScope::run`]).
pub fn current_scope() -> Option<RequestScope> {
    CURRENT.try_with(Clone::clone).ok()
}

/// Calls `f` with the current request's scope, if any, without cloning it (the log formatter).
pub fn with_current<R>(mut f: impl FnMut(Option<&RequestScope>) -> R) -> R {
    CURRENT
        .try_with(|scope| f(Some(scope)))
        .unwrap_or_else(|_| f(None))
}

/// Records the current request's trace ids (once; a second call is ignored), so that its log lines
/// can be joined with the exported trace.
pub fn record_trace(ids: TraceIds) {
    let _ = CURRENT.try_with(|scope| scope.trace.set(ids));
}

/// Axum middleware for every route: assigns the id, runs the handler with the request's scope as
/// the task's current one (so every log line of the request names it, and the upstream client and
/// error renderer find the id), and sets `x-request-id` on the answer, whatever the answer is.
pub async fn middleware(request: Request, next: Next) -> Response {
    within(request, |request| next.run(request)).await
}

/// Runs `handler` on `request` as [`middleware`] does, for a caller that is not an axum
/// middleware stack (the listener's direct way to inference, `server::Edge`).
pub async fn within<Handler, Answer>(mut request: Request, handler: Handler) -> Response
where
    Handler: FnOnce(Request) -> Answer,
    Answer: Future<Output = Response>,
{
    let id = RequestId::from_headers(request.headers());
    // Handlers that want it without the task-local (none today) find it here too.
    request.extensions_mut().insert(id.clone());
    let mut response = CURRENT
        .scope(RequestScope::new(id.clone()), handler(request))
        .await;
    if let Some(value) = id.header_value() {
        response.headers_mut().insert(HEADER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_kept_only_when_bounded_and_visible_ascii() {
        assert_eq!(
            RequestId::accept(b"req-123_abc.DEF:9").map(|r| r.to_string()),
            Some("req-123_abc.DEF:9".to_owned())
        );
        for bad in [
            &b""[..],
            b"has space",
            b"tab\there",
            b"\x7f",
            "caf\u{e9}".as_bytes(),
            &[b'a'; MAX_LEN + 1],
        ] {
            assert!(RequestId::accept(bad).is_none(), "{bad:?} was accepted");
        }
        assert!(RequestId::accept(&[b'a'; MAX_LEN]).is_some());
    }

    #[test]
    fn generated_ids_are_uuid_v7_and_distinct() {
        let (a, b) = (RequestId::generate(), RequestId::generate());
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(a.as_str()).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 7);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        // Its time is now's (generously: a loaded machine may pause between the two readings).
        let (secs, _) = parsed.get_timestamp().expect("v7 has a time").to_unix();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        assert!(now.abs_diff(secs) < 600, "{secs} vs {now}");
        // Ids of one millisecond differ in their random bits.
        let many: std::collections::HashSet<String> = (0..1000)
            .map(|_| RequestId::generate().as_str().to_owned())
            .collect();
        assert_eq!(many.len(), 1000);
    }
}
