//! Why a body could not be read in its dialect.

use serde_json::Value;

use super::json::kind;

/// Why a request body, an upstream answer or a protocol name could not be read.
///
/// The `Display` text is the reason a client or a log sees, and its wording is part of the
/// interface: the gateway answers `400 invalid chat request body: {error}`, and tests assert the
/// text. Paths are JSON paths into the body, such as `messages[2].content[0].type`.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The bytes are not JSON.
    #[error("not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The body is JSON but not an object.
    #[error("the body must be a JSON object")]
    BodyNotObject,
    /// A required field is absent, `null`, or an empty string.
    #[error("`{path}` is required")]
    Missing { path: String },
    /// A field holds another JSON type than the dialect's; `expected` and `found` are in words
    /// (`a string or an array of parts`, `a number`).
    #[error("`{path}` must be {expected}, not {found}")]
    WrongType {
        path: String,
        expected: &'static str,
        found: &'static str,
    },
    /// A field has an acceptable type but a value the dialect does not allow (an unknown role or
    /// enum value, an empty list); `reason` reads after the path.
    #[error("`{path}` {reason}")]
    InvalidValue { path: String, reason: String },
    /// A field asks for something the dialect has but the gateway does not translate (legacy
    /// function calling, a part or tool type, stored conversation state); `reason` reads after the
    /// path and says what is accepted instead.
    #[error("`{path}` {reason}")]
    Unsupported { path: String, reason: String },
    /// The body is larger in structure than the gateway's limits allow; `what` says which limit
    /// and `key` is its config key (`server.max_messages`, `server.max_content_parts`).
    #[error("{what} (the gateway's limit, {key})")]
    TooLarge { what: String, key: &'static str },
    /// An upstream's 2xx answer is not what its dialect defines; the inner error says where. Its
    /// text is the inner error's, so a log reads the same as for a client's body.
    #[error("{0}")]
    InvalidResponse(Box<ProtocolError>),
    /// An upstream's 2xx answer is an error object instead of an answer; `message` is its own.
    #[error("upstream error: {message}")]
    Upstream { message: String },
    /// A protocol name that is none of `openai`, `openai_responses`, `anthropic`.
    #[error("unknown protocol `{0}`; expected openai, openai_responses or anthropic")]
    UnknownDialect(String),
}

impl ProtocolError {
    pub(crate) fn missing(path: impl Into<String>) -> Self {
        ProtocolError::Missing { path: path.into() }
    }

    pub(crate) fn wrong_type(path: impl Into<String>, expected: &'static str, got: &Value) -> Self {
        ProtocolError::WrongType {
            path: path.into(),
            expected,
            found: kind(got),
        }
    }

    pub(crate) fn invalid(path: impl Into<String>, reason: impl Into<String>) -> Self {
        ProtocolError::InvalidValue {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(path: impl Into<String>, reason: impl Into<String>) -> Self {
        ProtocolError::Unsupported {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// An upstream error object (`{"message": ...}`, or a bare string).
    pub(crate) fn upstream(error: &Value) -> Self {
        let message = match error {
            Value::String(s) => s.clone(),
            _ => match error.get("message").and_then(Value::as_str) {
                Some(m) => m.to_owned(),
                None => error.to_string(),
            },
        };
        ProtocolError::Upstream { message }
    }

    /// This error, found while reading an upstream's answer: wrapped as
    /// [`ProtocolError::InvalidResponse`] unless the upstream said it failed.
    pub(crate) fn in_response(self) -> Self {
        match self {
            e @ (ProtocolError::Upstream { .. } | ProtocolError::InvalidResponse(_)) => e,
            e => ProtocolError::InvalidResponse(Box::new(e)),
        }
    }
}
