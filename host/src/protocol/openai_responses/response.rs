//! Responses answers ↔ IR.

use serde::de::MapAccess;
use serde_json::{Value, json};

use super::item_id;
use crate::protocol::ir::{FinishReason, Output, Response, ToolCall, Usage};
use crate::protocol::json::{self, Obj};
use crate::protocol::scan::{
    self, Checked, Each, Fields, IsStr, Object, OpenAiUsage, Summary, Text,
};
use crate::protocol::{ProtocolError, ids};

/// Reads an upstream's non-streaming answer.
pub fn parse_response(bytes: &[u8]) -> Result<Response, ProtocolError> {
    read_response(bytes).map_err(ProtocolError::in_response)
}

fn read_response(bytes: &[u8]) -> Result<Response, ProtocolError> {
    let v = json::parse(bytes)?;
    let body = Obj::body(&v)?;
    if body.str("status")? == Some("failed") || body.has("error") {
        return Err(ProtocolError::upstream(body.get("error").unwrap_or(&v)));
    }
    let items = body
        .array("output")?
        .ok_or_else(|| body.missing("output"))?;
    let mut output = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("output[{i}]");
        let item = Obj::at(item, &path)?;
        match item.str("type")? {
            Some("message") => {
                for part in item.array("content")?.into_iter().flatten() {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => {
                            let t = part.get("text").and_then(Value::as_str).unwrap_or("");
                            output.push(Output::Text(t.to_owned()));
                        }
                        Some("refusal") => {
                            let t = part.get("refusal").and_then(Value::as_str).unwrap_or("");
                            output.push(Output::Text(t.to_owned()));
                        }
                        _ => {}
                    }
                }
            }
            Some("function_call") => output.push(Output::ToolCall(ToolCall {
                id: item.req_str("call_id")?.to_owned(),
                name: item.req_str("name")?.to_owned(),
                arguments: item.str("arguments")?.unwrap_or("").to_owned(),
            })),
            Some("reasoning") => {
                let text = reasoning_text(item.map.get("content"))
                    .or_else(|| reasoning_text(item.map.get("summary")))
                    .unwrap_or_default();
                if !text.is_empty() {
                    output.push(Output::Reasoning {
                        text,
                        signature: None,
                    });
                }
            }
            // Built-in tool calls (web search, …) have no IR form.
            _ => {}
        }
    }
    let has_calls = output.iter().any(|o| matches!(o, Output::ToolCall(_)));
    let finish = match body.str("status")? {
        Some("incomplete") => incomplete_reason(body.get("incomplete_details")),
        _ if has_calls => FinishReason::ToolCalls,
        _ => FinishReason::Stop,
    };
    Ok(Response {
        id: body.str_or_empty("id").to_owned(),
        model: body.str_or_empty("model").to_owned(),
        created: body.get("created_at").and_then(Value::as_u64),
        output,
        finish,
        stop_sequence: None,
        usage: body.get("usage").map(parse_usage).unwrap_or_default(),
    })
}

/// The fast path of [`parse_response`] for an answer relayed unchanged: its usage and model, or
/// `None` when the full parse must decide (see `protocol::scan`). It checks what
/// [`read_response`] checks, over the same keys.
pub fn scan_response(bytes: &[u8]) -> Option<Summary> {
    let Object(body) = scan::scan::<Object<ScannedBody>>(bytes)?;
    let usage = body
        .usage
        .map_or_else(Usage::default, |Object(u)| u.responses());
    Some(Summary {
        usage,
        model: body.model.map(|m| m.0.into_owned()).unwrap_or_default(),
    })
}

#[derive(Default)]
struct ScannedBody<'de> {
    output: bool,
    model: Option<Text<'de>>,
    usage: Option<Object<OpenAiUsage>>,
}

impl<'de> Fields<'de> for ScannedBody<'de> {
    const KEYS: &'static [&'static str] = &["status", "error", "output", "model", "usage"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "status" => {
                if map
                    .next_value::<Option<Text<'de>>>()?
                    .is_some_and(|s| s.0 == "failed")
                {
                    return Err(serde::de::Error::custom("a failed response"));
                }
            }
            "error" => scan::expect_null(map)?,
            "output" => {
                self.output = map
                    .next_value::<Option<Each<Object<ScannedItem>>>>()?
                    .is_some();
            }
            "model" => self.model = map.next_value()?,
            "usage" => self.usage = map.next_value()?,
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.output
    }
}

/// An output item: a `function_call` needs its call id and name.
#[derive(Default)]
struct ScannedItem<'de> {
    kind: Option<Text<'de>>,
    call_id: bool,
    name: bool,
}

impl<'de> Fields<'de> for ScannedItem<'de> {
    const KEYS: &'static [&'static str] = &["type", "content", "call_id", "name", "arguments"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        let non_blank = |t: Option<Text<'de>>| t.is_some_and(|t| !t.is_blank());
        match key {
            "type" => self.kind = map.next_value()?,
            "content" => {
                map.next_value::<Option<Each<Checked>>>()?;
            }
            "call_id" => self.call_id = non_blank(map.next_value()?),
            "name" => self.name = non_blank(map.next_value()?),
            "arguments" => {
                map.next_value::<Option<IsStr>>()?;
            }
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        match &self.kind {
            Some(kind) if kind.0 == "function_call" => self.call_id && self.name,
            _ => true,
        }
    }
}

fn reasoning_text(parts: Option<&Value>) -> Option<String> {
    let parts = parts?.as_array()?;
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n\n"))
}

pub(super) fn incomplete_reason(details: Option<&Value>) -> FinishReason {
    match details
        .and_then(|d| d.get("reason"))
        .and_then(Value::as_str)
    {
        Some("max_output_tokens") | None => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
    }
}

pub(super) fn parse_usage(v: &Value) -> Usage {
    let Ok(u) = Obj::at(v, "usage") else {
        return Usage::default();
    };
    let detail = |outer: &str, inner: &str| {
        u.map
            .get(outer)
            .and_then(|d| d.get(inner))
            .and_then(Value::as_u64)
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
    };
    Usage {
        input_tokens: u.u32_or_zero("input_tokens"),
        output_tokens: u.u32_or_zero("output_tokens"),
        cached_input_tokens: detail("input_tokens_details", "cached_tokens"),
        cache_creation_input_tokens: 0,
        reasoning_tokens: detail("output_tokens_details", "reasoning_tokens"),
    }
}

pub(super) fn usage_value(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_input_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens.saturating_add(u.output_tokens),
    })
}

/// `status` and `incomplete_details` of a finished response.
pub(super) fn status_of(finish: &FinishReason) -> (&'static str, Value) {
    match finish {
        FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        FinishReason::ContentFilter => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// A complete response object around `output` (also used by the stream encoder's lifecycle
/// events, where it is the SDKs' snapshot).
pub(super) fn response_object(
    id: &str,
    created_at: u64,
    model: &str,
    status: &str,
    output: Vec<Value>,
    incomplete_details: Value,
    usage: Option<&Usage>,
) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete_details,
        "instructions": null,
        "max_output_tokens": null,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": null,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": usage.map(usage_value),
        "user": null,
        "metadata": {},
    })
}

pub(super) fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    })
}

pub(super) fn reasoning_item(id: &str, text: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    })
}

pub(super) fn function_call_item(id: &str, call: &ToolCall, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    })
}

/// The answer for a Responses client.
pub fn build_response(r: &Response, public_model: &str) -> Vec<u8> {
    let id = ids::with_prefix(&r.id, "resp_");
    let output: Vec<Value> = r
        .output
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Output::Text(t) if t.is_empty() => None,
            Output::Text(t) => Some(message_item(&item_id("msg_", &id, i), t, "completed")),
            Output::Reasoning { text, .. } => Some(reasoning_item(&item_id("rs_", &id, i), text)),
            Output::ToolCall(c) => {
                Some(function_call_item(&item_id("fc_", &id, i), c, "completed"))
            }
        })
        .collect();
    let (status, details) = status_of(&r.effective_finish());
    let body = response_object(
        &id,
        r.created.unwrap_or_else(crate::clock::unix_secs),
        public_model,
        status,
        output,
        details,
        Some(&r.usage),
    );
    json::to_vec(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_and_incomplete_responses() {
        let err = parse_response(
            br#"{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"boom"},"output":[]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("boom"));
        let r = parse_response(
            br#"{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},
                "output":[{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"Hel"}]}],
                "usage":{"input_tokens":3,"output_tokens":1,"input_tokens_details":{"cached_tokens":2}}}"#,
        )
        .unwrap();
        assert_eq!(r.finish, FinishReason::Length);
        assert_eq!(r.text(), "Hel");
        assert_eq!(r.usage.cached_input_tokens, 2);
        let out: Value = serde_json::from_slice(&build_response(&r, "pub")).unwrap();
        assert_eq!(out["status"], "incomplete");
        assert_eq!(out["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(out["output"][0]["id"], "msg_1_0");
    }
}
