//! The client side of the edge: connection deadlines and cap under a low file limit, request-body
//! deadline, the shutdown drain and its deadline, requests abandoned before the upstream answered.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{Gateway, Mock, chat_body};

fn model(mock: &Mock, server: &str) -> String {
    format!(
        "server:\n{server}models:\n  - id: m\n    router: fixed\n    route:\n      - kind: openai_compat\n        base_url: {}\n        provider_model_id: sim\n",
        mock.base_url()
    )
}

/// Reads until the server closes the connection (or resets it); `None` if it is still open after
/// `within`. Returns what was read.
async fn read_until_closed(tcp: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(seen),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// The issue's fd-exhaustion scenario, scaled to a 256-file limit: more idle and header-dribbling
/// connections than the limit. Clients already connected keep being served; connections over the
/// cap are answered 503 and closed; idle and dribbling ones are closed after the header timeout;
/// then new clients are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_dribbling_connections_are_capped_and_closed_while_clients_keep_being_served() {
    let mock = Mock::start(&[]);
    let gw =
        Gateway::start_with_file_limit(&model(&mock, "  header_read_timeout_seconds: 3\n"), 256);
    let log = gw.log();
    assert!(
        log.contains("file_limit=256") && log.contains("max_connections=64"),
        "the limits are logged: {log}"
    );

    // A client with a keep-alive connection, busy the whole time.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let url = gw.url("/v1/chat/completions");
    assert_eq!(
        client
            .post(&url)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = tokio::spawn({
        let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
        async move {
            let mut latencies = Vec::new();
            let mut failures = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                match client.post(&url).json(&chat_body("m", false)).send().await {
                    Ok(r) if r.status() == 200 => match r.bytes().await {
                        Ok(_) => latencies.push(started.elapsed()),
                        Err(e) => failures.push(e.to_string()),
                    },
                    Ok(r) => failures.push(format!("status {}", r.status())),
                    Err(e) => failures.push(e.to_string()),
                }
            }
            (latencies, failures)
        }
    });

    // 300 idle connections and 50 that dribble a request head, one byte every half second.
    let addr = format!("127.0.0.1:{}", gw.port);
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(&addr).await.unwrap());
    }
    let dribblers: Vec<_> = (0..50)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let mut tcp = TcpStream::connect(&addr).await.unwrap();
                for byte in b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: "
                    .iter()
                    .cycle()
                {
                    if tcp.write_all(&[*byte]).await.is_err() {
                        break;
                    }
                    if started.elapsed() > Duration::from_secs(60) {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Some(started.elapsed())
            })
        })
        .collect();

    // Every idle connection ends: answered 503 at once (over the cap) or closed at the timeout.
    let mut refused = 0;
    for tcp in &mut idle {
        let seen = read_until_closed(tcp, Duration::from_secs(30))
            .await
            .expect("an idle connection stayed open 30 s with a 3 s header timeout");
        if seen.starts_with(b"HTTP/1.1 503") {
            refused += 1;
        } else {
            assert!(seen.is_empty(), "{}", String::from_utf8_lossy(&seen));
        }
    }
    assert!(
        (100..=300).contains(&refused),
        "a cap of 64 refuses most of 300 idle connections: {refused}"
    );
    for d in dribblers {
        let held = d
            .await
            .unwrap()
            .expect("a dribbling connection stayed open 60 s");
        assert!(held < Duration::from_secs(30), "{held:?}");
    }

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut latencies, failures) = busy.await.unwrap();
    assert!(
        failures.is_empty(),
        "the connected client failed: {failures:?}"
    );
    assert!(latencies.len() >= 10, "{}", latencies.len());
    latencies.sort();
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    println!(
        "served {} requests during the flood, p50 {:?}, p99 {p99:?}",
        latencies.len(),
        latencies[latencies.len() / 2]
    );

    // Slots are free again: a new client is served.
    let fresh = reqwest::Client::new();
    assert_eq!(
        fresh
            .post(&url)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(mock.chat_requests().await as usize, latencies.len() + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_its_deadline_is_answered_408_in_the_client_dialect() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&model(&mock, "  request_body_timeout_seconds: 1\n"));
    let mut tcp = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let started = Instant::now();
    tcp.write_all(
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    let seen = read_until_closed(&mut tcp, Duration::from_secs(15))
        .await
        .expect("the slow body was still being waited for after 15 s");
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    // Anthropic's error shape, as the endpoint's dialect asks.
    assert!(text.contains(r#""type":"error""#), "{text}");
    assert!(text.contains("did not arrive within 1 s"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(mock.chat_requests().await, 0);
}

/// A chunked body whose framing breaks is the client's mistake, told as such (400 in its dialect,
/// naming what broke), not taken for a body over the size limit; nothing goes upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_whose_chunks_do_not_parse_is_answered_400_in_the_client_dialect() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&model(&mock, ""));
    let mut tcp = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    tcp.write_all(
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n9\r\n{\"model\":\r\nzz\r\n",
    )
    .await
    .unwrap();
    let seen = read_until_closed(&mut tcp, Duration::from_secs(15))
        .await
        .expect("the connection ends after the answer to a broken body");
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains(r#""type":"error""#), "{text}");
    assert!(
        text.contains("the request body could not be read: a chunk-size line does not parse"),
        "{text}"
    );
    assert_eq!(mock.chat_requests().await, 0);
}

/// `/health` once it answers 503 after SIGTERM (the signal takes a moment to arrive); the last
/// answer if it never does within 10 s.
async fn health_after_sigterm(gw: &Gateway) -> (u16, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = reqwest::get(gw.url("/health")).await.unwrap();
        let status = r.status().as_u16();
        let body = r.json().await.unwrap();
        if status == 503 || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a streamed response to its end; returns the text and whether it ended cleanly.
async fn read_stream(response: reqwest::Response) -> String {
    let mut text = String::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(c) => text.push_str(&String::from_utf8_lossy(&c)),
            Err(e) => {
                text.push_str(&format!("\n<body error: {e}>"));
                break;
            }
        }
    }
    text
}

/// HTTP/1 connections are served by the gateway's own connection code, HTTP/2 ones (prior
/// knowledge) by hyper's: both reach the same handler, for a whole answer, a stream, and a request
/// body sent in chunks of unknown length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_http2_clients_are_served_alike() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&model(&mock, ""));
    let http1 = reqwest::Client::builder().http1_only().build().unwrap();
    let http2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = gw.url("/v1/chat/completions");
    for (client, version) in [
        (&http1, reqwest::Version::HTTP_11),
        (&http2, reqwest::Version::HTTP_2),
    ] {
        let whole = client
            .post(&url)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        assert_eq!((whole.version(), whole.status().as_u16()), (version, 200));
        let answer: serde_json::Value = whole.json().await.unwrap();
        assert!(
            answer["choices"][0]["message"]["content"].is_string(),
            "{answer}"
        );

        let streamed = client
            .post(&url)
            .json(&chat_body("m", true))
            .send()
            .await
            .unwrap();
        assert_eq!(streamed.status(), 200);
        let text = read_stream(streamed).await;
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");

        let body = serde_json::to_vec(&chat_body("m", false)).unwrap();
        let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
            body.chunks(7).map(|piece| Ok(piece.to_vec())).collect();
        let chunked = client
            .post(&url)
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)))
            .send()
            .await
            .unwrap();
        let status = chunked.status();
        let text = chunked.text().await.unwrap();
        assert_eq!(status, 200, "{version:?}: {text}");
    }
    assert_eq!(mock.chat_requests().await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_streams_that_finish_within_the_grace_complete() {
    // 20 tokens at 10/s: about 2 s per stream, well within the default 30 s grace.
    let mock = Mock::start(&["--tokens-per-s", "10", "--completion-tokens", "20"]);
    let mut gw = Gateway::start(&model(&mock, ""));
    let client = reqwest::Client::new();
    let mut streams = Vec::new();
    for _ in 0..10 {
        let response = client
            .post(gw.url("/v1/chat/completions"))
            .json(&chat_body("m", true))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        streams.push(tokio::spawn(read_stream(response)));
    }
    gw.terminate();
    let (status, body) = health_after_sigterm(&gw).await;
    assert_eq!((status, body["status"].as_str()), (503, Some("draining")));
    for s in streams {
        let text = s.await.unwrap();
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        assert!(!text.contains("shutting down"), "{text}");
    }
    let exit = gw
        .wait_exit(Duration::from_secs(20))
        .expect("exits once its streams are done");
    assert!(exit.success(), "{exit:?}");
    assert_eq!(mock.stats().await["streams_completed"], 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_stream_still_running_at_the_grace_deadline_and_exits_0() {
    // 400 tokens at 4/s: 100 s, far past a 2 s grace.
    let mock = Mock::start(&["--tokens-per-s", "4", "--completion-tokens", "400"]);
    let mut gw = Gateway::start(&model(&mock, "  shutdown_grace_seconds: 2\n"));
    let client = reqwest::Client::new();
    let chat = client
        .post(gw.url("/v1/chat/completions"))
        .json(&chat_body("m", true))
        .send()
        .await
        .unwrap();
    let messages = client
        .post(gw.url("/v1/messages"))
        .json(&json!({
            "model": "m", "stream": true, "max_tokens": 1000,
            "messages": [{ "role": "user", "content": "Say hello." }],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (chat.status().as_u16(), messages.status().as_u16()),
        (200, 200)
    );
    let chat = tokio::spawn(read_stream(chat));
    let messages = tokio::spawn(read_stream(messages));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let terminated = Instant::now();
    gw.terminate();
    let (status, body) = health_after_sigterm(&gw).await;
    assert_eq!((status, body["status"].as_str()), (503, Some("draining")));

    let chat = chat.await.unwrap();
    let messages = messages.await.unwrap();
    let ended = terminated.elapsed();
    assert!(
        ended >= Duration::from_millis(1500) && ended < Duration::from_secs(20),
        "the streams ran on for the grace, then ended: {ended:?}"
    );
    // Each ends with an error event in its own dialect.
    assert!(chat.contains("data: {\"error\""), "{chat}");
    assert!(chat.contains("shutting down"), "{chat}");
    assert!(messages.contains("event: error"), "{messages}");
    assert!(messages.contains("shutting down"), "{messages}");
    let exit = gw
        .wait_exit(Duration::from_secs(20))
        .expect("exits after the grace");
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_abandoned_before_the_upstream_answers_is_logged_499_with_its_wait() {
    let mock = Mock::start(&["--ttft-ms", "20000"]);
    let gw = Gateway::start(&model(&mock, ""));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap();
    let err = client
        .post(gw.url("/v1/chat/completions"))
        .json(&chat_body("m", false))
        .send()
        .await
        .expect_err("the upstream answers after 20 s");
    assert!(err.is_timeout(), "{err}");
    drop(client);

    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        gw.dir.path().join("switchyard.db").display()
    ))
    .await
    .unwrap();
    let mut rows: Vec<(String, i64, f64, Option<String>)> = Vec::new();
    for _ in 0..200 {
        rows = sqlx::query_as("SELECT model, status, latency_ms, error FROM api_logs")
            .fetch_all(&db)
            .await
            .unwrap();
        if !rows.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (model, status, waited_ms, error) = &rows[0];
    assert_eq!((model.as_str(), *status), ("m", 499));
    assert!(
        (500.0..15_000.0).contains(waited_ms),
        "it waited about 0.8 s: {waited_ms}"
    );
    assert!(
        error
            .as_deref()
            .unwrap_or_default()
            .contains("client closed"),
        "{error:?}"
    );
    let log = gw.log();
    let line = log
        .lines()
        .find(|l| l.contains("status=499"))
        .unwrap_or_else(|| panic!("no access line with status 499:\n{log}"));
    assert!(
        line.contains("latency_ms=") && line.contains("model=m"),
        "{line}"
    );
    assert_eq!(mock.chat_requests().await, 1);
}

#[tokio::test]
async fn rows_queued_just_before_sigterm_are_written_before_exit() {
    // The request log writes every 250 ms; a SIGTERM right after the last answer used to exit
    // before that interval's rows were written.
    let mock = Mock::start(&[]);
    let mut gw = Gateway::start(&model(&mock, ""));
    let client = reqwest::Client::new();
    const REQUESTS: usize = 30;
    for _ in 0..REQUESTS {
        let response = client
            .post(gw.url("/v1/chat/completions"))
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    gw.terminate();
    let exit = gw
        .wait_exit(Duration::from_secs(30))
        .expect("exits after SIGTERM");
    assert!(exit.success(), "{exit:?}");
    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        gw.dir.path().join("switchyard.db").display()
    ))
    .await
    .unwrap();
    let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM api_logs WHERE status = 200")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(rows, REQUESTS as i64, "every answered request has its row");
}
