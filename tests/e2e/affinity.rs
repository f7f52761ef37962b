//! Session affinity, caller identity and prefill accounting, end to end.

use std::time::Duration;

use serde_json::json;

use crate::harness::{Gateway, Mock};

const ADMIN: &str = "test-admin-token";

fn config(head: &str, a: &Mock, wa: &str, b: &Mock, wb: &str) -> String {
    config_with("", head, a, wa, b, wb)
}

/// `server_extra` goes inside the `server:` section, `head` after it.
fn config_with(server_extra: &str, head: &str, a: &Mock, wa: &str, b: &Mock, wb: &str) -> String {
    format!(
        "server:\n  admin_token: {ADMIN}\n{server_extra}{head}models:\n  - id: m\n    aliases: [m-alias]\n    route:\n      - kind: openai_compat\n        base_url: {}\n        weight: {wa}\n      - kind: openai_compat\n        base_url: {}\n        weight: {wb}\n",
        a.base_url(),
        b.base_url()
    )
}

fn affinity_on(body: &str, extra: &[(&str, &str)]) -> Gateway {
    let mut env = vec![("ROUTING_AFFINITY_ENABLED", "1")];
    env.extend_from_slice(extra);
    Gateway::start_with_env(body, &env)
}

fn body(model: &str, text: &str, stream: bool) -> serde_json::Value {
    json!({ "model": model, "stream": stream, "messages": [{ "role": "user", "content": text }] })
}

async fn chat_with(
    gw: &Gateway,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: serde_json::Value,
) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .json(&body);
    if let Some(k) = key {
        request = request.bearer_auth(k);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// Which mock answered (the reply names its port).
fn served_by(text: &str, a: &Mock, b: &Mock) -> char {
    if text.contains(&format!("port {}.", a.port)) {
        'A'
    } else if text.contains(&format!("port {}.", b.port)) {
        'B'
    } else {
        '?'
    }
}

async fn put_weights(gw: &Gateway, weights: serde_json::Value) {
    let status = reqwest::Client::new()
        .put(gw.url("/admin/routing/weights"))
        .bearer_auth(ADMIN)
        .json(&json!({ "model": "m", "weights": weights }))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
}

async fn deep(gw: &Gateway) -> serde_json::Value {
    gw.deep(ADMIN).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_sticks_while_many_callers_spread() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = affinity_on(&config("", &a, "1", &b, "1"), &[]);
    let mut first = Vec::new();
    for _ in 0..30 {
        let (status, text) = chat_with(&gw, Some("sk-sticky"), &[], body("m", "hi", false)).await;
        assert_eq!(status, 200);
        first.push(served_by(&text, &a, &b));
    }
    assert!(
        first.iter().all(|s| *s == first[0]),
        "one key, one endpoint: {first:?}"
    );
    // The alias shares the canonical model's record.
    let (_, text) = chat_with(&gw, Some("sk-sticky"), &[], body("m-alias", "hi", false)).await;
    assert_eq!(served_by(&text, &a, &b), first[0]);

    let mut spread = Vec::new();
    for i in 0..40 {
        let (_, text) = chat_with(&gw, Some(&format!("sk-{i}")), &[], body("m", "hi", false)).await;
        spread.push(served_by(&text, &a, &b));
    }
    assert!(
        spread.contains(&'A') && spread.contains(&'B'),
        "different keys spread: {spread:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pin_outlives_weight_changes_but_not_an_error() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = affinity_on(&config("", &a, "1", &b, "0.000000001"), &[]);
    let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
    assert_eq!(served_by(&text, &a, &b), 'A');
    // Weights now favour B, but the warm session stays on A.
    let (a_id, b_id) = (format!("m:local-{}", a.port), format!("m:local-{}", b.port));
    put_weights(&gw, json!({ a_id.clone(): 0.000000001, b_id.clone(): 1.0 })).await;
    for _ in 0..10 {
        let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
        assert_eq!(served_by(&text, &a, &b), 'A', "sticky despite the weights");
    }
    // One error at A: fallback serves this request and the pin is dropped ...
    a.behave(json!({ "fail_status": 500, "fail_count": 1 }))
        .await;
    let (status, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
    assert_eq!(status, 200);
    assert_eq!(served_by(&text, &a, &b), 'B');
    // ... so the next request is the strategy's again (B by weight) and re-pins there.
    for _ in 0..10 {
        let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
        assert_eq!(served_by(&text, &a, &b), 'B');
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_pinned_endpoint_loses_the_pin() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = affinity_on(
        &config(
            "health:\n  failure_threshold: 1\n  cooldown_seconds: 60\n",
            &a,
            "1",
            &b,
            "0.000000001",
        ),
        &[],
    );
    let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
    assert_eq!(served_by(&text, &a, &b), 'A');
    // Another caller trips A's breaker (threshold 1).
    a.behave(json!({ "fail_status": 503, "fail_count": 1 }))
        .await;
    let (status, _) = chat_with(&gw, Some("sk-other"), &[], body("m", "hi", false)).await;
    assert_eq!(status, 200);
    let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
    assert_eq!(served_by(&text, &a, &b), 'B', "open breaker: the pin moves");
}

/// Starts a slow streaming request that holds `tokens` of prefill on whichever endpoint takes it
/// until the mock's TTFT passes, and returns its task.
fn background_stream(gw: &Gateway, key: &str, chars: usize) -> tokio::task::JoinHandle<String> {
    let url = gw.url("/v1/chat/completions");
    let key = key.to_owned();
    let text = "x".repeat(chars);
    tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(url)
            .bearer_auth(key)
            .json(&body("m", &text, true))
            .send()
            .await
            .unwrap();
        response.text().await.unwrap_or_default()
    })
}

async fn backlog(gw: &Gateway, mock: &Mock) -> u64 {
    deep(gw).await["prefill"][format!("m:local-{}", mock.port)]["backlog_tokens"]
        .as_u64()
        .unwrap_or(0)
}

async fn wait_for_backlog(gw: &Gateway, mock: &Mock, at_least: u64) {
    for _ in 0..100 {
        if backlog(gw, mock).await >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backlog never reached {at_least}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_ceiling_the_pin_moves_but_own_load_does_not_count() {
    let a = Mock::start(&["--ttft-ms", "800"]);
    let b = Mock::start(&[]);
    let gw = affinity_on(
        &config("", &a, "1", &b, "0.000000001"),
        &[("ROUTING_PREFILL_AFFINITY_CEILING", "1000")],
    );
    // Pin K on A (its answer takes 800 ms).
    let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
    assert_eq!(served_by(&text, &a, &b), 'A');
    // K's own 2 000-token prefill on A does not push K off A: parallel turns stay together.
    let own = background_stream(&gw, "sk-k", 8000);
    wait_for_backlog(&gw, &a, 2000).await;
    let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
    assert_eq!(
        served_by(&text, &a, &b),
        'A',
        "own in-flight load is discounted"
    );
    own.await.unwrap();
    // Another caller's 2 000 tokens pending on A exceed the ceiling: K is rerouted and re-pinned.
    let other = background_stream(&gw, "sk-other", 8000);
    wait_for_backlog(&gw, &a, 2000).await;
    let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
    assert_eq!(served_by(&text, &a, &b), 'B', "backed up: rerouted");
    other.await.unwrap();
    let (_, text) = chat_with(&gw, Some("sk-k"), &[], body("m", "hi", false)).await;
    assert_eq!(served_by(&text, &a, &b), 'B', "the pin moved with it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_addresses_count_only_from_trusted_proxies() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let trusted = affinity_on(
        &config_with(
            "  trusted_proxies: [\"127.0.0.1/32\"]\n",
            "",
            &a,
            "1",
            &b,
            "1",
        ),
        &[],
    );
    // Distinct clients behind the proxy spread; one client (and its /64) sticks.
    let mut spread = Vec::new();
    for i in 0..40 {
        let xff = format!("198.51.100.{i}");
        let (_, text) = chat_with(
            &trusted,
            None,
            &[("x-forwarded-for", &xff)],
            body("m", "hi", false),
        )
        .await;
        spread.push(served_by(&text, &a, &b));
    }
    assert!(spread.contains(&'A') && spread.contains(&'B'), "{spread:?}");
    let mut same_64 = Vec::new();
    for i in 0..20 {
        let xff = format!("2001:db8:7:7::{:x}", i + 1);
        let (_, text) = chat_with(
            &trusted,
            None,
            &[("x-forwarded-for", &xff)],
            body("m", "hi", false),
        )
        .await;
        same_64.push(served_by(&text, &a, &b));
    }
    assert!(
        same_64.iter().all(|s| *s == same_64[0]),
        "one /64, one endpoint: {same_64:?}"
    );

    // Without a trusted proxy the header is ignored: every request is the same caller.
    let untrusted = affinity_on(&config("", &a, "1", &b, "1"), &[]);
    let mut ignored = Vec::new();
    for i in 0..20 {
        let xff = format!("198.51.100.{i}");
        let (_, text) = chat_with(
            &untrusted,
            None,
            &[("x-forwarded-for", &xff)],
            body("m", "hi", false),
        )
        .await;
        ignored.push(served_by(&text, &a, &b));
    }
    assert!(ignored.iter().all(|s| *s == ignored[0]), "{ignored:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_released_at_the_first_token_on_error_and_on_disconnect() {
    // 600 ms to the first token, then 10 tokens/s: the prefill ends long before the stream does.
    let a = Mock::start(&["--ttft-ms", "600", "--tokens-per-s", "10"]);
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN}\nmodels:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
        a.base_url()
    ));
    let stream = background_stream(&gw, "sk-1", 4000);
    wait_for_backlog(&gw, &a, 1000).await;
    // After the first token the backlog is free while the stream is still decoding.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!stream.is_finished(), "still decoding");
    assert_eq!(backlog(&gw, &a).await, 0, "released at the first token");
    stream.await.unwrap();

    // Upstream failure.
    a.behave(json!({ "fail_status": 500, "ttft_ms": 0 })).await;
    let (status, _) = chat_with(&gw, Some("sk-2"), &[], body("m", &"x".repeat(4000), false)).await;
    assert_eq!(status, 502);
    assert_eq!(backlog(&gw, &a).await, 0, "released on error");

    // The client goes away during the prefill.
    a.behave(json!({ "ttft_ms": 2000 })).await;
    let url = gw.url("/v1/chat/completions");
    let leaving = tokio::spawn(async move {
        let _ = reqwest::Client::new()
            .post(url)
            .json(&body("m", &"x".repeat(4000), true))
            .timeout(Duration::from_millis(300))
            .send()
            .await;
    });
    wait_for_backlog(&gw, &a, 1000).await;
    leaving.await.unwrap();
    let mut released = false;
    for _ in 0..50 {
        if backlog(&gw, &a).await == 0 {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "released when the client disconnected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elephants_serialise_across_replicas_and_degrade_to_least_loaded() {
    let a = Mock::start(&["--ttft-ms", "1500"]);
    let b = Mock::start(&["--ttft-ms", "1500"]);
    // Elephants from 1 000 uncached tokens (4 000 characters) to keep bodies small.
    let gw = Gateway::start_with_env(
        &config("", &a, "1", &b, "1"),
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("ROUTING_PREFILL_ELEPHANT_TOKENS", "1000"),
        ],
    );
    let first = background_stream(&gw, "sk-e1", 4400);
    let mut waited = 0;
    while backlog(&gw, &a).await + backlog(&gw, &b).await < 1100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 1;
        assert!(waited < 200);
    }
    let first_on_a = backlog(&gw, &a).await > 0;
    let second = background_stream(&gw, "sk-e2", 4400);
    while backlog(&gw, &a).await + backlog(&gw, &b).await < 2200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let d = deep(&gw).await;
    let (ea, eb) = (
        d["prefill"][format!("m:local-{}", a.port)]["elephants"]
            .as_u64()
            .unwrap_or(0),
        d["prefill"][format!("m:local-{}", b.port)]["elephants"]
            .as_u64()
            .unwrap_or(0),
    );
    assert_eq!(
        (ea, eb),
        (1, 1),
        "the second elephant avoided the busy replica (first on A: {first_on_a})"
    );
    // Every replica is at the cap: a third elephant is still served, on the least loaded.
    let (status, _) = chat_with(&gw, Some("sk-e3"), &[], body("m", &"x".repeat(4000), false)).await;
    assert_eq!(status, 200, "never refused");
    let (x, y) = (first.await.unwrap(), second.await.unwrap());
    assert!(x.contains("[DONE]") && y.contains("[DONE]"));
}
