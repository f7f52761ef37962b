//! Renaming the model in an upstream's JSON text without re-serialising it: the client asked for
//! the public name and should not learn which deployment answered.

use bytes::Bytes;

/// Replaces the first `"model":"<provider id>"` (or `"model": "<provider id>"`) with the public
/// name. Built once per answer or stream: its needles are what every event of a stream is searched
/// for (with a SIMD substring search: scanning for the first byte stopped at every quote), and
/// building them per event showed in profiles.
#[derive(Debug, Clone)]
pub struct ModelRename {
    /// `"model":` and `"model": ` each followed by the JSON-quoted provider id, in the order they
    /// are tried; empty when the names are equal (nothing to do).
    needles: Vec<(memchr::memmem::Finder<'static>, usize)>,
    /// The public name, JSON-quoted.
    replacement: Vec<u8>,
}

impl ModelRename {
    pub fn new(provider_model_id: &str, public_model: &str) -> Self {
        let quoted = |s: &str| serde_json::to_string(s).ok();
        let (Some(needle), Some(replacement)) = (quoted(provider_model_id), quoted(public_model))
        else {
            return Self::none();
        };
        if provider_model_id == public_model {
            return Self::none();
        }
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
        Self {
            needles,
            replacement: replacement.into_bytes(),
        }
    }

    fn none() -> Self {
        Self {
            needles: Vec::new(),
            replacement: Vec::new(),
        }
    }

    /// `body` with the model renamed; the same bytes (no copy) when it does not name the
    /// provider's model.
    pub fn apply(&self, body: Bytes) -> Bytes {
        match self.locate(&body) {
            Some(at) => {
                let mut out = Vec::with_capacity(body.len() + self.replacement.len());
                self.splice(&body, at, &mut out);
                Bytes::from(out)
            }
            None => body,
        }
    }

    /// Appends `data` to `out`, renamed.
    pub fn apply_into(&self, data: &[u8], out: &mut Vec<u8>) {
        match self.locate(data) {
            Some(at) => self.splice(data, at, out),
            None => out.extend_from_slice(data),
        }
    }

    /// Which needle matched and where.
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
}
