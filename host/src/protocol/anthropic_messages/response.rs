//! Anthropic Messages answers ↔ IR.

use serde::de::MapAccess;
use serde_json::{Value, json};

use super::request::arguments_object;
use crate::protocol::ir::{FinishReason, Output, Response, ToolCall, Usage};
use crate::protocol::json::{self, Obj};
use crate::protocol::scan::{self, Each, Fields, IsStr, Object, Summary, Text, tokens};
use crate::protocol::{ProtocolError, ids};

/// Reads an upstream's non-streaming answer.
pub fn parse_response(bytes: &[u8]) -> Result<Response, ProtocolError> {
    read_response(bytes).map_err(ProtocolError::in_response)
}

fn read_response(bytes: &[u8]) -> Result<Response, ProtocolError> {
    let v = json::parse(bytes)?;
    let body = Obj::body(&v)?;
    if body.str("type")? == Some("error") {
        return Err(ProtocolError::upstream(body.get("error").unwrap_or(&v)));
    }
    let content = body
        .array("content")?
        .ok_or_else(|| body.missing("content"))?;
    let mut output = Vec::with_capacity(content.len());
    for (i, b) in content.iter().enumerate() {
        let path = format!("content[{i}]");
        let b = Obj::at(b, &path)?;
        match b.req_str("type")? {
            "text" => output.push(Output::Text(b.str("text")?.unwrap_or("").to_owned())),
            "thinking" => output.push(Output::Reasoning {
                text: b.str("thinking")?.unwrap_or("").to_owned(),
                signature: b
                    .str("signature")?
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            }),
            "tool_use" => output.push(Output::ToolCall(ToolCall {
                id: b.req_str("id")?.to_owned(),
                name: b.req_str("name")?.to_owned(),
                arguments: b
                    .get("input")
                    .map_or_else(|| "{}".to_owned(), Value::to_string),
            })),
            // Redacted reasoning and server-tool blocks have no IR form (see docs/translation.md).
            _ => {}
        }
    }
    let stop_sequence = body.str("stop_sequence")?.map(str::to_owned);
    Ok(Response {
        id: body.str_or_empty("id").to_owned(),
        model: body.str_or_empty("model").to_owned(),
        created: None,
        output,
        finish: body
            .get("stop_reason")
            .and_then(Value::as_str)
            .map_or(FinishReason::Stop, parse_stop_reason),
        stop_sequence,
        usage: body.get("usage").map(parse_usage).unwrap_or_default(),
    })
}

/// The fast path of [`parse_response`] for an answer relayed unchanged: its usage and model, or
/// `None` when the full parse must decide (see `protocol::scan`). It checks what
/// [`read_response`] checks, over the same keys.
pub fn scan_response(bytes: &[u8]) -> Option<Summary> {
    let Object(body) = scan::scan::<Object<ScannedBody>>(bytes)?;
    let usage = body.usage.map_or_else(Usage::default, |Object(u)| {
        let cached = tokens(u.cache_read_input_tokens);
        let created = tokens(u.cache_creation_input_tokens);
        Usage {
            input_tokens: tokens(u.input_tokens)
                .saturating_add(cached)
                .saturating_add(created),
            output_tokens: tokens(u.output_tokens),
            cached_input_tokens: cached,
            cache_creation_input_tokens: created,
            reasoning_tokens: 0,
        }
    });
    Some(Summary {
        usage,
        model: body.model.map(|m| m.0.into_owned()).unwrap_or_default(),
    })
}

#[derive(Default)]
struct ScannedBody<'de> {
    content: bool,
    model: Option<Text<'de>>,
    usage: Option<Object<ScannedUsage>>,
}

impl<'de> Fields<'de> for ScannedBody<'de> {
    const KEYS: &'static [&'static str] = &["type", "content", "stop_sequence", "model", "usage"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "type" => {
                if map
                    .next_value::<Option<Text<'de>>>()?
                    .is_some_and(|t| t.0 == "error")
                {
                    return Err(serde::de::Error::custom("an error answer"));
                }
            }
            "content" => {
                self.content = map
                    .next_value::<Option<Each<Object<ScannedBlock>>>>()?
                    .is_some();
            }
            "stop_sequence" => {
                map.next_value::<Option<IsStr>>()?;
            }
            "model" => self.model = map.next_value()?,
            "usage" => self.usage = map.next_value()?,
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.content
    }
}

/// A content block: its `type` is required; a `tool_use` block needs its id and name.
#[derive(Default)]
struct ScannedBlock<'de> {
    kind: Option<Text<'de>>,
    id: bool,
    name: bool,
}

impl<'de> Fields<'de> for ScannedBlock<'de> {
    const KEYS: &'static [&'static str] = &["type", "text", "thinking", "signature", "id", "name"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        let non_blank = |t: Option<Text<'de>>| t.is_some_and(|t| !t.is_blank());
        match key {
            "type" => self.kind = map.next_value()?,
            "text" | "thinking" | "signature" => {
                map.next_value::<Option<IsStr>>()?;
            }
            "id" => self.id = non_blank(map.next_value()?),
            "name" => self.name = non_blank(map.next_value()?),
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        match &self.kind {
            None => false,
            Some(kind) if kind.is_blank() => false,
            Some(kind) if kind.0 == "tool_use" => self.id && self.name,
            Some(_) => true,
        }
    }
}

#[derive(Default)]
struct ScannedUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

impl<'de> Fields<'de> for ScannedUsage {
    const KEYS: &'static [&'static str] = &[
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "input_tokens" => self.input_tokens = map.next_value()?,
            "output_tokens" => self.output_tokens = map.next_value()?,
            "cache_read_input_tokens" => self.cache_read_input_tokens = map.next_value()?,
            "cache_creation_input_tokens" => {
                self.cache_creation_input_tokens = map.next_value()?;
            }
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }
}

pub(super) fn parse_stop_reason(s: &str) -> FinishReason {
    match s {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "max_tokens" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

/// Anthropic's name for a finish reason.
pub(super) fn stop_reason(f: &FinishReason, stop_sequence: Option<&str>) -> &'static str {
    match f {
        FinishReason::Stop if stop_sequence.is_some() => "stop_sequence",
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::ContentFilter => "refusal",
        FinishReason::Other(o) => match o.as_str() {
            "pause_turn" => "pause_turn",
            "model_context_window_exceeded" => "model_context_window_exceeded",
            _ => "end_turn",
        },
    }
}

/// Anthropic counts cached input apart from `input_tokens`; the IR counts it inside.
pub(super) fn parse_usage(v: &Value) -> Usage {
    let Ok(u) = Obj::at(v, "usage") else {
        return Usage::default();
    };
    let cached = u.u32_or_zero("cache_read_input_tokens");
    let created = u.u32_or_zero("cache_creation_input_tokens");
    Usage {
        input_tokens: u
            .u32_or_zero("input_tokens")
            .saturating_add(cached)
            .saturating_add(created),
        output_tokens: u.u32_or_zero("output_tokens"),
        cached_input_tokens: cached,
        cache_creation_input_tokens: created,
        reasoning_tokens: 0,
    }
}

pub(super) fn usage_value(u: &Usage) -> Value {
    json!({
        "input_tokens": u
            .input_tokens
            .saturating_sub(u.cached_input_tokens)
            .saturating_sub(u.cache_creation_input_tokens),
        "output_tokens": u.output_tokens,
        "cache_creation_input_tokens": u.cache_creation_input_tokens,
        "cache_read_input_tokens": u.cached_input_tokens,
    })
}

/// The answer for an Anthropic client.
pub fn build_response(r: &Response, public_model: &str) -> Vec<u8> {
    let content: Vec<Value> = r
        .output
        .iter()
        .filter_map(|o| match o {
            Output::Text(t) if t.is_empty() => None,
            Output::Text(t) => Some(json!({"type": "text", "text": t})),
            Output::Reasoning { text, signature } => Some(json!({
                "type": "thinking",
                "thinking": text,
                "signature": signature.as_deref().unwrap_or(""),
            })),
            Output::ToolCall(c) => Some(json!({
                "type": "tool_use",
                "id": ids::tool_use_id(&c.id),
                "name": c.name,
                "input": arguments_object(&c.arguments),
            })),
        })
        .collect();
    let finish = r.effective_finish();
    let body = json!({
        "id": ids::with_prefix(&r.id, "msg_"),
        "type": "message",
        "role": "assistant",
        "model": public_model,
        "content": content,
        "stop_reason": stop_reason(&finish, r.stop_sequence.as_deref()),
        "stop_sequence": r.stop_sequence,
        "usage": usage_value(&r.usage),
    });
    json::to_vec(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_are_inside_input_in_the_ir_and_outside_on_the_wire() {
        let r = parse_response(
            br#"{"id":"msg_1","type":"message","role":"assistant","model":"c","content":[{"type":"text","text":"hi"}],
                "stop_reason":"stop_sequence","stop_sequence":"END",
                "usage":{"input_tokens":10,"output_tokens":2,"cache_read_input_tokens":30,"cache_creation_input_tokens":5}}"#,
        )
        .unwrap();
        assert_eq!(r.usage.input_tokens, 45);
        assert_eq!(r.usage.cached_input_tokens, 30);
        assert_eq!(r.finish, FinishReason::Stop);
        let out: Value = serde_json::from_slice(&build_response(&r, "pub")).unwrap();
        assert_eq!(out["usage"]["input_tokens"], 10);
        assert_eq!(out["usage"]["cache_read_input_tokens"], 30);
        assert_eq!(out["stop_reason"], "stop_sequence");
        assert_eq!(out["stop_sequence"], "END");
        assert_eq!(out["id"], "msg_1");
    }

    #[test]
    fn error_bodies_are_errors() {
        let err = parse_response(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("Overloaded"));
    }
}
