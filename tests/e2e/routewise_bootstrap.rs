//! The RouteWise DB bootstrap against real gateway processes, on SQLite and on PostgreSQL: a
//! router created with `db_bootstrap_enabled` — at startup, or re-created by a settings change —
//! replays the model's recent `api_logs` rows and starts with samples.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::databases::{Db, on_both_databases};
use crate::harness::{Gateway, Mock, chat_body};
use crate::routewise_settings::{TOKEN, model_setting, ok, status};

on_both_databases!(
    a_gateway_started_after_traffic_starts_warm,
    a_router_re_created_by_a_settings_change_replays_the_log,
);

fn config(fast: &Mock, slow: &Mock, params: &str) -> String {
    format!(
        "server:
  admin_token: {TOKEN}
models:
  - id: m
    router: routewise
    router_params: {params}
    route:
      - {{ kind: openai_compat, base_url: {} }}
      - {{ kind: openai_compat, base_url: {} }}
",
        fast.base_url(),
        slow.base_url()
    )
}

fn start(db: &Db, yaml: &str) -> Gateway {
    Gateway::start_on(Some(&db.url()), yaml, &[("ROUTING_AFFINITY_ENABLED", "0")])
}

/// Sends `n` requests to `m`, then waits until the request log holds `total` rows of it.
async fn traffic(db: &Db, gw: &Gateway, n: usize, total: i64) {
    for _ in 0..n {
        let (code, body) = gw.chat(chat_body("m", false)).await;
        assert_eq!(code, 200, "{body}");
    }
    let start = Instant::now();
    loop {
        let rows = db
            .scalar("SELECT COUNT(*) FROM api_logs WHERE model = 'm'")
            .await;
        if rows >= total {
            assert_eq!(rows, total);
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{rows} rows");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn samples(status: &Value) -> Vec<u64> {
    status["latency"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p["samples"].as_u64().unwrap())
        .collect()
}

async fn deep(gw: &Gateway) -> Value {
    gw.deep(TOKEN).await
}

async fn a_gateway_started_after_traffic_starts_warm(db: Db) {
    let (fast, slow) = (Mock::start(&[]), Mock::start(&["--ttft-ms", "150"]));
    {
        let cold = start(&db, &config(&fast, &slow, "{}"));
        traffic(&db, &cold, 12, 12).await;
        let s = status(&cold, "m").await;
        assert_eq!(s["counters"]["observations"], 12, "{s}");
        assert!(
            deep(&cold).await["routewise"]["bootstrap"]
                .as_object()
                .unwrap()
                .is_empty(),
            "off by default"
        );
    }

    // Before its first request, the new process already knows both endpoints.
    let warm = start(&db, &config(&fast, &slow, "{ db_bootstrap_enabled: true }"));
    let s = status(&warm, "m").await;
    assert_eq!(s["counters"]["decisions"], 0, "{s}");
    assert_eq!(s["counters"]["observations"], 12, "{s}");
    assert_eq!(s["counters"]["foreign_observations"], 12);
    let per_endpoint = samples(&s);
    assert_eq!(per_endpoint.iter().sum::<u64>(), 12, "{s}");
    assert!(per_endpoint.iter().all(|&n| n >= 1), "both explored: {s}");
    assert_eq!(s["output"]["model_samples"], 12, "{s}");
    let slow_id = format!("m:local-{}", slow.port);
    let fast_id = format!("m:local-{}", fast.port);
    let latency = &s["latency"];
    assert!(
        latency[&slow_id]["mean_ttft_ms"].as_f64().unwrap()
            > latency[&fast_id]["mean_ttft_ms"].as_f64().unwrap(),
        "{latency}"
    );
    let report = &deep(&warm).await["routewise"]["bootstrap"]["m"];
    assert_eq!(
        (&report["rows"], &report["replayed"], &report["skipped"]),
        (&json!(12), &json!(12), &json!(0)),
        "{report}"
    );
    assert_eq!(report["settings"]["window_sec"], 3600);
    assert!(report["error"].is_null(), "{report}");
    // No probe, no exploration: the first decision goes by the learned latencies.
    let (code, body) = warm.chat(chat_body("m", false)).await;
    assert_eq!(code, 200, "{body}");
    let s = status(&warm, "m").await;
    assert_eq!(s["last_decision"]["explored"], Value::Null, "{s}");
    // The envelope is evaluated when a decision needs it: it held the 12 replayed costs.
    assert_eq!(s["envelope"]["samples"], 12, "{s}");
    drop(warm);

    // The cap keeps the newest rows.
    let capped = start(
        &db,
        &config(
            &fast,
            &slow,
            "{ db_bootstrap_enabled: true, db_bootstrap_max_rows: 5 }",
        ),
    );
    assert_eq!(status(&capped, "m").await["counters"]["observations"], 5);
    drop(capped);

    // A window that ends before the rows were written reads nothing.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let empty = start(
        &db,
        &config(
            &fast,
            &slow,
            "{ db_bootstrap_enabled: true, latency_history_prior_window_sec: 1 }",
        ),
    );
    assert_eq!(status(&empty, "m").await["counters"]["observations"], 0);
    assert_eq!(deep(&empty).await["routewise"]["bootstrap"]["m"]["rows"], 0);
}

async fn a_router_re_created_by_a_settings_change_replays_the_log(db: Db) {
    let (fast, slow) = (Mock::start(&[]), Mock::start(&["--ttft-ms", "50"]));
    let gw = start(&db, &config(&fast, &slow, "{}"));
    traffic(&db, &gw, 6, 6).await;
    let before = status(&gw, "m").await;
    assert_eq!(before["counters"]["decisions"], 6);

    // Enabling the bootstrap changes the params: a new router, warmed from the log at once.
    ok(
        &gw,
        reqwest::Method::PATCH,
        &model_setting("db_bootstrap_enabled", "m"),
        Some(json!({"value": true})),
    )
    .await;
    let s = status(&gw, "m").await;
    assert_eq!(s["host_side"]["db_bootstrap_enabled"], true, "{s}");
    assert_eq!(s["counters"]["decisions"], 0, "a new router: {s}");
    assert_eq!(s["counters"]["observations"], 6, "{s}");
    assert_eq!(samples(&s).iter().sum::<u64>(), 6, "{s}");
    assert_eq!(
        deep(&gw).await["routewise"]["bootstrap"]["m"]["replayed"],
        6
    );
}
