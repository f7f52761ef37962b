//! Proxying Chat Completions: weighted split, fallback, streaming.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use crate::harness::{Gateway, Mock, chat_body};

fn two_route_model(model: &str, router: &str, a: &Mock, wa: f64, b: &Mock, wb: f64) -> String {
    format!(
        "models:\n  - id: {model}\n    aliases: [{model}-alias]\n    router: {router}\n    route:\n      - kind: openai_compat\n        weight: {wa}\n        base_url: {}\n        provider_model_id: sim-a\n        api_key: key-a\n      - kind: openai_compat\n        weight: {wb}\n        base_url: {}\n        provider_model_id: sim-b\n",
        a.base_url(),
        b.base_url()
    )
}

/// Sends `n` requests, `concurrency` at a time, and returns their statuses.
async fn send_many(gw: &Gateway, model: &str, n: usize, concurrency: usize) -> Vec<u16> {
    futures::stream::iter(0..n)
        .map(|_| async { gw.chat(chat_body(model, false)).await.0 })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_split_follows_weights_and_rewrites_model() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = Gateway::start(&two_route_model("demo", "fixed", &a, 0.7, &b, 0.3));

    let (status, body) = gw.chat(chat_body("demo-alias", false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["model"], "demo-alias",
        "client sees the name it asked for"
    );
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("Hello from")
    );
    assert!(
        body.get("_routing").is_none(),
        "attribution never reaches the client"
    );

    let n = 1000;
    let statuses = send_many(&gw, "demo", n, 16).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let (ca, cb) = (a.chat_requests().await, b.chat_requests().await);
    assert_eq!(
        ca + cb,
        n as u64 + 1,
        "every request reached exactly one upstream"
    );
    let share = ca as f64 / (ca + cb) as f64;
    assert!(
        (share - 0.7).abs() < 0.05,
        "route A share {share:.3} should be ~0.7 ({ca} vs {cb})"
    );

    // The upstream got its own model name and key, and the rest of the body untouched.
    let last = a.stats().await;
    assert_eq!(last["last_body"]["model"], "sim-a");
    assert_eq!(last["last_body"]["messages"][0]["content"], "Say hello.");
    assert_eq!(last["last_authorization"], "Bearer key-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_when_an_upstream_returns_500() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "fail_status": 500 })).await;
    let gw = Gateway::start(&two_route_model("demo", "fixed", &a, 0.5, &b, 0.5));

    let statuses = send_many(&gw, "demo", 60, 4).await;
    assert!(
        statuses.iter().all(|s| *s == 200),
        "no client-visible errors: {statuses:?}"
    );
    let (ca, cb) = (a.chat_requests().await, b.chat_requests().await);
    assert_eq!(cb, 60, "B answered every request");
    assert!(
        ca > 0 && ca < 60,
        "A was tried only when it was primary: {ca}"
    );
    let log = gw.log();
    assert!(
        log.contains("fell_back=true"),
        "attribution records the fallback"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_when_an_upstream_is_killed() {
    let mut a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = Gateway::start(&two_route_model("demo", "fixed", &a, 0.9, &b, 0.1));
    assert_eq!(gw.chat(chat_body("demo", false)).await.0, 200);
    a.kill();
    let before = b.chat_requests().await;
    let statuses = send_many(&gw, "demo", 30, 4).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(b.chat_requests().await - before, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_attempts_failed_reports_every_attempt_in_openai_shape() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "fail_status": 503 })).await;
    b.behave(json!({ "fail_status": 500 })).await;
    let gw = Gateway::start(&two_route_model("demo", "round_robin", &a, 1.0, &b, 1.0));
    let (status, body) = gw.chat(chat_body("demo", false)).await;
    assert_eq!(status, 502, "{body}");
    let error = &body["error"];
    assert_eq!(error["type"], "upstream_error");
    assert_eq!(error["code"], "all_attempts_failed");
    let attempts = error["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{body}");
    let ids: Vec<&str> = attempts
        .iter()
        .map(|a| a["endpoint_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&format!("demo:local-{}", a.port).as_str()),
        "{ids:?}"
    );
    assert!(
        ids.contains(&format!("demo:local-{}", b.port).as_str()),
        "{ids:?}"
    );
    assert!(attempts.iter().all(|a| a["error_type"] == "http_status"));
    assert!(
        error["message"].as_str().unwrap().contains("HTTP 5"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_answered_locally() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = Gateway::start(&two_route_model("demo", "fixed", &a, 1.0, &b, 1.0));
    let client = reqwest::Client::new();
    let response = client
        .post(gw.url("/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid chat request body: "),
        "{body}"
    );
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let (status, body) = gw.chat(chat_body("nope", false)).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(
        a.chat_requests().await + b.chat_requests().await,
        0,
        "nothing reached upstreams"
    );

    let models: serde_json::Value = client
        .get(gw.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["demo", "demo-alias"]);
    let health: serde_json::Value = client
        .get(gw.url("/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["routes_configured"], 2);
}

/// Reads an SSE response, returning each `data:` payload with the time it arrived.
async fn read_events(response: reqwest::Response) -> Vec<(Duration, String)> {
    let started = Instant::now();
    let mut events = Vec::new();
    let mut buffer = String::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            for line in event.lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    events.push((started.elapsed(), data.to_owned()));
                }
            }
        }
    }
    events
}

async fn stream(gw: &Gateway, model: &str) -> (u16, Vec<(Duration, String)>) {
    let response = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat_body(model, true))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, read_events(response).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_relayed_chunk_by_chunk() {
    // 8 tokens at 20 tokens/s: the upstream spends ~350 ms between first and last token.
    let a = Mock::start(&["--tokens-per-s", "20", "--completion-tokens", "8"]);
    let b = Mock::start(&["--tokens-per-s", "20", "--completion-tokens", "8"]);
    let gw = Gateway::start(&two_route_model("demo", "fixed", &a, 1.0, &b, 1.0));
    let (status, events) = stream(&gw, "demo").await;
    assert_eq!(status, 200);
    let payloads: Vec<&str> = events.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(payloads.last(), Some(&"[DONE]"), "{payloads:?}");
    // role + 8 tokens + finish + usage + [DONE]
    assert_eq!(events.len(), 12, "{payloads:?}");
    let text: String = payloads
        .iter()
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(text.starts_with("Hello from sim on port"), "{text}");
    let first_token = events[1].0;
    let last_token = events[8].0;
    assert!(
        last_token - first_token >= Duration::from_millis(200),
        "tokens arrived together ({first_token:?} .. {last_token:?}): the stream was buffered"
    );
    let usage = serde_json::from_str::<serde_json::Value>(payloads[10]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 8, "{usage}");
    assert!(
        payloads
            .iter()
            .all(|p| !p.contains("sim-a\"") && !p.contains("sim-b\"")),
        "model renamed in chunks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_never_falls_back_after_its_first_content() {
    // Spaced tokens, so the events before the break are flushed to the gateway as a real
    // replica's would be.
    let a = Mock::start(&["--tokens-per-s", "50"]);
    let b = Mock::start(&[]);
    a.behave(json!({ "break_stream_after_events": 3 })).await;
    // B is a candidate but essentially never primary.
    let gw = Gateway::start(&two_route_model("demo", "fixed", &a, 1.0, &b, 1e-9));
    let (status, events) = stream(&gw, "demo").await;
    assert_eq!(status, 200);
    assert_eq!(
        events.len(),
        4,
        "3 relayed events then an error event: {events:?}"
    );
    let last: serde_json::Value = serde_json::from_str(&events[3].1).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("upstream stream failed"),
        "{last}"
    );
    assert_eq!(a.chat_requests().await, 1);
    assert_eq!(
        b.chat_requests().await,
        0,
        "no second provider spliced into the stream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fails_before_its_first_event_falls_back() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "break_stream_after_events": 0 })).await;
    let gw = Gateway::start(&two_route_model("demo", "fixed", &a, 1.0, &b, 1e-9));
    let (status, events) = stream(&gw, "demo").await;
    assert_eq!(status, 200);
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    assert_eq!(a.chat_requests().await, 1);
    assert_eq!(b.chat_requests().await, 1, "B served the stream");
    assert_eq!(b.stats().await["streams_completed"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_logged_to_the_database_off_the_hot_path() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "fail_status": 500 })).await;
    let gw = Gateway::start(&two_route_model("demo", "round_robin", &a, 1.0, &b, 1.0));
    for _ in 0..4 {
        assert_eq!(gw.chat(chat_body("demo", false)).await.0, 200);
    }
    let (status, _) = stream(&gw, "demo").await;
    assert_eq!(status, 200);
    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        gw.dir.path().join("switchyard.db").display()
    ))
    .await
    .unwrap();
    let mut rows: Vec<(String, i64, bool, i64, Option<i64>)> = Vec::new();
    for _ in 0..100 {
        rows = sqlx::query_as(
            "SELECT endpoint_id, attempts, fell_back, status, completion_tokens FROM api_logs ORDER BY id",
        )
        .fetch_all(&db)
        .await
        .unwrap();
        if rows.len() == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rows.len(), 5, "{rows:?}");
    let b_id = format!("demo:local-{}", b.port);
    assert!(
        rows.iter().all(|r| r.0 == b_id && r.3 == 200),
        "B served all: {rows:?}"
    );
    let fell_back = rows.iter().filter(|r| r.2).count();
    assert!(
        fell_back >= 2,
        "round robin made A primary about half the time: {rows:?}"
    );
    assert!(
        rows.iter().all(|r| r.1 == if r.2 { 2 } else { 1 }),
        "{rows:?}"
    );
    assert!(
        rows.iter().all(|r| r.4 == Some(16)),
        "completion tokens recorded: {rows:?}"
    );
}
