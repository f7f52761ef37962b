//! Client and upstream wire protocols, translated through one internal representation.
//!
//! Every chat dialect ([`Dialect`]) parses client requests into [`ir::Request`], builds upstream
//! requests from it, parses upstream answers into [`ir::Response`], builds client answers from it,
//! and for streams decodes upstream SSE events into [`ir::StreamEvent`]s ([`Decoder`]) and encodes
//! them as client SSE frames ([`Encoder`]). Any client dialect can therefore be served by any
//! upstream dialect; `docs/translation.md` says what maps to what and what is dropped.
//!
//! Driving a stream: feed each upstream SSE event (name and data) to [`Decoder::decode`] and each
//! resulting IR event to [`Encoder::encode`], writing the frames it returns as they come. When the
//! upstream body ends, feed [`Decoder::finish`]'s events too (it supplies `Done`, or an `Error` if
//! the stream stopped early); when the upstream connection fails, encode an
//! [`ir::StreamEvent::Error`] yourself. After `Done` or `Error` both sides ignore further input.

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::{Value, json};

pub mod anthropic_messages;
mod delta_template;
mod error;
pub mod ids;
pub mod inbound;
pub mod ir;
pub mod json;
pub mod openai_chat;
mod openai_parts;
pub mod openai_responses;
pub mod rename;
pub mod scan;
pub mod sse;

pub use error::ProtocolError;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod golden;

/// A chat protocol, as spoken by a client or an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Dialect {
    /// OpenAI Chat Completions, `POST /v1/chat/completions`.
    #[serde(rename = "openai")]
    OpenAiChat,
    /// OpenAI Responses (stateless subset), `POST /v1/responses`.
    #[serde(rename = "openai_responses")]
    OpenAiResponses,
    /// Anthropic Messages, `POST /v1/messages`.
    #[serde(rename = "anthropic")]
    AnthropicMessages,
}

impl Dialect {
    pub const ALL: [Dialect; 3] = [
        Dialect::OpenAiChat,
        Dialect::OpenAiResponses,
        Dialect::AnthropicMessages,
    ];

    /// The short name used in flags and config: `openai`, `openai_responses`, `anthropic`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "openai",
            Dialect::OpenAiResponses => "openai_responses",
            Dialect::AnthropicMessages => "anthropic",
        }
    }

    /// The endpoint path below the API root (`/v1`).
    pub fn path(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "/chat/completions",
            Dialect::OpenAiResponses => "/responses",
            Dialect::AnthropicMessages => "/messages",
        }
    }

    /// Parses a client's request body within the default [`json::Limits`]; the error is the
    /// reason to show the client.
    pub fn parse_request(self, body: &[u8]) -> Result<ir::Request, ProtocolError> {
        match self {
            Dialect::OpenAiChat => openai_chat::parse_request(body),
            Dialect::OpenAiResponses => openai_responses::parse_request(body),
            Dialect::AnthropicMessages => anthropic_messages::parse_request(body),
        }
    }

    /// [`Dialect::parse_request`] within `limits` (the gateway's configured ones), which are
    /// checked as the body is read: a body over them is refused before it takes memory.
    pub fn parse_request_within(
        self,
        body: &[u8],
        limits: json::Limits,
    ) -> Result<ir::Request, ProtocolError> {
        self.parse_request_fields(body, limits)
            .map(|(request, _)| request)
    }

    /// [`Dialect::parse_request_within`], with where the body's top-level entries are (when its
    /// reader recorded them), for [`Inbound`](inbound::Inbound) to write a pass-through body from.
    pub fn parse_request_fields(
        self,
        body: &[u8],
        limits: json::Limits,
    ) -> Result<(ir::Request, Option<json::BodyFields>), ProtocolError> {
        match self {
            Dialect::OpenAiChat => openai_chat::parse_request_fields(body, limits),
            Dialect::OpenAiResponses => openai_responses::parse_request_fields(body, limits),
            Dialect::AnthropicMessages => anthropic_messages::parse_request_fields(body, limits),
        }
    }

    /// The request body for an upstream of this dialect, naming `provider_model_id`.
    pub fn build_request(self, request: &ir::Request, provider_model_id: &str) -> Vec<u8> {
        match self {
            Dialect::OpenAiChat => openai_chat::build_request(request, provider_model_id),
            Dialect::OpenAiResponses => openai_responses::build_request(request, provider_model_id),
            Dialect::AnthropicMessages => {
                anthropic_messages::build_request(request, provider_model_id)
            }
        }
    }

    /// Parses an upstream's non-streaming (2xx) answer; the error is
    /// [`ProtocolError::InvalidResponse`] or [`ProtocolError::Upstream`].
    pub fn parse_response(self, body: &[u8]) -> Result<ir::Response, ProtocolError> {
        match self {
            Dialect::OpenAiChat => openai_chat::parse_response(body),
            Dialect::OpenAiResponses => openai_responses::parse_response(body),
            Dialect::AnthropicMessages => anthropic_messages::parse_response(body),
        }
    }

    /// What a non-streaming (2xx) answer relayed unchanged tells the gateway: its usage and
    /// model. The same verdict as [`Dialect::parse_response`], mostly without building a tree
    /// (see [`scan`]).
    pub fn summarize_response(self, body: &[u8]) -> Result<scan::Summary, ProtocolError> {
        if let Some(summary) = self.scan_response(body) {
            return Ok(summary);
        }
        self.parse_response(body).map(|r| scan::Summary {
            usage: r.usage,
            model: r.model,
        })
    }

    /// The fast path of [`Dialect::summarize_response`]: `None` when the full parse must decide.
    pub fn scan_response(self, body: &[u8]) -> Option<scan::Summary> {
        match self {
            Dialect::OpenAiChat => openai_chat::scan_response(body),
            Dialect::OpenAiResponses => openai_responses::scan_response(body),
            Dialect::AnthropicMessages => anthropic_messages::scan_response(body),
        }
    }

    /// The non-streaming answer body for a client, naming `public_model`.
    pub fn build_response(self, response: &ir::Response, public_model: &str) -> Vec<u8> {
        match self {
            Dialect::OpenAiChat => openai_chat::build_response(response, public_model),
            Dialect::OpenAiResponses => openai_responses::build_response(response, public_model),
            Dialect::AnthropicMessages => {
                anthropic_messages::build_response(response, public_model)
            }
        }
    }

    /// A decoder for one upstream stream of this dialect.
    pub fn decoder(self) -> Decoder {
        match self {
            Dialect::OpenAiChat => Decoder::Chat(openai_chat::StreamDecoder::new()),
            Dialect::OpenAiResponses => Decoder::Responses(openai_responses::StreamDecoder::new()),
            Dialect::AnthropicMessages => {
                Decoder::Anthropic(anthropic_messages::StreamDecoder::new())
            }
        }
    }

    /// An encoder for one client stream of this dialect, naming `public_model`, with defaults:
    /// Chat usage chunks always sent, Anthropic `message_start` announcing 0 input tokens. See
    /// [`Dialect::encoder_for`] to mirror the client's request instead.
    pub fn encoder(self, public_model: &str) -> Encoder {
        match self {
            Dialect::OpenAiChat => Encoder::Chat(openai_chat::StreamEncoder::new(public_model)),
            Dialect::OpenAiResponses => {
                Encoder::Responses(openai_responses::StreamEncoder::new(public_model))
            }
            Dialect::AnthropicMessages => {
                Encoder::Anthropic(anthropic_messages::StreamEncoder::new(public_model))
            }
        }
    }

    /// An encoder that also mirrors what `request` (the client's, in this dialect) asked for:
    /// Chat Completions sends the usage chunk only when the client set
    /// `stream_options.include_usage`, as OpenAI does; Anthropic's `message_start` announces the
    /// request's prompt estimate as its input tokens until the real count arrives.
    pub fn encoder_for(self, public_model: &str, request: &ir::Request) -> Encoder {
        match self {
            Dialect::OpenAiChat => {
                let asked = request
                    .extra
                    .get("stream_options")
                    .and_then(|o| o.get("include_usage"))
                    .and_then(Value::as_bool)
                    == Some(true);
                Encoder::Chat(openai_chat::StreamEncoder::new(public_model).include_usage(asked))
            }
            Dialect::OpenAiResponses => self.encoder(public_model),
            Dialect::AnthropicMessages => Encoder::Anthropic(
                anthropic_messages::StreamEncoder::new(public_model)
                    .input_tokens_hint(request.prompt_token_estimate()),
            ),
        }
    }

    /// An error body in this dialect's shape for an HTTP status.
    pub fn error_body(self, status: u16, message: &str) -> Value {
        match self {
            Dialect::OpenAiChat | Dialect::OpenAiResponses => error_body_openai(status, message),
            Dialect::AnthropicMessages => anthropic_messages::error_body(status, message),
        }
    }
}

impl std::fmt::Display for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Dialect {
    type Err = ProtocolError;

    /// Accepts the short names of [`Dialect::as_str`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dialect::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| ProtocolError::UnknownDialect(s.to_owned()))
    }
}

/// Decodes one upstream stream into IR events. See the module docs for how to drive it.
#[derive(Debug)]
pub enum Decoder {
    Chat(openai_chat::StreamDecoder),
    Responses(openai_responses::StreamDecoder),
    Anthropic(anthropic_messages::StreamDecoder),
}

impl Decoder {
    /// IR events for one upstream SSE event (`event` is the SSE event name, empty when absent).
    /// Never panics; a malformed event becomes an `Error` event.
    pub fn decode(&mut self, event: &str, data: &str) -> Vec<ir::StreamEvent> {
        match self {
            Decoder::Chat(d) => d.decode(event, data),
            Decoder::Responses(d) => d.decode(event, data),
            Decoder::Anthropic(d) => d.decode(event, data),
        }
    }

    /// Whether a pass-through relay that has already seen the first token may forward an event
    /// without decoding it: true only for one that cannot end the answer or carry usage or an
    /// error — for Chat, a chunk that names no finish reason, usage or error (a
    /// `"finish_reason":null` does not count); for Anthropic, a `content_block_delta`. Decoding
    /// every content delta of a stream only to drop its text was the largest cost of relaying
    /// one. Conservative: any other spelling is decoded, and Responses events always are.
    pub fn may_skip_after_first_token(&self, event: &str, data: &str) -> bool {
        match self {
            Decoder::Chat(d) => {
                d.templated_text(data).is_some() || openai_chat::is_plain_delta(data)
            }
            Decoder::Anthropic(d) => {
                d.templated_text(event, data).is_some()
                    || anthropic_messages::is_plain_delta(event, data)
            }
            Decoder::Responses(_) => false,
        }
    }

    /// The text of a text delta in the frame of one this decoder decoded, read without decoding
    /// (see `delta_template`): decoding it would give that text alone, or nothing when it is
    /// empty, and change no state. `None` for any other event.
    pub fn templated_text<'a>(&self, event: &str, data: &'a str) -> Option<Cow<'a, str>> {
        match self {
            Decoder::Chat(d) => d.templated_text(data),
            Decoder::Anthropic(d) => d.templated_text(event, data),
            Decoder::Responses(_) => None,
        }
    }

    /// The template `data` (a text delta) is read by, as [`Decoder::templated_text`] reads it.
    pub(crate) fn templated(
        &self,
        event: &str,
        data: &str,
    ) -> Option<delta_template::Templated<'_>> {
        match self {
            Decoder::Chat(d) => d.templated(data),
            Decoder::Anthropic(d) => d.templated(event, data),
            Decoder::Responses(_) => None,
        }
    }

    /// Call once when the upstream body ended: `Done` if the answer was complete but not closed,
    /// `Error` if it stopped early, nothing if a terminal event was already returned.
    pub fn finish(&mut self) -> Vec<ir::StreamEvent> {
        match self {
            Decoder::Chat(d) => d.finish(),
            Decoder::Responses(d) => d.finish(),
            Decoder::Anthropic(d) => d.finish(),
        }
    }
}

/// Encodes IR events as one client stream. See the module docs for how to drive it.
#[derive(Debug)]
pub enum Encoder {
    Chat(openai_chat::StreamEncoder),
    Responses(openai_responses::StreamEncoder),
    Anthropic(anthropic_messages::StreamEncoder),
}

impl Encoder {
    /// Complete SSE frames (each ending in a blank line) for one IR event, ready to write.
    /// Emits as it goes: nothing is held back except what a dialect can only say at the end
    /// (Anthropic's `message_delta`, Responses' `response.completed`), which `Done` releases.
    pub fn encode(&mut self, event: &ir::StreamEvent) -> Vec<Bytes> {
        match self {
            Encoder::Chat(e) => e.encode(event),
            Encoder::Responses(e) => e.encode(event),
            Encoder::Anthropic(e) => e.encode(event),
        }
    }

    /// What [`Encoder::encode`] writes for a text delta, appended to `out`.
    pub fn text_delta_into(&mut self, text: &str, out: &mut Vec<u8>) {
        match self {
            Encoder::Anthropic(e) => e.text_delta_into(text, out),
            other => sse::append(
                out,
                other.encode(&ir::StreamEvent::TextDelta(text.to_owned())),
            ),
        }
    }

    /// [`Encoder::encode`] for several events.
    pub fn encode_all<'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a ir::StreamEvent>,
    ) -> Vec<Bytes> {
        events.into_iter().flat_map(|e| self.encode(e)).collect()
    }
}

/// OpenAI's error shape (Chat Completions and Responses share it).
pub fn error_body_openai(status: u16, message: &str) -> Value {
    let kind = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

/// The HTTP status an upstream error object stands for (by its `type` or `code`); 502 when it
/// does not say.
pub fn status_of_error(error: &Value) -> u16 {
    let code = error.get("code").and_then(Value::as_u64);
    if let Some(c) = code.filter(|c| (400..600).contains(c)) {
        return c as u16;
    }
    let named = |k: &str| error.get(k).and_then(Value::as_str).unwrap_or("");
    for name in [named("type"), named("code")] {
        match name {
            "invalid_request_error" | "invalid_request" => return 400,
            "authentication_error" | "invalid_api_key" => return 401,
            "permission_error" => return 403,
            "not_found_error" | "model_not_found" => return 404,
            "request_too_large" => return 413,
            "rate_limit_error" | "rate_limit_exceeded" | "insufficient_quota" => return 429,
            "api_error" | "server_error" => return 500,
            "overloaded_error" => return 529,
            _ => {}
        }
    }
    502
}

/// The message of an upstream error object (`{"message": ...}`, or a bare string).
pub fn upstream_error_message(error: &Value) -> String {
    ProtocolError::upstream(error).to_string()
}

/// Validates an OpenAI embeddings body: the model and the characters of input (token-id inputs
/// count 4 characters per token, the inverse of the prompt estimate).
pub fn parse_embeddings_request(body: &[u8]) -> Result<(String, usize), ProtocolError> {
    let v = json::parse(body)?;
    let body = json::Obj::body(&v)?;
    let model = body.req_str("model")?.to_owned();
    let input = body
        .get("input")
        .ok_or_else(|| ProtocolError::missing("input"))?;
    let bad = || {
        ProtocolError::invalid(
            "input",
            "must be a string, an array of strings, or token arrays",
        )
    };
    let chars = match input {
        Value::String(s) => s.chars().count(),
        Value::Array(items) if !items.is_empty() => {
            let mut chars = 0usize;
            for item in items {
                chars = chars.saturating_add(match item {
                    Value::String(s) => s.chars().count(),
                    Value::Number(n) if n.is_u64() => 4,
                    Value::Array(tokens) if tokens.iter().all(Value::is_u64) => {
                        tokens.len().saturating_mul(4)
                    }
                    _ => return Err(bad()),
                });
            }
            chars
        }
        Value::Array(_) => return Err(ProtocolError::invalid("input", "must not be empty")),
        _ => return Err(bad()),
    };
    Ok((model, chars))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dialect_names_round_trip() {
        for d in Dialect::ALL {
            assert_eq!(d.as_str().parse::<Dialect>().unwrap(), d);
            assert_eq!(
                serde_json::to_value(d).unwrap(),
                Value::String(d.as_str().into())
            );
        }
        assert!("grpc".parse::<Dialect>().is_err());
    }

    #[test]
    fn embeddings_requests_are_validated() {
        assert_eq!(
            parse_embeddings_request(br#"{"model":"e","input":"abcd"}"#).unwrap(),
            ("e".into(), 4)
        );
        assert_eq!(
            parse_embeddings_request(br#"{"model":"e","input":["ab","c",[1,2]]}"#)
                .unwrap()
                .1,
            11
        );
        for (body, reason) in [
            (&br#"{"input":"x"}"#[..], "`model` is required"),
            (br#"{"model":"e"}"#, "`input` is required"),
            (br#"{"model":"e","input":[]}"#, "must not be empty"),
            (br#"{"model":"e","input":{"a":1}}"#, "must be a string"),
        ] {
            let err = parse_embeddings_request(body).unwrap_err().to_string();
            assert!(err.contains(reason), "{err}");
        }
    }

    #[test]
    fn error_bodies_have_each_dialects_shape() {
        let o = Dialect::OpenAiChat.error_body(429, "slow down");
        assert_eq!(o["error"]["message"], "slow down");
        assert_eq!(o["error"]["type"], "rate_limit_error");
        assert!(o["error"]["param"].is_null() && o["error"]["code"].is_null());
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (404, "not_found_error"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (529, "overloaded_error"),
        ] {
            let a = Dialect::AnthropicMessages.error_body(status, "m");
            assert_eq!(a["type"], "error");
            assert_eq!(a["error"]["type"], kind, "{status}");
            assert_eq!(a["error"]["message"], "m");
        }
    }

    #[test]
    fn upstream_error_types_map_to_statuses() {
        assert_eq!(status_of_error(&json!({"type": "overloaded_error"})), 529);
        assert_eq!(
            status_of_error(&json!({"code": "rate_limit_exceeded"})),
            429
        );
        assert_eq!(status_of_error(&json!({"code": 401})), 401);
        assert_eq!(status_of_error(&json!({})), 502);
    }
}
