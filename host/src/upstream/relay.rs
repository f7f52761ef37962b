//! Relaying an upstream's SSE stream to the client, event by event.
//!
//! A stream is locked to its upstream at its first content or tool-call delta (its commit point;
//! or its proper end, for an answer without content). Until then the relay holds the lifecycle
//! frames it would send (`response.created`, `message_start`, a role-only delta, pings) and a
//! failure, a stall past the first-token deadline or an early end is a failed attempt that falls
//! back. After it, splicing a second provider into the stream would duplicate role events and
//! corrupt usage, so a failure ends the stream with an error event in the client's dialect.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::Sleep;

use crate::config::StreamDeadlines;

use crate::protocol::inbound::Inbound;
use crate::protocol::ir::{self, StreamEvent};
use crate::protocol::rename::ModelRename;
use crate::protocol::sse::{self, SseEvent};
use crate::protocol::{Decoder, Dialect, Encoder};

use super::redact::Redactor;
use super::{AttemptEnd, AttemptError, AttemptSink};

pub type EventStream = Pin<Box<dyn Stream<Item = Bytes> + Send>>;

/// How a relayed stream ended, for the request log.
#[derive(Debug, Clone, Default)]
pub struct StreamSummary {
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Why the stream did not complete: an upstream failure or the client leaving.
    pub error: Option<String>,
}

/// Largest chunk the relay gathers from frames that are ready together.
const BATCH_BYTES: usize = 16 * 1024;

/// Capacity the relay's buffer keeps between chunks: a few frames' worth.
const RETAINED_BYTES: usize = 2 * 1024;

/// The upstream's events; a failure to read them (transport, an oversized event) is the attempt's.
pub(super) type UpstreamEvents = Pin<Box<dyn Stream<Item = Result<SseEvent, AttemptError>> + Send>>;

/// Relays upstream SSE events to the client as they come — verbatim (model renamed) when the
/// dialects match, else re-encoded — decoding each one to note the first token, usage and errors,
/// and telling its sink when the first token came and how the stream ended.
pub(super) struct StreamRelay<S: AttemptSink> {
    upstream: UpstreamEvents,
    decoder: Decoder,
    /// `None` when the client speaks the upstream's dialect (pass-through).
    encoder: Option<Encoder>,
    client_dialect: Dialect,
    /// The client's frames, written here as they are made and sent as one chunk of the body:
    /// hyper writes every chunk with its own syscall, and a frame made as a buffer of its own
    /// cost two allocations and a copy into the chunk.
    pending: Vec<u8>,
    /// The upstream's model name to the public one, in every verbatim frame.
    rename: ModelRename,
    /// The renamed start of the frames the decoder's current delta template reads.
    head_rename: Option<HeadRename>,
    public_model: String,
    started: Instant,
    first_token: Option<f64>,
    /// The upstream said the answer is complete.
    answered: bool,
    usage: ir::Usage,
    /// Set when the upstream's stream reported an error event.
    upstream_error: Option<String>,
    deadlines: StreamDeadlines,
    /// The end of the whole stream's time.
    total: Pin<Box<Sleep>>,
    /// Silence allowed until; armed at the commit point and moved on as events arrive.
    idle: Pin<Box<Sleep>>,
    /// An event arrived since `idle` was last moved on.
    heard: bool,
    finished: bool,
    summary: Option<tokio::sync::oneshot::Sender<StreamSummary>>,
    /// Dropped with the relay; told nothing more if the client leaves first.
    sink: S,
    /// Masks credentials in the upstream's error events and in what a broken stream says.
    redactor: Redactor,
    /// The request's id, for the error event a broken stream ends with (the relay is polled by
    /// the server after the handler returned, outside the id's task-local).
    request_id: Option<crate::telemetry::request_id::RequestId>,
}

/// What a delta template's frames start with once renamed (see [`ModelRename::renamed_head`]).
struct HeadRename {
    /// The template's generation it was made for.
    generation: u8,
    /// `None`: each frame is renamed whole.
    renamed: Option<Vec<u8>>,
}

/// When a relayed stream started and the deadlines it runs under.
pub(super) struct StreamClock {
    pub started: Instant,
    pub deadlines: StreamDeadlines,
}

impl<S: AttemptSink> StreamRelay<S> {
    pub(super) fn new(
        upstream: UpstreamEvents,
        dialect: Dialect,
        inbound: &Inbound,
        rename: ModelRename,
        StreamClock { started, deadlines }: StreamClock,
        sink: S,
        redactor: Redactor,
    ) -> (Self, tokio::sync::oneshot::Receiver<StreamSummary>) {
        let (summary_tx, summary) = tokio::sync::oneshot::channel();
        let relay = StreamRelay {
            upstream,
            decoder: dialect.decoder(),
            encoder: (dialect != inbound.dialect).then(|| {
                inbound
                    .dialect
                    .encoder_for(&inbound.request.model, &inbound.request)
            }),
            client_dialect: inbound.dialect,
            pending: Vec::new(),
            rename,
            head_rename: None,
            public_model: inbound.request.model.clone(),
            started,
            first_token: None,
            answered: false,
            usage: ir::Usage::default(),
            upstream_error: None,
            deadlines,
            total: Box::pin(tokio::time::sleep_until((started + deadlines.total).into())),
            idle: Box::pin(tokio::time::sleep_until((started + deadlines.total).into())),
            heard: false,
            finished: false,
            summary: Some(summary_tx),
            sink,
            redactor,
            request_id: crate::telemetry::request_id::current(),
        };
        (relay, summary)
    }

    /// Reads the upstream until its first content or tool-call delta (the commit point), or until
    /// it completes properly without any, queueing what the client will be sent. Fails — and
    /// tells the sink — when the upstream fails, reports an error, sends an invalid event, ends
    /// early, holds more than `held_limit` bytes of frames, or passes the first-token (or total)
    /// deadline first. Nothing has reached the client until this returns `Ok`.
    pub(super) async fn open(&mut self, held_limit: usize) -> Result<(), AttemptError> {
        let first_token_at = self.started + self.deadlines.first_token;
        let total_at = self.started + self.deadlines.total;
        let (deadline, expired) = if first_token_at <= total_at {
            (
                first_token_at,
                AttemptError::FirstTokenTimeout(self.deadlines.first_token),
            )
        } else {
            (total_at, AttemptError::TotalTimeout(self.deadlines.total))
        };
        let failure = loop {
            let next = tokio::time::timeout_at(deadline.into(), self.upstream.next()).await;
            match next {
                Err(_) => break expired,
                Ok(Some(Ok(event))) => {
                    self.relay(event);
                    if let Some(message) = self.upstream_error.take() {
                        break AttemptError::StreamFailed(message);
                    }
                    if self.first_token.is_some() || self.answered {
                        self.commit();
                        return Ok(());
                    }
                    if self.pending.len() > held_limit {
                        break AttemptError::ResponseTooLarge {
                            what: "the frames before the first content (upstream.max_body_mib)",
                            limit: held_limit,
                        };
                    }
                }
                Ok(Some(Err(e))) => break e,
                Ok(None) => {
                    let closing = self.decoder.finish();
                    if let Some(StreamEvent::Error { message, .. }) = closing
                        .iter()
                        .find(|e| matches!(e, StreamEvent::Error { .. }))
                    {
                        break AttemptError::EmptyStream(message.clone());
                    }
                    // Complete without content (an empty answer, `max_tokens: 0`): relayed.
                    self.close(closing);
                    self.finish(None);
                    return Ok(());
                }
            }
        };
        self.fail_uncommitted(failure)
    }

    /// The stream is the client's from here: the idle deadline starts counting.
    fn commit(&mut self) {
        let at = Instant::now() + self.deadlines.idle;
        self.idle.as_mut().reset(at.into());
    }

    /// Ends an attempt that failed before its commit point: the sink hears it, the client nothing.
    fn fail_uncommitted(&mut self, e: AttemptError) -> Result<(), AttemptError> {
        self.finished = true;
        // The receiver goes with the failed attempt; the request log hears from the dispatch.
        self.summary = None;
        self.pending.clear();
        self.sink.end(AttemptEnd {
            outcome: Err(&e),
            status: e.status(),
            ttft_ms: None,
            latency_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            usage: self.usage,
            response_model: None,
        });
        Err(e)
    }

    /// Queues what one upstream event becomes for the client.
    pub(super) fn relay(&mut self, event: SseEvent) {
        // After the first token a text delta matters to accounting no more: relayed as it came,
        // or, translated, straight from its text to the client's frame.
        if self.first_token.is_some() {
            match &mut self.encoder {
                Some(encoder) => {
                    if let Some(text) = self.decoder.templated_text(&event.event, &event.data) {
                        encoder.text_delta_into(&text, &mut self.pending);
                        return;
                    }
                }
                None => {
                    if self.write_templated(&event) {
                        return;
                    }
                    if self
                        .decoder
                        .may_skip_after_first_token(&event.event, &event.data)
                    {
                        self.write_verbatim(&event);
                        return;
                    }
                }
            }
        }
        let mut decoded = self.decoder.decode(&event.event, &event.data);
        let mut event = event;
        if let Some(StreamEvent::Error { message, .. }) = decoded
            .iter_mut()
            .find(|e| matches!(e, StreamEvent::Error { .. }))
        {
            // An error event is upstream text on its way to the client and the request log.
            *message = self.redactor.text(message);
            event.data = self.redactor.text(&event.data).into();
        }
        self.account(&decoded);
        match &mut self.encoder {
            Some(encoder) => {
                for event in &decoded {
                    sse::append(&mut self.pending, encoder.encode(event));
                }
            }
            None => self.write_verbatim(&event),
        }
    }

    /// Queues the upstream's own frame, with the public model name.
    fn write_verbatim(&mut self, event: &SseEvent) {
        let out = open_frame(&mut self.pending, event);
        self.rename.apply_into(event.data.as_bytes(), out);
        out.extend_from_slice(b"\n\n");
    }

    /// Queues the upstream's own frame when the decoder's delta template reads it (so it is a
    /// plain delta), renamed by the template's head; false, queueing nothing, otherwise.
    fn write_templated(&mut self, event: &SseEvent) -> bool {
        let Some(template) = self.decoder.templated(&event.event, &event.data) else {
            return false;
        };
        let head_len = template.head.len();
        if self.head_rename.as_ref().map(|h| h.generation) != Some(template.generation) {
            self.head_rename = Some(HeadRename {
                generation: template.generation,
                renamed: self.rename.renamed_head(template.head, template.tail),
            });
        }
        let Some(HeadRename {
            renamed: Some(renamed),
            ..
        }) = &self.head_rename
        else {
            self.write_verbatim(event);
            return true;
        };
        let out = open_frame(&mut self.pending, event);
        out.extend_from_slice(renamed);
        out.extend_from_slice(&event.data.as_bytes()[head_len..]);
        out.extend_from_slice(b"\n\n");
        true
    }

    fn account(&mut self, events: &[StreamEvent]) {
        for event in events {
            match event {
                // A content or tool-call delta makes the stream a success; a role delta does not.
                StreamEvent::TextDelta(_)
                | StreamEvent::ReasoningDelta(_)
                | StreamEvent::ToolCallStart { .. }
                | StreamEvent::ToolCallDelta { .. }
                    if self.first_token.is_none() =>
                {
                    self.first_token = Some(self.started.elapsed().as_secs_f64() * 1000.0);
                    self.sink.first_token();
                }
                StreamEvent::Usage(u) => self.usage = *u,
                StreamEvent::Done => self.answered = true,
                StreamEvent::Error { message, .. } => {
                    self.upstream_error = Some(message.clone());
                }
                _ => {}
            }
        }
    }

    /// The client's error frame for a stream that broke after its commit point.
    fn error_frames(&mut self, status: u16, message: String) -> Vec<Bytes> {
        let event = StreamEvent::Error { status, message };
        let frames = match &mut self.encoder {
            Some(encoder) => encoder.encode(&event),
            None => self
                .client_dialect
                .encoder(&self.public_model)
                .encode(&event),
        };
        match &self.request_id {
            Some(id) => frames
                .into_iter()
                .map(|f| sse::with_error_field(f, "request_id", id.as_str()))
                .collect(),
            None => frames,
        }
    }

    /// Queues what the upstream's end (`closing`: the decoder's last events) means for the client.
    fn close(&mut self, closing: Vec<StreamEvent>) {
        self.account(&closing);
        if let Some(encoder) = &mut self.encoder {
            let frames = encoder.encode_all(&closing);
            sse::append(&mut self.pending, frames);
        } else if let Some(StreamEvent::Error { message, .. }) = closing
            .iter()
            .find(|e| matches!(e, StreamEvent::Error { .. }))
        {
            // Cut off without its terminal event: say so in the client's dialect.
            let frames = self.error_frames(502, message.clone());
            sse::append(&mut self.pending, frames);
        }
    }

    /// Ends the stream with `failure` told to the client in its dialect.
    fn fail(&mut self, status: u16, message: String, failure: AttemptError) {
        let frames = self.error_frames(status, message);
        sse::append(&mut self.pending, frames);
        self.finish(Some(failure));
    }

    /// The deadline that ran out while the upstream was silent, if one did. Moves the idle
    /// deadline on first when events came since it was set (once per wake-up, not per event).
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<AttemptError> {
        if self.total.as_mut().poll(cx).is_ready() {
            return Some(AttemptError::TotalTimeout(self.deadlines.total));
        }
        if std::mem::take(&mut self.heard) {
            let at = Instant::now() + self.deadlines.idle;
            self.idle.as_mut().reset(at.into());
        }
        if self.idle.as_mut().poll(cx).is_ready() {
            return Some(AttemptError::IdleTimeout(self.deadlines.idle));
        }
        None
    }

    fn finish(&mut self, failure: Option<AttemptError>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let latency_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let error = failure.as_ref().map(ToString::to_string);
        self.sink.end(AttemptEnd {
            outcome: failure.as_ref().map_or(Ok(()), Err),
            // The upstream answered 200; what failed came after.
            status: 200,
            ttft_ms: self.first_token,
            latency_ms,
            usage: self.usage,
            response_model: None,
        });
        if let Some(tx) = self.summary.take() {
            let _ = tx.send(StreamSummary {
                ttft_ms: self.first_token,
                latency_ms,
                prompt_tokens: self.usage.input_tokens,
                completion_tokens: self.usage.output_tokens,
                error,
            });
        }
    }
}

/// Starts `event`'s verbatim frame in `out`, up to its data: the `event:` line (none for the
/// default name) and `data: `.
fn open_frame<'o>(out: &'o mut Vec<u8>, event: &SseEvent) -> &'o mut Vec<u8> {
    out.reserve(event.data.len() + event.event.len() + 48);
    if !event.event.is_empty() && &*event.event != "message" {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.event.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out
}

impl<S: AttemptSink> Stream for StreamRelay<S> {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        // Frames that are ready together leave as one chunk (up to BATCH_BYTES); nothing waits
        // to fill a batch, so a slow upstream's tokens still go out one by one.
        loop {
            if self.finished {
                break;
            }
            if self.pending.len() >= BATCH_BYTES {
                // An upstream that always has more ready never lets the timers below be polled.
                if Instant::now() >= self.started + self.deadlines.total {
                    let e = AttemptError::TotalTimeout(self.deadlines.total);
                    self.fail(504, e.to_string(), e);
                    continue;
                }
                break;
            }
            match self.upstream.as_mut().poll_next(cx) {
                Poll::Pending => match self.expired(cx) {
                    // The deadline's frames go out on the next turn of the loop.
                    Some(e) => {
                        tracing::warn!("upstream stream ended by its deadline: {e}");
                        self.fail(504, e.to_string(), e);
                    }
                    None => break,
                },
                Poll::Ready(Some(Ok(event))) => {
                    self.heard = true;
                    self.relay(event);
                }
                Poll::Ready(None) => {
                    // The decoder knows whether the answer was complete.
                    let closing = self.decoder.finish();
                    self.close(closing);
                    let error = self.upstream_error.clone();
                    self.finish(error.map(AttemptError::StreamFailed));
                }
                Poll::Ready(Some(Err(e))) => {
                    // Bytes already reached the client: end with an error event, never fall back.
                    let message = self.redactor.text(&format!("upstream stream failed: {e}"));
                    tracing::warn!("upstream stream broke after its commit point: {message}");
                    let failure = match e {
                        AttemptError::Transport(_) => AttemptError::StreamFailed(message.clone()),
                        other => other,
                    };
                    self.fail(502, message, failure);
                }
            }
        }
        if !self.pending.is_empty() {
            // Copied out, so the buffer keeps its capacity for the next chunk; but not what a
            // burst grew it to, which a long stream would hold for its whole life.
            let chunk = Bytes::copy_from_slice(&self.pending);
            if self.pending.capacity() > RETAINED_BYTES {
                self.pending = Vec::new();
            } else {
                self.pending.clear();
            }
            Poll::Ready(Some(chunk))
        } else if self.finished {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

impl<S: AttemptSink> Drop for StreamRelay<S> {
    fn drop(&mut self) {
        // Dropped before the upstream finished: the client went away. Not the upstream's fault,
        // so the sink is told nothing (it is dropped with the relay); the request log is.
        if !self.finished
            && let Some(tx) = self.summary.take()
        {
            let _ = tx.send(StreamSummary {
                ttft_ms: self.first_token,
                latency_ms: self.started.elapsed().as_secs_f64() * 1000.0,
                prompt_tokens: self.usage.input_tokens,
                completion_tokens: self.usage.output_tokens,
                error: Some("client disconnected".into()),
            });
        }
    }
}
