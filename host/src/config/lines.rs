//! Where a key path is in the YAML text, so validation errors give the line like parse errors do.
//!
//! The text is parsed again, by the same parser (`serde_norway`), only when an error needs a line:
//! a seeking visitor walks down the path and fails at its end, and the parser stamps that failure
//! with the position it was reading. That keeps one YAML parser in the build and no position
//! bookkeeping on the success path.

use std::fmt;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The config's text as written, kept for [`KeyLines::line`].
#[derive(Clone, Default)]
pub struct KeyLines {
    text: Arc<str>,
}

impl fmt::Debug for KeyLines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLines")
            .field("bytes", &self.text.len())
            .finish()
    }
}

impl KeyLines {
    pub fn new(text: &str) -> KeyLines {
        KeyLines { text: text.into() }
    }

    /// The 1-based line of the key (or sequence item) that `path` names, as errors write paths:
    /// `models[0] (m1).route[1].weight`, the parenthesised labels skipped. `None` when the path is
    /// not one (`environment variable X`) or is not in the text (a default).
    pub fn line(&self, path: &str) -> Option<usize> {
        let segments = parse_path(path)?;
        if segments.is_empty() {
            return None;
        }
        let deserializer = serde_norway::Deserializer::from_str(&self.text);
        match Seek(&segments).deserialize(deserializer) {
            Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| l.line()),
            _ => None,
        }
    }
}

/// The message of the error the seeker raises where the path ends.
const FOUND: &str = "switchyard: key path found";

#[derive(Debug, PartialEq)]
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

/// `a.b[2] (label).c` → `a`, `b`, `2`, `c`. `None` for anything else.
fn parse_path(path: &str) -> Option<Vec<Segment<'_>>> {
    let mut segments = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        let end = rest.find(['.', '[', ' ']).unwrap_or(rest.len());
        let key = &rest[..end];
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return None;
        }
        segments.push(Segment::Key(key));
        rest = &rest[end..];
        while let Some(after) = rest.strip_prefix('[') {
            let close = after.find(']')?;
            segments.push(Segment::Index(after[..close].parse().ok()?));
            rest = &after[close + 1..];
        }
        if let Some(after) = rest.strip_prefix(" (") {
            // A label (a model id or route name) may hold anything, parentheses included: it ends
            // at the last `)` before the next `.` that follows a `)`, or at the end.
            let close = match after.find(").") {
                Some(i) => i,
                None => after.strip_suffix(')')?.len(),
            };
            rest = &after[close + 1..];
        }
        match rest.strip_prefix('.') {
            Some(after) => rest = after,
            None if rest.is_empty() => {}
            None => return None,
        }
    }
    Some(segments)
}

/// Walks down the remaining segments.
struct Seek<'p, 'a>(&'p [Segment<'a>]);

impl<'de> DeserializeSeed<'de> for Seek<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Segment::Key(wanted), rest)) = self.0.split_first() else {
            return Ok(());
        };
        if rest.is_empty() {
            // Fail on the key itself, so the position is the key's line.
            while map.next_key_seed(FailAtKey(wanted))?.is_some() {
                map.next_value::<IgnoredAny>()?;
            }
            return Ok(());
        }
        while let Some(key) = map.next_key::<String>()? {
            if key == *wanted {
                map.next_value_seed(Seek(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Segment::Index(wanted), rest)) = self.0.split_first() else {
            return Ok(());
        };
        for _ in 0..*wanted {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        if rest.is_empty() {
            seq.next_element_seed(FailHere)?;
        } else {
            seq.next_element_seed(Seek(rest))?;
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// A map key that fails when it is the wanted one.
struct FailAtKey<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for FailAtKey<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FailAtKey<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<(), E> {
        if key == self.0 {
            Err(E::custom(FOUND))
        } else {
            Ok(())
        }
    }
}

/// Fails on whatever value comes next.
struct FailHere;

impl<'de> DeserializeSeed<'de> for FailHere {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FailHere {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "database:\n  url: x\nmodels:\n  - id: m.1 (a)\n    router: nope\n    route:\n      - kind: openai_compat\n        base_url: http://a/v1\n      - kind: anthropic\n        weight: -1\n  - id: m2\n    router_params:\n      alpha: 2\n";

    #[test]
    fn paths_parse_with_labels_skipped() {
        assert_eq!(
            parse_path("models[0] (m.1 (a)).route[1].weight").unwrap(),
            [
                Segment::Key("models"),
                Segment::Index(0),
                Segment::Key("route"),
                Segment::Index(1),
                Segment::Key("weight")
            ]
        );
        assert!(parse_path("environment variable X").is_none());
    }

    #[test]
    fn finds_keys_and_items() {
        let lines = KeyLines::new(TEXT);
        assert_eq!(lines.line("database.url"), Some(2));
        assert_eq!(lines.line("models[0] (m.1 (a)).router"), Some(5));
        assert_eq!(lines.line("models[0] (m.1 (a)).route[1].weight"), Some(10));
        assert_eq!(lines.line("models[0].route[1]"), Some(9));
        assert_eq!(lines.line("models[1] (m2).router_params"), Some(12));
        assert_eq!(lines.line("models[1] (m2).id"), Some(11));
        assert_eq!(lines.line("models[1].router"), None);
        assert_eq!(lines.line("models[5].id"), None);
        assert_eq!(lines.line("server.listen"), None);
    }
}
