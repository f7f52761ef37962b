//! Observing the gateway: `GET /metrics` after real traffic (a failing upstream, a fallback, a
//! stream, caller errors), request ids end to end, and JSON logs.

use std::time::Duration;

use serde_json::json;

use crate::harness::{Gateway, Mock, chat_body};

const ADMIN_TOKEN: &str = "observe-admin-token";

/// A model `demo` whose first route (A) is always tried first; B is the fallback.
fn fallback_model(a: &Mock, b: &Mock, extra: &str) -> String {
    format!(
        "server:\n  admin_token: {ADMIN_TOKEN}\n  metrics_listen: 127.0.0.1:0\n{extra}models:\n  - id: demo\n    router: fixed\n    route:\n      - kind: openai_compat\n        weight: 1.0\n        base_url: {}\n        provider_model_id: sim-a\n      - kind: openai_compat\n        weight: 1e-9\n        base_url: {}\n        provider_model_id: sim-b\n",
        a.base_url(),
        b.base_url()
    )
}

/// The metrics-only listener's address, from the gateway's log line that announces it.
pub async fn metrics_url(gw: &Gateway) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let log = gw.log();
        if let Some(rest) = log.split("serving /metrics without a token on ").nth(1) {
            let url: String = rest
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '"' && *c != '\\')
                .collect();
            return url;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway never announced its metrics listener:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One sample of a Prometheus text exposition.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

fn parse_exposition(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|l| !l.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            Sample {
                name: name.to_owned(),
                labels,
                value: value.parse().expect("a number"),
            }
        })
        .collect()
}

/// The sum of every sample of `name` whose labels include all of `want`.
fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            want.iter()
                .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| s.value)
        .sum()
}

async fn scrape(url: &str, token: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("metrics reachable");
    (
        response.status().as_u16(),
        response.text().await.expect("body"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_attempts_fallbacks_and_errors_with_bounded_labels() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "fail_status": 500 })).await;
    let gw = Gateway::start(&fallback_model(&a, &b, ""));
    for _ in 0..3 {
        let (status, body) = gw.chat(chat_body("demo", false)).await;
        assert_eq!(status, 200, "{body}");
    }
    // A stream: three failures in a row opened A's breaker, so B serves it at the first attempt.
    let (status, text) = gw.chat_text(chat_body("demo", true)).await;
    assert_eq!(status, 200, "{text}");
    // Caller errors: an unknown model, a body that is not JSON.
    assert_eq!(gw.chat(chat_body("nope", false)).await.0, 404);
    let bad = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    // The main listener's /metrics is an admin endpoint.
    let (status, _) = scrape(&gw.url("/metrics"), None).await;
    assert_eq!(status, 401, "no token, no metrics");
    let (status, _) = scrape(&gw.url("/metrics"), Some("wrong")).await;
    assert_eq!(status, 401);
    let (status, main_text) = scrape(&gw.url("/metrics"), Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{main_text}");
    // The metrics listener needs no token, and serves nothing else.
    let url = metrics_url(&gw).await;
    let (status, text) = scrape(&url, None).await;
    assert_eq!(status, 200, "{text}");
    let other = url.replace("/metrics", "/v1/models");
    assert_eq!(reqwest::get(&other).await.unwrap().status(), 404);

    // The stream's request is booked when it ends: poll until it is.
    let a_id = format!("demo:local-{}", a.port);
    let b_id = format!("demo:local-{}", b.port);
    let served = [
        ("model", "demo"),
        ("endpoint", b_id.as_str()),
        ("status_class", "2xx"),
        ("inbound_protocol", "openai"),
        ("upstream_protocol", "openai_compat"),
        ("operation", "chat"),
    ];
    let mut samples = parse_exposition(&text);
    for _ in 0..100 {
        if value(
            &samples,
            "gen_ai_server_request_duration_seconds_count",
            &served,
        ) == 4.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        samples = parse_exposition(&scrape(&url, None).await.1);
    }
    let v = |name: &str, want: &[(&str, &str)]| value(&samples, name, want);
    assert_eq!(
        v("gen_ai_server_request_duration_seconds_count", &served),
        4.0,
        "{text}"
    );
    assert_eq!(
        v(
            "gen_ai_server_time_to_first_token_seconds_count",
            &served[..2]
        ),
        4.0
    );
    // The stream had 16 tokens: a time-per-output-token sample.
    assert!(
        samples.iter().any(
            |s| s.name == "gen_ai_server_time_per_output_token_seconds_count"
                || s.name == "gen_ai_server_time_per_output_token_seconds_bucket"
        ),
        "{text}"
    );
    assert_eq!(v("switchyard_fallbacks_total", &[("model", "demo")]), 3.0);
    assert_eq!(
        v("switchyard_request_attempts_sum", &[("model", "demo")]),
        7.0,
        "two attempts for each of the first three requests, one for the stream"
    );
    // Per attempt: A failed three times with a 500, B served four times.
    assert_eq!(
        v(
            "gen_ai_client_operation_duration_seconds_count",
            &[
                ("endpoint", a_id.as_str()),
                ("error_type", "http_status"),
                ("status_class", "5xx")
            ]
        ),
        3.0,
        "{text}"
    );
    assert_eq!(
        v(
            "gen_ai_client_operation_duration_seconds_count",
            &[
                ("endpoint", b_id.as_str()),
                ("error_type", "none"),
                ("status_class", "2xx")
            ]
        ),
        4.0
    );
    // Tokens B reported: 16 completion tokens per answer.
    assert_eq!(
        v(
            "gen_ai_client_token_usage_sum",
            &[("endpoint", b_id.as_str()), ("type", "output")]
        ),
        64.0,
        "{text}"
    );
    assert!(
        v(
            "gen_ai_client_token_usage_sum",
            &[("endpoint", b_id.as_str()), ("type", "input")]
        ) > 0.0
    );
    assert!(
        v(
            "switchyard_gateway_overhead_seconds_count",
            &[("model", "demo")]
        ) >= 4.0
    );
    // Errors by the closed vocabulary.
    assert_eq!(
        v(
            "switchyard_errors_total",
            &[
                ("error_type", "caller_model_not_found"),
                ("status_class", "4xx")
            ]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        v(
            "switchyard_errors_total",
            &[("error_type", "caller_invalid_body")]
        ),
        1.0
    );
    assert_eq!(
        v(
            "switchyard_errors_total",
            &[("error_type", "caller_unauthorized")]
        ),
        0.0,
        "the admin endpoint's 401s are not inference errors"
    );
    // State mirrored at scrape time: A's availability fell, B's did not; nothing in flight.
    let availability = |id: &str| v("switchyard_endpoint_availability", &[("endpoint", id)]);
    assert!(availability(&a_id) < 1.0, "{text}");
    assert_eq!(availability(&b_id), 1.0);
    assert_eq!(
        v(
            "switchyard_endpoint_in_flight",
            &[("endpoint", b_id.as_str())]
        ),
        0.0
    );
    let circuit = |id: &str| v("switchyard_endpoint_circuit_state", &[("endpoint", id)]);
    assert_eq!(circuit(&a_id), 2.0, "A's breaker is open: {text}");
    assert_eq!(circuit(&b_id), 0.0);
    // Each of the four requests that reached selection was ordered: the three with both upstreams
    // admitted by the strategy, the stream (A's breaker open, B alone) by the host, since `fixed`
    // declares `select-single`.
    let selected = v(
        "switchyard_strategy_select_duration_seconds_count",
        &[("model", "demo"), ("strategy", "fixed")],
    );
    let skipped = v(
        "switchyard_strategy_selects_skipped_total",
        &[("model", "demo"), ("strategy", "fixed")],
    );
    assert_eq!((selected, skipped), (3.0, 1.0), "{text}");
    // The request log wrote the rows (it flushes every 250 ms).
    let mut written = 0.0;
    for _ in 0..100 {
        let samples = parse_exposition(&scrape(&url, None).await.1);
        written = value(
            &samples,
            "switchyard_request_log_rows_total",
            &[("outcome", "written")],
        );
        if written >= 4.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        written, 4.0,
        "the four served requests (caller errors before a model is known are not logged)"
    );
    // No label carries a caller, a key or a prompt.
    for s in &samples {
        for (k, _) in &s.labels {
            assert!(
                [
                    "model",
                    "operation",
                    "inbound_protocol",
                    "upstream_protocol",
                    "endpoint",
                    "status_class",
                    "status",
                    "error_type",
                    "type",
                    "le",
                    "quantile",
                    "strategy",
                    "call",
                    "kind",
                    "pool",
                    "outcome",
                ]
                .contains(&k.as_str()),
                "unexpected label {k} on {s:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_echoed_generated_and_sent_upstream() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = Gateway::start(&fallback_model(&a, &b, ""));
    let client = reqwest::Client::new();
    let post = |id: Option<&str>, model: &str| {
        let mut request = client
            .post(gw.url("/v1/chat/completions"))
            .json(&chat_body(model, false));
        if let Some(id) = id {
            request = request.header("x-request-id", id);
        }
        request.send()
    };
    let header = |r: &reqwest::Response| {
        r.headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_owned())
    };

    // The client's id: echoed, and the upstream got it.
    let response = post(Some("client-id-42"), "demo").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response).as_deref(), Some("client-id-42"));
    assert_eq!(a.stats().await["last_request_id"], "client-id-42");

    // No id: one is generated (a UUID v7), returned, and is what the upstream got.
    let response = post(None, "demo").await.unwrap();
    let generated = header(&response).expect("a generated id");
    assert_eq!(generated.len(), 36, "{generated}");
    assert_eq!(&generated[14..15], "7", "UUID version 7: {generated}");
    assert_eq!(a.stats().await["last_request_id"], generated.as_str());

    // An id that is not a bounded visible-ASCII token is replaced.
    for bad in ["has space".to_owned(), "x".repeat(200)] {
        let response = post(Some(&bad), "demo").await.unwrap();
        let id = header(&response).unwrap();
        assert_ne!(id, bad);
        assert_eq!(id.len(), 36);
        assert_eq!(a.stats().await["last_request_id"], id.as_str());
    }

    // Errors carry it in the header and in the error object, in each dialect.
    let response = post(Some("err-1"), "nope").await.unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(header(&response).as_deref(), Some("err-1"));
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["request_id"], "err-1", "{body}");
    let response = client
        .post(gw.url("/v1/messages"))
        .header("x-request-id", "err-2")
        .json(&json!({"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(header(&response).as_deref(), Some("err-2"));
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["request_id"], "err-2", "{body}");
    assert_eq!(body["error"]["request_id"], "err-2", "{body}");
    // An upstream failure: every attempt failed.
    a.behave(json!({ "fail_status": 500 })).await;
    b.behave(json!({ "fail_status": 500 })).await;
    let response = post(Some("err-3"), "demo").await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(header(&response).as_deref(), Some("err-3"));
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["request_id"], "err-3", "{body}");
    assert_eq!(
        b.stats().await["last_request_id"],
        "err-3",
        "the fallback got the same id"
    );
    // Answers that are not inference answers carry one too.
    let health = client.get(gw.url("/health")).send().await.unwrap();
    assert!(header(&health).is_some());

    // The request log has the ids.
    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        gw.dir.path().join("switchyard.db").display()
    ))
    .await
    .unwrap();
    let mut ids: Vec<(Option<String>, i64)> = Vec::new();
    for _ in 0..100 {
        ids = sqlx::query_as("SELECT request_id, status FROM api_logs ORDER BY id")
            .fetch_all(&db)
            .await
            .unwrap();
        if ids.len() == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert_eq!(ids[0], (Some("client-id-42".to_owned()), 200));
    assert_eq!(ids[1], (Some(generated), 200));
    assert_eq!(ids[4], (Some("err-3".to_owned()), 502));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_the_request_id() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "fail_status": 500 })).await;
    let gw = Gateway::start_with_env(
        &fallback_model(&a, &b, "logging:\n  format: json\n"),
        &[("ROUTING_AFFINITY_ENABLED", "0")],
    );
    let response = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", "json-log-id")
        .json(&chat_body("demo", false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // The access line is written once the answer is (see server/answered.rs): wait for it.
    let mut log = String::new();
    for _ in 0..100 {
        log = gw.log();
        if log
            .lines()
            .any(|l| l.contains("\"served\"") && l.contains("json-log-id"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.len() > 2, "{log}");
    let served: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "served")
        .collect();
    assert_eq!(served.len(), 1, "{log}");
    let line = served[0];
    assert_eq!(line["span"]["request_id"], "json-log-id", "{line}");
    assert_eq!(line["fields"]["fell_back"], true, "{line}");
    assert_eq!(line["target"], "switchyard::access");
    // The failed attempt's debug line is inside the same request.
    assert!(
        lines
            .iter()
            .filter(|l| l["spans"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["request_id"] == "json-log-id")))
            .count()
            >= 2,
        "{log}"
    );
}

/// The edge's own answers (issue #15) are observed like the others: a request the client
/// abandoned is a 499 row with its id and counts as `caller_disconnected`; a body that came too
/// slowly is a 408 with the id in its header and body; a stream that breaks after its first token
/// ends with an error event that names the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_slow_and_broken_requests_carry_their_ids_and_are_counted() {
    let slow = Mock::start(&["--ttft-ms", "20000"]);
    let other = Mock::start(&[]);
    let gw = Gateway::start(&fallback_model(
        &slow,
        &other,
        "  request_body_timeout_seconds: 1\n",
    ));
    let metrics = metrics_url(&gw).await;

    // Abandoned: the client gives up long before the upstream's first byte.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap();
    let err = impatient
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", "abandoned-1")
        .json(&chat_body("demo", false))
        .send()
        .await
        .expect_err("the upstream answers after 20 s");
    assert!(err.is_timeout(), "{err}");
    drop(impatient);

    // Too slow a body: the 408 comes in the endpoint's dialect, with the id.
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut tcp,
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-request-id: slow-1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut seen),
    )
    .await;
    let text = String::from_utf8_lossy(&seen).to_lowercase();
    assert!(text.starts_with("http/1.1 408"), "{text}");
    assert!(text.contains("x-request-id: slow-1\r\n"), "{text}");
    assert!(text.contains(r#""request_id":"slow-1""#), "{text}");

    // Broken after the first token: the error event names the request.
    slow.behave(json!({ "ttft_ms": 0, "break_stream_after_events": 3 }))
        .await;
    let response = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", "broken-1")
        .json(&chat_body("demo", true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let stream = tokio::time::timeout(Duration::from_secs(30), response.text())
        .await
        .expect("the broken stream ends")
        .unwrap_or_default();
    let error_event = stream
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find(|v| v.get("error").is_some())
        .unwrap_or_else(|| panic!("no error event in the stream:\n{stream}"));
    assert_eq!(error_event["error"]["request_id"], "broken-1", "{stream}");

    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        gw.dir.path().join("switchyard.db").display()
    ))
    .await
    .unwrap();
    let mut rows: Vec<(Option<String>, i64)> = Vec::new();
    for _ in 0..200 {
        rows = sqlx::query_as("SELECT request_id, status FROM api_logs ORDER BY id")
            .fetch_all(&db)
            .await
            .unwrap();
        if rows.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        rows.contains(&(Some("abandoned-1".to_owned()), 499)),
        "{rows:?}"
    );
    assert!(
        rows.contains(&(Some("broken-1".to_owned()), 200)),
        "{rows:?}"
    );

    let (status, text) = scrape(&metrics, None).await;
    assert_eq!(status, 200, "{text}");
    let samples = parse_exposition(&text);
    let errors = |error_type: &str, class: &str| {
        value(
            &samples,
            "switchyard_errors_total",
            &[("error_type", error_type), ("status_class", class)],
        )
    };
    assert_eq!(errors("caller_disconnected", "4xx"), 1.0, "{text}");
    assert_eq!(errors("caller_body_timeout", "4xx"), 1.0, "{text}");
    assert_eq!(errors("upstream_stream_failed", "2xx"), 1.0, "{text}");
    assert_eq!(
        value(
            &samples,
            "gen_ai_server_request_duration_seconds_count",
            &[("status_class", "4xx"), ("endpoint", "none")],
        ),
        1.0,
        "the abandoned request is one 4xx request without an endpoint: {text}"
    );
}
