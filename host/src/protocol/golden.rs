//! Golden translation tests: every client dialect against every upstream dialect.
//!
//! One conversation (system text, a user message with an image, an assistant turn that calls a
//! tool, the tool's result, a follow-up) is written in each client dialect. Parsing any of them and
//! building for upstream dialect B must give exactly B's golden body. Likewise one upstream answer
//! (text, a tool call, usage with cached tokens), written in each upstream dialect, must render as
//! exactly the client dialect's golden answer, streamed or not.

use serde_json::{Value, json};

use super::ir::{FinishReason, StreamEvent, Usage};
use super::{Dialect, sse};

const IMAGE: &str = "iVBORw0KGgo=";

fn client_request(d: Dialect) -> Value {
    let schema =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    match d {
        Dialect::OpenAiChat => json!({
            "model": "public",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in Paris? See photo."},
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{IMAGE}")}}
                ]},
                {"role": "assistant", "content": "Let me check.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
                {"role": "user", "content": "Thanks. Summarise."}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": schema}}],
            "tool_choice": "auto",
            "temperature": 0.5,
            "max_tokens": 100,
            "user": "u1"
        }),
        Dialect::OpenAiResponses => json!({
            "model": "public",
            "instructions": "You are terse.",
            "input": [
                {"role": "user", "content": [
                    {"type": "input_text", "text": "Weather in Paris? See photo."},
                    {"type": "input_image", "image_url": format!("data:image/png;base64,{IMAGE}")}
                ]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
                {"role": "user", "content": "Thanks. Summarise."}
            ],
            "tools": [{"type": "function", "name": "get_weather", "description": "Current weather", "parameters": schema}],
            "tool_choice": "auto",
            "temperature": 0.5,
            "max_output_tokens": 100,
            "user": "u1"
        }),
        Dialect::AnthropicMessages => json!({
            "model": "public",
            "system": "You are terse.",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in Paris? See photo."},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "18C, sunny"},
                    {"type": "text", "text": "Thanks. Summarise."}
                ]}
            ],
            "tools": [{"name": "get_weather", "description": "Current weather", "input_schema": schema}],
            "tool_choice": {"type": "auto"},
            "temperature": 0.5,
            "max_tokens": 100,
            "metadata": {"user_id": "u1"}
        }),
    }
}

fn upstream_request(d: Dialect) -> Value {
    let schema =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    match d {
        Dialect::OpenAiChat => json!({
            "model": "provider-model",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in Paris? See photo."},
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{IMAGE}")}}
                ]},
                {"role": "assistant", "content": "Let me check.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
                {"role": "user", "content": "Thanks. Summarise."}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": schema}}],
            "tool_choice": "auto",
            "temperature": 0.5,
            "max_tokens": 100,
            "user": "u1"
        }),
        Dialect::OpenAiResponses => json!({
            "model": "provider-model",
            "instructions": "You are terse.",
            "input": [
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Weather in Paris? See photo."},
                    {"type": "input_image", "image_url": format!("data:image/png;base64,{IMAGE}"), "detail": "auto"}
                ]},
                {"type": "message", "role": "assistant", "content": "Let me check."},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks. Summarise."}]}
            ],
            "tools": [{"type": "function", "name": "get_weather", "description": "Current weather", "parameters": schema, "strict": false}],
            "tool_choice": "auto",
            "temperature": 0.5,
            "max_output_tokens": 100,
            "user": "u1",
            "store": false
        }),
        Dialect::AnthropicMessages => json!({
            "model": "provider-model",
            "max_tokens": 100,
            "system": "You are terse.",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in Paris? See photo."},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "18C, sunny"},
                    {"type": "text", "text": "Thanks. Summarise."}
                ]}
            ],
            "tools": [{"name": "get_weather", "description": "Current weather", "input_schema": schema}],
            "tool_choice": {"type": "auto"},
            "temperature": 0.5,
            "metadata": {"user_id": "u1"}
        }),
    }
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn parse(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap()
}

#[test]
fn requests_translate_between_every_pair() {
    for client in Dialect::ALL {
        let r = client
            .parse_request(&bytes(&client_request(client)))
            .unwrap();
        assert_eq!(r.prompt_token_estimate(), (28 + 14 + 13 + 10 + 18) / 4 + 85);
        assert_eq!(r.modalities(), crate::protocol::ir::Modalities::IMAGE);
        for upstream in Dialect::ALL {
            let built = parse(&upstream.build_request(&r, "provider-model"));
            assert_eq!(
                built,
                upstream_request(upstream),
                "{client} client → {upstream} upstream"
            );
        }
    }
}

#[test]
fn streaming_requests_ask_for_usage_where_needed() {
    for client in Dialect::ALL {
        let mut body = client_request(client);
        body["stream"] = true.into();
        let r = client.parse_request(&bytes(&body)).unwrap();
        assert!(r.stream);
        let chat = parse(&Dialect::OpenAiChat.build_request(&r, "m"));
        assert_eq!(chat["stream"], true);
        assert_eq!(chat["stream_options"], json!({"include_usage": true}));
        for upstream in [Dialect::OpenAiResponses, Dialect::AnthropicMessages] {
            let b = parse(&upstream.build_request(&r, "m"));
            assert_eq!(b["stream"], true, "{upstream}");
            assert!(b.get("stream_options").is_none());
        }
    }
}

/// A field that only some dialects have: where it arrives in each, or that it is dropped.
#[test]
fn dialect_specific_request_fields() {
    let chat = |extra: Value| {
        let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        if let (Value::Object(b), Value::Object(e)) = (&mut b, extra) {
            b.extend(e);
        }
        Dialect::OpenAiChat.parse_request(&bytes(&b)).unwrap()
    };
    let anthropic = |extra: Value| {
        let mut b =
            json!({"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}]});
        if let (Value::Object(b), Value::Object(e)) = (&mut b, extra) {
            b.extend(e);
        }
        Dialect::AnthropicMessages
            .parse_request(&bytes(&b))
            .unwrap()
    };
    let build = |d: Dialect, r: &super::ir::Request| parse(&d.build_request(r, "up"));

    // Stop sequences: Chat ↔ Anthropic; Responses has none.
    let r = chat(json!({"stop": "END"}));
    assert_eq!(
        build(Dialect::AnthropicMessages, &r)["stop_sequences"],
        json!(["END"])
    );
    assert!(build(Dialect::OpenAiResponses, &r).get("stop").is_none());
    let r = anthropic(json!({"stop_sequences": ["A", "B"], "top_k": 5}));
    assert_eq!(build(Dialect::OpenAiChat, &r)["stop"], json!(["A", "B"]));
    // top_k reaches Anthropic only.
    assert!(build(Dialect::OpenAiChat, &r).get("top_k").is_none());
    assert!(build(Dialect::OpenAiResponses, &r).get("top_k").is_none());
    assert_eq!(build(Dialect::AnthropicMessages, &r)["top_k"], 5);

    // Reasoning: effort ↔ budget.
    let r = chat(json!({"reasoning_effort": "high", "max_completion_tokens": 40000}));
    let a = build(Dialect::AnthropicMessages, &r);
    assert_eq!(
        a["thinking"],
        json!({"type": "enabled", "budget_tokens": 24576})
    );
    assert_eq!(a["max_tokens"], 40000);
    let o = build(Dialect::OpenAiResponses, &r);
    assert_eq!(o["reasoning"], json!({"effort": "high", "summary": "auto"}));
    let r = anthropic(
        json!({"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 9000}),
    );
    assert_eq!(build(Dialect::OpenAiChat, &r)["reasoning_effort"], "low");
    assert_eq!(
        build(Dialect::OpenAiResponses, &r)["reasoning"]["effort"],
        "low"
    );

    // JSON mode: Chat ↔ Responses; Anthropic has no equivalent.
    let schema = json!({"type": "object"});
    let r = chat(
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": true}}}),
    );
    assert_eq!(
        build(Dialect::OpenAiResponses, &r)["text"],
        json!({"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": true}})
    );
    assert!(
        build(Dialect::AnthropicMessages, &r)
            .get("response_format")
            .is_none()
    );
    let r = Dialect::OpenAiResponses
        .parse_request(br#"{"model":"m","input":"x","text":{"format":{"type":"json_object"}}}"#)
        .unwrap();
    assert_eq!(
        build(Dialect::OpenAiChat, &r)["response_format"],
        json!({"type": "json_object"})
    );

    // OpenAI-only sampling knobs and `n`/`logprobs` do not reach Anthropic.
    let r = chat(
        json!({"n": 2, "logprobs": true, "seed": 3, "presence_penalty": 0.1, "temperature": 1.7}),
    );
    let a = build(Dialect::AnthropicMessages, &r);
    for k in ["n", "logprobs", "seed", "presence_penalty"] {
        assert!(a.get(k).is_none(), "{k}");
    }
    assert_eq!(a["temperature"], 1.0, "clamped to Anthropic's range");
    assert_eq!(
        a["max_tokens"],
        super::anthropic_messages::DEFAULT_MAX_TOKENS
    );
    assert_eq!(build(Dialect::OpenAiChat, &r)["seed"], 3);

    // Parallel tool calls ↔ disable_parallel_tool_use.
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let r = chat(json!({"tools": tools, "parallel_tool_calls": false, "tool_choice": "required"}));
    assert_eq!(
        build(Dialect::AnthropicMessages, &r)["tool_choice"],
        json!({"type": "any", "disable_parallel_tool_use": true})
    );
    let r = anthropic(
        json!({"tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true}}),
    );
    let c = build(Dialect::OpenAiChat, &r);
    assert_eq!(
        c["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(c["parallel_tool_calls"], false);
    assert_eq!(
        build(Dialect::OpenAiResponses, &r)["tool_choice"],
        json!({"type": "function", "name": "f"})
    );

    // Audio reaches Chat upstreams only; it is still seen by routing.
    let r = chat(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "listen"},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]}));
    assert!(
        r.modalities()
            .contains(crate::protocol::ir::Modalities::AUDIO)
    );
    assert_eq!(
        build(Dialect::OpenAiChat, &r)["messages"][0]["content"][1]["type"],
        "input_audio"
    );
    assert_eq!(
        build(Dialect::AnthropicMessages, &r)["messages"][0]["content"],
        json!([{"type": "text", "text": "listen"}])
    );

    // Image URLs (not inline data) keep their form.
    let r = chat(json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}}]}]}));
    assert_eq!(
        build(Dialect::AnthropicMessages, &r)["messages"][0]["content"][0]["source"],
        json!({"type": "url", "url": "https://x/cat.png"})
    );
    assert_eq!(
        build(Dialect::OpenAiResponses, &r)["input"][0]["content"][0],
        json!({"type": "input_image", "image_url": "https://x/cat.png", "detail": "low"})
    );

    // Anthropic prompt-caching markers survive Anthropic → Anthropic.
    let r = anthropic(
        json!({"system": [{"type": "text", "text": "big", "cache_control": {"type": "ephemeral"}}]}),
    );
    assert_eq!(
        build(Dialect::AnthropicMessages, &r)["system"],
        json!([{"type": "text", "text": "big", "cache_control": {"type": "ephemeral"}}])
    );
    assert_eq!(
        build(Dialect::OpenAiChat, &r)["messages"][0],
        json!({"role": "system", "content": "big"})
    );
}

// ---------------------------------------------------------------------------------------------
// Answers

const USAGE: Usage = Usage {
    input_tokens: 50,
    output_tokens: 12,
    cached_input_tokens: 20,
    cache_creation_input_tokens: 0,
    reasoning_tokens: 0,
};

fn upstream_answer(d: Dialect) -> Value {
    match d {
        Dialect::OpenAiChat => json!({
            "id": "abc", "object": "chat.completion", "created": 1700000000, "model": "provider-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me check.",
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]
            }}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62, "prompt_tokens_details": {"cached_tokens": 20}}
        }),
        Dialect::OpenAiResponses => json!({
            "id": "abc", "object": "response", "created_at": 1700000000, "status": "completed", "model": "provider-model",
            "output": [
                {"type": "message", "id": "msg_x", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
                {"type": "function_call", "id": "fc_x", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed"}
            ],
            "usage": {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 62}
        }),
        Dialect::AnthropicMessages => json!({
            "id": "abc", "type": "message", "role": "assistant", "model": "provider-model",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 30, "output_tokens": 12, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 0}
        }),
    }
}

fn client_answer(d: Dialect) -> Value {
    match d {
        Dialect::OpenAiChat => json!({
            "id": "chatcmpl-abc", "object": "chat.completion", "model": "public",
            "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me check.", "refusal": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]
            }}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62,
                      "prompt_tokens_details": {"cached_tokens": 20}, "completion_tokens_details": {"reasoning_tokens": 0}}
        }),
        Dialect::OpenAiResponses => json!({
            "id": "resp_abc", "object": "response", "status": "completed", "model": "public",
            "error": null, "incomplete_details": null, "instructions": null, "max_output_tokens": null,
            "output": [
                {"type": "message", "id": "msg_abc_0", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Let me check.", "annotations": [], "logprobs": []}]},
                {"type": "function_call", "id": "fc_abc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed"}
            ],
            "parallel_tool_calls": true, "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
            "store": false, "temperature": null, "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
            "top_p": null, "truncation": "disabled", "user": null, "metadata": {},
            "usage": {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 12,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 62}
        }),
        Dialect::AnthropicMessages => json!({
            "id": "msg_abc", "type": "message", "role": "assistant", "model": "public",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 30, "output_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 20}
        }),
    }
}

/// Removes the creation time, which Anthropic upstreams do not report (so it is "now").
fn without_time(mut v: Value) -> Value {
    if let Value::Object(o) = &mut v {
        for k in ["created", "created_at"] {
            if let Some(t) = o.remove(k) {
                assert!(t.is_u64(), "{k} is a number");
            }
        }
    }
    v
}

#[test]
fn answers_translate_between_every_pair() {
    for upstream in Dialect::ALL {
        let r = upstream
            .parse_response(&bytes(&upstream_answer(upstream)))
            .unwrap();
        assert_eq!(r.usage, USAGE, "{upstream}");
        assert_eq!(r.finish, FinishReason::ToolCalls);
        for client in Dialect::ALL {
            let built = without_time(parse(&client.build_response(&r, "public")));
            assert_eq!(
                built,
                client_answer(client),
                "{upstream} upstream → {client} client"
            );
        }
    }
}

/// How each upstream says each finish reason, and what each client is told.
#[test]
fn finish_reasons_map_in_every_direction() {
    let cases = [
        (FinishReason::Stop, "stop", "end_turn", ("completed", None)),
        (
            FinishReason::Length,
            "length",
            "max_tokens",
            ("incomplete", Some("max_output_tokens")),
        ),
        (
            FinishReason::ContentFilter,
            "content_filter",
            "refusal",
            ("incomplete", Some("content_filter")),
        ),
    ];
    for (reason, chat, anthropic, (status, incomplete)) in cases {
        let upstream_bodies = [
            (
                Dialect::OpenAiChat,
                json!({"id": "a", "model": "m", "choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": chat}]}),
            ),
            (
                Dialect::AnthropicMessages,
                json!({"id": "a", "type": "message", "model": "m", "content": [{"type": "text", "text": "x"}], "stop_reason": anthropic}),
            ),
            (
                Dialect::OpenAiResponses,
                json!({"id": "a", "object": "response", "model": "m", "status": status,
                       "incomplete_details": incomplete.map(|r| json!({"reason": r})),
                       "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]}]}),
            ),
        ];
        for (upstream, body) in upstream_bodies {
            let r = upstream.parse_response(&bytes(&body)).unwrap();
            assert_eq!(r.finish, reason, "{upstream} {body}");
            let c = parse(&Dialect::OpenAiChat.build_response(&r, "p"));
            assert_eq!(c["choices"][0]["finish_reason"], chat);
            let a = parse(&Dialect::AnthropicMessages.build_response(&r, "p"));
            assert_eq!(a["stop_reason"], anthropic);
            let o = parse(&Dialect::OpenAiResponses.build_response(&r, "p"));
            assert_eq!(o["status"], status);
            assert_eq!(o["incomplete_details"]["reason"].as_str(), incomplete);
        }
    }
    // A stop sequence is named to Anthropic clients.
    let r = Dialect::AnthropicMessages
        .parse_response(br#"{"id":"a","type":"message","model":"m","content":[],"stop_reason":"stop_sequence","stop_sequence":"END"}"#)
        .unwrap();
    let a = parse(&Dialect::AnthropicMessages.build_response(&r, "p"));
    assert_eq!(
        (a["stop_reason"].as_str(), a["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some("END"))
    );
    assert_eq!(
        parse(&Dialect::OpenAiChat.build_response(&r, "p"))["choices"][0]["finish_reason"],
        "stop"
    );
}

#[test]
fn reasoning_reaches_every_client() {
    let r = Dialect::AnthropicMessages
        .parse_response(br#"{"id":"a","type":"message","model":"m","stop_reason":"end_turn",
            "content":[{"type":"thinking","thinking":"Hmm.","signature":"sig"},{"type":"text","text":"Yes."}]}"#)
        .unwrap();
    let c = parse(&Dialect::OpenAiChat.build_response(&r, "p"));
    assert_eq!(c["choices"][0]["message"]["reasoning_content"], "Hmm.");
    assert_eq!(c["choices"][0]["message"]["content"], "Yes.");
    let o = parse(&Dialect::OpenAiResponses.build_response(&r, "p"));
    assert_eq!(o["output"][0]["type"], "reasoning");
    assert_eq!(o["output"][0]["content"][0]["text"], "Hmm.");
    assert_eq!(o["output"][1]["content"][0]["text"], "Yes.");
    let a = parse(&Dialect::AnthropicMessages.build_response(&r, "p"));
    assert_eq!(
        a["content"][0],
        json!({"type": "thinking", "thinking": "Hmm.", "signature": "sig"})
    );
}

// ---------------------------------------------------------------------------------------------
// Streams

fn upstream_stream(d: Dialect) -> String {
    let frame = |name: &str, data: Value| match d {
        Dialect::OpenAiChat => format!("data: {data}\n\n"),
        _ => format!("event: {name}\ndata: {data}\n\n"),
    };
    let mut s = String::new();
    match d {
        Dialect::OpenAiChat => {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": "abc", "object": "chat.completion.chunk", "created": 1, "model": "provider-model",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            };
            s += &frame(
                "",
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            );
            for t in ["Let", " me", " check."] {
                s += &frame("", chunk(json!({"content": t}), Value::Null));
            }
            s += &frame(
                "",
                chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
                    Value::Null,
                ),
            );
            for a in ["{\"city\":", "\"Paris\"}"] {
                s += &frame(
                    "",
                    chunk(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}),
                        Value::Null,
                    ),
                );
            }
            s += &frame("", chunk(json!({}), json!("tool_calls")));
            s += &frame(
                "",
                json!({"id": "abc", "object": "chat.completion.chunk", "created": 1, "model": "provider-model", "choices": [],
                                    "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62, "prompt_tokens_details": {"cached_tokens": 20}}}),
            );
            s += "data: [DONE]\n\n";
        }
        Dialect::OpenAiResponses => {
            let response = |status: &str, output: Value, usage: Value| json!({"id": "abc", "object": "response", "created_at": 1, "status": status, "model": "provider-model", "output": output, "usage": usage});
            let mut seq = 0;
            let mut ev = |name: &str, mut data: Value| {
                data["type"] = name.into();
                data["sequence_number"] = seq.into();
                seq += 1;
                frame(name, data)
            };
            s += &ev(
                "response.created",
                json!({"response": response("in_progress", json!([]), Value::Null)}),
            );
            s += &ev(
                "response.in_progress",
                json!({"response": response("in_progress", json!([]), Value::Null)}),
            );
            s += &ev(
                "response.output_item.added",
                json!({"output_index": 0, "item": {"type": "message", "id": "m0", "status": "in_progress", "role": "assistant", "content": []}}),
            );
            s += &ev(
                "response.content_part.added",
                json!({"item_id": "m0", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            for t in ["Let", " me", " check."] {
                s += &ev(
                    "response.output_text.delta",
                    json!({"item_id": "m0", "output_index": 0, "content_index": 0, "delta": t}),
                );
            }
            s += &ev(
                "response.output_text.done",
                json!({"item_id": "m0", "output_index": 0, "content_index": 0, "text": "Let me check."}),
            );
            s += &ev(
                "response.output_item.done",
                json!({"output_index": 0, "item": {"type": "message", "id": "m0", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]}}),
            );
            s += &ev(
                "response.output_item.added",
                json!({"output_index": 1, "item": {"type": "function_call", "id": "f1", "call_id": "call_1", "name": "get_weather", "arguments": "", "status": "in_progress"}}),
            );
            for a in ["{\"city\":", "\"Paris\"}"] {
                s += &ev(
                    "response.function_call_arguments.delta",
                    json!({"item_id": "f1", "output_index": 1, "delta": a}),
                );
            }
            s += &ev(
                "response.function_call_arguments.done",
                json!({"item_id": "f1", "output_index": 1, "arguments": "{\"city\":\"Paris\"}"}),
            );
            s += &ev(
                "response.output_item.done",
                json!({"output_index": 1, "item": {"type": "function_call", "id": "f1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed"}}),
            );
            s += &ev(
                "response.completed",
                json!({"response": response("completed", json!([]),
                json!({"input_tokens": 50, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 12, "total_tokens": 62}))}),
            );
        }
        Dialect::AnthropicMessages => {
            s += &frame(
                "message_start",
                json!({"type": "message_start", "message": {"id": "abc", "type": "message", "role": "assistant", "model": "provider-model",
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 30, "cache_read_input_tokens": 20, "output_tokens": 1}}}),
            );
            s += &frame("ping", json!({"type": "ping"}));
            s += &frame(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            );
            for t in ["Let", " me", " check."] {
                s += &frame(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
                );
            }
            s += &frame(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            );
            s += &frame(
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}}),
            );
            for a in ["", "{\"city\":", "\"Paris\"}"] {
                s += &frame(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": a}}),
                );
            }
            s += &frame(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            );
            s += &frame(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 12}}),
            );
            s += &frame("message_stop", json!({"type": "message_stop"}));
        }
    }
    s
}

fn decode_all(d: Dialect, text: &str) -> Vec<StreamEvent> {
    let mut decoder = d.decoder();
    let mut events: Vec<StreamEvent> = sse::parse(text)
        .iter()
        .flat_map(|e| decoder.decode(&e.event, &e.data))
        .collect();
    events.extend(decoder.finish());
    events
}

fn expected_events() -> Vec<StreamEvent> {
    vec![
        StreamEvent::Start {
            id: "abc".into(),
            model: "provider-model".into(),
        },
        StreamEvent::TextDelta("Let".into()),
        StreamEvent::TextDelta(" me".into()),
        StreamEvent::TextDelta(" check.".into()),
        StreamEvent::ToolCallStart {
            index: 0,
            id: "call_1".into(),
            name: "get_weather".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "{\"city\":".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "\"Paris\"}".into(),
        },
        StreamEvent::Finish {
            reason: FinishReason::ToolCalls,
            stop_sequence: None,
        },
        StreamEvent::Usage(USAGE),
        StreamEvent::Done,
    ]
}

/// The event names a client stream is made of (`type` of each Chat chunk's delta for Chat).
fn shape(d: Dialect, frames: &[sse::SseEvent]) -> Vec<String> {
    frames
        .iter()
        .map(|f| match d {
            Dialect::OpenAiChat if f.data == "[DONE]" => "[DONE]".to_owned(),
            Dialect::OpenAiChat => {
                let v: Value = serde_json::from_str(&f.data).unwrap();
                let choice = &v["choices"][0];
                if v["choices"].as_array().is_some_and(Vec::is_empty) {
                    "usage".to_owned()
                } else if let Some(reason) = choice["finish_reason"].as_str() {
                    format!("finish:{reason}")
                } else {
                    let mut keys: Vec<&str> = choice["delta"]
                        .as_object()
                        .unwrap()
                        .keys()
                        .map(String::as_str)
                        .collect();
                    keys.sort_unstable();
                    keys.join("+")
                }
            }
            _ => {
                let v: Value = serde_json::from_str(&f.data).unwrap();
                assert_eq!(v["type"].as_str(), Some(&*f.event), "SSE name = type");
                f.event.to_string()
            }
        })
        .collect()
}

fn expected_shape(d: Dialect) -> Vec<&'static str> {
    match d {
        Dialect::OpenAiChat => vec![
            "content+role",
            "content",
            "content",
            "content",
            "tool_calls",
            "tool_calls",
            "tool_calls",
            "finish:tool_calls",
            "usage",
            "[DONE]",
        ],
        Dialect::OpenAiResponses => vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ],
        Dialect::AnthropicMessages => vec![
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ],
    }
}

/// What a client SDK would accumulate from a stream.
#[derive(Debug, Default, PartialEq)]
struct Accumulated {
    id: String,
    model: String,
    text: String,
    reasoning: String,
    /// (id, name, arguments)
    calls: Vec<(String, String, String)>,
    finish: String,
    input_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
}

fn accumulate(d: Dialect, frames: &[sse::SseEvent]) -> Accumulated {
    let mut a = Accumulated::default();
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    for f in frames {
        if f.data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&f.data).unwrap();
        match d {
            Dialect::OpenAiChat => {
                a.id = v["id"].as_str().unwrap().to_owned();
                a.model = v["model"].as_str().unwrap().to_owned();
                if v["usage"].is_object() {
                    a.input_tokens = n(&v["usage"]["prompt_tokens"]);
                    a.cached_tokens = n(&v["usage"]["prompt_tokens_details"]["cached_tokens"]);
                    a.output_tokens = n(&v["usage"]["completion_tokens"]);
                }
                let Some(choice) = v["choices"].get(0) else {
                    continue;
                };
                let delta = &choice["delta"];
                a.text += delta["content"].as_str().unwrap_or("");
                a.reasoning += delta["reasoning_content"].as_str().unwrap_or("");
                for c in delta["tool_calls"].as_array().into_iter().flatten() {
                    let i = c["index"].as_u64().unwrap() as usize;
                    if a.calls.len() <= i {
                        a.calls.push((
                            c["id"].as_str().unwrap().into(),
                            c["function"]["name"].as_str().unwrap().into(),
                            String::new(),
                        ));
                    }
                    a.calls[i].2 += c["function"]["arguments"].as_str().unwrap_or("");
                }
                if let Some(r) = choice["finish_reason"].as_str() {
                    a.finish = r.into();
                }
            }
            Dialect::OpenAiResponses => match &*f.event {
                "response.created" => {
                    a.id = v["response"]["id"].as_str().unwrap().into();
                    a.model = v["response"]["model"].as_str().unwrap().into();
                }
                "response.output_text.delta" => a.text += v["delta"].as_str().unwrap(),
                "response.reasoning_text.delta" => a.reasoning += v["delta"].as_str().unwrap(),
                "response.output_item.added" if v["item"]["type"] == "function_call" => {
                    a.calls.push((
                        v["item"]["call_id"].as_str().unwrap().into(),
                        v["item"]["name"].as_str().unwrap().into(),
                        String::new(),
                    ))
                }
                "response.function_call_arguments.delta" => {
                    a.calls.last_mut().unwrap().2 += v["delta"].as_str().unwrap();
                }
                "response.completed" | "response.incomplete" => {
                    let r = &v["response"];
                    a.finish = r["status"].as_str().unwrap().into();
                    a.input_tokens = n(&r["usage"]["input_tokens"]);
                    a.cached_tokens = n(&r["usage"]["input_tokens_details"]["cached_tokens"]);
                    a.output_tokens = n(&r["usage"]["output_tokens"]);
                    // The final object repeats everything the deltas said.
                    let text: String = r["output"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|i| i["type"] == "message")
                        .map(|i| i["content"][0]["text"].as_str().unwrap())
                        .collect();
                    assert_eq!(text, a.text);
                    let args: Vec<&str> = r["output"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|i| i["type"] == "function_call")
                        .map(|i| i["arguments"].as_str().unwrap())
                        .collect();
                    assert_eq!(
                        args,
                        a.calls.iter().map(|c| c.2.as_str()).collect::<Vec<_>>()
                    );
                }
                _ => {}
            },
            Dialect::AnthropicMessages => match &*f.event {
                "message_start" => {
                    let m = &v["message"];
                    a.id = m["id"].as_str().unwrap().into();
                    a.model = m["model"].as_str().unwrap().into();
                    assert!(m["usage"].is_object() && m["content"].is_array());
                }
                "content_block_start" if v["content_block"]["type"] == "tool_use" => {
                    a.calls.push((
                        v["content_block"]["id"].as_str().unwrap().into(),
                        v["content_block"]["name"].as_str().unwrap().into(),
                        String::new(),
                    ))
                }
                "content_block_delta" => match v["delta"]["type"].as_str().unwrap() {
                    "text_delta" => a.text += v["delta"]["text"].as_str().unwrap(),
                    "thinking_delta" => a.reasoning += v["delta"]["thinking"].as_str().unwrap(),
                    "input_json_delta" => {
                        a.calls.last_mut().unwrap().2 +=
                            v["delta"]["partial_json"].as_str().unwrap()
                    }
                    _ => {}
                },
                "message_delta" => {
                    a.finish = v["delta"]["stop_reason"].as_str().unwrap().into();
                    let u = &v["usage"];
                    a.input_tokens = n(&u["input_tokens"])
                        + n(&u["cache_read_input_tokens"])
                        + n(&u["cache_creation_input_tokens"]);
                    a.cached_tokens = n(&u["cache_read_input_tokens"]);
                    a.output_tokens = n(&u["output_tokens"]);
                }
                _ => {}
            },
        }
    }
    a
}

fn expected_accumulated(d: Dialect) -> Accumulated {
    let (id, finish) = match d {
        Dialect::OpenAiChat => ("chatcmpl-abc", "tool_calls"),
        Dialect::OpenAiResponses => ("resp_abc", "completed"),
        Dialect::AnthropicMessages => ("msg_abc", "tool_use"),
    };
    Accumulated {
        id: id.into(),
        model: "public".into(),
        text: "Let me check.".into(),
        reasoning: String::new(),
        calls: vec![(
            "call_1".into(),
            "get_weather".into(),
            "{\"city\":\"Paris\"}".into(),
        )],
        finish: finish.into(),
        input_tokens: 50,
        cached_tokens: 20,
        output_tokens: 12,
    }
}

fn encode(client: Dialect, events: &[StreamEvent]) -> (String, Vec<sse::SseEvent>) {
    let mut encoder = client.encoder("public");
    let mut text = String::new();
    for e in events {
        for frame in encoder.encode(e) {
            let frame = std::str::from_utf8(&frame).unwrap();
            assert!(
                frame.ends_with("\n\n"),
                "each frame is one complete event: {frame:?}"
            );
            assert_eq!(sse::parse(frame).len(), 1, "{frame:?}");
            text += frame;
        }
    }
    let frames = sse::parse(&text);
    (text, frames)
}

#[test]
fn streams_translate_between_every_pair() {
    for upstream in Dialect::ALL {
        let events = decode_all(upstream, &upstream_stream(upstream));
        assert_eq!(events, expected_events(), "{upstream} decoder");
        for client in Dialect::ALL {
            let (_, frames) = encode(client, &events);
            assert_eq!(
                shape(client, &frames),
                expected_shape(client),
                "{upstream} → {client}"
            );
            assert_eq!(
                accumulate(client, &frames),
                expected_accumulated(client),
                "{upstream} → {client}"
            );
        }
    }
}

#[test]
fn responses_streams_number_and_index_their_events() {
    let (_, frames) = encode(Dialect::OpenAiResponses, &expected_events());
    for (i, f) in frames.iter().enumerate() {
        let v: Value = serde_json::from_str(&f.data).unwrap();
        assert_eq!(v["sequence_number"], i, "{}", f.data);
        if f.event.contains("delta")
            || f.event.contains(".done") && f.event != "response.output_item.done"
        {
            assert!(
                v["item_id"].is_string() && v["output_index"].is_u64(),
                "{}",
                f.data
            );
        }
        if f.event == "response.output_text.delta" {
            assert_eq!(v["item_id"], "msg_abc_0");
            assert_eq!(
                (v["output_index"].as_u64(), v["content_index"].as_u64()),
                (Some(0), Some(0))
            );
        }
        if f.event == "response.function_call_arguments.delta" {
            assert_eq!(v["item_id"], "fc_abc_1");
            assert_eq!(v["output_index"], 1);
        }
    }
    let completed: Value = serde_json::from_str(&frames.last().unwrap().data).unwrap();
    assert_eq!(
        without_time(completed["response"].clone()),
        without_time(client_answer(Dialect::OpenAiResponses)),
        "the final event carries the full response"
    );
}

#[test]
fn anthropic_stream_framing_is_exact() {
    let (text, _) = encode(Dialect::AnthropicMessages, &expected_events());
    let lines: Vec<&str> = text.split("\n\n").take(3).collect();
    assert_eq!(
        lines[0],
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_abc\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"public\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":0,\"output_tokens\":0,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0}}}"
    );
    assert_eq!(lines[1], "event: ping\ndata: {\"type\":\"ping\"}");
    assert_eq!(
        lines[2],
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}"
    );
    let tail: Vec<&str> = text.trim_end().rsplit("\n\n").take(2).collect();
    assert_eq!(
        tail[0],
        "event: message_stop\ndata: {\"type\":\"message_stop\"}"
    );
    assert_eq!(
        tail[1],
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":20,\"input_tokens\":30,\"output_tokens\":12}}"
    );
}

#[test]
fn chat_stream_framing_is_exact() {
    let (text, _) = encode(Dialect::OpenAiChat, &expected_events());
    let frames: Vec<&str> = text.split_inclusive("\n\n").collect();
    let created = serde_json::from_str::<Value>(&frames[0][6..]).unwrap()["created"].clone();
    assert_eq!(
        frames[0],
        format!(
            "data: {{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":{created},\"model\":\"public\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )
    );
    assert_eq!(*frames.last().unwrap(), "data: [DONE]\n\n");
}

#[test]
fn reasoning_streams_reach_every_client() {
    let events = vec![
        StreamEvent::Start {
            id: "r".into(),
            model: "m".into(),
        },
        StreamEvent::ReasoningDelta("Hm".into()),
        StreamEvent::ReasoningDelta("m.".into()),
        StreamEvent::ReasoningSignature("sig".into()),
        StreamEvent::TextDelta("Yes.".into()),
        StreamEvent::Finish {
            reason: FinishReason::Stop,
            stop_sequence: None,
        },
        StreamEvent::Done,
    ];
    for client in Dialect::ALL {
        let (text, frames) = encode(client, &events);
        let a = accumulate(client, &frames);
        assert_eq!(
            (a.reasoning.as_str(), a.text.as_str()),
            ("Hmm.", "Yes."),
            "{client}"
        );
        if client == Dialect::AnthropicMessages {
            assert!(text.contains("\"signature_delta\""));
        }
    }
    // And the Anthropic decoder produces exactly those events from thinking blocks.
    let upstream = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"r\",\"model\":\"m\",\"usage\":{\"input_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Hm\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"m.\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Yes.\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let mut decoded = decode_all(Dialect::AnthropicMessages, upstream);
    assert_eq!(
        decoded.remove(decoded.len() - 2),
        StreamEvent::Usage(Usage {
            input_tokens: 1,
            output_tokens: 5,
            ..Usage::default()
        })
    );
    assert_eq!(decoded, events);
}

#[test]
fn upstream_errors_mid_stream_reach_every_client() {
    let upstream_errors = [
        (
            Dialect::OpenAiChat,
            "",
            r#"{"error":{"message":"boom","type":"server_error"}}"#,
            500,
        ),
        (
            Dialect::AnthropicMessages,
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"boom"}}"#,
            529,
        ),
        (
            Dialect::OpenAiResponses,
            "response.failed",
            r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"boom"}}}"#,
            500,
        ),
    ];
    for (upstream, event, data, status) in upstream_errors {
        let mut d = upstream.decoder();
        let events = d.decode(event, data);
        assert_eq!(
            events,
            vec![StreamEvent::Error {
                status,
                message: "upstream error: boom".into()
            }]
        );
        assert!(
            d.decode("", "[DONE]").is_empty(),
            "nothing after a terminal event"
        );
        assert!(d.finish().is_empty());
    }
    let error = StreamEvent::Error {
        status: 529,
        message: "boom".into(),
    };
    let start = StreamEvent::Start {
        id: "e".into(),
        model: "m".into(),
    };
    for client in Dialect::ALL {
        let (_, frames) = encode(
            client,
            &[
                start.clone(),
                StreamEvent::TextDelta("x".into()),
                error.clone(),
                StreamEvent::Done,
            ],
        );
        let last: Value = serde_json::from_str(&frames.last().unwrap().data).unwrap();
        match client {
            Dialect::OpenAiChat => assert_eq!(last["error"]["message"], "boom"),
            Dialect::AnthropicMessages => {
                assert_eq!(frames.last().unwrap().event, "error");
                assert_eq!(last["error"]["type"], "overloaded_error");
            }
            Dialect::OpenAiResponses => {
                assert_eq!(last["type"], "response.failed");
                assert_eq!(last["response"]["error"]["message"], "boom");
            }
        }
        assert!(
            !frames
                .iter()
                .any(|f| f.data == "[DONE]" || f.event == "message_stop"),
            "{client}: no clean end after an error"
        );
    }
}

#[test]
fn streams_that_end_early_are_errors_and_streams_missing_only_done_complete() {
    for upstream in Dialect::ALL {
        let full = upstream_stream(upstream);
        let events = sse::parse(&full);
        // Cut after the first text delta.
        let mut d = upstream.decoder();
        for e in events.iter().take(4) {
            d.decode(&e.event, &e.data);
        }
        assert!(
            matches!(
                d.finish().as_slice(),
                [StreamEvent::Error { status: 502, .. }]
            ),
            "{upstream}"
        );
    }
    // A Chat stream that finished but never said [DONE] is complete.
    let full = upstream_stream(Dialect::OpenAiChat);
    let events = sse::parse(&full);
    let mut d = Dialect::OpenAiChat.decoder();
    for e in &events[..events.len() - 1] {
        d.decode(&e.event, &e.data);
    }
    assert_eq!(d.finish(), vec![StreamEvent::Done]);
}

#[test]
fn chat_decoder_tolerates_common_server_quirks() {
    let mut d = Dialect::OpenAiChat.decoder();
    let chunk = |delta: Value| {
        json!({"id": "x", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]}).to_string()
    };
    let mut events = Vec::new();
    // Two parallel calls both announced at index 0 (distinct ids), one whole in a single delta.
    events.extend(d.decode("", &chunk(json!({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}))));
    events.extend(d.decode("", &chunk(json!({"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": "{\"x\""}}]}))));
    events.extend(d.decode(
        "",
        &chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]})),
    ));
    // Reasoning under the `reasoning` name.
    events.extend(d.decode("", &chunk(json!({"reasoning": "r"}))));
    assert_eq!(
        events[1..].to_vec(),
        vec![
            StreamEvent::ToolCallStart {
                index: 0,
                id: "a".into(),
                name: "f".into()
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: "{}".into()
            },
            StreamEvent::ToolCallStart {
                index: 1,
                id: "b".into(),
                name: "g".into()
            },
            StreamEvent::ToolCallDelta {
                index: 1,
                arguments: "{\"x\"".into()
            },
            StreamEvent::ToolCallDelta {
                index: 1,
                arguments: ":1}".into()
            },
            StreamEvent::ReasoningDelta("r".into()),
        ]
    );
    // A call without arguments from Anthropic reads as `{}` to OpenAI clients.
    let mut d = Dialect::AnthropicMessages.decoder();
    d.decode(
        "",
        r#"{"type":"message_start","message":{"id":"x","model":"m"}}"#,
    );
    d.decode("", r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"now","input":{}}}"#);
    d.decode("", r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#);
    assert_eq!(
        d.decode("", r#"{"type":"content_block_stop","index":0}"#),
        vec![StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "{}".into()
        }]
    );
}

#[test]
fn encoders_for_a_request_mirror_what_the_client_asked() {
    let usage_frames = |body: &str| {
        let r = Dialect::OpenAiChat.parse_request(body.as_bytes()).unwrap();
        let (_, frames) = {
            let mut e = Dialect::OpenAiChat.encoder_for("public", &r);
            let text: String = e
                .encode_all(&expected_events())
                .iter()
                .map(|f| String::from_utf8(f.to_vec()).unwrap())
                .collect();
            let frames = sse::parse(&text);
            (text, frames)
        };
        frames
            .iter()
            .filter(|f| f.data.contains("\"usage\""))
            .count()
    };
    let base = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true"#;
    assert_eq!(usage_frames(&format!("{base}}}")), 0);
    assert_eq!(
        usage_frames(&format!(
            "{base},\"stream_options\":{{\"include_usage\":true}}}}"
        )),
        1
    );
    let r = Dialect::AnthropicMessages
        .parse_request(
            br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"abcdefgh"}]}"#,
        )
        .unwrap();
    let mut e = Dialect::AnthropicMessages.encoder_for("public", &r);
    let start = e.encode(&expected_events()[0]);
    let start: Value = serde_json::from_str(
        std::str::from_utf8(&start[0])
            .unwrap()
            .split_once("data: ")
            .unwrap()
            .1
            .trim(),
    )
    .unwrap();
    assert_eq!(start["message"]["usage"]["input_tokens"], 2);
}
