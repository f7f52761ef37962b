//! Anthropic Messages streams: `message_start`, content blocks, `message_delta`, `message_stop`.

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem::Finder;
use serde::Deserialize;
use serde_json::Value;

use super::error_body;
use super::response::{parse_stop_reason, stop_reason, usage_value};
use crate::protocol::delta_template::{DeltaTemplate, Templated};
use crate::protocol::ir::{FinishReason, StreamEvent, Usage, effective_finish};
use crate::protocol::{ids, json, scan, sse, status_of_error, upstream_error_message};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
    Tool { index: u32, had_arguments: bool },
    Other,
}

/// Turns an upstream's Messages stream into IR events.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// Content blocks by their upstream index.
    blocks: Vec<(u64, Block)>,
    tools: u32,
    /// The running usage in Anthropic's terms (input excludes cache reads and writes).
    input: u32,
    output: u32,
    cache_read: u32,
    cache_creation: u32,
    finished: bool,
    done: bool,
    /// The frame of this stream's text deltas, once one was decoded.
    template: DeltaTemplate,
}

/// The key that opens a text delta's text, as compact JSON writes it.
const TEXT_KEY: &str = r#""text":""#;

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn usage(&self) -> Usage {
        Usage {
            input_tokens: self
                .input
                .saturating_add(self.cache_read)
                .saturating_add(self.cache_creation),
            output_tokens: self.output,
            cached_input_tokens: self.cache_read,
            cache_creation_input_tokens: self.cache_creation,
            reasoning_tokens: 0,
        }
    }

    /// Later usage reports repeat earlier counts; only the fields present are updated.
    fn merge_usage(&mut self, u: &UsageView) {
        let count = |n: Option<u64>| n.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        if let Some(n) = count(u.input_tokens) {
            self.input = n;
        }
        if let Some(n) = count(u.output_tokens) {
            self.output = n;
        }
        if let Some(n) = count(u.cache_read_input_tokens) {
            self.cache_read = n;
        }
        if let Some(n) = count(u.cache_creation_input_tokens) {
            self.cache_creation = n;
        }
    }

    fn block(&mut self, index: u64) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, b)| b)
    }

    /// Decodes one SSE event; the type is read from the data (`type`), falling back to the name.
    pub fn decode(&mut self, event: &str, data: &str) -> Vec<StreamEvent> {
        if self.done || data.trim().is_empty() {
            return Vec::new();
        }
        // Most of a stream: a text delta in the frame of one decoded before.
        if let Some(text) = self.template.text(data) {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![StreamEvent::TextDelta(text.into_owned())]
            };
        }
        // Deltas are read straight from the text by the scan's reader, borrowing their strings;
        // every other event, and a delta the typed view cannot take (a wrong type somewhere, a
        // repeated key) or the reader gives up on, goes through a `Value`, with the same result
        // for every field read.
        if data.contains("content_block_delta")
            && let Some(view) = scan::scan_str::<BlockDeltaView<'_>>(data)
            && view.kind == "content_block_delta"
        {
            let mut out = Vec::new();
            self.block_delta(view.index.unwrap_or(0), &view.delta, &mut out);
            // A text delta's event reads the same whatever the decoder's state, so its frame
            // reads the stream's next ones (see `DeltaTemplate`).
            if let [StreamEvent::TextDelta(text)] = out.as_slice()
                && view.delta.kind.as_deref() == Some("text_delta")
            {
                self.template
                    .learn(data, TEXT_KEY, text, || is_plain_delta(event, data));
            }
            return out;
        }
        // The lifecycle events (a few a stream) read the same way into a typed view; an error
        // event, or anything the view cannot take, through a `Value` into the same view.
        if let Some(view) = scan::scan_str::<EventView<'_>>(data) {
            let kind = view.kind.as_deref().unwrap_or(event);
            if LIFECYCLE.contains(&kind) {
                return self.lifecycle(kind, &view);
            }
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return self.fail(502, format!("invalid upstream stream event: {e}")),
        };
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(event);
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let mut out = Vec::new();
        match kind {
            kind if LIFECYCLE.contains(&kind) => {
                return self.lifecycle(kind, &EventView::lenient(&v));
            }
            "content_block_delta" => {
                let d = v.get("delta").unwrap_or(&Value::Null);
                self.block_delta(index, &DeltaView::lenient(d), &mut out);
            }
            "error" => {
                let e = v.get("error").unwrap_or(&v);
                return self.fail(status_of_error(e), upstream_error_message(e));
            }
            // `ping` and event types newer than this code carry nothing to translate.
            _ => {}
        }
        out
    }

    /// The text of `data` when it is a text delta in the frame of one this decoder decoded,
    /// read without decoding: what [`StreamDecoder::decode`] would make of it is that text
    /// alone (nothing when it is empty). Such an event is a plain delta (see [`is_plain_delta`]).
    pub fn templated_text<'a>(&self, event: &str, data: &'a str) -> Option<Cow<'a, str>> {
        self.template_for(event)?.text(data)
    }

    /// The template that reads `data`, if one does.
    pub(crate) fn templated(&self, event: &str, data: &str) -> Option<Templated<'_>> {
        self.template_for(event)?.reading(data)
    }

    /// The template, for a text delta's event while the stream may still send them.
    fn template_for(&self, event: &str) -> Option<&DeltaTemplate> {
        (!self.done && event == "content_block_delta").then_some(&self.template)
    }

    /// A lifecycle event of type `kind` (one of [`LIFECYCLE`]).
    fn lifecycle(&mut self, kind: &str, v: &EventView<'_>) -> Vec<StreamEvent> {
        let index = v.index.unwrap_or(0);
        let text = |t: &Option<Cow<'_, str>>| t.as_deref().unwrap_or("").to_owned();
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                if let Some(message) = &v.message {
                    if let Some(u) = &message.usage {
                        self.merge_usage(u);
                    }
                    out.push(StreamEvent::Start {
                        id: text(&message.id),
                        model: text(&message.model),
                    });
                } else {
                    out.push(StreamEvent::Start {
                        id: String::new(),
                        model: String::new(),
                    });
                }
            }
            "content_block_start" => {
                let b = v.content_block.as_ref();
                let block = match b.and_then(|b| b.kind.as_deref()) {
                    Some("text") => {
                        let t = b.map(|b| text(&b.text)).unwrap_or_default();
                        if !t.is_empty() {
                            out.push(StreamEvent::TextDelta(t));
                        }
                        Block::Text
                    }
                    Some("thinking") => {
                        let t = b.map(|b| text(&b.thinking)).unwrap_or_default();
                        if !t.is_empty() {
                            out.push(StreamEvent::ReasoningDelta(t));
                        }
                        Block::Thinking
                    }
                    Some("tool_use") => {
                        let tool = self.tools;
                        self.tools += 1;
                        out.push(StreamEvent::ToolCallStart {
                            index: tool,
                            id: b.map(|b| text(&b.id)).unwrap_or_default(),
                            name: b.map(|b| text(&b.name)).unwrap_or_default(),
                        });
                        Block::Tool {
                            index: tool,
                            had_arguments: false,
                        }
                    }
                    _ => Block::Other,
                };
                self.blocks.push((index, block));
            }
            "content_block_stop" => {
                // A call without arguments streams no JSON at all; OpenAI clients expect `{}`.
                if let Some(Block::Tool {
                    index,
                    had_arguments: false,
                }) = self.block(index).copied()
                {
                    out.push(StreamEvent::ToolCallDelta {
                        index,
                        arguments: "{}".into(),
                    });
                }
            }
            "message_delta" => {
                if let Some(u) = &v.usage {
                    self.merge_usage(u);
                }
                if let Some(d) = &v.delta
                    && let Some(reason) = d.stop_reason.as_deref()
                {
                    self.finished = true;
                    out.push(StreamEvent::Finish {
                        reason: parse_stop_reason(reason),
                        stop_sequence: d.stop_sequence.as_deref().map(str::to_owned),
                    });
                }
            }
            "message_stop" => {
                self.done = true;
                out.push(StreamEvent::Usage(self.usage()));
                out.push(StreamEvent::Done);
            }
            // `ping`.
            _ => {}
        }
        out
    }

    /// A `content_block_delta`'s delta at upstream block `index`.
    fn block_delta(&mut self, index: u64, d: &DeltaView<'_>, out: &mut Vec<StreamEvent>) {
        let text = |t: &Option<Cow<'_, str>>| t.as_deref().unwrap_or("").to_owned();
        match d.kind.as_deref() {
            Some("text_delta") => {
                let t = text(&d.text);
                if !t.is_empty() {
                    out.push(StreamEvent::TextDelta(t));
                }
            }
            Some("thinking_delta") => {
                let t = text(&d.thinking);
                if !t.is_empty() {
                    out.push(StreamEvent::ReasoningDelta(t));
                }
            }
            Some("signature_delta") => {
                out.push(StreamEvent::ReasoningSignature(text(&d.signature)));
            }
            Some("input_json_delta") => {
                let partial = text(&d.partial_json);
                if let Some(Block::Tool {
                    index,
                    had_arguments,
                }) = self.block(index)
                    && !partial.is_empty()
                {
                    *had_arguments = true;
                    out.push(StreamEvent::ToolCallDelta {
                        index: *index,
                        arguments: partial,
                    });
                }
            }
            _ => {}
        }
    }

    fn fail(&mut self, status: u16, message: String) -> Vec<StreamEvent> {
        self.done = true;
        vec![StreamEvent::Error { status, message }]
    }

    /// Call when the upstream stream ended; see `Decoder::finish`.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        if self.done {
            return Vec::new();
        }
        if self.finished {
            self.done = true;
            return vec![StreamEvent::Usage(self.usage()), StreamEvent::Done];
        }
        self.fail(
            502,
            "upstream stream ended before the answer was complete".into(),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
    Tool(u32),
}

/// The events of a stream's life around its deltas, read by [`StreamDecoder::lifecycle`].
const LIFECYCLE: &[&str] = &[
    "message_start",
    "content_block_start",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
];

/// A lifecycle event as the typed path reads it: the fields the decoder reads, strings borrowed,
/// every other field skipped. The reader gives up on a field of an unexpected type, a repeated
/// key or an array where an object belongs; the event is then read through a `Value` into the
/// same view ([`EventView::lenient`]), where such a field counts as absent.
#[derive(Deserialize, Default)]
struct EventView<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    message: Option<MessageView<'a>>,
    #[serde(borrow, default)]
    content_block: Option<ContentBlockView<'a>>,
    #[serde(borrow, default)]
    delta: Option<StopView<'a>>,
    #[serde(default)]
    usage: Option<UsageView>,
}

#[derive(Deserialize, Default)]
struct MessageView<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<UsageView>,
}

#[derive(Deserialize, Default)]
struct ContentBlockView<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

/// A `message_delta`'s delta.
#[derive(Deserialize, Default)]
struct StopView<'a> {
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    stop_sequence: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default, Debug, PartialEq)]
struct UsageView {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

impl<'a> EventView<'a> {
    /// What the typed view would read from `v`, a field of a wrong type read as absent.
    fn lenient(v: &'a Value) -> Self {
        let text = json::str_or_absent;
        EventView {
            kind: text(v, "type"),
            index: v.get("index").and_then(Value::as_u64),
            message: v.get("message").map(|m| MessageView {
                id: text(m, "id"),
                model: text(m, "model"),
                usage: m.get("usage").map(UsageView::lenient),
            }),
            content_block: v.get("content_block").map(|b| ContentBlockView {
                kind: text(b, "type"),
                text: text(b, "text"),
                thinking: text(b, "thinking"),
                id: text(b, "id"),
                name: text(b, "name"),
            }),
            delta: v.get("delta").map(|d| StopView {
                stop_reason: text(d, "stop_reason"),
                stop_sequence: text(d, "stop_sequence"),
            }),
            usage: v.get("usage").map(UsageView::lenient),
        }
    }
}

impl UsageView {
    fn lenient(u: &Value) -> Self {
        let count = |k: &str| u.get(k).and_then(Value::as_u64);
        UsageView {
            input_tokens: count("input_tokens"),
            output_tokens: count("output_tokens"),
            cache_read_input_tokens: count("cache_read_input_tokens"),
            cache_creation_input_tokens: count("cache_creation_input_tokens"),
        }
    }
}

/// A `content_block_delta` event as the typed fast path reads it.
#[derive(Deserialize)]
struct BlockDeltaView<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow)]
    delta: DeltaView<'a>,
}

/// The fields of a delta the decoder reads; absent or `null` ones are `None`, as `Value` reads
/// them.
#[derive(Deserialize, Default, Debug, PartialEq)]
struct DeltaView<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    signature: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    partial_json: Option<Cow<'a, str>>,
}

impl<'a> DeltaView<'a> {
    /// What the typed view would read from `d`, a wrong type read as absent.
    fn lenient(d: &'a Value) -> Self {
        let str_at = |k: &str| json::str_or_absent(d, k);
        DeltaView {
            kind: str_at("type"),
            text: str_at("text"),
            thinking: str_at("thinking"),
            signature: str_at("signature"),
            partial_json: str_at("partial_json"),
        }
    }
}

/// The frames that never change.
const PING: &[u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";
const MESSAGE_STOP: &[u8] = b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// What a `content_block_start` opens.
#[derive(Debug, Clone, Copy)]
enum BlockStart<'a> {
    Text,
    Thinking,
    ToolUse { id: &'a str, name: &'a str },
}

/// The delta of a `content_block_delta`, most of what a stream is.
#[derive(Debug, Clone, Copy)]
enum Delta<'a> {
    Text(&'a str),
    Thinking(&'a str),
    Signature(&'a str),
    InputJson(&'a str),
}

/// Frames IR events as an Anthropic Messages stream for a client.
#[derive(Debug)]
pub struct StreamEncoder {
    public_model: String,
    input_tokens_hint: u32,
    started: bool,
    closed: bool,
    next_block: u32,
    open: Option<(u32, Open)>,
    /// Content block index of each IR tool call.
    tool_blocks: Vec<(u32, u32)>,
    finish: Option<(FinishReason, Option<String>)>,
    usage: Option<Usage>,
}

impl StreamEncoder {
    pub fn new(public_model: &str) -> Self {
        Self {
            public_model: public_model.to_owned(),
            input_tokens_hint: 0,
            started: false,
            closed: false,
            next_block: 0,
            open: None,
            tool_blocks: Vec::new(),
            finish: None,
            usage: None,
        }
    }

    /// The input token count to announce in `message_start`, before the upstream's real count
    /// arrives with `message_delta` (e.g. the gateway's prompt estimate). 0 by default.
    pub fn input_tokens_hint(mut self, tokens: u32) -> Self {
        self.input_tokens_hint = tokens;
        self
    }

    fn start(&mut self, id: &str, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        out.push(Self::message_start(
            &ids::with_prefix(id, "msg_"),
            &self.public_model,
            self.input_tokens_hint,
        ));
        out.push(Bytes::from_static(PING));
    }

    /// The `message_start` frame. The SDKs build their message snapshot from this object, so it
    /// is complete; written in the order Anthropic writes it, the constant parts as text.
    fn message_start(id: &str, model: &str, input_tokens: u32) -> Bytes {
        sse::FrameWriter::event("message_start")
            .json(r#"{"type":"message_start","message":{"id":"#)
            .value(id)
            .json(r#","type":"message","role":"assistant","model":"#)
            .value(model)
            .json(r#","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":"#)
            .value(&input_tokens)
            .json(r#","output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}"#)
            .finish()
    }

    fn close_block(&mut self, out: &mut Vec<Bytes>) {
        if let Some((index, _)) = self.open.take() {
            out.push(
                sse::FrameWriter::event("content_block_stop")
                    .json(r#"{"type":"content_block_stop","index":"#)
                    .value(&index)
                    .json("}")
                    .finish(),
            );
        }
    }

    fn open_block(&mut self, kind: Open, block: BlockStart<'_>, out: &mut Vec<Bytes>) -> u32 {
        self.close_block(out);
        let index = self.next_block;
        self.next_block += 1;
        self.open = Some((index, kind));
        let frame = sse::FrameWriter::event("content_block_start")
            .json(r#"{"type":"content_block_start","index":"#)
            .value(&index)
            .json(r#","content_block":"#);
        let frame = match block {
            BlockStart::Text => frame.json(r#"{"type":"text","text":""}"#),
            BlockStart::Thinking => {
                frame.json(r#"{"type":"thinking","thinking":"","signature":""}"#)
            }
            BlockStart::ToolUse { id, name } => frame
                .json(r#"{"type":"tool_use","id":"#)
                .value(id)
                .json(r#","name":"#)
                .value(name)
                .json(r#","input":{}}"#),
        };
        out.push(frame.json("}").finish());
        index
    }

    /// The block of `kind`, opened (as `block()`) if it is not the current one.
    fn ensure_block(&mut self, kind: Open, block: BlockStart<'_>, out: &mut Vec<Bytes>) -> u32 {
        match self.open {
            Some((index, open)) if open == kind => index,
            _ => self.open_block(kind, block, out),
        }
    }

    fn delta(index: u32, delta: Delta<'_>) -> Bytes {
        let mut out = Vec::with_capacity(128);
        Self::delta_into(index, delta, &mut out);
        Bytes::from(out)
    }

    /// The `content_block_delta` frame, appended to `out`.
    fn delta_into(index: u32, delta: Delta<'_>, out: &mut Vec<u8>) {
        let (head, text) = match delta {
            Delta::Text(t) => (r#"{"type":"text_delta","text":"#, t),
            Delta::Thinking(t) => (r#"{"type":"thinking_delta","thinking":"#, t),
            Delta::Signature(t) => (r#"{"type":"signature_delta","signature":"#, t),
            Delta::InputJson(t) => (r#"{"type":"input_json_delta","partial_json":"#, t),
        };
        out.extend_from_slice(b"event: content_block_delta\ndata: ");
        out.extend_from_slice(br#"{"type":"content_block_delta","index":"#);
        json::push(out, &index);
        out.extend_from_slice(br#","delta":"#);
        out.extend_from_slice(head.as_bytes());
        json::push(out, text);
        out.extend_from_slice(b"}}\n\n");
    }

    /// What [`StreamEncoder::encode`] writes for a text delta, appended to `out` (a relay's
    /// frames of a stream's text, without an event or a frame of their own).
    pub fn text_delta_into(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.closed || text.is_empty() {
            return;
        }
        let mut opened = Vec::new();
        self.start("", &mut opened);
        let index = self.ensure_block(Open::Text, BlockStart::Text, &mut opened);
        sse::append(out, opened);
        Self::delta_into(index, Delta::Text(text), out);
    }

    /// The client frames for one IR event; nothing after `Done` or `Error`.
    pub fn encode(&mut self, event: &StreamEvent) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        match event {
            StreamEvent::Start { id, .. } => self.start(id, &mut out),
            StreamEvent::TextDelta(t) if t.is_empty() => {}
            StreamEvent::TextDelta(t) => {
                self.start("", &mut out);
                let i = self.ensure_block(Open::Text, BlockStart::Text, &mut out);
                out.push(Self::delta(i, Delta::Text(t)));
            }
            StreamEvent::ReasoningDelta(t) if t.is_empty() => {}
            StreamEvent::ReasoningDelta(t) => {
                self.start("", &mut out);
                let i = self.ensure_block(Open::Thinking, BlockStart::Thinking, &mut out);
                out.push(Self::delta(i, Delta::Thinking(t)));
            }
            StreamEvent::ReasoningSignature(s) => {
                if let Some((i, Open::Thinking)) = self.open {
                    out.push(Self::delta(i, Delta::Signature(s)));
                }
            }
            StreamEvent::ToolCallStart { index, id, name } => {
                self.start("", &mut out);
                let block = self.open_block(
                    Open::Tool(*index),
                    BlockStart::ToolUse {
                        id: &ids::tool_use_id(id),
                        name,
                    },
                    &mut out,
                );
                self.tool_blocks.push((*index, block));
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                // Arguments of a call whose block was already closed (interleaved calls) still
                // go to that block's index, where the SDKs accumulate them.
                if let Some(&(_, block)) = self.tool_blocks.iter().find(|(t, _)| t == index)
                    && !arguments.is_empty()
                {
                    out.push(Self::delta(block, Delta::InputJson(arguments)));
                }
            }
            StreamEvent::Finish {
                reason,
                stop_sequence,
            } => {
                self.close_block(&mut out);
                self.finish = Some((reason.clone(), stop_sequence.clone()));
            }
            StreamEvent::Usage(u) => self.usage = Some(*u),
            StreamEvent::Done => {
                self.start("", &mut out);
                self.close_block(&mut out);
                self.closed = true;
                let (reason, stop_sequence) =
                    self.finish.take().unwrap_or((FinishReason::Stop, None));
                let reason = effective_finish(&reason, !self.tool_blocks.is_empty());
                let frame = sse::FrameWriter::event("message_delta")
                    .json(r#"{"type":"message_delta","delta":{"stop_reason":"#)
                    .value(stop_reason(&reason, stop_sequence.as_deref()))
                    .json(r#","stop_sequence":"#)
                    .value(&stop_sequence)
                    .json(r#"},"usage":"#);
                let frame = match &self.usage {
                    Some(u) => frame.value(&usage_value(u)),
                    None => frame.json(r#"{"output_tokens":0}"#),
                };
                out.push(frame.json("}").finish());
                out.push(Bytes::from_static(MESSAGE_STOP));
            }
            StreamEvent::Error { status, message } => {
                self.closed = true;
                out.push(sse::event_frame("error", &error_body(*status, message)));
            }
        }
        out
    }
}

/// A `content_block_delta` event: text, thinking or tool-argument deltas, never usage, a stop
/// reason or an error (those ride on `message_delta`, `message_stop` and `error`). Its deltas
/// matter to a pass-through relay's accounting only until the first token.
pub fn is_plain_delta(event: &str, data: &str) -> bool {
    // Built once, like the Chat check's searchers (`memmem::find` would build one per call).
    static DELTA: LazyLock<Finder<'static>> =
        LazyLock::new(|| Finder::new(r#""type":"content_block_delta""#));
    static ERROR: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("error"));
    event == "content_block_delta"
        && DELTA.find(data.as_bytes()).is_some()
        && ERROR.find(data.as_bytes()).is_none()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The frames written as text say what the `Value`s they replaced said.
    #[test]
    fn written_frames_match_their_value_form() {
        let mut encoder = StreamEncoder::new("pub \"model\"").input_tokens_hint(12);
        let events = [
            StreamEvent::Start {
                id: "msg_1".into(),
                model: "up".into(),
            },
            StreamEvent::ReasoningDelta("hm".into()),
            StreamEvent::TextDelta("Hi".into()),
            StreamEvent::ToolCallStart {
                index: 0,
                id: "toolu_1".into(),
                name: "get \"x\"".into(),
            },
            StreamEvent::Finish {
                reason: FinishReason::Stop,
                stop_sequence: Some("END".into()),
            },
            StreamEvent::Usage(Usage {
                input_tokens: 30,
                output_tokens: 5,
                cached_input_tokens: 10,
                cache_creation_input_tokens: 2,
                reasoning_tokens: 0,
            }),
            StreamEvent::Done,
        ];
        let mut written = Vec::new();
        for event in &events {
            for frame in encoder.encode(event) {
                for e in sse::parse(std::str::from_utf8(&frame).unwrap()) {
                    let data: Value = serde_json::from_str(&e.data).unwrap();
                    written.push((e.event, data));
                }
            }
        }
        let block_start = |index: u32, block: Value| json!({"type": "content_block_start", "index": index, "content_block": block});
        let block_stop = |index: u32| json!({"type": "content_block_stop", "index": index});
        let expected = [
            (
                "message_start",
                json!({
                    "type": "message_start",
                    "message": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "model": "pub \"model\"",
                        "content": [],
                        "stop_reason": null,
                        "stop_sequence": null,
                        "usage": {
                            "input_tokens": 12,
                            "output_tokens": 0,
                            "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 0,
                        },
                    },
                }),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_start",
                block_start(
                    0,
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                ),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "thinking_delta", "thinking": "hm"}}),
            ),
            ("content_block_stop", block_stop(0)),
            (
                "content_block_start",
                block_start(1, json!({"type": "text", "text": ""})),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                       "delta": {"type": "text_delta", "text": "Hi"}}),
            ),
            ("content_block_stop", block_stop(1)),
            (
                "content_block_start",
                block_start(
                    2,
                    json!({"type": "tool_use", "id": "toolu_1", "name": "get \"x\"", "input": {}}),
                ),
            ),
            ("content_block_stop", block_stop(2)),
            (
                "message_delta",
                json!({
                    "type": "message_delta",
                    // A stream that called a tool stopped for it, whatever the upstream said.
                    "delta": {"stop_reason": "tool_use", "stop_sequence": "END"},
                    "usage": {"input_tokens": 18, "output_tokens": 5,
                              "cache_creation_input_tokens": 2, "cache_read_input_tokens": 10},
                }),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        let expected: Vec<(String, Value)> = expected
            .into_iter()
            .map(|(e, v)| (e.to_owned(), v))
            .collect();
        let written: Vec<(String, Value)> = written
            .into_iter()
            .map(|(e, v)| (e.to_string(), v))
            .collect();
        assert_eq!(written, expected);

        // Without usage from the upstream, and without a finish reason.
        let mut encoder = StreamEncoder::new("m");
        let mut last = Vec::new();
        for event in [StreamEvent::TextDelta("x".into()), StreamEvent::Done] {
            last = encoder.encode(&event);
        }
        let delta = sse::parse(std::str::from_utf8(&last[1]).unwrap());
        assert_eq!(
            serde_json::from_str::<Value>(&delta[0].data).unwrap(),
            json!({"type": "message_delta",
                   "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                   "usage": {"output_tokens": 0}})
        );
    }

    /// The typed lifecycle view reads every event it accepts as the lenient one does, and what
    /// it refuses still decodes the lenient way.
    #[test]
    fn typed_and_lenient_lifecycle_views_read_alike() {
        let events = [
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":5,"output_tokens":1,"cache_read_input_tokens":2}}}"#,
            r#"{"type":"message_start","message":null}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":"pre"}}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"thinking","thinking":"t","signature":""}}"#,
            r#"{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}"#,
            r#"{"type":"content_block_stop","index":3}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"message_stop"}"#,
        ];
        let (mut typed, mut lenient) = (StreamDecoder::new(), StreamDecoder::new());
        let mut decoded = Vec::new();
        for data in events {
            let view = scan::scan_str::<EventView<'_>>(data).expect(data);
            let value: Value = serde_json::from_str(data).unwrap();
            let kind = view.kind.as_deref().unwrap();
            let events = typed.lifecycle(kind, &view);
            assert_eq!(
                events,
                lenient.lifecycle(kind, &EventView::lenient(&value)),
                "{data}"
            );
            decoded.extend(events);
        }
        assert_eq!(decoded.len(), 9, "{decoded:?}");
        assert_eq!(
            decoded.last(),
            Some(&StreamEvent::Done),
            "usage then done at message_stop"
        );
        // Refused by the view: a count of another type (absent to the lenient view), an array
        // where an object belongs (no message), a repeated key (the last one wins).
        let refused = [
            r#"{"type":"message_start","message":["msg_x","m"]}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_reason":"max_tokens"},"usage":{"output_tokens":1.5}}"#,
        ];
        for data in refused {
            assert!(scan::scan_str::<EventView<'_>>(data).is_none(), "{data}");
        }
        let mut decoder = StreamDecoder::new();
        assert_eq!(
            decoder.decode("", refused[0]),
            vec![StreamEvent::Start {
                id: String::new(),
                model: String::new()
            }]
        );
        assert_eq!(
            decoder.decode("", refused[1]),
            vec![StreamEvent::Finish {
                reason: FinishReason::Length,
                stop_sequence: None
            }]
        );
        assert_eq!(
            decoder.output, 0,
            "a count that is not an integer is not read"
        );
    }

    /// A stream's text deltas after the first are read by their frame, to the same events as
    /// the full decoding, whatever their text; and a pass-through relay may skip them.
    #[test]
    fn text_deltas_in_a_learned_frame_decode_as_in_full() {
        let delta = |text: &str| {
            format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{}}}}}"#,
                serde_json::to_string(text).unwrap()
            )
        };
        let mut templated = StreamDecoder::new();
        for text in ["Hello", " world", "", "a \"q\" \\ \n \u{e9}", "z"] {
            let mut full = StreamDecoder::new();
            let data = delta(text);
            let expected = full.decode("content_block_delta", &data);
            assert_eq!(
                templated.decode("content_block_delta", &data),
                expected,
                "{text:?}"
            );
        }
        assert_eq!(
            templated
                .templated_text("content_block_delta", &delta("again"))
                .as_deref(),
            Some("again")
        );
        assert!(
            templated
                .templated_text("message_delta", &delta("again"))
                .is_none()
        );
        assert!(
            templated
                .templated_text(
                    "content_block_delta",
                    &delta("x").replace("\"index\":0", "\"index\":1")
                )
                .is_none()
        );
    }

    /// The typed view reads every delta it accepts as the lenient one does, and what it refuses
    /// still decodes the lenient way.
    #[test]
    fn typed_and_lenient_delta_views_read_alike() {
        for data in [
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi \"there\" \u00e9"}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"thinking_delta","thinking":"hm"},"extra":[1,{"a":null}]}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}"#,
            r#"{"type":"content_block_delta","index":null,"delta":{"type":"text_delta","text":null}}"#,
            r#"{"type":"content_block_delta","delta":{"type":"future_delta","text":"x"}}"#,
        ] {
            let typed: BlockDeltaView<'_> = serde_json::from_str(data).unwrap();
            let value: Value = serde_json::from_str(data).unwrap();
            assert_eq!(typed.delta, DeltaView::lenient(&value["delta"]), "{data}");
            assert_eq!(
                typed.index.unwrap_or(0),
                value["index"].as_u64().unwrap_or(0),
                "{data}"
            );
        }
        let mut decoder = StreamDecoder::new();
        let refused_by_the_view = [
            // A string index (read as 0), a repeated key (the last one wins), no `type` (the
            // event's name is used).
            r#"{"type":"content_block_delta","index":"7","delta":{"type":"text_delta","text":"a"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"b","text":"c"}}"#,
            r#"{"index":0,"delta":{"type":"text_delta","text":"d"}}"#,
        ];
        let mut texts = Vec::new();
        for data in refused_by_the_view {
            assert!(
                serde_json::from_str::<BlockDeltaView<'_>>(data).is_err(),
                "{data}"
            );
            assert!(
                scan::scan::<BlockDeltaView<'_>>(data.as_bytes()).is_none(),
                "{data}"
            );
            for event in decoder.decode("content_block_delta", data) {
                match event {
                    StreamEvent::TextDelta(t) => texts.push(t),
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(texts, ["a", "c", "d"]);
    }

    /// The typed delta frames say what the `Value`s they replaced said, escapes included.
    #[test]
    fn typed_deltas_match_their_value_form() {
        let text = "a \"quoted\" \\ line\nwith \u{1} control, \u{e9} and \u{1F600}";
        let cases = [
            (
                Delta::Text(text),
                json!({"type": "text_delta", "text": text}),
            ),
            (
                Delta::Thinking(text),
                json!({"type": "thinking_delta", "thinking": text}),
            ),
            (
                Delta::Signature(text),
                json!({"type": "signature_delta", "signature": text}),
            ),
            (
                Delta::InputJson(text),
                json!({"type": "input_json_delta", "partial_json": text}),
            ),
        ];
        for (delta, value) in cases {
            let frame = StreamEncoder::delta(7, delta);
            let events = sse::parse(std::str::from_utf8(&frame).unwrap());
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].event, "content_block_delta");
            let written: Value = serde_json::from_str(&events[0].data).unwrap();
            assert_eq!(
                written,
                json!({"type": "content_block_delta", "index": 7, "delta": value})
            );
            // Anthropic's own order, which a pass-through check (`is_plain_delta`) also reads.
            assert!(is_plain_delta(&events[0].event, &events[0].data));
        }
    }

    #[test]
    fn only_content_block_deltas_are_plain() {
        let delta =
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#;
        assert!(is_plain_delta("content_block_delta", delta));
        // The event name alone is not enough, nor a delta that mentions an error.
        assert!(!is_plain_delta(
            "content_block_delta",
            r#"{"type":"message_delta","usage":{}}"#
        ));
        assert!(!is_plain_delta(
            "content_block_delta",
            r#"{"type":"content_block_delta","error":{"message":"x"}}"#
        ));
        for (event, data) in [
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
            (
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
            ),
            ("", delta),
        ] {
            assert!(!is_plain_delta(event, data), "{event}");
        }
    }
}
