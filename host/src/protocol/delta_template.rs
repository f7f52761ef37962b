//! A stream's text deltas read by their shape instead of parsed.
//!
//! An upstream writes every text delta of a stream alike: the same id, model and timestamp, the
//! same keys in the same order, only the text differs (`{"id":"c1",…,"delta":{"content":"Hello"},
//! "logprobs":null,"finish_reason":null}]}`). Once one such event has been decoded the full way,
//! its text before and after the delta's string is a template: an event that is the template with
//! another string in that place is that same JSON with another text, so it decodes to that text
//! and nothing else. Checking that takes two comparisons and one string read, against a parse of
//! the whole event through serde (about 4,400 instructions each for a Chat chunk, most of a
//! translated stream's decoding).
//!
//! Exact, not heuristic: the string in the middle is read as JSON reads it (escapes decoded, a
//! raw quote or control character refused), so an event that matches holds one valid string
//! there; anything else (another timestamp, a key added, spaces) goes the full way, which may
//! learn a template again, up to [`MAX_LEARNED`] times a stream.

use std::borrow::Cow;

use memchr::memmem;

use super::scan;

/// Templates a stream may learn: an upstream whose deltas never repeat their frame (a new id or
/// timestamp each time) would otherwise pay to learn one on every event.
const MAX_LEARNED: u8 = 4;

/// The frame of a stream's text deltas, learned from one of them.
#[derive(Debug, Default)]
pub(crate) struct DeltaTemplate {
    /// The event up to and including the opening quote of its text.
    head: String,
    /// The event from the closing quote of its text to its end.
    tail: String,
    learned: u8,
    /// Which template `head` and `tail` are: changes whenever another is learned.
    generation: u8,
}

/// A template that read an event, for writing that event again (see [`DeltaTemplate::text`]).
#[derive(Debug, Clone, Copy)]
pub struct Templated<'a> {
    pub generation: u8,
    /// The event up to and including the opening quote of its text: it ends with the key that
    /// opens the text.
    pub head: &'a str,
    /// The event from the closing quote of its text to its end.
    pub tail: &'a str,
}

impl DeltaTemplate {
    /// The text of `data` when it is the template's event with another text in its place.
    pub(crate) fn text<'a>(&self, data: &'a str) -> Option<Cow<'a, str>> {
        if self.head.is_empty()
            || data.len() < self.head.len() + self.tail.len()
            || !data.starts_with(self.head.as_str())
            || !data.ends_with(self.tail.as_str())
        {
            return None;
        }
        // The text's closing quote must be the tail's first byte, not one before it.
        let (text, end) = scan::string_at(data, self.head.len() - 1)?;
        (end == data.len() - self.tail.len() + 1).then_some(text)
    }

    /// The template itself when it reads `data` (see [`DeltaTemplate::text`]).
    pub(crate) fn reading(&self, data: &str) -> Option<Templated<'_>> {
        self.text(data)?;
        Some(Templated {
            generation: self.generation,
            head: &self.head,
            tail: &self.tail,
        })
    }

    /// Learns the template from `data`, an event that decoded to the one text delta `text` and
    /// nothing else, where `key` (`"content":"`, the key with the colon and the opening quote as
    /// the upstream writes them) opens that text, and `plain` says the event is a plain delta
    /// (asked last: it costs substring searches). Learns nothing, and keeps the template it has,
    /// when the stream has learned often enough, when the event is not plain, when `key` is not
    /// written once exactly (the text could be another string), or when the string there is not
    /// `text`.
    pub(crate) fn learn(
        &mut self,
        data: &str,
        key: &str,
        text: &str,
        plain: impl FnOnce() -> bool,
    ) {
        if self.learned >= MAX_LEARNED || text.is_empty() || !plain() {
            return;
        }
        self.learned += 1;
        // A key's quotes cannot occur inside a JSON string (they would be escaped there), so
        // each occurrence of `key` is a key of the event.
        let Some(at) = memmem::find(data.as_bytes(), key.as_bytes()) else {
            return;
        };
        if memmem::find(&data.as_bytes()[at + 1..], key.as_bytes()).is_some() {
            return;
        }
        let quote = at + key.len() - 1;
        let Some((found, end)) = scan::string_at(data, quote) else {
            return;
        };
        if found != text {
            return;
        }
        self.head.clear();
        self.head.push_str(&data[..=quote]);
        self.tail.clear();
        self.tail.push_str(&data[end - 1..]);
        self.generation = self.generation.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = r#""content":""#;

    fn chunk(text: &str) -> String {
        format!(
            r#"{{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{{"index":0,"delta":{{"content":{}}},"logprobs":null,"finish_reason":null}}]}}"#,
            serde_json::to_string(text).unwrap()
        )
    }

    fn learned(text: &str) -> DeltaTemplate {
        let mut template = DeltaTemplate::default();
        template.learn(&chunk(text), KEY, text, || true);
        template
    }

    #[test]
    fn events_of_the_same_frame_are_read_by_it() {
        let template = learned("Hello");
        for text in [
            "",
            " world",
            "a \"quoted\" \\ line\n\u{1}",
            "caf\u{e9} \u{1F600}",
        ] {
            assert_eq!(
                template.text(&chunk(text)).as_deref(),
                Some(text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn anything_else_is_not() {
        let template = learned("Hello");
        let other_frames = [
            // Another timestamp, a key added, a finish reason, spaces.
            chunk("x").replace(r#""created":7"#, r#""created":8"#),
            chunk("x").replace(r#""logprobs":null"#, r#""logprobs":null,"usage":{}"#),
            chunk("x").replace(r#""finish_reason":null"#, r#""finish_reason":"stop""#),
            chunk("x").replace(r#""content":"x""#, r#""content": "x""#),
            // The text's place holding two strings, or a string and more JSON.
            chunk("x").replace(r#""x""#, r#""a","content":"b""#),
            chunk("x").replace(r#""x""#, r#""a"},"delta":{"content":"b""#),
            // Not a string: a raw quote, a raw control character, a bad escape, cut short.
            chunk("x").replace(r#""x""#, "\"a\"b\""),
            chunk("x").replace(r#""x""#, "\"a\nb\""),
            chunk("x").replace(r#""x""#, r#""a\qb""#),
            chunk("x")[..40].to_owned(),
        ];
        for data in &other_frames {
            assert_eq!(template.text(data), None, "{data}");
        }
    }

    #[test]
    fn learns_only_from_an_event_whose_key_opens_its_text_once() {
        let mut template = DeltaTemplate::default();
        // The key written twice (a second `content` elsewhere): which one is the text?
        let twice = chunk("a").replace(r#""model":"m""#, r#""model":"m","x":{"content":"a"}"#);
        template.learn(&twice, KEY, "a", || true);
        assert_eq!(template.text(&chunk("b")), None);
        // The string at the key is not the text decoded.
        template.learn(&chunk("a"), KEY, "b", || true);
        assert_eq!(template.text(&chunk("b")), None);
        // Not a plain delta.
        template.learn(&chunk("a"), KEY, "a", || false);
        assert_eq!(template.text(&chunk("b")), None);
        template.learn(&chunk("a"), KEY, "a", || true);
        assert_eq!(template.text(&chunk("b")).as_deref(), Some("b"));
        // A failed learning keeps the template learned before.
        template.learn(&twice, KEY, "a", || true);
        assert_eq!(template.text(&chunk("b")).as_deref(), Some("b"));
    }

    #[test]
    fn a_stream_learns_a_bounded_number_of_times() {
        let mut template = DeltaTemplate::default();
        for _ in 0..MAX_LEARNED {
            template.learn(&chunk("a"), KEY, "a", || true);
        }
        assert!(template.text(&chunk("b")).is_some());
        template.learn(&chunk("c").replace("c1", "c2"), KEY, "c", || {
            panic!("not asked once the stream has learned often enough")
        });
        // Kept from before: no more learning.
        assert_eq!(template.text(&chunk("b")).as_deref(), Some("b"));
        assert_eq!(template.text(&chunk("b").replace("c1", "c2")), None);
    }
}
