//! Chat Completions answers ↔ IR.

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};

use super::request::arguments_text;
use crate::protocol::ir::{FinishReason, Output, Response, ToolCall, Usage};
use crate::protocol::json::{self, Obj};
use crate::protocol::scan::{
    self, Checked, Each, Fields, First, IsStr, Object, OpenAiUsage, Summary, Text,
};
use crate::protocol::{ProtocolError, ids};

/// Reads an upstream's non-streaming answer.
pub fn parse_response(bytes: &[u8]) -> Result<Response, ProtocolError> {
    read_response(bytes).map_err(ProtocolError::in_response)
}

fn read_response(bytes: &[u8]) -> Result<Response, ProtocolError> {
    let v = json::parse(bytes)?;
    let body = Obj::body(&v)?;
    if let Some(e) = body.get("error") {
        return Err(ProtocolError::upstream(e));
    }
    let choices = body
        .array("choices")?
        .ok_or_else(|| body.missing("choices"))?;
    let first = choices
        .first()
        .ok_or_else(|| ProtocolError::invalid("choices", "is empty"))?;
    let choice = Obj::at(first, "choices[0]")?;
    let message_path = choice.path("message");
    let message = Obj::at(
        choice
            .get("message")
            .ok_or_else(|| choice.missing("message"))?,
        &message_path,
    )?;
    let mut output = Vec::new();
    let reasoning = match message.str("reasoning_content")? {
        Some(r) => Some(r),
        None => message.get("reasoning").and_then(Value::as_str),
    };
    if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
        output.push(Output::Reasoning {
            text: r.to_owned(),
            signature: None,
        });
    }
    let text = match message.get("content") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        // Some servers answer with text parts.
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        Some(other) => {
            return Err(ProtocolError::wrong_type(
                message.path("content"),
                "a string",
                other,
            ));
        }
    };
    if !text.is_empty() {
        output.push(Output::Text(text));
    }
    if let Some(refusal) = message.str("refusal")?.filter(|r| !r.is_empty()) {
        output.push(Output::Text(refusal.to_owned()));
    }
    if let Some(calls) = message.array("tool_calls")? {
        for (j, c) in calls.iter().enumerate() {
            let path = format!("{message_path}.tool_calls[{j}]");
            let c = Obj::at(c, &path)?;
            let f_path = c.path("function");
            let f = Obj::at(
                c.get("function").ok_or_else(|| c.missing("function"))?,
                &f_path,
            )?;
            output.push(Output::ToolCall(ToolCall {
                id: match c.str("id")? {
                    Some(id) if !id.is_empty() => id.to_owned(),
                    _ => ids::random("call_"),
                },
                name: f.req_str("name")?.to_owned(),
                arguments: arguments_text(f.get("arguments")),
            }));
        }
    }
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map_or(FinishReason::Stop, parse_finish);
    Ok(Response {
        id: body.str_or_empty("id").to_owned(),
        model: body.str_or_empty("model").to_owned(),
        created: body.get("created").and_then(Value::as_u64),
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
    let usage = body.usage.map_or_else(Usage::default, |Object(u)| u.chat());
    Some(Summary {
        usage,
        model: body.model.map(|m| m.0.into_owned()).unwrap_or_default(),
    })
}

#[derive(Default)]
struct ScannedBody<'de> {
    choices: bool,
    model: Option<Text<'de>>,
    usage: Option<Object<OpenAiUsage>>,
}

impl<'de> Fields<'de> for ScannedBody<'de> {
    const KEYS: &'static [&'static str] = &["error", "choices", "model", "usage"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "error" => scan::expect_null(map)?,
            "choices" => {
                self.choices = map
                    .next_value::<Option<First<Object<ScannedChoice>>>>()?
                    .is_some();
            }
            "model" => self.model = map.next_value()?,
            "usage" => self.usage = map.next_value()?,
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.choices
    }
}

#[derive(Default)]
struct ScannedChoice {
    message: bool,
}

impl<'de> Fields<'de> for ScannedChoice {
    const KEYS: &'static [&'static str] = &["message"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "message" => {
                self.message = map
                    .next_value::<Option<Object<ScannedMessage>>>()?
                    .is_some();
            }
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.message
    }
}

#[derive(Default)]
struct ScannedMessage;

impl<'de> Fields<'de> for ScannedMessage {
    const KEYS: &'static [&'static str] =
        &["reasoning_content", "content", "refusal", "tool_calls"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "reasoning_content" | "refusal" => {
                map.next_value::<Option<IsStr>>()?;
            }
            // Some servers answer with text parts, which the full parse reads leniently.
            "content" => {
                map.next_value::<Option<ScannedContent>>()?;
            }
            "tool_calls" => {
                map.next_value::<Option<Each<Object<ScannedToolCall>>>>()?;
            }
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }
}

/// A message's `content`: a string or an array of anything.
struct ScannedContent;

impl<'de> serde::Deserialize<'de> for ScannedContent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = ScannedContent;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<ScannedContent, E> {
                Ok(ScannedContent)
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<ScannedContent, S::Error> {
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(ScannedContent)
            }
        }
        d.deserialize_any(ContentVisitor)
    }
}

#[derive(Default)]
struct ScannedToolCall {
    function: bool,
}

impl<'de> Fields<'de> for ScannedToolCall {
    const KEYS: &'static [&'static str] = &["id", "function"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "id" => {
                map.next_value::<Option<IsStr>>()?;
            }
            "function" => {
                self.function = map
                    .next_value::<Option<Object<ScannedFunction>>>()?
                    .is_some();
            }
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.function
    }
}

#[derive(Default)]
struct ScannedFunction {
    named: bool,
}

impl<'de> Fields<'de> for ScannedFunction {
    const KEYS: &'static [&'static str] = &["name"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "name" => {
                self.named = map
                    .next_value::<Option<Text<'de>>>()?
                    .is_some_and(|n| !n.is_blank());
            }
            other => return Err(scan::unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.named
    }
}

pub(super) fn parse_finish(s: &str) -> FinishReason {
    match s {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

/// The Chat name of a finish reason; reasons Chat has no name for read as `stop`.
pub(super) fn finish_str(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::Other(_) => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
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
        input_tokens: u.u32_or_zero("prompt_tokens"),
        output_tokens: u.u32_or_zero("completion_tokens"),
        cached_input_tokens: detail("prompt_tokens_details", "cached_tokens"),
        cache_creation_input_tokens: 0,
        reasoning_tokens: detail("completion_tokens_details", "reasoning_tokens"),
    }
}

pub(super) fn usage_value(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens.saturating_add(u.output_tokens),
        "prompt_tokens_details": {"cached_tokens": u.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    })
}

/// The answer for a Chat Completions client.
pub fn build_response(r: &Response, public_model: &str) -> Vec<u8> {
    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    let text = r.text();
    let calls: Vec<Value> = r
        .tool_calls()
        .map(|c| {
            json!({
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })
        })
        .collect();
    let content = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        text.into()
    };
    message.insert("content".into(), content);
    message.insert("refusal".into(), Value::Null);
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let reasoning = r.reasoning();
    if !reasoning.is_empty() {
        // Not in OpenAI's schema; the de-facto field of OpenAI-compatible reasoning servers.
        message.insert("reasoning_content".into(), reasoning.into());
    }
    let body = json!({
        "id": ids::with_prefix(&r.id, "chatcmpl-"),
        "object": "chat.completion",
        "created": r.created.unwrap_or_else(crate::clock::unix_secs),
        "model": public_model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_str(&r.effective_finish()),
        }],
        "usage": usage_value(&r.usage),
    });
    json::to_vec(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_text_reasoning_tool_calls_and_usage() {
        let r = parse_response(
            br#"{"id":"c1","model":"up","created":5,"choices":[{"index":0,"message":{"role":"assistant","content":null,
                "reasoning_content":"think","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},
                "finish_reason":"tool_calls"}],
                "usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        )
        .unwrap();
        assert_eq!(r.finish, FinishReason::ToolCalls);
        assert_eq!(r.reasoning(), "think");
        assert_eq!(r.tool_calls().count(), 1);
        assert_eq!(r.usage.cached_input_tokens, 4);
        assert_eq!(r.created, Some(5));
    }

    #[test]
    fn upstream_errors_and_empty_choices_are_errors() {
        assert!(
            parse_response(br#"{"error":{"message":"boom"}}"#)
                .unwrap_err()
                .to_string()
                .contains("boom")
        );
        assert!(
            parse_response(br#"{"choices":[]}"#)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
    }
}
