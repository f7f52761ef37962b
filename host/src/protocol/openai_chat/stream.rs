//! Chat Completions streams: `data: {chunk}` events ending with `data: [DONE]`.

use bytes::Bytes;
use serde_json::{Value, json};

use super::response::{finish_str, parse_finish, parse_usage, usage_value};
use crate::protocol::ir::{StreamEvent, effective_finish};
use crate::protocol::json::Obj;
use crate::protocol::{error_body_openai, ids, sse, status_of_error, upstream_error_message};

/// Turns an upstream's Chat Completions chunks into IR events.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    /// Per IR tool index: the upstream's index and id of that call.
    tools: Vec<(u64, String)>,
    finished: bool,
    done: bool,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one SSE event (the event name is ignored: Chat streams do not use it).
    pub fn decode(&mut self, _event: &str, data: &str) -> Vec<StreamEvent> {
        if self.done {
            return Vec::new();
        }
        let data = data.trim();
        if data.is_empty() {
            return Vec::new();
        }
        if data == "[DONE]" {
            self.done = true;
            return vec![StreamEvent::Done];
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return self.fail(502, format!("invalid upstream stream chunk: {e}")),
        };
        let Ok(chunk) = Obj::body(&v) else {
            return self.fail(502, "upstream stream chunk is not a JSON object".into());
        };
        if let Some(e) = chunk.get("error") {
            return self.fail(status_of_error(e), upstream_error_message(e));
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.push(StreamEvent::Start {
                id: chunk.str_or_empty("id").to_owned(),
                model: chunk.str_or_empty("model").to_owned(),
            });
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        // Only the first choice is translated (`n > 1` has no equivalent elsewhere).
        let choice = choices.and_then(|c| {
            c.iter()
                .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        });
        if let Some(choice) = choice {
            if let Some(delta) = choice.get("delta") {
                self.delta(delta, &mut out);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finished = true;
                out.push(StreamEvent::Finish {
                    reason: parse_finish(reason),
                    stop_sequence: None,
                });
            }
        }
        // Usage rides on the last chunk (empty `choices`) or on the finishing one; servers that
        // repeat running totals on every chunk are only heard at the end.
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object())
            && (choices.is_none_or(|c| c.is_empty()) || self.finished)
        {
            out.push(StreamEvent::Usage(parse_usage(u)));
        }
        out
    }

    fn delta(&mut self, delta: &Value, out: &mut Vec<StreamEvent>) {
        let text = |k: &str| {
            delta
                .get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        if let Some(r) = text("reasoning_content").or_else(|| text("reasoning")) {
            out.push(StreamEvent::ReasoningDelta(r.to_owned()));
        }
        if let Some(t) = text("content") {
            out.push(StreamEvent::TextDelta(t.to_owned()));
        }
        if let Some(t) = text("refusal") {
            out.push(StreamEvent::TextDelta(t.to_owned()));
        }
        let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) else {
            return;
        };
        for (pos, call) in calls.iter().enumerate() {
            let upstream_index = call
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(pos as u64);
            let id = call.get("id").and_then(Value::as_str).unwrap_or("");
            let function = call.get("function");
            let name = function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let arguments = function
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str)
                .unwrap_or("");
            // A new id at a known index is a new call: some servers put every call at index 0.
            let known = self.tools.iter().rposition(|(i, known_id)| {
                *i == upstream_index && (id.is_empty() || id == known_id)
            });
            let index = match known {
                Some(i) => i,
                None => {
                    let id = if id.is_empty() {
                        ids::random("call_")
                    } else {
                        id.to_owned()
                    };
                    self.tools.push((upstream_index, id.clone()));
                    let index = self.tools.len() - 1;
                    out.push(StreamEvent::ToolCallStart {
                        index: index as u32,
                        id,
                        name: name.to_owned(),
                    });
                    index
                }
            };
            if !arguments.is_empty() {
                out.push(StreamEvent::ToolCallDelta {
                    index: index as u32,
                    arguments: arguments.to_owned(),
                });
            }
        }
    }

    fn fail(&mut self, status: u16, message: String) -> Vec<StreamEvent> {
        self.done = true;
        vec![StreamEvent::Error { status, message }]
    }

    /// Call when the upstream stream ended: completes a stream that lacked only `[DONE]`, reports
    /// one that ended early, and returns nothing after a terminal event.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        if self.done {
            return Vec::new();
        }
        if self.finished {
            self.done = true;
            return vec![StreamEvent::Done];
        }
        self.fail(
            502,
            "upstream stream ended before the answer was complete".into(),
        )
    }
}

/// Frames IR events as Chat Completions chunks for a client.
#[derive(Debug)]
pub struct StreamEncoder {
    public_model: String,
    id: String,
    created: u64,
    started: bool,
    had_tool_calls: bool,
    include_usage: bool,
    closed: bool,
}

impl StreamEncoder {
    pub fn new(public_model: &str) -> Self {
        Self {
            public_model: public_model.to_owned(),
            id: String::new(),
            created: ids::now(),
            started: false,
            had_tool_calls: false,
            include_usage: true,
            closed: false,
        }
    }

    /// Whether usage events become a usage chunk (on by default; OpenAI sends it only when the
    /// client set `stream_options.include_usage`, and every SDK accepts it either way).
    pub fn include_usage(mut self, yes: bool) -> Self {
        self.include_usage = yes;
        self
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Bytes {
        sse::data_frame(&json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.public_model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        }))
    }

    fn start(&mut self, id: &str, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = ids::with_prefix(id, "chatcmpl-");
        out.push(self.chunk(json!({"role": "assistant", "content": ""}), None));
    }

    /// The client frames for one IR event; nothing after `Done` or `Error`.
    pub fn encode(&mut self, event: &StreamEvent) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        match event {
            StreamEvent::Start { id, .. } => self.start(id, &mut out),
            StreamEvent::TextDelta(t) => {
                self.start("", &mut out);
                out.push(self.chunk(json!({"content": t}), None));
            }
            StreamEvent::ReasoningDelta(t) => {
                self.start("", &mut out);
                out.push(self.chunk(json!({"reasoning_content": t}), None));
            }
            StreamEvent::ReasoningSignature(_) => {}
            StreamEvent::ToolCallStart { index, id, name } => {
                self.start("", &mut out);
                self.had_tool_calls = true;
                out.push(self.chunk(
                    json!({"tool_calls": [{
                        "index": index,
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }]}),
                    None,
                ));
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                self.start("", &mut out);
                out.push(self.chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}),
                    None,
                ));
            }
            StreamEvent::Finish { reason, .. } => {
                self.start("", &mut out);
                let reason = effective_finish(reason, self.had_tool_calls);
                out.push(self.chunk(json!({}), Some(finish_str(&reason))));
            }
            StreamEvent::Usage(u) => {
                if self.include_usage {
                    self.start("", &mut out);
                    out.push(sse::data_frame(&json!({
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.public_model,
                        "choices": [],
                        "usage": usage_value(u),
                    })));
                }
            }
            StreamEvent::Done => {
                self.closed = true;
                out.push(Bytes::from_static(b"data: [DONE]\n\n"));
            }
            StreamEvent::Error { status, message } => {
                // The OpenAI SDKs raise an API error for a chunk with an `error` member.
                self.closed = true;
                out.push(sse::data_frame(&error_body_openai(*status, message)));
            }
        }
        out
    }
}
