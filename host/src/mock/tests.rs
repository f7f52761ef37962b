//! The mock served in-process on a loopback port, spoken to in every protocol.

use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};

use super::*;
use crate::protocol::sse;

struct Running {
    base: String,
    state: Arc<MockState>,
    http: reqwest::Client,
}

async fn start(configure: impl FnOnce(&mut MockOptions)) -> Running {
    let mut options = MockOptions::new(([127, 0, 0, 1], 0).into());
    configure(&mut options);
    let listener = tokio::net::TcpListener::bind(options.listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(MockState {
        behaviour: Mutex::new(Behaviour::default()),
        stats: Mutex::new(Stats::default()),
        completed: AtomicU64::new(0),
        port: addr.port(),
        options,
    });
    tokio::spawn(axum::serve(listener, router(state.clone())).into_future());
    Running {
        base: format!("http://{addr}"),
        state,
        http: reqwest::Client::new(),
    }
}

impl Running {
    async fn post(&self, path: &str, body: Value) -> (u16, String) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("x-api-key", "secret")
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn stats(&self) -> Value {
        self.http
            .get(format!("{}/_mock/stats", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

fn request(d: Dialect, stream: bool, tools: bool) -> Value {
    let mut body = match d {
        Dialect::OpenAiChat => {
            json!({"model": "up", "messages": [{"role": "user", "content": "Weather?"}]})
        }
        Dialect::OpenAiResponses => json!({"model": "up", "input": "Weather?"}),
        Dialect::AnthropicMessages => {
            json!({"model": "up", "max_tokens": 100, "messages": [{"role": "user", "content": "Weather?"}]})
        }
    };
    if stream {
        body["stream"] = true.into();
        if d == Dialect::OpenAiChat {
            body["stream_options"] = json!({"include_usage": true});
        }
    }
    if tools {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        body["tools"] = match d {
            Dialect::OpenAiChat => json!([
                {"type": "function", "function": {"name": "lookup", "parameters": schema}},
                {"type": "function", "function": {"name": "get_weather", "parameters": schema}}
            ]),
            Dialect::OpenAiResponses => json!([
                {"type": "function", "name": "lookup", "parameters": schema},
                {"type": "function", "name": "get_weather", "parameters": schema}
            ]),
            Dialect::AnthropicMessages => json!([
                {"name": "lookup", "input_schema": schema},
                {"name": "get_weather", "input_schema": schema}
            ]),
        };
    }
    body
}

/// The IR answer of a body in `d`, streamed or not.
fn answer_of(d: Dialect, stream: bool, body: &str) -> ir::Response {
    if !stream {
        let r = d.parse_response(body.as_bytes()).unwrap();
        // A same-protocol relay reads the answer through the scan: it must take the mock's.
        let summary = crate::protocol::scan::Summary {
            usage: r.usage,
            model: r.model.clone(),
        };
        assert_eq!(d.scan_response(body.as_bytes()), Some(summary), "{body}");
        return r;
    }
    let mut decoder = d.decoder();
    let mut events: Vec<StreamEvent> = sse::parse(body)
        .iter()
        .flat_map(|e| decoder.decode(&e.event, &e.data))
        .collect();
    events.extend(decoder.finish());
    assert_eq!(events.last(), Some(&StreamEvent::Done), "{body}");
    let mut r = ir::Response {
        id: String::new(),
        model: String::new(),
        created: None,
        output: Vec::new(),
        finish: FinishReason::Other("none".into()),
        stop_sequence: None,
        usage: Usage::default(),
    };
    let mut text = String::new();
    for e in events {
        match e {
            StreamEvent::Start { model, .. } => r.model = model,
            StreamEvent::TextDelta(t) => text += &t,
            StreamEvent::ToolCallStart { id, name, .. } => {
                r.output.push(Output::ToolCall(ir::ToolCall {
                    id,
                    name,
                    arguments: String::new(),
                }))
            }
            StreamEvent::ToolCallDelta { arguments, .. } => {
                if let Some(Output::ToolCall(c)) = r.output.last_mut() {
                    c.arguments += &arguments;
                }
            }
            StreamEvent::Finish { reason, .. } => r.finish = reason,
            StreamEvent::Usage(u) => r.usage = u,
            _ => {}
        }
    }
    if !text.is_empty() {
        r.output.insert(0, Output::Text(text));
    }
    r
}

#[tokio::test]
async fn speaks_every_protocol_streamed_or_not() {
    let mock = start(|o| o.completion_tokens = 6).await;
    let port = mock.state.port;
    for d in Dialect::ALL {
        for stream in [false, true] {
            let (status, body) = mock
                .post(&format!("/v1{}", d.path()), request(d, stream, false))
                .await;
            assert_eq!(status, 200, "{d} {body}");
            let r = answer_of(d, stream, &body);
            assert_eq!(
                r.text(),
                format!("Hello from sim on port {port}. The quick"),
                "{d} {stream}"
            );
            assert_eq!(r.model, "up");
            assert_eq!(r.finish, FinishReason::Stop);
            assert_eq!(r.usage.output_tokens, 6, "{d} {stream}");
            assert_eq!(r.usage.input_tokens, 2, "`Weather?` is 8 characters");
        }
        // Also without the /v1 prefix.
        let (status, _) = mock.post(d.path(), request(d, false, false)).await;
        assert_eq!(status, 200);
    }
    let stats = mock.stats().await;
    assert_eq!(stats["chat_requests"], 9);
    assert_eq!(stats["streams_completed"], 3);
    assert_eq!(stats["paths"]["/v1/messages"], 2);
    assert_eq!(stats["paths"]["/responses"], 1);
    assert_eq!(stats["last_path"], "/messages");
    assert_eq!(stats["last_authorization"], "secret");
    assert_eq!(stats["last_auth_header"], "x-api-key");
    assert_eq!(stats["last_anthropic_version"], "2023-06-01");
}

#[tokio::test]
async fn max_tokens_cuts_the_answer_with_a_length_finish() {
    let mock = start(|_| {}).await;
    for d in Dialect::ALL {
        let mut body = request(d, true, false);
        let key = match d {
            Dialect::OpenAiChat => "max_tokens",
            Dialect::OpenAiResponses => "max_output_tokens",
            Dialect::AnthropicMessages => "max_tokens",
        };
        body[key] = 3.into();
        let (_, text) = mock.post(&format!("/v1{}", d.path()), body).await;
        let r = answer_of(d, true, &text);
        assert_eq!(r.finish, FinishReason::Length, "{d}");
        assert_eq!(r.usage.output_tokens, 3);
    }
}

#[tokio::test]
async fn one_protocol_only_answers_404_elsewhere() {
    let mock = start(|o| o.protocol = Some(Dialect::AnthropicMessages)).await;
    let (status, body) = mock
        .post(
            "/v1/chat/completions",
            request(Dialect::OpenAiChat, false, false),
        )
        .await;
    assert_eq!(status, 404);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("anthropic"),
        "{error}"
    );
    let (status, _) = mock
        .post(
            "/v1/responses",
            request(Dialect::OpenAiResponses, false, false),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = mock
        .post(
            "/v1/messages",
            request(Dialect::AnthropicMessages, false, false),
        )
        .await;
    assert_eq!(status, 200);
    let stats = mock.stats().await;
    assert_eq!(stats["chat_requests"], 1, "404s are not chat requests");
    assert_eq!(stats["paths"]["/v1/chat/completions"], 1);
}

#[tokio::test]
async fn tool_call_mode_calls_the_offered_tool() {
    let mock = start(|o| o.tool_call = true).await;
    for d in Dialect::ALL {
        for stream in [false, true] {
            let (status, body) = mock
                .post(&format!("/v1{}", d.path()), request(d, stream, true))
                .await;
            assert_eq!(status, 200, "{body}");
            let r = answer_of(d, stream, &body);
            let calls: Vec<_> = r.tool_calls().collect();
            assert_eq!(calls.len(), 1, "{d} {stream}: {body}");
            assert_eq!(calls[0].name, TOOL_NAME);
            assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
            assert_eq!(r.effective_finish(), FinishReason::ToolCalls);
            let wire = match d {
                Dialect::OpenAiChat => "\"tool_calls\"",
                Dialect::OpenAiResponses => "\"function_call\"",
                Dialect::AnthropicMessages => "\"tool_use\"",
            };
            assert!(body.contains(wire), "{d}: {body}");
        }
        // No tools offered: text.
        let (_, body) = mock
            .post(&format!("/v1{}", d.path()), request(d, false, false))
            .await;
        assert!(answer_of(d, false, &body).text().starts_with("Hello"));
    }
    // After a tool result, the answer is text, so an agent loop ends.
    let mut body = request(Dialect::OpenAiChat, false, true);
    body["messages"] = json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"}
    ]);
    let (_, text) = mock.post("/v1/chat/completions", body).await;
    assert!(
        answer_of(Dialect::OpenAiChat, false, &text)
            .text()
            .starts_with("Hello")
    );
}

#[tokio::test]
async fn failures_and_invalid_bodies_answer_in_the_protocols_shape() {
    let mock = start(|_| {}).await;
    mock.state.behaviour.lock().fail_status = Some(529);
    let (status, body) = mock
        .post(
            "/v1/messages",
            request(Dialect::AnthropicMessages, false, false),
        )
        .await;
    assert_eq!(status, 529);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "overloaded_error");
    mock.state.behaviour.lock().fail_status = None;
    let (status, body) = mock
        .post(
            "/v1/messages",
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("`max_tokens` is required"), "{body}");
    let (status, body) = mock
        .post(
            "/v1/responses",
            json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("stateless"), "{body}");
}

#[tokio::test]
async fn embeddings_are_deterministic_unit_vectors() {
    let mock = start(|_| {}).await;
    let (status, body) = mock
        .post(
            "/v1/embeddings",
            json!({"model": "e", "input": ["hello", "world"], "dimensions": 8}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "e");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    let first: Vec<f32> = serde_json::from_value(v["data"][0]["embedding"].clone()).unwrap();
    assert_eq!(first.len(), 8);
    assert!((first.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-4);
    assert_eq!(first, embeddings::vector("hello", 8));
    assert_ne!(first, embeddings::vector("world", 8));
    assert_eq!(v["data"][1]["index"], 1);

    // The OpenAI SDKs ask for base64 by default.
    let (_, body) = mock
        .post(
            "/embeddings",
            json!({"model": "e", "input": "hello", "encoding_format": "base64"}),
        )
        .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(
        floats,
        embeddings::vector("hello", embeddings::DEFAULT_DIMENSIONS)
    );

    let (status, _) = mock.post("/v1/embeddings", json!({"model": "e"})).await;
    assert_eq!(status, 400);
    let stats = mock.stats().await;
    assert_eq!(stats["embedding_requests"], 3);
    assert_eq!(stats["chat_requests"], 0);
}

#[tokio::test]
async fn chat_streams_keep_their_historic_framing() {
    // role + N tokens + finish + usage (when asked) + [DONE], as the e2e suite expects.
    let mock = start(|o| o.completion_tokens = 8).await;
    let (_, body) = mock
        .post(
            "/v1/chat/completions",
            request(Dialect::OpenAiChat, true, false),
        )
        .await;
    let events = sse::parse(&body);
    assert_eq!(events.len(), 12);
    assert_eq!(events[11].data, "[DONE]");
    let usage: Value = serde_json::from_str(&events[10].data).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    let mut no_usage = request(Dialect::OpenAiChat, true, false);
    no_usage.as_object_mut().unwrap().remove("stream_options");
    let (_, body) = mock.post("/v1/chat/completions", no_usage).await;
    assert_eq!(sse::parse(&body).len(), 11);
}

/// `--first-token-at-once`: the first token waits only for the TTFT, the rest for the token rate
/// (the bench's held streams need a first token the gateway can commit to its client).
#[tokio::test]
async fn the_first_token_can_go_out_at_once() {
    let mock = start(|o| {
        o.tokens_per_s = 0.5;
        o.ttft_ms = 7;
    })
    .await;
    let body =
        json!({"model": "sim", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]});
    let request = Dialect::OpenAiChat
        .parse_request(body.to_string().as_bytes())
        .unwrap();
    let answer = Answer::plan(&mock.state, &request);
    let pauses = |first_at_once| -> Vec<Duration> {
        let pace = Pace {
            first_at_once,
            ..Pace::new(&mock.state, &Behaviour::default())
        };
        answer.events(&pace).into_iter().map(|(_, p)| p).collect()
    };
    let two_s = Duration::from_secs(2);
    let ttft = Duration::from_millis(7);
    // Start (after the TTFT), three tokens, then the finish.
    assert_eq!(pauses(false)[..4], [ttft, two_s, two_s, two_s]);
    assert_eq!(pauses(true)[..4], [ttft, Duration::ZERO, two_s, two_s]);
}
