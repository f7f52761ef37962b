//! `${VAR}` and `${VAR:-default}` interpolation into the parsed scalar values of the config.
//!
//! The YAML is parsed first and each scalar is interpolated as the typed structs read it
//! ([`Interpolating`] wraps the YAML deserializer), so a variable's value is always one scalar:
//! `abc #def` stays `abc #def` (pasted into the text it was cut at the `#`), and a value with a
//! newline cannot add keys. A scalar read as a number or boolean is parsed after interpolation, so
//! `weight: ${W:-0.5}` still works. Keys and comments are never interpolated. A missing variable
//! fails in the scalar that names it, so the error has that scalar's line and key path.

use std::cell::RefCell;
use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// `text` with every `${VAR}` / `${VAR:-default}` replaced; `Err(VAR)` for an unset variable
/// without a default. A `${` without a closing `}` is left as written. An empty variable counts as
/// unset when there is a default.
pub fn interpolate(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let expr = &after[..end];
        let (name, default) = match expr.split_once(":-") {
            Some((n, d)) => (n.trim(), Some(d)),
            None => (expr.trim(), None),
        };
        match env(name).filter(|v| !(v.is_empty() && default.is_some())) {
            Some(value) => out.push_str(&value),
            None => match default {
                Some(d) => out.push_str(d),
                None => return Err(name.to_owned()),
            },
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// What interpolation needs, shared by every wrapper of one deserialization.
pub struct Context<'e> {
    env: &'e dyn Fn(&str) -> Option<String>,
    /// The variable that was missing, when deserialization failed because of one.
    missing: RefCell<Option<String>>,
}

impl<'e> Context<'e> {
    pub fn new(env: &'e dyn Fn(&str) -> Option<String>) -> Context<'e> {
        Context {
            env,
            missing: RefCell::new(None),
        }
    }

    /// The unset variable that stopped deserialization, if that is what stopped it.
    pub fn missing_variable(&self) -> Option<String> {
        self.missing.borrow().clone()
    }
}

/// A deserializer that interpolates every scalar value `inner` yields.
pub struct Interpolating<'c, 'e, D> {
    inner: D,
    cx: &'c Context<'e>,
}

impl<'c, 'e, D> Interpolating<'c, 'e, D> {
    pub fn new(inner: D, cx: &'c Context<'e>) -> Self {
        Interpolating { inner, cx }
    }
}

/// What the reader asked for, which decides how an interpolated scalar is typed.
#[derive(Clone, Copy, PartialEq)]
enum Want {
    /// A string (or an identifier, such as an enum variant).
    Str,
    Bool,
    Int,
    Float,
    /// Self-describing (`serde_json::Value`, untagged enums): a scalar that is a single
    /// `${...}` becomes a number or boolean when its value reads as one.
    Any,
}

macro_rules! via_any {
    ($($method:ident => $want:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.inner.deserialize_any(Wrap { visitor, cx: self.cx, want: Want::$want })
        }
    )*};
}

macro_rules! same {
    ($($method:ident => $want:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.inner.$method(Wrap { visitor, cx: self.cx, want: Want::$want })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Interpolating<'_, '_, D> {
    type Error = D::Error;

    // The YAML deserializer refuses a scalar such as `${W}` when asked for a number or a boolean;
    // asked for anything, it hands the text over and `Wrap` parses the interpolated value.
    via_any! {
        deserialize_any => Any,
        deserialize_bool => Bool,
        deserialize_i8 => Int, deserialize_i16 => Int, deserialize_i32 => Int,
        deserialize_i64 => Int, deserialize_i128 => Int,
        deserialize_u8 => Int, deserialize_u16 => Int, deserialize_u32 => Int,
        deserialize_u64 => Int, deserialize_u128 => Int,
        deserialize_f32 => Float, deserialize_f64 => Float,
    }

    same! {
        deserialize_char => Str, deserialize_str => Str, deserialize_string => Str,
        deserialize_bytes => Str, deserialize_byte_buf => Str,
        deserialize_option => Any, deserialize_unit => Any,
        deserialize_seq => Any, deserialize_map => Any,
        deserialize_identifier => Str,
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_unit_struct(name, any(visitor, self.cx))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_newtype_struct(name, any(visitor, self.cx))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_tuple(len, any(visitor, self.cx))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_tuple_struct(name, len, any(visitor, self.cx))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_struct(name, fields, any(visitor, self.cx))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_enum(name, variants, any(visitor, self.cx))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        // Nothing reads an ignored value: a variable it names is not required.
        self.inner.deserialize_ignored_any(visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// `visitor` wrapped for a value of any shape.
fn any<'c, 'e, V>(visitor: V, cx: &'c Context<'e>) -> Wrap<'c, 'e, V> {
    Wrap {
        visitor,
        cx,
        want: Want::Any,
    }
}

/// A visitor that interpolates the scalars it is shown and wraps what it hands on.
struct Wrap<'c, 'e, V> {
    visitor: V,
    cx: &'c Context<'e>,
    want: Want,
}

impl<'de, V: Visitor<'de>> Wrap<'_, '_, V> {
    fn scalar<E: de::Error>(self, written: &str) -> Result<V::Value, E> {
        let value = match interpolate(written, self.cx.env) {
            Ok(v) => v,
            Err(var) => {
                let message = format!("environment variable {var} is not set");
                *self.cx.missing.borrow_mut() = Some(var);
                return Err(E::custom(message));
            }
        };
        let whole = written.starts_with("${")
            && written.ends_with('}')
            && written.matches("${").count() == 1;
        let v = self.visitor;
        let t = value.trim();
        match self.want {
            Want::Str => v.visit_string(value),
            Want::Bool => match t {
                "true" | "True" | "TRUE" => v.visit_bool(true),
                "false" | "False" | "FALSE" => v.visit_bool(false),
                _ => v.visit_string(value),
            },
            Want::Int | Want::Float => typed(v, value),
            Want::Any if whole => match t {
                "true" => v.visit_bool(true),
                "false" => v.visit_bool(false),
                _ => typed(v, value),
            },
            Want::Any => v.visit_string(value),
        }
    }
}

/// The value as the number it reads as, else as the string (which the visitor then refuses with
/// its own "invalid type" message).
fn typed<'de, V: Visitor<'de>, E: de::Error>(v: V, value: String) -> Result<V::Value, E> {
    let t = value.trim();
    if let Ok(n) = t.parse::<u64>() {
        v.visit_u64(n)
    } else if let Ok(n) = t.parse::<i64>() {
        v.visit_i64(n)
    } else if let Ok(x) = t.parse::<f64>() {
        v.visit_f64(x)
    } else {
        v.visit_string(value)
    }
}

macro_rules! forward {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<E: de::Error>(self, value: $ty) -> Result<Self::Value, E> {
            self.visitor.$method(value)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<'_, '_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    forward! {
        visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64),
        visit_i128(i128), visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64),
        visit_u128(u128), visit_f32(f32), visit_f64(f64), visit_char(char),
        visit_bytes(&[u8]), visit_borrowed_bytes(&'de [u8]), visit_byte_buf(Vec<u8>),
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        if v.contains("${") {
            self.scalar(v)
        } else {
            self.visitor.visit_str(v)
        }
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        if v.contains("${") {
            self.scalar(v)
        } else {
            self.visitor.visit_borrowed_str(v)
        }
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        if v.contains("${") {
            self.scalar(&v)
        } else {
            self.visitor.visit_string(v)
        }
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<V::Value, D2::Error> {
        self.visitor.visit_some(Interpolating::new(d, self.cx))
    }

    fn visit_newtype_struct<D2: Deserializer<'de>>(self, d: D2) -> Result<V::Value, D2::Error> {
        self.visitor
            .visit_newtype_struct(Interpolating::new(d, self.cx))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_seq(Access {
            inner: seq,
            cx: self.cx,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(Access {
            inner: map,
            cx: self.cx,
        })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(Access {
            inner: data,
            cx: self.cx,
        })
    }
}

/// A sequence, map, enum or variant whose values are interpolated (map keys are not).
struct Access<'c, 'e, A> {
    inner: A,
    cx: &'c Context<'e>,
}

/// A seed whose deserializer interpolates.
struct Seed<'c, 'e, S> {
    seed: S,
    cx: &'c Context<'e>,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, '_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Interpolating::new(d, self.cx))
    }
}

impl<'c, 'e, A> Access<'c, 'e, A> {
    fn seed<S>(&self, seed: S) -> Seed<'c, 'e, S> {
        Seed { seed, cx: self.cx }
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Access<'_, '_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_element_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Access<'_, '_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.inner.next_key_seed(seed)
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'c, 'e, 'de, A: EnumAccess<'de>> EnumAccess<'de> for Access<'c, 'e, A> {
    type Error = A::Error;
    type Variant = Access<'c, 'e, A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), A::Error> {
        let cx = self.cx;
        let (value, variant) = self.inner.variant_seed(Seed { seed, cx })?;
        Ok((value, Access { inner: variant, cx }))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Access<'_, '_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.newtype_variant_seed(seed)
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        let cx = self.cx;
        self.inner.tuple_variant(
            len,
            Wrap {
                visitor,
                cx,
                want: Want::Any,
            },
        )
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let cx = self.cx;
        self.inner.struct_variant(
            fields,
            Wrap {
                visitor,
                cx,
                want: Want::Any,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "SET" => Some("value".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn substitutes_set_variables_and_defaults() {
        assert_eq!(interpolate("a ${SET} b", &env).unwrap(), "a value b");
        assert_eq!(interpolate("${UNSET:-dflt}", &env).unwrap(), "dflt");
        assert_eq!(interpolate("${EMPTY:-x}", &env).unwrap(), "x");
        assert_eq!(interpolate("${UNSET:-}", &env).unwrap(), "");
        assert_eq!(interpolate("${EMPTY}", &env).unwrap(), "");
    }

    #[test]
    fn missing_variable_is_named() {
        assert_eq!(interpolate("x ${NOPE}", &env).unwrap_err(), "NOPE");
    }

    #[test]
    fn unclosed_braces_are_left_alone() {
        assert_eq!(interpolate("${oops", &env).unwrap(), "${oops");
    }
}
