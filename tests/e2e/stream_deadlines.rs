//! Every wait on an upstream's answer has a deadline and every buffer a limit (issue 15, items
//! 1–4). The misbehaving upstreams are written here on raw sockets; the healthy one is the
//! project's mock. Each test asserts what the client got, which upstream was asked, and what
//! `/health/deep` and the request log say.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{Gateway, Mock, chat_body};

/// An upstream that reads each request and then answers with `answer`, written by hand.
struct RawUpstream {
    port: u16,
    requests: Arc<AtomicUsize>,
}

impl RawUpstream {
    async fn start<F, Fut>(answer: F) -> RawUpstream
    where
        F: Fn(TcpStream, Vec<u8>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let counter = counter.clone();
                let answer = answer.clone();
                tokio::spawn(async move {
                    if let Some(body) = read_request(&mut socket).await {
                        counter.fetch_add(1, Ordering::SeqCst);
                        answer(socket, body).await;
                    }
                });
            }
        });
        RawUpstream { port, requests }
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads one request's head and returns its `content-length` body; `None` when the peer went
/// away.
async fn read_request(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let Ok(n) = socket.read(&mut chunk).await else {
            return None;
        };
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
    Some(buffer.split_off(head_end))
}

/// An SSE answer's head; the body runs until the connection closes.
const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let chunk = json!({
        "id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": 0, "model": "raw",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {chunk}\n\n")
}

/// OpenAI's first frame: the role with empty content, no text yet.
fn role_frame() -> String {
    chunk(json!({"role": "assistant", "content": ""}), None)
}

fn token_frame(text: &str) -> String {
    chunk(json!({"content": text}), None)
}

/// Writes `frames`, then holds the connection open and silent for `silence`.
async fn frames_then_silence(mut socket: TcpStream, frames: Vec<String>, silence: Duration) {
    let _ = socket.write_all(SSE_HEAD).await;
    for frame in frames {
        let _ = socket.write_all(frame.as_bytes()).await;
    }
    let _ = socket.flush().await;
    tokio::time::sleep(silence).await;
}

/// A model `m` whose primary is `primary` (with `primary_extra` keys of its `route:` entry) and
/// whose backup, essentially never chosen first, is the mock.
fn config(upstream: &str, primary: &str, primary_extra: &str, kind: &str, backup: &Mock) -> String {
    format!(
        "server:\n  admin_token: {ADMIN}\nupstream:\n  connect_timeout_ms: 2000\n{upstream}models:\n  - id: m\n    router: fixed\n    route:\n      - kind: {kind}\n        weight: 1\n        base_url: {primary}\n{primary_extra}      - kind: {kind}\n        weight: 1e-9\n        base_url: {}\n",
        backup.base_url()
    )
}

/// A streamed request to `path`; the status, the `data:` payloads, and how long it all took.
async fn stream(gw: &Gateway, path: &str, body: Value) -> (u16, Vec<String>, Duration) {
    let started = Instant::now();
    let response = reqwest::Client::new()
        .post(gw.url(path))
        .json(&body)
        .send()
        .await
        .expect("gateway reachable");
    let status = response.status().as_u16();
    let mut buffer = String::new();
    let mut body = response.bytes_stream();
    while let Some(Ok(chunk)) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
    let data = buffer
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect();
    (status, data, started.elapsed())
}

/// The Chat text of a stream's payloads.
fn chat_text(data: &[String]) -> String {
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// The Messages text of a stream's payloads.
fn messages_text(data: &[String]) -> String {
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// The admin token of every gateway these tests start (`/health/deep` is behind it).
const ADMIN: &str = "deadline-admin";

async fn endpoint_report(gw: &Gateway, endpoint_id: &str) -> Value {
    let deep = gw.deep(ADMIN).await;
    deep["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["endpoint_id"] == endpoint_id)
        .cloned()
        .unwrap_or_else(|| panic!("{endpoint_id} in {deep}"))
}

/// The request log's rows (status, fell_back, error, failed_attempts), once `n` are written.
async fn log_rows(gw: &Gateway, n: usize) -> Vec<(i64, bool, Option<String>, Option<String>)> {
    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        gw.dir.path().join("switchyard.db").display()
    ))
    .await
    .unwrap();
    let mut rows = Vec::new();
    for _ in 0..200 {
        rows = sqlx::query_as(
            "SELECT status, fell_back, error, failed_attempts FROM api_logs ORDER BY id",
        )
        .fetch_all(&db)
        .await
        .unwrap();
        if rows.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rows.len(), n, "{rows:?}");
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_silent_after_its_headers_fails_over_at_the_first_token_deadline() {
    // Headers and a role delta, then two minutes of nothing.
    let a = RawUpstream::start(|socket, _| {
        frames_then_silence(socket, vec![role_frame()], Duration::from_secs(120))
    })
    .await;
    let b = Mock::start(&[]);
    // The route's own deadline (1 s) overrides the section's default (300 s).
    let gw = Gateway::start(&config(
        "",
        &a.base_url(),
        "        first_token_timeout_seconds: 1\n",
        "openai_compat",
        &b,
    ));
    let (status, data, took) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
    assert_eq!(status, 200, "{data:?}");
    assert!(
        took < Duration::from_secs(15),
        "failed over within the bound: {took:?}"
    );
    assert!(
        chat_text(&data).starts_with("Hello from sim"),
        "the backup's content: {data:?}"
    );
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let roles = data.iter().filter(|d| d.contains("\"role\"")).count();
    assert_eq!(
        roles, 1,
        "the held role delta of A was never sent: {data:?}"
    );
    assert_eq!(a.requests(), 1);
    assert_eq!(b.chat_requests().await, 1);

    let report = endpoint_report(&gw, &format!("m:local-{}", a.port)).await;
    assert_eq!(report["failures"], 1, "{report}");
    assert!(
        report["last_error"]
            .as_str()
            .unwrap()
            .starts_with("first_token_timeout"),
        "{report}"
    );
    let rows = log_rows(&gw, 1).await;
    let (status, fell_back, error, failed) = &rows[0];
    assert_eq!((*status, *fell_back, error.as_deref()), (200, true, None));
    let failed: Value = serde_json::from_str(failed.as_deref().unwrap()).unwrap();
    assert_eq!(failed[0]["error_type"], "first_token_timeout", "{failed}");
    assert_eq!(
        failed[0]["endpoint_id"],
        format!("m:local-{}", a.port),
        "{failed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_stalls_after_its_first_token_ends_with_an_idle_timeout_event() {
    let a = RawUpstream::start(|socket, _| {
        frames_then_silence(
            socket,
            vec![role_frame(), token_frame("Hel")],
            Duration::from_secs(120),
        )
    })
    .await;
    let b = Mock::start(&[]);
    let gw = Gateway::start(&config(
        "  idle_timeout_seconds: 1\n",
        &a.base_url(),
        "",
        "openai_compat",
        &b,
    ));
    let (status, data, took) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(15), "ended in time: {took:?}");
    assert_eq!(chat_text(&data), "Hel", "{data:?}");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("idle_timeout"),
        "an error event in the client's dialect: {last}"
    );
    assert_eq!(b.chat_requests().await, 0, "no fallback after content");

    let report = endpoint_report(&gw, &format!("m:local-{}", a.port)).await;
    assert_eq!(report["failures"], 1, "the expiry is charged: {report}");
    assert!(
        report["last_error"]
            .as_str()
            .unwrap()
            .starts_with("idle_timeout"),
        "{report}"
    );
    let rows = log_rows(&gw, 1).await;
    assert!(
        rows[0].2.as_deref().unwrap().starts_with("idle_timeout"),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endless_stream_ends_at_the_total_deadline() {
    let a = RawUpstream::start(|mut socket, _| async move {
        let _ = socket.write_all(SSE_HEAD).await;
        let _ = socket.write_all(role_frame().as_bytes()).await;
        // A token every 200 ms, forever: never idle, never done.
        while socket.write_all(token_frame("x").as_bytes()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let b = Mock::start(&[]);
    let gw = Gateway::start(&config(
        "  idle_timeout_seconds: 1\n",
        &a.base_url(),
        "        stream_timeout_seconds: 3\n",
        "openai_compat",
        &b,
    ));
    let (status, data, took) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
    assert_eq!(status, 200);
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(20),
        "{took:?}"
    );
    assert!(chat_text(&data).len() >= 3, "tokens flowed: {data:?}");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("total_timeout"),
        "{last}"
    );
    let report = endpoint_report(&gw, &format!("m:local-{}", a.port)).await;
    assert!(
        report["last_error"]
            .as_str()
            .unwrap()
            .starts_with("total_timeout"),
        "{report}"
    );
    assert_eq!(b.chat_requests().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifecycle_frame_then_an_error_or_a_close_falls_back() {
    let error_frame =
        "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
    let cases: [(&str, Vec<String>); 2] = [
        ("closed after the role delta", vec![role_frame()]),
        (
            "an error event after the role delta",
            vec![role_frame(), error_frame.to_owned()],
        ),
    ];
    for (case, frames) in cases {
        let a = RawUpstream::start(move |socket, _| {
            frames_then_silence(socket, frames.clone(), Duration::ZERO)
        })
        .await;
        let b = Mock::start(&[]);
        let gw = Gateway::start(&config("", &a.base_url(), "", "openai_compat", &b));
        let (status, data, _) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
        assert_eq!(status, 200, "{case}: {data:?}");
        assert!(
            chat_text(&data).starts_with("Hello from sim"),
            "{case}: {data:?}"
        );
        assert!(
            !data.iter().any(|d| d.contains("overloaded")),
            "{case}: {data:?}"
        );
        assert_eq!(
            data.iter().filter(|d| d.contains("\"role\"")).count(),
            1,
            "{case}: one role delta, the backup's: {data:?}"
        );
        assert_eq!((a.requests(), b.chat_requests().await), (1, 1), "{case}");
        let report = endpoint_report(&gw, &format!("m:local-{}", a.port)).await;
        assert_eq!(report["failures"], 1, "{case}: {report}");
    }

    // Anthropic: `message_start` (and a ping), then an overloaded error, translated for a Chat
    // client and passed through for a Messages client.
    let a = RawUpstream::start(|socket, _| {
        let start = json!({"type": "message_start", "message": {"id": "msg_raw", "type": "message", "role": "assistant", "model": "raw", "content": [], "stop_reason": null, "usage": {"input_tokens": 3, "output_tokens": 0}}});
        let frames = vec![
            format!("event: message_start\ndata: {start}\n\n"),
            "event: ping\ndata: {\"type\":\"ping\"}\n\n".to_owned(),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n".to_owned(),
        ];
        frames_then_silence(socket, frames, Duration::ZERO)
    })
    .await;
    let b = Mock::start(&[]);
    let gw = Gateway::start(&config("", &a.base_url(), "", "anthropic", &b));
    let (status, data, _) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
    assert_eq!(status, 200, "{data:?}");
    assert!(chat_text(&data).starts_with("Hello from sim"), "{data:?}");
    let messages = json!({"model": "m", "stream": true, "max_tokens": 64, "messages": [{"role": "user", "content": "Say hello."}]});
    let (status, data, _) = stream(&gw, "/v1/messages", messages).await;
    assert_eq!(status, 200, "{data:?}");
    assert!(
        !data
            .iter()
            .any(|d| d.contains("Overloaded") || d.contains("msg_raw")),
        "nothing of A reached the client: {data:?}"
    );
    assert_eq!(
        data.iter()
            .filter(|d| d.contains("\"message_start\""))
            .count(),
        1,
        "{data:?}"
    );
    assert!(
        messages_text(&data).starts_with("Hello from sim"),
        "{data:?}"
    );
    assert_eq!((a.requests(), b.chat_requests().await), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_first_event_falls_back_in_the_same_dialect_and_translated() {
    let a = RawUpstream::start(|socket, _| {
        frames_then_silence(
            socket,
            vec![
                "data: {not json\n\n".to_owned(),
                "data: [DONE]\n\n".to_owned(),
            ],
            Duration::ZERO,
        )
    })
    .await;
    let b = Mock::start(&[]);
    let gw = Gateway::start(&config("", &a.base_url(), "", "openai_compat", &b));
    // Same dialect: passed through, were it not refused.
    let (status, data, _) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
    assert_eq!(status, 200, "{data:?}");
    assert!(chat_text(&data).starts_with("Hello from sim"), "{data:?}");
    assert!(!data.iter().any(|d| d.contains("not json")), "{data:?}");
    // Translated: a Messages client.
    let messages = json!({"model": "m", "stream": true, "max_tokens": 64, "messages": [{"role": "user", "content": "Say hello."}]});
    let (status, data, _) = stream(&gw, "/v1/messages", messages).await;
    assert_eq!(status, 200, "{data:?}");
    assert!(
        messages_text(&data).starts_with("Hello from sim"),
        "{data:?}"
    );
    assert!(
        !data.iter().any(|d| d.contains("\"error\"")),
        "no error event: {data:?}"
    );
    assert_eq!((a.requests(), b.chat_requests().await), (2, 2));
    let report = endpoint_report(&gw, &format!("m:local-{}", a.port)).await;
    assert_eq!(report["failures"], 2, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_completes_without_content_is_relayed() {
    // An empty answer: a role delta, a finish reason, the end. Complete, so not a failure.
    let a = RawUpstream::start(|socket, _| {
        let frames = vec![
            role_frame(),
            chunk(json!({}), Some("length")),
            "data: [DONE]\n\n".to_owned(),
        ];
        frames_then_silence(socket, frames, Duration::ZERO)
    })
    .await;
    let b = Mock::start(&[]);
    let gw = Gateway::start(&config("", &a.base_url(), "", "openai_compat", &b));
    let (status, data, _) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
    assert_eq!(status, 200, "{data:?}");
    assert_eq!(data.len(), 3, "{data:?}");
    assert!(data[1].contains("\"length\""), "{data:?}");
    assert_eq!(data[2], "[DONE]");
    assert_eq!(b.chat_requests().await, 0, "no fallback");
    let report = endpoint_report(&gw, &format!("m:local-{}", a.port)).await;
    assert_eq!(
        (report["successes"].as_u64(), report["failures"].as_u64()),
        (Some(1), Some(0)),
        "{report}"
    );
}

/// Peak resident memory of a process, in MiB (Linux).
fn peak_rss_mib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024)
}

/// Writes `head` then `filler` up to `total` bytes, until the gateway stops reading.
async fn endless(mut socket: TcpStream, head: Vec<u8>, total: usize) {
    if socket.write_all(&head).await.is_err() {
        return;
    }
    let filler = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < total && socket.write_all(&filler).await.is_ok() {
        sent += filler.len();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_answer_or_event_fails_and_falls_back() {
    const HUGE: usize = 300 << 20;
    // A 300 MiB SSE line without a newline (the limit is the default, 1 MiB).
    let line = RawUpstream::start(|socket, _| {
        let mut head = SSE_HEAD.to_vec();
        head.extend_from_slice(b"data: ");
        endless(socket, head, HUGE)
    })
    .await;
    // A 300 MiB body that declares no length (the limit is the default, 64 MiB).
    let body = RawUpstream::start(|socket, _| {
        let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"".to_vec();
        endless(socket, head, HUGE)
    })
    .await;
    let b = Mock::start(&[]);
    let yaml = format!(
        "server:\n  admin_token: {ADMIN}\nmodels:\n  - id: m\n    router: fixed\n    route:\n      - kind: openai_compat\n        weight: 1\n        base_url: {}\n      - kind: openai_compat\n        weight: 1e-9\n        base_url: {}\n  - id: n\n    router: fixed\n    route:\n      - kind: openai_compat\n        weight: 1\n        base_url: {}\n      - kind: openai_compat\n        weight: 1e-9\n        base_url: {}\n",
        line.base_url(),
        b.base_url(),
        body.base_url(),
        b.base_url()
    );
    let gw = Gateway::start(&yaml);
    let before = peak_rss_mib(gw.pid());

    let (status, data, took) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
    assert_eq!(status, 200, "{data:?}");
    assert!(chat_text(&data).starts_with("Hello from sim"), "{data:?}");
    let after_line = peak_rss_mib(gw.pid());
    eprintln!("oversized SSE line: fell back in {took:?}");

    let started = Instant::now();
    let (status, answer) = gw.chat(chat_body("n", false)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("Hello from sim"),
        "{answer}"
    );
    let after_body = peak_rss_mib(gw.pid());
    eprintln!("oversized body: fell back in {:?}", started.elapsed());
    eprintln!(
        "gateway peak RSS (VmHWM) MiB: at start {before:?}, after the 300 MiB line {after_line:?}, after the 300 MiB body {after_body:?}"
    );

    assert_eq!((line.requests(), body.requests()), (1, 1));
    assert_eq!(b.chat_requests().await, 2);
    for (upstream, model) in [(&line, "m"), (&body, "n")] {
        let report = endpoint_report(&gw, &format!("{model}:local-{}", upstream.port)).await;
        assert!(
            report["last_error"]
                .as_str()
                .unwrap()
                .starts_with("response_too_large"),
            "{report}"
        );
    }
    // Both were read only to their limits (the old gateway held 636 and 852 MiB).
    if let Some(peak) = after_body {
        assert!(peak < 400, "peak RSS {peak} MiB");
    }
    // And it still serves.
    assert_eq!(gw.chat(chat_body("m", false)).await.0, 200);
}

/// A complete, non-streaming Chat answer.
async fn whole_answer(mut socket: TcpStream) {
    let body = json!({
        "id": "chatcmpl-raw", "object": "chat.completion", "created": 0, "model": "raw",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "raw answer"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    })
    .to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = socket.write_all(head.as_bytes()).await;
    let _ = socket.write_all(body.as_bytes()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_races_streams_to_their_first_content_not_their_first_event() {
    // The cheap primary answers whole requests at once; its streams send the role delta at once
    // and their first content 2.5 s later. Committed at the role delta, the primary would win
    // the race before the hedge's checkpoint and the client would wait 2.5 s.
    let cheap = RawUpstream::start(|socket, body| async move {
        if !String::from_utf8_lossy(&body).contains("\"stream\":true") {
            return whole_answer(socket).await;
        }
        let mut socket = socket;
        let _ = socket.write_all(SSE_HEAD).await;
        let _ = socket.write_all(role_frame().as_bytes()).await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let _ = socket.write_all(token_frame("slow").as_bytes()).await;
        let _ = socket
            .write_all(chunk(json!({}), Some("stop")).as_bytes())
            .await;
        let _ = socket.write_all(b"data: [DONE]\n\n").await;
    })
    .await;
    let fast = Mock::start(&[]);
    let yaml = format!(
        "server:\n  admin_token: {ADMIN}\nmodels:\n  - id: m\n    router: routewise\n    router_params: {{budget_alpha: 0, latency_hedge_mode: probability_target, latency_slo_sec: 1}}\n    route:\n      - kind: openai_compat\n        base_url: {}\n        pricing: {{prompt: 0.1, completion: 0.1}}\n      - kind: openai_compat\n        base_url: {}\n        pricing: {{prompt: 10, completion: 10}}\n",
        cheap.base_url(),
        fast.base_url()
    );
    let gw = Gateway::start(&yaml);
    let client = reqwest::Client::new();
    // The strategy learns both endpoints' latencies (pinned requests are observed too).
    for port in [cheap.port, fast.port] {
        for _ in 0..25 {
            let response = client
                .post(gw.url("/v1/chat/completions"))
                .json(&chat_body("m", false))
                .bearer_auth(ADMIN)
                .header("x-route-pin", format!("m:local-{port}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    }
    let (cheap_before, fast_before) = (cheap.requests(), fast.chat_requests().await);
    let (status, data, took) = stream(&gw, "/v1/chat/completions", chat_body("m", true)).await;
    assert_eq!(status, 200, "{data:?}");
    assert!(
        chat_text(&data).starts_with("Hello from sim"),
        "the backup won: {data:?}"
    );
    assert!(took < Duration::from_millis(2300), "{took:?}");
    assert_eq!(
        data.iter().filter(|d| d.contains("\"role\"")).count(),
        1,
        "{data:?}"
    );
    assert_eq!(cheap.requests(), cheap_before + 1, "the primary was sent");
    assert_eq!(fast.chat_requests().await, fast_before + 1, "one backup");
}
