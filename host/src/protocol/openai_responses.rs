//! OpenAI Responses (`POST /v1/responses`), the stateless subset of the Open Responses shape:
//! requests, answers and streams ↔ IR.
//!
//! The gateway keeps no conversation state, so `previous_response_id` and `conversation` are
//! rejected and upstream requests are sent with `store: false`.

use serde_json::Value;

mod request;
mod response;
mod stream;

pub use request::{build_request, parse_request, parse_request_fields, parse_request_within};
pub use response::{build_response, parse_response, scan_response};
pub use stream::{StreamDecoder, StreamEncoder};

/// The error body of OpenAI's API (the Responses API shares Chat Completions' shape).
pub fn error_body(status: u16, message: &str) -> Value {
    super::error_body_openai(status, message)
}

/// The id of output item `index` of response `response_id` (`msg_…`, `fc_…`, `rs_…`). Derived
/// rather than random so that the same answer always renders the same way.
fn item_id(prefix: &str, response_id: &str, index: usize) -> String {
    let base = response_id.strip_prefix("resp_").unwrap_or(response_id);
    format!("{prefix}{base}_{index}")
}
