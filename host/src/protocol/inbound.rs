//! A chat request as it arrived, ready for any upstream.

use super::Dialect;
use super::ir;

/// A chat request as it arrived: its dialect, its IR, and the parsed body, which upstreams of the
/// same dialect get nearly verbatim.
#[derive(Debug, Clone)]
pub struct Inbound {
    pub dialect: Dialect,
    pub request: ir::Request,
    pub body: serde_json::Map<String, serde_json::Value>,
    /// The gateway's estimate of the prompt's tokens.
    pub prompt_tokens: u32,
}
