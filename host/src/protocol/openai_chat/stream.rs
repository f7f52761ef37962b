//! Chat Completions streams: `data: {chunk}` events ending with `data: [DONE]`.

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem::Finder;
use serde::Deserialize;
use serde_json::{Value, json};

use super::response::{finish_str, parse_finish, parse_usage, usage_value};
use crate::protocol::delta_template::{DeltaTemplate, Templated};
use crate::protocol::ir::{StreamEvent, effective_finish};
use crate::protocol::{error_body_openai, ids, scan, sse, status_of_error, upstream_error_message};

/// Turns an upstream's Chat Completions chunks into IR events.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    /// Per IR tool index: the upstream's index and id of that call.
    tools: Vec<(u64, String)>,
    finished: bool,
    done: bool,
    /// The frame of this stream's content deltas, once one was decoded.
    template: DeltaTemplate,
}

/// The key that opens a content delta's text, as compact JSON writes it.
const CONTENT_KEY: &str = r#""content":""#;

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
        // Most of a stream: a content delta in the frame of one decoded before.
        if let Some(text) = self.template.text(data) {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![StreamEvent::TextDelta(text.into_owned())]
            };
        }
        if data == "[DONE]" {
            self.done = true;
            return vec![StreamEvent::Done];
        }
        // The common shape is read straight from the text by the scan's reader, borrowing its
        // strings; anything the typed view cannot take (a wrong type somewhere, a duplicate key)
        // or the reader gives up on goes the lenient way, through a `Value`, with the same result
        // for every field the view reads.
        let typed = if data.starts_with('{') {
            scan::scan_str::<ChunkView<'_>>(data)
        } else {
            None
        };
        let value;
        let chunk = match typed {
            Some(chunk) => chunk,
            None => {
                value = match serde_json::from_str::<Value>(data) {
                    Ok(v) => v,
                    Err(e) => return self.fail(502, format!("invalid upstream stream chunk: {e}")),
                };
                if !value.is_object() {
                    return self.fail(502, "upstream stream chunk is not a JSON object".into());
                }
                ChunkView::lenient(&value)
            }
        };
        let events = self.apply(chunk);
        // A content delta and nothing else, in a chunk that says nothing but deltas: its frame
        // reads the stream's next ones (see `DeltaTemplate` for why that is exact). Its other
        // fields are fixed in the frame and gave no event here, nor can they in a chunk that
        // differs only in the content (no other field's event depends on it).
        if let [StreamEvent::TextDelta(text)] = events.as_slice() {
            self.template
                .learn(data, CONTENT_KEY, text, || is_plain_delta(data));
        }
        events
    }

    /// The text of `data` when it is a content delta in the frame of one this decoder decoded,
    /// read without decoding: what [`StreamDecoder::decode`] would make of it is that text
    /// alone (nothing when it is empty). Such a chunk is a plain delta (see [`is_plain_delta`]).
    pub fn templated_text<'a>(&self, data: &'a str) -> Option<Cow<'a, str>> {
        self.live_template()?.text(data.trim())
    }

    /// The template that reads `data` as it stands (untrimmed), if one does.
    pub(crate) fn templated(&self, data: &str) -> Option<Templated<'_>> {
        self.live_template()?.reading(data)
    }

    /// The template, while the stream may still send deltas.
    fn live_template(&self) -> Option<&DeltaTemplate> {
        (!self.done).then_some(&self.template)
    }

    fn apply(&mut self, chunk: ChunkView<'_>) -> Vec<StreamEvent> {
        if let Some(e) = chunk.error.as_ref().filter(|e| !e.is_null()) {
            return self.fail(status_of_error(e), upstream_error_message(e));
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.push(StreamEvent::Start {
                id: chunk.id.as_deref().unwrap_or("").to_owned(),
                model: chunk.model.as_deref().unwrap_or("").to_owned(),
            });
        }
        // Only the first choice is translated (`n > 1` has no equivalent elsewhere).
        let choice = chunk
            .choices
            .as_ref()
            .and_then(|c| c.iter().find(|c| c.index.unwrap_or(0) == 0));
        if let Some(choice) = choice {
            if let Some(delta) = &choice.delta {
                self.delta(delta, &mut out);
            }
            if let Some(reason) = &choice.finish_reason {
                self.finished = true;
                out.push(StreamEvent::Finish {
                    reason: parse_finish(reason),
                    stop_sequence: None,
                });
            }
        }
        // Usage rides on the last chunk (empty `choices`) or on the finishing one; servers that
        // repeat running totals on every chunk are only heard at the end.
        if let Some(u) = chunk.usage.as_ref().filter(|u| u.is_object())
            && (chunk.choices.as_ref().is_none_or(|c| c.is_empty()) || self.finished)
        {
            out.push(StreamEvent::Usage(parse_usage(u)));
        }
        out
    }

    fn delta(&mut self, delta: &DeltaView<'_>, out: &mut Vec<StreamEvent>) {
        let text =
            |t: &Option<Cow<'_, str>>| t.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
        if let Some(r) = text(&delta.reasoning_content).or_else(|| text(&delta.reasoning)) {
            out.push(StreamEvent::ReasoningDelta(r));
        }
        if let Some(t) = text(&delta.content) {
            out.push(StreamEvent::TextDelta(t));
        }
        if let Some(t) = text(&delta.refusal) {
            out.push(StreamEvent::TextDelta(t));
        }
        let Some(calls) = &delta.tool_calls else {
            return;
        };
        for (pos, call) in calls.iter().enumerate() {
            let upstream_index = call.index.unwrap_or(pos as u64);
            let id = call.id.as_deref().unwrap_or("");
            let function = call.function.as_ref();
            let name = function.and_then(|f| f.name.as_deref()).unwrap_or("");
            let arguments = function.and_then(|f| f.arguments.as_deref()).unwrap_or("");
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

/// A chunk that carries only deltas: no finish reason other than the compact `null`, no usage,
/// no error, not the end marker. Its deltas matter to accounting only until the first token.
pub fn is_plain_delta(data: &str) -> bool {
    let data = data.as_bytes();
    let needles = &*PLAIN_DELTA_NEEDLES;
    let mentions = |needle: &Finder<'_>| needle.find(data).is_some();
    if mentions(&needles.usage) || mentions(&needles.error) || mentions(&needles.done) {
        return false;
    }
    match needles.finish_reason.find(data) {
        None => true,
        Some(at) => {
            let rest = &data[at..];
            rest.starts_with(b"finish_reason\":null")
                && needles.finish_reason.find(&rest[1..]).is_none()
        }
    }
}

/// The searchers of [`is_plain_delta`], built once: `memmem::find` builds one on every call
/// (~550 instructions), which made the check that lets a relay skip decoding a chunk cost more
/// than the decoding (~46,000 instructions per 20-event stream).
struct PlainDeltaNeedles {
    usage: Finder<'static>,
    error: Finder<'static>,
    done: Finder<'static>,
    finish_reason: Finder<'static>,
}

static PLAIN_DELTA_NEEDLES: LazyLock<PlainDeltaNeedles> = LazyLock::new(|| PlainDeltaNeedles {
    usage: Finder::new("usage"),
    error: Finder::new("error"),
    done: Finder::new("[DONE]"),
    finish_reason: Finder::new("finish_reason"),
});

/// What the decoder reads of a chunk. Strings borrow from the event's text unless they hold
/// escapes; every other field is skipped without being built.
#[derive(Deserialize)]
struct ChunkView<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    choices: Option<Vec<ChoiceView<'a>>>,
    usage: Option<Value>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    delta: Option<DeltaView<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct DeltaView<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<ToolCallView<'a>>>,
}

#[derive(Deserialize)]
struct ToolCallView<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: Option<FunctionView<'a>>,
}

#[derive(Deserialize)]
struct FunctionView<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// The view of a chunk read as a `Value`, where a field of an unexpected type counts as absent
/// (and a choice without an integer `index` as the first), as the typed view would have it had
/// the type been right.
impl<'a> ChunkView<'a> {
    fn lenient(v: &'a Value) -> Self {
        let text = crate::protocol::json::str_or_absent;
        let present = |v: &'a Value, key: &str| v.get(key).filter(|v| !v.is_null()).cloned();
        let choices = v.get("choices").and_then(Value::as_array).map(|choices| {
            choices
                .iter()
                .map(|c| ChoiceView {
                    index: c.get("index").and_then(Value::as_u64),
                    delta: c.get("delta").map(|d| DeltaView {
                        content: text(d, "content"),
                        reasoning_content: text(d, "reasoning_content"),
                        reasoning: text(d, "reasoning"),
                        refusal: text(d, "refusal"),
                        tool_calls: d.get("tool_calls").and_then(Value::as_array).map(|calls| {
                            calls
                                .iter()
                                .map(|call| ToolCallView {
                                    index: call.get("index").and_then(Value::as_u64),
                                    id: text(call, "id"),
                                    function: call.get("function").map(|f| FunctionView {
                                        name: text(f, "name"),
                                        arguments: text(f, "arguments"),
                                    }),
                                })
                                .collect()
                        }),
                    }),
                    finish_reason: text(c, "finish_reason"),
                })
                .collect()
        });
        ChunkView {
            id: text(v, "id"),
            model: text(v, "model"),
            choices,
            usage: present(v, "usage"),
            error: present(v, "error"),
        }
    }
}

/// The delta of a chunk a stream is mostly made of.
#[derive(Debug, Clone, Copy)]
enum ChunkDelta<'a> {
    Role,
    Content(&'a str),
    Reasoning(&'a str),
    ToolArguments { index: u32, arguments: &'a str },
}

/// Frames IR events as Chat Completions chunks for a client.
#[derive(Debug)]
pub struct StreamEncoder {
    public_model: String,
    id: String,
    created: u64,
    /// What every chunk starts with, up to its choice's delta; written at the start.
    chunk_prefix: sse::FramePrefix,
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
            created: crate::clock::unix_secs(),
            chunk_prefix: sse::FramePrefix::default(),
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

    /// A chunk whose only choice holds `delta` (any JSON value) and `finish_reason`; its id,
    /// model and time are the stream's, written once.
    fn chunk_of(&self, delta: &Value, finish_reason: Option<&str>) -> Bytes {
        self.chunk_tail(self.chunk_head().value(delta), finish_reason)
    }

    /// A chunk of one of the deltas every token makes, written without a `Value`.
    fn chunk(&self, delta: ChunkDelta<'_>) -> Bytes {
        let head = self.chunk_head();
        let head = match delta {
            ChunkDelta::Role => head.json(r#"{"role":"assistant","content":""}"#),
            ChunkDelta::Content(t) => head.json(r#"{"content":"#).value(t).json("}"),
            ChunkDelta::Reasoning(t) => head.json(r#"{"reasoning_content":"#).value(t).json("}"),
            ChunkDelta::ToolArguments { index, arguments } => head
                .json(r#"{"tool_calls":[{"index":"#)
                .value(&index)
                .json(r#","function":{"arguments":"#)
                .value(arguments)
                .json("}}]}"),
        };
        self.chunk_tail(head, None)
    }

    fn chunk_head(&self) -> sse::FrameWriter {
        sse::FrameWriter::after(&self.chunk_prefix)
    }

    fn chunk_tail(&self, head: sse::FrameWriter, finish_reason: Option<&str>) -> Bytes {
        head.json(r#","logprobs":null,"finish_reason":"#)
            .value(&finish_reason)
            .json("}]}")
            .finish()
    }

    fn start(&mut self, id: &str, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = ids::with_prefix(id, "chatcmpl-");
        // Keys in OpenAI's order.
        self.chunk_prefix = sse::FrameWriter::data()
            .json(r#"{"id":"#)
            .value(&self.id)
            .json(r#","object":"chat.completion.chunk","created":"#)
            .value(&self.created)
            .json(r#","model":"#)
            .value(&self.public_model)
            .json(r#","choices":[{"index":0,"delta":"#)
            .prefix();
        out.push(self.chunk(ChunkDelta::Role));
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
                out.push(self.chunk(ChunkDelta::Content(t)));
            }
            StreamEvent::ReasoningDelta(t) => {
                self.start("", &mut out);
                out.push(self.chunk(ChunkDelta::Reasoning(t)));
            }
            StreamEvent::ReasoningSignature(_) => {}
            StreamEvent::ToolCallStart { index, id, name } => {
                self.start("", &mut out);
                self.had_tool_calls = true;
                out.push(self.chunk_of(
                    &json!({"tool_calls": [{
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
                out.push(self.chunk(ChunkDelta::ToolArguments {
                    index: *index,
                    arguments,
                }));
            }
            StreamEvent::Finish { reason, .. } => {
                self.start("", &mut out);
                let reason = effective_finish(reason, self.had_tool_calls);
                out.push(self.chunk_of(&json!({}), Some(finish_str(&reason))));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream decoded with the frames it learns gives the events the full decoding of every
    /// chunk gives, whatever the texts, and chunks in another frame are decoded in full.
    #[test]
    fn content_deltas_in_a_learned_frame_decode_as_in_full() {
        let chunk = |delta: &str, finish: &str| {
            format!(
                r#"{{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]}}"#
            )
        };
        let content = |text: &str| {
            chunk(
                &format!(r#"{{"content":{}}}"#, serde_json::to_string(text).unwrap()),
                "null",
            )
        };
        let stream = [
            chunk(r#"{"role":"assistant","content":""}"#, "null"),
            content("Hello"),
            content(" wor\"ld\" \u{e9}\n"),
            content(""),
            // Another frame: a refusal beside the content, then the first frame again.
            chunk(r#"{"content":"a","refusal":"b"}"#, "null"),
            content("again"),
            chunk(r#"{"content":"last"}"#, r#""stop""#),
            content("after the finish"),
            r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#.to_owned(),
            "[DONE]".to_owned(),
        ];
        let mut templated = StreamDecoder::new();
        let mut expected = Vec::new();
        let mut got = Vec::new();
        for data in &stream {
            // A decoder that has seen the same chunks but never reads by a frame.
            let mut full = StreamDecoder::new();
            for earlier in stream.iter().take_while(|d| *d != data) {
                full.decode("", earlier);
                full.template = DeltaTemplate::default();
            }
            expected.push(full.decode("", data));
            got.push(templated.decode("", data));
        }
        assert_eq!(got, expected);
        let mut learned = StreamDecoder::new();
        // The first chunk starts the stream (two events): no frame is learned from it.
        learned.decode("", &content("x"));
        assert_eq!(learned.templated_text(&content("y")), None);
        learned.decode("", &content("x"));
        assert_eq!(learned.templated_text(&content("y")).as_deref(), Some("y"));
        assert!(is_plain_delta(&content("y")));
        assert_eq!(
            learned.templated_text(&chunk(r#"{"content":"y"}"#, r#""stop""#)),
            None
        );
    }

    /// The typed chunks say what the `Value`s they replaced said, escapes included.
    #[test]
    fn typed_chunks_match_their_value_form() {
        let text = "a \"quoted\" \\ line\nwith \u{1} control, \u{e9} and \u{1F600}";
        let mut encoder = StreamEncoder::new("public/model");
        let start = encoder.encode(&StreamEvent::Start {
            id: "abc".into(),
            model: "m".into(),
        });
        assert_eq!(start.len(), 1);
        let created = encoder.created;
        let chunk = |delta: Value| {
            json!({
                "id": "chatcmpl-abc",
                "object": "chat.completion.chunk",
                "created": created,
                "model": "public/model",
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}],
            })
        };
        let cases = [
            (
                StreamEvent::TextDelta(text.into()),
                json!({"content": text}),
            ),
            (
                StreamEvent::ReasoningDelta(text.into()),
                json!({"reasoning_content": text}),
            ),
            (
                StreamEvent::ToolCallDelta {
                    index: 3,
                    arguments: text.into(),
                },
                json!({"tool_calls": [{"index": 3, "function": {"arguments": text}}]}),
            ),
        ];
        for (event, delta) in cases {
            let frames = encoder.encode(&event);
            assert_eq!(frames.len(), 1, "{event:?}");
            let events = sse::parse(std::str::from_utf8(&frames[0]).unwrap());
            let written: Value = serde_json::from_str(&events[0].data).unwrap();
            assert_eq!(written, chunk(delta), "{event:?}");
        }
    }

    /// The typed view and the lenient one agree on every chunk the typed view can read, so the
    /// fast path changes nothing but speed.
    #[test]
    fn typed_and_lenient_views_decode_alike() {
        let stream = [
            r#"{"id":"c1","model":"m\u00e9","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"reasoning_content":"hm","content":"Hi \"there\""}}],"usage":null}"#,
            r#"{"id":"c1","choices":[{"index":1,"delta":{"content":"second choice"}},{"index":0,"delta":{"refusal":"no"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1}"}},{"id":"call_b","function":{"name":"g"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":2}}}"#,
            r#"{"error":{"message":"overloaded","code":529}}"#,
        ];
        let mut typed = StreamDecoder::new();
        let mut lenient = StreamDecoder::new();
        for chunk in stream {
            let view: ChunkView<'_> = serde_json::from_str(chunk).expect("typed view reads it");
            let value: Value = serde_json::from_str(chunk).expect("valid JSON");
            assert_eq!(
                typed.apply(view),
                lenient.apply(ChunkView::lenient(&value)),
                "{chunk}"
            );
        }
    }

    #[test]
    fn only_chunks_without_an_ending_usage_or_error_are_plain_deltas() {
        assert!(is_plain_delta(
            r#"{"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#
        ));
        assert!(is_plain_delta(r#"{"choices":[{"delta":{"content":"x"}}]}"#));
        for data in [
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason": null}]}"#,
            r#"{"choices":[{"finish_reason":null},{"finish_reason":"length"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
            r#"{"choices":[{"delta":{"content":"x"}}],"usage":null}"#,
            r#"{"error":{"message":"boom"}}"#,
            "[DONE]",
        ] {
            assert!(!is_plain_delta(data), "{data}");
        }
        // What a plain delta decodes to after the first token is text only: skipping it loses
        // nothing the relay accounts.
        let mut d = StreamDecoder::new();
        d.decode("", r#"{"choices":[{"delta":{"content":"a"}}]}"#);
        let events = d.decode(
            "",
            r#"{"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#,
        );
        assert_eq!(events, vec![StreamEvent::TextDelta("hi".into())]);
    }

    /// What the typed view refuses still decodes, through the lenient view.
    #[test]
    fn chunks_of_unexpected_shape_fall_back_to_the_lenient_view() {
        let mut d = StreamDecoder::new();
        let events = d.decode(
            "",
            r#"{"id":7,"choices":[{"index":0,"delta":{"content":["odd"],"reasoning":"r"},"finish_reason":1}]}"#,
        );
        assert_eq!(
            events,
            vec![
                StreamEvent::Start {
                    id: String::new(),
                    model: String::new()
                },
                StreamEvent::ReasoningDelta("r".into()),
            ]
        );
        assert!(matches!(
            d.decode("", r#"["not","an","object"]"#).as_slice(),
            [StreamEvent::Error { status: 502, .. }]
        ));
    }
}
