//! Names the request path looks maps up by, compared by pointer before their text.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::ops::Deref;
use std::rc::Rc;

/// An endpoint id or model name shared by `Rc`. Two names holding the same `Rc` are equal
/// without reading their text: the latency profiles are keyed by the very `Rc` each route holds,
/// and the output predictor by the router's own model name, so a request's lookups find their
/// entry by pointer. In the component a string comparison is wasi-libc's byte-by-byte `memcmp`:
/// four of them, one per lookup, were ~2,000 of a request's guest instructions.
///
/// Orders and compares as `str` does (the pointer only ever answers "equal" for equal text), so
/// a map keyed by it can still be searched by `&str`.
#[derive(Clone)]
pub struct SharedName(Rc<str>);

impl SharedName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for SharedName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SharedName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for SharedName {
    fn from(text: &str) -> Self {
        SharedName(text.into())
    }
}

impl PartialEq for SharedName {
    fn eq(&self, other: &Self) -> bool {
        Rc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for SharedName {}

impl Ord for SharedName {
    fn cmp(&self, other: &Self) -> Ordering {
        if Rc::ptr_eq(&self.0, &other.0) {
            return Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

impl PartialOrd for SharedName {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for SharedName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn names_order_as_their_text_whether_shared_or_not() {
        let texts = ["b", "a", "ab", "", "ba", "a\u{e9}", "b"];
        for x in texts {
            for y in texts {
                let (a, b) = (SharedName::from(x), SharedName::from(y));
                assert_eq!(a.cmp(&b), x.cmp(y), "{x:?} {y:?}");
                assert_eq!(a == b, x == y, "{x:?} {y:?}");
            }
            let shared = SharedName::from(x);
            assert_eq!(shared.cmp(&shared.clone()), Ordering::Equal);
        }
    }

    #[test]
    fn a_map_keyed_by_names_finds_an_entry_by_its_rc_by_other_text_and_by_str() {
        let key = SharedName::from("model-a:local-9001");
        let mut map = BTreeMap::new();
        map.insert(SharedName::from("model-a:local-9000"), 0);
        map.insert(key.clone(), 1);
        map.insert(SharedName::from("model-b:local-9001"), 2);
        assert_eq!(map.get(&key), Some(&1));
        assert_eq!(map.get(&SharedName::from("model-a:local-9001")), Some(&1));
        assert_eq!(map.get("model-a:local-9001"), Some(&1));
        assert_eq!(map.get("model-a:local-9002"), None);
    }
}
