//! Keeping secrets out of what an upstream says.
//!
//! An upstream may echo what it received: its error body can hold the key the gateway sent
//! (a misconfigured proxy that prints its request, a provider that quotes the bad key), and a
//! transport error names the URL, password included. That text goes on to the client's error,
//! `/health/deep`, the log and `api_logs`, so it is masked once, before it leaves the attempt:
//! every credential the attempt sent, any `Authorization`/`x-api-key`/`api_key`/bearer-looking
//! value, `sk-…` tokens, and the password of any `scheme://user:password@` URL.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Captures, Regex};

use crate::entity::{URL_PASSWORD, mask, url_password};

use super::AttemptError;

/// A URL with its password masked, for every place a configured `base_url` is shown or logged.
pub use crate::entity::mask_url_password as url;

/// Shorter credentials are not searched for: replacing every occurrence of a three-letter string
/// would mangle the message and hide nothing worth hiding.
const MIN_SECRET_LEN: usize = 6;

/// Compiles one of the literal patterns below; the unit tests exercise each of them.
#[allow(clippy::expect_used, reason = "literal patterns, checked by the tests")]
fn pattern(source: &str) -> Regex {
    Regex::new(source).expect("a literal pattern compiles")
}

/// A header or field that carries a credential, then its value (after an optional scheme).
static CREDENTIAL_FIELD: LazyLock<Regex> = LazyLock::new(|| {
    pattern(
        r#"(?i)\b((?:proxy-)?authorization|x-api-key|api[_-]?key|access[_-]?token|secret[_-]?key)("?\s*[:=]\s*"?)(?:(bearer|basic|token)\s+)?([^"'\s,;&}<>]+)"#,
    )
});

/// `Bearer <token>` wherever it appears.
static BEARER: LazyLock<Regex> =
    LazyLock::new(|| pattern(r"(?i)\b(bearer)\s+([A-Za-z0-9._~+/=-]{6,})"));

/// OpenAI- and Anthropic-style keys (`sk-…`, `sk-ant-…`, `sk-proj-…`).
static SK_TOKEN: LazyLock<Regex> = LazyLock::new(|| pattern(r"\bsk-[A-Za-z0-9_-]{8,}"));

/// The credentials one attempt sent, and how to mask them and anything that looks like one.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// Masks `secrets` (each credential sent: the upstream's key, a pool key or a pass-through
    /// caller's own) besides the patterns every redactor masks.
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Self {
        let mut secrets: Vec<String> = secrets
            .into_iter()
            .map(str::trim)
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .map(str::to_owned)
            .collect();
        // Longest first, so a key that contains another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self { secrets }
    }

    /// `text` with every secret and credential-looking value masked.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), &mask(secret));
            }
        }
        redact_patterns(&out).into_owned()
    }

    /// The error with its upstream text masked; the kind and status are kept.
    pub fn error(&self, e: AttemptError) -> AttemptError {
        match e {
            AttemptError::Transport(t) => AttemptError::Transport(self.text(&t)),
            AttemptError::Status {
                status,
                body,
                retry_after,
            } => AttemptError::Status {
                status,
                body: self.text(&body),
                retry_after,
            },
            AttemptError::InvalidResponse(t) => AttemptError::InvalidResponse(self.text(&t)),
            AttemptError::EmptyStream(t) => AttemptError::EmptyStream(self.text(&t)),
            AttemptError::StreamFailed(t) => AttemptError::StreamFailed(self.text(&t)),
            // No upstream text in these: nothing to mask.
            e @ (AttemptError::Timeout(_)
            | AttemptError::FirstTokenTimeout(_)
            | AttemptError::IdleTimeout(_)
            | AttemptError::TotalTimeout(_)
            | AttemptError::ResponseTooLarge { .. }) => e,
        }
    }
}

/// `text` with credential-looking values and URL passwords masked (no known secrets: for text
/// that did not come from an attempt, such as a configured URL).
pub fn redact_patterns(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    for (pattern, replace) in [
        (&*URL_PASSWORD, url_password as fn(&Captures) -> String),
        (&*CREDENTIAL_FIELD, credential_field),
        (&*BEARER, bearer),
        (&*SK_TOKEN, sk_token),
    ] {
        let replaced = match pattern.replace_all(&out, replace) {
            Cow::Owned(replaced) => Some(replaced),
            Cow::Borrowed(_) => None,
        };
        if let Some(replaced) = replaced {
            out = Cow::Owned(replaced);
        }
    }
    out
}

fn credential_field(c: &Captures) -> String {
    let scheme = c
        .get(3)
        .map_or(String::new(), |s| format!("{} ", s.as_str()));
    format!("{}{}{scheme}{}", &c[1], &c[2], masked_value(&c[4]))
}

fn bearer(c: &Captures) -> String {
    format!("{} {}", &c[1], masked_value(&c[2]))
}

fn sk_token(c: &Captures) -> String {
    masked_value(&c[0])
}

/// A value already masked (it contains the ellipsis or is `***`) is left as it is.
fn masked_value(value: &str) -> String {
    if value.contains('…') || value.chars().all(|c| c == '*') {
        value.to_owned()
    } else {
        mask(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-upstream-0123456789abcdef";
    const POOL: &str = "pool-key-ZYXWVUTSRQ";
    const CALLER: &str = "caller-own-credential-42";

    #[test]
    fn every_sent_credential_and_every_credential_shape_is_masked() {
        let redactor = Redactor::new([KEY, POOL, CALLER]);
        let echoed = format!(
            r#"{{"error": "bad key {KEY}", "headers": {{"authorization": "Bearer {CALLER}",
            "x-api-key": "{POOL}"}}, "also": "Authorization: Bearer abcdefghijk123", "api_key=qwertyuiop123",
            "url": "https://alice:hunter2secret@proxy.example/v1", "other": "sk-ant-api03-AAAABBBBCCCCDDDD"}}"#
        );
        let out = redactor.text(&echoed);
        for secret in [
            KEY,
            POOL,
            CALLER,
            "abcdefghijk123",
            "qwertyuiop123",
            "hunter2secret",
            "sk-ant-api03-AAAABBBBCCCCDDDD",
        ] {
            assert!(!out.contains(secret), "{secret} survived in {out}");
        }
        // Still readable: the masks keep a head and a tail, and the URL keeps its user and host.
        assert!(out.contains("sk-up…ef"), "{out}");
        assert!(out.contains("https://alice:***@proxy.example/v1"), "{out}");
        assert!(out.contains("bad key"), "{out}");
    }

    #[test]
    fn errors_keep_their_kind_and_status() {
        let redactor = Redactor::new([KEY]);
        let e = redactor.error(AttemptError::Status {
            status: 401,
            body: format!("invalid key {KEY}"),
            retry_after: None,
        });
        assert_eq!(e.status(), 401);
        assert!(!e.to_string().contains(KEY), "{e}");
        let e = redactor.error(AttemptError::Transport(
            "error sending request for url (http://u:pw-123456@h/v1/chat/completions)".into(),
        ));
        assert_eq!(e.error_type(), "transport");
        assert!(!e.to_string().contains("pw-123456"), "{e}");
    }

    #[test]
    fn plain_text_and_short_values_are_left_alone() {
        let redactor = Redactor::new(["abc", ""]);
        let text = "upstream answered: model overloaded, try again (abc)";
        assert_eq!(redactor.text(text), text);
        assert_eq!(url("http://127.0.0.1:9001/v1"), "http://127.0.0.1:9001/v1");
        assert_eq!(url("https://user@host/v1"), "https://user@host/v1");
        assert_eq!(url("https://user:pass@host/v1"), "https://user:***@host/v1");
    }
}
