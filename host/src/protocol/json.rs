//! Typed access to untyped JSON with error messages that name the offending field.
//!
//! Bodies are read as `serde_json::Value` rather than derived structs so that every wrong type
//! yields a reason a client can act on (`` `messages[2].content` must be a string or an array``)
//! and nothing on any input can panic.
//!
//! A request body is not turned into one `Value` tree: a tree costs several hundred bytes per JSON
//! object (a `BTreeMap` node each), so a 26 MiB body of tiny messages took 650 MiB. [`Lazy`] keeps
//! the message list as slices of the body and parses one message at a time, and [`Limits`] caps
//! the messages and nested objects while the body is read, before anything is built. It reads with
//! the scan's reader (`scan::Pull`, held to `serde_json` by its tests), and with `serde_json` only
//! where that gives up, so every error is still `serde_json`'s.

use std::borrow::Cow;
use std::cell::Cell;
use std::sync::LazyLock;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{ProtocolError, scan};

/// Appends `value` to `out` as JSON. Writing to a `Vec` fails only for a value that is not JSON
/// (a map with keys that are not strings), which no caller writes.
pub fn push(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    let _ = serde_json::to_writer(out, value);
}

/// Appends `text` as a JSON string, as [`push`] writes it. A string with nothing to escape (nearly
/// every key, model name and id) is copied between its quotes; only one with escapes goes through
/// `serde_json`'s escaper, which looks every byte up in its table (~65 instructions a short
/// string, where this is ~20).
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    if scan::plain_run(bytes, 0) == bytes.len() {
        out.reserve(bytes.len() + 2);
        out.push(b'"');
        out.extend_from_slice(bytes);
        out.push(b'"');
    } else {
        push(out, text);
    }
}

/// Appends `prefix`, then `text` as a JSON string ([`push_str`]).
pub fn push_str_entry(out: &mut Vec<u8>, prefix: &str, text: &str) {
    out.extend_from_slice(prefix.as_bytes());
    push_str(out, text);
}

/// Appends `prefix`, then `value` as JSON: how a record with known keys is written, each key a
/// constant in its prefix (`{"key":`, `,"key":`) instead of going through `serde_json`'s escaper
/// as a derived `Serialize` sends it, on every call.
pub fn push_entry(out: &mut Vec<u8>, prefix: &str, value: &(impl serde::Serialize + ?Sized)) {
    out.extend_from_slice(prefix.as_bytes());
    push(out, value);
}

/// Parses a body, or says why it is not JSON.
pub fn parse(bytes: &[u8]) -> Result<Value, ProtocolError> {
    serde_json::from_slice(bytes).map_err(ProtocolError::NotJson)
}

/// How large a request's structure may be. Checked while the body is read, so a request over a
/// limit is refused before it takes memory; the error names the config key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries of the message list (`messages`, or Responses' `input`): `server.max_messages`.
    pub max_messages: usize,
    /// JSON objects and arrays anywhere in the body except the body itself, the message list and
    /// its messages: content parts, tool calls, tool results, tools and their schemas, metadata.
    /// `server.max_content_parts`.
    pub max_content_parts: usize,
}

impl Limits {
    /// Far above any real conversation (a long agent session has a few thousand messages).
    pub const DEFAULT: Limits = Limits {
        max_messages: 100_000,
        max_content_parts: 200_000,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// What is left of a body's [`Limits`] while it is read, and which one ran out.
struct Budget {
    limits: Limits,
    parts_left: Cell<usize>,
    exceeded: Cell<Option<Exceeded>>,
}

/// Which limit ran out (the error itself is built outside the deserializer, whose errors carry
/// only text).
#[derive(Clone, Copy)]
enum Exceeded {
    Messages,
    Parts,
}

impl Budget {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            parts_left: Cell::new(limits.max_content_parts),
            exceeded: Cell::new(None),
        }
    }

    /// Counts one object or array; an error once the limit is passed.
    fn charge<E: de::Error>(&self) -> Result<(), E> {
        match self.parts_left.get().checked_sub(1) {
            Some(left) => {
                self.parts_left.set(left);
                Ok(())
            }
            None => Err(self.exceed(Exceeded::Parts)),
        }
    }

    fn exceed<E: de::Error>(&self, kind: Exceeded) -> E {
        self.exceeded.set(Some(kind));
        E::custom("request limit exceeded")
    }

    /// The error to report for a failed parse: the limit that ran out, else not JSON.
    fn error(&self, e: serde_json::Error, list_key: &str) -> ProtocolError {
        match self.exceeded.get() {
            Some(Exceeded::Messages) => ProtocolError::TooLarge {
                what: format!(
                    "`{list_key}` has more than {} entries",
                    self.limits.max_messages
                ),
                key: "server.max_messages",
            },
            Some(Exceeded::Parts) => ProtocolError::TooLarge {
                what: format!(
                    "the body has more than {} content parts and other nested objects",
                    self.limits.max_content_parts
                ),
                key: "server.max_content_parts",
            },
            None => ProtocolError::NotJson(e),
        }
    }
}

/// A request body read without building one tree of it: the top-level fields as values, except
/// the message list, whose entries stay slices of the body until [`Lazy::each`] parses them one
/// at a time (or [`Lazy::each_plain`] hands over the plain ones without a tree). Peak memory is
/// then the body, the IR being built, and one message's tree.
pub struct Lazy<'a> {
    /// The top-level object without the message list when that is an array; `Null` when the body
    /// is not an object.
    top: Value,
    list: Option<Vec<ListEntry<'a>>>,
    /// The top-level entries where they are in the body, when the scan's reader read it (not
    /// `serde_json`).
    fields: Option<BodyFields>,
    list_key: &'static str,
    budget: Budget,
}

impl<'a> Lazy<'a> {
    /// Reads `bytes`, keeping the array at `list_key` unparsed; fails on invalid JSON or when a
    /// limit is passed.
    pub fn parse(
        bytes: &'a [u8],
        list_key: &'static str,
        limits: Limits,
    ) -> Result<Self, ProtocolError> {
        Self::read(bytes, list_key, limits, false)
    }

    /// [`Lazy::parse`] of a body whose list is `messages`, for [`Lazy::each_plain`]: each entry
    /// of the plain shape is read as a [`PlainMessage`] while the body's reading passes it, so
    /// that its text is read once, not once to find its end and once more to read it. The price
    /// is its three strings (borrowed from the body unless they hold escapes) kept beside the
    /// entry until [`Lazy::each_plain`] moves them into the IR, less than the tree per message
    /// they spare.
    pub fn parse_messages(bytes: &'a [u8], limits: Limits) -> Result<Self, ProtocolError> {
        Self::read(bytes, "messages", limits, true)
    }

    fn read(
        bytes: &'a [u8],
        list_key: &'static str,
        limits: Limits,
        read_plain: bool,
    ) -> Result<Self, ProtocolError> {
        let budget = Budget::new(limits);
        if let Some((top, list, fields)) = read_body_fast(bytes, list_key, &budget, read_plain) {
            return Ok(Self {
                top,
                list,
                fields: Some(fields),
                list_key,
                budget,
            });
        }
        // The fast reader gave up (a body it does not judge, an error, a limit run out): serde_json
        // reads it again from the start, on a fresh budget, and its verdict and error stand.
        let budget = Budget::new(limits);
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let read = BodySeed {
            budget: &budget,
            list_key,
        }
        .deserialize(&mut de)
        .and_then(|body| de.end().map(|()| body));
        let (top, list) = read.map_err(|e| budget.error(e, list_key))?;
        Ok(Self {
            top,
            list: list.map(|entries| {
                entries
                    .into_iter()
                    .map(|raw| ListEntry {
                        raw: raw.get(),
                        plain: Cell::new(Recorded::Unread),
                    })
                    .collect()
            }),
            fields: None,
            list_key,
            budget,
        })
    }

    /// Where the body's top-level entries are in it, when its reading recorded them.
    pub fn take_fields(&mut self) -> Option<BodyFields> {
        self.fields.take()
    }

    /// The body, which must be an object. Its message list is absent when it was an array (read
    /// it with [`Lazy::list_len`] and [`Lazy::each`]); any other value there is kept, for the
    /// parser to name its type.
    pub fn body(&self) -> Result<Obj<'_, 'static>, ProtocolError> {
        Obj::body(&self.top)
    }

    /// The number of entries of the message list, when it is an array.
    pub fn list_len(&self) -> Option<usize> {
        self.list.as_ref().map(Vec::len)
    }

    /// Parses each entry of the message list in turn and hands it to `f` with its index; the
    /// entry's tree is dropped before the next is read.
    pub fn each(
        &self,
        mut f: impl FnMut(usize, &Value) -> Result<(), ProtocolError>,
    ) -> Result<(), ProtocolError> {
        self.each_entry(false, |i, entry| match entry {
            Entry::Tree(v) => f(i, v).map(|()| true),
            Entry::Plain(_) => Ok(false),
        })
    }

    /// [`Lazy::each`], offering each entry that is a [`PlainMessage`] to `f` as one first: most
    /// of a conversation is such messages, and reading one off the text costs its strings' copy
    /// and nothing else, where a tree costs a map, its keys, a copy of each string and their
    /// drop. `f` returns whether it took the entry; one it declines (a role it reads more of)
    /// comes back as a tree, and so does every entry of another shape. Whatever `f` takes from
    /// a plain message must equal what it makes of the same entry as a tree.
    pub fn each_plain(
        &self,
        f: impl FnMut(usize, Entry<'_, 'a>) -> Result<bool, ProtocolError>,
    ) -> Result<(), ProtocolError> {
        self.each_entry(true, f)
    }

    fn each_entry(
        &self,
        offer_plain: bool,
        mut f: impl FnMut(usize, Entry<'_, 'a>) -> Result<bool, ProtocolError>,
    ) -> Result<(), ProtocolError> {
        let Some(list) = &self.list else {
            return Ok(());
        };
        for (i, entry) in list.iter().enumerate() {
            let raw = entry.raw;
            if offer_plain {
                // Moved out, not cloned: a text with escapes was decoded into a string of its own,
                // which goes to the IR as it is.
                let plain = match entry.plain.replace(Recorded::Other) {
                    Recorded::Plain(plain) => Some(plain),
                    Recorded::Other => None,
                    Recorded::Unread => PlainMessage::read(raw),
                };
                if let Some(plain) = plain
                    && f(i, Entry::Plain(plain))?
                {
                    continue;
                }
            }
            let seed = || ValueSeed {
                budget: &self.budget,
                counted: false,
            };
            let parts_left = self.budget.parts_left.get();
            let mut fast = scan::Pull::of_str(raw);
            let entry = match fast.seed(seed()).and_then(|v| fast.end(v)) {
                Some(entry) => entry,
                None => {
                    // As in `Lazy::parse`: serde_json decides, on the budget as it was before.
                    self.budget.parts_left.set(parts_left);
                    self.budget.exceeded.set(None);
                    let mut de = serde_json::Deserializer::from_str(raw);
                    seed()
                        .deserialize(&mut de)
                        .and_then(|v| de.end().map(|()| v))
                        .map_err(|e| self.budget.error(e, self.list_key))?
                }
            };
            f(i, Entry::Tree(&entry))?;
        }
        Ok(())
    }
}

/// An entry of the message list: its text and, when the body's reading read it, whether it has
/// the plain shape (in a cell: [`Lazy::each_plain`] moves a plain message out of a shared `Lazy`).
struct ListEntry<'a> {
    raw: &'a str,
    plain: Cell<Recorded<'a>>,
}

/// What the body's reading found an entry to be.
enum Recorded<'a> {
    Plain(PlainMessage<'a>),
    /// Of another shape: read as a tree.
    Other,
    /// Not looked at (a body `serde_json` read, or a list read without [`Lazy::parse_messages`]).
    Unread,
}

/// An entry of a request's message list, as [`Lazy::each_plain`] offers it.
pub enum Entry<'v, 'a> {
    /// A message of the most common shape, read off the body's text.
    Plain(PlainMessage<'a>),
    /// Any entry, parsed.
    Tree(&'v Value),
}

/// A message that is an object of exactly a string `role`, a string `content` and, optionally, a
/// string `name`, each once, in any order: the shape of nearly every turn of a conversation. Its
/// strings are borrowed from the body when they hold no escapes.
#[derive(Debug, PartialEq, Eq)]
pub struct PlainMessage<'a> {
    pub role: Cow<'a, str>,
    pub content: Cow<'a, str>,
    pub name: Option<Cow<'a, str>>,
}

impl<'a> PlainMessage<'a> {
    /// `raw`, one entry's text as the body's reading judged it, when it has that shape; `None`
    /// for any other (another key, a repeated one, a value of another type, `null` included).
    pub(crate) fn read(raw: &'a str) -> Option<Self> {
        let mut pull = scan::Pull::of_str(raw);
        let plain = Self::pull(&mut pull)?;
        pull.end(plain)
    }

    /// The plain message at `pull`'s next token, read past; `None` (with `pull` partway) for any
    /// other value.
    fn pull(pull: &mut scan::Pull<'a>) -> Option<Self> {
        const ROLE: u32 = 0;
        const CONTENT: u32 = 1;
        const NAME: u32 = 2;
        const OTHER: u32 = 3;
        let (mut role, mut content, mut name) = (None, None, None);
        pull.fields(
            |key| match key {
                "role" => Some(ROLE),
                "content" => Some(CONTENT),
                "name" => Some(NAME),
                _ => Some(OTHER),
            },
            |pull, field| {
                let slot = match field {
                    ROLE => &mut role,
                    CONTENT => &mut content,
                    NAME => &mut name,
                    _ => return None,
                };
                *slot = Some(pull.string()?);
                Some(())
            },
        )?;
        Some(PlainMessage {
            role: role?,
            content: content?,
            name,
        })
    }
}

/// [`BodySeed`]'s reading of `bytes` by the scan's reader, which reads a request about twice as
/// fast as `serde_json` and hands the same values to the same seeds (`scan::reader` says how it
/// matches `serde_json`): the same top-level value and message list, or `None` where it gives up,
/// a limit run out included.
fn read_body_fast<'a>(
    bytes: &'a [u8],
    list_key: &str,
    budget: &Budget,
    read_plain: bool,
) -> Option<(Value, Option<Vec<ListEntry<'a>>>, BodyFields)> {
    let mut pull = scan::Pull::new(bytes)?;
    let value = || ValueSeed {
        budget,
        counted: true,
    };
    // Any other body is given up: serde_json's reading names it.
    pull.open(b'{')?;
    let mut top = Map::new();
    let mut list = None;
    let mut fields = Vec::with_capacity(8);
    let mut first = true;
    while pull.more(b'}', &mut first)? {
        let key_at = pull.position();
        let key = pull.key()?;
        let field_key = match &key {
            // No escapes: the key is the text between its quotes.
            Cow::Borrowed(text) => FieldKey::At(key_at + 1..key_at + 1 + text.len()),
            Cow::Owned(decoded) => FieldKey::Decoded(decoded.clone()),
        };
        let value_at = pull.position();
        if key != list_key {
            let v = pull.seed(value())?;
            top.insert(key.into_owned(), v);
        } else if pull.peek()? == b'[' {
            // A repeated key replaces the earlier value, as in a parsed `Value`.
            pull.open(b'[')?;
            let mut entries = Vec::new();
            let mut first_entry = true;
            while pull.more(b']', &mut first_entry)? {
                if entries.len() == budget.limits.max_messages {
                    return None;
                }
                entries.push(list_entry(&mut pull, read_plain)?);
            }
            pull.close(b']')?;
            top.remove(&*key);
            list = Some(entries);
        } else {
            let v = pull.seed(value())?;
            list = None;
            top.insert(key.into_owned(), v);
        }
        fields.push((field_key, value_at..pull.offset()));
    }
    pull.close(b'}')?;
    pull.end((Value::Object(top), list, BodyFields(fields)))
}

/// The message list's entry at `pull`'s next token, read past: as a [`PlainMessage`] when
/// `read_plain` and it is one, else found whole (a plain message's reading that stops partway
/// starts over, on a copy of where it began).
fn list_entry<'a>(pull: &mut scan::Pull<'a>, read_plain: bool) -> Option<ListEntry<'a>> {
    let start = pull.position();
    let plain = if read_plain {
        let mut ahead = pull.clone();
        match PlainMessage::pull(&mut ahead) {
            Some(plain) => {
                *pull = ahead;
                Recorded::Plain(plain)
            }
            None => {
                pull.raw()?;
                Recorded::Other
            }
        }
    } else {
        pull.raw()?;
        Recorded::Unread
    };
    Some(ListEntry {
        raw: pull.text(start..pull.offset())?,
        plain: Cell::new(plain),
    })
}

/// A request body's top-level entries, in order and repeats included, as places in the body: what
/// a pass-through upstream body is written from (`upstream::request`), recorded while the body was
/// parsed so that it is not read a second time (for a 100-byte body that second reading was
/// ~2,000 instructions; it grows with the body).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyFields(Vec<(FieldKey, std::ops::Range<usize>)>);

/// A top-level key: where it is in the body when it has no escapes, else decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FieldKey {
    At(std::ops::Range<usize>),
    Decoded(String),
}

impl BodyFields {
    /// Each entry's key (decoded) and value's text, read off `body`, the body they were recorded
    /// from; `None` if they do not fit it (a different body). A key with escapes is borrowed from
    /// the record, every other key and every value from the body.
    pub fn entries<'k, 'b: 'k>(&'k self, body: &'b [u8]) -> Option<Vec<(Cow<'k, str>, &'b [u8])>> {
        self.0
            .iter()
            .map(|(key, value)| {
                let key = match key {
                    FieldKey::At(at) => std::str::from_utf8(body.get(at.clone())?).ok()?,
                    FieldKey::Decoded(decoded) => decoded.as_str(),
                };
                Some((Cow::Borrowed(key), body.get(value.clone())?))
            })
            .collect()
    }
}

/// Reads the body object: every field a value, except an array at `list_key`, kept unparsed.
struct BodySeed<'b> {
    budget: &'b Budget,
    list_key: &'static str,
}

type BodyParts<'de> = (Value, Option<Vec<&'de RawValue>>);

impl<'de> DeserializeSeed<'de> for BodySeed<'_> {
    type Value = BodyParts<'de>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_> {
    type Value = BodyParts<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut top = Map::new();
        let mut list = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.list_key {
                // A repeated key replaces the earlier value, as in a parsed `Value`.
                match map.next_value_seed(ListSeed(self.budget))? {
                    Listed::Raw(entries) => {
                        top.remove(&key);
                        list = Some(entries);
                    }
                    Listed::Value(v) => {
                        list = None;
                        top.insert(key, v);
                    }
                }
            } else {
                let v = map.next_value_seed(ValueSeed {
                    budget: self.budget,
                    counted: true,
                })?;
                top.insert(key, v);
            }
        }
        Ok((Value::Object(top), list))
    }

    // Any other body is refused by `Lazy::body`; arrays are skipped without building them.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok((Value::Null, None))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok((Value::Null, None))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok((Value::Null, None))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok((Value::Null, None))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok((Value::Null, None))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok((Value::Null, None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok((Value::Null, None))
    }
}

/// The message list: an array is kept as slices of the body, anything else becomes a value.
struct ListSeed<'b>(&'b Budget);

enum Listed<'de> {
    Raw(Vec<&'de RawValue>),
    Value(Value),
}

impl<'de> DeserializeSeed<'de> for ListSeed<'_> {
    type Value = Listed<'de>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ListSeed<'_> {
    type Value = Listed<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = seq.next_element::<&'de RawValue>()? {
            if entries.len() == self.0.limits.max_messages {
                return Err(self.0.exceed(Exceeded::Messages));
            }
            entries.push(entry);
        }
        Ok(Listed::Raw(entries))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.value().visit_map(map).map(Listed::Value)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Listed::Value(Value::Bool(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Listed::Value(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Listed::Value(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Listed::Value(num(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Listed::Value(Value::String(v.to_owned())))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Listed::Value(Value::Null))
    }
}

impl ListSeed<'_> {
    fn value(&self) -> ValueSeed<'_> {
        ValueSeed {
            budget: self.0,
            counted: true,
        }
    }
}

/// A `serde_json::Value`, built the way serde_json builds it, with each object and array counted
/// against the budget (`counted: false` spares the outermost one: a message is not a part).
struct ValueSeed<'b> {
    budget: &'b Budget,
    counted: bool,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(num(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        if self.counted {
            self.budget.charge()?;
        }
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(ValueSeed {
            budget: self.budget,
            counted: true,
        })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        if self.counted {
            self.budget.charge()?;
        }
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let v = map.next_value_seed(ValueSeed {
                budget: self.budget,
                counted: true,
            })?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// A JSON object plus the path it was found at (empty for the body itself).
#[derive(Clone, Copy)]
pub struct Obj<'a, 'p> {
    pub map: &'a Map<String, Value>,
    path: &'p str,
    /// [`key_bit`] of every key of `map`: a key whose bit is clear is not there, found without a
    /// search. A parser asks for a dozen optional fields a client seldom sends, and each search of
    /// the map compares strings (~90 instructions a lookup, callgrind; this check costs a few).
    keys: u64,
}

/// Maps with more keys than this get no filter (all bits set): it would be mostly ones.
const FILTERED_KEYS: usize = 16;

/// One of 64 bits for `key`, from its length and its first and last bytes (the keys a parser
/// looks for differ in those).
fn key_bit(key: &str) -> u64 {
    let bytes = key.as_bytes();
    let ends = match bytes {
        [] => 0,
        [first, .., last] => usize::from(*first) * 7 + usize::from(*last) * 3,
        [only] => usize::from(*only) * 10,
    };
    1 << ((ends + bytes.len()) & 63)
}

/// The filter of [`Obj::keys`] for `map`.
fn key_bits(map: &Map<String, Value>) -> u64 {
    if map.len() > FILTERED_KEYS {
        return u64::MAX;
    }
    map.keys().fold(0, |bits, key| bits | key_bit(key))
}

/// The path of `key` inside the object at `path`.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Messages whose paths are formatted once per process rather than per request.
const MESSAGE_PATHS_KEPT: usize = 128;

/// `messages[i]` and `messages[i].content`: the paths each message of a request is read under,
/// kept only for errors. Formatted once for the first [`MESSAGE_PATHS_KEPT`] messages: formatting
/// them for every message of every request cost ~600 instructions each (callgrind).
pub fn message_paths(i: usize) -> (Cow<'static, str>, Cow<'static, str>) {
    fn format_paths(i: usize) -> (String, String) {
        let path = format!("messages[{i}]");
        let content = join(&path, "content");
        (path, content)
    }
    static KEPT: LazyLock<Vec<(String, String)>> =
        LazyLock::new(|| (0..MESSAGE_PATHS_KEPT).map(format_paths).collect());
    match KEPT.get(i) {
        Some((path, content)) => (Cow::Borrowed(path), Cow::Borrowed(content)),
        None => {
            let (path, content) = format_paths(i);
            (Cow::Owned(path), Cow::Owned(content))
        }
    }
}

/// `v[key]` when it is a string, borrowed; absent when it is missing or of another type (how a
/// stream decoder's lenient views read a field its typed view would have refused).
pub fn str_or_absent<'a>(v: &'a Value, key: &str) -> Option<Cow<'a, str>> {
    v.get(key).and_then(Value::as_str).map(Cow::Borrowed)
}

/// The type of a JSON value in words, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a, 'p> Obj<'a, 'p> {
    /// The request body, which must be an object.
    pub fn body(v: &'a Value) -> Result<Self, ProtocolError> {
        match v {
            Value::Object(map) => Ok(Self {
                map,
                path: "",
                keys: key_bits(map),
            }),
            _ => Err(ProtocolError::BodyNotObject),
        }
    }

    /// `v`, which must be an object, found at `path`.
    pub fn at(v: &'a Value, path: &'p str) -> Result<Self, ProtocolError> {
        match v {
            Value::Object(map) => Ok(Self {
                map,
                path,
                keys: key_bits(map),
            }),
            other => Err(ProtocolError::wrong_type(path, "an object", other)),
        }
    }

    pub fn path(&self, key: &str) -> String {
        join(self.path, key)
    }

    /// The value of `key`; `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        if self.keys & key_bit(key) == 0 {
            return None;
        }
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn wrong(&self, key: &str, want: &'static str, got: &Value) -> ProtocolError {
        ProtocolError::wrong_type(self.path(key), want, got)
    }

    /// The error for `key` being absent.
    pub fn missing(&self, key: &str) -> ProtocolError {
        ProtocolError::missing(self.path(key))
    }

    pub fn str(&self, key: &str) -> Result<Option<&'a str>, ProtocolError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    /// A required non-empty string.
    pub fn req_str(&self, key: &str) -> Result<&'a str, ProtocolError> {
        match self.str(key)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(self.missing(key)),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, ProtocolError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "a boolean", v)),
        }
    }

    pub fn f64(&self, key: &str) -> Result<Option<f64>, ProtocolError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(self.wrong(key, "a number", v)),
        }
    }

    pub fn i64(&self, key: &str) -> Result<Option<i64>, ProtocolError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {
                Ok(Some(n.as_i64().unwrap_or(i64::MAX)))
            }
            Some(v) => Err(self.wrong(key, "an integer", v)),
        }
    }

    /// A non-negative integer, saturated to `u32`.
    pub fn u32(&self, key: &str) -> Result<Option<u32>, ProtocolError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) if n.is_u64() => {
                Ok(Some(n.as_u64().map_or(u32::MAX, |n| {
                    u32::try_from(n).unwrap_or(u32::MAX)
                })))
            }
            Some(v) => Err(self.wrong(key, "a non-negative integer", v)),
        }
    }

    pub fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ProtocolError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong(key, "an array", v)),
        }
    }

    pub fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ProtocolError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(v) => Err(self.wrong(key, "an object", v)),
        }
    }

    /// Lenient reads for upstream answers, where a wrong type means "not given".
    pub fn str_or_empty(&self, key: &str) -> &'a str {
        self.get(key).and_then(Value::as_str).unwrap_or("")
    }

    pub fn u32_or_zero(&self, key: &str) -> u32 {
        self.get(key)
            .and_then(Value::as_u64)
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
    }
}

/// Inserts `key: value` when `value` is `Some`.
pub fn put<T: Into<Value>>(map: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        map.insert(key.to_owned(), v.into());
    }
}

/// A JSON number from an `f64` (`null` for NaN and infinities, which JSON cannot carry).
pub fn num(v: f64) -> Value {
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
}

/// Serializes a value that is known to be serializable (a `Value`).
pub fn to_vec(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// Serializes `map` as an object whose entry `key` is written by `list` instead of the placeholder
/// `map` holds there (so that it keeps its place in key order). Upstream bodies are built this
/// way so that their message list is serialized as it is built, one message's tree at a time:
/// a tree of the whole list cost several hundred bytes per message. `capacity` is a guess of the
/// size; a generous one is cheap (untouched pages of a large buffer take no memory), while growing
/// by doubling copies the body each time.
pub fn to_vec_with(
    map: &Map<String, Value>,
    key: &str,
    list: &impl serde::Serialize,
    capacity: usize,
) -> Vec<u8> {
    struct With<'a, L> {
        map: &'a Map<String, Value>,
        key: &'a str,
        list: &'a L,
    }
    impl<L: serde::Serialize> serde::Serialize for With<'_, L> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut out = serializer.serialize_map(Some(self.map.len()))?;
            for (k, v) in self.map {
                if k == self.key {
                    out.serialize_entry(k, self.list)?;
                } else {
                    out.serialize_entry(k, v)?;
                }
            }
            out.end()
        }
    }
    let mut out = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut out, &With { map, key, list }) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

/// Everything in `body` except the `modeled` keys: what the IR keeps in `Request::extra`.
pub fn extra(body: &Map<String, Value>, modeled: &[&str]) -> Map<String, Value> {
    body.iter()
        .filter(|(k, _)| !modeled.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The body's reading takes a plain entry whole as it passes it, and finds the same entry, the
    /// same text, as the entry's own reading; an entry it starts to read as plain and is not (a
    /// key found late, a nested value) is still found whole, and the list goes on after it.
    #[test]
    fn the_bodys_reading_takes_plain_messages_as_their_own_reading_does() {
        let body = br#"{"model":"m","messages":[ {"role":"user","content":"a\"b"} ,
            {"role":"assistant","content":"x","tool_calls":[{"id":"c","function":{"name":"f"}}]},
            {"content":"y","role":"tool","tool_call_id":"c"}, {"role":"user","content":[{"type":"text","text":"t"}]},
            {"name":"n","role":"user","content":"z"}, 7 ],"stream":false}"#;
        let limits = Limits::DEFAULT;
        let read = Lazy::parse_messages(body, limits).unwrap();
        let unread = Lazy::parse(body, "messages", limits).unwrap();
        let (Some(read), Some(unread)) = (&read.list, &unread.list) else {
            panic!("a list");
        };
        assert_eq!(read.len(), 6);
        let mut plain = 0;
        for (entry, other) in read.iter().zip(unread) {
            assert_eq!(entry.raw, other.raw);
            assert!(matches!(
                other.plain.replace(Recorded::Other),
                Recorded::Unread
            ));
            match (
                entry.plain.replace(Recorded::Other),
                PlainMessage::read(entry.raw),
            ) {
                (Recorded::Plain(recorded), Some(own)) => {
                    assert_eq!(recorded, own);
                    plain += 1;
                }
                (Recorded::Other, None) => {}
                _ => panic!("{} read differently", entry.raw),
            }
        }
        assert_eq!(plain, 2);
    }

    /// A message of role, string content and string name, and only those, each once, is read off
    /// its text (escapes decoded); any other shape is left to the tree.
    #[test]
    fn plain_messages_are_role_content_and_name_only() {
        let plain = PlainMessage::read;
        let read = plain(r#" { "content" : "a \"b\" \u00e9" , "role":"user", "name":"n" } "#)
            .expect("plain");
        assert_eq!(read.role, "user");
        assert_eq!(read.content, "a \"b\" \u{e9}");
        assert_eq!(read.name.as_deref(), Some("n"));
        let read = plain(r#"{"role":"assistant","content":""}"#).expect("plain");
        assert_eq!(
            (&*read.role, &*read.content, read.name),
            ("assistant", "", None)
        );
        for other in [
            r#"{"role":"user"}"#,
            r#"{"content":"x"}"#,
            r#"{"role":"user","content":null}"#,
            r#"{"role":"user","content":[{"type":"text","text":"x"}]}"#,
            r#"{"role":"user","content":"x","name":null}"#,
            r#"{"role":"user","content":"x","content":"y"}"#,
            r#"{"role":"user","content":"x","cache":1}"#,
            r#"{"role":"assistant","content":"x","tool_calls":[]}"#,
            r#"{"role":7,"content":"x"}"#,
            r#"["user","x"]"#,
            r#""x""#,
        ] {
            assert_eq!(plain(other), None, "{other}");
        }
    }

    /// The entries a body's parse records are the ones a reading of the body alone finds: keys
    /// decoded (escaped or not), values' text as written, repeats and the message list included,
    /// whatever the whitespace.
    #[test]
    fn recorded_fields_are_the_bodys_top_level_entries() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            " {\n \"mo\\u0064el\" :\t\"m\" , \"messages\" : [ ] , \"x\":{\"a\":[1,2,{\"b\":null}]}, \"n\": -1.5e3 ,\"model\":\"m2\" }\n",
            r#"{"messages":{"not":"a list"},"stream":true,"model":"caf\u00e9"}"#,
        ];
        for body in bodies {
            let mut lazy = Lazy::parse(body.as_bytes(), "messages", Limits::default()).expect(body);
            let fields = lazy.take_fields().expect("the scan's reader read it");
            let recorded = fields.entries(body.as_bytes()).expect("fits");
            let scanned = scan::object_entries(body.as_bytes()).expect("reads");
            assert_eq!(recorded.len(), scanned.len(), "{body}");
            for ((key, value), (want_key, want_value)) in recorded.iter().zip(&scanned) {
                assert_eq!(key, want_key, "{body}");
                assert_eq!(*value, want_value.as_bytes(), "{body}");
            }
        }
        // Another body's bytes do not fit them.
        let mut lazy = Lazy::parse(
            br#"{"model":"a-long-model-name"}"#,
            "messages",
            Limits::default(),
        )
        .expect("parses");
        let fields = lazy.take_fields().expect("recorded");
        assert!(fields.entries(b"{}").is_none());
    }

    /// The plain-string shortcut writes what `serde_json` writes, at every length around its
    /// eight-byte steps and with each byte that must be escaped at each place.
    #[test]
    fn strings_are_pushed_as_serde_json_writes_them() {
        let mut cases = vec![
            String::new(),
            "caf\u{e9} \u{1f600}".into(),
            "del\u{7f}".into(),
        ];
        for len in 0..20 {
            let plain: String = "abcdefghijklmnopqrstuvwxyz".chars().take(len).collect();
            cases.push(plain.clone());
            for stop in ['"', '\\', '\n', '\u{0}', '\u{1f}'] {
                for at in 0..=len {
                    let mut text = plain.clone();
                    text.insert(at, stop);
                    cases.push(text);
                }
            }
        }
        for text in cases {
            let mut out = b"[".to_vec();
            push_str(&mut out, &text);
            assert_eq!(out[1..], serde_json::to_vec(&text).unwrap()[..], "{text:?}");
        }
    }

    /// The key filter only ever skips a search that would find nothing: over maps of every size
    /// around [`FILTERED_KEYS`], each key is found as the map finds it, and so is each key it
    /// does not hold (near misses included: same length, same ends, a prefix, empty, not ASCII).
    #[test]
    fn an_object_finds_each_key_as_its_map_does() {
        let keys: Vec<&str> = "model messages tools tool_choice temperature top_p stop stream seed \
             user metadata max_tokens max_completion_tokens role content name refusal tool_calls \
             tool_call_id type text a é 模型 mode modem models mxdel stoq roles x-custom top_k top_q"
            .split_whitespace()
            .chain([""])
            .collect();
        for held in 0..=keys.len() {
            let map: Map<String, Value> = keys[..held]
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    (
                        k.to_string(),
                        if i % 5 == 4 { Value::Null } else { json!(i) },
                    )
                })
                .collect();
            let value = Value::Object(map.clone());
            let obj = Obj::body(&value).unwrap();
            for key in keys.iter().copied().chain(["modelx", "MODEL", "contents"]) {
                let expected = map.get(key).filter(|v| !v.is_null());
                assert_eq!(obj.get(key), expected, "{key:?} among {held} keys");
            }
        }
    }

    #[test]
    fn message_paths_read_the_same_kept_or_formatted() {
        for i in [0, 1, MESSAGE_PATHS_KEPT - 1, MESSAGE_PATHS_KEPT, 10_000] {
            let (path, content) = message_paths(i);
            assert_eq!(path, format!("messages[{i}]"));
            assert_eq!(content, format!("messages[{i}].content"));
            assert_eq!(
                matches!(path, Cow::Borrowed(_)),
                i < MESSAGE_PATHS_KEPT,
                "{i}"
            );
        }
        // An error past the kept ones still names its message.
        let mut messages = vec![json!({"role": "user", "content": "hi"}); MESSAGE_PATHS_KEPT + 5];
        messages.push(json!({"role": "robot", "content": "hi"}));
        let body = json!({"model": "m", "messages": messages}).to_string();
        let e = crate::protocol::Dialect::OpenAiChat
            .parse_request_within(body.as_bytes(), Limits::default())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("messages[{}].role", MESSAGE_PATHS_KEPT + 5)),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_field_and_type() {
        let v = json!({"a": {"b": 1}, "n": -1, "s": "", "x": null});
        let o = Obj::body(&v).unwrap();
        let a = Obj::at(o.get("a").unwrap(), "a").unwrap();
        assert_eq!(
            a.str("b").unwrap_err().to_string(),
            "`a.b` must be a string, not a number"
        );
        assert!(o.u32("n").unwrap_err().to_string().contains("non-negative"));
        assert_eq!(o.req_str("s").unwrap_err().to_string(), "`s` is required");
        assert_eq!(o.str("x").unwrap(), None);
        assert!(Obj::body(&json!([])).is_err());
    }

    fn lazy(body: &str, limits: Limits) -> Result<(Value, Vec<Value>), String> {
        let l = Lazy::parse(body.as_bytes(), "messages", limits).map_err(|e| e.to_string())?;
        let mut entries = Vec::new();
        l.each(|_, v| {
            entries.push(v.clone());
            Ok(())
        })
        .map_err(|e| e.to_string())?;
        Ok((l.top, entries))
    }

    #[test]
    fn lazy_body_reads_like_a_parsed_one_without_its_list() {
        let (top, entries) = lazy(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}, 2],"n":1.5}"#,
            Limits::DEFAULT,
        )
        .unwrap();
        assert_eq!(top, json!({"model": "m", "n": 1.5}));
        assert_eq!(
            entries,
            [
                json!({"role": "user", "content": [{"type": "text", "text": "a"}]}),
                json!(2)
            ]
        );
        // Anything but an array stays in the body, for the parser to name; the last key wins.
        let (top, entries) = lazy(r#"{"messages":[1],"messages":"x"}"#, Limits::DEFAULT).unwrap();
        assert_eq!((top, entries.len()), (json!({"messages": "x"}), 0));
        let (top, entries) =
            lazy(r#"{"messages":{"a":[]},"messages":[1]}"#, Limits::DEFAULT).unwrap();
        assert_eq!((top, entries), (json!({}), vec![json!(1)]));
        // Not an object: refused by `body()`, arrays skipped unbuilt.
        let l = Lazy::parse(b"[{},{}]", "messages", Limits::DEFAULT).unwrap();
        assert!(matches!(l.body(), Err(ProtocolError::BodyNotObject)));
        assert!(
            lazy(r#"{"messages":[1,]}"#, Limits::DEFAULT)
                .unwrap_err()
                .starts_with("not valid JSON")
        );
    }

    /// Whether the scan's reader reads a body or gives it up to serde_json, the body and its
    /// messages come out as serde_json reads them whole; what only serde_json reads (a number
    /// near `f64`'s limits, nesting past 100) is read, and a message given up halfway is not
    /// charged twice against the limits.
    #[test]
    fn lazy_bodies_read_as_serde_json_reads_them_whichever_reader_reads() {
        let deep = format!(
            r#"{{"model":"m","x":{}1{}}}"#,
            "[".repeat(110),
            "]".repeat(110)
        );
        let deep_message = format!(
            r#"{{"messages":[{{"c":{}1{}}}]}}"#,
            "[".repeat(110),
            "]".repeat(110)
        );
        for body in [
            r#"{"model":"m","messages":[{"role":"user","content":"hi \u00e9 \ud83d\ude00"}],"temperature":0.7,"seed":-3,"stream":true}"#,
            r#" { "messages" : [ { "a" : [ 1 , 2.5e-3 , null , false ] } , "x" ] , "n" : 18446744073709551616 } "#,
            r#"{"model":"m","max":1e300,"messages":[{"x":2.2250738585072014e-308}]}"#,
            r#"{"messages":[],"metadata":{"k":"v"},"messages":[{"a":1}]}"#,
            deep.as_str(),
            deep_message.as_str(),
        ] {
            let (top, entries) = lazy(body, Limits::DEFAULT).unwrap();
            let mut whole: Value = serde_json::from_str(body).unwrap();
            let expected = match whole.as_object_mut().and_then(|o| o.remove("messages")) {
                Some(Value::Array(list)) => list,
                Some(other) => panic!("{other}"),
                None => Vec::new(),
            };
            assert_eq!((top, entries), (whole, expected), "{body}");
        }
        for body in [
            r#"{"messages":[1e400]}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"a":1} x"#,
        ] {
            assert!(
                lazy(body, Limits::DEFAULT)
                    .unwrap_err()
                    .starts_with("not valid JSON")
            );
        }
        let limits = Limits {
            max_messages: 2,
            max_content_parts: 3,
        };
        assert!(lazy(r#"{"messages":[{"c":[{},{"x":1e300}]}]}"#, limits).is_ok());
        assert!(lazy(r#"{"messages":[{"c":[{},{"x":1e300},[]]}]}"#, limits).is_err());
    }

    #[test]
    fn limits_are_named_when_passed() {
        let limits = Limits {
            max_messages: 2,
            max_content_parts: 3,
        };
        assert!(lazy(r#"{"messages":[{},{}]}"#, limits).is_ok());
        assert_eq!(
            lazy(r#"{"messages":[{},{},{}]}"#, limits).unwrap_err(),
            "`messages` has more than 2 entries (the gateway's limit, server.max_messages)"
        );
        // Messages themselves are not parts; what they and the body hold is.
        assert!(lazy(r#"{"messages":[{"c":[{}]}],"tools":[]}"#, limits).is_ok());
        let over = "the body has more than 3 content parts and other nested objects \
                    (the gateway's limit, server.max_content_parts)";
        assert_eq!(
            lazy(r#"{"messages":[{"c":[{}]}],"tools":[{}]}"#, limits).unwrap_err(),
            over
        );
        assert_eq!(
            lazy(r#"{"messages":[{"c":[[],[]]},{"c":[]}]}"#, limits).unwrap_err(),
            over
        );
    }
}
