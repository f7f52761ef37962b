//! Secrets: upstream keys kept as they are but shown masked, consumer keys and legacy tokens kept
//! as hashes.

use std::borrow::Cow;
use std::fmt;
use std::sync::LazyLock;

use regex::{Captures, Regex};

use serde::{Serialize, Serializer};

/// A secret that must be stored as is (it is sent upstream). `Debug` and `Serialize` show it
/// masked; only [`Secret::expose`] gives it out.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: impl Into<String>) -> Secret {
        Secret(secret.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn masked(&self) -> String {
        mask(&self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.masked())
    }
}

/// `sk-ab…yz`: enough to tell keys apart, too little to use one. Short secrets show nothing, as
/// seven of their characters would be most of them.
pub fn mask(secret: &str) -> String {
    let chars: Vec<char> = secret.chars().collect();
    if chars.len() < 12 {
        return "…".to_owned();
    }
    let head: String = chars[..5].iter().collect();
    let tail: String = chars[chars.len() - 2..].iter().collect();
    format!("{head}…{tail}")
}

/// `scheme://user:password@` anywhere in a text.
#[allow(
    clippy::expect_used,
    reason = "a literal pattern, checked by the tests"
)]
pub(crate) static URL_PASSWORD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*):([^/\s@]+)@")
        .expect("a literal pattern compiles")
});

pub(crate) fn url_password(c: &Captures) -> String {
    format!("{}:***@", &c[1])
}

/// A URL with its password masked (`https://user:***@host/v1`); other URLs unchanged. For every
/// place a configured `base_url` is shown or logged.
pub fn mask_url_password(url: &str) -> Cow<'_, str> {
    // A password needs its `@`; most URLs have none, and the regex cost ~600 instructions a
    // request where a dispatch names the upstream that answered.
    if !url.contains('@') {
        return Cow::Borrowed(url);
    }
    URL_PASSWORD.replace_all(url, url_password)
}

/// SHA-256, hex. Keys are long random strings, so a fast hash is enough: there is nothing to
/// brute-force that is easier than the key itself.
pub fn hash_secret(secret: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A new consumer API key: `sk-sy-` and 40 random alphanumerics (~238 bits).
pub fn generate_consumer_secret() -> String {
    use rand::Rng;
    let body: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(40)
        .map(char::from)
        .collect();
    format!("sk-sy-{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_in_json_and_debug() {
        let s = Secret::new("sk-abcdefghijklmnopqrstuvwxyz");
        assert_eq!(s.masked(), "sk-ab…yz");
        assert_eq!(serde_json::to_value(&s).unwrap(), "sk-ab…yz");
        assert_eq!(format!("{s:?}"), "sk-ab…yz");
        assert_eq!(mask("short"), "…");
    }

    #[test]
    fn consumer_secrets_are_random_and_prefixed() {
        let a = generate_consumer_secret();
        let b = generate_consumer_secret();
        assert!(a.starts_with("sk-sy-") && a.len() == 46, "{a}");
        assert_ne!(a, b);
        assert_eq!(hash_secret(&a).len(), 64);
    }
}
