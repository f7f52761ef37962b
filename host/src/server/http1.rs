//! HTTP/1.1 client connections, served by the connection's own task.
//!
//! hyper's server connection runs a dispatcher between the socket and the service: the request
//! body goes to the handler through a channel, the answer through hyper's write buffer and its
//! encoder, each step a poll of its state machine (~16,900 instructions of a non-streaming
//! request, callgrind, issue #18). Here the task that accepted the connection reads each request's
//! head (`httparse`, the parser hyper uses), hands the request to the [`Edge`], and writes the
//! answer with its head and body in one vectored write. A body already read with its head (nearly
//! every inference request) reaches the handler as one piece; only a body still arriving goes
//! through a channel, fed by this task while the handler waits for it.
//!
//! What hyper did and this keeps: the header-read deadline from the connection's start or the end
//! of the previous answer (keep-alive idle time included), `100 Continue` when the handler waits
//! for such a body, pipelined requests answered in order, a client that closes while its request is
//! being served drops the handler (the request is logged as abandoned), `date` on every answer,
//! chunked answers to HTTP/1.1 clients when the length is not known, and no more requests once the
//! drain began.

use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::{Buf, Bytes, BytesMut};
use futures::channel::mpsc;
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, EXPECT, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use switchyard_http1::{Decoded, Framing, HeadCopy, content_length, list_items, lists_token};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::Edge;
use super::listener::Drain;

/// Largest request head (line and headers). hyper's limit was its ~400 KiB read buffer; no client
/// of an inference API sends more than a few KiB of headers.
const HEAD_LIMIT: usize = 64 * 1024;

/// Most headers a request may have (hyper's default).
const MAX_HEADERS: usize = 100;

/// What a read asks the socket for at least.
const READ_MIN: usize = 8 * 1024;

/// How much of what follows a request (a pipelined next one) is read while it is served, to see
/// the client close; past this the connection is not read until the answer is out.
const READ_AHEAD_LIMIT: usize = 64 * 1024;

/// How much of a streamed answer is gathered into one write when its pieces come faster than
/// they can be written.
const WRITE_BATCH: usize = 64 * 1024;

/// Pieces of an answer up to this size are copied next to the head and chunk lines; larger ones
/// are written from where they are.
const COPY_LIMIT: usize = 4 * 1024;

/// A connection closed while the client may still be sending (a body the answer did not wait
/// for) reads and drops this much, for at most [`LINGER_TIME`], so the answer is not lost to the
/// reset a close with unread bytes sends.
const LINGER_BYTES: usize = 1 << 20;
const LINGER_TIME: Duration = Duration::from_secs(2);

/// An idle connection keeps no read buffer, and a write buffer only up to this size: 10,000
/// keep-alive clients between requests held 8 KiB each of read buffer otherwise.
const IDLE_WRITE_BUFFER: usize = 4 * 1024;

/// How long a client connection may keep the gateway waiting on it (`server.*` in the file).
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientDeadlines {
    /// A request's head, from the end of the previous answer.
    pub header_read: Duration,
    /// A write of the answer that makes no progress: a client that stops reading lets the socket
    /// buffers fill, and without this the answer (a stream and its upstream connection with it)
    /// would be held for as long as the client stays connected. Counted between two writes that
    /// move bytes (nginx's `send_timeout`), so a slow reader that keeps reading is not cut off.
    pub client_write: Duration,
}

/// Serves the HTTP/1 requests of one client connection until it closes, its header deadline
/// passes, or (between requests) the drain begins. The first head must arrive by
/// `first_deadline`; each later one within `deadlines.header_read` of the previous answer.
pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    app: &Edge,
    drain: &Drain,
    first_deadline: Instant,
    deadlines: ClientDeadlines,
) {
    let mut connection = ClientConnection {
        stream,
        read: BytesMut::new(),
        out: Outgoing::default(),
        write_timeout: deadlines.client_write,
    };
    let mut deadline = pin!(tokio::time::sleep_until(first_deadline));
    let mut draining = pin!(drain.draining());
    loop {
        let head = match connection
            .read_head(deadline.as_mut(), draining.as_mut())
            .await
        {
            Ok(Some(head)) => head,
            Ok(None) => return,
            Err(rejection) => {
                tracing::debug!(%peer, "request refused: {}", rejection.message);
                connection.reject(&rejection).await;
                return;
            }
        };
        match connection.exchange(head, peer, app, drain).await {
            Next::KeepAlive => {
                connection.idle();
                deadline
                    .as_mut()
                    .reset(Instant::now() + deadlines.header_read);
            }
            Next::Close { unread_input } => {
                connection.close(unread_input).await;
                return;
            }
            Next::Abandon => return,
        }
    }
}

/// What becomes of the connection after an exchange.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// It may carry the next request.
    KeepAlive,
    /// The answer is out and the connection ends; the client may still be sending.
    Close { unread_input: bool },
    /// The client went away, or the answer could not be finished: nothing more is written.
    Abandon,
}

/// A request that cannot be served, answered before the connection closes.
#[derive(Debug)]
struct Rejection {
    status: StatusCode,
    message: &'static str,
}

impl Rejection {
    fn bad(message: &'static str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }
}

/// A request's head, parsed, with what its framing says of its body and its connection.
struct RequestHead {
    request: Request<()>,
    /// `None`: no body.
    body: Option<Framing>,
    /// Whether the client allows another request on the connection after this one.
    keep_alive: bool,
    /// The client waits for `100 Continue` before sending the body.
    expects_continue: bool,
}

/// One client connection, with what was read from it and not yet taken, and the answer being
/// written.
struct ClientConnection {
    stream: TcpStream,
    read: BytesMut,
    out: Outgoing,
    /// [`ClientDeadlines::client_write`].
    write_timeout: Duration,
}

impl ClientConnection {
    /// The next request's head; `None` when the connection should end without an answer: closed
    /// by the client, its deadline passed, or the drain began with no request started.
    async fn read_head(
        &mut self,
        mut deadline: Pin<&mut Sleep>,
        mut draining: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<RequestHead>, Rejection> {
        // A pipelined request may already be here: no timer is touched for it.
        if !self.read.is_empty()
            && let Some(head) = self.parse_head()?
        {
            return Ok(Some(head));
        }
        poll_fn(|cx| {
            loop {
                if self.read.len() >= HEAD_LIMIT {
                    return Poll::Ready(Err(Rejection {
                        status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        message: "the request head is larger than 64 KiB",
                    }));
                }
                // A connection without a buffer (idle) takes one only once the client sends.
                let readable = if self.read.capacity() == 0 {
                    self.stream.poll_read_ready(cx)
                } else {
                    Poll::Ready(Ok(()))
                };
                let read = match readable {
                    Poll::Ready(Ok(())) => {
                        self.read.reserve(READ_MIN);
                        poll_read(&mut self.stream, &mut self.read, cx)
                    }
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                };
                match read {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Ok(None)),
                    Poll::Ready(Ok(_)) => match self.parse_head() {
                        Ok(Some(head)) => return Poll::Ready(Ok(Some(head))),
                        Ok(None) => continue,
                        Err(rejection) => return Poll::Ready(Err(rejection)),
                    },
                    Poll::Pending => {}
                }
                // The drain ends only connections between requests; once it has completed this
                // connection is closed, so it is not polled again.
                if self.read.is_empty() && draining.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(None));
                }
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(None));
                }
                return Poll::Pending;
            }
        })
        .await
    }

    /// The head at the start of the buffer, taken out of it, when all of it is there.
    fn parse_head(&mut self) -> Result<Option<RequestHead>, Rejection> {
        // Left uninitialized: zeroing room for 100 headers costs ~3,200 instructions a request.
        let mut slots = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut []);
        let length = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
            &mut parsed,
            &self.read,
            &mut slots,
        ) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(Rejection {
                    status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    message: "the request has more than 100 headers",
                });
            }
            Err(httparse::Error::Version) => {
                return Err(Rejection {
                    status: StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                    message: "only HTTP/1.0, HTTP/1.1 and HTTP/2 are served",
                });
            }
            Err(_) => return Err(Rejection::bad("the request head does not parse")),
        };
        let method = Method::from_bytes(parsed.method.unwrap_or_default().as_bytes())
            .map_err(|_| Rejection::bad("the request method is not valid"))?;
        let version = match parsed.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        let head = HeadCopy::new(&self.read, length);
        let target = parsed.path.unwrap_or_default();
        let uri = Uri::from_maybe_shared(head.slice(target.as_bytes()))
            .map_err(|_| Rejection::bad("the request target is not a valid URI"))?;
        let headers = head
            .headers(parsed.headers)
            .map_err(|m| Rejection::bad(m.0))?;
        self.read.advance(length);

        let facts = HeadFacts::of(&headers);
        // RFC 9112 §3.2: an HTTP/1.1 request without a Host, or with more than one, is answered
        // 400 (nginx does so too); a request meant for another host must not be served as ours.
        match (version, facts.hosts) {
            (Version::HTTP_11, 0) => {
                return Err(Rejection::bad(
                    "an HTTP/1.1 request must carry a Host header",
                ));
            }
            (_, 2..) => {
                return Err(Rejection::bad(
                    "the request carries more than one Host header",
                ));
            }
            _ => {}
        }
        let body = request_framing(version, &headers, &facts)?;
        let keep_alive = match version {
            Version::HTTP_10 => facts.keep_alive,
            _ => !facts.close,
        };
        let expects_continue = version == Version::HTTP_11 && facts.expects_continue;
        let mut request = Request::new(());
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.version_mut() = version;
        *request.headers_mut() = headers;
        Ok(Some(RequestHead {
            request,
            body,
            keep_alive,
            expects_continue,
        }))
    }

    /// Serves one request: hands it to `app` with its body, watches the connection while the
    /// handler runs (a client that closes drops it), and writes the answer.
    async fn exchange(
        &mut self,
        head: RequestHead,
        peer: SocketAddr,
        app: &Edge,
        drain: &Drain,
    ) -> Next {
        let RequestHead {
            request,
            body,
            keep_alive,
            expects_continue,
        } = head;
        let mut pump = None;
        let body = match body {
            None => Body::empty(),
            Some(Framing::Length(length)) if self.read.len() as u64 >= length => {
                let length = length as usize;
                let body = Bytes::copy_from_slice(&self.read[..length]);
                self.read.advance(length);
                Body::from(body)
            }
            Some(framing) => {
                let (sender, receiver) = mpsc::channel(1);
                pump = Some(BodyPump {
                    framing,
                    sender,
                    interim: if expects_continue { CONTINUE } else { &[] },
                });
                Body::from_stream(receiver)
            }
        };
        let is_head = request.method() == Method::HEAD;
        let version = request.version();
        let mut request = request.map(|()| body);
        request.extensions_mut().insert(ConnectInfo(peer));

        let mut answer = pin!(app.answer(request));
        // Whether the request's body was read to its end (or had none).
        let mut body_read = pump.is_none();
        let mut body_broken = false;
        let response = poll_fn(|cx| {
            if let Poll::Ready(response) = answer.as_mut().poll(cx) {
                return Poll::Ready(Some(response));
            }
            if let Some(feeding) = &mut pump {
                match self.poll_pump(feeding, cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Pumped::Done) => {
                        pump = None;
                        body_read = true;
                    }
                    Poll::Ready(Pumped::NotWanted | Pumped::Broken) => {
                        // The handler stopped reading (a body over the limit) or the body does
                        // not parse: what is left of it is not read, and the connection ends
                        // after the answer.
                        pump = None;
                        body_broken = true;
                    }
                    Poll::Ready(Pumped::ClientGone) => return Poll::Ready(None),
                }
            }
            if body_read && self.poll_client_gone(cx).is_ready() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await;
        let Some(response) = response else {
            return Next::Abandon;
        };
        let keep_alive = keep_alive && body_read && !body_broken && !drain.is_draining();
        let next = self.respond(response, is_head, version, keep_alive).await;
        match next {
            Next::Close { .. } => Next::Close {
                unread_input: !body_read || !self.read.is_empty(),
            },
            next => next,
        }
    }

    /// Feeds the handler the request body as it arrives.
    fn poll_pump(&mut self, pump: &mut BodyPump, cx: &mut Context<'_>) -> Poll<Pumped> {
        while !pump.interim.is_empty() {
            match ready!(Pin::new(&mut self.stream).poll_write(cx, pump.interim)) {
                Ok(0) | Err(_) => return Poll::Ready(Pumped::ClientGone),
                Ok(n) => pump.interim = &pump.interim[n..],
            }
        }
        loop {
            if ready!(pump.sender.poll_ready(cx)).is_err() {
                return Poll::Ready(Pumped::NotWanted);
            }
            match pump.framing.decode(&mut self.read) {
                Ok(Decoded::Data(data)) => {
                    if pump.sender.start_send(Ok(data)).is_err() {
                        return Poll::Ready(Pumped::NotWanted);
                    }
                    if pump.framing.is_complete() {
                        return Poll::Ready(Pumped::Done);
                    }
                    continue;
                }
                Ok(Decoded::End) => return Poll::Ready(Pumped::Done),
                Ok(Decoded::NeedMore) => {}
                Err(malformed) => {
                    let error = io::Error::new(io::ErrorKind::InvalidData, malformed);
                    let _ = pump.sender.start_send(Err(error));
                    return Poll::Ready(Pumped::Broken);
                }
            }
            self.read.reserve(READ_MIN);
            match ready!(poll_read(&mut self.stream, &mut self.read, cx)) {
                Ok(0) | Err(_) => return Poll::Ready(Pumped::ClientGone),
                Ok(_) => {}
            }
        }
    }

    /// Ready when the client has closed the connection (or it broke). What it sends meanwhile
    /// (a pipelined request) is kept for later, up to [`READ_AHEAD_LIMIT`].
    ///
    /// It reads into a small buffer of its own, so that a connection whose answer is a long
    /// stream does not hold a read buffer for it.
    fn poll_client_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut buffer = [MaybeUninit::<u8>::uninit(); 1024];
        loop {
            if self.read.len() >= READ_AHEAD_LIMIT {
                return Poll::Pending;
            }
            let mut watched = tokio::io::ReadBuf::uninit(&mut buffer);
            match ready!(Pin::new(&mut self.stream).poll_read(cx, &mut watched)) {
                Err(_) => return Poll::Ready(()),
                Ok(()) if watched.filled().is_empty() => return Poll::Ready(()),
                Ok(()) => self.read.extend_from_slice(watched.filled()),
            }
        }
    }

    /// Lets go of the buffers an idle connection does not need (see [`IDLE_WRITE_BUFFER`]).
    fn idle(&mut self) {
        if self.read.is_empty() {
            self.read = BytesMut::new();
        }
        if self.out.staged.capacity() > IDLE_WRITE_BUFFER {
            self.out = Outgoing::default();
        }
    }

    /// Writes `response`: its head, then its body as it comes (by length, chunked, or to the
    /// close for an HTTP/1.0 client), gathering what is ready into one write.
    async fn respond(
        &mut self,
        response: Response<Body>,
        is_head: bool,
        version: Version,
        mut keep_alive: bool,
    ) -> Next {
        let (parts, body) = response.into_parts();
        let status = parts.status;
        let has_body = !(is_head
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED);
        let declared = match parts.headers.contains_key(CONTENT_LENGTH) {
            true => content_length(&parts.headers).ok(),
            false => None,
        };
        let framing = if status == StatusCode::NO_CONTENT || status.is_informational() {
            AnswerFraming::Length(0)
        } else if let Some(length) = declared {
            AnswerFraming::Length(length)
        } else if let Some(length) = body.size_hint().exact() {
            AnswerFraming::Length(length)
        } else if version == Version::HTTP_11 {
            AnswerFraming::Chunked
        } else {
            keep_alive = false;
            AnswerFraming::UntilClose
        };

        let out = &mut self.out;
        out.clear();
        out.head(status);
        for (name, value) in &parts.headers {
            // The handler's `Connection: close` is kept; what this writes of the connection and
            // the body's framing is its own.
            if name == CONNECTION {
                keep_alive &= !lists_token(value.as_bytes(), "close");
                continue;
            }
            if name == TRANSFER_ENCODING {
                continue;
            }
            out.header(name.as_str(), value.as_bytes());
        }
        if !parts.headers.contains_key(DATE) {
            with_http_date(|date| out.header("date", date));
        }
        match framing {
            AnswerFraming::Length(length)
                if declared.is_none() && status != StatusCode::NO_CONTENT =>
            {
                out.header(
                    "content-length",
                    itoa::Buffer::new().format(length).as_bytes(),
                );
            }
            AnswerFraming::Chunked => out.header("transfer-encoding", b"chunked"),
            _ => {}
        }
        if !keep_alive {
            out.header("connection", b"close");
        } else if version == Version::HTTP_10 {
            out.header("connection", b"keep-alive");
        }
        out.staged.extend_from_slice(b"\r\n");

        if !has_body {
            drop(body);
            return match self.flush().await {
                Ok(()) if keep_alive => Next::KeepAlive,
                Ok(()) => Next::Close {
                    unread_input: false,
                },
                Err(_) => Next::Abandon,
            };
        }
        let mut body = pin!(body);
        let mut framing = framing;
        loop {
            let batch = poll_fn(|cx| self.poll_batch(body.as_mut(), &mut framing, cx)).await;
            if self.flush().await.is_err() {
                return Next::Abandon;
            }
            match batch {
                Batch::More => {}
                Batch::End => break,
                Batch::Failed | Batch::ClientGone => return Next::Abandon,
            }
        }
        match framing {
            AnswerFraming::Length(0) | AnswerFraming::Chunked if keep_alive => Next::KeepAlive,
            AnswerFraming::Length(0) | AnswerFraming::Chunked | AnswerFraming::UntilClose => {
                Next::Close {
                    unread_input: false,
                }
            }
            // Shorter than its length: the client must not take the connection's next bytes
            // for the rest of it.
            AnswerFraming::Length(_) => Next::Abandon,
        }
    }

    /// Stages what the body has ready, framed, after what is staged already (the head, first):
    /// ready to be written when the body has nothing more ready, at its end, or past
    /// [`WRITE_BATCH`].
    fn poll_batch(
        &mut self,
        mut body: Pin<&mut Body>,
        framing: &mut AnswerFraming,
        cx: &mut Context<'_>,
    ) -> Poll<Batch> {
        loop {
            if self.out.len() >= WRITE_BATCH {
                return Poll::Ready(Batch::More);
            }
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers: not sent.
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    match framing {
                        AnswerFraming::Length(left) => {
                            if data.len() as u64 > *left {
                                return Poll::Ready(Batch::Failed);
                            }
                            *left -= data.len() as u64;
                            self.out.data(data);
                        }
                        AnswerFraming::Chunked => {
                            let mut line = [0u8; 18];
                            let size = chunk_size_line(data.len(), &mut line);
                            self.out.staged.extend_from_slice(size);
                            self.out.data(data);
                            self.out.staged.extend_from_slice(b"\r\n");
                        }
                        AnswerFraming::UntilClose => self.out.data(data),
                    }
                }
                Poll::Ready(Some(Err(error))) => {
                    tracing::debug!("an answer's body failed: {error}");
                    return Poll::Ready(Batch::Failed);
                }
                Poll::Ready(None) => {
                    if *framing == AnswerFraming::Chunked {
                        self.out.staged.extend_from_slice(b"0\r\n\r\n");
                    }
                    return Poll::Ready(Batch::End);
                }
                Poll::Pending => {
                    if !self.out.is_empty() {
                        return Poll::Ready(Batch::More);
                    }
                    // Waiting on a stream's next piece: idle as far as buffers go.
                    self.idle();
                    if self.poll_client_gone(cx).is_ready() {
                        return Poll::Ready(Batch::ClientGone);
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// Writes everything staged; fails when a write has moved nothing for the write timeout.
    async fn flush(&mut self) -> io::Result<()> {
        let mut written = 0;
        let total = self.out.len();
        let Self {
            stream,
            out,
            write_timeout,
            ..
        } = self;
        // The timer is armed only once a write has to wait: nearly every answer goes out in one
        // write that does not, and it pays for no timer.
        let mut stalled: Option<Pin<Box<Sleep>>> = None;
        while written < total {
            let n = poll_fn(|cx| {
                let mut slices = [IoSlice::new(&[]); 64];
                let count = out.slices_from(written, &mut slices);
                if let Poll::Ready(wrote) =
                    Pin::new(&mut *stream).poll_write_vectored(cx, &slices[..count])
                {
                    return Poll::Ready(wrote);
                }
                let timer =
                    stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(*write_timeout)));
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client read nothing of its answer within the write timeout",
                )))
            })
            .await;
            let n = match n {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) => {
                    if e.kind() == io::ErrorKind::TimedOut {
                        tracing::info!("{e}: the connection is closed");
                        crate::telemetry::metrics::client_write_timed_out();
                    }
                    return Err(e);
                }
            };
            written += n;
            stalled = None;
        }
        out.clear();
        Ok(())
    }

    /// Answers a request that cannot be served (the connection closes after).
    async fn reject(mut self, rejection: &Rejection) {
        let body = serde_json::json!({"error": {
            "message": rejection.message,
            "type": "invalid_request_error",
            "code": "malformed_request",
        }});
        let mut answer = Response::new(Body::from(body.to_string()));
        *answer.status_mut() = rejection.status;
        answer.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        if let Next::Close { .. } = self.respond(answer, false, Version::HTTP_11, false).await {
            self.close(true).await;
        }
    }

    /// Ends the connection after its last answer: the write side is shut (the client reads the
    /// end of an answer framed by the close), and while the client may still be sending, what it
    /// sends is read and dropped for a while, so that closing does not reset the connection
    /// before the client has read the answer.
    async fn close(mut self, unread_input: bool) {
        if self.stream.shutdown().await.is_err() || !unread_input {
            return;
        }
        let linger = async {
            let mut dropped = 0;
            // On the heap, and only here: on the stack it sat in every connection's future (its
            // task was 10 KiB, of which 8 KiB this buffer), though few connections ever linger.
            let mut buf = vec![0u8; 8 * 1024];
            while dropped < LINGER_BYTES {
                match tokio::io::AsyncReadExt::read(&mut self.stream, &mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => dropped += n,
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, linger).await;
    }
}

/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A request body still arriving, fed to the handler's [`Body`] through a channel.
struct BodyPump {
    framing: Framing,
    sender: mpsc::Sender<Result<Bytes, io::Error>>,
    /// What is left to write of `100 Continue`, before the body is read.
    interim: &'static [u8],
}

/// How feeding a request body ended.
enum Pumped {
    /// All of it reached the handler.
    Done,
    /// The handler dropped the body before its end.
    NotWanted,
    /// Its chunks do not parse; the handler was given the error.
    Broken,
    /// The client closed the connection before the body's end.
    ClientGone,
}

/// How an answer's body is framed on the wire, and for a length how much is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerFraming {
    Length(u64),
    Chunked,
    UntilClose,
}

/// What [`ClientConnection::poll_batch`] staged.
enum Batch {
    /// Some of the body; more is to come.
    More,
    /// The rest of the body and its end.
    End,
    /// The body failed or ran past its length: the answer cannot be finished.
    Failed,
    ClientGone,
}

/// An answer being written: small pieces (the head, chunk lines, short data) copied into one
/// buffer, larger ones kept where they are and written between them.
#[derive(Default)]
struct Outgoing {
    staged: Vec<u8>,
    /// Pieces written from where they are, each after `staged[..at]`.
    kept: Vec<(usize, Bytes)>,
}

impl Outgoing {
    fn clear(&mut self) {
        self.staged.clear();
        self.kept.clear();
    }

    fn len(&self) -> usize {
        self.staged.len() + self.kept.iter().map(|(_, b)| b.len()).sum::<usize>()
    }

    fn is_empty(&self) -> bool {
        self.staged.is_empty() && self.kept.is_empty()
    }

    fn head(&mut self, status: StatusCode) {
        self.staged.extend_from_slice(b"HTTP/1.1 ");
        self.staged.extend_from_slice(status.as_str().as_bytes());
        self.staged.push(b' ');
        self.staged
            .extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        self.staged.extend_from_slice(b"\r\n");
    }

    fn header(&mut self, name: &str, value: &[u8]) {
        self.staged.extend_from_slice(name.as_bytes());
        self.staged.extend_from_slice(b": ");
        self.staged.extend_from_slice(value);
        self.staged.extend_from_slice(b"\r\n");
    }

    fn data(&mut self, data: Bytes) {
        if data.len() <= COPY_LIMIT {
            self.staged.extend_from_slice(&data);
        } else {
            self.kept.push((self.staged.len(), data));
        }
    }

    /// Fills `slices` with what is left to write after the first `skip` bytes; returns how many
    /// it filled.
    fn slices_from<'a>(&'a self, mut skip: usize, slices: &mut [IoSlice<'a>]) -> usize {
        let mut count = 0;
        let mut from = 0;
        let kept = self.kept.iter().map(|(at, kept)| (*at, &kept[..]));
        for (at, kept) in kept.chain(std::iter::once((self.staged.len(), &[][..]))) {
            for piece in [&self.staged[from..at], kept] {
                if skip >= piece.len() {
                    skip -= piece.len();
                    continue;
                }
                if count == slices.len() {
                    return count;
                }
                slices[count] = IoSlice::new(&piece[skip..]);
                skip = 0;
                count += 1;
            }
            from = at;
        }
        count
    }
}

/// A chunk's size line (`1a2b\r\n`) for `size` bytes, written into `line`.
fn chunk_size_line(size: usize, line: &mut [u8; 18]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut at = 16;
    let mut rest = size;
    loop {
        at -= 1;
        line[at] = HEX[rest & 0xf];
        rest >>= 4;
        if rest == 0 {
            break;
        }
    }
    line[16] = b'\r';
    line[17] = b'\n';
    &line[at..]
}

/// What a request's headers say of its body's framing and of its connection, found in one pass
/// over them (a lookup by name for each cost ~100 instructions).
#[derive(Debug, Default)]
struct HeadFacts {
    /// How many `Host` headers the request has.
    hosts: u8,
    content_length: bool,
    transfer_encoding: bool,
    /// `Connection` lists `close`.
    close: bool,
    /// `Connection` lists `keep-alive`.
    keep_alive: bool,
    /// `Expect: 100-continue`.
    expects_continue: bool,
}

impl HeadFacts {
    fn of(headers: &HeaderMap) -> Self {
        let mut facts = HeadFacts::default();
        for (name, value) in headers {
            if name == HOST {
                facts.hosts = facts.hosts.saturating_add(1);
            } else if name == CONTENT_LENGTH {
                facts.content_length = true;
            } else if name == TRANSFER_ENCODING {
                facts.transfer_encoding = true;
            } else if name == CONNECTION {
                facts.close |= lists_token(value.as_bytes(), "close");
                facts.keep_alive |= lists_token(value.as_bytes(), "keep-alive");
            } else if name == EXPECT {
                facts.expects_continue |= value.as_bytes().eq_ignore_ascii_case(b"100-continue");
            }
        }
        facts
    }
}

/// How a request's body is framed (RFC 9112 §6.3): a request has a body only when it says so.
fn request_framing(
    version: Version,
    headers: &HeaderMap,
    facts: &HeadFacts,
) -> Result<Option<Framing>, Rejection> {
    if facts.transfer_encoding {
        // Both framings at once is how requests are smuggled past a proxy: refused.
        if facts.content_length {
            return Err(Rejection::bad(
                "the request has both Content-Length and Transfer-Encoding",
            ));
        }
        if version == Version::HTTP_10 {
            return Err(Rejection::bad("an HTTP/1.0 request cannot be chunked"));
        }
        let chunked_last = list_items(headers, TRANSFER_ENCODING)
            .rfind(|item| !item.is_empty())
            .is_some_and(|last| last.eq_ignore_ascii_case(b"chunked"));
        if !chunked_last {
            return Err(Rejection {
                status: StatusCode::NOT_IMPLEMENTED,
                message: "a request body's only transfer coding may be chunked",
            });
        }
        return Ok(Some(Framing::CHUNKED));
    }
    if facts.content_length {
        return match content_length(headers) {
            Ok(0) => Ok(None),
            Ok(length) => Ok(Some(Framing::Length(length))),
            Err(_) => Err(Rejection::bad("the request's Content-Length is not valid")),
        };
    }
    Ok(None)
}

/// Reads into the spare room of `read` (which the caller reserved).
fn poll_read(
    stream: &mut TcpStream,
    read: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    tokio_util::io::poll_read_buf(Pin::new(stream), cx, read)
}

/// Calls `with` with the current time as an HTTP date, formatted once a second per thread.
fn with_http_date<R>(with: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, [u8; 29])> = const { std::cell::RefCell::new((0, [0; 29])) };
    }
    let now = SystemTime::now();
    let second = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != second {
            let formatted = httpdate::fmt_http_date(now);
            if formatted.len() == text.len() {
                text.copy_from_slice(formatted.as_bytes());
                *at = second;
            }
        }
        with(&text[..])
    })
}

#[cfg(test)]
mod tests {
    use http::{HeaderName, HeaderValue};
    use std::sync::Arc;
    use std::time::Duration;

    use axum::Router;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Sends on drop: tells a test that the handler's future was dropped.
    struct DroppedSignal(Option<tokio::sync::oneshot::Sender<()>>);

    impl Drop for DroppedSignal {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }

    struct Served {
        addr: SocketAddr,
        /// Completes when a `/wait` handler was dropped.
        waiting_dropped: tokio::sync::Mutex<tokio::sync::oneshot::Receiver<()>>,
        /// Completes when an `/endless` answer's body was dropped.
        endless_dropped: tokio::sync::Mutex<tokio::sync::oneshot::Receiver<()>>,
    }

    /// Serves a small router on loopback with [`serve`]: `/echo` answers its body, `/stream` three
    /// pieces of unknown length, `/endless` 64 KiB pieces for as long as it is read (and says when
    /// it is dropped), `/wait` never.
    async fn serving(header_read_timeout: Duration) -> Served {
        serving_with(ClientDeadlines {
            header_read: header_read_timeout,
            client_write: Duration::from_secs(60),
        })
        .await
    }

    async fn serving_with(deadlines: ClientDeadlines) -> Served {
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel();
        let dropped_tx = Arc::new(std::sync::Mutex::new(Some(dropped_tx)));
        let (endless_dropped_tx, endless_dropped_rx) = tokio::sync::oneshot::channel();
        let endless_dropped_tx = Arc::new(std::sync::Mutex::new(Some(endless_dropped_tx)));
        let router = Router::new()
            .route("/echo", post(|body: Bytes| async move { body }))
            .route(
                "/stream",
                get(|| async {
                    let pieces =
                        ["one ", "two ", "three"].map(|p| Ok::<_, io::Error>(Bytes::from(p)));
                    Body::from_stream(futures::stream::iter(pieces))
                }),
            )
            .route(
                "/endless",
                get(move || {
                    let guard = DroppedSignal(endless_dropped_tx.lock().unwrap().take());
                    let piece = Bytes::from(vec![b'e'; 64 * 1024]);
                    let pieces = futures::stream::repeat_with(move || {
                        let _held = &guard;
                        Ok::<_, io::Error>(piece.clone())
                    });
                    async move { Body::from_stream(pieces) }
                }),
            )
            .route(
                "/wait",
                get(move || {
                    let guard = DroppedSignal(dropped_tx.lock().unwrap().take());
                    async move {
                        std::future::pending::<()>().await;
                        drop(guard);
                    }
                }),
            );
        let edge = Edge::routed(router);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let drain = Arc::new(Drain::default());
            loop {
                let (tcp, peer) = listener.accept().await.unwrap();
                let (edge, drain) = (edge.clone(), drain.clone());
                tokio::spawn(async move {
                    serve(
                        tcp,
                        peer,
                        &edge,
                        &drain,
                        Instant::now() + deadlines.header_read,
                        deadlines,
                    )
                    .await;
                });
            }
        });
        Served {
            addr,
            waiting_dropped: tokio::sync::Mutex::new(dropped_rx),
            endless_dropped: tokio::sync::Mutex::new(endless_dropped_rx),
        }
    }

    /// One answer read off a connection: status, headers, body (de-chunked).
    struct Answer {
        status: u16,
        headers: HeaderMap,
        body: Vec<u8>,
    }

    /// Reads the next answer from `tcp`, with what was read past earlier answers in `read`.
    async fn next_answer(tcp: &mut TcpStream, read: &mut BytesMut, head_request: bool) -> Answer {
        let within = Duration::from_secs(20);
        let (status, headers) = loop {
            let mut slots = [httparse::EMPTY_HEADER; 32];
            let mut parsed = httparse::Response::new(&mut slots);
            if let httparse::Status::Complete(length) = parsed.parse(read).unwrap() {
                let mut headers = HeaderMap::new();
                for h in parsed.headers.iter() {
                    headers.append(
                        HeaderName::from_bytes(h.name.as_bytes()).unwrap(),
                        HeaderValue::from_bytes(h.value).unwrap(),
                    );
                }
                let status = parsed.code.unwrap();
                read.advance(length);
                break (status, headers);
            }
            let n = tokio::time::timeout(within, tcp.read_buf(read))
                .await
                .expect("an answer's head within 20 s")
                .unwrap();
            assert!(n > 0, "closed before an answer's head: {read:?}");
        };
        let mut framing = if head_request || status == 100 {
            Framing::Length(0)
        } else if headers.contains_key(TRANSFER_ENCODING) {
            Framing::CHUNKED
        } else if headers.contains_key(CONTENT_LENGTH) {
            Framing::Length(content_length(&headers).unwrap())
        } else {
            Framing::UntilClose
        };
        let mut body = Vec::new();
        loop {
            match framing.decode(read).unwrap() {
                Decoded::Data(data) => body.extend_from_slice(&data),
                Decoded::End => break,
                Decoded::NeedMore => {
                    let n = tokio::time::timeout(within, tcp.read_buf(read))
                        .await
                        .expect("an answer's body within 20 s")
                        .unwrap();
                    if n == 0 {
                        assert_eq!(framing, Framing::UntilClose, "closed inside a body");
                        break;
                    }
                }
            }
        }
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Whether the server closes `tcp` (reads nothing more) within 20 s.
    async fn closed(tcp: &mut TcpStream) -> bool {
        let mut rest = Vec::new();
        match tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut rest)).await {
            Ok(Ok(_)) => rest.is_empty(),
            Ok(Err(_)) => true,
            Err(_) => false,
        }
    }

    fn echo(body: &str) -> String {
        format!(
            "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn requests_on_one_connection_are_answered_in_order_pipelined_or_not() {
        let served = serving(Duration::from_secs(30)).await;
        let mut tcp = TcpStream::connect(served.addr).await.unwrap();
        let mut read = BytesMut::new();
        tcp.write_all(echo("first").as_bytes()).await.unwrap();
        let answer = next_answer(&mut tcp, &mut read, false).await;
        assert_eq!((answer.status, &answer.body[..]), (200, &b"first"[..]));
        assert!(answer.headers.contains_key(DATE));
        assert_eq!(answer.headers[CONTENT_LENGTH], "5");
        // Three at once.
        let pipelined = [echo("a"), echo("bb"), echo("ccc")].concat();
        tcp.write_all(pipelined.as_bytes()).await.unwrap();
        for expected in ["a", "bb", "ccc"] {
            let answer = next_answer(&mut tcp, &mut read, false).await;
            assert_eq!(answer.body, expected.as_bytes());
        }
        // The client's `connection: close` ends it after the answer.
        tcp.write_all(
            b"POST /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 4\r\n\r\nlast",
        )
        .await
        .unwrap();
        let answer = next_answer(&mut tcp, &mut read, false).await;
        assert_eq!(answer.body, b"last");
        assert_eq!(answer.headers[CONNECTION], "close");
        assert!(closed(&mut tcp).await);
    }

    #[tokio::test]
    async fn a_body_arriving_in_pieces_or_chunks_reaches_the_handler_whole() {
        let served = serving(Duration::from_secs(30)).await;
        let mut tcp = TcpStream::connect(served.addr).await.unwrap();
        let mut read = BytesMut::new();
        let body = "x".repeat(100_000);
        let wire = echo(&body);
        for piece in wire.as_bytes().chunks(30_000) {
            tcp.write_all(piece).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let answer = next_answer(&mut tcp, &mut read, false).await;
        assert_eq!(answer.body.len(), body.len());

        let chunked =
            "POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
        tcp.write_all(chunked.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        tcp.write_all(b"6;ext=1\r\n world\r\n0\r\ntrailer: 1\r\n\r\n")
            .await
            .unwrap();
        let answer = next_answer(&mut tcp, &mut read, false).await;
        assert_eq!(answer.body, b"hello world");
        // The connection still serves.
        tcp.write_all(echo("after").as_bytes()).await.unwrap();
        assert_eq!(next_answer(&mut tcp, &mut read, false).await.body, b"after");
    }

    #[tokio::test]
    async fn a_client_expecting_100_continue_is_told_to_send_its_body() {
        let served = serving(Duration::from_secs(30)).await;
        let mut tcp = TcpStream::connect(served.addr).await.unwrap();
        let mut read = BytesMut::new();
        tcp.write_all(
            b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n",
        )
        .await
        .unwrap();
        let interim = next_answer(&mut tcp, &mut read, false).await;
        assert_eq!(interim.status, 100);
        tcp.write_all(b"body").await.unwrap();
        let answer = next_answer(&mut tcp, &mut read, false).await;
        assert_eq!((answer.status, &answer.body[..]), (200, &b"body"[..]));
    }

    #[tokio::test]
    async fn an_answer_of_unknown_length_is_chunked_for_http_1_1_and_closed_for_http_1_0() {
        let served = serving(Duration::from_secs(30)).await;
        let mut tcp = TcpStream::connect(served.addr).await.unwrap();
        let mut read = BytesMut::new();
        tcp.write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = next_answer(&mut tcp, &mut read, false).await;
        assert_eq!(answer.headers[TRANSFER_ENCODING], "chunked");
        assert_eq!(answer.body, b"one two three");
        // HEAD: the head only, and the connection goes on.
        tcp.write_all(b"HEAD /stream HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = next_answer(&mut tcp, &mut read, true).await;
        assert_eq!(answer.status, 200);
        tcp.write_all(echo("still").as_bytes()).await.unwrap();
        assert_eq!(next_answer(&mut tcp, &mut read, false).await.body, b"still");

        let mut old = TcpStream::connect(served.addr).await.unwrap();
        old.write_all(b"GET /stream HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let answer = next_answer(&mut old, &mut read, false).await;
        assert!(!answer.headers.contains_key(TRANSFER_ENCODING));
        assert_eq!(answer.body, b"one two three");
    }

    #[tokio::test]
    async fn requests_that_cannot_be_served_are_answered_and_closed() {
        let served = serving(Duration::from_secs(30)).await;
        let cases: [(&[u8], u16); 8] = [
            (b"GET / HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n", 400),
            (b"GET / HTTP/3.0\r\n\r\n", 505),
            (
                b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
                400,
            ),
            (b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: x\r\n\r\n", 400),
            (
                b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n",
                501,
            ),
            // RFC 9112 §3.2: an HTTP/1.1 request names exactly one host.
            (b"GET /stream HTTP/1.1\r\n\r\n", 400),
            (b"GET /stream HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nhost: x\r\nx-big: ", 431),
        ];
        for (wire, status) in cases {
            let mut tcp = TcpStream::connect(served.addr).await.unwrap();
            let mut read = BytesMut::new();
            tcp.write_all(wire).await.unwrap();
            if status == 431 {
                let _ = tcp.write_all(&vec![b'a'; 70 * 1024]).await;
            }
            let answer = next_answer(&mut tcp, &mut read, false).await;
            assert_eq!(answer.status, status, "{}", String::from_utf8_lossy(wire));
            let error: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
            assert!(error["error"]["message"].is_string(), "{error}");
            assert!(closed(&mut tcp).await);
        }
    }

    #[tokio::test]
    async fn a_client_that_closes_while_served_drops_its_handler() {
        let served = serving(Duration::from_secs(30)).await;
        let mut tcp = TcpStream::connect(served.addr).await.unwrap();
        tcp.write_all(b"GET /wait HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(tcp);
        let mut dropped = served.waiting_dropped.lock().await;
        tokio::time::timeout(Duration::from_secs(20), &mut *dropped)
            .await
            .expect("the handler is dropped when its client closes")
            .unwrap();
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_let_go_after_the_write_timeout_and_a_slow_one_is_not() {
        let deadlines = ClientDeadlines {
            header_read: Duration::from_secs(30),
            client_write: Duration::from_secs(1),
        };
        let served = serving_with(deadlines).await;
        // A reader slower than the gateway writes but never idle for the timeout keeps its
        // answer past several timeouts.
        let mut slow = TcpStream::connect(served.addr).await.unwrap();
        slow.write_all(b"GET /endless HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let mut buf = vec![0u8; 16 * 1024];
        let mut received = 0;
        while started.elapsed() < Duration::from_secs(3) {
            let n = tokio::time::timeout(Duration::from_secs(20), slow.read(&mut buf))
                .await
                .expect("the slow reader still gets its answer")
                .unwrap();
            assert!(n > 0, "closed after {received} bytes");
            received += n;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(slow);
        // A server of its own, whose `/endless` signal is still unused.
        let served = serving_with(deadlines).await;
        // A client that asks and never reads: once the socket buffers are full, the write stalls,
        // and after the timeout the answer (and what feeds it) is dropped.
        let mut stuck = TcpStream::connect(served.addr).await.unwrap();
        stuck
            .write_all(b"GET /endless HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut dropped = served.endless_dropped.lock().await;
        tokio::time::timeout(Duration::from_secs(30), &mut *dropped)
            .await
            .expect("the answer of a client that reads nothing is dropped")
            .unwrap();
        drop(stuck);
    }

    #[tokio::test]
    async fn a_connection_without_a_request_by_its_deadline_is_closed() {
        let served = serving(Duration::from_millis(300)).await;
        let mut idle = TcpStream::connect(served.addr).await.unwrap();
        assert!(closed(&mut idle).await);
        // The deadline counts again from an answer's end.
        let mut tcp = TcpStream::connect(served.addr).await.unwrap();
        let mut read = BytesMut::new();
        tcp.write_all(echo("one").as_bytes()).await.unwrap();
        assert_eq!(next_answer(&mut tcp, &mut read, false).await.body, b"one");
        assert!(closed(&mut tcp).await);
    }

    #[test]
    fn chunk_size_lines_are_lowercase_hex() {
        let mut line = [0u8; 18];
        assert_eq!(chunk_size_line(0, &mut line), b"0\r\n");
        assert_eq!(chunk_size_line(26, &mut line), b"1a\r\n");
        assert_eq!(
            chunk_size_line(usize::MAX, &mut line),
            b"ffffffffffffffff\r\n"
        );
    }

    #[test]
    fn kept_pieces_are_written_between_the_staged_ones() {
        let mut out = Outgoing::default();
        out.staged.extend_from_slice(b"head|");
        out.data(Bytes::from(vec![b'k'; COPY_LIMIT + 1]));
        out.staged.extend_from_slice(b"|tail");
        let gather = |skip| {
            let mut slices = [IoSlice::new(&[]); 8];
            let count = out.slices_from(skip, &mut slices);
            slices[..count]
                .iter()
                .flat_map(|s| s.to_vec())
                .collect::<Vec<u8>>()
        };
        let all = gather(0);
        assert_eq!(all.len(), out.len());
        assert!(all.starts_with(b"head|k") && all.ends_with(b"k|tail"));
        assert_eq!(gather(3), all[3..]);
        assert_eq!(gather(5 + COPY_LIMIT), all[5 + COPY_LIMIT..]);
        assert!(gather(out.len()).is_empty());
    }
}
