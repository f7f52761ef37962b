//! Chat Completions answers ↔ IR.

use std::borrow::Cow;

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
    if let Some(summary) = pull_response(bytes) {
        return Some(summary);
    }
    scan_by_fields(bytes)
}

/// [`scan_response`] without its first reading ([`pull_response`]).
pub(crate) fn scan_by_fields(bytes: &[u8]) -> Option<Summary> {
    let Object(body) = scan::scan::<Object<ScannedBody>>(bytes)?;
    let usage = body.usage.map_or_else(Usage::default, |Object(u)| u.chat());
    Some(Summary {
        usage,
        model: body.model.map(|m| m.0.into_owned()).unwrap_or_default(),
    })
}

/// The common answer (one message of text, no tool calls) read key by key, the way
/// [`ScannedBody`] reads it but without serde's visitors, which cost about as much as the reading
/// (a key through `KeyIndex` ~190 instructions; ~9,000 an answer in all). It is stricter, never
/// looser: anything it does not read here (tool calls, Responses-named usage, a repeated key)
/// gives up, and [`ScannedBody`] decides.
pub(crate) fn pull_response(bytes: &[u8]) -> Option<Summary> {
    let mut pull = scan::Pull::new(bytes)?;
    let (mut choices, mut model, mut usage) = (false, None, None);
    let field = |key: &str| match key {
        "error" => Some(0),
        "choices" => Some(1),
        "model" => Some(2),
        "usage" => Some(3),
        _ => None,
    };
    pull.fields(field, |pull, key| {
        match key {
            // Only `null`: an error beside an answer is the full parse's to report.
            0 => return pull.null()?.then_some(()),
            1 => choices = pull_choices(pull)?,
            2 => {
                model = if pull.null()? {
                    None
                } else {
                    Some(pull.string()?)
                }
            }
            _ => usage = Some(pull_usage(pull)?),
        }
        Some(())
    })?;
    choices.then_some(())?;
    pull.end(Summary {
        usage: usage.unwrap_or_default(),
        model: model.map(Cow::into_owned).unwrap_or_default(),
    })
}

/// `choices`: whether it is a non-empty array whose first element holds a message object.
fn pull_choices(pull: &mut scan::Pull) -> Option<bool> {
    pull.open(b'[')?;
    let mut first = true;
    if !pull.more(b']', &mut first)? {
        return None;
    }
    let mut message = false;
    pull.fields(
        |key| (key == "message").then_some(0),
        |pull, _| {
            message = true;
            pull_message(pull)
        },
    )?;
    while pull.more(b']', &mut first)? {
        pull.raw()?;
    }
    pull.close(b']')?;
    Some(message)
}

/// A choice's message: an object whose text fields are strings or `null` and whose `content` may
/// be an array of parts; one with `tool_calls` is left to [`ScannedMessage`].
fn pull_message(pull: &mut scan::Pull) -> Option<()> {
    let field = |key: &str| match key {
        "reasoning_content" => Some(0),
        "refusal" => Some(1),
        "content" => Some(2),
        "tool_calls" => Some(3),
        _ => None,
    };
    pull.fields(field, |pull, key| {
        if pull.null()? {
            return Some(());
        }
        match (key, pull.peek()?) {
            (0..=2, b'"') => pull.string().map(drop),
            (2, b'[') => pull.raw().map(drop),
            _ => None,
        }
    })
}

/// `usage` (or `null`), under Chat's names; Responses' names are left to [`OpenAiUsage`].
fn pull_usage(pull: &mut scan::Pull) -> Option<Usage> {
    if pull.null()? {
        return Some(Usage::default());
    }
    let field = |key: &str| match key {
        "prompt_tokens" => Some(0),
        "completion_tokens" => Some(1),
        "prompt_tokens_details" => Some(2),
        "completion_tokens_details" => Some(3),
        "input_tokens" | "output_tokens" | "input_tokens_details" | "output_tokens_details" => {
            Some(4)
        }
        _ => None,
    };
    let (mut prompt, mut completion) = (None, None);
    let (mut cached, mut reasoning) = (None, None);
    pull.fields(field, |pull, key| {
        match key {
            0 => prompt = pull.count()?,
            1 => completion = pull.count()?,
            2 => cached = pull_details(pull)?.0,
            3 => reasoning = pull_details(pull)?.1,
            _ => return None,
        }
        Some(())
    })?;
    Some(Usage {
        input_tokens: scan::tokens(prompt),
        output_tokens: scan::tokens(completion),
        cached_input_tokens: scan::tokens(cached),
        cache_creation_input_tokens: 0,
        reasoning_tokens: scan::tokens(reasoning),
    })
}

/// A `*_tokens_details` object (or `null`): its cached and reasoning tokens.
fn pull_details(pull: &mut scan::Pull) -> Option<(Option<u64>, Option<u64>)> {
    let mut counts = (None, None);
    if !pull.null()? {
        let field = |key: &str| match key {
            "cached_tokens" => Some(0),
            "reasoning_tokens" => Some(1),
            _ => None,
        };
        pull.fields(field, |pull, key| {
            let count = pull.count()?;
            match key {
                0 => counts.0 = count,
                _ => counts.1 = count,
            }
            Some(())
        })?;
    }
    Some(counts)
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
    fn the_common_answer_is_read_key_by_key_and_the_rest_is_left_to_the_scan_by_fields() {
        let common = br#"{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"content":"Hi \"there\"","refusal":null,"role":"assistant"}}],"created":1796632372,"id":"chatcmpl-1","model":"sim","object":"chat.completion","usage":{"completion_tokens":16,"completion_tokens_details":{"reasoning_tokens":2},"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":3},"total_tokens":23}}"#;
        let pulled = pull_response(common).expect("the common answer takes the pull reading");
        assert_eq!(Some(&pulled), scan_by_fields(common).as_ref());
        assert_eq!(pulled.model, "sim");
        assert_eq!(
            (
                pulled.usage.input_tokens,
                pulled.usage.output_tokens,
                pulled.usage.cached_input_tokens,
                pulled.usage.reasoning_tokens
            ),
            (7, 16, 3, 2)
        );
        // Read by the fields alone: tool calls, Responses-named usage.
        for fields_only in [
            r#"{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f"}}]}}]}"#,
            r#"{"choices":[{"message":{}}],"usage":{"input_tokens":1}}"#,
        ] {
            assert_eq!(pull_response(fields_only.as_bytes()), None, "{fields_only}");
            assert!(
                scan_response(fields_only.as_bytes()).is_some(),
                "{fields_only}"
            );
        }
        // Refused by both: the full parse decides.
        for neither in [
            r#"{"choices":[]}"#,
            r#"{"choices":[{"message":null}]}"#,
            r#"{"choices":[{"message":{"content":5}}]}"#,
            r#"{"choices":[{"message":{}}],"usage":{"prompt_tokens":-1}}"#,
            r#"{"choices":[{"message":{}}],"model":"a","model":"b"}"#,
            r#"{"error":null,"choices":[{"message":{}}],"error":null}"#,
            r#"{"choices":[{"message":{}}],"model":5}"#,
            r#"{"choices":[{"message":{"refusal":["x"]}}]}"#,
            r#"{"choices":[{"message":{}},5],"usage":{"prompt_tokens_details":{"cached_tokens":1.5}}}"#,
            r#"{"choices":[{"message":{}}],"error":{"message":"x"}}"#,
            r#"{"choices":[{"message":{}}]} x"#,
        ] {
            assert_eq!(pull_response(neither.as_bytes()), None, "{neither}");
            assert_eq!(scan_by_fields(neither.as_bytes()), None, "{neither}");
        }
    }

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
