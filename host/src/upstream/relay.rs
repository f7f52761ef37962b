//! Relaying an upstream's SSE stream to the client, event by event.
//!
//! A stream is locked to its upstream at its first event: splicing a second provider into an SSE
//! stream would duplicate role events and corrupt usage, so after that point a failure ends the
//! stream with an error event in the client's dialect instead of falling back.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::Stream;

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

pub(super) type UpstreamEvents =
    Pin<Box<dyn Stream<Item = Result<SseEvent, reqwest::Error>> + Send>>;

/// Relays upstream SSE events to the client as they come — verbatim (model renamed) when the
/// dialects match, else re-encoded — decoding each one to note the first token, usage and errors,
/// and telling its sink when the first token came and how the stream ended.
pub(super) struct StreamRelay<S: AttemptSink> {
    upstream: UpstreamEvents,
    decoder: Decoder,
    /// `None` when the client speaks the upstream's dialect (pass-through).
    encoder: Option<Encoder>,
    client_dialect: Dialect,
    pending: VecDeque<Bytes>,
    /// The upstream's model name to the public one, in every verbatim frame.
    rename: ModelRename,
    public_model: String,
    started: Instant,
    first_token: Option<f64>,
    usage: ir::Usage,
    /// Set when the upstream's stream reported an error event.
    upstream_error: Option<String>,
    finished: bool,
    summary: Option<tokio::sync::oneshot::Sender<StreamSummary>>,
    /// Dropped with the relay; told nothing more if the client leaves first.
    sink: S,
    /// Masks credentials in the upstream's error events and in what a broken stream says.
    redactor: Redactor,
}

impl<S: AttemptSink> StreamRelay<S> {
    pub(super) fn new(
        upstream: UpstreamEvents,
        dialect: Dialect,
        inbound: &Inbound,
        rename: ModelRename,
        started: Instant,
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
            pending: VecDeque::new(),
            rename,
            public_model: inbound.request.model.clone(),
            started,
            first_token: None,
            usage: ir::Usage::default(),
            upstream_error: None,
            finished: false,
            summary: Some(summary_tx),
            sink,
            redactor,
        };
        (relay, summary)
    }

    /// Queues what one upstream event becomes for the client.
    pub(super) fn relay(&mut self, event: SseEvent) {
        if self.encoder.is_none()
            && self.first_token.is_some()
            && self
                .decoder
                .may_skip_after_first_token(&event.event, &event.data)
        {
            let frame = self.verbatim(event);
            self.pending.push_back(frame);
            return;
        }
        let mut decoded = self.decoder.decode(&event.event, &event.data);
        let mut event = event;
        if let Some(StreamEvent::Error { message, .. }) = decoded
            .iter_mut()
            .find(|e| matches!(e, StreamEvent::Error { .. }))
        {
            // An error event is upstream text on its way to the client and the request log.
            *message = self.redactor.text(message);
            event.data = self.redactor.text(&event.data);
        }
        self.account(&decoded);
        match &mut self.encoder {
            Some(encoder) => self.pending.extend(encoder.encode_all(&decoded)),
            None => self.pending.push_back(self.verbatim(event)),
        }
    }

    /// The upstream's own frame, with the public model name, written in one buffer.
    fn verbatim(&self, event: SseEvent) -> Bytes {
        let mut out = Vec::with_capacity(event.data.len() + event.event.len() + 48);
        if !event.event.is_empty() && event.event != "message" {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(event.event.as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(b"data: ");
        self.rename.apply_into(event.data.as_bytes(), &mut out);
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
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
                StreamEvent::Error { message, .. } => {
                    self.upstream_error = Some(message.clone());
                }
                _ => {}
            }
        }
    }

    /// The client's error frame for a stream that broke after its first event.
    fn error_frames(&mut self, message: String) -> Vec<Bytes> {
        let event = StreamEvent::Error {
            status: 502,
            message,
        };
        match &mut self.encoder {
            Some(encoder) => encoder.encode(&event),
            None => self
                .client_dialect
                .encoder(&self.public_model)
                .encode(&event),
        }
    }

    fn finish(&mut self, error: Option<String>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let latency_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let failure = error.clone().map(AttemptError::StreamFailed);
        self.sink.end(AttemptEnd {
            outcome: failure.as_ref().map_or(Ok(()), Err),
            // The upstream answered 200; what failed came after.
            status: 200,
            ttft_ms: self.first_token,
            latency_ms,
            usage: self.usage,
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

impl<S: AttemptSink> Stream for StreamRelay<S> {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        // Frames that are ready together leave as one chunk (up to BATCH_BYTES); nothing waits
        // to fill a batch, so a slow upstream's tokens still go out one by one.
        let mut batch = sse::FrameBatch::default();
        loop {
            while let Some(frame) = self.pending.pop_front() {
                batch.push(frame);
            }
            if self.finished || batch.len() >= BATCH_BYTES {
                break;
            }
            match self.upstream.as_mut().poll_next(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Ok(event))) => self.relay(event),
                Poll::Ready(None) => {
                    // The decoder knows whether the answer was complete.
                    let closing = self.decoder.finish();
                    self.account(&closing);
                    if let Some(encoder) = &mut self.encoder {
                        let frames = encoder.encode_all(&closing);
                        self.pending.extend(frames);
                    } else if let Some(StreamEvent::Error { message, .. }) = closing
                        .iter()
                        .find(|e| matches!(e, StreamEvent::Error { .. }))
                    {
                        // Cut off without its terminal event: say so in the client's dialect.
                        let frames = self.error_frames(message.clone());
                        self.pending.extend(frames);
                    }
                    let error = self.upstream_error.clone();
                    self.finish(error);
                }
                Poll::Ready(Some(Err(e))) => {
                    // Bytes already reached the client: end with an error event, never fall back.
                    let message = self.redactor.text(&format!("upstream stream failed: {e}"));
                    tracing::warn!("upstream stream broke after its first event: {message}");
                    let frames = self.error_frames(message.clone());
                    self.pending.extend(frames);
                    self.finish(Some(message));
                }
            }
        }
        match batch.take() {
            Some(bytes) => Poll::Ready(Some(bytes)),
            None if self.finished => Poll::Ready(None),
            None => Poll::Pending,
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
