//! Server-sent event framing: writing frames, and a small reader for tests and the mock.

use bytes::Bytes;
use serde_json::Value;

/// `data: <json>\n\n`, the framing of Chat Completions chunks.
pub fn data_frame(data: &Value) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// `event: <name>\ndata: <json>\n\n`, the framing of Responses and Anthropic events.
pub fn event_frame(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// One parsed server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty when absent.
    pub event: String,
    pub data: String,
}

/// Splits a complete SSE text into events (per the HTML spec: `data` lines joined with `\n`,
/// comments and unknown fields ignored, events without data skipped).
pub fn parse(text: &str) -> Vec<SseEvent> {
    let mut out = Vec::new();
    let mut event = String::new();
    let mut data: Option<String> = None;
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if let Some(d) = data.take() {
                out.push(SseEvent {
                    event: std::mem::take(&mut event),
                    data: d,
                });
            }
            event.clear();
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => event = value.to_owned(),
            "data" => match data.as_mut() {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
    if let Some(d) = data {
        out.push(SseEvent { event, data: d });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_writes() {
        let mut text = String::new();
        text.push_str(std::str::from_utf8(&data_frame(&serde_json::json!({"a":1}))).unwrap());
        text.push_str(": comment\n\n");
        text.push_str(
            std::str::from_utf8(&event_frame("ping", &serde_json::json!({"type":"ping"}))).unwrap(),
        );
        text.push_str("data: line1\r\ndata: line2\r\n\r\n");
        let events = parse(&text);
        assert_eq!(
            events,
            vec![
                SseEvent {
                    event: String::new(),
                    data: r#"{"a":1}"#.into()
                },
                SseEvent {
                    event: "ping".into(),
                    data: r#"{"type":"ping"}"#.into()
                },
                SseEvent {
                    event: String::new(),
                    data: "line1\nline2".into()
                },
            ]
        );
    }
}
