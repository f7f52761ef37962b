//! Renaming the model in an upstream's JSON text without re-serialising it: the client asked for
//! the public name and should not learn which deployment answered.

use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use parking_lot::RwLock;

use crate::id_map::IdMap;

/// Replaces the first `"model":"<provider id>"` (or `"model": "<provider id>"`) with the public
/// name. Its needles are what every event of a stream is searched for (a SIMD substring search:
/// scanning for the first byte stopped at every quote). Building those searchers cost ~20,000
/// instructions per stream (callgrind, a twentieth of a relayed stream), so the searchers of a
/// pair of names are built once per process and shared.
#[derive(Debug, Clone)]
pub struct ModelRename(Option<Arc<Needles>>);

#[derive(Debug)]
struct Needles {
    /// `"model":` and `"model": ` each followed by the JSON-quoted provider id, in the order they
    /// are tried.
    needles: Vec<(memchr::memmem::Finder<'static>, usize)>,
    /// The public name, JSON-quoted.
    replacement: Vec<u8>,
}

/// Pairs of names whose searchers are kept; past it the cache starts over (models and aliases
/// are few: this only bounds it).
const BUILT_LIMIT: usize = 4096;

/// The searchers built so far, by provider id, then public name: both levels are looked up by
/// `&str`, so finding a pair allocates nothing (a joined key was a `format!` per request). The
/// names are the operator's (a public name reaches here only once it resolved to a model).
type Built = IdMap<String, IdMap<String, Arc<Needles>>>;
static BUILT: LazyLock<RwLock<Built>> = LazyLock::new(Default::default);

impl ModelRename {
    pub fn new(provider_model_id: &str, public_model: &str) -> Self {
        if provider_model_id == public_model {
            return Self(None);
        }
        if let Some(built) = BUILT
            .read()
            .get(provider_model_id)
            .and_then(|by_public| by_public.get(public_model))
        {
            return Self(Some(built.clone()));
        }
        let Some(built) = Needles::build(provider_model_id, public_model) else {
            return Self(None);
        };
        let built = Arc::new(built);
        let mut cache = BUILT.write();
        if cache.values().map(IdMap::len).sum::<usize>() >= BUILT_LIMIT {
            cache.clear();
        }
        cache
            .entry(provider_model_id.to_owned())
            .or_default()
            .insert(public_model.to_owned(), built.clone());
        Self(Some(built))
    }

    /// `body` with the model renamed; the same bytes (no copy) when it does not name the
    /// provider's model.
    pub fn apply(&self, body: Bytes) -> Bytes {
        match (&self.0, self.locate(&body)) {
            (Some(needles), Some(at)) => {
                let mut out = Vec::with_capacity(body.len() + needles.replacement.len());
                needles.splice(&body, at, &mut out);
                Bytes::from(out)
            }
            _ => body,
        }
    }

    /// Appends `data` to `out`, renamed.
    pub fn apply_into(&self, data: &[u8], out: &mut Vec<u8>) {
        match (&self.0, self.locate(data)) {
            (Some(needles), Some(at)) => needles.splice(data, at, out),
            _ => out.extend_from_slice(data),
        }
    }

    /// For the events a delta template reads (`head`, a JSON string's contents, `tail`; `head`
    /// ending in the key that opens the string): what their renamed text starts with in place of
    /// `head`, the rest staying as it is. `None` when nothing is renamed, or when `tail` names
    /// the model, which only [`ModelRename::apply_into`] on the whole event handles.
    ///
    /// Exact, so the search runs once per template instead of once per event: a needle starts
    /// with a quote and holds more, the string's contents hold no raw quote, and the string's
    /// opening quote follows a key's `":`, never `"model":`, so a needle found in such an event
    /// lies whole in `head` or in `tail` (the tests hold both ways of renaming to one result).
    pub fn renamed_head(&self, head: &str, tail: &str) -> Option<Vec<u8>> {
        let needles = self.0.as_ref()?;
        if needles.locate(tail.as_bytes()).is_some() {
            return None;
        }
        let mut out = Vec::with_capacity(head.len() + needles.replacement.len());
        self.apply_into(head.as_bytes(), &mut out);
        Some(out)
    }

    /// Which needle matched and where.
    fn locate(&self, data: &[u8]) -> Option<(usize, usize)> {
        self.0.as_ref()?.locate(data)
    }
}

impl Needles {
    fn build(provider_model_id: &str, public_model: &str) -> Option<Self> {
        let quoted = |s: &str| serde_json::to_string(s).ok();
        let (needle, replacement) = (quoted(provider_model_id)?, quoted(public_model)?);
        let needles = ["\"model\":", "\"model\": "]
            .iter()
            .map(|sep| {
                let needle = format!("{sep}{needle}");
                (
                    memchr::memmem::Finder::new(needle.as_bytes()).into_owned(),
                    sep.len(),
                )
            })
            .collect();
        Some(Self {
            needles,
            replacement: replacement.into_bytes(),
        })
    }

    fn locate(&self, data: &[u8]) -> Option<(usize, usize)> {
        self.needles
            .iter()
            .enumerate()
            .find_map(|(n, (needle, _))| needle.find(data).map(|at| (n, at)))
    }

    fn splice(&self, data: &[u8], (n, at): (usize, usize), out: &mut Vec<u8>) {
        let (needle, sep_len) = &self.needles[n];
        out.extend_from_slice(&data[..at + sep_len]);
        out.extend_from_slice(&self.replacement);
        out.extend_from_slice(&data[at + needle.needle().len()..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_the_first_match_in_compact_and_spaced_json() {
        let r = ModelRename::new("sim-small", "demo-chat");
        let out = r.apply(Bytes::from_static(
            br#"{"id":"x","model":"sim-small","choices":[]}"#,
        ));
        assert_eq!(&out[..], br#"{"id":"x","model":"demo-chat","choices":[]}"#);
        let r = ModelRename::new("a/b", "pub");
        assert_eq!(
            &r.apply(Bytes::from_static(br#"{"model": "a/b"}"#))[..],
            br#"{"model": "pub"}"#
        );
        let mut out = b"data: ".to_vec();
        r.apply_into(br#"{"model":"a/b","x":"model"}"#, &mut out);
        assert_eq!(&out[..], br#"data: {"model":"pub","x":"model"}"#);
    }

    /// A templated event renamed by its head is what renaming the whole event gives, whatever
    /// its text (quotes, escapes, the model's own name in it), with the model before the text,
    /// after it, nowhere or twice.
    #[test]
    fn a_renamed_head_gives_what_renaming_the_whole_event_gives() {
        let rename = ModelRename::new("sim-small", "demo-chat");
        let frames = [
            (
                r#"{"id":"c","model":"sim-small","choices":[{"delta":{"content":""#,
                r#""}}]}"#,
            ),
            (
                r#"{"id":"c","choices":[{"delta":{"content":""#,
                r#""}}],"model":"sim-small"}"#,
            ),
            (
                r#"{"model": "sim-small","delta":{"text":""#,
                r#""},"model":"sim-small"}"#,
            ),
            (
                r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":""#,
                r#""}}"#,
            ),
        ];
        let texts = [
            "",
            "hi",
            r#"\"model\":\"sim-small\""#,
            "model",
            r#"sim-small\\"#,
            r#"\u0022"#,
            "caf\u{e9}",
        ];
        for (head, tail) in frames {
            let renamed_head = rename.renamed_head(head, tail);
            for text in texts {
                let event = format!("{head}{text}{tail}");
                let mut whole = Vec::new();
                rename.apply_into(event.as_bytes(), &mut whole);
                match &renamed_head {
                    Some(renamed) => {
                        let mut by_head = renamed.clone();
                        by_head.extend_from_slice(&event.as_bytes()[head.len()..]);
                        assert_eq!(
                            String::from_utf8_lossy(&by_head),
                            String::from_utf8_lossy(&whole),
                            "{event}"
                        );
                    }
                    // Only a tail that names the model is left to the whole event's rename.
                    None => assert!(tail.contains("sim-small"), "{event}"),
                }
            }
        }
        assert!(ModelRename::new("m", "m").renamed_head("{", "}").is_none());
    }

    #[test]
    fn leaves_other_models_and_equal_names_alone() {
        let body = Bytes::from_static(br#"{"model":"other"}"#);
        assert_eq!(ModelRename::new("sim", "pub").apply(body.clone()), body);
        assert_eq!(ModelRename::new("sim", "sim").apply(body.clone()), body);
        // A quote in the id is matched in its escaped form.
        let r = ModelRename::new("a\"b", "p");
        assert_eq!(
            &r.apply(Bytes::from_static(br#"{"model":"a\"b"}"#))[..],
            br#"{"model":"p"}"#
        );
    }

    #[test]
    fn renames_with_one_searcher_per_pair_of_names() {
        let a = ModelRename::new("shared-sim", "shared-pub");
        let b = ModelRename::new("shared-sim", "shared-pub");
        let (Some(a), Some(b)) = (&a.0, &b.0) else {
            panic!("a rename between different names has searchers");
        };
        assert!(Arc::ptr_eq(a, b), "built once, shared");
        // Pairs are kept apart by both names, not by a joined key: no other pair shares them.
        let other = ModelRename::new("shared-simshared", "-pub");
        assert!(!Arc::ptr_eq(a, other.0.as_ref().unwrap()));
        let out = ModelRename::new("shared-sim", "shared-pub")
            .apply(Bytes::from_static(br#"{"model":"shared-sim"}"#));
        assert_eq!(&out[..], br#"{"model":"shared-pub"}"#);
    }
}
