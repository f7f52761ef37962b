//! Reading what the gateway needs from an answer it relays unchanged (usage, model, and the shape
//! checks that decide a fallback) without building a `serde_json::Value` tree of it.
//!
//! A scan is a fast path only. It gives up (`None`) on anything unusual: a repeated key, a key
//! written with escapes, a wrong type anywhere it looks. The caller then runs the full parse,
//! whose verdict and error message stand. What a scan must never do is accept a body the full
//! parse rejects, or read other usage or another model than it: `fuzz.rs` checks that on every
//! body it generates, and the tests below on the bodies a generator does not write. So the values
//! a scan skips are still read as the tree would read them (every string's escapes and UTF-8,
//! every number's range, the nesting depth), only kept nowhere; `serde::de::IgnoredAny` would
//! skip them unread.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::ir::Usage;

mod reader;

pub(crate) use reader::{Pull, object_entries, plain_run, string_at};

/// What a relayed answer tells the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    pub usage: Usage,
    /// The model the upstream named; empty when it named none.
    pub model: String,
}

/// Scans `bytes` as `T`, or gives up; read by [`reader`], not `serde_json`, for speed.
pub(crate) fn scan<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Option<T> {
    reader::from_slice(bytes)
}

/// [`scan`] of a stream's event, whose text is UTF-8 already.
pub(crate) fn scan_str<'de, T: Deserialize<'de>>(text: &'de str) -> Option<T> {
    reader::from_str(text)
}

/// A token count as the full parse reads it: saturated to `u32`, zero when absent.
pub(crate) fn tokens(n: Option<u64>) -> u32 {
    n.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The reason a scan gives up; never shown to anyone (the full parse's error is).
fn give_up<E: de::Error>(why: &str) -> E {
    E::custom(why)
}

/// Any JSON value, read as `serde_json::Value` reads it and kept nowhere.
pub(crate) struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The scan's reader reads an ignored value whole (`Reader::skip`); a deserializer that
        // skips one unread must not be given a `Checked`.
        d.deserialize_ignored_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_key::<Checked>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

/// A string, borrowed from the body unless it was written with escapes.
pub(crate) struct Text<'de>(pub Cow<'de, str>);

impl Text<'_> {
    /// What `json::Obj::req_str` accepts: not empty after trimming.
    pub fn is_blank(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(TextVisitor)
    }
}

/// A string, checked and kept nowhere.
pub(crate) struct IsStr;

impl<'de> Deserialize<'de> for IsStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IsStrVisitor;
        impl<'de> Visitor<'de> for IsStrVisitor {
            type Value = IsStr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<IsStr, E> {
                Ok(IsStr)
            }
        }
        d.deserialize_str(IsStrVisitor)
    }
}

/// The keys of an object a scan reads; [`Object`] checks and skips the others.
pub(crate) trait Fields<'de>: Default {
    /// The keys [`Fields::read`] reads (at most 32).
    const KEYS: &'static [&'static str];

    /// Reads the value of `key`, one of [`Fields::KEYS`].
    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error>;

    /// Whether the object, read whole, is one the full parse accepts (its required keys are there).
    fn complete(&self) -> bool {
        true
    }
}

/// A JSON object read through `T`: only an object (a derived struct would also take an array),
/// each of `T`'s keys at most once (the tree keeps the last of a repeated key; a scan gives up).
/// A key `T` does not read has its value checked and skipped.
pub(crate) struct Object<T>(pub T);

impl<'de, T: Fields<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Fields<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = Object<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<T>, A::Error> {
        let mut fields = T::default();
        let mut seen = 0u32;
        while let Some(key) = map.next_key_seed(KeyIndex(T::KEYS))? {
            match key {
                Some(i) => {
                    let bit = 1u32 << i;
                    if seen & bit != 0 {
                        return Err(give_up("a repeated key"));
                    }
                    seen |= bit;
                    fields.read(T::KEYS[i], &mut map)?;
                }
                None => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        if fields.complete() {
            Ok(Object(fields))
        } else {
            Err(give_up("a required key is missing"))
        }
    }
}

/// An object's key as its position in a list of keys, if it is one; escapes are decoded, as the
/// tree decodes them.
struct KeyIndex(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeyIndex {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIndex {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<Option<usize>, E> {
        // Length and first byte before the bytes: most keys of a body are not in the list, and a
        // comparison of equal lengths calls `memcmp` (~25 instructions, a dozen a body).
        let first = key.as_bytes().first();
        Ok(self
            .0
            .iter()
            .position(|k| k.len() == key.len() && k.as_bytes().first() == first && *k == key))
    }
}

/// An array whose elements are each read as `T` and kept nowhere.
pub(crate) struct Each<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Each<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EachVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for EachVisitor<T> {
            type Value = Each<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Each<T>, A::Error> {
                while seq.next_element::<T>()?.is_some() {}
                Ok(Each(PhantomData))
            }
        }
        d.deserialize_seq(EachVisitor(PhantomData))
    }
}

/// A non-empty array whose first element is read as `T`; the others are checked.
pub(crate) struct First<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for First<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FirstVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for FirstVisitor<T> {
            type Value = First<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-empty array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<First<T>, A::Error> {
                let first = seq
                    .next_element::<T>()?
                    .ok_or_else(|| give_up("an empty array"))?;
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_seq(FirstVisitor(PhantomData))
    }
}

/// A value that must be absent or `null` (`json::Obj::get` reads `null` as absent); anything
/// else gives up.
pub(crate) fn expect_null<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    match map.next_value::<Option<Checked>>()? {
        None => Ok(()),
        Some(Checked) => Err(give_up("a value the full parse acts on")),
    }
}

/// The error for a key in `KEYS` that `read` does not handle: gives up, so the full parse runs.
pub(crate) fn unread<E: de::Error>(key: &str) -> E {
    E::custom(format_args!("the scan lists `{key}` but does not read it"))
}

/// OpenAI's usage object under Chat's names (`prompt_tokens`, …) or Responses' (`input_tokens`,
/// …). A scan reads both sets in either dialect, and each `*_details` key in both details
/// objects: a key it reads and the full parse ignores can only make it give up.
#[derive(Default)]
pub(crate) struct OpenAiUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    prompt_details: Option<Object<TokenDetails>>,
    completion_details: Option<Object<TokenDetails>>,
    input_details: Option<Object<TokenDetails>>,
    output_details: Option<Object<TokenDetails>>,
}

impl OpenAiUsage {
    /// As Chat Completions names it.
    pub fn chat(self) -> Usage {
        Self::usage(
            self.prompt_tokens,
            self.completion_tokens,
            self.prompt_details,
            self.completion_details,
        )
    }

    /// As Responses names it.
    pub fn responses(self) -> Usage {
        Self::usage(
            self.input_tokens,
            self.output_tokens,
            self.input_details,
            self.output_details,
        )
    }

    fn usage(
        input: Option<u64>,
        output: Option<u64>,
        input_details: Option<Object<TokenDetails>>,
        output_details: Option<Object<TokenDetails>>,
    ) -> Usage {
        Usage {
            input_tokens: tokens(input),
            output_tokens: tokens(output),
            cached_input_tokens: tokens(input_details.and_then(|d| d.0.cached_tokens)),
            cache_creation_input_tokens: 0,
            reasoning_tokens: tokens(output_details.and_then(|d| d.0.reasoning_tokens)),
        }
    }
}

impl<'de> Fields<'de> for OpenAiUsage {
    const KEYS: &'static [&'static str] = &[
        "prompt_tokens",
        "completion_tokens",
        "input_tokens",
        "output_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
        "input_tokens_details",
        "output_tokens_details",
    ];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "prompt_tokens" => self.prompt_tokens = map.next_value()?,
            "completion_tokens" => self.completion_tokens = map.next_value()?,
            "input_tokens" => self.input_tokens = map.next_value()?,
            "output_tokens" => self.output_tokens = map.next_value()?,
            "prompt_tokens_details" => self.prompt_details = map.next_value()?,
            "completion_tokens_details" => self.completion_details = map.next_value()?,
            "input_tokens_details" => self.input_details = map.next_value()?,
            "output_tokens_details" => self.output_details = map.next_value()?,
            other => return Err(unread(other)),
        }
        Ok(())
    }
}

/// The `*_tokens_details` objects of OpenAI usage.
#[derive(Default)]
struct TokenDetails {
    cached_tokens: Option<u64>,
    reasoning_tokens: Option<u64>,
}

impl<'de> Fields<'de> for TokenDetails {
    const KEYS: &'static [&'static str] = &["cached_tokens", "reasoning_tokens"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "cached_tokens" => self.cached_tokens = map.next_value()?,
            "reasoning_tokens" => self.reasoning_tokens = map.next_value()?,
            other => return Err(unread(other)),
        }
        Ok(())
    }
}

/// An embeddings answer: an object with a `data` array; the model is renamed in place and nothing
/// else is read.
#[derive(Default)]
struct EmbeddingsBody {
    data: bool,
}

impl<'de> Fields<'de> for EmbeddingsBody {
    const KEYS: &'static [&'static str] = &["data"];

    fn read<A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "data" => self.data = map.next_value::<Option<Each<Checked>>>()?.is_some(),
            other => return Err(unread(other)),
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.data
    }
}

/// Whether an upstream's embeddings answer is one to relay: a JSON object with a `data` array.
pub fn is_embeddings_answer(bytes: &[u8]) -> bool {
    if scan::<Object<EmbeddingsBody>>(bytes).is_some() {
        return true;
    }
    // The scan gives up on what it does not expect (a repeated `data`, say); the tree decides.
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .is_some_and(|v| v.get("data").is_some_and(serde_json::Value::is_array))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Dialect;

    /// A valid answer of each dialect, with `{extra}` where a test puts a key the parsers skip,
    /// and `{text}` inside a string they read.
    fn answer(d: Dialect, extra: &str, text: &str) -> String {
        let body = match d {
            Dialect::OpenAiChat => {
                r#"{"id":"c1","model":"m\/1",{extra}"choices":[{"index":0,"message":{"role":"assistant","content":"hi{text}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}}"#
            }
            Dialect::OpenAiResponses => {
                r#"{"id":"r1","object":"response","status":"completed","model":"m\/1",{extra}"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi{text}"}]}],"usage":{"input_tokens":5,"output_tokens":2,"input_tokens_details":{"cached_tokens":1}}}"#
            }
            Dialect::AnthropicMessages => {
                r#"{"id":"a1","type":"message","role":"assistant","model":"m\/1",{extra}"content":[{"type":"text","text":"hi{text}"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":2,"cache_read_input_tokens":1}}"#
            }
        };
        body.replace("{extra}", extra).replace("{text}", text)
    }

    fn summary_of_parse(d: Dialect, body: &[u8]) -> Result<Summary, String> {
        d.parse_response(body)
            .map(|r| Summary {
                usage: r.usage,
                model: r.model,
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn plain_answers_are_scanned_and_read_as_the_parse_reads_them() {
        for d in Dialect::ALL {
            let body = answer(d, "", "");
            let scanned = d.scan_response(body.as_bytes());
            assert!(scanned.is_some(), "{d}: a plain answer was not scanned");
            assert_eq!(
                scanned.map(Ok),
                Some(summary_of_parse(d, body.as_bytes())),
                "{d}"
            );
            let s = d.summarize_response(body.as_bytes()).unwrap();
            assert_eq!(s.model, "m/1", "{d}: escapes in the model are decoded");
            assert_eq!(s.usage.output_tokens, 2, "{d}");
            assert_eq!(s.usage.cached_input_tokens, 1, "{d}");
        }
    }

    /// Bodies the generator in `fuzz.rs` never writes (it serialises `Value`s): the tree rejects
    /// each, and so must the scan.
    #[test]
    fn what_the_tree_rejects_in_skipped_values_the_scan_rejects() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let cases: [(&str, &str); 6] = [
            (r#""skipped":"\ud800","#, "a lone surrogate"),
            (r#""skipped":1e400,"#, "a number out of range"),
            (r#""skipped":"\x","#, "an invalid escape"),
            (&format!(r#""skipped":{deep},"#), "nesting deeper than 128"),
            (
                "\"skipped\":\"tab\there\",",
                "a control character in a string",
            ),
            (r#""skipped":[1,],"#, "a trailing comma"),
        ];
        for d in Dialect::ALL {
            for (extra, what) in cases {
                let body = answer(d, extra, "");
                assert!(
                    d.parse_response(body.as_bytes()).is_err(),
                    "{d}: the tree accepts {what}; the case tests nothing"
                );
                assert!(
                    d.scan_response(body.as_bytes()).is_none(),
                    "{d}: the scan accepted {what}"
                );
                assert!(
                    d.summarize_response(body.as_bytes()).is_err(),
                    "{d}: {what}"
                );
            }
            let mut invalid_utf8 = answer(d, r#""skipped":"xx","#, "").into_bytes();
            let at = invalid_utf8
                .windows(2)
                .position(|w| w == b"xx")
                .expect("the marker");
            invalid_utf8[at] = 0xff;
            assert!(d.parse_response(&invalid_utf8).is_err(), "{d}");
            assert!(
                d.scan_response(&invalid_utf8).is_none(),
                "{d}: invalid UTF-8"
            );
            let trailing = format!("{} x", answer(d, "", ""));
            assert!(d.parse_response(trailing.as_bytes()).is_err(), "{d}");
            assert!(
                d.scan_response(trailing.as_bytes()).is_none(),
                "{d}: trailing data"
            );
        }
    }

    /// Bodies the tree reads in its own way (the last of a repeated key, an array where it wants
    /// an object): the scan gives up and the full parse decides.
    #[test]
    fn unusual_bodies_go_to_the_full_parse() {
        for d in Dialect::ALL {
            let repeated = answer(d, r#""model":"other","#, "");
            assert!(d.scan_response(repeated.as_bytes()).is_none(), "{d}");
            assert_eq!(
                d.summarize_response(repeated.as_bytes())
                    .map_err(|e| e.to_string()),
                summary_of_parse(d, repeated.as_bytes()),
                "{d}: the full parse's reading stands"
            );
            // Keys are compared decoded, as the tree stores them: this is `model` again.
            let escaped_key = answer(d, r#""\u006dodel":"other","#, "");
            assert!(d.scan_response(escaped_key.as_bytes()).is_none(), "{d}");
            assert!(d.summarize_response(escaped_key.as_bytes()).is_ok(), "{d}");
            // Escapes in skipped keys and in strings the scan reads are fine.
            let escapes = answer(d, r#""sk\u0069pped":"\ud83d\ude00","#, r#"\n\"\u00e9"#);
            assert_eq!(
                d.scan_response(escapes.as_bytes()).map(Ok),
                Some(summary_of_parse(d, escapes.as_bytes())),
                "{d}"
            );
            let array_body = format!("[{}]", answer(d, "", ""));
            assert!(d.scan_response(array_body.as_bytes()).is_none(), "{d}");
            assert!(d.summarize_response(array_body.as_bytes()).is_err(), "{d}");
        }
        // A choice written as an array: a derived struct would read it by position.
        let positional = r#"{"model":"m","choices":[[{"content":"x"}]]}"#;
        assert!(
            Dialect::OpenAiChat
                .scan_response(positional.as_bytes())
                .is_none()
        );
        assert!(
            Dialect::OpenAiChat
                .parse_response(positional.as_bytes())
                .is_err()
        );
    }

    #[test]
    fn upstream_errors_are_left_to_the_full_parse() {
        let cases = [
            (
                Dialect::OpenAiChat,
                r#"{"error":{"message":"overloaded"},"choices":[{"message":{"content":"x"}}]}"#,
            ),
            (
                Dialect::AnthropicMessages,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"overloaded"},"content":[]}"#,
            ),
            (
                Dialect::OpenAiResponses,
                r#"{"status":"failed","error":{"message":"overloaded"},"output":[]}"#,
            ),
            (
                Dialect::OpenAiResponses,
                r#"{"status":"completed","error":{"message":"overloaded"},"output":[]}"#,
            ),
        ];
        for (d, body) in cases {
            assert!(d.scan_response(body.as_bytes()).is_none(), "{d}: {body}");
            let e = d.summarize_response(body.as_bytes()).unwrap_err();
            assert!(e.to_string().contains("overloaded"), "{d}: {e}");
        }
        // `null` is absent to the full parse, and to the scan.
        let null_error = r#"{"error":null,"choices":[{"message":{"content":"x"}}]}"#;
        assert!(
            Dialect::OpenAiChat
                .scan_response(null_error.as_bytes())
                .is_some()
        );
    }

    #[test]
    fn embeddings_answers_need_a_data_array() {
        assert!(is_embeddings_answer(
            br#"{"object":"list","data":[{"embedding":[0.1,-2e-3]}],"model":"e"}"#
        ));
        // A repeated key goes to the tree, which keeps the last.
        assert!(is_embeddings_answer(br#"{"data":1,"data":[]}"#));
        assert!(!is_embeddings_answer(br#"{"data":[],"data":1}"#));
        for bad in [
            &br#"{"data":{}}"#[..],
            br#"{"data":null}"#,
            br#"{"object":"list"}"#,
            br#"[{"data":[]}]"#,
            br#"{"data":[1e400]}"#,
            b"not json",
        ] {
            assert!(
                !is_embeddings_answer(bad),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
