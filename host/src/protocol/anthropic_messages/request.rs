//! Anthropic Messages requests ↔ IR.

use serde_json::{Map, Value, json};

use crate::protocol::ir::{
    ImageSource, Message, Part, Reasoning, Request, Role, Tool, ToolCall, ToolChoice, ToolResult,
};
use crate::protocol::json::{self, Limits, Obj, put};
use crate::protocol::{Dialect, ProtocolError, ids};

/// `max_tokens` sent to Anthropic when the client set no limit (Anthropic requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: u32 = 1024;

/// Top-level fields the IR models. `thinking` is modeled only for `enabled`/`disabled` and stays in
/// `extra` otherwise (newer modes reach an Anthropic upstream untouched).
const MODELED: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "metadata",
    "stream",
];

/// Parses and validates a client's Messages body within the default [`Limits`].
pub fn parse_request(bytes: &[u8]) -> Result<Request, ProtocolError> {
    parse_request_within(bytes, Limits::DEFAULT)
}

/// [`parse_request`] within `limits`, which are checked as the body is read.
pub fn parse_request_within(bytes: &[u8], limits: Limits) -> Result<Request, ProtocolError> {
    parse(bytes, limits, true).map(|(request, _)| request)
}

/// [`parse_request_within`], with where the body's top-level entries are (when its reader
/// recorded them), for a pass-through upstream body.
pub fn parse_request_fields(
    bytes: &[u8],
    limits: Limits,
) -> Result<(Request, Option<json::BodyFields>), ProtocolError> {
    parse(bytes, limits, true)
}

/// A `count_tokens` body: a Messages body that needs no `max_tokens`.
pub fn parse_count_tokens_request(bytes: &[u8], limits: Limits) -> Result<Request, ProtocolError> {
    parse(bytes, limits, false).map(|(request, _)| request)
}

fn parse(
    bytes: &[u8],
    limits: Limits,
    needs_max_tokens: bool,
) -> Result<(Request, Option<json::BodyFields>), ProtocolError> {
    let mut lazy = json::Lazy::parse_messages(bytes, limits)?;
    let body = lazy.body()?;
    let model = body.req_str("model")?;
    let max_tokens = match body.u32("max_tokens")? {
        Some(n) => n,
        None if needs_max_tokens => return Err(body.missing("max_tokens")),
        None => 1,
    };
    let count = match lazy.list_len() {
        Some(0) => return Err(ProtocolError::invalid("messages", "must not be empty")),
        Some(n) => n,
        None => {
            // Not an array: name its type, or say it is missing.
            body.array("messages")?;
            return Err(ProtocolError::missing("messages"));
        }
    };
    let mut messages = Vec::with_capacity(count + 1);
    if let Some(system) = system(&body)? {
        messages.push(system);
    }
    lazy.each_plain(|i, entry| match entry {
        json::Entry::Plain(m) => Ok(match plain_message(m) {
            Some(m) => {
                messages.push(m);
                true
            }
            None => false,
        }),
        json::Entry::Tree(m) => message(i, m, &mut messages).map(|()| true),
    })?;
    let mut r = Request::new(model, Dialect::AnthropicMessages, messages);
    r.max_output_tokens = Some(max_tokens);
    r.tools = tools(&body)?;
    if let Some(v) = body.get("tool_choice") {
        let c = Obj::at(v, "tool_choice")?;
        r.tool_choice = Some(match c.req_str("type")? {
            "auto" => ToolChoice::Auto,
            "any" => ToolChoice::Required,
            "none" => ToolChoice::None,
            "tool" => ToolChoice::Function(c.req_str("name")?.to_owned()),
            other => {
                return Err(ProtocolError::invalid(
                    "tool_choice.type",
                    format!("must be auto, any, tool or none; not `{other}`"),
                ));
            }
        });
        if c.bool("disable_parallel_tool_use")? == Some(true) {
            r.parallel_tool_calls = Some(false);
        }
    }
    r.temperature = body.f64("temperature")?;
    r.top_p = body.f64("top_p")?;
    r.top_k = body.u32("top_k")?;
    if let Some(stops) = body.array("stop_sequences")? {
        r.stop = stops
            .iter()
            .map(|s| {
                s.as_str().map(str::to_owned).ok_or_else(|| {
                    ProtocolError::invalid("stop_sequences", "must be an array of strings")
                })
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(m) = body.get("metadata") {
        let m = Obj::at(m, "metadata")?;
        r.user = m.str("user_id")?.map(str::to_owned);
    }
    r.stream = body.bool("stream")?.unwrap_or(false);
    r.extra = json::extra(body.map, MODELED);
    if let Some(t) = body.get("thinking") {
        let t = Obj::at(t, "thinking")?;
        match t.req_str("type")? {
            "enabled" => {
                let budget = t
                    .u32("budget_tokens")?
                    .ok_or_else(|| t.missing("budget_tokens"))?;
                r.reasoning = Some(Reasoning {
                    budget_tokens: Some(budget),
                    ..Default::default()
                });
                r.extra.remove("thinking");
            }
            "disabled" => {
                r.extra.remove("thinking");
            }
            _ => {}
        }
    }
    Ok((r, lazy.take_fields()))
}

fn system(body: &Obj) -> Result<Option<Message>, ProtocolError> {
    let content = match body.get("system") {
        None => return Ok(None),
        Some(Value::String(s)) => vec![Part::text(s.as_str())],
        Some(Value::Array(blocks)) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (i, b) in blocks.iter().enumerate() {
                let path = format!("system[{i}]");
                let b = Obj::at(b, &path)?;
                if b.req_str("type")? != "text" {
                    return Err(ProtocolError::invalid(b.path("type"), "must be `text`"));
                }
                parts.push(Part::Text {
                    text: b.str("text")?.unwrap_or("").to_owned(),
                    cache_control: b.get("cache_control").cloned(),
                });
            }
            parts
        }
        Some(other) => {
            return Err(ProtocolError::wrong_type(
                "system",
                "a string or an array of text blocks",
                other,
            ));
        }
    };
    Ok(Some(Message {
        role: Role::System,
        content,
        name: None,
    }))
}

/// What [`message`] makes of a message of role and string content: a user's or assistant's text.
/// `None` for any other role, and for a `name`, which a tree's reading decides on.
fn plain_message(m: json::PlainMessage<'_>) -> Option<Message> {
    let role = match &*m.role {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        _ => return None,
    };
    if m.name.is_some() {
        return None;
    }
    Some(Message {
        role,
        content: vec![Part::text(m.content)],
        name: None,
    })
}

/// Appends the IR messages of one Anthropic message: a user message's `tool_result` blocks become
/// a `Tool` message ahead of the rest.
fn message(i: usize, v: &Value, out: &mut Vec<Message>) -> Result<(), ProtocolError> {
    let (path, content_path) = json::message_paths(i);
    let m = Obj::at(v, &path)?;
    let role = match m.req_str("role")? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => {
            return Err(ProtocolError::invalid(
                m.path("role"),
                format!("must be user or assistant; not `{other}`"),
            ));
        }
    };
    let blocks: Vec<Part> = match m.get("content") {
        Some(Value::String(s)) => vec![Part::text(s.as_str())],
        Some(Value::Array(blocks)) => blocks
            .iter()
            .enumerate()
            .map(|(j, b)| block(b, &format!("{content_path}[{j}]"), role))
            .collect::<Result<_, _>>()?,
        None => return Err(m.missing("content")),
        Some(other) => {
            return Err(ProtocolError::wrong_type(
                content_path,
                "a string or an array of content blocks",
                other,
            ));
        }
    };
    if !blocks.iter().any(|p| matches!(p, Part::ToolResult(_))) {
        // The common case keeps its exactly sized vector: a partition's vectors grow to room for
        // four parts, which for one-part messages was a third of the IR's memory.
        out.push(Message {
            role,
            content: blocks,
            name: None,
        });
        return Ok(());
    }
    let (results, rest): (Vec<Part>, Vec<Part>) = blocks
        .into_iter()
        .partition(|p| matches!(p, Part::ToolResult(_)));
    let only_results = rest.is_empty() && !results.is_empty();
    if !results.is_empty() {
        out.push(Message {
            role: Role::Tool,
            content: results,
            name: None,
        });
    }
    if !only_results {
        out.push(Message {
            role,
            content: rest,
            name: None,
        });
    }
    Ok(())
}

fn block(v: &Value, path: &str, role: Role) -> Result<Part, ProtocolError> {
    let b = Obj::at(v, path)?;
    let kind = b.req_str("type")?;
    let cache_control = b.get("cache_control").cloned();
    let allowed = matches!(
        (kind, role),
        ("text" | "image", _)
            | ("tool_result", Role::User)
            | (
                "tool_use" | "thinking" | "redacted_thinking",
                Role::Assistant
            )
    );
    if !allowed {
        return Err(ProtocolError::unsupported(
            b.path("type"),
            format!(
                "`{kind}` is not supported in a {} message (text, image, tool_use, tool_result, thinking)",
                if role == Role::User {
                    "user"
                } else {
                    "assistant"
                }
            ),
        ));
    }
    match kind {
        "text" => Ok(Part::Text {
            text: b.str("text")?.unwrap_or("").to_owned(),
            cache_control,
        }),
        "image" => image(&b, cache_control),
        "tool_use" => Ok(Part::ToolCall(ToolCall {
            id: b.req_str("id")?.to_owned(),
            name: b.req_str("name")?.to_owned(),
            arguments: b
                .get("input")
                .map_or_else(|| "{}".to_owned(), Value::to_string),
        })),
        "thinking" => Ok(Part::Reasoning {
            text: b.str("thinking")?.unwrap_or("").to_owned(),
            signature: b
                .str("signature")?
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        }),
        "redacted_thinking" => Ok(Part::RedactedReasoning {
            data: b.req_str("data")?.to_owned(),
        }),
        _ => {
            // tool_result
            let content = match b.get("content") {
                None => Vec::new(),
                Some(Value::String(s)) => vec![Part::text(s.as_str())],
                Some(Value::Array(items)) => {
                    let mut parts = Vec::with_capacity(items.len());
                    for (k, item) in items.iter().enumerate() {
                        let item_path = format!("{path}.content[{k}]");
                        let item = Obj::at(item, &item_path)?;
                        match item.req_str("type")? {
                            "text" => parts.push(Part::Text {
                                text: item.str("text")?.unwrap_or("").to_owned(),
                                cache_control: item.get("cache_control").cloned(),
                            }),
                            "image" => {
                                parts.push(image(&item, item.get("cache_control").cloned())?)
                            }
                            other => {
                                return Err(ProtocolError::unsupported(
                                    item.path("type"),
                                    format!(
                                        "`{other}` is not supported in a tool result (text, image)"
                                    ),
                                ));
                            }
                        }
                    }
                    parts
                }
                Some(other) => {
                    return Err(ProtocolError::wrong_type(
                        b.path("content"),
                        "a string or an array of blocks",
                        other,
                    ));
                }
            };
            Ok(Part::ToolResult(ToolResult {
                tool_call_id: b.req_str("tool_use_id")?.to_owned(),
                content,
                is_error: b.bool("is_error")?.unwrap_or(false),
                cache_control,
            }))
        }
    }
}

fn image(b: &Obj, cache_control: Option<Value>) -> Result<Part, ProtocolError> {
    let s_path = b.path("source");
    let s = Obj::at(b.get("source").ok_or_else(|| b.missing("source"))?, &s_path)?;
    let source = match s.req_str("type")? {
        "base64" => ImageSource::Base64 {
            media_type: s.req_str("media_type")?.to_owned(),
            data: s.req_str("data")?.to_owned(),
        },
        "url" => ImageSource::Url(s.req_str("url")?.to_owned()),
        other => {
            return Err(ProtocolError::unsupported(
                s.path("type"),
                format!("`{other}` is not supported (base64, url)"),
            ));
        }
    };
    Ok(Part::Image {
        source,
        detail: None,
        cache_control,
    })
}

fn tools(body: &Obj) -> Result<Vec<Tool>, ProtocolError> {
    let Some(raw) = body.array("tools")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(raw.len());
    for (i, t) in raw.iter().enumerate() {
        let path = format!("tools[{i}]");
        let t = Obj::at(t, &path)?;
        match t.str("type")? {
            None | Some("custom") => {}
            Some(other) => {
                return Err(ProtocolError::unsupported(
                    t.path("type"),
                    format!(
                        "`{other}` is not supported; only client tools with `input_schema` are"
                    ),
                ));
            }
        }
        out.push(Tool {
            name: t.req_str("name")?.to_owned(),
            description: t.str("description")?.map(str::to_owned),
            parameters: t
                .get("input_schema")
                .cloned()
                .ok_or_else(|| t.missing("input_schema"))?,
            strict: None,
            cache_control: t.get("cache_control").cloned(),
        });
    }
    Ok(out)
}

/// The body for an Anthropic upstream.
pub fn build_request(r: &Request, provider_model_id: &str) -> Vec<u8> {
    let mut body = if r.source == Dialect::AnthropicMessages {
        r.extra.clone()
    } else {
        Map::new()
    };
    body.insert("model".into(), provider_model_id.into());
    let mut max_tokens = r.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS).max(1);
    let mut budget = r
        .reasoning
        .as_ref()
        .and_then(Reasoning::effective_budget)
        .map(|b| b.max(MIN_THINKING_BUDGET));
    // The budget is part of `max_tokens` and must be smaller: a budget that does not fit a limit
    // the client set shrinks (or thinking stays off); the default limit grows instead.
    if let Some(b) = budget
        && b >= max_tokens
    {
        if r.max_output_tokens.is_none() {
            max_tokens = b.saturating_add(DEFAULT_MAX_TOKENS);
        } else if max_tokens > MIN_THINKING_BUDGET {
            budget = Some(max_tokens - 1);
        } else {
            budget = None;
        }
    }
    body.insert("max_tokens".into(), max_tokens.into());
    if let Some(b) = budget {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": b}),
        );
    }
    if let Some(system) = system_value(&r.messages) {
        body.insert("system".into(), system);
    }
    // Written by `Turns` as the body is serialized.
    body.insert("messages".into(), Value::Null);
    if !r.tools.is_empty() {
        let tools = r
            .tools
            .iter()
            .map(|t| {
                let mut o = Map::new();
                o.insert("name".into(), t.name.clone().into());
                put(&mut o, "description", t.description.clone());
                o.insert("input_schema".into(), input_schema(&t.parameters));
                put(&mut o, "cache_control", t.cache_control.clone());
                Value::Object(o)
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let mut choice = match &r.tool_choice {
            None | Some(ToolChoice::Auto) => json!({"type": "auto"}),
            Some(ToolChoice::None) => json!({"type": "none"}),
            Some(ToolChoice::Required) => json!({"type": "any"}),
            Some(ToolChoice::Function(name)) => json!({"type": "tool", "name": name}),
        };
        let no_parallel = r.parallel_tool_calls == Some(false)
            && !matches!(r.tool_choice, Some(ToolChoice::None));
        if no_parallel && let Value::Object(c) = &mut choice {
            c.insert("disable_parallel_tool_use".into(), true.into());
        }
        if r.tool_choice.is_some() || no_parallel {
            body.insert("tool_choice".into(), choice);
        }
    }
    // Anthropic's range is 0..=1 where OpenAI's is 0..=2; out-of-range values would be rejected.
    put(
        &mut body,
        "temperature",
        r.temperature.map(|t| json::num(t.clamp(0.0, 1.0))),
    );
    put(&mut body, "top_p", r.top_p.map(json::num));
    put(&mut body, "top_k", r.top_k);
    if !r.stop.is_empty() {
        body.insert("stop_sequences".into(), r.stop.clone().into());
    }
    if let Some(user) = &r.user {
        body.insert("metadata".into(), json!({"user_id": user}));
    }
    if r.stream {
        body.insert("stream".into(), true.into());
    } else {
        body.remove("stream");
    }
    let turns = Turns::of(&r.messages);
    json::to_vec_with(&body, "messages", &turns, r.json_size_hint())
}

/// Anthropic requires an object schema at the top.
fn input_schema(parameters: &Value) -> Value {
    match parameters {
        Value::Object(o) if o.contains_key("type") => parameters.clone(),
        Value::Object(o) => {
            let mut o = o.clone();
            o.insert("type".into(), "object".into());
            Value::Object(o)
        }
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// All system and developer text, wherever it stood (Anthropic has only a top-level `system`).
fn system_value(messages: &[Message]) -> Option<Value> {
    let parts: Vec<&Part> = messages
        .iter()
        .filter(|m| matches!(m.role, Role::System | Role::Developer))
        .flat_map(|m| m.content.iter())
        .filter(|p| matches!(p, Part::Text { text, .. } if !text.is_empty()))
        .collect();
    match parts.as_slice() {
        [] => None,
        [
            Part::Text {
                text,
                cache_control: None,
            },
        ] => Some(text.clone().into()),
        many => Some(Value::Array(
            many.iter().filter_map(|p| block_value(p)).collect(),
        )),
    }
}

/// The `messages` of an upstream body: user and assistant turns, serialized one block's tree at a
/// time (a turn can hold a whole conversation of one role).
struct Turns<'a>(Vec<(&'static str, Vec<&'a Message>)>);

impl<'a> Turns<'a> {
    fn of(messages: &'a [Message]) -> Self {
        let mut out: Vec<(&'static str, Vec<&Message>)> = Vec::new();
        for m in messages {
            let role = match m.role {
                Role::System | Role::Developer => continue,
                Role::User | Role::Tool => "user",
                Role::Assistant => "assistant",
            };
            if !m.content.iter().any(is_block) {
                continue;
            }
            // Anthropic wants user and assistant turns to alternate: neighbours of one role merge
            // (tool results and the user text after them become one user turn).
            match out.last_mut() {
                Some((last, turn)) if *last == role => turn.push(m),
                _ => out.push((role, vec![m])),
            }
        }
        Turns(out)
    }
}

impl serde::Serialize for Turns<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for (role, messages) in &self.0 {
            seq.serialize_element(&Turn { role, messages })?;
        }
        seq.end()
    }
}

/// One user or assistant turn: `{"content": [blocks], "role": role}`.
struct Turn<'a> {
    role: &'static str,
    messages: &'a [&'a Message],
}

impl serde::Serialize for Turn<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("content", &Blocks(self.messages))?;
        map.serialize_entry("role", self.role)?;
        map.end()
    }
}

/// The blocks of a turn's messages, each built just before it is written.
struct Blocks<'a>(&'a [&'a Message]);

impl serde::Serialize for Blocks<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(None)?;
        for part in self.0.iter().flat_map(|m| m.content.iter()) {
            if let Some(block) = block_value(part) {
                seq.serialize_element(&block)?;
            }
        }
        seq.end()
    }
}

/// Whether [`block_value`] gives a block for `p`.
fn is_block(p: &Part) -> bool {
    match p {
        Part::Text { text, .. } => !text.is_empty(),
        Part::Audio { .. } | Part::Video { .. } => false,
        Part::Reasoning { signature, .. } => signature.is_some(),
        Part::Image { .. }
        | Part::RedactedReasoning { .. }
        | Part::ToolCall(_)
        | Part::ToolResult(_) => true,
    }
}

/// The Anthropic block for a part; `None` for what Anthropic cannot take (audio, video, unsigned
/// reasoning, empty text).
fn block_value(p: &Part) -> Option<Value> {
    let with_cache = |mut v: Value, cache: &Option<Value>| {
        if let (Value::Object(o), Some(c)) = (&mut v, cache) {
            o.insert("cache_control".into(), c.clone());
        }
        v
    };
    match p {
        Part::Text {
            text,
            cache_control,
        } if !text.is_empty() => Some(with_cache(
            json!({"type": "text", "text": text}),
            cache_control,
        )),
        Part::Text { .. } | Part::Audio { .. } | Part::Video { .. } => None,
        Part::Image {
            source,
            cache_control,
            ..
        } => {
            let source = match source {
                ImageSource::Url(url) => json!({"type": "url", "url": url}),
                ImageSource::Base64 { media_type, data } => {
                    json!({"type": "base64", "media_type": media_type, "data": data})
                }
            };
            Some(with_cache(
                json!({"type": "image", "source": source}),
                cache_control,
            ))
        }
        Part::Reasoning {
            text,
            signature: Some(signature),
        } => Some(json!({"type": "thinking", "thinking": text, "signature": signature})),
        Part::Reasoning {
            signature: None, ..
        } => None,
        Part::RedactedReasoning { data } => {
            Some(json!({"type": "redacted_thinking", "data": data}))
        }
        Part::ToolCall(c) => Some(json!({
            "type": "tool_use",
            "id": ids::tool_use_id(&c.id),
            "name": c.name,
            "input": arguments_object(&c.arguments),
        })),
        Part::ToolResult(r) => {
            let content = match r.content.as_slice() {
                [
                    Part::Text {
                        text,
                        cache_control: None,
                    },
                ] => Value::String(text.clone()),
                parts => Value::Array(parts.iter().filter_map(block_value).collect()),
            };
            let mut o = json!({
                "type": "tool_result",
                "tool_use_id": ids::tool_use_id(&r.tool_call_id),
                "content": content,
            });
            if r.is_error
                && let Value::Object(m) = &mut o
            {
                m.insert("is_error".into(), true.into());
            }
            Some(with_cache(o, &r.cache_control))
        }
    }
}

/// Tool-call arguments as the object Anthropic's `input` must be; arguments that are not a JSON
/// object (a model's malformed output) become `{}`.
pub(super) fn arguments_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

#[cfg(test)]
mod tests;
