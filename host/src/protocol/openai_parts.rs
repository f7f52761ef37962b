//! Message content of the two OpenAI dialects: a string, or an array of typed parts.
//!
//! Chat Completions and Responses share the shape of `content` and most part types, but each
//! names images its own way and accepts a few types the other does not. [`Parts`] says which
//! dialect's set applies, so the differences stay visible in one `match`:
//!
//! | part type                     | Chat | Responses |
//! |-------------------------------|------|-----------|
//! | `text`, `refusal`             | yes  | yes       |
//! | `input_audio`                 | yes  | yes       |
//! | `input_text`, `output_text`   | no   | yes       |
//! | `image_url` (`{url, detail}`) | yes  | no        |
//! | `video_url`                   | yes  | no        |
//! | `input_image` (flat fields)   | no   | yes       |

use serde_json::Value;

use crate::protocol::ProtocolError;
use crate::protocol::ir::{ImageSource, Part};
use crate::protocol::json::Obj;

/// Whose content parts to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parts {
    /// Chat Completions (`messages[].content`).
    Chat,
    /// Responses (`input[].content`, `function_call_output.output`).
    Responses,
}

impl Parts {
    /// The accepted types, as listed in the error for any other.
    fn accepted(self) -> &'static str {
        match self {
            Parts::Chat => "text, image_url, input_audio, video_url, refusal",
            Parts::Responses => "input_text, input_image, input_audio, output_text, refusal",
        }
    }
}

/// The parts of a `content` value found at `path`: none when absent, one text part for a string.
pub(crate) fn content(
    v: Option<&Value>,
    path: &str,
    set: Parts,
) -> Result<Vec<Part>, ProtocolError> {
    match v {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![Part::text(s.as_str())]),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| part(p, &format!("{path}[{j}]"), set))
            .collect(),
        Some(other) => Err(ProtocolError::wrong_type(
            path,
            "a string or an array of parts",
            other,
        )),
    }
}

fn part(v: &Value, path: &str, set: Parts) -> Result<Part, ProtocolError> {
    let p = Obj::at(v, path)?;
    match (set, p.req_str("type")?) {
        (_, "text") | (Parts::Responses, "input_text" | "output_text") => {
            Ok(Part::text(p.str("text")?.unwrap_or("")))
        }
        (_, "refusal") => Ok(Part::text(p.str("refusal")?.unwrap_or(""))),
        (_, "input_audio") => audio(&p),
        (Parts::Chat, "image_url") => chat_image(&p),
        (Parts::Chat, "video_url") => chat_video(&p),
        (Parts::Responses, "input_image") => responses_image(&p),
        (_, other) => Err(ProtocolError::unsupported(
            format!("{path}.type"),
            format!("`{other}` is not supported ({})", set.accepted()),
        )),
    }
}

/// `{"type":"input_audio","input_audio":{"data","format"}}`, the same in both dialects.
fn audio(p: &Obj) -> Result<Part, ProtocolError> {
    let a_path = p.path("input_audio");
    let a = Obj::at(
        p.get("input_audio")
            .ok_or_else(|| p.missing("input_audio"))?,
        &a_path,
    )?;
    Ok(Part::Audio {
        data: a.req_str("data")?.to_owned(),
        format: a.req_str("format")?.to_owned(),
    })
}

/// Chat's image: the spec nests `{url, detail}`; a bare string is a common client shortcut.
fn chat_image(p: &Obj) -> Result<Part, ProtocolError> {
    let (url, detail) = match p.get("image_url") {
        Some(Value::String(u)) => (u.as_str(), None),
        Some(inner) => {
            let path = p.path("image_url");
            let o = Obj::at(inner, &path)?;
            (o.req_str("url")?, o.str("detail")?.map(str::to_owned))
        }
        None => return Err(p.missing("image_url")),
    };
    Ok(Part::Image {
        source: ImageSource::from_url(url),
        detail,
        cache_control: None,
    })
}

/// Chat's video: `{url}` or a bare string, like its image.
fn chat_video(p: &Obj) -> Result<Part, ProtocolError> {
    let url = match p.get("video_url") {
        Some(Value::String(u)) => u.clone(),
        Some(inner) => {
            let path = p.path("video_url");
            Obj::at(inner, &path)?.req_str("url")?.to_owned()
        }
        None => return Err(p.missing("video_url")),
    };
    Ok(Part::Video { url })
}

/// Responses' image: `image_url` and `detail` sit on the part itself.
fn responses_image(p: &Obj) -> Result<Part, ProtocolError> {
    let Some(url) = p.str("image_url")? else {
        return Err(ProtocolError::unsupported(
            p.path("image_url"),
            "is required (uploaded `file_id` images are not supported)",
        ));
    };
    Ok(Part::Image {
        source: ImageSource::from_url(url),
        detail: p.str("detail")?.map(str::to_owned),
        cache_control: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(set: Parts, part: Value) -> Result<Part, String> {
        let mut parts = content(Some(&json!([part])), "c", set).map_err(|e| e.to_string())?;
        Ok(parts.remove(0))
    }

    #[test]
    fn each_dialect_accepts_its_own_part_types_only() {
        let text = |t: &str| json!({"type": t, "text": "x"});
        for t in ["text", "refusal", "input_audio"] {
            let p = match t {
                "refusal" => json!({"type": t, "refusal": "no"}),
                "input_audio" => json!({"type": t, "input_audio": {"data": "AA", "format": "wav"}}),
                _ => text(t),
            };
            assert!(parse(Parts::Chat, p.clone()).is_ok(), "chat {t}");
            assert!(parse(Parts::Responses, p).is_ok(), "responses {t}");
        }
        for t in ["input_text", "output_text"] {
            assert_eq!(parse(Parts::Responses, text(t)), Ok(Part::text("x")));
            let err = parse(Parts::Chat, text(t)).unwrap_err();
            assert_eq!(
                err,
                format!(
                    "`c[0].type` `{t}` is not supported (text, image_url, input_audio, video_url, refusal)"
                )
            );
        }
        let chat_only = [
            json!({"type": "image_url", "image_url": {"url": "https://x/i.png", "detail": "low"}}),
            json!({"type": "image_url", "image_url": "https://x/i.png"}),
            json!({"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}),
            json!({"type": "video_url", "video_url": "https://x/v.mp4"}),
        ];
        for p in chat_only {
            assert!(parse(Parts::Chat, p.clone()).is_ok(), "{p}");
            let err = parse(Parts::Responses, p.clone()).unwrap_err();
            assert!(
                err.ends_with(
                    "is not supported (input_text, input_image, input_audio, output_text, refusal)"
                ),
                "{err}"
            );
        }
        let responses_image =
            json!({"type": "input_image", "image_url": "https://x/i.png", "detail": "high"});
        assert_eq!(
            parse(Parts::Responses, responses_image.clone()),
            Ok(Part::Image {
                source: ImageSource::from_url("https://x/i.png"),
                detail: Some("high".into()),
                cache_control: None,
            })
        );
        assert!(
            parse(Parts::Chat, responses_image)
                .unwrap_err()
                .contains("`input_image` is not supported")
        );
    }

    #[test]
    fn missing_media_names_the_field() {
        assert_eq!(
            parse(Parts::Chat, json!({"type": "image_url"})).unwrap_err(),
            "`c[0].image_url` is required"
        );
        assert_eq!(
            parse(Parts::Chat, json!({"type": "video_url"})).unwrap_err(),
            "`c[0].video_url` is required"
        );
        assert_eq!(
            parse(
                Parts::Responses,
                json!({"type": "input_image", "file_id": "f"})
            )
            .unwrap_err(),
            "`c[0].image_url` is required (uploaded `file_id` images are not supported)"
        );
        for set in [Parts::Chat, Parts::Responses] {
            assert_eq!(
                parse(set, json!({"type": "input_audio"})).unwrap_err(),
                "`c[0].input_audio` is required"
            );
            assert_eq!(
                content(Some(&json!(3)), "c", set).unwrap_err().to_string(),
                "`c` must be a string or an array of parts, not a number"
            );
        }
    }
}
