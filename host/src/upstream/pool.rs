//! Idle HTTP/1.1 connections to plain-`http` upstreams, kept per thread and per origin.
//!
//! Replicas on a private network (vLLM, SGLang) are reached over plain HTTP/1.1, and that is the
//! gateway's hottest path. hyper-util's pooled client, which serves them otherwise, SipHashes its
//! key `(scheme, authority)` one byte at a time three times a request, builds a connect future for
//! every checkout (raced against the pool, dropped when an idle connection wins) and spawns a task
//! per request to put the connection back once its answer has been read. Here an idle connection is
//! found by its `host:port` in a map of this thread's origins (foldhash), taken off a stack, and put
//! back by the answer's body when it ends. The connection is spoken to by the attempt's own task
//! ([`super::http1`]), not by a task of its own. TLS upstreams (which may speak HTTP/2) stay on
//! hyper-util's client.
//!
//! What is kept from hyper-util: a connection idle for [`IDLE_TIMEOUT`] is closed; a request that
//! could not be written because a reused connection had closed meanwhile is sent again on another
//! (it never reached the upstream); an answer not read to its end closes its connection (what is
//! left of it would be read as the next answer). A connection the upstream closed while it was idle
//! is seen when it is next taken (the socket reads its end without waiting) or by the sweep.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::connect::HttpConnector;
use parking_lot::Mutex;
use tower_service::Service;

use crate::id_map::IdMap;

use super::AttemptError;
use super::client::describe;
use super::http1::{BodyReader, Connection, Http1Error};

/// How long a connection may sit idle before it is closed (as hyper-util's pool did).
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per origin and thread: enough for every connection a burst opened to come
/// back, bounded so that one does not keep thousands of sockets open after it.
const MAX_IDLE_PER_ORIGIN: usize = 1024;

/// Origins a thread keeps pools for before it drops them all (upstream URLs come from the config,
/// so this is only reached by a gateway whose config was reloaded with ever new hosts).
const MAX_ORIGINS: usize = 1024;

/// How often idle connections past [`IDLE_TIMEOUT`], or closed by their upstream, are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

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
    connection: Connection,
    since: Instant,
}

/// A connection taken from the pool (or just opened) for one request.
struct Lease {
    connection: Connection,
    origin: Arc<Origin>,
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

    /// Sends a request (`head` from [`super::http1::RequestHead`], naming its `Host`, and `body`)
    /// to `origin` (`host:port`), whose connections are opened to `uri`, on an idle connection or
    /// a new one, and reads the answer's head.
    pub(super) async fn send(
        &self,
        origin: &str,
        uri: &http::Uri,
        head: &[u8],
        body: &[u8],
    ) -> Result<Response<PooledBody>, AttemptError> {
        let origin = self.origin(origin);
        loop {
            let (mut connection, reused) = match take_idle(&origin) {
                Some(connection) => (connection, true),
                None => (self.connect(uri).await?, false),
            };
            match connection.write_request(head, body).await {
                Ok(()) => {}
                // Not written: the reused connection closed before it could be. Another one
                // (in the end a new one, which is not retried) takes it.
                Err((_, false)) if reused => continue,
                Err((error, _)) => return Err(transport(&error)),
            }
            let (head, reader) = connection.read_head().await.map_err(|e| transport(&e))?;
            let mut body = PooledBody {
                reader,
                lease: Some(Lease { connection, origin }),
            };
            if body.reader.is_end_stream() {
                body.give_back();
            }
            return Ok(head.map(|()| body));
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

    /// A new connection to `uri`.
    async fn connect(&self, uri: &http::Uri) -> Result<Connection, AttemptError> {
        let io = self
            .connector
            .clone()
            .call(uri.clone())
            .await
            .map_err(|e| AttemptError::Transport(format!("connecting: {}", describe(&e))))?;
        Ok(Connection::new(io.into_inner()))
    }

    /// Closes this thread's connections idle past [`IDLE_TIMEOUT`] or closed by their upstream.
    fn sweep(&self) {
        let now = Instant::now();
        let origins: Vec<Arc<Origin>> = self.origins.lock().values().cloned().collect();
        for origin in origins {
            origin
                .idle
                .lock()
                .retain(|idle| now - idle.since < IDLE_TIMEOUT && idle.connection.is_reusable());
        }
    }
}

fn transport(error: &Http1Error) -> AttemptError {
    AttemptError::Transport(describe(error))
}

/// The most recently used idle connection of `origin` that can take a request; `None` when there
/// is none.
fn take_idle(origin: &Origin) -> Option<Connection> {
    loop {
        let Idle { connection, since } = origin.idle.lock().pop_back()?;
        if since.elapsed() < IDLE_TIMEOUT && connection.is_reusable() {
            return Some(connection);
        }
    }
}

impl Origin {
    fn put(&self, mut connection: Connection) {
        connection.shrink_for_idle();
        let mut idle = self.idle.lock();
        if idle.len() >= MAX_IDLE_PER_ORIGIN {
            idle.pop_front();
        }
        idle.push_back(Idle {
            connection,
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
    reader: BodyReader,
    /// `None` once the body has ended (the connection given back or closed).
    lease: Option<Lease>,
}

impl PooledBody {
    fn give_back(&mut self) {
        if let Some(lease) = self.lease.take()
            && lease.connection.reusable_after(&self.reader)
        {
            lease.origin.put(lease.connection);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = Http1Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Http1Error>>> {
        let this = self.get_mut();
        let Some(lease) = this.lease.as_mut() else {
            return Poll::Ready(None);
        };
        match ready!(lease.connection.poll_body(&mut this.reader, cx)) {
            Some(Ok(data)) => {
                if this.reader.is_end_stream() {
                    this.give_back();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            // A broken answer leaves its connection unusable.
            Some(Err(error)) => {
                this.lease = None;
                Poll::Ready(Some(Err(error)))
            }
            None => {
                this.give_back();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reader.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.reader.remaining() {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::upstream::http1::RequestHead;

    /// How the test upstream treats a connection after its first answer.
    #[derive(Clone, Copy)]
    enum After {
        KeepAlive,
        /// Closes the socket without saying so in the answer (as a server whose keep-alive
        /// timeout ran out does).
        Close,
    }

    /// How the test upstream writes its answers.
    #[derive(Clone, Copy)]
    enum Shape {
        /// This many bytes under a `Content-Length`.
        Length(usize),
        /// An interim `100 Continue`, then `CHUNKED_TEXT` in chunks written apart, as a stream's
        /// events are.
        Chunked,
    }

    const CHUNKED_TEXT: &str = "data: one\n\ndata: two\n\ndata: [DONE]\n\n";

    /// A loopback HTTP/1.1 upstream answering every request as `shape` says; returns its address
    /// and how many connections it accepted.
    async fn upstream(after: After, shape: Shape) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(answer(socket, after, shape));
            }
        });
        (address, accepted)
    }

    async fn answer(mut socket: TcpStream, after: After, shape: Shape) {
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
            let pieces: Vec<Vec<u8>> = match shape {
                Shape::Length(body_len) => {
                    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {body_len}\r\n\r\n");
                    std::iter::once(head.into_bytes())
                        .chain(vec![b'x'; body_len].chunks(16 * 1024).map(<[u8]>::to_vec))
                        .collect()
                }
                Shape::Chunked => {
                    let mut pieces = vec![
                        b"HTTP/1.1 100 Continue\r\n\r\n".to_vec(),
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
                    ];
                    for event in CHUNKED_TEXT.split_inclusive("\n\n") {
                        pieces.push(format!("{:x}\r\n{event}\r\n", event.len()).into_bytes());
                    }
                    pieces.push(b"0\r\n\r\n".to_vec());
                    pieces
                }
            };
            for piece in pieces {
                if socket.write_all(&piece).await.is_err() {
                    return;
                }
                if matches!(shape, Shape::Chunked) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
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
        let mut head = RequestHead::new(&http::Method::POST, "/v1/chat/completions");
        head.header(&http::header::HOST, &[origin.as_bytes()])
            .unwrap();
        let body = b"{\"model\":\"m\"}";
        pools
            .send(&origin, &uri, &head.finish(body.len()), body)
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
        let (address, accepted) = upstream(After::KeepAlive, Shape::Length(300)).await;
        let pools = pools();
        for _ in 0..5 {
            let response = post(&pools, address).await.unwrap();
            assert_eq!(read_all(response).await, 300);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn chunked_answers_after_an_interim_one_are_read_whole_on_one_connection() {
        let (address, accepted) = upstream(After::KeepAlive, Shape::Chunked).await;
        let pools = pools();
        for _ in 0..3 {
            let response = post(&pools, address).await.unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(response.body().size_hint().exact(), None);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, CHUNKED_TEXT.as_bytes());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_left_unread_closes_its_connection() {
        let (address, accepted) = upstream(After::KeepAlive, Shape::Length(256 * 1024)).await;
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
        let (address, accepted) = upstream(After::Close, Shape::Length(10)).await;
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
                .any(|idle| idle.connection.is_reusable())
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
