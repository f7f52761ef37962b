//! The pooled HTTP client every attempt sends through, with its timeouts.
//!
//! Plain-`http` upstreams are spoken to from this thread's pools (`pool.rs`, `http1.rs`); TLS ones
//! through hyper-util's pooled client directly. reqwest wraps the same client and
//! cost ~8,500 instructions more per request (a redirect layer it always installs, the URL parsed
//! again into its own types and back); it stays only for a gateway whose environment names a proxy
//! (`HTTPS_PROXY` and friends), which reqwest implements and hyper does not.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Method, Request, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as PooledClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use parking_lot::RwLock;

use crate::config::{StreamDeadlines, UpstreamClientConfig};
use crate::id_map::IdMap;

use super::AttemptError;
use super::http1::RequestHead;
use super::pool::{Http1Pools, PooledBody};

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
const ANTHROPIC_VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Parsed upstream URLs kept before the cache is cleared (routes change rarely; this only bounds it).
const URL_CACHE_LIMIT: usize = 1024;

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = super::pool::IDLE_TIMEOUT;

/// The environment variables reqwest reads its proxies from (either case).
const PROXY_VARIABLES: [&str; 3] = ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"];

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// One thread's way out: its own pools for plain-`http` upstreams and hyper-util's pooled client
/// for TLS ones, or reqwest when the environment names a proxy.
#[derive(Clone)]
enum Transport {
    Direct {
        plain: Arc<Http1Pools>,
        /// Boxed: the pooled client is large and lives once per thread.
        tls: Box<PooledClient<Connector, Full<Bytes>>>,
    },
    Proxied(reqwest::Client),
}

/// An upstream's answer: status, headers and a body still to read.
pub type UpstreamResponse = http::Response<UpstreamBody>;

/// The body of an upstream's answer, whichever transport carried it.
pub enum UpstreamBody {
    /// From a plain-`http` upstream: the connection goes back to its pool at the end.
    Pooled(PooledBody),
    Direct(Incoming),
    Proxied(reqwest::Body),
}

/// A transport error while a body is read.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            UpstreamBody::Pooled(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            UpstreamBody::Direct(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            UpstreamBody::Proxied(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Pooled(body) => body.is_end_stream(),
            UpstreamBody::Direct(body) => body.is_end_stream(),
            UpstreamBody::Proxied(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Pooled(body) => body.size_hint(),
            UpstreamBody::Direct(body) => body.size_hint(),
            UpstreamBody::Proxied(body) => body.size_hint(),
        }
    }
}

/// Why the upstream client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientBuildError(#[from] reqwest::Error);

/// The shared upstream HTTP client: a connection pool per upstream host and per thread.
#[derive(Clone)]
pub struct UpstreamClient {
    /// One client (and so one connection pool) per thread that sends. A pooled connection is driven
    /// by a task on the runtime that opened it: shared between the per-core serving threads, every
    /// reuse from another thread would cost two cross-thread wake-ups per request.
    http: Arc<thread_local::ThreadLocal<Transport>>,
    /// Built at start (so a bad setting fails there); the clients of the threads are its twins.
    template: Transport,
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
    urls: Arc<RwLock<IdMap<String, Arc<Target>>>>,
}

/// An upstream URL as sent: the URI without its user information, which becomes Basic auth.
struct Target {
    uri: Uri,
    basic_auth: Option<HeaderValue>,
    /// What a plain `http` URL is sent with; TLS URLs are left to hyper-util's client (they may
    /// speak HTTP/2, which names the host in `:authority`).
    plain: Option<PlainTarget>,
}

/// A plain `http` URL, sent over HTTP/1.1 from this thread's [`Http1Pools`], parts built once.
struct PlainTarget {
    /// The `Host` header (`host`, or `host:port` off port 80).
    host: HeaderValue,
    /// The pool's key: `host:port`.
    origin: Arc<str>,
    /// The request line's origin form (`/path?query`).
    path: Box<str>,
}

impl UpstreamClient {
    pub fn new(config: &UpstreamClientConfig) -> Result<Self, ClientBuildError> {
        let template = build_transport(config.connect_timeout)?;
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
    fn http(&self) -> &Transport {
        self.http.get_or(|| {
            // The template's settings built once already; should this thread's copy fail anyway,
            // it shares the template's pool.
            build_transport(self.connect_timeout).unwrap_or_else(|_| self.template.clone())
        })
    }

    /// `url` parsed, from the cache when it was seen before.
    fn parsed(&self, url: &str) -> Result<Arc<Target>, AttemptError> {
        if let Some(parsed) = self.urls.read().get(url) {
            return Ok(parsed.clone());
        }
        let parsed = target(url).map(Arc::new).ok_or_else(|| {
            AttemptError::Transport(format!(
                "invalid upstream URL `{}`",
                super::redact::url(url)
            ))
        })?;
        let mut urls = self.urls.write();
        if urls.len() >= URL_CACHE_LIMIT {
            urls.clear();
        }
        urls.insert(url.to_owned(), parsed.clone());
        Ok(parsed)
    }

    /// POSTs a JSON body and waits for the response headers. A non-2xx answer is an error carrying
    /// the start of its body. `trace` is the W3C trace context to send, if any.
    pub async fn post_json(
        &self,
        url: &str,
        auth: UpstreamAuth<'_>,
        body: Vec<u8>,
        trace: Option<&crate::telemetry::trace::TraceHeaders>,
    ) -> Result<UpstreamResponse, AttemptError> {
        let target = self.parsed(url)?;
        let transport = self.http();
        let plain = match transport {
            Transport::Direct { plain, .. } => target.plain.as_ref().map(|p| (plain, p)),
            Transport::Proxied(_) => None,
        };
        let mut outgoing = match plain {
            Some((pools, plain)) => {
                let mut outgoing = Outgoing::Plain {
                    pools,
                    plain,
                    head: RequestHead::new(&Method::POST, &plain.path),
                };
                outgoing.header(&HOST, &[plain.host.as_bytes()], false)?;
                outgoing
            }
            None => Outgoing::Other(HeaderMap::with_capacity(6)),
        };
        outgoing.header(&CONTENT_TYPE, &[b"application/json"], false)?;
        // The upstream's logs can then be joined with ours.
        if let Some(id) = crate::telemetry::request_id::current() {
            outgoing.header(
                &crate::telemetry::request_id::HEADER,
                &[id.as_str().as_bytes()],
                false,
            )?;
        }
        for (name, value) in trace.into_iter().flat_map(|t| t.iter()) {
            outgoing.header(&name, &[value.as_bytes()], false)?;
        }
        match auth {
            UpstreamAuth::Bearer(Some(key)) => {
                outgoing.header(&AUTHORIZATION, &[b"Bearer ", key.as_bytes()], true)?;
            }
            UpstreamAuth::Anthropic(key) => {
                outgoing.header(
                    &ANTHROPIC_VERSION_HEADER,
                    &[ANTHROPIC_VERSION.as_bytes()],
                    false,
                )?;
                if let Some(key) = key {
                    outgoing.header(&X_API_KEY, &[key.as_bytes()], true)?;
                }
            }
            UpstreamAuth::Bearer(None) => {}
        }
        if let Some(basic) = &target.basic_auth
            && !matches!(auth, UpstreamAuth::Bearer(Some(_)))
        {
            outgoing.header(&AUTHORIZATION, &[basic.as_bytes()], true)?;
        }
        let sent = async {
            match outgoing {
                Outgoing::Plain { pools, plain, head } => pools
                    .send(&plain.origin, &target.uri, &head.finish(body.len()), &body)
                    .await
                    .map(|r| r.map(UpstreamBody::Pooled)),
                Outgoing::Other(headers) => {
                    let mut request = Request::new(Bytes::from(body));
                    *request.method_mut() = Method::POST;
                    *request.uri_mut() = target.uri.clone();
                    *request.headers_mut() = headers;
                    self.send(transport, request).await
                }
            }
        };
        let response = tokio::time::timeout(self.first_byte_timeout, sent)
            .await
            .map_err(|_| AttemptError::Timeout(self.first_byte_timeout))??;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
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

    async fn send(
        &self,
        transport: &Transport,
        request: Request<Bytes>,
    ) -> Result<UpstreamResponse, AttemptError> {
        match transport {
            Transport::Direct { tls: client, .. } => client
                .request(request.map(Full::new))
                .await
                .map(|r| r.map(UpstreamBody::Direct))
                .map_err(|e| AttemptError::Transport(describe(&e))),
            Transport::Proxied(client) => {
                let request = reqwest::Request::try_from(request)
                    .map_err(|e| AttemptError::Transport(describe(&e)))?;
                client
                    .execute(request)
                    .await
                    .map(|r| http::Response::from(r).map(UpstreamBody::Proxied))
                    .map_err(|e| AttemptError::Transport(describe(&e)))
            }
        }
    }

    /// Reads a whole (non-streaming) body within the request timeout and the body limit.
    pub async fn read_body(&self, response: UpstreamResponse) -> Result<Bytes, AttemptError> {
        tokio::time::timeout(
            self.request_timeout,
            read_limited(response, self.max_body_bytes, false),
        )
        .await
        .map_err(|_| AttemptError::Timeout(self.request_timeout))?
    }
}

/// `url` as a URI to send to, with `user:password@` (as reqwest read it) turned into Basic auth.
fn target(url: &str) -> Option<Target> {
    let mut parsed = url::Url::parse(url).ok()?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return None;
    }
    let basic_auth = if parsed.username().is_empty() && parsed.password().is_none() {
        None
    } else {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let user = decode(parsed.username());
        let password = parsed.password().map(decode).unwrap_or_default();
        use base64::Engine as _;
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let mut value = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
        value.set_sensitive(true);
        parsed.set_username("").ok()?;
        parsed.set_password(None).ok()?;
        Some(value)
    };
    let uri = Uri::try_from(parsed.as_str()).ok()?;
    let plain = (uri.scheme_str() == Some("http"))
        .then(|| {
            let host = uri.host()?;
            let port = uri.port_u16().unwrap_or(80);
            let origin = format!("{host}:{port}");
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            Some(PlainTarget {
                host: HeaderValue::from_str(if port == 80 { host } else { &origin }).ok()?,
                origin: Arc::from(origin),
                path: Box::from(path),
            })
        })
        .flatten();
    Some(Target {
        uri,
        basic_auth,
        plain,
    })
}

/// An upstream request's headers as they are gathered: written straight into the head for a
/// plain-`http` upstream, into a map for hyper's client and reqwest.
enum Outgoing<'a> {
    Plain {
        pools: &'a Http1Pools,
        plain: &'a PlainTarget,
        head: RequestHead,
    },
    Other(HeaderMap),
}

impl Outgoing<'_> {
    /// Adds the header `name` with `pieces` as its value. A `secret` (a credential) is left out
    /// of the HTTP stack's debug output, and one with bytes a header cannot carry fails the
    /// attempt without being quoted.
    fn header(
        &mut self,
        name: &HeaderName,
        pieces: &[&[u8]],
        secret: bool,
    ) -> Result<(), AttemptError> {
        let invalid = || {
            let what = if secret {
                "the upstream credential"
            } else {
                "an upstream request header"
            };
            AttemptError::Transport(format!("{what} is not a valid header value"))
        };
        match self {
            Outgoing::Plain { head, .. } => head.header(name, pieces).map_err(|_| invalid()),
            Outgoing::Other(headers) => {
                let value = match pieces {
                    [one] => HeaderValue::from_bytes(one),
                    _ => HeaderValue::from_bytes(&pieces.concat()),
                };
                let mut value = value.map_err(|_| invalid())?;
                value.set_sensitive(secret);
                headers.append(name.clone(), value);
                Ok(())
            }
        }
    }
}

/// Whether the environment names a proxy (the variables reqwest reads, either case).
fn proxy_configured() -> bool {
    PROXY_VARIABLES.iter().any(|name| {
        [name.to_string(), name.to_ascii_lowercase()]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
    })
}

fn build_transport(connect_timeout: Duration) -> Result<Transport, ClientBuildError> {
    if proxy_configured() {
        return Ok(Transport::Proxied(
            reqwest::Client::builder()
                .connect_timeout(connect_timeout)
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .tcp_nodelay(true)
                // As the direct client: an upstream's redirect is relayed as its answer.
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
        ));
    }
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    let plain = Http1Pools::new(http.clone());
    // `https` URLs are the TLS layer's to accept.
    http.enforce_http(false);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Transport::Direct {
        plain,
        tls: Box::new(
            PooledClient::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_timer(TokioTimer::new())
                .build(tls),
        ),
    })
}

/// The body chunk by chunk, stopping at `limit` bytes: past it, the first `limit` bytes when
/// `keep_head`, else a [`AttemptError::ResponseTooLarge`]. A declared length past the limit fails
/// before anything is read.
async fn read_limited(
    response: UpstreamResponse,
    limit: usize,
    keep_head: bool,
) -> Result<Bytes, AttemptError> {
    let too_large = AttemptError::ResponseTooLarge {
        what: "the answer (upstream.max_body_mib)",
        limit,
    };
    let mut body = response.into_body();
    let declared = body.size_hint().exact().unwrap_or(0);
    if !keep_head && declared > limit as u64 {
        return Err(too_large);
    }
    // A body that arrives in one chunk is returned without a copy; more are joined as they come
    // (kept apart, a body sent in tiny chunks would cost far more than its size).
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| AttemptError::Transport(describe(&*e)))?;
        // Trailers carry nothing an answer needs.
        let Ok(mut chunk) = frame.into_data() else {
            continue;
        };
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

/// The clients' Display hides the cause ("client error (Connect)"); the chain says what happened.
pub(super) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_information_leaves_the_uri_for_basic_auth() {
        let t = target("https://alice:pa%20ss@api.example:8443/v1/chat/completions").unwrap();
        assert_eq!(
            t.uri.to_string(),
            "https://api.example:8443/v1/chat/completions"
        );
        let basic = t.basic_auth.unwrap();
        assert!(basic.is_sensitive());
        // base64("alice:pa ss")
        assert_eq!(basic.to_str().unwrap(), "Basic YWxpY2U6cGEgc3M=");

        let plain = target("http://127.0.0.1:9000/v1/embeddings").unwrap();
        assert_eq!(plain.uri.to_string(), "http://127.0.0.1:9000/v1/embeddings");
        assert!(plain.basic_auth.is_none());
    }

    #[test]
    fn plain_http_targets_carry_the_host_header_the_client_would_write() {
        let host = |url: &str| {
            target(url)
                .unwrap()
                .plain
                .map(|p| p.host.to_str().unwrap().to_owned())
        };
        assert_eq!(
            host("http://127.0.0.1:9000/v1").as_deref(),
            Some("127.0.0.1:9000")
        );
        assert_eq!(
            host("http://vllm.internal/v1").as_deref(),
            Some("vllm.internal")
        );
        assert_eq!(
            host("http://vllm.internal:80/v1").as_deref(),
            Some("vllm.internal")
        );
        assert_eq!(host("http://[::1]:8000/v1").as_deref(), Some("[::1]:8000"));
        assert_eq!(
            host("http://u:p@10.0.0.7:8000/v1").as_deref(),
            Some("10.0.0.7:8000")
        );
        assert_eq!(
            host("https://api.example:8443/v1"),
            None,
            "TLS may be HTTP/2"
        );
    }

    #[test]
    fn plain_http_targets_are_pooled_by_host_and_port_and_sent_in_origin_form() {
        let plain = |url: &str| {
            let p = target(url).unwrap().plain.unwrap();
            (p.origin.to_string(), p.path.to_string())
        };
        assert_eq!(
            plain("http://10.0.0.7:8000/v1/chat/completions"),
            ("10.0.0.7:8000".into(), "/v1/chat/completions".into())
        );
        // Port 80 written or not is one origin.
        assert_eq!(
            plain("http://vllm.internal/v1/x?api-version=2"),
            ("vllm.internal:80".into(), "/v1/x?api-version=2".into())
        );
        assert_eq!(plain("http://vllm.internal:80").0, "vllm.internal:80");
        assert_eq!(plain("http://vllm.internal").1, "/");
        assert_eq!(plain("http://[::1]:8000/v1").0, "[::1]:8000");
    }

    #[test]
    fn only_http_urls_with_a_host_are_targets() {
        for bad in ["ftp://host/v1", "unix:/tmp/sock", "not a url", "http://"] {
            assert!(target(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn credentials_that_a_header_cannot_carry_fail_without_quoting_them() {
        let mut outgoing = Outgoing::Other(HeaderMap::new());
        let e = outgoing
            .header(&AUTHORIZATION, &[b"Bearer ", b"sk-line\nbreak"], true)
            .unwrap_err();
        assert!(!e.to_string().contains("sk-line"), "{e}");
        outgoing
            .header(&AUTHORIZATION, &[b"Bearer ", b"sk-fine"], true)
            .unwrap();
        let Outgoing::Other(headers) = outgoing else {
            unreachable!()
        };
        assert_eq!(headers[AUTHORIZATION], "Bearer sk-fine");
        assert!(headers[AUTHORIZATION].is_sensitive());
    }
}
