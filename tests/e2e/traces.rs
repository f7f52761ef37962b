//! OpenTelemetry traces against a real OTLP/HTTP receiver (tests/otlp/receiver.py, decoding the
//! protobuf with the official `opentelemetry-proto` messages): the request span continues the
//! client's trace, each attempt (the failed one and the fallback) is a child span with the GenAI
//! and Switchyard attributes, every upstream gets the attempt's own `traceparent`, and the spans
//! still queued at SIGTERM are exported before exit. With tracing off nothing is exported and no
//! trace context is invented upstream (a client's is passed on unchanged).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, chat_body, python_venv, read_port, repo};

const ADMIN: &str = "traces-admin";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// The test's OTLP receiver: a Python process appending the spans it decodes to a file.
struct Receiver {
    port: u16,
    spans: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Receiver {
    async fn start() -> Receiver {
        let python =
            tokio::task::spawn_blocking(|| python_venv("otlp-venv", "tests/otlp/requirements.txt"))
                .await
                .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let spans = dir.path().join("spans.jsonl");
        let mut child = Command::new(python)
            .arg(repo().join("tests/otlp/receiver.py"))
            .arg(&spans)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the OTLP receiver");
        let port = read_port(&mut child, "OTLP receiver");
        Receiver {
            port,
            spans,
            child,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.spans)
            .unwrap_or_default()
            .lines()
            // A line being written as this reads it is skipped (read again next time).
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The spans of `trace_id`, once there are at least `n` of them (panics after a minute).
    async fn wait_for(&self, trace_id: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spans: Vec<Value> = self
                .spans()
                .into_iter()
                .filter(|s| s["trace_id"] == trace_id)
                .collect();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} spans of trace {trace_id} arrived within a minute: {spans:#?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two upstreams of one model: `fixed` tries the first (higher priority) before the second.
fn config(first: &Mock, second: &Mock, telemetry: &str) -> String {
    format!(
        "server:\n  admin_token: {ADMIN}\n  shutdown_grace_seconds: 20\nlogging:\n  format: json\n{telemetry}models:\n  - id: m\n    router: fixed\n    route:\n      - kind: openai_compat\n        base_url: {}\n        provider_model_id: sim-a\n        priority: 1\n      - kind: openai_compat\n        base_url: {}\n        provider_model_id: sim-b\n        priority: 0\n",
        first.base_url(),
        second.base_url()
    )
}

async fn send(
    gateway: &Gateway,
    body: Value,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut request = reqwest::Client::new()
        .post(gateway.url("/v1/chat/completions"))
        .json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("gateway reachable");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.expect("body"))
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn named<'a>(spans: &'a [Value], kind: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["kind"] == kind).collect()
}

async fn traceparents(mock: &Mock) -> Vec<Value> {
    mock.stats().await["traceparents"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_span_continues_the_client_trace_with_one_child_per_attempt() {
    let receiver = Receiver::start().await;
    let (first, second) = (Mock::start(&[]), Mock::start(&[]));
    first.behave(json!({ "fail_status": 500 })).await;
    let telemetry = format!("telemetry:\n  otlp_endpoint: {}\n", receiver.url());
    let mut gateway = Gateway::start_with_env(
        &config(&first, &second, &telemetry),
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("OTEL_SERVICE_NAME", "switchyard-e2e"),
        ],
    );
    let (ep1, ep2) = (
        format!("m:local-{}", first.port),
        format!("m:local-{}", second.port),
    );

    // 1. A client trace: the first upstream fails, the second serves.
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let (status, _, text) = send(
        &gateway,
        chat_body("m", false),
        &[
            ("traceparent", &traceparent),
            ("tracestate", "vendor=opaque"),
            ("x-request-id", "trace-e2e-1"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let spans = receiver.wait_for(TRACE_ID, 3).await;
    assert_eq!(spans.len(), 3, "{spans:#?}");

    let servers = named(&spans, "SPAN_KIND_SERVER");
    assert_eq!(servers.len(), 1, "{spans:#?}");
    let request = servers[0];
    assert_eq!(request["parent_span_id"], CLIENT_SPAN, "{request:#}");
    assert_eq!(request["name"], "chat m", "{request:#}");
    assert_eq!(request["resource"]["service.name"], "switchyard-e2e");
    assert_eq!(attr(request, "gen_ai.operation.name"), "chat");
    assert_eq!(attr(request, "gen_ai.request.model"), "m");
    assert_eq!(attr(request, "switchyard.request_id"), "trace-e2e-1");
    assert_eq!(attr(request, "switchyard.strategy"), "fixed");
    assert_eq!(
        attr(request, "switchyard.decision.order"),
        &json!([ep1, ep2]),
        "{request:#}"
    );
    let seed = attr(request, "switchyard.decision.seed");
    assert!(
        seed.as_str().is_some_and(|s| s.parse::<u64>().is_ok()),
        "the seed is a u64 in a string: {request:#}"
    );
    assert_eq!(attr(request, "http.response.status_code"), 200);
    assert_eq!(attr(request, "switchyard.endpoint"), ep2.as_str());
    assert_eq!(attr(request, "switchyard.attempts"), 2);
    assert!(attr(request, "gen_ai.usage.output_tokens").as_i64() > Some(0));
    assert!(attr(request, "switchyard.time_to_first_token").as_f64() > Some(0.0));
    assert_eq!(request["status"]["code"], "STATUS_CODE_UNSET");

    let mut attempts = named(&spans, "SPAN_KIND_CLIENT");
    attempts.sort_by_key(|s| s["start_ns"].as_u64());
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for attempt in &attempts {
        assert_eq!(attempt["parent_span_id"], request["span_id"], "{attempt:#}");
        assert_eq!(attr(attempt, "gen_ai.operation.name"), "chat");
        assert_eq!(attr(attempt, "gen_ai.provider.name"), "openai");
        assert_eq!(attr(attempt, "switchyard.upstream.kind"), "openai_compat");
        assert_eq!(attr(attempt, "switchyard.hedge"), false);
        assert_eq!(attr(attempt, "server.address"), "127.0.0.1");
    }
    let (failed, served) = (attempts[0], attempts[1]);
    assert_eq!(failed["name"], "chat sim-a");
    assert_eq!(attr(failed, "switchyard.endpoint"), ep1.as_str());
    assert_eq!(attr(failed, "gen_ai.request.model"), "sim-a");
    assert_eq!(attr(failed, "http.response.status_code"), 500);
    assert_eq!(attr(failed, "error.type"), "http_status");
    assert_eq!(failed["status"]["code"], "STATUS_CODE_ERROR", "{failed:#}");
    assert_eq!(served["name"], "chat sim-b");
    assert_eq!(attr(served, "switchyard.endpoint"), ep2.as_str());
    assert_eq!(attr(served, "gen_ai.request.model"), "sim-b");
    // The mock upstream answers with the model it was asked for.
    assert_eq!(attr(served, "gen_ai.response.model"), "sim-b");
    assert_eq!(attr(served, "http.response.status_code"), 200);
    assert!(attr(served, "gen_ai.usage.input_tokens").as_i64() > Some(0));
    assert!(attr(served, "gen_ai.usage.output_tokens").as_i64() > Some(0));
    assert!(attr(served, "switchyard.time_to_first_token").as_f64() > Some(0.0));
    assert_eq!(served["attributes"].get("error.type"), None);
    assert_ne!(served["status"]["code"], "STATUS_CODE_ERROR", "{served:#}");

    // Each upstream saw the client's trace, with its own attempt span as the parent.
    for (mock, attempt) in [(&first, failed), (&second, served)] {
        let seen = traceparents(mock).await;
        let expected = format!("00-{TRACE_ID}-{}-01", attempt["span_id"].as_str().unwrap());
        assert_eq!(seen.last(), Some(&json!(expected)), "{seen:?}");
        assert_eq!(mock.stats().await["last_tracestate"], "vendor=opaque");
    }
    // JSON log lines of the request carry its trace and span ids.
    let log = gateway.log();
    assert!(
        log.lines()
            .any(|l| l.contains(&format!("\"trace_id\":\"{TRACE_ID}\""))
                && l.contains(&format!(
                    "\"span_id\":\"{}\"",
                    request["span_id"].as_str().unwrap()
                ))),
        "{log}"
    );

    // 2. No client trace, streaming: a new trace whose request span is a root.
    let before: std::collections::HashSet<String> = receiver
        .spans()
        .iter()
        .map(|s| s["trace_id"].as_str().unwrap().to_owned())
        .collect();
    first.behave(json!({})).await;
    let (status, _, text) = send(&gateway, chat_body("m", true), &[]).await;
    assert_eq!(status, 200, "{text}");
    let sent = traceparents(&first).await;
    let sent = sent
        .last()
        .and_then(Value::as_str)
        .expect("a traceparent")
        .to_owned();
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts.len(), 4, "{sent}");
    assert!(!before.contains(parts[1]), "a new trace: {sent}");
    let spans = receiver.wait_for(parts[1], 2).await;
    let request = named(&spans, "SPAN_KIND_SERVER")[0];
    let attempt = named(&spans, "SPAN_KIND_CLIENT")[0];
    assert_eq!(request["parent_span_id"], "", "a root span: {request:#}");
    assert_eq!(attempt["span_id"], parts[2], "{attempt:#}");
    assert_eq!(attempt["parent_span_id"], request["span_id"]);
    assert!(
        attr(request, "gen_ai.usage.output_tokens").as_i64() > Some(0),
        "{request:#}"
    );
    // No prompt or answer text is in any span.
    let all = std::fs::read_to_string(&receiver.spans).unwrap();
    assert!(!all.contains("Say hello"), "{all}");

    // The exporter's own counter.
    let metrics = gateway.metrics(ADMIN).await;
    assert!(
        metrics.contains("switchyard_trace_spans_total{outcome=\"exported\"}"),
        "{metrics}"
    );

    // 3. Spans still queued at SIGTERM are exported before the process exits.
    let last = "0af7651916cd43dd8448eb211c80319c";
    let (status, _, text) = send(
        &gateway,
        chat_body("m", false),
        &[("traceparent", &format!("00-{last}-b7ad6b7169203331-01"))],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    gateway.terminate();
    let exit = gateway.wait_exit(Duration::from_secs(60));
    assert!(exit.is_some_and(|s| s.success()), "exit: {exit:?}");
    let spans: Vec<Value> = receiver
        .spans()
        .into_iter()
        .filter(|s| s["trace_id"] == last)
        .collect();
    assert_eq!(spans.len(), 2, "flushed at exit: {spans:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_off_nothing_is_exported_and_only_a_client_trace_is_passed_on() {
    let receiver = Receiver::start().await;
    let (first, second) = (Mock::start(&[]), Mock::start(&[]));
    // An endpoint in the file, switched off by the standard variable.
    let telemetry = format!("telemetry:\n  otlp_endpoint: {}\n", receiver.url());
    let mut gateway = Gateway::start_with_env(
        &config(&first, &second, &telemetry),
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("OTEL_SDK_DISABLED", "true"),
        ],
    );
    let (status, _, text) = send(&gateway, chat_body("m", false), &[]).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        traceparents(&first).await,
        vec![Value::Null],
        "nothing invented"
    );
    assert_eq!(first.stats().await["last_tracestate"], Value::Null);

    // A client's valid trace context goes upstream as it came; an invalid one does not.
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let (status, _, text) = send(
        &gateway,
        chat_body("m", true),
        &[
            ("traceparent", &traceparent),
            ("tracestate", "vendor=opaque"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (status, _, text) = send(
        &gateway,
        chat_body("m", false),
        &[(
            "traceparent",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        )],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        traceparents(&first).await,
        vec![Value::Null, json!(traceparent), Value::Null]
    );
    // What is exported would have been flushed at exit.
    gateway.terminate();
    let exit = gateway.wait_exit(Duration::from_secs(60));
    assert!(exit.is_some_and(|s| s.success()), "exit: {exit:?}");
    assert!(receiver.spans().is_empty(), "{:?}", receiver.spans());
    assert!(!gateway.log().contains("trace_id"), "{}", gateway.log());
}

/// The refusal of a bad endpoint names the file, the line and the key.
#[test]
fn a_bad_otlp_endpoint_is_refused_with_its_line() {
    let stderr = crate::harness::serve_refuses(
        "server: {}\ntelemetry:\n  otlp_endpoint: collector:4318\n",
        &[],
    );
    assert!(
        stderr.contains(
            "config.yaml:5: telemetry.otlp_endpoint: `collector:4318` is not an http:// or https:// URL"
        ),
        "{stderr}"
    );
}
