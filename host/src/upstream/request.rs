//! What goes on the wire for one attempt: the URL, the credential and the body.

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
    let body = PassThroughBody {
        body: &inbound.body,
        model: &upstream.provider_model_id,
        // Usage on Chat streams lets the gateway account tokens; the extra chunk is valid for clients.
        include_usage: dialect == Dialect::OpenAiChat && inbound.request.stream,
    };
    serde_json::to_vec(&body).unwrap_or_default()
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
            serde_json::from_slice::<serde_json::Value>(&out).expect("valid JSON")
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
