//! The RouteWise prober against a real gateway and real mock upstreams: with short intervals and
//! no client traffic, every idle endpoint of a model that enables it gets a streamed one-token
//! `ping`, and the outcome reaches the router as an observation; models that do not enable it, or
//! whose endpoints are not idle long enough, are left alone.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Gateway, Mock};
use crate::routewise_settings::{TOKEN, ok, status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_endpoints_are_probed_and_learned_from() {
    let fast = Mock::start(&[]);
    let slow = Mock::start(&["--ttft-ms", "120"]);
    let failing = Mock::start(&["--fail-rate", "1.0"]);
    let untouched = Mock::start(&[]);
    let gw = Gateway::start(&format!(
        "server:
  admin_token: {TOKEN}
models:
  - id: probed
    router: routewise
    router_params:
      routewise_probe_enabled: true
      routewise_probe_interval_sec: 1
      routewise_probe_idle_threshold_sec: 1
    route:
      - {{ kind: openai_compat, base_url: {}, provider_model_id: fast-model }}
      - {{ kind: openai_compat, base_url: {} }}
      - {{ kind: openai_compat, base_url: {} }}
  - id: busy-threshold
    router: routewise
    router_params:
      routewise_probe_enabled: true
      routewise_probe_interval_sec: 1
      routewise_probe_idle_threshold_sec: 3600
    route:
      - {{ kind: openai_compat, base_url: {u} }}
  - id: off
    router: routewise
    route:
      - {{ kind: openai_compat, base_url: {u} }}
",
        fast.base_url(),
        slow.base_url(),
        failing.base_url(),
        u = untouched.base_url(),
    ));

    // One probe per interval, the longest-idle endpoint first: all three within a few seconds.
    let start = Instant::now();
    loop {
        let counts = (
            fast.chat_requests().await,
            slow.chat_requests().await,
            failing.chat_requests().await,
        );
        if counts.0 >= 1 && counts.1 >= 1 && counts.2 >= 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "not every endpoint was probed: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Not before the first interval, and not all at once.
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );

    // What the upstream received: a streamed one-token ping in its own protocol.
    let body = fast.stats().await["last_body"].clone();
    assert_eq!(body["model"], "fast-model", "{body}");
    assert_eq!(body["stream"], true, "{body}");
    assert_eq!(body["max_tokens"], 1, "{body}");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "ping"}])
    );

    // The outcomes reached the router: samples everywhere, the failure penalised, no decision.
    let s = status(&gw, "probed").await;
    assert_eq!(s["counters"]["decisions"], 0, "{s}");
    let latency = &s["latency"];
    let id = |m: &Mock| format!("probed:local-{}", m.port);
    for m in [&fast, &slow, &failing] {
        assert!(
            latency[id(m)]["samples"].as_u64().unwrap() >= 1,
            "{}: {latency}",
            id(m)
        );
    }
    assert_eq!(latency[id(&failing)]["mean_ttft_ms"], 60000.0, "{latency}");
    let (fast_ms, slow_ms) = (
        latency[id(&fast)]["mean_ttft_ms"].as_f64().unwrap(),
        latency[id(&slow)]["mean_ttft_ms"].as_f64().unwrap(),
    );
    assert!(
        slow_ms >= 120.0 && fast_ms < slow_ms,
        "{fast_ms} vs {slow_ms}"
    );

    let deep: Value = gw.deep(TOKEN).await;
    let probes = &deep["routewise"]["probes"]["probed"];
    assert!(probes["probes"].as_u64().unwrap() >= 3, "{probes}");
    assert!(probes["failures"].as_u64().unwrap() >= 1, "{probes}");
    assert!(probes["last"]["endpoint_id"].is_string(), "{probes}");
    assert!(
        deep["routewise"]["probes"]["off"].is_null(),
        "{}",
        deep["routewise"]
    );

    // Neither the disabled model nor the one whose threshold is an hour was probed.
    assert_eq!(untouched.chat_requests().await, 0);

    // Turned off at run time, probing stops.
    ok(
        &gw,
        reqwest::Method::PATCH,
        "/admin/routewise/model-settings/routewise_probe_enabled?model_id=probed",
        Some(json!({"value": false})),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let total = |counts: [u64; 3]| counts.iter().sum::<u64>();
    let before = total([
        fast.chat_requests().await,
        slow.chat_requests().await,
        failing.chat_requests().await,
    ]);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = total([
        fast.chat_requests().await,
        slow.chat_requests().await,
        failing.chat_requests().await,
    ]);
    assert_eq!(before, after);
}
