//! Idle HTTP/1.1 connections to plain-`http` upstreams, kept per thread and per origin.
//!
//! Replicas on a private network (vLLM, SGLang) are reached over plain HTTP/1.1, and that is the
//! gateway's hottest path. hyper-util's pooled client, which serves them otherwise, SipHashes its
//! key `(scheme, authority)` one byte at a time three times a request, builds a connect future for
//! every checkout (raced against the pool, dropped when an idle connection wins) and spawns a task
//! per request to put the connection back once its answer has been read. Here an idle connection is
//! found by its `host:port` in a map of this thread's origins (foldhash), taken off a stack, and put
//! back by the answer's body when it ends. TLS upstreams (which may speak HTTP/2) stay on
//! hyper-util's client.
//!
//! What is kept from it: a connection idle for [`IDLE_TIMEOUT`] is closed; a request that could not
//! be written because a reused connection had closed meanwhile is sent again on another (it never
//! reached the upstream); an answer not read to its end closes its connection (hyper's rule for
//! HTTP/1: what is left of it would be read as the next answer).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::client::legacy::connect::HttpConnector;
use parking_lot::Mutex;
use tower_service::Service;

use crate::id_map::IdMap;

use super::AttemptError;
use super::client::describe;

/// How long a connection may sit idle before it is closed (as hyper-util's pool did).
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per origin and thread: enough for every connection a burst opened to come
/// back, bounded so that one does not keep thousands of sockets open after it.
const MAX_IDLE_PER_ORIGIN: usize = 1024;

/// Origins a thread keeps pools for before it drops them all (upstream URLs come from the config,
/// so this is only reached by a gateway whose config was reloaded with ever new hosts).
const MAX_ORIGINS: usize = 1024;

/// How often idle connections past [`IDLE_TIMEOUT`] are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

type Sender = SendRequest<Full<Bytes>>;

/// One thread's idle connections, by origin.
pub(super) struct Http1Pools {
    connector: HttpConnector,
    origins: Mutex<IdMap<Arc<str>, Arc<Origin>>>,
}

/// The idle connections to one `host:port`, the most recently used last.
#[derive(Default)]
struct Origin {
    idle: Mutex<VecDeque<Idle>>,
}

struct Idle {
    sender: Sender,
    since: Instant,
}

/// A connection taken from the pool (or just opened) for one request.
struct Lease {
    sender: Sender,
    origin: Arc<Origin>,
    reused: bool,
}

impl Http1Pools {
    /// Pools that open connections with `connector`. When called on a Tokio runtime, a task on it
    /// closes connections idle past [`IDLE_TIMEOUT`] even when no request comes to find them.
    pub(super) fn new(connector: HttpConnector) -> Arc<Self> {
        let pools = Arc::new(Self {
            connector,
            origins: Mutex::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep(Arc::downgrade(&pools)));
        }
        pools
    }

    /// Sends `request` (origin-form URI, `Host` set) to `origin` (`host:port`), whose connections
    /// are opened to `uri`, on an idle connection or a new one.
    pub(super) async fn send(
        &self,
        origin: &str,
        uri: &http::Uri,
        connect_timeout: Duration,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, AttemptError> {
        let origin = self.origin(origin);
        loop {
            let mut lease = match take_idle(&origin, connect_timeout).await {
                Some(sender) => Lease {
                    sender,
                    origin: origin.clone(),
                    reused: true,
                },
                None => Lease {
                    sender: self.connect(uri).await?,
                    origin: origin.clone(),
                    reused: false,
                },
            };
            match lease.sender.try_send_request(request).await {
                Ok(response) => {
                    return Ok(response.map(|body| PooledBody {
                        body,
                        lease: Some(lease),
                    }));
                }
                Err(mut error) => match error.take_message() {
                    // Not written: the reused connection closed before it could be. Another one
                    // (in the end a new one, which is not retried) takes it.
                    Some(unsent) if lease.reused => request = unsent,
                    _ => return Err(AttemptError::Transport(describe(error.error()))),
                },
            }
        }
    }

    /// This thread's pool for `origin`.
    fn origin(&self, origin: &str) -> Arc<Origin> {
        let mut origins = self.origins.lock();
        if let Some(pool) = origins.get(origin) {
            return pool.clone();
        }
        if origins.len() >= MAX_ORIGINS {
            origins.clear();
        }
        let pool = Arc::new(Origin::default());
        origins.insert(Arc::from(origin), pool.clone());
        pool
    }

    /// A new connection to `uri`, its HTTP/1 connection driven by a task on this runtime.
    async fn connect(&self, uri: &http::Uri) -> Result<Sender, AttemptError> {
        let io = self
            .connector
            .clone()
            .call(uri.clone())
            .await
            .map_err(|e| AttemptError::Transport(format!("connecting: {}", describe(&e))))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| AttemptError::Transport(describe(&e)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %describe(&error), "upstream connection ended");
            }
        });
        Ok(sender)
    }

    /// Closes this thread's connections idle past [`IDLE_TIMEOUT`].
    fn sweep(&self) {
        let now = Instant::now();
        let origins: Vec<Arc<Origin>> = self.origins.lock().values().cloned().collect();
        for origin in origins {
            origin
                .idle
                .lock()
                .retain(|idle| !idle.sender.is_closed() && now - idle.since < IDLE_TIMEOUT);
        }
    }
}

/// The most recently used idle connection of `origin` that can take a request, waiting (at most
/// `within`) for one that has not yet seen its last answer's end; `None` when there is none.
async fn take_idle(origin: &Origin, within: Duration) -> Option<Sender> {
    loop {
        let Idle { mut sender, since } = origin.idle.lock().pop_back()?;
        if sender.is_closed() || since.elapsed() >= IDLE_TIMEOUT {
            continue;
        }
        // The connection's task may not have taken in the end of the answer it was put back at.
        if sender.is_ready()
            || matches!(
                tokio::time::timeout(within, sender.ready()).await,
                Ok(Ok(()))
            )
        {
            return Some(sender);
        }
    }
}

impl Origin {
    fn put(&self, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() >= MAX_IDLE_PER_ORIGIN {
            idle.pop_front();
        }
        idle.push_back(Idle {
            sender,
            since: Instant::now(),
        });
    }
}

async fn sweep(pools: Weak<Http1Pools>) {
    let mut interval = tokio::time::interval(SWEEP_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        interval.tick().await;
        let Some(pools) = pools.upgrade() else {
            return;
        };
        pools.sweep();
    }
}

/// An answer's body on a pooled connection: at its end, the connection goes back to its pool.
pub struct PooledBody {
    body: Incoming,
    lease: Option<Lease>,
}

impl PooledBody {
    fn give_back(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.origin.put(lease.sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        match &frame {
            None => this.give_back(),
            Some(Ok(_)) if this.body.is_end_stream() => this.give_back(),
            // A broken answer leaves its connection unusable.
            Some(Err(_)) => this.lease = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// How the test upstream treats a connection after its first answer.
    #[derive(Clone, Copy)]
    enum After {
        KeepAlive,
        /// Closes the socket without saying so in the answer (as a server whose keep-alive
        /// timeout ran out does).
        Close,
    }

    /// A loopback HTTP/1.1 upstream answering every request with `body_len` bytes; returns its
    /// address and how many connections it accepted.
    async fn upstream(after: After, body_len: usize) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(answer(socket, after, body_len));
            }
        });
        (address, accepted)
    }

    async fn answer(mut socket: TcpStream, after: After, body_len: usize) {
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            // A request: its head, then the Content-Length it declares.
            let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buffer[..n]),
                }
                continue;
            };
            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
            let declared: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            while seen.len() < end + 4 + declared {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buffer[..n]),
                }
            }
            seen.drain(..end + 4 + declared);
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {body_len}\r\n\r\n");
            if socket.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            for chunk in vec![b'x'; body_len].chunks(16 * 1024) {
                if socket.write_all(chunk).await.is_err() {
                    return;
                }
            }
            if matches!(after, After::Close) {
                return;
            }
        }
    }

    fn pools() -> Arc<Http1Pools> {
        Http1Pools::new(HttpConnector::new())
    }

    async fn post(
        pools: &Http1Pools,
        address: std::net::SocketAddr,
    ) -> Result<Response<PooledBody>, AttemptError> {
        let origin = address.to_string();
        let uri: http::Uri = format!("http://{origin}/v1/chat/completions")
            .parse()
            .unwrap();
        let request = Request::post("/v1/chat/completions")
            .header(http::header::HOST, &origin)
            .body(Full::new(Bytes::from_static(b"{\"model\":\"m\"}")))
            .unwrap();
        pools
            .send(&origin, &uri, Duration::from_secs(10), request)
            .await
    }

    async fn read_all(response: Response<PooledBody>) -> usize {
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .len()
    }

    #[tokio::test]
    async fn answers_read_to_their_end_leave_their_connection_for_the_next_request() {
        let (address, accepted) = upstream(After::KeepAlive, 300).await;
        let pools = pools();
        for _ in 0..5 {
            let response = post(&pools, address).await.unwrap();
            assert_eq!(read_all(response).await, 300);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_left_unread_closes_its_connection() {
        let (address, accepted) = upstream(After::KeepAlive, 256 * 1024).await;
        let pools = pools();
        let mut body = post(&pools, address).await.unwrap().into_body();
        body.frame().await.unwrap().unwrap();
        drop(body);
        // Its rest would be read as the next answer: the next request opens a new connection.
        let response = post(&pools, address).await.unwrap();
        assert_eq!(read_all(response).await, 256 * 1024);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_while_idle_is_not_used_again() {
        let (address, accepted) = upstream(After::Close, 10).await;
        let pools = pools();
        for round in 1..=3 {
            let response = post(&pools, address).await.unwrap();
            assert_eq!(read_all(response).await, 10);
            assert_eq!(accepted.load(Ordering::SeqCst), round);
            // Once its task has seen the close, the idle connection is passed over.
            let origin = pools.origin(&address.to_string());
            let deadline = Instant::now() + Duration::from_secs(30);
            while origin
                .idle
                .lock()
                .iter()
                .any(|idle| !idle.sender.is_closed())
            {
                assert!(Instant::now() < deadline, "the close was never seen");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_transport_error_saying_so() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let Err(error) = post(&pools(), address).await else {
            panic!("a closed port answered");
        };
        assert_eq!(error.error_type(), "transport");
        assert!(error.to_string().contains("connecting"), "{error}");
    }
}
