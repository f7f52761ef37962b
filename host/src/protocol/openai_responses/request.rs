//! Responses requests ↔ IR.

use serde_json::{Map, Value, json};

use crate::protocol::ir::{
    Effort, Message, Part, Reasoning, Request, ResponseFormat, Role, Tool, ToolCall, ToolChoice,
    ToolResult,
};
use crate::protocol::json::{self, Limits, Obj, put};
use crate::protocol::openai_chat::empty_schema;
use crate::protocol::openai_parts::{Parts, content};
use crate::protocol::{Dialect, ProtocolError};

/// The smallest `max_output_tokens` the Responses API accepts.
const MIN_OUTPUT_TOKENS: u32 = 16;

/// Top-level fields the IR models. `text` is missing on purpose: besides `format` (modeled) it
/// carries `verbosity`, so it stays in `extra` and the builder only replaces its `format`.
const MODELED: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "reasoning",
    "metadata",
    "user",
    "stream",
];

const STATELESS: &str = "this gateway is stateless: send the whole conversation in `input`";

/// Parses and validates a client's Responses body within the default [`Limits`].
pub fn parse_request(bytes: &[u8]) -> Result<Request, ProtocolError> {
    parse_request_within(bytes, Limits::DEFAULT)
}

/// [`parse_request`] within `limits`, which are checked as the body is read.
pub fn parse_request_within(bytes: &[u8], limits: Limits) -> Result<Request, ProtocolError> {
    parse_request_fields(bytes, limits).map(|(request, _)| request)
}

/// [`parse_request_within`], with where the body's top-level entries are (when its reader
/// recorded them), for a pass-through upstream body.
pub fn parse_request_fields(
    bytes: &[u8],
    limits: Limits,
) -> Result<(Request, Option<json::BodyFields>), ProtocolError> {
    let mut lazy = json::Lazy::parse(bytes, "input", limits)?;
    let body = lazy.body()?;
    let model = body.req_str("model")?;
    if body.has("previous_response_id") {
        return Err(ProtocolError::unsupported(
            "previous_response_id",
            format!("is not supported; {STATELESS}"),
        ));
    }
    if body.has("conversation") {
        return Err(ProtocolError::unsupported(
            "conversation",
            format!("is not supported; {STATELESS}"),
        ));
    }
    let mut messages = Vec::new();
    if let Some(instructions) = body.str("instructions")? {
        messages.push(Message::text(Role::System, instructions));
    }
    match (lazy.list_len(), body.get("input")) {
        (Some(0), _) => return Err(ProtocolError::invalid("input", "must not be empty")),
        (Some(n), _) => {
            messages.reserve(n);
            lazy.each(|i, item| input_item(item, &format!("input[{i}]"), &mut messages))?;
        }
        (None, None) => return Err(ProtocolError::missing("input")),
        (None, Some(Value::String(s))) => messages.push(Message::text(Role::User, s.as_str())),
        (None, Some(other)) => {
            return Err(ProtocolError::wrong_type(
                "input",
                "a string or an array of items",
                other,
            ));
        }
    }
    let mut r = Request::new(model, Dialect::OpenAiResponses, messages);
    r.tools = tools(&body)?;
    r.tool_choice = tool_choice(&body)?;
    r.parallel_tool_calls = body.bool("parallel_tool_calls")?;
    r.temperature = body.f64("temperature")?;
    r.top_p = body.f64("top_p")?;
    r.max_output_tokens = body.u32("max_output_tokens")?;
    if let Some(t) = body.get("text") {
        let t = Obj::at(t, "text")?;
        if let Some(f) = t.get("format") {
            r.response_format = Some(format(&Obj::at(f, "text.format")?)?);
        }
    }
    if let Some(reasoning) = body.get("reasoning") {
        let o = Obj::at(reasoning, "reasoning")?;
        let effort = match o.str("effort")? {
            None => None,
            Some(e) => Some(Effort::parse(e).ok_or_else(|| {
                ProtocolError::invalid(
                    "reasoning.effort",
                    format!("must be none, minimal, low, medium, high or xhigh; not `{e}`"),
                )
            })?),
        };
        r.reasoning = Some(Reasoning {
            effort,
            budget_tokens: None,
            summary: o.str("summary")?.map(str::to_owned),
        });
    }
    if let Some(m) = body.object("metadata")? {
        r.metadata = m.clone();
    }
    r.user = body.str("user")?.map(str::to_owned);
    r.stream = body.bool("stream")?.unwrap_or(false);
    r.extra = json::extra(body.map, MODELED);
    Ok((r, lazy.take_fields()))
}

/// Appends one input item: a message, or a function call / output / reasoning that joins the
/// assistant or tool message before it.
fn input_item(v: &Value, path: &str, out: &mut Vec<Message>) -> Result<(), ProtocolError> {
    let item = Obj::at(v, path)?;
    let kind = match item.str("type")? {
        Some(k) => k,
        None if item.has("role") => "message",
        None => return Err(item.missing("type")),
    };
    match kind {
        "message" => {
            let role = match item.req_str("role")? {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "system" => Role::System,
                "developer" => Role::Developer,
                other => {
                    return Err(ProtocolError::invalid(
                        item.path("role"),
                        format!("must be user, assistant, system or developer; not `{other}`"),
                    ));
                }
            };
            let content = content(item.get("content"), &item.path("content"), Parts::Responses)?;
            if role == Role::Assistant {
                assistant(out).content.extend(content);
            } else {
                out.push(Message {
                    role,
                    content,
                    name: None,
                });
            }
        }
        "function_call" => {
            let call = ToolCall {
                id: item.req_str("call_id")?.to_owned(),
                name: item.req_str("name")?.to_owned(),
                arguments: item.str("arguments")?.unwrap_or("").to_owned(),
            };
            assistant(out).content.push(Part::ToolCall(call));
        }
        "function_call_output" => {
            // A string or parts, read exactly like a message's content.
            let content = content(item.get("output"), &item.path("output"), Parts::Responses)?;
            let result = Part::ToolResult(ToolResult {
                tool_call_id: item.req_str("call_id")?.to_owned(),
                content,
                is_error: false,
                cache_control: None,
            });
            match out.last_mut() {
                Some(m) if m.role == Role::Tool => m.content.push(result),
                _ => out.push(Message {
                    role: Role::Tool,
                    content: vec![result],
                    name: None,
                }),
            }
        }
        "reasoning" => {
            // Replayed reasoning (clients append `response.output` to `input`): its text is kept,
            // but it reaches no upstream (see docs/translation.md).
            let texts = |key: &str| -> String {
                item.get(key)
                    .and_then(Value::as_array)
                    .map(|parts| {
                        parts
                            .iter()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n\n")
                    })
                    .unwrap_or_default()
            };
            let mut text = texts("content");
            if text.is_empty() {
                text = texts("summary");
            }
            assistant(out).content.push(Part::Reasoning {
                text,
                signature: None,
            });
        }
        "item_reference" => {
            return Err(ProtocolError::unsupported(
                item.path("type"),
                format!("`item_reference` is not supported; {STATELESS}"),
            ));
        }
        other => {
            return Err(ProtocolError::unsupported(
                item.path("type"),
                format!(
                    "`{other}` is not supported (message, function_call, function_call_output, reasoning)"
                ),
            ));
        }
    }
    Ok(())
}

/// The assistant message to add to: the last message when it is one, else a new one.
fn assistant(out: &mut Vec<Message>) -> &mut Message {
    if out.last().is_none_or(|m| m.role != Role::Assistant) {
        out.push(Message {
            role: Role::Assistant,
            content: Vec::new(),
            name: None,
        });
    }
    let last = out.len() - 1;
    &mut out[last]
}

fn tools(body: &Obj) -> Result<Vec<Tool>, ProtocolError> {
    let Some(raw) = body.array("tools")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(raw.len());
    for (i, t) in raw.iter().enumerate() {
        let path = format!("tools[{i}]");
        let t = Obj::at(t, &path)?;
        match t.req_str("type")? {
            "function" => {}
            other => {
                return Err(ProtocolError::unsupported(
                    t.path("type"),
                    format!("`{other}` is not supported; only `function` tools are"),
                ));
            }
        }
        out.push(Tool {
            name: t.req_str("name")?.to_owned(),
            description: t.str("description")?.map(str::to_owned),
            parameters: t.get("parameters").cloned().unwrap_or_else(empty_schema),
            strict: t.bool("strict")?,
            cache_control: None,
        });
    }
    Ok(out)
}

fn tool_choice(body: &Obj) -> Result<Option<ToolChoice>, ProtocolError> {
    match body.get("tool_choice") {
        None => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(Some(ToolChoice::Auto)),
            "none" => Ok(Some(ToolChoice::None)),
            "required" => Ok(Some(ToolChoice::Required)),
            other => Err(ProtocolError::invalid(
                "tool_choice",
                format!("must be auto, none, required or a function; not `{other}`"),
            )),
        },
        Some(v) => {
            let o = Obj::at(v, "tool_choice")?;
            match o.req_str("type")? {
                "function" => Ok(Some(ToolChoice::Function(o.req_str("name")?.to_owned()))),
                other => Err(ProtocolError::unsupported(
                    "tool_choice.type",
                    format!("`{other}` is not supported; only `function` is"),
                )),
            }
        }
    }
}

fn format(f: &Obj) -> Result<ResponseFormat, ProtocolError> {
    match f.req_str("type")? {
        "text" => Ok(ResponseFormat::Text),
        "json_object" => Ok(ResponseFormat::JsonObject),
        "json_schema" => Ok(ResponseFormat::JsonSchema {
            name: f.req_str("name")?.to_owned(),
            description: f.str("description")?.map(str::to_owned),
            schema: f.get("schema").cloned().unwrap_or_else(empty_schema),
            strict: f.bool("strict")?,
        }),
        other => Err(ProtocolError::invalid(
            "text.format.type",
            format!("must be text, json_object or json_schema; not `{other}`"),
        )),
    }
}

/// The body for a Responses upstream.
pub fn build_request(r: &Request, provider_model_id: &str) -> Vec<u8> {
    let same = r.source == Dialect::OpenAiResponses;
    let mut body = if same { r.extra.clone() } else { Map::new() };
    body.insert("model".into(), provider_model_id.into());
    // Leading system text becomes `instructions`; later system messages keep their place.
    let leading = r
        .messages
        .iter()
        .take_while(|m| matches!(m.role, Role::System | Role::Developer))
        .count();
    let instructions: Vec<String> = r.messages[..leading]
        .iter()
        .map(Message::joined_text)
        .filter(|t| !t.is_empty())
        .collect();
    if !instructions.is_empty() {
        body.insert("instructions".into(), instructions.join("\n\n").into());
    }
    // Written by `InputItems` as the body is serialized.
    body.insert("input".into(), Value::Null);
    if !r.tools.is_empty() {
        let tools = r
            .tools
            .iter()
            .map(|t| {
                let mut o = Map::new();
                o.insert("type".into(), "function".into());
                o.insert("name".into(), t.name.clone().into());
                put(&mut o, "description", t.description.clone());
                o.insert("parameters".into(), t.parameters.clone());
                // Responses makes function tools strict unless told otherwise; schemas written for
                // other dialects rarely meet strict mode's rules.
                o.insert("strict".into(), t.strict.unwrap_or(false).into());
                Value::Object(o)
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        put(
            &mut body,
            "tool_choice",
            r.tool_choice.as_ref().map(|c| match c {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Function(name) => json!({"type": "function", "name": name}),
            }),
        );
        put(&mut body, "parallel_tool_calls", r.parallel_tool_calls);
    }
    put(&mut body, "temperature", r.temperature.map(json::num));
    put(&mut body, "top_p", r.top_p.map(json::num));
    put(
        &mut body,
        "max_output_tokens",
        r.max_output_tokens.map(|n| n.max(MIN_OUTPUT_TOKENS)),
    );
    if let Some(f) = &r.response_format {
        let format = match f {
            ResponseFormat::Text => json!({"type": "text"}),
            ResponseFormat::JsonObject => json!({"type": "json_object"}),
            ResponseFormat::JsonSchema {
                name,
                description,
                schema,
                strict,
            } => {
                let mut o = Map::new();
                o.insert("type".into(), "json_schema".into());
                o.insert("name".into(), name.clone().into());
                put(&mut o, "description", description.clone());
                o.insert("schema".into(), schema.clone());
                put(&mut o, "strict", *strict);
                Value::Object(o)
            }
        };
        let text = body
            .entry("text")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(t) = text {
            t.insert("format".into(), format);
        }
    }
    if let Some(reasoning) = &r.reasoning {
        let mut o = Map::new();
        put(
            &mut o,
            "effort",
            reasoning.effective_effort().map(Effort::as_str),
        );
        // A client of another dialect that asked for reasoning expects to see it; Responses only
        // shows reasoning as a summary.
        let summary = match (&reasoning.summary, same) {
            (Some(s), _) => Some(s.clone()),
            (None, false)
                if reasoning
                    .effective_effort()
                    .is_some_and(|e| e != Effort::None) =>
            {
                Some("auto".to_owned())
            }
            (None, _) => None,
        };
        put(&mut o, "summary", summary);
        if !o.is_empty() {
            body.insert("reasoning".into(), Value::Object(o));
        }
    }
    if !r.metadata.is_empty() {
        body.insert("metadata".into(), Value::Object(r.metadata.clone()));
    }
    put(&mut body, "user", r.user.clone());
    if r.stream {
        body.insert("stream".into(), true.into());
    } else {
        body.remove("stream");
    }
    // Nothing is stored upstream unless the client asked: the gateway never refers back to it.
    body.entry("store").or_insert(Value::Bool(false));
    let input = InputItems(&r.messages[leading..]);
    json::to_vec_with(&body, "input", &input, r.json_size_hint())
}

/// The `input` of an upstream body, serialized one message's items at a time.
struct InputItems<'a>(&'a [Message]);

impl serde::Serialize for InputItems<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(None)?;
        let mut items = Vec::new();
        for m in self.0 {
            push_items(&mut items, m);
            for v in items.drain(..) {
                seq.serialize_element(&v)?;
            }
        }
        seq.end()
    }
}

fn push_items(out: &mut Vec<Value>, m: &Message) {
    match m.role {
        Role::System | Role::Developer | Role::User => {
            let role = match m.role {
                Role::System => "system",
                Role::Developer => "developer",
                _ => "user",
            };
            let content: Vec<Value> = m.content.iter().filter_map(input_part).collect();
            out.push(json!({"type": "message", "role": role, "content": content}));
        }
        Role::Assistant => {
            // Earlier assistant text goes in the short message form (string content), which
            // needs no output item ids.
            let mut text = String::new();
            let flush = |text: &mut String, out: &mut Vec<Value>| {
                if !text.is_empty() {
                    out.push(json!({
                        "type": "message",
                        "role": "assistant",
                        "content": std::mem::take(text),
                    }));
                }
            };
            for p in &m.content {
                match p {
                    Part::Text { text: t, .. } => text.push_str(t),
                    Part::ToolCall(c) => {
                        flush(&mut text, out);
                        out.push(json!({
                            "type": "function_call",
                            "call_id": c.id,
                            "name": c.name,
                            "arguments": c.arguments,
                        }));
                    }
                    _ => {}
                }
            }
            flush(&mut text, out);
        }
        Role::Tool => {
            for p in &m.content {
                if let Part::ToolResult(r) = p {
                    let output = match r.content.as_slice() {
                        [] => Value::String(String::new()),
                        parts if parts.iter().all(|p| matches!(p, Part::Text { .. })) => {
                            Value::String(crate::protocol::ir::join_text(parts))
                        }
                        parts => Value::Array(parts.iter().filter_map(input_part).collect()),
                    };
                    out.push(json!({
                        "type": "function_call_output",
                        "call_id": r.tool_call_id,
                        "output": output,
                    }));
                }
            }
        }
    }
}

/// A user-side content part; `None` for what Responses cannot take (audio, video).
fn input_part(p: &Part) -> Option<Value> {
    match p {
        Part::Text { text, .. } => Some(json!({"type": "input_text", "text": text})),
        Part::Image { source, detail, .. } => Some(json!({
            "type": "input_image",
            "image_url": source.to_url(),
            "detail": detail.as_deref().unwrap_or("auto"),
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(r: &Request) -> Value {
        serde_json::from_slice(&build_request(r, "up")).unwrap()
    }

    #[test]
    fn stateful_fields_are_rejected() {
        let err = parse_request(br#"{"model":"m","input":"x","previous_response_id":"resp_1"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`previous_response_id` is not supported"),
            "{err}"
        );
        assert!(err.contains("stateless"));
        let err =
            parse_request(br#"{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}"#)
                .unwrap_err()
                .to_string();
        assert!(err.contains("item_reference"));
    }

    #[test]
    fn replayed_output_items_fold_into_messages() {
        let r = parse_request(
            br#"{"model":"m","instructions":"be brief","input":[
                {"role":"user","content":"weather?"},
                {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"think"}]},
                {"type":"function_call","id":"fc_1","call_id":"call_1","name":"w","arguments":"{}"},
                {"type":"function_call_output","call_id":"call_1","output":"sunny"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Sunny."}]}]}"#,
        )
        .unwrap();
        let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Assistant
            ]
        );
        let b = build(&r);
        assert_eq!(b["instructions"], "be brief");
        assert_eq!(b["store"], false);
        let types: Vec<&str> = b["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "message",
                "function_call",
                "function_call_output",
                "message"
            ]
        );
    }

    #[test]
    fn text_verbosity_survives_and_format_is_replaced() {
        let r = parse_request(
            br#"{"model":"m","input":"x","text":{"verbosity":"low","format":{"type":"json_object"}},"store":true}"#,
        )
        .unwrap();
        assert_eq!(r.response_format, Some(ResponseFormat::JsonObject));
        let b = build(&r);
        assert_eq!(
            b["text"],
            json!({"verbosity": "low", "format": {"type": "json_object"}})
        );
        assert_eq!(b["store"], true);
    }
}
