//! A chat request as it arrived, ready for any upstream.

use super::Dialect;
use super::{ir, json};

/// A chat request as it arrived: its dialect, its IR, and the body's bytes, which upstreams of the
/// same dialect get nearly verbatim.
#[derive(Debug, Clone)]
pub struct Inbound {
    pub dialect: Dialect,
    /// The IR; its `messages` are empty when no upstream needs them (see [`Inbound::new`]).
    pub request: ir::Request,
    /// The client's JSON object as sent (not a parsed tree: the bytes are the cheapest form of
    /// it, and a pass-through upstream body is written from their top-level fields); empty when
    /// no upstream speaks the client's dialect.
    pub body: bytes::Bytes,
    /// Where `body`'s top-level entries are, when its parse recorded them (see
    /// [`json::BodyFields`]); `None` makes a pass-through body read them from `body` again.
    pub fields: Option<json::BodyFields>,
    /// The gateway's estimate of the prompt's tokens.
    pub prompt_tokens: u32,
}

impl Inbound {
    /// The request, keeping only what upstreams speaking `upstreams` need: the body's bytes when
    /// one speaks the client's dialect (it gets them nearly verbatim), the IR's messages when one
    /// does not (its body is built from them). Holding both cost a large request a second copy
    /// of its body for as long as it was served.
    pub fn new(
        dialect: Dialect,
        mut request: ir::Request,
        body: bytes::Bytes,
        fields: Option<json::BodyFields>,
        upstreams: impl IntoIterator<Item = Dialect>,
    ) -> Self {
        let prompt_tokens = request.prompt_token_estimate();
        let (mut same, mut other) = (false, false);
        for upstream in upstreams {
            if upstream == dialect {
                same = true;
            } else {
                other = true;
            }
        }
        if !other {
            request.messages = Vec::new();
        }
        Self {
            dialect,
            request,
            body: if same { body } else { bytes::Bytes::new() },
            fields: if same { fields } else { None },
            prompt_tokens,
        }
    }
}
