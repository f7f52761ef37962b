//! What a request body may hold: a Chat turn without content is refused (issue #16 item 3), the
//! message and part counts are capped, and the memory one large body costs is bounded (issue #15
//! item 6). Each refusal is local: the upstream must receive nothing.

use serde_json::{Value, json};

use crate::harness::{Gateway, Mock};

/// One model per upstream dialect, all on `mock`; `server` is the config's server section.
fn three_dialects(mock: &Mock, server: &str) -> String {
    format!(
        "{server}models:
  - id: via-openai
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:{port}/v1
  - id: via-anthropic
    route:
      - kind: anthropic
        base_url: http://127.0.0.1:{port}
  - id: via-responses
    route:
      - kind: openai_responses
        base_url: http://127.0.0.1:{port}/v1
",
        port = mock.port
    )
}

async fn post(gw: &Gateway, path: &str, body: Vec<u8>) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("gateway reachable");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("non-JSON ({e}): {text}"));
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_turn_without_content_is_refused_before_any_upstream() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&three_dialects(&mock, ""));
    let conversations = [
        (json!([{"role": "user"}]), "messages[0].content"),
        (
            json!([
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": null}
            ]),
            "messages[2].content",
        ),
    ];
    for model in ["via-openai", "via-anthropic", "via-responses"] {
        for (messages, path) in &conversations {
            let (status, body) = gw.chat(json!({"model": model, "messages": messages})).await;
            assert_eq!(status, 400, "{model} {messages}: {body}");
            assert_eq!(
                body["error"]["message"],
                format!("invalid chat request body: `{path}` is required"),
                "{model}: {body}"
            );
            assert_eq!(body["error"]["type"], "invalid_request_error");
        }
    }
    assert_eq!(
        mock.chat_requests().await,
        0,
        "nothing may reach the upstream"
    );

    // An assistant turn that only calls tools keeps `content: null`, and every turn arrives.
    let (status, body) = gw
        .chat(json!({"model": "via-anthropic", "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "thanks"}
        ]}))
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = mock.stats().await["last_body"]["messages"].clone();
    let roles: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"], "{sent}");
}

fn many_messages(n: usize, dialect_messages: bool) -> Vec<u8> {
    let messages: Vec<Value> = (0..n)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "hi"}))
        .collect();
    let mut body = json!({"model": "via-openai", "messages": messages});
    if dialect_messages {
        body["max_tokens"] = json!(16);
    }
    serde_json::to_vec(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_and_part_limits_answer_400_in_the_clients_dialect() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&three_dialects(
        &mock,
        "server:\n  max_messages: 1000\n  max_content_parts: 50\n",
    ));
    // Anthropic's shape for a Messages client, whatever the upstream.
    let (status, body) = post(&gw, "/v1/messages", many_messages(1001, true)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(
        body["error"]["message"],
        "invalid chat request body: `messages` has more than 1000 entries \
         (the gateway's limit, server.max_messages)"
    );
    // OpenAI's for Chat; content parts count across messages.
    let parts: Vec<Value> = (0..30)
        .map(|_| json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}))
        .collect();
    let (status, body) = post(
        &gw,
        "/v1/chat/completions",
        serde_json::to_vec(&json!({"model": "via-anthropic", "messages": parts})).unwrap(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("server.max_content_parts"), "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let (status, body) = post(
        &gw,
        "/v1/responses",
        serde_json::to_vec(&json!({"model": "via-openai", "input": vec![json!("x"); 1001]}))
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`input` has more than 1000 entries"),
        "{body}"
    );
    assert_eq!(
        mock.chat_requests().await,
        0,
        "nothing may reach the upstream"
    );
    // At the limit, the request goes through.
    let (status, body) = post(&gw, "/v1/messages", many_messages(1000, true)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(mock.chat_requests().await, 1);
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// A generous ceiling measured on the real process: the peak RSS one large request adds, against
/// its body. Before the fix a body of small messages cost 25× (chat) to 50× (translated) its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_large_body_costs_a_bounded_multiple_of_its_size() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&three_dialects(&mock, ""));
    // 40,000 messages of ~200 characters: 8 MiB, with a per-message cost the old tree paid.
    let text = "y".repeat(200);
    for (path, model) in [
        ("/v1/chat/completions", "via-openai"),
        ("/v1/messages", "via-openai"),
        ("/v1/chat/completions", "via-anthropic"),
    ] {
        let messages: Vec<Value> = (0..40_000)
            .map(
                |i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": text}),
            )
            .collect();
        let body =
            serde_json::to_vec(&json!({"model": model, "max_tokens": 8, "messages": messages}))
                .unwrap();
        // Resets the peak to the current RSS, so the peak read after is this request's.
        std::fs::write(format!("/proc/{}/clear_refs", gw.pid()), "5").unwrap();
        let before = status_kib(gw.pid(), "VmRSS");
        let size_kib = body.len() as u64 / 1024;
        let (status, answer) = post(&gw, path, body).await;
        assert_eq!(status, 200, "{path} {model}: {answer}");
        let growth = status_kib(gw.pid(), "VmHWM").saturating_sub(before);
        assert!(
            growth < 6 * size_kib,
            "{path} via {model}: peak grew {growth} KiB for a {size_kib} KiB body"
        );
    }
}
