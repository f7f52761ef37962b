//! The upstream client's transport: hyper directly by default, reqwest through a proxy the
//! environment names, and what both send.

use base64::Engine as _;

use crate::harness::{Gateway, Mock, chat_body};

fn model(base_url: &str, api_key: Option<&str>) -> String {
    let key = api_key.map_or(String::new(), |k| format!("        api_key: {k}\n"));
    format!(
        "models:\n  - id: demo\n    router: fixed\n    route:\n      - kind: openai_compat\n        base_url: {base_url}\n        provider_model_id: sim\n{key}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_go_through_the_proxy_the_environment_names() {
    // The mock stands in for the proxy: a plain HTTP proxy receives the absolute URL as the request
    // target, and the mock answers by the path. The upstream's own host does not resolve, so a
    // 200 can only have come through the proxy.
    let proxy = Mock::start(&[]);
    let gw = Gateway::start_with_env(
        &model("http://upstream.invalid/v1", Some("key-through-proxy")),
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("HTTP_PROXY", &format!("http://127.0.0.1:{}", proxy.port)),
        ],
    );
    let (status, body) = gw.chat(chat_body("demo", false)).await;
    assert_eq!(status, 200, "{body}\n{}", gw.log());
    assert_eq!(body["model"], "demo");
    let stats = proxy.stats().await;
    assert_eq!(stats["chat_requests"], 1, "{stats}");
    assert_eq!(stats["last_authorization"], "Bearer key-through-proxy");
    assert_eq!(
        stats["last_host"],
        serde_json::json!(["upstream.invalid"]),
        "the upstream's host, once, not the proxy's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_attempt_names_the_upstreams_host_and_port_once() {
    let upstream = Mock::start(&[]);
    let gw = Gateway::start(&model(
        &format!("http://127.0.0.1:{}/v1", upstream.port),
        None,
    ));
    for _ in 0..2 {
        // The second goes over the pooled connection.
        let (status, body) = gw.chat(chat_body("demo", false)).await;
        assert_eq!(status, 200, "{body}\n{}", gw.log());
        assert_eq!(
            upstream.stats().await["last_host"],
            serde_json::json!([format!("127.0.0.1:{}", upstream.port)])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_credentials_become_basic_auth_and_an_api_key_wins_over_them() {
    let upstream = Mock::start(&[]);
    let with_user = format!("http://alice:s3cret%21@127.0.0.1:{}/v1", upstream.port);
    let gw = Gateway::start(&model(&with_user, None));
    let (status, body) = gw.chat(chat_body("demo", false)).await;
    assert_eq!(status, 200, "{body}\n{}", gw.log());
    let expected = base64::engine::general_purpose::STANDARD.encode("alice:s3cret!");
    assert_eq!(
        upstream.stats().await["last_authorization"],
        format!("Basic {expected}"),
        "the URL's user and percent-decoded password, as Basic auth"
    );
    drop(gw);

    let gw = Gateway::start(&model(&with_user, Some("key-b")));
    let (status, body) = gw.chat(chat_body("demo", false)).await;
    assert_eq!(status, 200, "{body}\n{}", gw.log());
    assert_eq!(upstream.stats().await["last_authorization"], "Bearer key-b");
}

/// A relayed stream's frames leave as the upstream wrote them but for the model, which is the
/// public name in every chunk (its content deltas renamed by their template's head, the others
/// whole), and their texts add up to the whole answer's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_relayed_chunk_names_the_public_model_and_the_texts_add_up_to_the_answer() {
    let upstream = Mock::start(&["--completion-tokens", "40"]);
    let gw = Gateway::start(&model(
        &format!("http://127.0.0.1:{}/v1", upstream.port),
        None,
    ));
    let (status, whole) = gw.chat(chat_body("demo", false)).await;
    assert_eq!(status, 200, "{whole}\n{}", gw.log());
    let (status, text) = gw.chat_text(chat_body("demo", true)).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        !text.contains("\"sim\""),
        "the provider's model leaked: {text}"
    );
    let mut streamed = String::new();
    let mut chunks = 0;
    for frame in text.split("\n\n").filter(|f| !f.is_empty()) {
        let data = frame.strip_prefix("data: ").expect("a data frame");
        if data == "[DONE]" {
            continue;
        }
        let chunk: serde_json::Value = serde_json::from_str(data).expect("JSON");
        assert_eq!(chunk["model"], "demo", "{data}");
        if let Some(content) = chunk["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(content);
            chunks += 1;
        }
    }
    assert!(chunks > 10, "{text}");
    assert_eq!(
        Some(streamed.as_str()),
        whole["choices"][0]["message"]["content"].as_str()
    );
}
