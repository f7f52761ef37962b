//! What goes on the wire for one attempt: the URL, the credential and the body.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::config::{ModelUpstream, ProviderKind};
use crate::protocol::Dialect;
use crate::protocol::inbound::Inbound;

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
            let url = if base.ends_with("/v1") {
                format!("{base}/messages")
            } else {
                format!("{base}/v1/messages")
            };
            (url, UpstreamAuth::Anthropic(key))
        }
        other => (
            format!("{}{}", upstream.base_url, other.path()),
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
    // The top-level fields as slices of the client's bytes, in key order and the last of a
    // repeated key winning, as a parsed object would have them: the upstream body is written
    // straight from the client's, with no tree of it in between.
    let Ok(fields) = serde_json::from_slice::<BTreeMap<String, &RawValue>>(&inbound.body) else {
        // Unreachable for a parsed request (its body is a JSON object); the IR is then the source.
        return dialect.build_request(&inbound.request, &upstream.provider_model_id);
    };
    let body = RawPassThroughBody {
        fields: &fields,
        model: &upstream.provider_model_id,
        // Usage on Chat streams lets the gateway account tokens; the extra chunk is valid for clients.
        include_usage: dialect == Dialect::OpenAiChat && inbound.request.stream,
    };
    // Sized for the whole body up front: growing by doubling would copy it several times.
    let mut out = Vec::with_capacity(inbound.body.len() + 256);
    match serde_json::to_writer(&mut out, &body) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

/// [`PassThroughBody`] over the client's top-level fields as raw JSON.
struct RawPassThroughBody<'a> {
    fields: &'a BTreeMap<String, &'a RawValue>,
    model: &'a str,
    include_usage: bool,
}

impl serde::Serialize for RawPassThroughBody<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        let mut has_options = false;
        for (key, value) in self.fields {
            match key.as_str() {
                "model" => map.serialize_entry(key, self.model)?,
                "stream_options" if self.include_usage => {
                    has_options = true;
                    // Not an object (not usable as the client sent it): options of our own.
                    let options =
                        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(
                            value.get(),
                        )
                        .unwrap_or_default();
                    map.serialize_entry(key, &WithIncludeUsage(&options))?;
                }
                _ => map.serialize_entry(key, value)?,
            }
        }
        if !self.fields.contains_key("model") {
            map.serialize_entry("model", self.model)?;
        }
        if self.include_usage && !has_options {
            map.serialize_entry("stream_options", &WithIncludeUsage(&serde_json::Map::new()))?;
        }
        map.end()
    }
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
            // The chat path writes from the client's bytes; it must agree with the parsed form.
            let bytes = serde_json::to_vec(&map).expect("serialises");
            let fields: BTreeMap<String, &RawValue> = serde_json::from_slice(&bytes).expect("raw");
            let raw = serde_json::to_vec(&RawPassThroughBody {
                fields: &fields,
                model: "up/model",
                include_usage,
            })
            .expect("serialises");
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&raw).expect("valid JSON"),
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
