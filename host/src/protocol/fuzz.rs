//! Robustness: random, truncated, mistyped and deeply nested inputs into every parser, decoder
//! and encoder. Nothing may panic; every parse ends in a value or an error string, and whatever
//! parses builds valid JSON for every dialect.
//!
//! A seeded generator (not proptest) keeps the runs reproducible and dependency-free; the seed of a
//! failing case is in the assertion message.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

use super::Dialect;
use super::ir::{FinishReason, StreamEvent, Usage};

/// Keys the parsers look at, so random objects reach deep code paths.
const KEYS: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "image_url",
    "url",
    "detail",
    "input_audio",
    "data",
    "format",
    "tool_calls",
    "id",
    "function",
    "name",
    "arguments",
    "tool_call_id",
    "tools",
    "parameters",
    "tool_choice",
    "stream",
    "max_tokens",
    "stop",
    "response_format",
    "json_schema",
    "schema",
    "reasoning_effort",
    "metadata",
    "user",
    "system",
    "source",
    "media_type",
    "tool_use_id",
    "input",
    "input_schema",
    "thinking",
    "budget_tokens",
    "signature",
    "is_error",
    "cache_control",
    "instructions",
    "call_id",
    "output",
    "summary",
    "effort",
    "reasoning",
    "max_output_tokens",
    "choices",
    "message",
    "delta",
    "finish_reason",
    "usage",
    "prompt_tokens",
    "index",
    "content_block",
    "partial_json",
    "stop_reason",
    "response",
    "status",
    "item",
    "output_index",
    "error",
    "incomplete_details",
    "previous_response_id",
];

/// String values that are meaningful somewhere.
const WORDS: &[&str] = &[
    "user",
    "assistant",
    "system",
    "developer",
    "tool",
    "function",
    "text",
    "image_url",
    "input_audio",
    "video_url",
    "image",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "base64",
    "url",
    "input_text",
    "input_image",
    "output_text",
    "function_call",
    "function_call_output",
    "message",
    "reasoning",
    "auto",
    "none",
    "any",
    "required",
    "enabled",
    "disabled",
    "json_object",
    "json_schema",
    "high",
    "low",
    "stop",
    "length",
    "tool_calls",
    "end_turn",
    "max_tokens",
    "completed",
    "incomplete",
    "failed",
    "text_delta",
    "input_json_delta",
    "thinking_delta",
    "signature_delta",
    "data:image/png;base64,AAAA",
    "data:",
    "",
    "{",
    "[DONE]",
];

fn random_value(rng: &mut StdRng, depth: u32) -> Value {
    let leaf = depth == 0 || rng.random_bool(0.4);
    match rng.random_range(0..if leaf { 5 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => match rng.random_range(0..4) {
            0 => json!(rng.random::<i64>()),
            1 => json!(rng.random_range(0..200_000u64)),
            2 => json!(rng.random::<f64>() * 4.0 - 1.0),
            _ => json!(u64::MAX),
        },
        3 => Value::String(WORDS[rng.random_range(0..WORDS.len())].to_owned()),
        4 => {
            let len = rng.random_range(0..12);
            Value::String((0..len).map(|_| rng.random::<char>()).collect())
        }
        5 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.random_range(0..6) {
                m.insert(
                    KEYS[rng.random_range(0..KEYS.len())].to_owned(),
                    random_value(rng, depth - 1),
                );
            }
            Value::Object(m)
        }
    }
}

/// Replaces one random node of `v` with a random value.
fn mutate(v: &mut Value, rng: &mut StdRng) {
    let children = match v {
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        _ => 0,
    };
    if children == 0 || rng.random_bool(0.25) {
        *v = random_value(rng, 3);
        return;
    }
    let i = rng.random_range(0..children);
    match v {
        Value::Array(a) => mutate(&mut a[i], rng),
        Value::Object(o) => {
            if let Some((_, child)) = o.iter_mut().nth(i) {
                mutate(child, rng);
            }
        }
        _ => {}
    }
}

fn seeds() -> Vec<Value> {
    vec![
        json!({"model": "m", "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "r"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}, "stream": true, "stop": ["x"],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}}, "reasoning_effort": "low"}),
        json!({"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "s"}], "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "tool_use", "id": "c", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": [{"type": "text", "text": "r"}], "is_error": true}]}],
            "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 2000}}),
        json!({"model": "m", "instructions": "i", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "t"}, {"type": "input_image", "image_url": "https://x"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "r"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}],
            "tools": [{"type": "function", "name": "f"}], "reasoning": {"effort": "high"}, "text": {"format": {"type": "json_object"}}}),
        json!({"id": "a", "model": "m", "choices": [{"message": {"content": "x", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 1}}}),
        // The common Chat answer: text only, the usage with both details objects.
        json!({"id": "b", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "x", "refusal": null}, "logprobs": null, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}, "completion_tokens_details": {"reasoning_tokens": 1}}}),
        json!({"id": "a", "type": "message", "model": "m", "content": [{"type": "text", "text": "x"}, {"type": "tool_use", "id": "c", "name": "f", "input": {}}],
               "stop_reason": "tool_use", "usage": {"input_tokens": 1, "cache_read_input_tokens": 2}}),
        json!({"id": "a", "object": "response", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "model": "m",
               "output": [{"type": "message", "content": [{"type": "output_text", "text": "x"}]}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}],
               "usage": {"input_tokens": 1}}),
    ]
}

/// Everything that takes bytes, applied to `body`: parses never panic, what parses builds, and
/// what a dialect's scan accepts its parse accepts and reads alike. Returns how many scans
/// accepted `body`.
fn exercise(body: &[u8], case: &str) -> usize {
    let mut scanned_bodies = 0;
    for d in Dialect::ALL {
        match d.parse_request(body) {
            Ok(r) => {
                let _ = (r.prompt_token_estimate(), r.modalities());
                for up in Dialect::ALL {
                    let built = up.build_request(&r, "up");
                    assert!(
                        serde_json::from_slice::<Value>(&built).is_ok(),
                        "{case}: {d} → {up} built invalid JSON"
                    );
                }
            }
            Err(reason) => assert!(!reason.to_string().is_empty(), "{case}: empty reason"),
        }
        // The key-by-key reading of a Chat answer is never looser than the scan by fields, and
        // reads what it reads.
        if d == Dialect::OpenAiChat
            && let Some(pulled) = super::openai_chat::pull_response(body)
        {
            assert_eq!(
                Some(pulled),
                super::openai_chat::scan_by_fields(body),
                "{case}: the pull reading accepts what the scan by fields does not, or reads it otherwise"
            );
        }
        if let Some(scanned) = d.scan_response(body) {
            scanned_bodies += 1;
            match d.parse_response(body) {
                Ok(r) => assert_eq!(
                    (scanned.usage, scanned.model.as_str()),
                    (r.usage, r.model.as_str()),
                    "{case}: {d}'s scan reads other usage or another model than its parse"
                ),
                Err(e) => panic!("{case}: {d}'s scan accepts what its parse rejects: {e}"),
            }
        }
        match d.parse_response(body) {
            Ok(r) => {
                for client in Dialect::ALL {
                    let built = client.build_response(&r, "pub");
                    assert!(
                        serde_json::from_slice::<Value>(&built).is_ok(),
                        "{case}: {d} → {client} built invalid JSON"
                    );
                }
            }
            Err(reason) => assert!(!reason.to_string().is_empty(), "{case}: empty reason"),
        }
    }
    let _ = super::parse_embeddings_request(body);
    scanned_bodies
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = StdRng::seed_from_u64(1);
    for i in 0..2000 {
        let len = rng.random_range(0..200);
        let body: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        exercise(&body, &format!("random bytes #{i}"));
    }
}

#[test]
fn every_truncation_of_valid_bodies_is_handled() {
    for (s, seed) in seeds().iter().enumerate() {
        let body = serde_json::to_vec(seed).unwrap();
        for cut in 0..body.len() {
            exercise(&body[..cut], &format!("seed {s} cut at {cut}"));
        }
        exercise(&body, &format!("seed {s} whole"));
    }
}

#[test]
fn mutated_and_random_json_never_panics() {
    let seeds = seeds();
    let mut scanned = 0;
    for i in 0..4000u64 {
        let mut rng = StdRng::seed_from_u64(i);
        let v = if i % 4 == 0 {
            random_value(&mut rng, 6)
        } else {
            let mut v = seeds[rng.random_range(0..seeds.len())].clone();
            for _ in 0..rng.random_range(1..4) {
                mutate(&mut v, &mut rng);
            }
            v
        };
        scanned += exercise(&serde_json::to_vec(&v).unwrap(), &format!("seed {i}: {v}"));
    }
    // The comparison above means something only if the scans accept a fair share of these.
    assert!(scanned > 300, "only {scanned} bodies were scanned");
}

#[test]
fn deep_nesting_never_overflows_the_stack() {
    for depth in [100, 127, 129, 10_000, 100_000] {
        let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let objects = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        for inner in [&arrays, &objects] {
            let bodies = [
                format!("{{\"model\":\"m\",\"max_tokens\":1,\"messages\":{inner}}}"),
                format!("{{\"model\":\"m\",\"input\":{inner}}}"),
                format!(
                    "{{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{{\"role\":\"user\",\"content\":\"x\"}}],\"tools\":[{{\"name\":\"f\",\"input_schema\":{inner}}}]}}"
                ),
            ];
            for body in bodies {
                exercise(body.as_bytes(), &format!("depth {depth}"));
            }
            exercise(inner.as_bytes(), &format!("bare depth {depth}"));
        }
    }
}

const EVENT_NAMES: &[&str] = &[
    "",
    "message",
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
    "response.created",
    "response.output_item.added",
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
];

#[test]
fn decoders_survive_any_event_sequence() {
    for i in 0..1500u64 {
        let mut rng = StdRng::seed_from_u64(i);
        for d in Dialect::ALL {
            let mut decoder = d.decoder();
            let mut encoders: Vec<_> = Dialect::ALL.iter().map(|c| c.encoder("pub")).collect();
            let mut events = Vec::new();
            for _ in 0..rng.random_range(1..30) {
                let name = EVENT_NAMES[rng.random_range(0..EVENT_NAMES.len())];
                let data = match rng.random_range(0..5) {
                    0 => "[DONE]".to_owned(),
                    1 => {
                        let len = rng.random_range(0..40);
                        (0..len).map(|_| rng.random::<char>()).collect()
                    }
                    _ => {
                        let mut v = random_value(&mut rng, 4);
                        if let (Value::Object(o), true) = (&mut v, rng.random_bool(0.7)) {
                            o.insert("type".into(), name.into());
                        }
                        v.to_string()
                    }
                };
                events.extend(decoder.decode(name, &data));
            }
            events.extend(decoder.finish());
            assert!(decoder.finish().is_empty(), "seed {i}: finish twice");
            let terminal = events
                .iter()
                .filter(|e| matches!(e, StreamEvent::Done | StreamEvent::Error { .. }))
                .count();
            assert_eq!(
                terminal, 1,
                "seed {i} {d}: exactly one terminal event in {events:?}"
            );
            assert!(
                matches!(
                    events.last(),
                    Some(StreamEvent::Done | StreamEvent::Error { .. })
                ),
                "seed {i} {d}: terminal event last"
            );
            for encoder in &mut encoders {
                for frame in encoder.encode_all(&events) {
                    assert!(frame.ends_with(b"\n\n"));
                }
            }
        }
    }
}

fn random_event(rng: &mut StdRng) -> StreamEvent {
    let s = |rng: &mut StdRng| WORDS[rng.random_range(0..WORDS.len())].to_owned();
    match rng.random_range(0..10) {
        0 => StreamEvent::Start {
            id: s(rng),
            model: s(rng),
        },
        1 => StreamEvent::TextDelta(s(rng)),
        2 => StreamEvent::ReasoningDelta(s(rng)),
        3 => StreamEvent::ReasoningSignature(s(rng)),
        4 => StreamEvent::ToolCallStart {
            index: rng.random_range(0..3),
            id: s(rng),
            name: s(rng),
        },
        5 => StreamEvent::ToolCallDelta {
            index: rng.random_range(0..4),
            arguments: s(rng),
        },
        6 => StreamEvent::Finish {
            reason: [
                FinishReason::Stop,
                FinishReason::Length,
                FinishReason::ToolCalls,
                FinishReason::Other(s(rng)),
            ][rng.random_range(0..4)]
            .clone(),
            stop_sequence: rng.random_bool(0.2).then(|| s(rng)),
        },
        7 => StreamEvent::Usage(Usage {
            input_tokens: rng.random(),
            output_tokens: rng.random(),
            cached_input_tokens: rng.random(),
            ..Usage::default()
        }),
        8 => StreamEvent::Done,
        _ => StreamEvent::Error {
            status: rng.random_range(0..1000),
            message: s(rng),
        },
    }
}

#[test]
fn encoders_survive_any_event_order() {
    for i in 0..3000u64 {
        let mut rng = StdRng::seed_from_u64(i);
        let events: Vec<StreamEvent> = (0..rng.random_range(0..25))
            .map(|_| random_event(&mut rng))
            .collect();
        for d in Dialect::ALL {
            let mut encoder = d.encoder("pub");
            let mut text = String::new();
            for e in &events {
                for frame in encoder.encode(e) {
                    let frame = String::from_utf8(frame.to_vec()).unwrap();
                    assert!(frame.ends_with("\n\n"), "seed {i}");
                    text += &frame;
                }
            }
            for e in super::sse::parse(&text) {
                if e.data != "[DONE]" {
                    assert!(
                        serde_json::from_str::<Value>(&e.data).is_ok(),
                        "seed {i} {d}: {}",
                        e.data
                    );
                }
            }
        }
    }
}
