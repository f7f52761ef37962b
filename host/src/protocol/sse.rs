//! Server-sent event framing: writing frames, reading upstream streams incrementally
//! ([`events`]), and a whole-text reader for tests and the mock.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use bytestring::ByteString;
use futures::Stream;
use serde::Serialize;
use serde_json::Value;

/// `data: <json>\n\n`, the framing of Chat Completions chunks.
pub fn data_frame(data: &Value) -> Bytes {
    frame(None, data)
}

/// `event: <name>\ndata: <json>\n\n`, the framing of Responses and Anthropic events.
pub fn event_frame(name: &str, data: &Value) -> Bytes {
    frame(Some(name), data)
}

/// Serialises straight into the frame's buffer: `format!` with `Value`'s `Display` went through
/// the formatter and showed in stream profiles. The events of every token are written by a
/// [`FrameWriter`] instead.
fn frame(name: Option<&str>, data: &Value) -> Bytes {
    let mut out = Vec::with_capacity(256);
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    // Writing a `Value` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut out, data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// A frame written piece by piece, for the events a stream is mostly made of (one per token): its
/// constant JSON is copied as it stands and only the values are encoded. A derived `Serialize`
/// escapes every key and tag again on every event: ~1,400 instructions for an Anthropic text
/// delta, of which the text was a tenth.
#[must_use]
pub struct FrameWriter {
    out: Vec<u8>,
}

/// The start of frames that share it (a Chat stream's chunks share their id, model and
/// timestamp), written once by a [`FrameWriter`].
#[derive(Debug, Clone, Default)]
pub struct FramePrefix(Vec<u8>);

impl FrameWriter {
    /// `data: `, then what is written.
    pub fn data() -> Self {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"data: ");
        FrameWriter { out }
    }

    /// `event: <name>\ndata: `, then what is written.
    pub fn event(name: &str) -> Self {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        FrameWriter { out }
    }

    /// `prefix`, then what is written.
    pub fn after(prefix: &FramePrefix) -> Self {
        let mut out = Vec::with_capacity(prefix.0.len() + 128);
        out.extend_from_slice(&prefix.0);
        FrameWriter { out }
    }

    /// JSON text copied as it stands: only text written here in the source, never a value.
    pub fn json(mut self, text: &'static str) -> Self {
        self.out.extend_from_slice(text.as_bytes());
        self
    }

    /// A value, encoded as JSON (a string escaped).
    pub fn value<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        // Writing JSON into a `Vec` cannot fail (no map here has non-string keys).
        let _ = serde_json::to_writer(&mut self.out, value);
        self
    }

    /// What was written so far, to start other frames with.
    pub fn prefix(self) -> FramePrefix {
        FramePrefix(self.out)
    }

    /// The frame, closed with its blank line.
    pub fn finish(mut self) -> Bytes {
        self.out.extend_from_slice(b"\n\n");
        Bytes::from(self.out)
    }
}

/// Appends `frames` to `out`, the buffer of a body's next chunk.
pub fn append(out: &mut Vec<u8>, frames: impl IntoIterator<Item = Bytes>) {
    for frame in frames {
        out.extend_from_slice(&frame);
    }
}

/// `frame` (one event this crate wrote) with `key: value` added to its error object: the `error`
/// member (Chat, Anthropic), the response's `error` (Responses' `response.failed`), or the event
/// itself when it is an error (Responses' `error`). Any other frame comes back as it was.
pub fn with_error_field(frame: Bytes, key: &str, value: &str) -> Bytes {
    let Some(event) = std::str::from_utf8(&frame)
        .ok()
        .and_then(|text| parse(text).into_iter().next())
    else {
        return frame;
    };
    let Ok(mut data) = serde_json::from_str::<Value>(&event.data) else {
        return frame;
    };
    let is_error_event = data.get("type").and_then(Value::as_str) == Some("error");
    let target = if data.get("error").is_some_and(Value::is_object) {
        data.get_mut("error")
    } else if data
        .pointer("/response/error")
        .is_some_and(Value::is_object)
    {
        data.pointer_mut("/response/error")
    } else if is_error_event {
        Some(&mut data)
    } else {
        None
    };
    let Some(Value::Object(target)) = target else {
        return frame;
    };
    target.insert(key.to_owned(), value.into());
    if event.event.is_empty() {
        data_frame(&data)
    } else {
        event_frame(&event.event, &data)
    }
}

/// One parsed server-sent event. Its fields are slices of the chunk they arrived in when they
/// fit in one line of one chunk (an upstream's token events almost always do), so reading an
/// event copies nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty when absent.
    pub event: ByteString,
    pub data: ByteString,
}

/// Splits a complete SSE text into events (per the HTML spec: `data` lines joined with `\n`,
/// comments and unknown fields ignored, events without data skipped).
pub fn parse(text: &str) -> Vec<SseEvent> {
    let mut out = Vec::new();
    let mut event = String::new();
    let mut data: Option<String> = None;
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if let Some(d) = data.take() {
                out.push(SseEvent {
                    event: std::mem::take(&mut event).into(),
                    data: d.into(),
                });
            }
            event.clear();
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => event = value.to_owned(),
            "data" => match data.as_mut() {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
    if let Some(d) = data {
        out.push(SseEvent {
            event: event.into(),
            data: d.into(),
        });
    }
    out
}

/// Reads SSE events from bytes as they arrive, per the HTML spec: lines end in LF, CRLF or CR
/// (also when split across chunks), a leading BOM is skipped, comments and unknown fields
/// (`id`, `retry`) are ignored, `data` lines are joined with LF, an event without `data` is not
/// dispatched, and an event not closed by a blank line when the stream ends is dropped.
///
/// Written for the relay's hot path: only an incomplete line is buffered, so a chunk holding many
/// events is scanned once (the `eventsource-stream` crate copied the rest of its buffer after
/// every line and validated it char by char, ~10 % of a relayed stream's CPU), and an event's
/// fields are slices of the chunk rather than strings of their own.
///
/// What it holds is bounded by its limit: a line, or an event's joined `data`, longer than that is
/// an [`EventTooLarge`] and not read further (an upstream that never sends a newline would
/// otherwise fill memory).
#[derive(Debug)]
pub struct EventReader {
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
    event: ByteString,
    data: Option<EventData>,
    /// The last chunk ended in CR: an LF opening the next one belongs to that line end.
    after_cr: bool,
    started: bool,
    /// Largest line, and largest event (its `data` joined), in bytes.
    limit: usize,
}

/// An event's `data` so far: one line (a slice), or several joined.
#[derive(Debug)]
enum EventData {
    Line(ByteString),
    Joined(String),
}

/// A line or event of a stream outgrew the reader's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a stream event exceeded the limit of {limit} bytes")]
pub struct EventTooLarge {
    pub limit: usize,
}

impl Default for EventReader {
    fn default() -> Self {
        Self::with_limit(usize::MAX)
    }
}

impl EventReader {
    /// A reader without a limit, for text the gateway wrote itself.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reader that refuses a line or event longer than `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        EventReader {
            partial: Vec::new(),
            event: ByteString::new(),
            data: None,
            after_cr: false,
            started: false,
            limit,
        }
    }

    /// Reads `chunk`, appending every event it completes to `out`. After an error the reader
    /// must not be fed again; the events completed before the oversized one are in `out`.
    pub fn feed(
        &mut self,
        chunk: &Bytes,
        out: &mut VecDeque<SseEvent>,
    ) -> Result<(), EventTooLarge> {
        let mut at = 0;
        if !self.started && !chunk.is_empty() {
            self.started = true;
            if chunk.starts_with(b"\xEF\xBB\xBF") {
                at = 3;
            }
        }
        if self.after_cr && at < chunk.len() {
            self.after_cr = false;
            if chunk[at] == b'\n' {
                at += 1;
            }
        }
        while let Some(found) = memchr::memchr2(b'\n', b'\r', &chunk[at..]) {
            let (start, end) = (at, at + found);
            at = end + 1;
            if chunk[end] == b'\r' {
                match chunk.get(at) {
                    Some(b'\n') => at += 1,
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            if self.partial.is_empty() {
                self.line(chunk, start..end, out)?;
            } else {
                // A line begun in an earlier chunk: joined into one of its own.
                self.fits(self.partial.len() + (end - start))?;
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(&chunk[start..end]);
                let whole = Bytes::from(whole);
                self.line(&whole, 0..whole.len(), out)?;
            }
        }
        let rest = &chunk[at..];
        self.fits(self.partial.len() + rest.len())?;
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    fn fits(&self, len: usize) -> Result<(), EventTooLarge> {
        if len > self.limit {
            return Err(EventTooLarge { limit: self.limit });
        }
        Ok(())
    }

    /// Reads the line `source[line]`.
    fn line(
        &mut self,
        source: &Bytes,
        line: std::ops::Range<usize>,
        out: &mut VecDeque<SseEvent>,
    ) -> Result<(), EventTooLarge> {
        let text = &source[line.clone()];
        if text.is_empty() {
            let event = std::mem::take(&mut self.event);
            if let Some(data) = self.data.take() {
                let data = match data {
                    EventData::Line(line) => line,
                    EventData::Joined(text) => text.into(),
                };
                out.push_back(SseEvent { event, data });
            }
            return Ok(());
        }
        self.fits(text.len())?;
        if text[0] == b':' {
            return Ok(());
        }
        let (field, value) = match memchr::memchr(b':', text) {
            Some(colon) => {
                let space = usize::from(text.get(colon + 1) == Some(&b' '));
                (&text[..colon], line.start + colon + 1 + space..line.end)
            }
            None => (text, line.end..line.end),
        };
        let is_event = match field {
            b"event" => true,
            b"data" => false,
            _ => return Ok(()),
        };
        // A slice of the chunk, its UTF-8 checked once; invalid bytes (rare) replaced in a copy.
        let value = ByteString::try_from(source.slice(value.clone()))
            .unwrap_or_else(|_| String::from_utf8_lossy(&source[value]).into_owned().into());
        if is_event {
            self.event = value;
            return Ok(());
        }
        self.data = Some(match self.data.take() {
            None => EventData::Line(value),
            Some(before) => {
                let mut joined = match before {
                    EventData::Line(line) => String::from(&*line),
                    EventData::Joined(text) => text,
                };
                // Many short `data` lines add up to one event: bounded the same.
                if joined.len() + 1 + value.len() > self.limit {
                    return Err(EventTooLarge { limit: self.limit });
                }
                joined.push('\n');
                joined.push_str(&value);
                EventData::Joined(joined)
            }
        });
        Ok(())
    }
}

/// Why [`Events`] stopped early.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError<E> {
    /// The byte stream failed.
    #[error("{0}")]
    Body(E),
    /// A line or event outgrew the reader's limit.
    #[error(transparent)]
    TooLarge(#[from] EventTooLarge),
}

/// The SSE events of a byte stream (an upstream's body), none longer than `max_event` bytes;
/// the byte stream's errors pass through.
pub fn events<S>(bytes: S, max_event: usize) -> Events<S> {
    Events {
        bytes,
        reader: EventReader::with_limit(max_event),
        ready: VecDeque::new(),
        too_large: None,
        ended: false,
    }
}

/// See [`events`].
pub struct Events<S> {
    bytes: S,
    reader: EventReader,
    ready: VecDeque<SseEvent>,
    /// Reported once the events completed before it are out.
    too_large: Option<EventTooLarge>,
    ended: bool,
}

impl<S, E> Stream for Events<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<SseEvent, ReadError<E>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(event) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if let Some(e) = this.too_large.take() {
                return Poll::Ready(Some(Err(e.into())));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.bytes).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    if let Err(e) = this.reader.feed(&chunk, &mut this.ready) {
                        // Nothing more is read: the rest of the body is dropped with the stream.
                        this.too_large = Some(e);
                        this.ended = true;
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(ReadError::Body(e)))),
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_field_lands_in_each_dialects_error_object_and_nowhere_else() {
        let chat = data_frame(&serde_json::json!({"error": {"message": "m"}}));
        let anthropic = event_frame(
            "error",
            &serde_json::json!({"type": "error", "error": {"type": "api_error"}}),
        );
        let responses_error = event_frame(
            "error",
            &serde_json::json!({"type": "error", "code": "server_error"}),
        );
        let responses_failed = event_frame(
            "response.failed",
            &serde_json::json!({"type": "response.failed", "response": {"error": {"code": "x"}}}),
        );
        let delta = data_frame(&serde_json::json!({"choices": []}));
        let read = |frame: Bytes| {
            let event = parse(std::str::from_utf8(&frame).unwrap_or_default()).remove(0);
            (
                event.event,
                serde_json::from_str::<Value>(&event.data).unwrap_or_default(),
            )
        };
        let (name, chat) = read(with_error_field(chat, "request_id", "r1"));
        assert_eq!((&*name, &chat["error"]["request_id"]), ("", &"r1".into()));
        let (name, anthropic) = read(with_error_field(anthropic, "request_id", "r1"));
        assert_eq!(name, "error");
        assert_eq!(anthropic["error"]["request_id"], "r1");
        assert_eq!(anthropic["error"]["type"], "api_error");
        let (_, error) = read(with_error_field(responses_error, "request_id", "r1"));
        assert_eq!(error["request_id"], "r1");
        let (name, failed) = read(with_error_field(responses_failed, "request_id", "r1"));
        assert_eq!(name, "response.failed");
        assert_eq!(failed["response"]["error"]["request_id"], "r1");
        assert_eq!(with_error_field(delta.clone(), "request_id", "r1"), delta);
    }

    #[test]
    fn reads_what_it_writes() {
        let mut text = String::new();
        text.push_str(std::str::from_utf8(&data_frame(&serde_json::json!({"a":1}))).unwrap());
        text.push_str(": comment\n\n");
        text.push_str(
            std::str::from_utf8(&event_frame("ping", &serde_json::json!({"type":"ping"}))).unwrap(),
        );
        text.push_str("data: line1\r\ndata: line2\r\n\r\n");
        let events = parse(&text);
        assert_eq!(
            events,
            vec![
                SseEvent {
                    event: ByteString::new(),
                    data: r#"{"a":1}"#.into()
                },
                SseEvent {
                    event: "ping".into(),
                    data: r#"{"type":"ping"}"#.into()
                },
                SseEvent {
                    event: ByteString::new(),
                    data: "line1\nline2".into()
                },
            ]
        );
    }

    /// Every way of cutting a stream into chunks reads the same events as the whole text.
    #[test]
    fn reader_matches_the_whole_text_reader_at_every_split() {
        let text = "\u{feff}: hello\r\nevent: message_start\r\ndata: {\"a\":1}\r\n\r\n\
                    data: one\rdata: two\r\rid: 7\nretry: 10\ndata:\n\nevent: lost\n\n\
                    data:x\n\ndata: [DONE]\n\ndata: unfinished\n";
        let bytes = text.as_bytes();
        let expected = vec![
            SseEvent {
                event: "message_start".into(),
                data: r#"{"a":1}"#.into(),
            },
            SseEvent {
                event: ByteString::new(),
                data: "one\ntwo".into(),
            },
            SseEvent {
                event: ByteString::new(),
                data: ByteString::new(),
            },
            SseEvent {
                event: ByteString::new(),
                data: "x".into(),
            },
            SseEvent {
                event: ByteString::new(),
                data: "[DONE]".into(),
            },
        ];
        for a in 0..bytes.len() {
            for b in a..bytes.len() {
                let mut reader = EventReader::new();
                let mut out = VecDeque::new();
                for chunk in [&bytes[..a], &bytes[a..b], &bytes[b..]] {
                    reader
                        .feed(&Bytes::copy_from_slice(chunk), &mut out)
                        .unwrap();
                }
                assert_eq!(Vec::from(out), expected, "split at {a} and {b}");
            }
        }
    }

    #[tokio::test]
    async fn events_pass_stream_errors_through() {
        use futures::StreamExt;
        let chunks: Vec<Result<Bytes, &str>> = vec![
            Ok(Bytes::from_static(b"data: a\n")),
            Ok(Bytes::from_static(b"\ndata: b")),
            Err("broken"),
        ];
        let got: Vec<_> = events(futures::stream::iter(chunks), usize::MAX)
            .collect()
            .await;
        assert_eq!(
            got,
            vec![
                Ok(SseEvent {
                    event: ByteString::new(),
                    data: "a".into()
                }),
                Err(ReadError::Body("broken"))
            ]
        );
    }

    /// A line that never ends, split over many chunks, stops the reader at its limit instead of
    /// growing its buffer; events before it still come out.
    #[test]
    fn a_line_longer_than_the_limit_is_refused_at_the_limit() {
        let mut reader = EventReader::with_limit(64);
        let mut out = VecDeque::new();
        reader
            .feed(&Bytes::from_static(b"data: ok\n\ndata: "), &mut out)
            .unwrap();
        let mut refused = None;
        for n in 0..100 {
            if let Err(e) = reader.feed(&Bytes::from(vec![b'x'; 10]), &mut out) {
                refused = Some((n, e));
                break;
            }
        }
        let (n, e) = refused.expect("refused");
        assert_eq!(e, EventTooLarge { limit: 64 });
        assert!(n <= 6, "refused once past 64 bytes, after {n} chunks");
        assert!(reader.partial.len() <= 64);
        assert_eq!(out.len(), 1);
        // A long line within one chunk, and many short data lines adding up, are refused too.
        let mut out = VecDeque::new();
        let long = format!("data: {}\n\n", "y".repeat(100));
        assert!(
            EventReader::with_limit(64)
                .feed(&Bytes::from(long), &mut out)
                .is_err()
        );
        let many = "data: abcdefgh\n".repeat(20);
        assert!(
            EventReader::with_limit(64)
                .feed(&Bytes::from(many), &mut out)
                .is_err()
        );
        assert!(out.is_empty());
        // At the limit exactly is fine.
        let exact = format!("data: {}\n\n", "z".repeat(58));
        assert!(
            EventReader::with_limit(64)
                .feed(&Bytes::from(exact), &mut out)
                .is_ok()
        );
        assert_eq!(out.len(), 1);
    }

    #[tokio::test]
    async fn events_report_an_oversized_event_after_the_ones_before_it() {
        use futures::StreamExt;
        let chunks: Vec<Result<Bytes, &str>> = vec![
            Ok(Bytes::from_static(b"data: a\n\ndata: ")),
            Ok(Bytes::from(vec![b'x'; 100])),
            Ok(Bytes::from_static(b"\n\ndata: never\n\n")),
        ];
        let got: Vec<_> = events(futures::stream::iter(chunks), 32).collect().await;
        assert_eq!(
            got,
            vec![
                Ok(SseEvent {
                    event: ByteString::new(),
                    data: "a".into()
                }),
                Err(ReadError::TooLarge(EventTooLarge { limit: 32 }))
            ]
        );
    }
}
