//! What goes on the wire for one attempt: the URL, the credential and the body.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::config::{ModelUpstream, ProviderKind};
use crate::protocol::inbound::Inbound;
use crate::protocol::{Dialect, json, scan};

use super::UpstreamAuth;

/// The dialect an upstream of this kind speaks.
pub fn upstream_dialect(kind: ProviderKind) -> Dialect {
    match kind {
        ProviderKind::OpenaiCompat => Dialect::OpenAiChat,
        ProviderKind::OpenaiResponses => Dialect::OpenAiResponses,
        ProviderKind::Anthropic => Dialect::AnthropicMessages,
    }
}

/// The URL and credential of a call to `upstream` in `dialect`; `credential` (a pass-through
/// route's client key) replaces the upstream's own key.
pub(super) fn endpoint<'a>(
    upstream: &'a ModelUpstream,
    dialect: Dialect,
    credential: Option<&'a str>,
) -> (String, UpstreamAuth<'a>) {
    let key = credential.or(upstream.api_key.as_deref());
    match dialect {
        // Anthropic base URLs conventionally stop before `/v1`.
        Dialect::AnthropicMessages => {
            let base = upstream.base_url.trim_end_matches('/');
            let path = if base.ends_with("/v1") {
                "/messages"
            } else {
                "/v1/messages"
            };
            ([base, path].concat(), UpstreamAuth::Anthropic(key))
        }
        // Joined, not `format!`ed: the formatting machinery cost ~650 instructions a request.
        other => (
            [upstream.base_url.as_str(), other.path()].concat(),
            UpstreamAuth::Bearer(key),
        ),
    }
}

/// The body for `upstream`: the client's own JSON with the upstream's model name when the dialects
/// match (fields the IR does not model reach the upstream untouched), else built from the IR.
pub(super) fn chat_body(inbound: &Inbound, upstream: &ModelUpstream, dialect: Dialect) -> Vec<u8> {
    if dialect != inbound.dialect {
        return dialect.build_request(&inbound.request, &upstream.provider_model_id);
    }
    // The top-level fields as slices of the client's bytes: the upstream body is written straight
    // from the client's, with no tree of it in between. Where the request's parse recorded them
    // they are read off the body; else the scan's reader finds them, and where it gives up (a
    // body nested deeper than it follows, say), `serde_json` does.
    let fields = inbound
        .fields
        .as_ref()
        .and_then(|fields| fields.entries(&inbound.body))
        .or_else(|| scan::object_entries(&inbound.body).map(as_bytes))
        .or_else(|| raw_fields(&inbound.body).map(as_bytes));
    let Some(fields) = fields else {
        // Unreachable for a parsed request (its body is a JSON object); the IR is then the source.
        return dialect.build_request(&inbound.request, &upstream.provider_model_id);
    };
    // Usage on Chat streams lets the gateway account tokens; the extra chunk is valid for clients.
    let include_usage = dialect == Dialect::OpenAiChat && inbound.request.stream;
    pass_through(
        fields,
        &upstream.provider_model_id,
        include_usage,
        inbound.body.len(),
    )
}

/// The top-level fields of a JSON object by `serde_json`, as [`scan::object_entries`] gives them.
fn raw_fields(body: &[u8]) -> Option<Vec<(Cow<'_, str>, &str)>> {
    let fields = serde_json::from_slice::<BTreeMap<String, &RawValue>>(body).ok()?;
    Some(
        fields
            .into_iter()
            .map(|(key, value)| (Cow::Owned(key), value.get()))
            .collect(),
    )
}

/// Entries with their values' text as bytes, as [`json::BodyFields::entries`] gives them.
fn as_bytes<'b>(fields: Vec<(Cow<'b, str>, &'b str)>) -> Vec<(Cow<'b, str>, &'b [u8])> {
    fields.into_iter().map(|(k, v)| (k, v.as_bytes())).collect()
}

/// Writes a client's top-level `fields` (each value as its JSON text) as an upstream body: in key
/// order with the last of a repeated key winning, as a parsed object would have them; the model
/// swapped for `model`; `stream_options.include_usage` added when asked for. `size` is the
/// client body's: the output is sized for it up front, as doubling would copy it several times.
fn pass_through(
    mut fields: Vec<(Cow<'_, str>, &[u8])>,
    model: &str,
    include_usage: bool,
    size: usize,
) -> Vec<u8> {
    // Stable: the entries of a repeated key keep their order, and the last is written.
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::with_capacity(size + 256);
    out.push(b'{');
    // An entry's start: the comma before all but the first, the key and the colon.
    let start = |out: &mut Vec<u8>, key: &str| {
        if out.len() > 1 {
            out.push(b',');
        }
        json::push_str(out, key);
        out.push(b':');
    };
    let (mut has_model, mut has_options) = (false, false);
    for (i, (key, raw)) in fields.iter().enumerate() {
        if fields.get(i + 1).is_some_and(|(next, _)| next == key) {
            continue;
        }
        start(&mut out, key);
        match key.as_ref() {
            "model" => {
                has_model = true;
                json::push_str(&mut out, model);
            }
            "stream_options" if include_usage => {
                has_options = true;
                // Not an object (not usable as the client sent it): options of our own.
                let options =
                    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(raw)
                        .unwrap_or_default();
                json::push(&mut out, &WithIncludeUsage(&options));
            }
            _ => out.extend_from_slice(raw),
        }
    }
    if !has_model {
        start(&mut out, "model");
        json::push_str(&mut out, model);
    }
    if include_usage && !has_options {
        start(&mut out, "stream_options");
        json::push(&mut out, &WithIncludeUsage(&serde_json::Map::new()));
    }
    out.push(b'}');
    out
}

/// An embeddings body: the client's own, with the upstream's model name.
pub(super) fn embeddings_body(
    body: &serde_json::Map<String, serde_json::Value>,
    upstream: &ModelUpstream,
) -> Vec<u8> {
    let body = PassThroughBody {
        body,
        model: &upstream.provider_model_id,
        include_usage: false,
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The client's body as it goes to a same-dialect upstream, written straight from the parsed
/// request: the model swapped, `stream_options.include_usage` added when asked for. Serialising
/// it this way spares a copy of the whole body (messages and all) per attempt.
struct PassThroughBody<'a> {
    body: &'a serde_json::Map<String, serde_json::Value>,
    model: &'a str,
    include_usage: bool,
}

impl serde::Serialize for PassThroughBody<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        // Absent, or not an object (not usable as the client sent it): options of our own.
        let no_options = serde_json::Map::new();
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.body {
            match key.as_str() {
                "model" => map.serialize_entry(key, self.model)?,
                "stream_options" if self.include_usage => {
                    let options = value.as_object().unwrap_or(&no_options);
                    map.serialize_entry(key, &WithIncludeUsage(options))?;
                }
                _ => map.serialize_entry(key, value)?,
            }
        }
        if !self.body.contains_key("model") {
            map.serialize_entry("model", self.model)?;
        }
        if self.include_usage && !self.body.contains_key("stream_options") {
            map.serialize_entry("stream_options", &WithIncludeUsage(&no_options))?;
        }
        map.end()
    }
}

/// `stream_options` with `include_usage: true` unless the client set it.
struct WithIncludeUsage<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl serde::Serialize for WithIncludeUsage<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.0 {
            map.serialize_entry(key, value)?;
        }
        if !self.0.contains_key("include_usage") {
            map.serialize_entry("include_usage", &true)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the request's parse found the body's top-level entries (as `Inbound` keeps them).
    fn recorded(body: &[u8]) -> Vec<(Cow<'_, str>, &[u8])> {
        let (_, fields) = crate::protocol::Dialect::OpenAiChat
            .parse_request_fields(body, json::Limits::default())
            .expect("parses");
        let fields = fields.expect("the scan's reader read it");
        let entries = fields.entries(body).expect("fits its body");
        // The record ends here: its keys are kept as copies, the values are the body's.
        entries
            .into_iter()
            .map(|(key, value)| (Cow::Owned(key.into_owned()), value))
            .collect()
    }

    #[test]
    fn a_repeated_key_is_written_once_with_its_last_value() {
        let body = br#"{ "model" : "a", "temperature":1, "model":"b", "temperature" : 0.5, "messages":[{"role":"user","content":"hi"}] }"#;
        let read = [
            scan::object_entries(body).map(as_bytes),
            raw_fields(body).map(as_bytes),
            Some(recorded(body)),
        ];
        for fields in read {
            let out = pass_through(fields.expect("read"), "up", false, body.len());
            assert_eq!(
                std::str::from_utf8(&out).expect("UTF-8"),
                r#"{"messages":[{"role":"user","content":"hi"}],"model":"up","temperature":0.5}"#
            );
        }
    }

    #[test]
    fn pass_through_body_swaps_the_model_and_asks_for_usage() {
        let body = |json: serde_json::Value, include_usage: bool| {
            let serde_json::Value::Object(map) = json else {
                panic!("test bodies are objects");
            };
            let out = serde_json::to_vec(&PassThroughBody {
                body: &map,
                model: "up/model",
                include_usage,
            })
            .expect("serialises");
            let out = serde_json::from_slice::<serde_json::Value>(&out).expect("valid JSON");
            // The chat path writes from the client's bytes, through the scan's reader or through
            // `serde_json` where the reader gives up; both must agree with the parsed form, byte
            // for byte with each other.
            let bytes = serde_json::to_vec(&map).expect("serialises");
            let by_reader = pass_through(
                as_bytes(scan::object_entries(&bytes).expect("read")),
                "up/model",
                include_usage,
                bytes.len(),
            );
            let by_serde_json = pass_through(
                as_bytes(raw_fields(&bytes).expect("read")),
                "up/model",
                include_usage,
                bytes.len(),
            );
            assert_eq!(by_reader, by_serde_json);
            if map.contains_key("messages") {
                let by_parse =
                    pass_through(recorded(&bytes), "up/model", include_usage, bytes.len());
                assert_eq!(by_reader, by_parse);
            }
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&by_reader).expect("valid JSON"),
                out
            );
            out
        };
        let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
        assert_eq!(
            body(
                serde_json::json!({"model": "pub", "messages": messages, "x_vendor": {"k": 1}}),
                false
            ),
            serde_json::json!({"model": "up/model", "messages": messages, "x_vendor": {"k": 1}})
        );
        assert_eq!(
            body(serde_json::json!({"model": "pub", "stream": true}), true),
            serde_json::json!({"model": "up/model", "stream": true, "stream_options": {"include_usage": true}})
        );
        // The client's own choice stands; other options are kept.
        assert_eq!(
            body(
                serde_json::json!({"model": "pub", "stream_options": {"include_usage": false, "other": 1}}),
                true
            ),
            serde_json::json!({"model": "up/model", "stream_options": {"include_usage": false, "other": 1}})
        );
        assert_eq!(
            body(
                serde_json::json!({"model": "pub", "stream_options": null}),
                true
            ),
            serde_json::json!({"model": "up/model", "stream_options": {"include_usage": true}})
        );
    }
}
