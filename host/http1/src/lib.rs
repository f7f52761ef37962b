//! HTTP/1.1 message bodies as RFC 9112 frames them, for both sides of the gateway: the requests of
//! the clients it serves (`server/http1.rs`) and the answers of the plain-`http` upstreams it
//! speaks to (`upstream/http1.rs`). A body is framed by its `Content-Length`, by chunks, or (an
//! answer only) by the connection's close; [`Framing::decode`] takes its pieces out of a
//! connection's read buffer as they arrive, whatever the reads' split.

#![forbid(unsafe_code)]

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, header::CONTENT_LENGTH};

/// Largest chunk-size line, extensions included.
pub const CHUNK_LINE_LIMIT: usize = 4 * 1024;

/// Largest trailer section of a chunked body (read and dropped: nothing here needs trailers).
pub const TRAILERS_LIMIT: usize = 16 * 1024;

/// What in a message breaks HTTP/1.1's framing; the text names it ("a chunk-size line does not
/// parse"), for a caller to put after whose message it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub &'static str);

/// How a body ends (RFC 9112 §6.3), and how much of it is still to come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes left.
    Length(u64),
    /// Chunks, and where their reader is.
    Chunked(Chunk),
    /// Everything until the connection closes (answers only).
    UntilClose,
}

/// Where a chunked body's reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk, this many trailer bytes read so far.
    Trailers(usize),
    /// The blank line after the trailers was read: the body is over.
    Done,
}

/// What the buffered bytes gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// The body's next piece.
    Data(Bytes),
    /// The body is over (and stays over).
    End,
    /// More bytes must be read first.
    NeedMore,
}

impl Framing {
    /// A chunked body, before its first chunk.
    pub const CHUNKED: Framing = Framing::Chunked(Chunk::Size);

    /// Whether the whole body has been taken out.
    pub fn is_complete(&self) -> bool {
        matches!(self, Framing::Length(0) | Framing::Chunked(Chunk::Done))
    }

    /// The body's bytes still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Framing::Length(left) => Some(*left),
            Framing::Chunked(Chunk::Done) => Some(0),
            _ => None,
        }
    }

    /// The next piece of the body in `read`, taken out of it. A body framed by its length ends
    /// with its last piece: [`Framing::is_complete`] says so as soon as that piece is returned.
    pub fn decode(&mut self, read: &mut BytesMut) -> Result<Decoded, Malformed> {
        match self {
            Framing::Length(0) => Ok(Decoded::End),
            Framing::Length(left) => {
                if read.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                Ok(Decoded::Data(take_up_to(read, left)))
            }
            Framing::UntilClose => {
                if read.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                Ok(Decoded::Data(read.split().freeze()))
            }
            Framing::Chunked(chunk) => decode_chunked(chunk, read),
        }
    }
}

/// What `read` holds of the `left` bytes still to come, taken out of it (`left` counted down).
fn take_up_to(read: &mut BytesMut, left: &mut u64) -> Bytes {
    let taken = read.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
    *left -= taken as u64;
    read.split_to(taken).freeze()
}

/// The next piece of a chunked body in `read` (RFC 9112 §7.1).
fn decode_chunked(chunk: &mut Chunk, read: &mut BytesMut) -> Result<Decoded, Malformed> {
    loop {
        match chunk {
            Chunk::Size => {
                let Some(end) = memchr::memchr(b'\n', read) else {
                    if read.len() > CHUNK_LINE_LIMIT {
                        return Err(Malformed("a chunk-size line is too long"));
                    }
                    return Ok(Decoded::NeedMore);
                };
                let size = chunk_size(&read[..=end])?;
                read.advance(end + 1);
                *chunk = match size {
                    0 => Chunk::Trailers(0),
                    size => Chunk::Data(size),
                };
            }
            Chunk::Data(left) => {
                if read.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let data = take_up_to(read, left);
                if *left == 0 {
                    *chunk = Chunk::DataEnd;
                }
                return Ok(Decoded::Data(data));
            }
            Chunk::DataEnd => {
                if read.len() < 2 {
                    return Ok(Decoded::NeedMore);
                }
                if &read[..2] != b"\r\n" {
                    return Err(Malformed("a chunk does not end with CRLF"));
                }
                read.advance(2);
                *chunk = Chunk::Size;
            }
            Chunk::Trailers(seen) => {
                let Some(end) = memchr::memchr(b'\n', read) else {
                    if *seen + read.len() > TRAILERS_LIMIT {
                        return Err(Malformed("its trailers are too large"));
                    }
                    return Ok(Decoded::NeedMore);
                };
                let line = &read[..end];
                let blank = line.is_empty() || line == b"\r";
                *seen += end + 1;
                read.advance(end + 1);
                if blank {
                    *chunk = Chunk::Done;
                    return Ok(Decoded::End);
                }
                if *seen > TRAILERS_LIMIT {
                    return Err(Malformed("its trailers are too large"));
                }
            }
            Chunk::Done => return Ok(Decoded::End),
        }
    }
}

/// A chunk-size line's size: hex digits, then optional extensions after `;`, ending in CRLF.
fn chunk_size(line: &[u8]) -> Result<u64, Malformed> {
    let bad = Malformed("a chunk-size line does not parse");
    let line = line
        .strip_suffix(b"\r\n")
        .ok_or(Malformed("a chunk-size line does not end with CRLF"))?;
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if digits == 0 || digits > 16 {
        return Err(bad);
    }
    let rest = line[digits..].trim_ascii_start();
    if !(rest.is_empty() || rest.starts_with(b";")) {
        return Err(bad);
    }
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| bad)?;
    u64::from_str_radix(text, 16).map_err(|_| bad)
}

/// One copy of a message head that `httparse` parsed, for the pieces of the message to be slices
/// of it: the parser's slices borrow the connection's read buffer, which moves on past the head.
pub struct HeadCopy {
    copy: Bytes,
    /// Where the read buffer started, to find a parsed slice's place in the copy.
    base: usize,
}

impl HeadCopy {
    /// Copies the first `length` bytes of `buffer`, the buffer the head was parsed from.
    pub fn new(buffer: &[u8], length: usize) -> Self {
        Self {
            copy: Bytes::copy_from_slice(&buffer[..length]),
            base: buffer.as_ptr() as usize,
        }
    }

    /// The copy of `part`, a slice the parser returned.
    pub fn slice(&self, part: &[u8]) -> Bytes {
        let at = part.as_ptr() as usize - self.base;
        self.copy.slice(at..at + part.len())
    }

    /// The parsed headers, in their order, values sliced from the copy.
    pub fn headers(&self, parsed: &[httparse::Header<'_>]) -> Result<HeaderMap, Malformed> {
        let mut headers = HeaderMap::with_capacity(parsed.len());
        for header in parsed {
            let name = HeaderName::from_bytes(header.name.as_bytes())
                .map_err(|_| Malformed("a header name is not valid"))?;
            let value = HeaderValue::from_maybe_shared(self.slice(header.value))
                .map_err(|_| Malformed("a header value is not valid"))?;
            headers.append(name, value);
        }
        Ok(headers)
    }
}

/// The message's `Content-Length`: repeated values (as lists or headers) must agree.
pub fn content_length(headers: &HeaderMap) -> Result<u64, Malformed> {
    // Nearly always one value of plain digits.
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    if let (Some(only), None) = (values.next(), values.next())
        && let Some(length) = digits(only.as_bytes())
    {
        return Ok(length);
    }
    let mut length = None;
    for part in list_items(headers, CONTENT_LENGTH) {
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return Err(Malformed("its Content-Length"));
        }
        let parsed: u64 = std::str::from_utf8(part)
            .ok()
            .and_then(|p| p.parse().ok())
            .ok_or(Malformed("its Content-Length"))?;
        if length.is_some_and(|l| l != parsed) {
            return Err(Malformed("its Content-Length values differ"));
        }
        length = Some(parsed);
    }
    length.ok_or(Malformed("its Content-Length"))
}

/// `text` as a decimal number: digits only, without overflow.
fn digits(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u64, |n, b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// The items of a comma-separated header over all its lines, trimmed (empty ones included).
pub fn list_items(headers: &HeaderMap, name: HeaderName) -> impl DoubleEndedIterator<Item = &[u8]> {
    headers
        .get_all(name)
        .into_iter()
        .flat_map(|value| value.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
}

/// Whether a comma-separated header such as `Connection` lists `token` in any of its lines.
pub fn has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|value| lists_token(value.as_bytes(), token))
}

/// Whether one line of a comma-separated header lists `token` (trimmed, in any case).
pub fn lists_token(value: &[u8], token: &str) -> bool {
    value
        .split(|b| *b == b',')
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed `step` bytes at a time; `Ok(None)` when it ran out before the end.
    fn decode_all(
        mut framing: Framing,
        wire: &[u8],
        step: usize,
    ) -> Result<Option<(Vec<u8>, usize)>, Malformed> {
        let mut read = BytesMut::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            match framing.decode(&mut read)? {
                Decoded::Data(data) => out.extend_from_slice(&data),
                Decoded::End => return Ok(Some((out, read.len() + wire.len() - fed))),
                Decoded::NeedMore if fed < wire.len() => {
                    let next = (fed + step).min(wire.len());
                    read.extend_from_slice(&wire[fed..next]);
                    fed = next;
                }
                Decoded::NeedMore => return Ok(None),
            }
        }
    }

    #[test]
    fn a_chunked_body_reads_the_same_whatever_the_reads_split_and_stays_over() {
        let wire =
            b"5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, wire.len()] {
            let (body, after) = decode_all(Framing::CHUNKED, wire, step).unwrap().unwrap();
            assert_eq!(body, b"helloabcdefghijklmnopqrstuvwxyz", "step {step}");
            assert_eq!(after, 4, "what follows the body is left: step {step}");
        }
        let mut framing = Framing::CHUNKED;
        let mut read = BytesMut::from(&b"0\r\n\r\n"[..]);
        assert_eq!(framing.decode(&mut read), Ok(Decoded::End));
        assert!(framing.is_complete());
        assert_eq!(framing.decode(&mut read), Ok(Decoded::End));
    }

    #[test]
    fn a_length_body_is_complete_with_its_last_piece() {
        let mut framing = Framing::Length(5);
        let mut read = BytesMut::from(&b"helloHTTP"[..]);
        assert_eq!(
            framing.decode(&mut read),
            Ok(Decoded::Data(Bytes::from_static(b"hello")))
        );
        assert!(framing.is_complete());
        assert_eq!(&read[..], b"HTTP");
        assert_eq!(decode_all(Framing::Length(5), b"abc", 1), Ok(None));
    }

    #[test]
    fn broken_framing_names_what_broke() {
        let error = |wire: &[u8]| decode_all(Framing::CHUNKED, wire, 3).unwrap_err().0;
        assert!(error(b"zz\r\n").contains("chunk-size"));
        assert!(error(b"2\r\nabXY").contains("CRLF"));
        assert!(error(b"11111111111111111\r\n").contains("chunk-size"));
        assert!(error(&[b'1'; 5000]).contains("too long"));
        let mut trailers = b"0\r\n".to_vec();
        trailers.extend(std::iter::repeat_n(b"x-t: 1\r\n".as_slice(), 3000).flatten());
        assert!(error(&trailers).contains("trailers"));
    }

    #[test]
    fn repeated_lengths_must_agree() {
        let length = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(CONTENT_LENGTH, HeaderValue::from_static(v));
            }
            content_length(&headers)
        };
        assert_eq!(length(&["2, 2"]), Ok(2));
        assert_eq!(length(&["1234"]), Ok(1234));
        assert_eq!(length(&["18446744073709551615"]), Ok(u64::MAX));
        assert!(length(&["18446744073709551616"]).is_err());
        assert!(length(&["+5"]).is_err());
        assert_eq!(length(&["7", "7"]), Ok(7));
        assert!(length(&["5", "6"]).unwrap_err().0.contains("differ"));
        assert!(length(&["-1"]).is_err());
        assert!(length(&["1,"]).is_err());
        assert!(length(&[]).is_err());
    }

    #[test]
    fn a_heads_headers_are_slices_of_its_copy_in_their_order() {
        let wire = b"HTTP/1.1 200 OK\r\nB: 2\r\na: one\r\nb: 3\r\n\r\nbody";
        let mut slots = [httparse::EMPTY_HEADER; 8];
        let mut parsed = httparse::Response::new(&mut slots);
        let httparse::Status::Complete(length) = parsed.parse(wire).unwrap() else {
            panic!("partial");
        };
        let copy = HeadCopy::new(wire, length);
        let headers = copy.headers(parsed.headers).unwrap();
        assert_eq!(headers["a"], "one");
        let b: Vec<_> = headers.get_all("b").iter().collect();
        assert_eq!(b, ["2", "3"]);
        assert_eq!(copy.slice(parsed.reason.unwrap().as_bytes()), "OK");
        let mut slots = [httparse::EMPTY_HEADER; 1];
        let mut parsed = httparse::Response::new(&mut slots);
        let bad = b"HTTP/1.1 200 OK\r\nx: \x7f\r\n\r\n";
        if let Ok(httparse::Status::Complete(length)) = parsed.parse(bad) {
            let copy = HeadCopy::new(bad, length);
            assert!(copy.headers(parsed.headers).is_err());
        }
    }

    #[test]
    fn tokens_are_found_in_any_line_and_case() {
        let mut headers = HeaderMap::new();
        headers.append(
            http::header::CONNECTION,
            HeaderValue::from_static("Upgrade, Keep-Alive"),
        );
        headers.append(http::header::CONNECTION, HeaderValue::from_static("close"));
        assert!(has_token(&headers, http::header::CONNECTION, "keep-alive"));
        assert!(has_token(&headers, http::header::CONNECTION, "close"));
        assert!(!has_token(&headers, http::header::CONNECTION, "te"));
    }
}
