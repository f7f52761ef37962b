//! Responses streams: typed `response.*` events with sequence numbers, ending with
//! `response.completed` (or `response.incomplete` / `response.failed`).

use bytes::Bytes;
use serde_json::{Value, json};

use super::item_id;
use super::response::{
    function_call_item, incomplete_reason, message_item, parse_usage, reasoning_item,
    response_object, status_of,
};
use crate::protocol::ir::{FinishReason, StreamEvent, ToolCall, Usage, effective_finish};
use crate::protocol::{ids, sse, status_of_error, upstream_error_message};

/// Turns an upstream's Responses stream into IR events.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    /// Function-call items: upstream output index, IR tool index, whether arguments were seen.
    tools: Vec<(u64, u32, bool)>,
    done: bool,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn start(&mut self, response: Option<&Value>, out: &mut Vec<StreamEvent>) {
        if self.started {
            return;
        }
        self.started = true;
        let field = |k: &str| {
            response
                .and_then(|r| r.get(k))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        out.push(StreamEvent::Start {
            id: field("id"),
            model: field("model"),
        });
    }

    /// Starts the tool call of a function-call item unless it was started already.
    fn tool(&mut self, output_index: u64, item: &Value, out: &mut Vec<StreamEvent>) -> u32 {
        if let Some(&(_, tool, _)) = self.tools.iter().find(|(o, _, _)| *o == output_index) {
            return tool;
        }
        let tool = self.tools.len() as u32;
        self.tools.push((output_index, tool, false));
        let field = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let id = match field("call_id") {
            id if id.is_empty() => ids::random("call_"),
            id => id,
        };
        out.push(StreamEvent::ToolCallStart {
            index: tool,
            id,
            name: field("name"),
        });
        tool
    }

    /// Arguments for the call at `output_index`; `whole` arguments (from a `done` event) are only
    /// sent when no deltas were.
    fn arguments(
        &mut self,
        output_index: u64,
        arguments: &str,
        whole: bool,
    ) -> Option<StreamEvent> {
        let entry = self.tools.iter_mut().find(|(o, _, _)| *o == output_index)?;
        if arguments.is_empty() || (whole && entry.2) {
            return None;
        }
        entry.2 = true;
        Some(StreamEvent::ToolCallDelta {
            index: entry.1,
            arguments: arguments.to_owned(),
        })
    }

    /// Decodes one SSE event; the type is read from the data (`type`), falling back to the name.
    pub fn decode(&mut self, event: &str, data: &str) -> Vec<StreamEvent> {
        if self.done || data.trim().is_empty() {
            return Vec::new();
        }
        if data.trim() == "[DONE]" {
            return self.finish();
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return self.fail(502, format!("invalid upstream stream event: {e}")),
        };
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(event);
        let output_index = v.get("output_index").and_then(Value::as_u64).unwrap_or(0);
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let mut out = Vec::new();
        match kind {
            "response.created" | "response.in_progress" | "response.queued" => {
                self.start(v.get("response"), &mut out);
            }
            "response.output_item.added" | "response.output_item.done" => {
                self.start(None, &mut out);
                let item = v.get("item").unwrap_or(&Value::Null);
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    self.tool(output_index, item, &mut out);
                    let arguments = item.get("arguments").and_then(Value::as_str).unwrap_or("");
                    // `added` items normally carry no arguments yet; a `done` item carries all.
                    let whole = kind == "response.output_item.done";
                    out.extend(self.arguments(output_index, arguments, whole));
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                self.start(None, &mut out);
                let d = text("delta");
                if !d.is_empty() {
                    out.push(StreamEvent::TextDelta(d));
                }
            }
            "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
                self.start(None, &mut out);
                let d = text("delta");
                if !d.is_empty() {
                    out.push(StreamEvent::ReasoningDelta(d));
                }
            }
            "response.function_call_arguments.delta" => {
                self.start(None, &mut out);
                self.tool(output_index, &Value::Null, &mut out);
                out.extend(self.arguments(output_index, &text("delta"), false));
            }
            "response.function_call_arguments.done" => {
                self.start(None, &mut out);
                self.tool(output_index, &Value::Null, &mut out);
                out.extend(self.arguments(output_index, &text("arguments"), true));
            }
            "response.completed" | "response.incomplete" => {
                self.start(v.get("response"), &mut out);
                let response = v.get("response").unwrap_or(&Value::Null);
                let reason = if kind == "response.incomplete"
                    || response.get("status").and_then(Value::as_str) == Some("incomplete")
                {
                    incomplete_reason(response.get("incomplete_details"))
                } else if self.tools.is_empty() {
                    FinishReason::Stop
                } else {
                    FinishReason::ToolCalls
                };
                out.push(StreamEvent::Finish {
                    reason,
                    stop_sequence: None,
                });
                if let Some(u) = response.get("usage").filter(|u| u.is_object()) {
                    out.push(StreamEvent::Usage(parse_usage(u)));
                }
                self.done = true;
                out.push(StreamEvent::Done);
            }
            "response.failed" => {
                let e = v
                    .get("response")
                    .and_then(|r| r.get("error"))
                    .filter(|e| !e.is_null())
                    .unwrap_or(&Value::Null);
                return self.fail(status_of_error(e), upstream_error_message(e));
            }
            "error" => {
                let e = v.get("error").unwrap_or(&v);
                return self.fail(status_of_error(e), upstream_error_message(e));
            }
            // Part boundaries, `.done` events repeating what the deltas said, and newer events.
            _ => {}
        }
        out
    }

    fn fail(&mut self, status: u16, message: String) -> Vec<StreamEvent> {
        self.done = true;
        vec![StreamEvent::Error { status, message }]
    }

    /// Call when the upstream stream ended; see `Decoder::finish`. A Responses stream is complete
    /// only with its terminal event, so anything else is an early end.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        if self.done {
            return Vec::new();
        }
        self.fail(
            502,
            "upstream stream ended before the answer was complete".into(),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Message,
    Reasoning,
    Call { tool: u32, id: String, name: String },
}

#[derive(Debug)]
struct Item {
    kind: Kind,
    id: String,
    /// The text, reasoning or arguments so far.
    text: String,
    open: bool,
}

/// The start of a delta event (text, reasoning or arguments), most of what a stream is: written
/// without a `Value` (see `sse::FrameWriter`); the caller adds the delta and closes the object.
fn delta_frame(
    name: &str,
    sequence_number: u64,
    item_id: &str,
    output_index: usize,
) -> sse::FrameWriter {
    sse::FrameWriter::event(name)
        .json(r#"{"type":"#)
        .value(name)
        .json(r#","sequence_number":"#)
        .value(&sequence_number)
        .json(r#","item_id":"#)
        .value(item_id)
        .json(r#","output_index":"#)
        .value(&output_index)
}

/// Frames IR events as a Responses stream for a client.
#[derive(Debug)]
pub struct StreamEncoder {
    public_model: String,
    id: String,
    created_at: u64,
    sequence: u64,
    started: bool,
    closed: bool,
    /// Output items by output index. Text and reasoning items close when another item opens;
    /// function calls stay open until the answer finishes, since their argument deltas may
    /// interleave.
    items: Vec<Item>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
}

impl StreamEncoder {
    pub fn new(public_model: &str) -> Self {
        Self {
            public_model: public_model.to_owned(),
            id: String::new(),
            created_at: crate::clock::unix_secs(),
            sequence: 0,
            started: false,
            closed: false,
            items: Vec::new(),
            finish: None,
            usage: None,
        }
    }

    /// The next event's `sequence_number`.
    fn next_sequence(&mut self) -> u64 {
        let number = self.sequence;
        self.sequence += 1;
        number
    }

    fn frame(&mut self, kind: &str, mut data: Value) -> Bytes {
        let sequence_number = self.next_sequence();
        if let Value::Object(o) = &mut data {
            o.insert("type".into(), kind.into());
            o.insert("sequence_number".into(), sequence_number.into());
        }
        sse::event_frame(kind, &data)
    }

    fn snapshot(&self, status: &str, details: Value, usage: Option<&Usage>) -> Value {
        let output = self
            .items
            .iter()
            .map(|i| item_value(i, if i.open { "in_progress" } else { "completed" }))
            .collect();
        response_object(
            &self.id,
            self.created_at,
            &self.public_model,
            status,
            output,
            details,
            usage,
        )
    }

    fn start(&mut self, id: &str, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = ids::with_prefix(id, "resp_");
        let response = self.snapshot("in_progress", Value::Null, None);
        out.push(self.frame("response.created", json!({"response": response})));
        out.push(self.frame("response.in_progress", json!({"response": response})));
    }

    /// The index of the open text or reasoning item of `kind`, opening one (and closing the
    /// current text/reasoning item) if needed.
    fn current(&mut self, kind: Kind, out: &mut Vec<Bytes>) -> usize {
        if let Some(i) = self.items.iter().rposition(|i| i.open && i.kind == kind) {
            return i;
        }
        self.close_where(|k| matches!(k, Kind::Message | Kind::Reasoning), out);
        let index = self.items.len();
        let (prefix, part) = match kind {
            Kind::Reasoning => ("rs_", json!({"type": "reasoning_text", "text": ""})),
            _ => (
                "msg_",
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
            ),
        };
        let item = Item {
            kind,
            id: item_id(prefix, &self.id, index),
            text: String::new(),
            open: true,
        };
        let mut added = item_value(&item, "in_progress");
        if let Some(content) = added.get_mut("content") {
            *content = json!([]);
        }
        let item_id = item.id.clone();
        self.items.push(item);
        out.push(self.frame(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ));
        out.push(self.frame(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
        ));
        index
    }

    fn close_where(&mut self, which: impl Fn(&Kind) -> bool, out: &mut Vec<Bytes>) {
        for index in 0..self.items.len() {
            if self.items[index].open && which(&self.items[index].kind) {
                self.close(index, out);
            }
        }
    }

    fn close(&mut self, index: usize, out: &mut Vec<Bytes>) {
        let Some(item) = self.items.get_mut(index) else {
            return;
        };
        item.open = false;
        let (id, text, kind) = (item.id.clone(), item.text.clone(), item.kind.clone());
        let done = item_value(item, "completed");
        let at = json!({"item_id": id, "output_index": index, "content_index": 0});
        let with = |mut base: Value, key: &str, value: Value| {
            if let Value::Object(o) = &mut base {
                o.insert(key.into(), value);
            }
            base
        };
        match kind {
            Kind::Message => {
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                let text_done = with(with(at.clone(), "text", text.into()), "logprobs", json!([]));
                out.push(self.frame("response.output_text.done", text_done));
                out.push(self.frame("response.content_part.done", with(at, "part", part)));
            }
            Kind::Reasoning => {
                let part = json!({"type": "reasoning_text", "text": text});
                out.push(self.frame(
                    "response.reasoning_text.done",
                    with(at.clone(), "text", text.into()),
                ));
                out.push(self.frame("response.content_part.done", with(at, "part", part)));
            }
            Kind::Call { name, .. } => {
                out.push(self.frame(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name, "arguments": text}),
                ));
            }
        }
        out.push(self.frame(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        ));
    }

    /// The client frames for one IR event; nothing after `Done` or `Error`.
    pub fn encode(&mut self, event: &StreamEvent) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        match event {
            StreamEvent::Start { id, .. } => self.start(id, &mut out),
            StreamEvent::TextDelta(t) | StreamEvent::ReasoningDelta(t) if t.is_empty() => {}
            StreamEvent::TextDelta(t) | StreamEvent::ReasoningDelta(t) => {
                self.start("", &mut out);
                let (kind, name) = match event {
                    StreamEvent::TextDelta(_) => (Kind::Message, "response.output_text.delta"),
                    _ => (Kind::Reasoning, "response.reasoning_text.delta"),
                };
                let index = self.current(kind.clone(), &mut out);
                if index >= self.items.len() {
                    return out;
                }
                let sequence_number = self.next_sequence();
                let item = &mut self.items[index];
                item.text.push_str(t);
                let frame = delta_frame(name, sequence_number, &item.id, index)
                    .json(r#","content_index":0,"delta":"#)
                    .value(t.as_str());
                let frame = match kind {
                    Kind::Message => frame.json(r#","logprobs":[]}"#),
                    _ => frame.json("}"),
                };
                out.push(frame.finish());
            }
            StreamEvent::ReasoningSignature(_) => {}
            StreamEvent::ToolCallStart { index, id, name } => {
                self.start("", &mut out);
                self.close_where(|k| matches!(k, Kind::Message | Kind::Reasoning), &mut out);
                let output_index = self.items.len();
                let item = Item {
                    kind: Kind::Call {
                        tool: *index,
                        id: id.clone(),
                        name: name.clone(),
                    },
                    id: item_id("fc_", &self.id, output_index),
                    text: String::new(),
                    open: true,
                };
                let added = item_value(&item, "in_progress");
                self.items.push(item);
                out.push(self.frame(
                    "response.output_item.added",
                    json!({"output_index": output_index, "item": added}),
                ));
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                let found = self.items.iter().position(|i| {
                    i.open && matches!(&i.kind, Kind::Call { tool, .. } if tool == index)
                });
                if let Some(output_index) = found
                    && !arguments.is_empty()
                {
                    let sequence_number = self.next_sequence();
                    let item = &mut self.items[output_index];
                    item.text.push_str(arguments);
                    let name = "response.function_call_arguments.delta";
                    let frame = delta_frame(name, sequence_number, &item.id, output_index)
                        .json(r#","delta":"#)
                        .value(arguments.as_str())
                        .json("}");
                    out.push(frame.finish());
                }
            }
            StreamEvent::Finish { reason, .. } => {
                self.start("", &mut out);
                self.close_where(|_| true, &mut out);
                self.finish = Some(reason.clone());
            }
            StreamEvent::Usage(u) => self.usage = Some(*u),
            StreamEvent::Done => {
                self.start("", &mut out);
                self.close_where(|_| true, &mut out);
                self.closed = true;
                let had_calls = self
                    .items
                    .iter()
                    .any(|i| matches!(i.kind, Kind::Call { .. }));
                let reason = effective_finish(
                    self.finish.as_ref().unwrap_or(&FinishReason::Stop),
                    had_calls,
                );
                let (status, details) = status_of(&reason);
                let response = self.snapshot(status, details, self.usage.as_ref());
                let name = if status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                out.push(self.frame(name, json!({"response": response})));
            }
            StreamEvent::Error { status, message } => {
                self.start("", &mut out);
                self.closed = true;
                let code = if *status == 429 {
                    "rate_limit_exceeded"
                } else {
                    "server_error"
                };
                out.push(self.frame(
                    "error",
                    json!({"code": code, "message": message, "param": null}),
                ));
                let mut response = self.snapshot("failed", Value::Null, self.usage.as_ref());
                if let Value::Object(o) = &mut response {
                    o.insert("error".into(), json!({"code": code, "message": message}));
                }
                out.push(self.frame("response.failed", json!({"response": response})));
            }
        }
        out
    }
}

fn item_value(item: &Item, status: &str) -> Value {
    match &item.kind {
        Kind::Message => message_item(&item.id, &item.text, status),
        Kind::Reasoning => reasoning_item(&item.id, &item.text),
        Kind::Call { id, name, .. } => function_call_item(
            &item.id,
            &ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: item.text.clone(),
            },
            status,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed delta frames say what the `Value`s they replaced said, escapes included, and
    /// keep the sequence numbers running.
    #[test]
    fn typed_deltas_match_their_value_form() {
        let text = "a \"quoted\" \\ line\nwith \u{1} control, \u{e9} and \u{1F600}";
        let mut encoder = StreamEncoder::new("public/model");
        let mut frames = Vec::new();
        for event in [
            StreamEvent::Start {
                id: "abc".into(),
                model: "m".into(),
            },
            StreamEvent::TextDelta(text.into()),
            StreamEvent::ReasoningDelta(text.into()),
            StreamEvent::ToolCallStart {
                index: 0,
                id: "call_1".into(),
                name: "f".into(),
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: text.into(),
            },
        ] {
            frames.extend(encoder.encode(&event));
        }
        let events: Vec<(String, Value)> = frames
            .iter()
            .flat_map(|f| sse::parse(std::str::from_utf8(f).unwrap()))
            .map(|e| (e.event.to_string(), serde_json::from_str(&e.data).unwrap()))
            .collect();
        for (at, (_, data)) in events.iter().enumerate() {
            assert_eq!(data["sequence_number"], json!(at), "{data}");
        }
        let of = |name: &str| {
            events
                .iter()
                .find(|(event, _)| event == name)
                .map(|(_, data)| data.clone())
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let text_delta = of("response.output_text.delta");
        let item = text_delta["item_id"].as_str().unwrap().to_owned();
        assert_eq!(
            text_delta,
            json!({"type": "response.output_text.delta", "sequence_number": text_delta["sequence_number"],
                   "item_id": item, "output_index": 0, "content_index": 0, "delta": text, "logprobs": []})
        );
        let reasoning = of("response.reasoning_text.delta");
        let item = reasoning["item_id"].as_str().unwrap().to_owned();
        assert_eq!(
            reasoning,
            json!({"type": "response.reasoning_text.delta", "sequence_number": reasoning["sequence_number"],
                   "item_id": item, "output_index": 1, "content_index": 0, "delta": text})
        );
        let arguments = of("response.function_call_arguments.delta");
        let item = arguments["item_id"].as_str().unwrap().to_owned();
        assert!(item.starts_with("fc_"), "{item}");
        assert_eq!(
            arguments,
            json!({"type": "response.function_call_arguments.delta",
                   "sequence_number": arguments["sequence_number"], "item_id": item,
                   "output_index": 2, "delta": text})
        );
    }
}
