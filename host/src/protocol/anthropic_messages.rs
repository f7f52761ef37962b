//! Anthropic Messages (`POST /v1/messages`): requests, answers and streams ↔ IR.

use serde_json::{Value, json};

mod request;
mod response;
mod stream;

pub use request::{
    DEFAULT_MAX_TOKENS, build_request, parse_count_tokens_request, parse_request,
    parse_request_fields, parse_request_within,
};
pub use response::{build_response, parse_response, scan_response};
pub use stream::{StreamDecoder, StreamEncoder, is_plain_delta};

/// Anthropic's error body for an HTTP status: `{"type":"error","error":{"type","message"}}`.
pub fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        // Anthropic answers 529 when overloaded; a gateway's 503 (no capacity) means the same.
        503 | 529 => "overloaded_error",
        402..=499 => "invalid_request_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}
