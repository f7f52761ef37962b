//! Typed access to untyped JSON with error messages that name the offending field.
//!
//! Bodies are read as `serde_json::Value` rather than derived structs so that every wrong type
//! yields a reason a client can act on (`` `messages[2].content` must be a string or an array``)
//! and nothing on any input can panic.

use serde_json::{Map, Value};

use super::ProtocolError;

/// Parses a body, or says why it is not JSON.
pub fn parse(bytes: &[u8]) -> Result<Value, ProtocolError> {
    serde_json::from_slice(bytes).map_err(ProtocolError::NotJson)
}

/// A JSON object plus the path it was found at (empty for the body itself).
#[derive(Clone, Copy)]
pub struct Obj<'a, 'p> {
    pub map: &'a Map<String, Value>,
    path: &'p str,
}

/// The path of `key` inside the object at `path`.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
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
            Value::Object(map) => Ok(Self { map, path: "" }),
            _ => Err(ProtocolError::BodyNotObject),
        }
    }

    /// `v`, which must be an object, found at `path`.
    pub fn at(v: &'a Value, path: &'p str) -> Result<Self, ProtocolError> {
        match v {
            Value::Object(map) => Ok(Self { map, path }),
            other => Err(ProtocolError::wrong_type(path, "an object", other)),
        }
    }

    pub fn path(&self, key: &str) -> String {
        join(self.path, key)
    }

    /// The value of `key`; `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
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
}
