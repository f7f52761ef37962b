//! The internal representation every dialect parses into and builds from.
//!
//! A client request in any dialect becomes one [`Request`]; an upstream answer becomes one
//! [`Response`] or a sequence of [`StreamEvent`]s. The types model what at least two dialects share;
//! what only one dialect has either lives in a field documented as dialect-specific (kept when the
//! same dialect is on both sides) or in [`Request::extra`], and `docs/translation.md` lists what is
//! dropped on the way to each other dialect.

use serde_json::{Map, Value};

use super::Dialect;

/// The non-text inputs a request carries, as a set of flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Modalities(u8);

impl Modalities {
    pub const IMAGE: Modalities = Modalities(1);
    pub const AUDIO: Modalities = Modalities(1 << 1);
    pub const VIDEO: Modalities = Modalities(1 << 2);

    /// Text only.
    pub const fn empty() -> Modalities {
        Modalities(0)
    }

    /// Whether every flag of `other` is set here.
    pub const fn contains(self, other: Modalities) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Modalities {
    type Output = Modalities;

    fn bitor(self, other: Modalities) -> Modalities {
        Modalities(self.0 | other.0)
    }
}

impl std::ops::BitOrAssign for Modalities {
    fn bitor_assign(&mut self, other: Modalities) {
        self.0 |= other.0;
    }
}

/// Token estimate of one image part, whatever its size (the reference estimator's flat rate).
pub const IMAGE_TOKENS: u32 = 85;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    /// OpenAI's newer name for system instructions; Anthropic has no such role (it joins `system`).
    Developer,
    User,
    Assistant,
    /// Tool results. A `Tool` message holds only [`Part::ToolResult`] parts.
    Tool,
}

/// One message of the conversation, its content in order.
///
/// Invariants the parsers keep and the builders rely on: [`Part::ToolCall`] and reasoning parts
/// appear only in `Assistant` messages, [`Part::ToolResult`] only in `Tool` messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
    /// OpenAI's participant name; only Chat Completions carries it.
    pub name: Option<String>,
}

impl Message {
    /// A message with a single text part.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: vec![Part::text(text)],
            name: None,
        }
    }

    /// The message's text parts, concatenated without separators.
    pub fn joined_text(&self) -> String {
        join_text(&self.content)
    }
}

/// Concatenation of the text parts among `parts`.
pub fn join_text(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource {
    /// An `http(s)` URL the upstream fetches.
    Url(String),
    /// Inline bytes, base64-encoded (without the `data:` prefix).
    Base64 { media_type: String, data: String },
}

impl ImageSource {
    /// Reads an OpenAI-style image URL, which may be a `data:<type>;base64,<data>` URL.
    pub fn from_url(url: &str) -> Self {
        if let Some(rest) = url.strip_prefix("data:")
            && let Some((meta, data)) = rest.split_once(',')
            && let Some(media_type) = meta.strip_suffix(";base64")
        {
            return ImageSource::Base64 {
                media_type: media_type.to_owned(),
                data: data.to_owned(),
            };
        }
        ImageSource::Url(url.to_owned())
    }

    /// The image as an OpenAI-style URL (inline data becomes a `data:` URL).
    pub fn to_url(&self) -> String {
        match self {
            ImageSource::Url(u) => u.clone(),
            ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        }
    }
}

/// One piece of message content.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text {
        text: String,
        /// Anthropic prompt-caching marker, kept verbatim; only Anthropic upstreams receive it.
        cache_control: Option<Value>,
    },
    Image {
        source: ImageSource,
        /// OpenAI's `detail` (`low`/`high`/`auto`); Anthropic has none.
        detail: Option<String>,
        cache_control: Option<Value>,
    },
    /// Input audio (base64 data and its format, e.g. `wav`). Kept so routing sees the modality; only
    /// Chat Completions upstreams accept it.
    Audio {
        data: String,
        format: String,
    },
    /// A video URL (a Chat Completions extension some OpenAI-compatible servers accept).
    Video {
        url: String,
    },
    /// Reasoning the assistant showed earlier. `signature` is Anthropic's proof of origin; only
    /// Anthropic upstreams receive reasoning, and only when it is signed.
    Reasoning {
        text: String,
        signature: Option<String>,
    },
    /// Anthropic's encrypted reasoning; only Anthropic upstreams receive it.
    RedactedReasoning {
        data: String,
    },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

impl Part {
    pub fn text(text: impl Into<String>) -> Self {
        Part::Text {
            text: text.into(),
            cache_control: None,
        }
    }
}

/// A function call the assistant made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON text, exactly as the model produced them (possibly invalid JSON).
    pub arguments: String,
}

/// The result of one tool call, sent back by the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub tool_call_id: String,
    /// Text and image parts only.
    pub content: Vec<Part>,
    /// Anthropic's `is_error`; OpenAI dialects have no such flag.
    pub is_error: bool,
    pub cache_control: Option<Value>,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
    /// OpenAI's strict schema adherence; `None` when the client did not say.
    pub strict: Option<bool>,
    pub cache_control: Option<Value>,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    /// Some tool, the model picks (Anthropic's `any`).
    Required,
    Function(String),
}

/// The shape the answer text must have.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        description: Option<String>,
        schema: Value,
        strict: Option<bool>,
    },
}

/// OpenAI's reasoning effort levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    XHigh,
}

impl Effort {
    pub fn parse(s: &str) -> Option<Effort> {
        Some(match s {
            "none" => Effort::None,
            "minimal" => Effort::Minimal,
            "low" => Effort::Low,
            "medium" => Effort::Medium,
            "high" => Effort::High,
            "xhigh" => Effort::XHigh,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Effort::None => "none",
            Effort::Minimal => "minimal",
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::XHigh => "xhigh",
        }
    }

    /// The thinking budget an effort stands for when the upstream wants tokens; `None` for no
    /// reasoning. Chosen so that [`Effort::from_budget`] maps each budget back to its effort
    /// (except `minimal`, which becomes `low`).
    pub fn budget_tokens(self) -> Option<u32> {
        match self {
            Effort::None => None,
            Effort::Minimal => Some(1024),
            Effort::Low => Some(2048),
            Effort::Medium => Some(8192),
            Effort::High => Some(24576),
            Effort::XHigh => Some(32768),
        }
    }

    /// The effort a thinking budget stands for when the upstream wants a level.
    pub fn from_budget(budget: u32) -> Effort {
        match budget {
            0..4096 => Effort::Low,
            4096..16384 => Effort::Medium,
            _ => Effort::High,
        }
    }
}

/// How much the model should reason before answering.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reasoning {
    /// OpenAI's level.
    pub effort: Option<Effort>,
    /// Anthropic's budget (`thinking.budget_tokens`).
    pub budget_tokens: Option<u32>,
    /// OpenAI Responses' `reasoning.summary` (`auto`/`concise`/`detailed`).
    pub summary: Option<String>,
}

impl Reasoning {
    /// The level to send to an OpenAI upstream; `None` means "say nothing".
    pub fn effective_effort(&self) -> Option<Effort> {
        self.effort
            .or_else(|| self.budget_tokens.map(Effort::from_budget))
    }

    /// The budget to send to an Anthropic upstream; `None` means thinking stays off.
    pub fn effective_budget(&self) -> Option<u32> {
        match (self.budget_tokens, self.effort) {
            (Some(b), _) => Some(b),
            (None, Some(e)) => e.budget_tokens(),
            (None, None) => None,
        }
    }
}

/// A chat request, whichever dialect it came in.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The model the client named (the public model id).
    pub model: String,
    /// System and developer messages keep their position here; dialects that take system text
    /// separately gather them.
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    /// `false` forbids several tool calls in one turn (Anthropic's `disable_parallel_tool_use`).
    pub parallel_tool_calls: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Anthropic only.
    pub top_k: Option<u32>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub max_output_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub response_format: Option<ResponseFormat>,
    pub reasoning: Option<Reasoning>,
    /// Free-form key/value pairs (OpenAI `metadata`).
    pub metadata: Map<String, Value>,
    /// End-user id (OpenAI `user`, Anthropic `metadata.user_id`).
    pub user: Option<String>,
    pub stream: bool,
    /// The dialect the request was parsed from.
    pub source: Dialect,
    /// Top-level fields of the source dialect that the IR does not model (e.g. `n`, `logprobs`,
    /// `service_tier`, vendor extensions). They reach an upstream of the same dialect untouched and
    /// are dropped for any other.
    pub extra: Map<String, Value>,
}

impl Request {
    /// A plain request with one user message; the other fields empty.
    pub fn new(model: impl Into<String>, source: Dialect, messages: Vec<Message>) -> Self {
        Self {
            model: model.into(),
            messages,
            tools: Vec::new(),
            tool_choice: None,
            parallel_tool_calls: None,
            temperature: None,
            top_p: None,
            top_k: None,
            presence_penalty: None,
            frequency_penalty: None,
            seed: None,
            max_output_tokens: None,
            stop: Vec::new(),
            response_format: None,
            reasoning: None,
            metadata: Map::new(),
            user: None,
            stream: false,
            source,
            extra: Map::new(),
        }
    }

    /// Characters / 4 of all text (system, messages, tool results) plus a flat
    /// [`IMAGE_TOKENS`] per image. A cheap estimate for routing, not a tokenizer.
    pub fn prompt_token_estimate(&self) -> u32 {
        let mut chars: u64 = 0;
        let mut images: u32 = 0;
        for m in &self.messages {
            count_parts(&m.content, &mut chars, &mut images);
        }
        u32::try_from(chars / 4)
            .unwrap_or(u32::MAX)
            .saturating_add(images.saturating_mul(IMAGE_TOKENS))
    }

    /// The input modalities beyond text that the request uses.
    pub fn modalities(&self) -> Modalities {
        let mut out = Modalities::empty();
        for m in &self.messages {
            modalities_of(&m.content, &mut out);
        }
        out
    }

    /// A generous guess of the size of this request's messages as JSON in any dialect, for
    /// sizing an upstream body's buffer up front (see [`super::json::to_vec_with`]).
    pub fn json_size_hint(&self) -> usize {
        fn parts_size(parts: &[Part]) -> usize {
            parts
                .iter()
                .map(|p| {
                    // Field names, quotes and escapes: text with many escapes can exceed it, and
                    // the buffer then grows as usual.
                    128 + match p {
                        Part::Text { text, .. } => text.len() * 2,
                        Part::Image { source, .. } => match source {
                            ImageSource::Url(u) => u.len(),
                            ImageSource::Base64 { data, .. } => data.len(),
                        },
                        Part::Audio { data, .. } => data.len(),
                        Part::Video { url } => url.len(),
                        Part::Reasoning { text, signature } => {
                            text.len() * 2 + signature.as_ref().map_or(0, String::len)
                        }
                        Part::RedactedReasoning { data } => data.len(),
                        Part::ToolCall(c) => c.arguments.len() * 2 + c.name.len() + c.id.len(),
                        Part::ToolResult(r) => parts_size(&r.content) + r.tool_call_id.len(),
                    }
                })
                .sum()
        }
        let messages: usize = self
            .messages
            .iter()
            .map(|m| 64 + parts_size(&m.content))
            .sum();
        messages + 4096
    }

    /// Whether the client offered at least one tool.
    pub fn has_tools(&self) -> bool {
        !self.tools.is_empty()
    }
}

/// The characters of `text`. Most prompts are ASCII, where that is its length: checking costs a
/// third of counting (~0.24 instructions a byte against ~0.7, callgrind, a 33 KB text).
fn char_count(text: &str) -> usize {
    if text.is_ascii() {
        text.len()
    } else {
        text.chars().count()
    }
}

fn count_parts(parts: &[Part], chars: &mut u64, images: &mut u32) {
    for p in parts {
        match p {
            Part::Text { text, .. } => *chars += char_count(text) as u64,
            Part::Image { .. } => *images = images.saturating_add(1),
            Part::ToolResult(r) => count_parts(&r.content, chars, images),
            _ => {}
        }
    }
}

fn modalities_of(parts: &[Part], out: &mut Modalities) {
    for p in parts {
        match p {
            Part::Image { .. } => *out |= Modalities::IMAGE,
            Part::Audio { .. } => *out |= Modalities::AUDIO,
            Part::Video { .. } => *out |= Modalities::VIDEO,
            Part::ToolResult(r) => modalities_of(&r.content, out),
            _ => {}
        }
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A natural end or a stop sequence.
    Stop,
    /// The output token limit.
    Length,
    ToolCalls,
    /// Refused or filtered.
    ContentFilter,
    /// Anything else, as the upstream named it.
    Other(String),
}

/// Token counts of one answer.
///
/// `input_tokens` counts every input token including cached ones (OpenAI's convention);
/// `cached_input_tokens` and `cache_creation_input_tokens` say how many of them were read from or
/// written to a prompt cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cached_input_tokens: u32,
    /// Anthropic only.
    pub cache_creation_input_tokens: u32,
    /// OpenAI only; part of `output_tokens`.
    pub reasoning_tokens: u32,
}

/// One piece of the assistant's answer, in the order produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Text(String),
    Reasoning {
        text: String,
        /// Anthropic's signature; passed to Anthropic clients only.
        signature: Option<String>,
    },
    ToolCall(ToolCall),
}

/// A complete (non-streaming) answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The upstream's id; builders prefix it as their dialect expects.
    pub id: String,
    /// The model the upstream reported.
    pub model: String,
    /// Unix seconds; `None` when the upstream did not say.
    pub created: Option<u64>,
    pub output: Vec<Output>,
    pub finish: FinishReason,
    /// The stop sequence that ended the answer, when the upstream says which.
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

impl Response {
    /// All text output, concatenated.
    pub fn text(&self) -> String {
        self.output
            .iter()
            .filter_map(|o| match o {
                Output::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    /// All reasoning output, concatenated.
    pub fn reasoning(&self) -> String {
        self.output
            .iter()
            .filter_map(|o| match o {
                Output::Reasoning { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.output.iter().filter_map(|o| match o {
            Output::ToolCall(c) => Some(c),
            _ => None,
        })
    }

    /// The finish reason a client should see: some upstreams say `stop` after calling tools, and
    /// agent loops of every SDK look for the tool-call reason.
    pub fn effective_finish(&self) -> FinishReason {
        effective_finish(&self.finish, self.tool_calls().next().is_some())
    }
}

/// `reason`, except that `Stop` after tool calls becomes `ToolCalls`.
pub fn effective_finish(reason: &FinishReason, had_tool_calls: bool) -> FinishReason {
    match reason {
        FinishReason::Stop if had_tool_calls => FinishReason::ToolCalls,
        other => other.clone(),
    }
}

/// One event of a streamed answer, whichever dialect it came in.
///
/// A well-formed stream is `Start`, then any deltas, then `Finish`, `Usage` (either order, usage
/// may be missing), then `Done`; or it ends early with `Error`. Encoders tolerate deviations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    Start {
        id: String,
        model: String,
    },
    TextDelta(String),
    ReasoningDelta(String),
    /// Anthropic's signature of the reasoning just streamed.
    ReasoningSignature(String),
    /// A tool call begins. `index` counts tool calls of this answer from 0.
    ToolCallStart {
        index: u32,
        id: String,
        name: String,
    },
    /// More of a tool call's argument JSON text.
    ToolCallDelta {
        index: u32,
        arguments: String,
    },
    Finish {
        reason: FinishReason,
        stop_sequence: Option<String>,
    },
    Usage(Usage),
    /// The answer is complete.
    Done,
    /// The upstream failed mid-stream. `status` is the HTTP status that best describes it, as for
    /// `error_body`.
    Error {
        status: u16,
        message: String,
    },
}

#[cfg(test)]
mod tests;
