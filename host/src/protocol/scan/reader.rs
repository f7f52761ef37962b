//! The JSON reader under every scan: a `serde::Deserializer` over a body known to be UTF-8, made
//! for the one thing a scan needs, a verdict at the least cost.
//!
//! `serde_json` spent about 25 instructions a byte on a small relayed answer, mostly per token
//! (its string path validates UTF-8 string by string, tracks positions for error messages, and
//! builds an error value for every give-up). Here the body's UTF-8 is checked once, strings are
//! borrowed slices of it whose ends are found a word or more at a time ([`plain_run`]), and an error
//! is a unit: a scan never shows one (the full parse's error is what a caller sees).
//!
//! It may give up on more than `serde_json` rejects, never on less, and what it hands a visitor is
//! what `serde_json` would hand it:
//! - the grammar is RFC 8259's, as `serde_json` reads it: no trailing commas, no comments, no
//!   leading zeros, whitespace only between tokens and at the ends;
//! - strings decode the same escapes, surrogate pairs included; a lone surrogate gives up;
//! - integers are visited as `u64` when not negative and `i64` when negative (`-0` as the float
//!   -0.0), as `serde_json` visits them; an integer beyond both, and any number with a fraction or an exponent, is an
//!   `f64` (the same correctly rounded value `serde_json` parses with `float_roundtrip`, which the
//!   build enables); a number whose magnitude could overflow gives up;
//! - nesting deeper than [`MAX_DEPTH`] gives up (`serde_json` rejects past 128).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Visitor};

/// Nesting a scan follows; deeper gives up (below `serde_json`'s own limit of 128).
const MAX_DEPTH: u32 = 100;

/// Digits plus exponent beyond which a number's magnitude could leave `f64`'s range (about
/// 1e±308): such a number gives up rather than judge it.
const MAX_MAGNITUDE: i64 = 300;

/// Bytes that end the plain run of a string: the quote, a backslash, and the control characters
/// a JSON string may not hold raw.
const STRING_STOP: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// The end of the plain run of a string that starts at `pos`: the first byte [`STRING_STOP`]
/// holds, or the end of `bytes`. Eight bytes at a time while none of them stops the run (a word
/// holds a quote or backslash where a byte of it XOR the byte is zero, and a control character
/// where a byte minus 0x20 borrows), then byte by byte.
///
/// A run still going after four words is a long one (a message's text, not a key or an id): from
/// there it goes 32 bytes at a time, each block tested whole without stopping early, which the
/// compiler turns into vector compares (SSE2 on every x86-64), about 0.8 instructions a byte
/// (callgrind, a 32 KiB conversation) against the words' ~3. Blocks from the first byte cost
/// every short string a block's test.
pub(crate) fn plain_run(bytes: &[u8], mut pos: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const SPACES: u64 = u64::from_ne_bytes([0x20; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    const BLOCK: usize = 32;
    // A flag on the lowest byte that is zero (a borrow only marks bytes above it).
    let zero_byte = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS;
    let mut words = 0;
    while let Some(chunk) = bytes.get(pos..pos + 8) {
        let Ok(chunk) = <[u8; 8]>::try_from(chunk) else {
            break;
        };
        let word = u64::from_le_bytes(chunk);
        let stops = zero_byte(word ^ QUOTES)
            | zero_byte(word ^ BACKSLASHES)
            | (word.wrapping_sub(SPACES) & !word & HIGHS);
        if stops != 0 {
            // The first flagged byte; the loop below decides on it.
            pos += (stops.trailing_zeros() / 8) as usize;
            break;
        }
        pos += 8;
        words += 1;
        if words == 4 {
            // Once per string: past the blocks without a stop, the words find the stop's place.
            while let Some(block) = bytes.get(pos..pos + BLOCK) {
                let Ok(block) = <&[u8; BLOCK]>::try_from(block) else {
                    break;
                };
                let stops = block.iter().fold(false, |any, &b| {
                    any | (b == b'"') | (b == b'\\') | (b < 0x20)
                });
                if stops {
                    break;
                }
                pos += BLOCK;
            }
        }
    }
    while pos < bytes.len() && !STRING_STOP[usize::from(bytes[pos])] {
        pos += 1;
    }
    pos
}

/// Why a scan gave up; it carries nothing because nobody reads it.
#[derive(Debug)]
pub(crate) struct GiveUp;

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the scan gave up")
    }
}

impl std::error::Error for GiveUp {}

impl de::Error for GiveUp {
    fn custom<T: fmt::Display>(_: T) -> Self {
        GiveUp
    }
}

/// Reads `bytes` as one JSON value of type `T`, or gives up.
pub(crate) fn from_slice<'de, T: de::Deserialize<'de>>(bytes: &'de [u8]) -> Option<T> {
    let mut reader = Reader::new(bytes)?;
    let value = T::deserialize(&mut reader).ok()?;
    reader.end(value)
}

/// [`from_slice`] for text already known to be UTF-8 (a stream's event), which is not checked again.
pub(crate) fn from_str<'de, T: de::Deserialize<'de>>(text: &'de str) -> Option<T> {
    let mut reader = Reader::of_str(text);
    let value = T::deserialize(&mut reader).ok()?;
    reader.end(value)
}

/// The JSON string whose opening quote is at `quote` in `text`, decoded, and the position just
/// past its closing quote; `None` when no valid string starts there.
pub(crate) fn string_at(text: &str, quote: usize) -> Option<(Cow<'_, str>, usize)> {
    let mut reader = Reader {
        text,
        pos: quote,
        depth: 0,
    };
    if text.as_bytes().get(quote) != Some(&b'"') {
        return None;
    }
    let string = reader.string().ok()?;
    Some((string, reader.pos))
}

/// The entries of the JSON object in `bytes` as written: each key (decoded) with the text of its
/// value, in order, a repeated key as often as it appears; or `None`, giving up as [`from_slice`]
/// does. What a pass-through body is written from, without a tree of the client's.
pub(crate) fn object_entries(bytes: &[u8]) -> Option<Vec<(Cow<'_, str>, &str)>> {
    let mut reader = Reader::new(bytes)?;
    let entries = reader.entries().ok()?;
    reader.end(entries)
}

/// A reader driven entry by entry from outside, for `json::Lazy`, which reads a request's
/// top-level object itself to keep the message list as slices of the text. Every call reads as
/// [`from_slice`] would (the same grammar, depth and verdicts), and `None` means it gave up: the
/// caller then reads the body with `serde_json`, whose error stands.
#[derive(Clone)]
pub(crate) struct Pull<'de> {
    reader: Reader<'de>,
}

impl<'de> Pull<'de> {
    /// A pull reader of `bytes`, which must be UTF-8.
    pub(crate) fn new(bytes: &'de [u8]) -> Option<Self> {
        Reader::new(bytes).map(|reader| Pull { reader })
    }

    /// A pull reader of text already known to be UTF-8.
    pub(crate) fn of_str(text: &'de str) -> Self {
        Pull {
            reader: Reader::of_str(text),
        }
    }

    /// The first byte of the next token, not consumed.
    pub(crate) fn peek(&mut self) -> Option<u8> {
        self.reader.peek().ok()
    }

    /// Enters the object or array opened by `open` at the next token.
    pub(crate) fn open(&mut self, open: u8) -> Option<()> {
        self.reader.open(open).ok()
    }

    /// Leaves the object or array that `close` ends.
    pub(crate) fn close(&mut self, close: u8) -> Option<()> {
        self.reader.close(close).ok()
    }

    /// Whether another entry follows before `close` (consuming the comma between two);
    /// `first` says whether none has been read yet, and is kept up to date.
    pub(crate) fn more(&mut self, close: u8, first: &mut bool) -> Option<bool> {
        let mut entries = Entries {
            reader: &mut self.reader,
            first: *first,
        };
        let more = entries.more(close).ok()?;
        *first = entries.first;
        Some(more)
    }

    /// Where the next token starts (past whitespace), or where reading stopped.
    pub(crate) fn position(&mut self) -> usize {
        self.reader.skip_whitespace();
        self.reader.pos
    }

    /// The text at `range` of what is read (`None` off its end or off a character's boundary).
    pub(crate) fn text(&self, range: std::ops::Range<usize>) -> Option<&'de str> {
        self.reader.text.get(range)
    }

    /// Where reading stopped: just past the last token read.
    pub(crate) fn offset(&self) -> usize {
        self.reader.pos
    }

    /// An object's next key and its colon.
    pub(crate) fn key(&mut self) -> Option<Cow<'de, str>> {
        self.reader.key().ok()
    }

    /// The text of the next value, read and judged whole.
    pub(crate) fn raw(&mut self) -> Option<&'de str> {
        self.reader.raw().ok()
    }

    /// The string at the next token, borrowed when it has no escapes.
    pub(crate) fn string(&mut self) -> Option<Cow<'de, str>> {
        self.reader.string().ok()
    }

    /// Whether the next token is `null`, consumed if it is (anything else is left to read).
    pub(crate) fn null(&mut self) -> Option<bool> {
        self.reader.null().ok()
    }

    /// The non-negative integer at the next token, or `None` at `null`, as `Option<u64>` reads.
    pub(crate) fn count(&mut self) -> Option<Option<u64>> {
        if self.null()? {
            return Some(None);
        }
        self.reader.unsigned().ok().map(Some)
    }

    /// The object at the next token, entry by entry: each key `field` knows (it gives the key's
    /// number, below 64) is read by `read`, given that number, at most once (a repeated one gives
    /// up, as `scan::Object` does); any other key's value is read whole and kept nowhere.
    /// `field` is best a `match`, which compiles to comparisons by length: a search of a list of
    /// keys cost ~25 instructions more a key.
    pub(crate) fn fields(
        &mut self,
        field: impl Fn(&str) -> Option<u32>,
        mut read: impl FnMut(&mut Self, u32) -> Option<()>,
    ) -> Option<()> {
        self.open(b'{')?;
        let (mut seen, mut first) = (0u64, true);
        while self.more(b'}', &mut first)? {
            let key = self.key()?;
            match field(&key) {
                Some(n) => {
                    let bit = 1u64.checked_shl(n)?;
                    if seen & bit != 0 {
                        return None;
                    }
                    seen |= bit;
                    read(self, n)?;
                }
                None => {
                    self.raw()?;
                }
            }
        }
        self.close(b'}')
    }

    /// The next value, read through `seed`.
    pub(crate) fn seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Option<S::Value> {
        seed.deserialize(&mut self.reader).ok()
    }

    /// `value`, when only whitespace is left.
    pub(crate) fn end<T>(self, value: T) -> Option<T> {
        self.reader.end(value)
    }
}

#[derive(Clone)]
struct Reader<'de> {
    text: &'de str,
    pos: usize,
    depth: u32,
}

/// A number as `serde_json` visits it.
enum Number {
    Unsigned(u64),
    Negative(i64),
    Float(f64),
}

impl<'de> Reader<'de> {
    /// A reader of text known to be UTF-8, from its start.
    fn of_str(text: &'de str) -> Self {
        Reader {
            text,
            pos: 0,
            depth: 0,
        }
    }

    /// A reader of `bytes`, which must be UTF-8 (checked once here, so strings are slices).
    fn new(bytes: &'de [u8]) -> Option<Self> {
        std::str::from_utf8(bytes).ok().map(Reader::of_str)
    }

    /// `value`, when only whitespace follows what was read.
    fn end<T>(mut self, value: T) -> Option<T> {
        self.skip_whitespace();
        (self.pos == self.text.len()).then_some(value)
    }

    fn bytes(&self) -> &'de [u8] {
        self.text.as_bytes()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes().get(self.pos) {
            self.pos += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Result<u8, GiveUp> {
        self.skip_whitespace();
        self.bytes().get(self.pos).copied().ok_or(GiveUp)
    }

    fn expect(&mut self, byte: u8) -> Result<(), GiveUp> {
        if self.peek()? == byte {
            self.pos += 1;
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    fn literal(&mut self, word: &str) -> Result<(), GiveUp> {
        let end = self.pos + word.len();
        if self.bytes().get(self.pos..end) == Some(word.as_bytes()) {
            self.pos = end;
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    /// Enters an object or array, opened by `open`.
    fn open(&mut self, open: u8) -> Result<(), GiveUp> {
        self.expect(open)?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(GiveUp);
        }
        Ok(())
    }

    fn close(&mut self, close: u8) -> Result<(), GiveUp> {
        self.expect(close)?;
        self.depth -= 1;
        Ok(())
    }

    /// The string at the next token (its opening quote not yet consumed), borrowed when it has
    /// no escapes.
    fn string(&mut self) -> Result<Cow<'de, str>, GiveUp> {
        self.expect(b'"')?;
        let bytes = self.bytes();
        let start = self.pos;
        let pos = plain_run(bytes, start);
        match bytes.get(pos) {
            Some(b'"') => {
                self.pos = pos + 1;
                // Both ends are ASCII quotes, so the slice is on character boundaries.
                self.text.get(start..pos).map(Cow::Borrowed).ok_or(GiveUp)
            }
            Some(b'\\') => {
                let mut out = String::with_capacity(pos - start + 16);
                out.push_str(self.text.get(start..pos).ok_or(GiveUp)?);
                self.pos = pos;
                self.escaped(out).map(Cow::Owned)
            }
            _ => Err(GiveUp),
        }
    }

    /// The rest of a string that has escapes, from a backslash; `out` holds what came before.
    fn escaped(&mut self, mut out: String) -> Result<String, GiveUp> {
        let bytes = self.bytes();
        loop {
            match bytes.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let decoded = match bytes.get(self.pos + 1) {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            let code = self.hex4(self.pos + 2)?;
                            let (code, len) = match code {
                                // A pair, as UTF-16 writes what lies beyond the BMP (Python's
                                // `json.dumps` writes every emoji so).
                                0xD800..=0xDBFF => {
                                    if self.bytes().get(self.pos + 6..self.pos + 8)
                                        != Some(&b"\\u"[..])
                                    {
                                        return Err(GiveUp);
                                    }
                                    let low = self.hex4(self.pos + 8)?;
                                    if !(0xDC00..=0xDFFF).contains(&low) {
                                        return Err(GiveUp);
                                    }
                                    (0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00), 12)
                                }
                                // A lone low half; `serde_json` rejects it too.
                                0xDC00..=0xDFFF => return Err(GiveUp),
                                code => (code, 6),
                            };
                            out.push(char::from_u32(code).ok_or(GiveUp)?);
                            self.pos += len;
                            continue;
                        }
                        _ => return Err(GiveUp),
                    };
                    out.push(decoded);
                    self.pos += 2;
                }
                Some(_) => {
                    let start = self.pos;
                    let pos = plain_run(bytes, start);
                    if pos == start {
                        // A raw control character, or the end of the body.
                        return Err(GiveUp);
                    }
                    out.push_str(self.text.get(start..pos).ok_or(GiveUp)?);
                    self.pos = pos;
                }
                None => return Err(GiveUp),
            }
        }
    }

    /// The four hex digits of a `\\u` escape at `at`.
    fn hex4(&self, at: usize) -> Result<u32, GiveUp> {
        let hex = self.text.get(at..at + 4).ok_or(GiveUp)?;
        // `from_str_radix` would also take a sign.
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(GiveUp);
        }
        u32::from_str_radix(hex, 16).map_err(|_| GiveUp)
    }

    /// The number at the next token.
    fn number(&mut self) -> Result<Number, GiveUp> {
        self.skip_whitespace();
        let bytes = self.bytes();
        let start = self.pos;
        let mut pos = start;
        let negative = bytes.get(pos) == Some(&b'-');
        if negative {
            pos += 1;
        }
        let digits_start = pos;
        let mut value: u64 = 0;
        let mut overflowed = false;
        match bytes.get(pos) {
            Some(b'0') => {
                pos += 1;
                // A leading zero stands alone.
                if bytes.get(pos).is_some_and(u8::is_ascii_digit) {
                    return Err(GiveUp);
                }
            }
            Some(b'1'..=b'9') => {
                while let Some(&d) = bytes.get(pos).filter(|b| b.is_ascii_digit()) {
                    match value
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(d - b'0')))
                    {
                        Some(v) => value = v,
                        None => overflowed = true,
                    }
                    pos += 1;
                }
            }
            _ => return Err(GiveUp),
        }
        let integer_digits = (pos - digits_start) as i64;
        let mut float = false;
        if bytes.get(pos) == Some(&b'.') {
            pos += 1;
            let fraction_start = pos;
            while bytes.get(pos).is_some_and(u8::is_ascii_digit) {
                pos += 1;
            }
            if pos == fraction_start || (pos - fraction_start) as i64 > MAX_MAGNITUDE {
                return Err(GiveUp);
            }
            float = true;
        }
        if let Some(b'e' | b'E') = bytes.get(pos) {
            pos += 1;
            if let Some(b'+' | b'-') = bytes.get(pos) {
                pos += 1;
            }
            let exponent_start = pos;
            let mut exponent: i64 = 0;
            while let Some(&d) = bytes.get(pos).filter(|b| b.is_ascii_digit()) {
                exponent = (exponent * 10 + i64::from(d - b'0')).min(10 * MAX_MAGNITUDE);
                pos += 1;
            }
            if pos == exponent_start || integer_digits + exponent > MAX_MAGNITUDE {
                return Err(GiveUp);
            }
            float = true;
        }
        self.pos = pos;
        if !float && !overflowed {
            if !negative {
                return Ok(Number::Unsigned(value));
            }
            // `serde_json`'s rule: a negative integer is an `i64` when it is one, except `-0`,
            // which is the float -0.0; beyond `i64`, a float.
            let n = (value as i64).wrapping_neg();
            if n < 0 {
                return Ok(Number::Negative(n));
            }
        }
        if integer_digits > MAX_MAGNITUDE {
            return Err(GiveUp);
        }
        let text = self.text.get(start..pos).ok_or(GiveUp)?;
        text.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Number::Float)
            .ok_or(GiveUp)
    }

    /// The string at the next token into `visitor`: borrowed when it can be, as `serde_json`
    /// hands it.
    fn str<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value, GiveUp> {
        match self.string()? {
            Cow::Borrowed(s) => visitor.visit_borrowed_str(s),
            Cow::Owned(s) => visitor.visit_string(s),
        }
    }

    /// Reads the next value into `visitor` as `serde_json`'s `deserialize_any` would.
    fn any<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value, GiveUp> {
        match self.peek()? {
            b'{' => self.map(visitor),
            b'[' => self.seq(visitor),
            b'"' => self.str(visitor),
            b't' => {
                self.literal("true")?;
                visitor.visit_bool(true)
            }
            b'f' => {
                self.literal("false")?;
                visitor.visit_bool(false)
            }
            b'n' => {
                self.literal("null")?;
                visitor.visit_unit()
            }
            b'-' | b'0'..=b'9' => match self.number()? {
                Number::Unsigned(n) => visitor.visit_u64(n),
                Number::Negative(n) => visitor.visit_i64(n),
                Number::Float(f) => visitor.visit_f64(f),
            },
            _ => Err(GiveUp),
        }
    }

    /// Reads the next value as [`Reader::any`] does (the same grammar, escapes, number ranges
    /// and depth, so the same verdict) and keeps nothing: no visitor is called for its parts.
    /// What a scan skips is most of a body, and walking it through visitors cost about twice as
    /// much.
    fn skip(&mut self) -> Result<(), GiveUp> {
        match self.peek()? {
            b'{' => {
                self.open(b'{')?;
                let mut entries = Entries {
                    reader: self,
                    first: true,
                };
                while entries.more(b'}')? {
                    entries.reader.key()?;
                    entries.reader.skip()?;
                }
                self.close(b'}')
            }
            b'[' => {
                self.open(b'[')?;
                let mut elements = Entries {
                    reader: self,
                    first: true,
                };
                while elements.more(b']')? {
                    elements.reader.skip()?;
                }
                self.close(b']')
            }
            b'"' => self.string().map(drop),
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'n' => self.literal("null"),
            b'-' | b'0'..=b'9' => self.number().map(drop),
            _ => Err(GiveUp),
        }
    }

    /// Whether the next token is `null`, consumed if it is (anything else is left to read).
    fn null(&mut self) -> Result<bool, GiveUp> {
        if self.peek()? != b'n' {
            return Ok(false);
        }
        self.literal("null").map(|()| true)
    }

    /// The non-negative integer at the next token, as `u64` is read: a minus sign gives up,
    /// whatever follows it.
    fn unsigned(&mut self) -> Result<u64, GiveUp> {
        if self.peek()? == b'-' {
            return Err(GiveUp);
        }
        match self.number()? {
            Number::Unsigned(n) => Ok(n),
            Number::Negative(_) | Number::Float(_) => Err(GiveUp),
        }
    }

    /// An object's key at the next token (a string: `string` refuses anything else) and the colon
    /// after it.
    fn key(&mut self) -> Result<Cow<'de, str>, GiveUp> {
        let key = self.string()?;
        self.expect(b':')?;
        Ok(key)
    }

    /// The text of the next value, read and judged whole ([`Reader::skip`]).
    fn raw(&mut self) -> Result<&'de str, GiveUp> {
        self.skip_whitespace();
        let start = self.pos;
        self.skip()?;
        self.text.get(start..self.pos).ok_or(GiveUp)
    }

    /// The object at the next token as (key, value's text) entries.
    fn entries(&mut self) -> Result<Vec<(Cow<'de, str>, &'de str)>, GiveUp> {
        self.open(b'{')?;
        let mut out = Vec::with_capacity(8);
        let mut entries = Entries {
            reader: self,
            first: true,
        };
        while entries.more(b'}')? {
            let key = entries.reader.key()?;
            out.push((key, entries.reader.raw()?));
        }
        self.close(b'}')?;
        Ok(out)
    }

    fn map<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value, GiveUp> {
        self.open(b'{')?;
        let value = visitor.visit_map(Entries {
            reader: self,
            first: true,
        })?;
        self.close(b'}')?;
        Ok(value)
    }

    fn seq<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value, GiveUp> {
        self.open(b'[')?;
        let value = visitor.visit_seq(Entries {
            reader: self,
            first: true,
        })?;
        self.close(b']')?;
        Ok(value)
    }
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = GiveUp;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        self.any(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        self.map(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        self.seq(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        self.str(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        self.deserialize_str(visitor)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        visitor.visit_u64(self.unsigned()?)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        if self.null()? {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, GiveUp> {
        visitor.visit_newtype_struct(self)
    }

    /// A struct is read from an object only: serde's derived visitors also take an array, field
    /// by field, which a `Value` read by key would not (`serde_json` would).
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, GiveUp> {
        self.map(visitor)
    }

    /// A value nobody keeps (`IgnoredAny`, a derived view's unknown field, [`super::Checked`]):
    /// read and judged as any other, handed to the visitor as a unit.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        self.skip()?;
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u128 f32 f64 char bytes byte_buf unit unit_struct
        tuple tuple_struct enum identifier
    }
}

/// The entries of an object, or the elements of an array, being read.
struct Entries<'a, 'de> {
    reader: &'a mut Reader<'de>,
    first: bool,
}

impl Entries<'_, '_> {
    /// Whether another entry follows, before `close`: consumes the comma between entries; a
    /// comma before `close` is left for the entry's read to refuse.
    fn more(&mut self, close: u8) -> Result<bool, GiveUp> {
        let next = self.reader.peek()?;
        if next == close {
            return Ok(false);
        }
        if self.first {
            self.first = false;
            return Ok(true);
        }
        if next != b',' {
            return Err(GiveUp);
        }
        self.reader.pos += 1;
        Ok(true)
    }
}

impl<'de> de::MapAccess<'de> for Entries<'_, 'de> {
    type Error = GiveUp;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, GiveUp> {
        if !self.more(b'}')? {
            return Ok(None);
        }
        // A key is a string, whatever the seed would take.
        if self.reader.peek()? != b'"' {
            return Err(GiveUp);
        }
        let key = seed.deserialize(&mut *self.reader)?;
        self.reader.expect(b':')?;
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, GiveUp> {
        seed.deserialize(&mut *self.reader)
    }
}

impl<'de> de::SeqAccess<'de> for Entries<'_, 'de> {
    type Error = GiveUp;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, GiveUp> {
        if !self.more(b']')? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.reader).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// What the reader makes of `body` against what `serde_json` does: the reader may give up
    /// where `serde_json` reads, never read where it rejects, and never read another value.
    fn agrees(body: &str) -> Option<Value> {
        let ours = from_slice::<Value>(body.as_bytes());
        let theirs = serde_json::from_slice::<Value>(body.as_bytes()).ok();
        if let Some(ours) = &ours {
            assert_eq!(Some(ours), theirs.as_ref(), "{body:?}");
        }
        ours
    }

    #[test]
    fn reads_what_serde_json_reads() {
        for body in [
            r#"{"a":1,"b":[true,false,null],"c":{"d":"e"},"f":-2,"g":1.5e3,"h":""}"#,
            " \t\r\n{ \"a\" : [ 1 , 2 ] } \n",
            r#""plain""#,
            r#""esc \" \\ \/ \b \f \n \r \t \u00e9 \u0000 end""#,
            r#"["caf\u00e9", "日本語", "emoji 😀", "pair \ud83d\ude00 end"]"#,
            "0",
            "-0",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "123456789012345678901234567890",
            "0.5",
            "-0.000001e-5",
            "1E+2",
            "[]",
            "{}",
            "[[[[[]]]]]",
            r#"{"a":1,"a":2}"#,
        ] {
            assert!(agrees(body).is_some(), "{body:?} was not read");
            assert!(
                from_slice::<de::IgnoredAny>(body.as_bytes()).is_some(),
                "{body:?}"
            );
        }
    }

    #[test]
    fn gives_up_on_everything_serde_json_rejects() {
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        let long = format!("1{}", "0".repeat(400));
        for body in [
            "",
            " ",
            "{",
            "[1,]",
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{1:2}"#,
            "[1 2]",
            "01",
            "-",
            "-a",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "1e400",
            "-1e400",
            long.as_str(),
            "tru",
            "nul",
            "True",
            "\"unterminated",
            "\"raw\ncontrol\"",
            "\"tab\there\"",
            r#""\x""#,
            r#""\u12""#,
            r#""\u12g4""#,
            r#""\ud800""#,
            r#""\ud800 ""#,
            r#""\ud800\u0041""#,
            r#""\ud83d\ude0""#,
            r#""\udc00\ud800""#,
            "\"\\",
            "1 2",
            "{} x",
            "[1]]",
            "\u{feff}1",
            "/* c */ 1",
            deep.as_str(),
        ] {
            assert!(
                serde_json::from_slice::<Value>(body.as_bytes()).is_err(),
                "serde_json reads {body:?}"
            );
            assert_eq!(from_slice::<Value>(body.as_bytes()), None, "{body:?}");
            assert!(
                from_slice::<de::IgnoredAny>(body.as_bytes()).is_none(),
                "{body:?}"
            );
        }
        assert_eq!(from_slice::<Value>(b"\"\xff\""), None, "invalid UTF-8");
    }

    #[test]
    fn gives_up_on_what_it_does_not_judge() {
        // Read by serde_json, but not worth a fast path: the full parse decides.
        let deep = format!("{}{}", "[".repeat(101), "]".repeat(101));
        for body in [deep.as_str(), "1e300", "2.2250738585072014e-308"] {
            assert!(serde_json::from_slice::<Value>(body.as_bytes()).is_ok());
            assert_eq!(from_slice::<Value>(body.as_bytes()), None, "{body:?}");
            assert!(
                from_slice::<de::IgnoredAny>(body.as_bytes()).is_none(),
                "{body:?}"
            );
        }
    }

    /// Valid bodies with random bytes changed, dropped or added (mostly ones JSON's grammar turns
    /// on): whatever the reader reads, `serde_json` reads the same.
    #[test]
    fn mutated_bodies_are_read_as_serde_json_reads_them_or_given_up() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        const SEEDS: [&str; 4] = [
            r#"{"id":"c1","model":"m\/1","choices":[{"index":0,"message":{"role":"assistant","content":"h\u00e9 \ud83d\ude00","refusal":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"x":[-0.5e-3,1E2,true,false]}}"#,
            r#"[1, -2, 3.25, "a\"b", {}, [], null, 18446744073709551615, -9223372036854775808]"#,
            r#" { "a" : { "b" : [ { "c" : "d\n\t" } ] } } "#,
            r#""\u0041\\\/\b\f""#,
        ];
        const ALPHABET: &[u8] = b"{}[],:\"\\/ 0123456789-+.eEtrufalsn\x00\x1f\x7f\xc3\xa9\xff u";
        let mut rng = StdRng::seed_from_u64(0x5ca9);
        let mut read = 0;
        for case in 0..40_000 {
            let mut body = SEEDS[case % SEEDS.len()].as_bytes().to_vec();
            for _ in 0..rng.random_range(1..=3) {
                let at = rng.random_range(0..=body.len());
                let byte = ALPHABET[rng.random_range(0..ALPHABET.len())];
                match rng.random_range(0..3) {
                    0 if at < body.len() => body[at] = byte,
                    1 if at < body.len() => {
                        body.remove(at);
                    }
                    _ => body.insert(at, byte),
                }
            }
            let ours = from_slice::<Value>(&body);
            let theirs = serde_json::from_slice::<Value>(&body).ok();
            // Skipping a value judges it as reading it does.
            assert_eq!(
                from_slice::<de::IgnoredAny>(&body).is_some(),
                ours.is_some(),
                "case {case}: {:?}",
                String::from_utf8_lossy(&body)
            );
            if ours.is_some() {
                read += 1;
                assert_eq!(
                    ours,
                    theirs,
                    "case {case}: {:?}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
        // The mutations must leave enough bodies valid for the comparison to mean something.
        assert!(read > 2_000, "only {read} mutated bodies were read");
    }

    #[test]
    fn a_plain_run_ends_at_the_first_byte_that_stops_it_wherever_it_lies() {
        let naive = |bytes: &[u8], pos: usize| {
            (pos..bytes.len())
                .find(|&i| STRING_STOP[usize::from(bytes[i])])
                .unwrap_or(bytes.len())
        };
        for stop in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
            // Past four words and two 32-byte blocks, each then a word and bytes.
            for len in 0..110 {
                for at in 0..=len {
                    // Bytes around the stop that come close to it: 0x20, 0x21, 0x5b, high bytes.
                    let mut bytes: Vec<u8> = (0..len)
                        .map(|i| [0x20, 0x21, 0x5b, 0x5d, 0x7f, 0x80, 0xc3, 0xff][i % 8])
                        .collect();
                    if at < len {
                        bytes[at] = stop;
                    }
                    for from in 0..=len.min(9) {
                        assert_eq!(
                            plain_run(&bytes, from),
                            naive(&bytes, from),
                            "stop {stop:#x} at {at} of {len}, from {from}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn object_entries_are_the_values_as_written() {
        let body =
            br#" { "model" : "m", "messages":[ {"a":1} ],"k\u00e9y":{"x":[1, 2]},"model":"n" } "#;
        let entries = object_entries(body).expect("an object");
        let entries: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_ref(), *v)).collect();
        assert_eq!(
            entries,
            [
                ("model", r#""m""#),
                ("messages", r#"[ {"a":1} ]"#),
                ("k\u{e9}y", r#"{"x":[1, 2]}"#),
                ("model", r#""n""#),
            ]
        );
        for not_one in [&b"[1]"[..], b"{\"a\":1,}", b"{\"a\":1} x", b"\"s\""] {
            assert!(object_entries(not_one).is_none(), "{not_one:?}");
        }
        assert_eq!(object_entries(b"{}").map(|e| e.len()), Some(0));
    }

    #[test]
    fn strings_without_escapes_are_borrowed() {
        struct Borrowed;
        impl<'de> de::Deserialize<'de> for Borrowed {
            fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Borrowed;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("a borrowed string")
                    }
                    fn visit_borrowed_str<E: de::Error>(self, _: &'de str) -> Result<Borrowed, E> {
                        Ok(Borrowed)
                    }
                }
                d.deserialize_str(V)
            }
        }
        assert!(from_slice::<Borrowed>(br#""plain""#).is_some());
        assert!(from_slice::<Borrowed>(br#""with \n escape""#).is_none());
    }
}
