//! OpenAI Chat Completions (`POST /v1/chat/completions`).
//!
//! Two APIs live here. [`parse`] and [`upstream_body`] are the pass-through path: the body is kept
//! as parsed JSON and forwarded with only `model` rewritten, so fields this gateway does not know
//! (new sampling knobs, vendor extensions) reach an OpenAI-compatible upstream intact. The
//! translating path goes through the IR: [`parse_request`], [`build_request`], [`parse_response`],
//! [`build_response`], [`StreamDecoder`], [`StreamEncoder`] and [`error_body`].

use serde_json::{Map, Value};

use super::ir::IMAGE_TOKENS;
use crate::strategy::Modalities;

mod request;
mod response;
mod stream;

pub use request::{build_request, empty_schema, parse_request};
pub use response::{build_response, parse_response};
pub use stream::{StreamDecoder, StreamEncoder};

/// The error body of OpenAI's API for an HTTP status: `{"error":{"message","type","param","code"}}`.
pub fn error_body(status: u16, message: &str) -> Value {
    super::error_body_openai(status, message)
}

/// A validated Chat Completions request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: String,
    pub stream: bool,
    pub max_tokens: Option<u32>,
    pub prompt_tokens: u32,
    pub modalities: Modalities,
    pub body: Map<String, Value>,
}

/// Parses and validates a request body; the error text is the reason shown to the client.
pub fn parse(bytes: &[u8]) -> Result<ChatRequest, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(body) = value else {
        return Err("the body must be a JSON object".into());
    };
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.trim().is_empty() => m.clone(),
        Some(Value::String(_)) | None => return Err("`model` is required".into()),
        Some(_) => return Err("`model` must be a string".into()),
    };
    let messages = match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err("`messages` must not be empty".into()),
        None => return Err("`messages` is required".into()),
        Some(_) => return Err("`messages` must be an array".into()),
    };
    let mut chars: u64 = 0;
    let mut image_tokens: u32 = 0;
    let mut modalities = Modalities::empty();
    for (i, message) in messages.iter().enumerate() {
        let Value::Object(message) = message else {
            return Err(format!("`messages[{i}]` must be an object"));
        };
        match message.get("role") {
            Some(Value::String(_)) => {}
            None => return Err(format!("`messages[{i}].role` is required")),
            Some(_) => return Err(format!("`messages[{i}].role` must be a string")),
        }
        match message.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => chars += s.chars().count() as u64,
            Some(Value::Array(parts)) => {
                for (j, part) in parts.iter().enumerate() {
                    let kind = part
                        .get("type")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("`messages[{i}].content[{j}].type` is required"))?;
                    match kind {
                        "text" => {
                            if let Some(t) = part.get("text").and_then(Value::as_str) {
                                chars += t.chars().count() as u64;
                            }
                        }
                        "image_url" | "image" => {
                            modalities |= Modalities::IMAGE;
                            image_tokens = image_tokens.saturating_add(IMAGE_TOKENS);
                        }
                        "input_audio" | "audio" => modalities |= Modalities::AUDIO,
                        "video_url" | "video" => modalities |= Modalities::VIDEO,
                        _ => {}
                    }
                }
            }
            Some(_) => {
                return Err(format!(
                    "`messages[{i}].content` must be a string or an array of parts"
                ));
            }
        }
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("`stream` must be a boolean".into()),
    };
    let max_tokens = match body
        .get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
    {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .map(|n| n.min(u64::from(u32::MAX)) as u32)
                .ok_or("`max_tokens` must be a non-negative integer")?,
        ),
    };
    let prompt_tokens = u32::try_from(chars / 4)
        .unwrap_or(u32::MAX)
        .saturating_add(image_tokens);
    Ok(ChatRequest {
        model,
        stream,
        max_tokens,
        prompt_tokens,
        modalities,
        body,
    })
}

/// The request body for an OpenAI-compatible upstream: the client's body with the upstream's model
/// name, and usage requested on streams so the gateway can account tokens.
pub fn upstream_body(request: &ChatRequest, provider_model_id: &str) -> Vec<u8> {
    let mut body = request.body.clone();
    body.insert("model".into(), Value::String(provider_model_id.to_owned()));
    if request.stream {
        let options = body
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(o) = options {
            o.entry("include_usage").or_insert(Value::Bool(true));
        }
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_characters_over_four_and_flat_images() {
        let r = parse(
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"abcdefgh"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},{"role":"assistant","content":"abcd"}]}"#,
        )
        .unwrap();
        assert_eq!(r.prompt_tokens, 3 + 85);
        assert!(r.modalities.contains(Modalities::IMAGE));
        assert!(!r.stream);
    }

    #[test]
    fn rejects_malformed_bodies_with_a_reason() {
        for (body, reason) in [
            (&b"{"[..], "not valid JSON"),
            (b"[]", "must be a JSON object"),
            (
                br#"{"messages":[{"role":"user","content":"x"}]}"#,
                "`model` is required",
            ),
            (br#"{"model":"m"}"#, "`messages` is required"),
            (br#"{"model":"m","messages":[]}"#, "must not be empty"),
            (
                br#"{"model":"m","messages":[{"content":"x"}]}"#,
                "role` is required",
            ),
            (
                br#"{"model":"m","messages":[{"role":"user","content":1}]}"#,
                "must be a string or an array",
            ),
            (
                br#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                "`stream` must be a boolean",
            ),
        ] {
            let err = parse(body).unwrap_err();
            assert!(err.contains(reason), "{err} should contain {reason}");
        }
    }

    #[test]
    fn upstream_body_rewrites_model_and_asks_for_stream_usage() {
        let r = parse(br#"{"model":"public","messages":[{"role":"user","content":"x"}],"stream":true,"seed":7}"#)
            .unwrap();
        let out: Value = serde_json::from_slice(&upstream_body(&r, "private")).unwrap();
        assert_eq!(out["model"], "private");
        assert_eq!(out["seed"], 7);
        assert_eq!(out["stream_options"]["include_usage"], true);
    }
}
