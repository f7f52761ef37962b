//! Identifiers and timestamps the dialects put on answers.

use rand::Rng;

/// A random id with `prefix`, e.g. `resp_3fZ…` (24 alphanumeric characters, like the providers').
pub fn random(prefix: &str) -> String {
    let mut rng = rand::rng();
    let tail: String = (0..24)
        .map(|_| char::from(rng.sample(rand::distr::Alphanumeric)))
        .collect();
    format!("{prefix}{tail}")
}

/// `id` carrying the dialect's `prefix`: kept when it already has it, prefixed otherwise, random
/// when empty. Keeping the upstream's id (rather than inventing one) lets logs on both sides be
/// matched.
pub fn with_prefix(id: &str, prefix: &str) -> String {
    if id.is_empty() {
        random(prefix)
    } else if id.starts_with(prefix) {
        id.to_owned()
    } else {
        format!("{prefix}{id}")
    }
}

/// An id usable as an Anthropic `tool_use` id (`^[a-zA-Z0-9_-]+$`): other characters become `_`.
/// Applied to both the call and its result, so they still match.
pub fn tool_use_id(id: &str) -> String {
    if id.is_empty() {
        return random("toolu_");
    }
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_sanitizes() {
        assert_eq!(with_prefix("resp_1", "resp_"), "resp_1");
        assert_eq!(with_prefix("chatcmpl-1", "resp_"), "resp_chatcmpl-1");
        assert!(with_prefix("", "msg_").starts_with("msg_"));
        assert_eq!(random("x").len(), 25);
        assert_eq!(tool_use_id("call:a.b"), "call_a_b");
    }
}
