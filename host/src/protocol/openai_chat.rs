//! OpenAI Chat Completions (`POST /v1/chat/completions`).
//!
//! Through the IR: [`parse_request`], [`build_request`], [`parse_response`], [`build_response`],
//! [`StreamDecoder`], [`StreamEncoder`] and [`error_body`]. When client and upstream both speak
//! Chat Completions, `routing::dispatch` passes the body through with only `model` rewritten.

use serde_json::Value;

mod request;
mod response;
mod stream;

pub use request::{
    build_request, empty_schema, parse_request, parse_request_fields, parse_request_within,
};
pub use response::{build_response, parse_response, scan_response};
#[cfg(test)]
pub(crate) use response::{pull_response, scan_by_fields};
pub use stream::{StreamDecoder, StreamEncoder, is_plain_delta};

/// The error body of OpenAI's API for an HTTP status: `{"error":{"message","type","param","code"}}`.
pub fn error_body(status: u16, message: &str) -> Value {
    super::error_body_openai(status, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ir::Modalities;

    #[test]
    fn estimates_characters_over_four_and_flat_images() {
        let r = parse_request(
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"abcdefgh"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},{"role":"assistant","content":"abcd"}]}"#,
        )
        .unwrap();
        assert_eq!(r.prompt_token_estimate(), 3 + 85);
        assert!(r.modalities().contains(Modalities::IMAGE));
        assert!(!r.stream);
    }
}
