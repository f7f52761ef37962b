//! Latency hedging: RouteWise decides (`latency_hedge_mode: probability_target`), the host sends
//! the backup when the primary has not answered by the planned checkpoint; the first answer wins.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{Gateway, Mock, chat_body};

const ADMIN: &str = "hedge-admin";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_primary_triggers_exactly_one_backup_and_the_first_answer_wins() {
    let (cheap, fast) = (Mock::start(&[]), Mock::start(&[]));
    let yaml = format!(
        "server:\n  admin_token: {ADMIN}\nmodels:\n  - id: m\n    router: routewise\n    router_params: {{budget_alpha: 0, latency_hedge_mode: probability_target, latency_slo_sec: 1}}\n    route:\n      - kind: openai_compat\n        base_url: {}\n        pricing: {{prompt: 0.1, completion: 0.1}}\n      - kind: openai_compat\n        base_url: {}\n        pricing: {{prompt: 10, completion: 10}}\n",
        cheap.base_url(),
        fast.base_url()
    );
    let gateway = Gateway::start(&yaml);
    let client = reqwest::Client::new();
    let send = |pin: Option<String>| {
        let mut request = client
            .post(gateway.url("/v1/chat/completions"))
            .json(&chat_body("m", false));
        if let Some(pin) = pin {
            request = request.bearer_auth(ADMIN).header("x-route-pin", pin);
        }
        async move {
            let response = request.send().await.expect("gateway reachable");
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            (status, body)
        }
    };
    // The strategy learns both endpoints' latencies (pinned requests are observed too).
    for port in [cheap.port, fast.port] {
        for _ in 0..25 {
            let (status, body) = send(Some(format!("m:local-{port}"))).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    // Both fast: the cheap primary answers before any checkpoint, no backup is sent.
    let fast_before = fast.chat_requests().await;
    for _ in 0..5 {
        assert_eq!(send(None).await.0, 200);
    }
    assert_eq!(fast.chat_requests().await, fast_before, "no hedge needed");

    // The cheap primary turns slow (2.5 s to first token, SLO 1 s): at the last checkpoint from
    // which the fast route still meets the SLO (90 %), the backup goes out and wins.
    cheap.behave(json!({"ttft_ms": 2500})).await;
    let (cheap_before, fast_before) = (cheap.chat_requests().await, fast.chat_requests().await);
    let started = Instant::now();
    let (status, body) = send(None).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    let routing: serde_json::Value = client
        .get(gateway.url("/routing"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let strategy = &routing["models"][0]["strategy_status"];
    assert!(
        took < Duration::from_millis(2000),
        "the backup's answer should win, took {took:?}; strategy status: {strategy}"
    );
    assert!(
        strategy["counters"]["hedges_planned"].as_u64() >= Some(1),
        "{strategy}"
    );
    assert!(
        took >= Duration::from_millis(850),
        "hedged too early: {took:?}"
    );
    assert_eq!(
        cheap.chat_requests().await,
        cheap_before + 1,
        "the primary was sent"
    );
    assert_eq!(
        fast.chat_requests().await,
        fast_before + 1,
        "exactly one backup"
    );
    let log = gateway.log();
    assert_eq!(
        log.matches("hedging: the primary has not answered").count(),
        1,
        "{log}"
    );

    // The request log has both sides of the race: the primary that lost (cancelled, nothing
    // known consumed) and the backup that answered, which alone is charged.
    let mut row = serde_json::Value::Null;
    for _ in 0..100 {
        let page: serde_json::Value = client
            .get(gateway.url("/admin/logs?limit=1"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        row = page["rows"][0].clone();
        if row["attempt_log"].as_array().is_some_and(|a| a.len() == 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempts = row["attempt_log"].as_array().expect("an attempt log");
    assert_eq!(attempts.len(), 2, "{row}");
    let (lost, won) = (&attempts[0], &attempts[1]);
    assert_eq!(
        lost["endpoint_id"],
        format!("m:local-{}", cheap.port),
        "{row}"
    );
    assert_eq!(lost["error_type"], "cancelled", "{row}");
    assert_eq!(lost["hedge"], false);
    assert_eq!(lost["cost_usd"], 0.0);
    assert_eq!(
        won["endpoint_id"],
        format!("m:local-{}", fast.port),
        "{row}"
    );
    assert_eq!(won["hedge"], true);
    assert_eq!(won["status"], 200);
    assert!(won["error_type"].is_null(), "{row}");
    let cost = won["cost_usd"].as_f64().unwrap();
    assert!(cost > 0.0, "{row}");
    assert_eq!(row["cost_usd"].as_f64(), Some(cost), "{row}");
    assert_eq!(row["decision"]["strategy"], "routewise", "{row}");
}
