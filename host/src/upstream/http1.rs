//! HTTP/1.1 on one connection to a plain-`http` upstream, spoken by the task that sends.
//!
//! hyper's client drives each connection from a task of its own: the request goes to it through a
//! channel, the answer's head and every piece of its body come back through two more, and each
//! hand-over wakes the other task (~12,000 instructions of a non-streaming request were that task,
//! callgrind). Here the attempt's own task writes the request and reads the answer from the socket.
//! What the gateway sends is narrow (a `POST` with a `Content-Length` body, its own headers), so the
//! writer is short; answers are read as RFC 9112 frames them: by `Content-Length`, chunked, or to
//! the connection's close. Heads are parsed by `httparse`, the parser hyper uses.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, Method, Response, StatusCode, Version};
use switchyard_http1::{Decoded, Framing, HeadCopy, content_length, has_token, list_items};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest answer head read (status line and headers); hyper's default buffer limit is ~400 KiB,
/// but no upstream needs more than a few KiB of headers.
const HEAD_LIMIT: usize = 64 * 1024;

/// Most headers an answer may have (hyper's default).
const MAX_HEADERS: usize = 100;

/// What a read asks the socket for at least, and at most for a long body of known length.
const READ_MIN: usize = 8 * 1024;
const READ_MAX: usize = 64 * 1024;

/// Why a request could not be sent or its answer read.
#[derive(Debug, thiserror::Error)]
pub enum Http1Error {
    #[error("writing the request: {0}")]
    Write(#[source] io::Error),
    #[error("reading the answer: {0}")]
    Read(#[source] io::Error),
    #[error("the upstream closed the connection before its answer was complete")]
    Closed,
    #[error("the upstream's answer is not valid HTTP/1.1: {0}")]
    Malformed(&'static str),
    #[error("the upstream's answer head is larger than {HEAD_LIMIT} bytes")]
    HeadTooLarge,
}

/// One connection, with what was read from it and not yet taken.
pub(super) struct Connection {
    stream: TcpStream,
    read: BytesMut,
}

/// An answer's body being read from its connection.
pub(super) struct BodyReader {
    framing: Framing,
    /// Whether the connection may carry another request once this body has been read.
    keep_alive: bool,
    done: bool,
}

impl Connection {
    pub(super) fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            read: BytesMut::new(),
        }
    }

    /// Lets go of a read buffer grown for a long answer before the connection waits in its pool:
    /// a thousand idle connections keep 8 KiB each, not what their largest answer needed.
    pub(super) fn shrink_for_idle(&mut self) {
        if self.read.capacity() > 2 * READ_MIN {
            self.read = BytesMut::new();
        }
    }

    /// Whether an idle connection can take a request: the upstream has neither closed it nor sent
    /// anything unasked. Costs no system call unless the socket was seen readable since its last
    /// answer.
    pub(super) fn is_reusable(&self) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        match self.stream.try_read(&mut [0u8; 1]) {
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
            // Closed (0), or bytes no request asked for.
            Ok(_) => false,
        }
    }

    /// Writes a request: its head (see [`RequestHead`]) and its body. Returns whether any of it
    /// was written when it fails (a request not written at all may go out again on another
    /// connection).
    pub(super) async fn write_request(
        &mut self,
        head: &[u8],
        body: &[u8],
    ) -> Result<(), (Http1Error, bool)> {
        let (mut head, mut body) = (head, body);
        let mut written_any = false;
        while !head.is_empty() || !body.is_empty() {
            let written = if head.is_empty() {
                self.stream.write(body).await
            } else {
                self.stream
                    .write_vectored(&[IoSlice::new(head), IoSlice::new(body)])
                    .await
            };
            match written {
                Ok(0) => {
                    return Err((
                        Http1Error::Write(io::ErrorKind::WriteZero.into()),
                        written_any,
                    ));
                }
                Ok(n) => {
                    written_any = true;
                    let from_head = n.min(head.len());
                    head = &head[from_head..];
                    body = &body[n - from_head..];
                }
                Err(e) => return Err((Http1Error::Write(e), written_any)),
            }
        }
        Ok(())
    }

    /// Reads an answer's head (passing over `1xx` interim answers) and returns it with the reader
    /// of its body.
    pub(super) async fn read_head(&mut self) -> Result<(Response<()>, BodyReader), Http1Error> {
        loop {
            if let Some(answer) = self.parse_head()? {
                return Ok(answer);
            }
            if self.read.len() >= HEAD_LIMIT {
                return Err(Http1Error::HeadTooLarge);
            }
            self.read.reserve(READ_MIN);
            let read = self.stream.read_buf(&mut self.read).await;
            match read.map_err(Http1Error::Read)? {
                0 => return Err(Http1Error::Closed),
                _ => continue,
            }
        }
    }

    /// The answer's head when the buffer holds all of it (an interim `1xx` is dropped, and the
    /// head after it parsed).
    fn parse_head(&mut self) -> Result<Option<(Response<()>, BodyReader)>, Http1Error> {
        loop {
            // Left uninitialized: zeroing room for 100 headers cost ~3,200 instructions an answer.
            let mut slots = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS];
            let mut parsed = httparse::Response::new(&mut []);
            let config = httparse::ParserConfig::default();
            let length = match config.parse_response_with_uninit_headers(
                &mut parsed,
                &self.read,
                &mut slots,
            ) {
                Ok(httparse::Status::Complete(length)) => length,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(Http1Error::Malformed("more than 100 headers"));
                }
                Err(_) => return Err(Http1Error::Malformed("its head does not parse")),
            };
            let code = parsed.code.unwrap_or_default();
            if (100..200).contains(&code) {
                if code == 101 {
                    return Err(Http1Error::Malformed("it switches protocols"));
                }
                self.read.advance(length);
                continue;
            }
            let status =
                StatusCode::from_u16(code).map_err(|_| Http1Error::Malformed("its status code"))?;
            let version = match parsed.version {
                Some(0) => Version::HTTP_10,
                _ => Version::HTTP_11,
            };
            let headers = HeadCopy::new(&self.read, length)
                .headers(parsed.headers)
                .map_err(|m| Http1Error::Malformed(m.0))?;
            self.read.advance(length);
            let body = BodyReader::for_answer(status, version, &headers)?;
            let mut response = Response::new(());
            *response.status_mut() = status;
            *response.version_mut() = version;
            *response.headers_mut() = headers;
            return Ok(Some((response, body)));
        }
    }

    /// The body's next piece: `None` at its end.
    pub(super) fn poll_body(
        &mut self,
        body: &mut BodyReader,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Http1Error>>> {
        loop {
            if body.done {
                return Poll::Ready(None);
            }
            match body.decode(&mut self.read) {
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(Decoded::End) => {
                    body.done = true;
                    return Poll::Ready(None);
                }
                Ok(Decoded::NeedMore) => {}
                Err(error) => return Poll::Ready(Some(Err(error))),
            }
            let wanted = match body.framing {
                Framing::Length(left) => (left as usize).clamp(READ_MIN, READ_MAX),
                _ => READ_MIN,
            };
            self.read.reserve(wanted);
            let read = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut self.stream),
                cx,
                &mut self.read
            ));
            match read {
                Ok(0) if body.framing == Framing::UntilClose => {
                    body.done = true;
                    return Poll::Ready(None);
                }
                Ok(0) => return Poll::Ready(Some(Err(Http1Error::Closed))),
                Ok(_) => {}
                Err(error) => return Poll::Ready(Some(Err(Http1Error::Read(error)))),
            }
        }
    }

    /// Whether the connection can carry the next request now that `body` was read to its end:
    /// the answer allowed it, and nothing came after the answer.
    pub(super) fn reusable_after(&self, body: &BodyReader) -> bool {
        body.done && body.keep_alive && self.read.is_empty()
    }
}

impl BodyReader {
    /// How the body of an answer with this head is framed, and whether its connection stays open.
    fn for_answer(
        status: StatusCode,
        version: Version,
        headers: &HeaderMap,
    ) -> Result<Self, Http1Error> {
        let mut keep_alive = match version {
            Version::HTTP_10 => has_token(headers, CONNECTION, "keep-alive"),
            _ => !has_token(headers, CONNECTION, "close"),
        };
        let framing = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            Framing::Length(0)
        } else if let Some(last) = list_items(headers, TRANSFER_ENCODING).rfind(|c| !c.is_empty()) {
            // A length beside a transfer coding is ignored, and the connection not trusted after.
            if headers.contains_key(CONTENT_LENGTH) {
                keep_alive = false;
            }
            if last.eq_ignore_ascii_case(b"chunked") {
                Framing::CHUNKED
            } else {
                keep_alive = false;
                Framing::UntilClose
            }
        } else if headers.contains_key(CONTENT_LENGTH) {
            Framing::Length(content_length(headers).map_err(|m| Http1Error::Malformed(m.0))?)
        } else {
            keep_alive = false;
            Framing::UntilClose
        };
        let done = framing == Framing::Length(0);
        Ok(Self {
            framing,
            keep_alive,
            done,
        })
    }

    pub(super) fn is_end_stream(&self) -> bool {
        self.done
    }

    /// The bytes of the body still to come, when known.
    pub(super) fn remaining(&self) -> Option<u64> {
        if self.done {
            return Some(0);
        }
        self.framing.remaining()
    }

    /// The next piece of the body in `read`, taking it out.
    fn decode(&mut self, read: &mut BytesMut) -> Result<Decoded, Http1Error> {
        let decoded = self
            .framing
            .decode(read)
            .map_err(|m| Http1Error::Malformed(m.0))?;
        // The caller sees a sized body's end with its last piece.
        if matches!(decoded, Decoded::Data(_)) && self.framing == Framing::Length(0) {
            self.done = true;
        }
        Ok(decoded)
    }
}

/// A request's head as it is written: its line, then each header as it is given, then the body's
/// length. The gateway's headers go straight into it, with no map between (a `HeaderMap`'s
/// hashing and each value's allocation cost ~1,000 instructions a request, only to be written out).
pub(super) struct RequestHead(Vec<u8>);

/// A header value with bytes a header cannot carry (control characters, line breaks).
#[derive(Debug)]
pub(super) struct InvalidHeaderValue;

impl RequestHead {
    pub(super) fn new(method: &Method, target: &str) -> Self {
        let mut head = Vec::with_capacity(256 + target.len());
        head.extend_from_slice(method.as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(target.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\n");
        Self(head)
    }

    /// Adds a header whose value is `pieces` one after another.
    pub(super) fn header(
        &mut self,
        name: &HeaderName,
        pieces: &[&[u8]],
    ) -> Result<(), InvalidHeaderValue> {
        // What `HeaderValue::from_bytes` accepts.
        let valid = |b: &u8| *b == b'\t' || (*b >= 0x20 && *b != 0x7f);
        if !pieces.iter().all(|piece| piece.iter().all(valid)) {
            return Err(InvalidHeaderValue);
        }
        self.0.extend_from_slice(name.as_str().as_bytes());
        self.0.extend_from_slice(b": ");
        for piece in pieces {
            self.0.extend_from_slice(piece);
        }
        self.0.extend_from_slice(b"\r\n");
        Ok(())
    }

    /// The head, ended by the body's `Content-Length` and the blank line.
    pub(super) fn finish(mut self, body_len: usize) -> Vec<u8> {
        self.0.extend_from_slice(b"content-length: ");
        self.0
            .extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        self.0.extend_from_slice(b"\r\n\r\n");
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    /// Decodes `wire` (a body as framed by `head`) fed `step` bytes at a time.
    fn decode_all(head: &str, wire: &[u8], step: usize) -> Result<(Vec<u8>, bool), Http1Error> {
        let mut connection = BytesMut::from(format!("{head}\r\n\r\n").as_bytes());
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut slots);
        let httparse::Status::Complete(length) = parsed.parse(&connection).unwrap() else {
            panic!("partial head");
        };
        let mut headers = HeaderMap::new();
        for h in parsed.headers.iter() {
            headers.append(
                HeaderName::from_bytes(h.name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(h.value).unwrap(),
            );
        }
        let version = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        let status = StatusCode::from_u16(parsed.code.unwrap()).unwrap();
        connection.advance(length);
        let mut body = BodyReader::for_answer(status, version, &headers)?;
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            match body.decode(&mut connection)? {
                Decoded::Data(data) => out.extend_from_slice(&data),
                Decoded::End => {
                    body.done = true;
                    break;
                }
                Decoded::NeedMore if fed < wire.len() => {
                    let next = (fed + step).min(wire.len());
                    connection.extend_from_slice(&wire[fed..next]);
                    fed = next;
                }
                Decoded::NeedMore if body.framing == Framing::UntilClose => {
                    body.done = true;
                    break;
                }
                Decoded::NeedMore => return Err(Http1Error::Closed),
            }
            if body.done {
                break;
            }
        }
        let reusable = body.keep_alive && connection.is_empty() && fed == wire.len();
        Ok((out, reusable))
    }

    /// Checks that `wire`, framed by `head`, reads as `body` and leaves its connection reusable
    /// or not.
    fn reads(head: &str, wire: &[u8], step: usize, body: &[u8], reusable: bool) {
        let (read, left_reusable) = decode_all(head, wire, step).unwrap();
        assert_eq!(read, body, "{head}");
        assert_eq!(left_reusable, reusable, "{head}");
    }

    #[test]
    fn a_chunked_body_reads_the_same_whatever_the_reads_split() {
        let wire =
            b"5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, wire.len()] {
            let (body, reusable) =
                decode_all("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked", wire, step).unwrap();
            assert_eq!(body, b"helloabcdefghijklmnopqrstuvwxyz", "step {step}");
            assert!(reusable, "step {step}");
        }
    }

    #[test]
    fn a_length_body_ends_at_its_length_and_bytes_after_it_keep_the_connection_from_reuse() {
        let head = "HTTP/1.1 200 OK\r\ncontent-length: 5";
        reads(head, b"hello", 2, b"hello", true);
        // Bytes no request asked for.
        reads(head, b"helloHTTP/1.1", 100, b"hello", false);
    }

    #[test]
    fn a_body_without_length_or_coding_runs_to_the_close_and_ends_its_connection() {
        reads("HTTP/1.1 200 OK", b"all of it", 4, b"all of it", false);
        let gzip = "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip";
        reads(gzip, b"zipped", 100, b"zipped", false);
    }

    #[test]
    fn what_the_answer_says_of_its_connection_decides_its_reuse() {
        let reusable = |head: &str| decode_all(head, b"ok", 100).unwrap().1;
        assert!(reusable("HTTP/1.1 200 OK\r\ncontent-length: 2"));
        assert!(!reusable(
            "HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 2"
        ));
        assert!(!reusable("HTTP/1.0 200 OK\r\ncontent-length: 2"));
        assert!(reusable(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2"
        ));
        // A length beside a coding: the coding frames the body, the connection is not trusted.
        let both = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked";
        reads(both, b"2\r\nok\r\n0\r\n\r\n", 100, b"ok", false);
    }

    #[test]
    fn an_answer_without_a_body_ends_at_its_head() {
        for head in ["HTTP/1.1 204 No Content", "HTTP/1.1 304 Not Modified"] {
            let (body, reusable) = decode_all(head, b"", 1).unwrap();
            assert!(body.is_empty(), "{head}");
            assert!(reusable, "{head}");
        }
    }

    #[test]
    fn broken_framing_is_an_error_naming_what_broke() {
        let error = |head: &str, wire: &[u8]| decode_all(head, wire, 3).unwrap_err().to_string();
        let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked";
        assert!(error(chunked, b"zz\r\n").contains("chunk-size"));
        assert!(error(chunked, b"2\r\nabXY").contains("CRLF"));
        assert!(error(chunked, b"11111111111111111\r\n").contains("chunk-size"));
        assert!(error(chunked, &[b'1'; 5000]).contains("too long"));
        assert!(error(chunked, b"3\r\nab").contains("closed"));
        let mut trailers = b"0\r\n".to_vec();
        trailers.extend(std::iter::repeat_n(b"x-t: 1\r\n".as_slice(), 3000).flatten());
        assert!(error(chunked, &trailers).contains("trailers"));
        assert!(
            error("HTTP/1.1 200 OK\r\ncontent-length: 5", b"abc").contains("closed"),
            "a body shorter than its length"
        );
        assert!(
            error(
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6",
                b"abcde"
            )
            .contains("differ")
        );
        assert!(error("HTTP/1.1 200 OK\r\ncontent-length: -1", b"").contains("Content-Length"));
        // The same value twice is one length.
        let (body, _) = decode_all("HTTP/1.1 200 OK\r\ncontent-length: 2, 2", b"ok", 1).unwrap();
        assert_eq!(body, b"ok");
    }

    #[test]
    fn the_request_head_names_its_length_after_the_given_headers() {
        let mut head = RequestHead::new(&Method::POST, "/v1/chat/completions?x=1");
        head.header(&http::header::HOST, &[b"10.0.0.7:8000"])
            .unwrap();
        head.header(&http::header::AUTHORIZATION, &[b"Bearer ", b"sk-1"])
            .unwrap();
        assert_eq!(
            String::from_utf8(head.finish(1234)).unwrap(),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 10.0.0.7:8000\r\n\
             authorization: Bearer sk-1\r\ncontent-length: 1234\r\n\r\n"
        );
        let mut head = RequestHead::new(&Method::POST, "/");
        for bad in [&b"a\r\nx-injected: 1"[..], b"nul\0", b"del\x7f"] {
            assert!(head.header(&http::header::AUTHORIZATION, &[bad]).is_err());
        }
        head.header(&http::header::USER_AGENT, &[b"tab\tand \xc3\xa9"])
            .unwrap();
    }
}
