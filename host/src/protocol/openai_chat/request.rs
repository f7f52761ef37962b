//! Chat Completions requests ↔ IR.

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use crate::protocol::ir::{
    Effort, Message, Part, Reasoning, Request, ResponseFormat, Role, Tool, ToolCall, ToolChoice,
    ToolResult,
};
use crate::protocol::json::{self, Limits, Obj, put};
use crate::protocol::openai_parts::{Parts, content};
use crate::protocol::{Dialect, ProtocolError};

/// Top-level fields the IR models; everything else goes to `Request::extra`.
///
/// `max_completion_tokens` is deliberately missing: it is read into `max_output_tokens` *and* kept in
/// `extra`, so that a Chat upstream receives the limit under the name the client used (OpenAI's
/// reasoning models reject `max_tokens`, many OpenAI-compatible servers only know `max_tokens`).
const MODELED: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "max_tokens",
    "stop",
    "response_format",
    "reasoning_effort",
    "metadata",
    "user",
    "stream",
];

/// Parses and validates a client's Chat Completions body within the default [`Limits`].
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
    let mut lazy = json::Lazy::parse_messages(bytes, limits)?;
    let body = lazy.body()?;
    let model = body.req_str("model")?;
    let count = match lazy.list_len() {
        Some(0) => return Err(ProtocolError::invalid("messages", "must not be empty")),
        Some(n) => n,
        None => {
            // Not an array: name its type, or say it is missing.
            body.array("messages")?;
            return Err(ProtocolError::missing("messages"));
        }
    };
    let mut messages = Vec::with_capacity(count);
    lazy.each_plain(|i, entry| {
        let m = match entry {
            json::Entry::Plain(m) => match plain_message(m) {
                Some(m) => m,
                None => return Ok(false),
            },
            json::Entry::Tree(m) => message(i, m)?,
        };
        messages.push(m);
        Ok(true)
    })?;
    let mut r = Request::new(model, Dialect::OpenAiChat, messages);
    r.tools = tools(&body)?;
    r.tool_choice = tool_choice(&body)?;
    r.parallel_tool_calls = body.bool("parallel_tool_calls")?;
    r.temperature = body.f64("temperature")?;
    r.top_p = body.f64("top_p")?;
    r.presence_penalty = body.f64("presence_penalty")?;
    r.frequency_penalty = body.f64("frequency_penalty")?;
    r.seed = body.i64("seed")?;
    r.max_output_tokens = match body.u32("max_completion_tokens")? {
        Some(n) => Some(n),
        None => body.u32("max_tokens")?,
    };
    r.stop = stop(&body)?;
    r.response_format = response_format(&body)?;
    if let Some(e) = body.str("reasoning_effort")? {
        let effort = Effort::parse(e).ok_or_else(|| {
            ProtocolError::invalid(
                "reasoning_effort",
                format!("must be none, minimal, low, medium, high or xhigh; not `{e}`"),
            )
        })?;
        r.reasoning = Some(Reasoning {
            effort: Some(effort),
            ..Default::default()
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

/// What [`message`] makes of a message of role, string content and name, for the roles whose
/// message that is all of; `None` for a role it must read as a tree (`tool`, or one to refuse).
fn plain_message(m: json::PlainMessage<'_>) -> Option<Message> {
    let role = match &*m.role {
        "system" => Role::System,
        "developer" => Role::Developer,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        _ => return None,
    };
    Some(Message {
        role,
        content: vec![Part::text(m.content)],
        name: m.name.map(Cow::into_owned),
    })
}

fn message(i: usize, v: &Value) -> Result<Message, ProtocolError> {
    let (path, content_path) = json::message_paths(i);
    let m = Obj::at(v, &path)?;
    let role = m.req_str("role")?;
    let name = m.str("name")?.map(str::to_owned);
    let (role, content) = match role {
        "system" | "developer" | "user" => {
            let role = match role {
                "system" => Role::System,
                "developer" => Role::Developer,
                _ => Role::User,
            };
            // Only an assistant turn may go without content (when it calls tools): a user turn
            // without any would be dropped by a translating builder, changing the conversation.
            let given = m.get("content").ok_or_else(|| m.missing("content"))?;
            (role, content(Some(given), &content_path, Parts::Chat)?)
        }
        "assistant" => {
            let mut parts = content(m.get("content"), &content_path, Parts::Chat)?;
            if let Some(refusal) = m.str("refusal")? {
                parts.push(Part::text(refusal));
            }
            if let Some(calls) = m.array("tool_calls")? {
                for (j, c) in calls.iter().enumerate() {
                    parts.push(Part::ToolCall(tool_call(
                        c,
                        &format!("{path}.tool_calls[{j}]"),
                    )?));
                }
            }
            (Role::Assistant, parts)
        }
        "tool" => {
            let tool_call_id = m.req_str("tool_call_id")?.to_owned();
            let content = content(m.get("content"), &content_path, Parts::Chat)?;
            (
                Role::Tool,
                vec![Part::ToolResult(ToolResult {
                    tool_call_id,
                    content,
                    is_error: false,
                    cache_control: None,
                })],
            )
        }
        "function" => {
            return Err(ProtocolError::unsupported(
                format!("{path}.role"),
                "`function` (legacy function calling) is not supported; use `tools` and role `tool`",
            ));
        }
        other => {
            return Err(ProtocolError::invalid(
                format!("{path}.role"),
                format!("must be system, developer, user, assistant or tool; not `{other}`"),
            ));
        }
    };
    Ok(Message {
        role,
        content,
        name,
    })
}

fn tool_call(v: &Value, path: &str) -> Result<ToolCall, ProtocolError> {
    let c = Obj::at(v, path)?;
    let f_path = c.path("function");
    let f = Obj::at(
        c.get("function").ok_or_else(|| c.missing("function"))?,
        &f_path,
    )?;
    Ok(ToolCall {
        id: c.req_str("id")?.to_owned(),
        name: f.req_str("name")?.to_owned(),
        arguments: arguments_text(f.get("arguments")),
    })
}

/// Arguments as JSON text; some clients send an object instead of its serialization.
pub(super) fn arguments_text(v: Option<&Value>) -> String {
    match v {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
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
            Some("function") | None => {}
            Some(other) => {
                return Err(ProtocolError::unsupported(
                    format!("{path}.type"),
                    format!("`{other}` is not supported; only `function` tools are"),
                ));
            }
        }
        let f_path = t.path("function");
        let f = Obj::at(
            t.get("function").ok_or_else(|| t.missing("function"))?,
            &f_path,
        )?;
        out.push(Tool {
            name: f.req_str("name")?.to_owned(),
            description: f.str("description")?.map(str::to_owned),
            parameters: f.get("parameters").cloned().unwrap_or_else(empty_schema),
            strict: f.bool("strict")?,
            cache_control: None,
        });
    }
    Ok(out)
}

/// The schema of a function without parameters.
pub fn empty_schema() -> Value {
    json!({"type": "object", "properties": {}})
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
            match o.str("type")? {
                Some("function") => {}
                _ => {
                    return Err(ProtocolError::invalid(
                        "tool_choice.type",
                        "must be `function`",
                    ));
                }
            }
            let f_path = o.path("function");
            let f = Obj::at(
                o.get("function").ok_or_else(|| o.missing("function"))?,
                &f_path,
            )?;
            Ok(Some(ToolChoice::Function(f.req_str("name")?.to_owned())))
        }
    }
}

fn stop(body: &Obj) -> Result<Vec<String>, ProtocolError> {
    match body.get("stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str().map(str::to_owned).ok_or_else(|| {
                    ProtocolError::invalid("stop", "must be a string or an array of strings")
                })
            })
            .collect(),
        Some(other) => Err(ProtocolError::wrong_type(
            "stop",
            "a string or an array of strings",
            other,
        )),
    }
}

fn response_format(body: &Obj) -> Result<Option<ResponseFormat>, ProtocolError> {
    let Some(v) = body.get("response_format") else {
        return Ok(None);
    };
    let o = Obj::at(v, "response_format")?;
    match o.req_str("type")? {
        "text" => Ok(Some(ResponseFormat::Text)),
        "json_object" => Ok(Some(ResponseFormat::JsonObject)),
        "json_schema" => {
            let s_path = o.path("json_schema");
            let s = Obj::at(
                o.get("json_schema")
                    .ok_or_else(|| o.missing("json_schema"))?,
                &s_path,
            )?;
            Ok(Some(ResponseFormat::JsonSchema {
                name: s.req_str("name")?.to_owned(),
                description: s.str("description")?.map(str::to_owned),
                schema: s.get("schema").cloned().unwrap_or_else(empty_schema),
                strict: s.bool("strict")?,
            }))
        }
        other => Err(ProtocolError::invalid(
            "response_format.type",
            format!("must be text, json_object or json_schema; not `{other}`"),
        )),
    }
}

/// The body for a Chat Completions upstream.
pub fn build_request(r: &Request, provider_model_id: &str) -> Vec<u8> {
    let same = r.source == Dialect::OpenAiChat;
    let mut body = if same { r.extra.clone() } else { Map::new() };
    body.insert("model".into(), provider_model_id.into());
    // Written by `ChatMessages` as the body is serialized.
    body.insert("messages".into(), Value::Null);
    if !r.tools.is_empty() {
        let tools = r
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), t.name.clone().into());
                put(&mut f, "description", t.description.clone());
                f.insert("parameters".into(), t.parameters.clone());
                put(&mut f, "strict", t.strict);
                json!({"type": "function", "function": f})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        put(
            &mut body,
            "tool_choice",
            r.tool_choice.as_ref().map(tool_choice_value),
        );
        put(&mut body, "parallel_tool_calls", r.parallel_tool_calls);
    }
    put(&mut body, "temperature", r.temperature.map(json::num));
    put(&mut body, "top_p", r.top_p.map(json::num));
    put(
        &mut body,
        "presence_penalty",
        r.presence_penalty.map(json::num),
    );
    put(
        &mut body,
        "frequency_penalty",
        r.frequency_penalty.map(json::num),
    );
    put(&mut body, "seed", r.seed);
    if let Some(max) = r.max_output_tokens {
        let key = if body.contains_key("max_completion_tokens") {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        body.insert(key.into(), max.into());
    }
    if !r.stop.is_empty() {
        body.insert("stop".into(), r.stop.clone().into());
    }
    put(
        &mut body,
        "response_format",
        r.response_format.as_ref().map(response_format_value),
    );
    if let Some(e) = r.reasoning.as_ref().and_then(Reasoning::effective_effort) {
        body.insert("reasoning_effort".into(), e.as_str().into());
    }
    if !r.metadata.is_empty() {
        body.insert("metadata".into(), Value::Object(r.metadata.clone()));
    }
    put(&mut body, "user", r.user.clone());
    if r.stream {
        body.insert("stream".into(), true.into());
        // Usage on streams lets the gateway account tokens; the client's own options are kept.
        let options = body
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(o) = options {
            o.insert("include_usage".into(), true.into());
        }
    } else {
        body.remove("stream");
        body.remove("stream_options");
    }
    let messages = ChatMessages {
        messages: &r.messages,
        same,
    };
    json::to_vec_with(&body, "messages", &messages, r.json_size_hint())
}

/// The `messages` of an upstream body, serialized one message's tree at a time.
struct ChatMessages<'a> {
    messages: &'a [Message],
    same: bool,
}

impl serde::Serialize for ChatMessages<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(None)?;
        let mut one = Vec::new();
        for m in self.messages {
            push_message(&mut one, m, self.same);
            for v in one.drain(..) {
                seq.serialize_element(&v)?;
            }
        }
        seq.end()
    }
}

fn push_message(out: &mut Vec<Value>, m: &Message, same: bool) {
    let role = match m.role {
        Role::System => "system",
        // Only OpenAI itself is sure to know `developer`; OpenAI treats `system` the same way.
        Role::Developer if same => "developer",
        Role::Developer => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => {
            for p in &m.content {
                if let Part::ToolResult(r) = p {
                    out.push(json!({
                        "role": "tool",
                        "tool_call_id": r.tool_call_id,
                        "content": text_content(&r.content),
                    }));
                }
            }
            return;
        }
    };
    let mut msg = Map::new();
    msg.insert("role".into(), role.into());
    if m.role == Role::Assistant {
        let text = m.joined_text();
        let calls: Vec<Value> = m
            .content
            .iter()
            .filter_map(|p| match p {
                Part::ToolCall(c) => Some(json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })),
                _ => None,
            })
            .collect();
        let content = if text.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            text.into()
        };
        msg.insert("content".into(), content);
        if !calls.is_empty() {
            msg.insert("tool_calls".into(), Value::Array(calls));
        }
    } else {
        msg.insert("content".into(), user_content(&m.content));
    }
    put(&mut msg, "name", m.name.clone());
    out.push(Value::Object(msg));
}

/// A single text part as a string (the common form), anything else as an array of parts.
fn user_content(parts: &[Part]) -> Value {
    if let [Part::Text { text, .. }] = parts {
        return text.clone().into();
    }
    let parts: Vec<Value> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text, .. } => Some(json!({"type": "text", "text": text})),
            Part::Image { source, detail, .. } => {
                let mut image = Map::new();
                image.insert("url".into(), source.to_url().into());
                put(&mut image, "detail", detail.clone());
                Some(json!({"type": "image_url", "image_url": image}))
            }
            Part::Audio { data, format } => Some(
                json!({"type": "input_audio", "input_audio": {"data": data, "format": format}}),
            ),
            Part::Video { url } => Some(json!({"type": "video_url", "video_url": {"url": url}})),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        return "".into();
    }
    Value::Array(parts)
}

/// Tool message content: text only (Chat tool messages cannot carry images).
fn text_content(parts: &[Part]) -> Value {
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    match texts.as_slice() {
        [] => "".into(),
        [one] => (*one).into(),
        many => Value::Array(
            many.iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect(),
        ),
    }
}

fn tool_choice_value(c: &ToolChoice) -> Value {
    match c {
        ToolChoice::Auto => "auto".into(),
        ToolChoice::None => "none".into(),
        ToolChoice::Required => "required".into(),
        ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

fn response_format_value(f: &ResponseFormat) -> Value {
    match f {
        ResponseFormat::Text => json!({"type": "text"}),
        ResponseFormat::JsonObject => json!({"type": "json_object"}),
        ResponseFormat::JsonSchema {
            name,
            description,
            schema,
            strict,
        } => {
            let mut s = Map::new();
            s.insert("name".into(), name.clone().into());
            put(&mut s, "description", description.clone());
            s.insert("schema".into(), schema.clone());
            put(&mut s, "strict", *strict);
            json!({"type": "json_schema", "json_schema": s})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message read off its text is the message its tree makes, for every role taken that way;
    /// the others are declined (and read as trees). The same holds for whole bodies.
    #[test]
    fn plain_messages_read_as_their_trees_do() {
        let taken = [
            r#"{"role":"system","content":"s"}"#,
            r#"{"role":"developer","content":"d","name":"ops"}"#,
            r#"{"content":"caf\u00e9 \"q\"","role":"user"}"#,
            r#"{"role":"user","content":"","name":""}"#,
            r#"{"role":"assistant","content":"a"}"#,
        ];
        for raw in taken {
            let plain = json::PlainMessage::read(raw).expect(raw);
            let tree: Value = serde_json::from_str(raw).unwrap();
            assert_eq!(
                plain_message(plain),
                Some(message(0, &tree).unwrap()),
                "{raw}"
            );
        }
        for declined in [
            r#"{"role":"tool","content":"r"}"#,
            r#"{"role":"function","content":"f"}"#,
            r#"{"role":" user","content":"x"}"#,
            r#"{"role":"","content":"x"}"#,
        ] {
            let plain = json::PlainMessage::read(declined).expect(declined);
            assert_eq!(plain_message(plain), None, "{declined}");
        }
        let body = format!(
            r#"{{"model":"m","messages":[{},{{"role":"tool","content":"r","tool_call_id":"c"}}]}}"#,
            taken.join(",")
        );
        let r = parse_request(body.as_bytes()).unwrap();
        let list: Value = serde_json::from_str(&format!("[{}]", taken.join(","))).unwrap();
        let trees: Vec<Message> = list
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m).unwrap())
            .collect();
        assert_eq!(r.messages[..taken.len()], trees[..]);
        assert_eq!(r.messages[taken.len()].role, Role::Tool);
        let refused = parse_request(
            br#"{"model":"m","messages":[{"role":"user","content":"x"},{"role":"function","content":"f"}]}"#,
        )
        .unwrap_err();
        assert!(
            refused.to_string().starts_with("`messages[1].role`"),
            "{refused}"
        );
    }

    fn body(r: &Request) -> Value {
        serde_json::from_slice(&build_request(r, "up")).unwrap()
    }

    #[test]
    fn same_dialect_keeps_unknown_fields_and_the_max_tokens_name() {
        let r = parse_request(
            br#"{"model":"m","messages":[{"role":"developer","content":"d"},{"role":"user","content":"x"}],
                "n":2,"logprobs":true,"max_completion_tokens":9,"stream":true,
                "stream_options":{"include_usage":false}}"#,
        )
        .unwrap();
        let b = body(&r);
        assert_eq!(b["n"], 2);
        assert_eq!(b["logprobs"], true);
        assert_eq!(b["max_completion_tokens"], 9);
        assert!(b.get("max_tokens").is_none());
        assert_eq!(b["messages"][0]["role"], "developer");
        assert_eq!(b["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn other_dialects_get_max_tokens_and_system_for_developer() {
        let mut r = parse_request(
            br#"{"model":"m","messages":[{"role":"developer","content":"d"},{"role":"user","content":"x"}],"n":2,"max_tokens":5}"#,
        )
        .unwrap();
        r.source = Dialect::AnthropicMessages;
        let b = body(&r);
        assert!(b.get("n").is_none());
        assert_eq!(b["max_tokens"], 5);
        assert_eq!(b["messages"][0]["role"], "system");
        assert!(b.get("stream").is_none());
    }

    #[test]
    fn an_assistant_turn_that_only_calls_tools_needs_no_content() {
        let r = parse_request(
            br#"{"model":"m","messages":[{"role":"user","content":"w?"},
                {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
                {"role":"assistant","tool_calls":[{"id":"d","type":"function","function":{"name":"f","arguments":"{}"}}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.messages.len(), 3);
        assert!(matches!(r.messages[1].content[..], [Part::ToolCall(_)]));
    }

    #[test]
    fn rejects_what_it_cannot_translate() {
        for (body, reason) in [
            (
                r#"{"model":"m","messages":[{"role":"function","content":"x","name":"f"}]}"#,
                "legacy function calling",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{}}]}]}"#,
                "`messages[0].content[0].type` `file` is not supported",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"custom","custom":{}}]}"#,
                "only `function` tools",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"}"#,
                "`reasoning_effort` must be",
            ),
            (
                r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#,
                "`messages[0].tool_call_id` is required",
            ),
            // A turn without content would vanish on the way to Anthropic (issue #16 item 3).
            (
                r#"{"model":"m","messages":[{"role":"user"}]}"#,
                "`messages[0].content` is required",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":null}]}"#,
                "`messages[2].content` is required",
            ),
            (
                r#"{"model":"m","messages":[{"role":"system","content":null},{"role":"user","content":"x"}]}"#,
                "`messages[0].content` is required",
            ),
        ] {
            let err = parse_request(body.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(reason), "{err} should contain {reason}");
        }
    }
}
