//! The `rate-limit` plugin, end to end: a limit refuses with a 429 in the client's dialect before
//! any upstream is contacted (counted at the mock), callers are isolated, token charges follow
//! the upstream's usage, concurrency slots come back when a client leaves mid-stream, and bad
//! configs are refused at startup (file and line) and by the admin API (422 naming the field).

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, header, send, serve_refuses};
use crate::routes::{Admin, TOKEN, eventually};

/// A model `m` served by `mock`, the admin token of [`Admin`], and `routes` (YAML).
fn config(mock: &Mock, routes: &str) -> String {
    format!(
        "server:\n  admin_token: {TOKEN}\nroutes:\n{routes}models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
        mock.base_url()
    )
}

fn number(headers: &HeaderMap, name: &str) -> u64 {
    header(headers, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {name} in {headers:?}"))
}

fn chat(content: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": content}]})
}

fn messages(content: &str) -> Value {
    json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": content}]})
}

/// Waits until `key` authenticates on `/team` (the consumers reached the gateway's snapshot);
/// `/v1/models` is not rate limited.
async fn known(gw: &Gateway, key: &str) {
    eventually(
        Duration::from_secs(10),
        "the consumer key is known",
        || async {
            reqwest::Client::new()
                .get(gw.url("/team/v1/models"))
                .bearer_auth(key)
                .send()
                .await
                .map(|r| r.status().as_u16() == 200)
                .unwrap_or(false)
        },
    )
    .await;
}

/// The request log's `rate_limited_by` of every row, once it holds `rows` rows.
async fn rate_limited_by(gw: &Gateway, rows: usize) -> Vec<(i64, Option<String>)> {
    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        gw.dir.path().join("switchyard.db").display()
    ))
    .await
    .unwrap();
    let mut found = Vec::new();
    for _ in 0..200 {
        found = sqlx::query_as("SELECT status, rate_limited_by FROM api_logs ORDER BY id")
            .fetch_all(&db)
            .await
            .unwrap();
        if found.len() >= rows {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_over_its_rpm_gets_a_429_in_its_dialect_before_any_upstream() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&config(
        &mock,
        "  - name: team\n    path_prefix: /team\n    plugins:\n      rate-limit:\n        limits:\n          - scope: consumer\n            requests_per_minute: 2\n",
    ));
    let admin = Admin::of(&gw);
    let (_, _, alice) = admin.consumer("alice", &[], &[]).await;
    let (_, _, bob) = admin.consumer("bob", &[], &[]).await;
    known(&gw, &alice).await;
    known(&gw, &bob).await;

    // Two requests a minute: both served, each saying what is left. (One request comes back
    // every 30 s, far longer than these take.)
    for remaining in ["1", "0"] {
        let (status, h, body) =
            send(&gw, "/team/v1/chat/completions", Some(&alice), chat("Hi")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            header(&h, "x-ratelimit-limit-requests").as_deref(),
            Some("2")
        );
        assert_eq!(
            header(&h, "x-ratelimit-remaining-requests").as_deref(),
            Some(remaining)
        );
        assert!(header(&h, "x-ratelimit-reset-requests").is_some(), "{h:?}");
    }
    // The third, in OpenAI's shape.
    let (status, h, body) = send(&gw, "/team/v1/chat/completions", Some(&alice), chat("Hi")).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert_eq!(body["error"]["type"], "requests", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("consumer:rpm"), "{message}");
    let retry_after = number(&h, "retry-after");
    assert!((1..=30).contains(&retry_after), "retry-after {retry_after}");
    assert_eq!(
        header(&h, "x-ratelimit-limit-requests").as_deref(),
        Some("2")
    );
    assert_eq!(
        header(&h, "x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    assert!(header(&h, "x-ratelimit-reset-requests").is_some(), "{h:?}");
    // The fourth, from an Anthropic client: Anthropic's shape, same headers.
    let (status, h, body) = send(&gw, "/team/v1/messages", Some(&alice), messages("Hi")).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("consumer:rpm"),
        "{body}"
    );
    assert!(number(&h, "retry-after") >= 1);
    assert_eq!(
        header(&h, "x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    assert_eq!(
        mock.chat_requests().await,
        2,
        "refusals never reach the upstream"
    );

    // Another consumer has its own counter.
    let (status, h, body) = send(&gw, "/team/v1/messages", Some(&bob), messages("Hi")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&h, "x-ratelimit-remaining-requests").as_deref(),
        Some("1")
    );
    assert_eq!(mock.chat_requests().await, 3);

    // The request log says which limit refused; so does the metric.
    let rows = rate_limited_by(&gw, 5).await;
    let refused: Vec<_> = rows.iter().filter(|(status, _)| *status == 429).collect();
    assert_eq!(refused.len(), 2, "{rows:?}");
    assert!(
        refused
            .iter()
            .all(|(_, by)| by.as_deref() == Some("consumer:rpm")),
        "{rows:?}"
    );
    assert!(
        rows.iter()
            .filter(|(status, _)| *status == 200)
            .all(|(_, by)| by.is_none()),
        "{rows:?}"
    );
    let metrics = gw.metrics(TOKEN).await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("switchyard_rate_limited_total{"))
        .unwrap_or_else(|| panic!("no rate-limited series:\n{metrics}"));
    assert!(line.contains("limit=\"consumer:rpm\""), "{line}");
    assert!(line.contains("route=\"team\""), "{line}");
    assert!(line.ends_with(" 2"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_charges_follow_the_upstreams_usage() {
    // The mock reports the prompt estimate as input and 16 completion tokens: a request of 40
    // characters (10 tokens) is charged 10 at admission and 26 once answered. A limit of 100 a
    // minute gives back one token every 0.6 s, so the figures below hold to a token or two.
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&config(
        &mock,
        "  - name: open\n    path_prefix: /\n    disable_auth: true\n    plugins:\n      rate-limit:\n        limits:\n          - scope: route\n            tokens_per_minute: 100\n",
    ));
    let prompt = "x".repeat(40);
    let remaining = |h: &HeaderMap| number(h, "x-ratelimit-remaining-tokens");

    let (status, h, body) = send(&gw, "/v1/chat/completions", None, chat(&prompt)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 10, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 16, "{body}");
    assert_eq!(number(&h, "x-ratelimit-limit-tokens"), 100);
    assert_eq!(remaining(&h), 90, "the estimate is charged at admission");

    // A request that no upstream serves gives its estimate back.
    mock.behave(json!({"fail_status": 500, "fail_count": 1}))
        .await;
    let (status, _, body) = send(&gw, "/v1/chat/completions", None, chat(&prompt)).await;
    assert_eq!(status, 502, "{body}");

    // 100 − 26 (the first, reconciled) − 10 (this one's estimate); the failed one costs nothing.
    // Charging estimates only would leave 80, keeping the failed one's 70.
    let (status, h, _) = send(&gw, "/v1/chat/completions", None, chat(&prompt)).await;
    assert_eq!(status, 200);
    let left = remaining(&h);
    assert!((64..=70).contains(&left), "remaining tokens {left}");

    // 52 charged: two more fit (the second overdraws to 104 once answered), then a refusal.
    let (status, _, _) = send(&gw, "/v1/chat/completions", None, chat(&prompt)).await;
    assert_eq!(status, 200);
    let (status, _, _) = send(&gw, "/v1/chat/completions", None, chat(&prompt)).await;
    assert_eq!(status, 200);
    let (status, h, body) = send(&gw, "/v1/chat/completions", None, chat(&prompt)).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["type"], "tokens", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("route:tpm"),
        "{body}"
    );
    // Overdrawn: nothing left (a token comes back every 0.6 s, so allow a few on a slow machine).
    assert!(remaining(&h) <= 5, "{h:?}");
    assert!(number(&h, "retry-after") >= 1);
    assert_eq!(mock.chat_requests().await, 5, "the refusal was not sent");
    // A prompt larger than the whole limit can never pass, and says so.
    let (status, _, body) = send(&gw, "/v1/chat/completions", None, chat(&"y".repeat(800))).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot be admitted"),
        "{body}"
    );
    let rows = rate_limited_by(&gw, 7).await;
    assert_eq!(
        rows.iter()
            .filter(|(_, by)| by.as_deref() == Some("route:tpm"))
            .count(),
        2,
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_slot_is_held_by_a_stream_and_freed_when_its_client_leaves() {
    // One token a second: a stream of 16 tokens lasts 16 s.
    let mock = Mock::start(&["--tokens-per-s", "1"]);
    let gw = Gateway::start(&config(
        &mock,
        "  - name: open\n    path_prefix: /\n    disable_auth: true\n    plugins:\n      rate-limit:\n        limits:\n          - scope: route\n            per_model: true\n            concurrent_requests: 1\n",
    ));
    let client = reqwest::Client::new();
    let mut stream = client
        .post(gw.url("/v1/chat/completions"))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(30), stream.chunk())
        .await
        .expect("the first event within 30 s")
        .unwrap();
    assert!(first.is_some(), "the stream has begun");

    // The slot is the stream's: a second request is refused at once, and not sent.
    let (status, h, body) = send(&gw, "/v1/chat/completions", None, chat("Hi")).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("route:per_model:concurrency"),
        "{body}"
    );
    assert_eq!(number(&h, "retry-after"), 1);
    assert_eq!(mock.chat_requests().await, 1);

    // The client leaves mid-stream: the slot comes back long before the stream would have ended.
    drop(stream);
    mock.behave(json!({"tokens_per_s": 1000.0})).await;
    let waited = eventually(
        Duration::from_secs(10),
        "a request is admitted after the streaming client left",
        || async { send(&gw, "/v1/chat/completions", None, chat("Hi")).await.0 == 200 },
    )
    .await;
    assert!(waited < Duration::from_secs(10));
    assert_eq!(
        mock.stats().await["streams_completed"],
        0,
        "the first stream was cut, not finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rate_limit_config_is_refused_at_startup_with_its_line() {
    let route = "routes:\n  - name: team\n    path_prefix: /team\n    plugins:\n      rate-limit:\n        limits:\n          - scope: consumer\n";
    let err = serve_refuses(&format!("{route}            requests_per_minute: 0\n"), &[]);
    assert!(
        err.contains(
            "config.yaml:10: routes[0] (team).plugins.rate-limit.limits[0].requests_per_minute: must be between 1 and 1000000000, got 0"
        ),
        "{err}"
    );
    let err = serve_refuses(&format!("{route}            rpm: 5\n"), &[]);
    assert!(
        err.contains("config.yaml:10:")
            && err.contains("routes[0].plugins.rate-limit.limits[0]: unknown field `rpm`"),
        "{err}"
    );
    let err = serve_refuses(route, &[]);
    assert!(
        err.contains("config.yaml:9: routes[0] (team).plugins.rate-limit.limits[0]: set at least one of requests_per_minute, tokens_per_minute, concurrent_requests"),
        "{err}"
    );
    let err = serve_refuses(
        "routes:\n  - name: team\n    path_prefix: /team\n    plugins:\n      cache: {}\n",
        &[],
    );
    assert!(
        err.contains("routes[0].plugins: unknown field `cache`, expected `rate-limit`"),
        "{err}"
    );
}
