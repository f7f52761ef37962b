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
