//! One attempt against one upstream: build the request, send it, return the answer or relay the
//! stream, and report how it went.

use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyDataStream;

use crate::config::{ModelUpstream, StreamDeadlines};
use crate::protocol::inbound::Inbound;
use crate::protocol::ir;
use crate::protocol::rename::ModelRename;
use crate::protocol::{Dialect, sse};
use crate::telemetry::trace::TraceHeaders;

use super::client::{UpstreamResponse, describe};
use super::redact::Redactor;
use super::relay::{EventStream, StreamClock, StreamRelay, StreamSummary};
use super::request::{chat_body, embeddings_body, endpoint, upstream_dialect};
use super::{AttemptError, UpstreamClient};

/// What an attempt tells whoever booked it. Routing implements it: this is how the upstream stage
/// reports to the stage above without importing it.
///
/// A sink dropped without [`AttemptSink::end`] was abandoned: the client went away mid-stream, or
/// routing cancelled the attempt (a hedge that lost). Nothing about the upstream follows from that.
pub trait AttemptSink: Send + Unpin + 'static {
    /// A stream's first content or tool-call delta arrived: the upstream is serving. A role-only
    /// or lifecycle event does not count. Never called for whole answers; their `end` says it.
    fn first_token(&mut self);
    /// The attempt ended, once: complete, failed before anything reached the client, or a relayed
    /// stream that failed.
    fn end(&mut self, end: AttemptEnd<'_>);
}

/// How an attempt ended.
#[derive(Debug)]
pub struct AttemptEnd<'a> {
    /// `Err` when it failed; a stream's failure may come after it reached the client.
    pub outcome: Result<(), &'a AttemptError>,
    /// HTTP status of the upstream's answer; 0 when there was none (transport error, timeout).
    pub status: u16,
    /// Milliseconds to the first token, or to the whole answer when not streamed.
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    /// What the upstream reported (zero when it reported nothing).
    pub usage: ir::Usage,
    /// The model the upstream said answered (whole answers; a stream's is not read).
    pub response_model: Option<&'a str>,
}

/// A chat attempt that succeeded, in the client's dialect.
pub enum ChatAnswer {
    /// A whole JSON body.
    Complete { body: Bytes, usage: ir::Usage },
    /// An SSE stream past its commit point (first content); `summary` resolves when it ends.
    Stream {
        events: EventStream,
        summary: tokio::sync::oneshot::Receiver<StreamSummary>,
    },
}

/// One attempt against one upstream. Created by routing for the upstream it chose; sends once.
pub struct Attempt<'a> {
    client: &'a UpstreamClient,
    upstream: &'a ModelUpstream,
    /// A pass-through route's client key, used instead of the upstream's own.
    credential: Option<&'a str>,
    /// The trace context sent upstream (`traceparent`, `tracestate`), if any.
    trace: Option<TraceHeaders>,
    started: Instant,
}

impl<'a> Attempt<'a> {
    pub fn new(
        client: &'a UpstreamClient,
        upstream: &'a ModelUpstream,
        credential: Option<&'a str>,
    ) -> Self {
        Attempt {
            client,
            upstream,
            credential,
            trace: None,
            started: Instant::now(),
        }
    }

    /// Sends `trace` (the attempt span's context, or the client's) with the request.
    pub fn with_trace(mut self, trace: Option<TraceHeaders>) -> Self {
        self.trace = trace;
        self
    }

    fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    /// Reports a whole answer as the attempt's end: its first token is the whole of it.
    fn answered(&self, sink: &mut impl AttemptSink, usage: ir::Usage, model: Option<&str>) {
        let latency_ms = self.elapsed_ms();
        sink.end(AttemptEnd {
            outcome: Ok(()),
            status: 200,
            ttft_ms: Some(latency_ms),
            latency_ms,
            usage,
            response_model: model,
        });
    }

    /// Masks the credentials this attempt sent (and anything credential-shaped) in upstream text.
    fn redactor(&self) -> Redactor {
        Redactor::new(
            self.credential
                .into_iter()
                .chain(self.upstream.api_key.as_deref()),
        )
    }

    /// Reports `e` as the attempt's end and hands it back, with its upstream text redacted: this
    /// is where an error leaves the attempt for the client, health, logs and `api_logs`.
    fn failed(&self, sink: &mut impl AttemptSink, e: AttemptError) -> AttemptError {
        let e = self.redactor().error(e);
        sink.end(AttemptEnd {
            outcome: Err(&e),
            status: e.status(),
            ttft_ms: None,
            latency_ms: self.elapsed_ms(),
            usage: ir::Usage::default(),
            response_model: None,
        });
        e
    }

    /// Sends a chat request in the upstream's dialect and waits for the whole answer, or for a
    /// stream's first content or tool-call delta (until then a failure can still fall back;
    /// after it, the stream is relayed and `sink` hears how it ends).
    pub async fn chat<S: AttemptSink>(
        self,
        inbound: &Inbound,
        mut sink: S,
    ) -> Result<ChatAnswer, AttemptError> {
        let dialect = upstream_dialect(self.upstream.kind);
        let (url, auth) = endpoint(self.upstream, dialect, self.credential);
        let body = chat_body(inbound, self.upstream, dialect);
        let sent = self.client.post_json(&url, auth, body, self.trace.as_ref());
        if inbound.request.stream {
            // The first-token deadline runs from dispatch, so it bounds the headers too.
            let deadlines = self
                .client
                .stream_deadlines
                .with(&self.upstream.stream_deadlines);
            let first_token_at = self.started + deadlines.first_token;
            let response = match tokio::time::timeout_at(first_token_at.into(), sent).await {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => return Err(self.failed(&mut sink, e)),
                Err(_) => {
                    let e = AttemptError::FirstTokenTimeout(deadlines.first_token);
                    return Err(self.failed(&mut sink, e));
                }
            };
            return self
                .open_stream(response, dialect, inbound, deadlines, sink)
                .await;
        }
        let response = match sent.await {
            Ok(response) => response,
            Err(e) => return Err(self.failed(&mut sink, e)),
        };
        match self.complete(response, dialect, inbound).await {
            Ok((body, usage, model)) => {
                self.answered(&mut sink, usage, Some(&model));
                Ok(ChatAnswer::Complete { body, usage })
            }
            Err(e) => Err(self.failed(&mut sink, e)),
        }
    }

    /// Reads and checks a whole answer, and puts it in the client's dialect; with its usage and
    /// the model the upstream named.
    async fn complete(
        &self,
        response: UpstreamResponse,
        dialect: Dialect,
        inbound: &Inbound,
    ) -> Result<(Bytes, ir::Usage, String), AttemptError> {
        let body = self.client.read_body(response).await?;
        let invalid =
            |e: crate::protocol::ProtocolError| AttemptError::InvalidResponse(e.to_string());
        if dialect == inbound.dialect {
            // Relayed as it came: only what it tells the gateway is read, not the whole answer.
            let summary = dialect.summarize_response(&body).map_err(invalid)?;
            let body = rename_model(
                body,
                &self.upstream.provider_model_id,
                &inbound.request.model,
            );
            return Ok((body, summary.usage, summary.model));
        }
        let parsed = dialect.parse_response(&body).map_err(invalid)?;
        let body = Bytes::from(
            inbound
                .dialect
                .build_response(&parsed, &inbound.request.model),
        );
        Ok((body, parsed.usage, parsed.model))
    }

    /// Holds the stream until its commit point (see [`StreamRelay::open`]); a failure before it
    /// is the attempt's and can still fall back.
    async fn open_stream<S: AttemptSink>(
        self,
        response: UpstreamResponse,
        dialect: Dialect,
        inbound: &Inbound,
        deadlines: StreamDeadlines,
        sink: S,
    ) -> Result<ChatAnswer, AttemptError> {
        let events = sse::events(
            Box::pin(BodyDataStream::new(response.into_body())),
            self.client.max_event_bytes,
        )
        .map(|read| {
            read.map_err(|e| match e {
                sse::ReadError::Body(e) => AttemptError::Transport(describe(&*e)),
                sse::ReadError::TooLarge(e) => AttemptError::ResponseTooLarge {
                    what: "a stream event (upstream.max_event_kib)",
                    limit: e.limit,
                },
            })
        });
        let (mut relay, summary) = StreamRelay::new(
            Box::pin(events),
            dialect,
            inbound,
            ModelRename::new(&self.upstream.provider_model_id, &inbound.request.model),
            StreamClock {
                started: self.started,
                deadlines,
            },
            sink,
            self.redactor(),
        );
        relay.open(self.client.max_body_bytes).await?;
        Ok(ChatAnswer::Stream {
            events: Box::pin(relay),
            summary,
        })
    }

    /// Sends an embeddings request (OpenAI-compatible upstreams: no streaming, no translation) and
    /// returns the answer with the public model name.
    pub async fn embeddings<S: AttemptSink>(
        self,
        body: &serde_json::Map<String, serde_json::Value>,
        public_model: &str,
        mut sink: S,
    ) -> Result<Bytes, AttemptError> {
        let url = format!("{}/embeddings", self.upstream.base_url);
        let auth =
            super::UpstreamAuth::Bearer(self.credential.or(self.upstream.api_key.as_deref()));
        let sent = self
            .client
            .post_json(
                &url,
                auth,
                embeddings_body(body, self.upstream),
                self.trace.as_ref(),
            )
            .await;
        let result = match sent {
            Ok(response) => self.client.read_body(response).await.and_then(|b| {
                if crate::protocol::scan::is_embeddings_answer(&b) {
                    Ok(b)
                } else {
                    Err(AttemptError::InvalidResponse("no `data` array".into()))
                }
            }),
            Err(e) => Err(e),
        };
        match result {
            Ok(bytes) => {
                self.answered(&mut sink, ir::Usage::default(), None);
                Ok(rename_model(
                    bytes,
                    &self.upstream.provider_model_id,
                    public_model,
                ))
            }
            Err(e) => Err(self.failed(&mut sink, e)),
        }
    }
}

/// Replaces the upstream's model name with the public one without re-serialising the JSON: the
/// client asked for the public name and should not learn which deployment answered.
pub fn rename_model(body: Bytes, provider_model_id: &str, public_model: &str) -> Bytes {
    ModelRename::new(provider_model_id, public_model).apply(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_model_in_compact_and_spaced_json() {
        let out = rename_model(
            Bytes::from_static(br#"{"id":"x","model":"sim-small","choices":[]}"#),
            "sim-small",
            "demo-chat",
        );
        assert_eq!(&out[..], br#"{"id":"x","model":"demo-chat","choices":[]}"#);
        let out = rename_model(Bytes::from_static(br#"{"model": "a/b"}"#), "a/b", "pub");
        assert_eq!(&out[..], br#"{"model": "pub"}"#);
        let untouched = rename_model(Bytes::from_static(br#"{"model":"other"}"#), "sim", "pub");
        assert_eq!(&untouched[..], br#"{"model":"other"}"#);
    }
}
