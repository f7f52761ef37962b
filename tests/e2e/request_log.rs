//! The request log through `GET /admin/logs`: real traffic from two consumers through a real
//! gateway process to mock upstreams that report prompt-cache usage, with priced routes, a
//! fallback, a stream, an Anthropic upstream and a request that fails; then every filter and the
//! paging cursor against what the log holds, and the 422s. On SQLite and on PostgreSQL.

use std::time::Duration;

use serde_json::{Value, json};

use crate::databases::{Db, on_both_databases};
use crate::harness::{Gateway, Mock};
use crate::routes::{Admin, TOKEN, known};

on_both_databases!(every_attempt_is_logged_priced_and_found_by_every_filter);

/// What mock B and C report: 1,200 input tokens, 1,000 of them read from the prompt cache (C
/// also writes 100 to it), and the mock's 16 completion tokens.
const INPUT: u32 = 1200;
const CACHED: u32 = 1000;
const WRITTEN: u32 = 100;
const COMPLETION: u32 = 16;

pub(crate) async fn logs(gw: &Gateway, query: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .get(gw.url(&format!("/admin/logs{query}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("gateway reachable");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The ids of a page's rows.
fn ids(page: &Value) -> Vec<i64> {
    page["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no rows in {page}"))
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

/// The ids of `all` (newest first) that `keep` keeps.
fn expected(all: &[Value], keep: impl Fn(&Value) -> bool) -> Vec<i64> {
    all.iter()
        .filter(|r| keep(r))
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

async fn chat(gw: &Gateway, key: &str, body: Value) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("gateway reachable");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

async fn every_attempt_is_logged_priced_and_found_by_every_filter(db: Db) {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let c = Mock::start(&["--protocol", "anthropic"]);
    a.behave(json!({"fail_status": 500})).await;
    b.behave(json!({"input_tokens": INPUT, "cached_input_tokens": CACHED}))
        .await;
    c.behave(json!({"input_tokens": INPUT, "cached_input_tokens": CACHED,
                    "cache_creation_input_tokens": WRITTEN}))
        .await;
    let yaml = format!(
        "server:\n  admin_token: {TOKEN}\nmodels:
  - id: priced
    router: fixed
    route:
      - kind: openai_compat
        base_url: {a}
        priority: 1
        pricing: {{ prompt: 2.0, completion: 8.0 }}
      - kind: openai_compat
        base_url: {b}
        pricing: {{ prompt: 3.0, completion: 15.0, input_cache_reads: 0.3 }}
  - id: free
    route:
      - kind: openai_compat
        base_url: {b}
  - id: broken
    route:
      - kind: openai_compat
        base_url: {a}
        pricing: {{ prompt: 2.0, completion: 8.0 }}
  - id: claude
    route:
      - kind: anthropic
        base_url: http://127.0.0.1:{c}
        pricing: {{ prompt: 3.0, completion: 15.0, input_cache_reads: 0.3, input_cache_writes: 3.75 }}
",
        a = a.base_url(),
        b = b.base_url(),
        c = c.port,
    );
    let gw = Gateway::start_on(
        Some(&db.url()),
        &yaml,
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("SWITCHYARD_DEFAULT_AUTH", "consumer_keys"),
        ],
    );
    let admin = Admin::of(&gw);
    let (_, _, alice) = admin.consumer("alice", &[], &[]).await;
    let (_, _, bob) = admin.consumer("bob", &[], &[]).await;
    known(&gw, &[alice.as_str(), bob.as_str()]).await;
    let (ea, eb, ec) = (
        format!("priced:local-{}", a.port),
        format!("priced:local-{}", b.port),
        format!("claude:local-{}", c.port),
    );

    // Traffic, a few milliseconds apart so that the rows' times differ.
    let ask = |model: &str, stream: bool| json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "Say hello."}]});
    let mut statuses = Vec::new();
    for (key, model, stream) in [
        (&alice, "priced", false),
        (&alice, "priced", true),
        (&bob, "free", false),
        (&bob, "broken", false),
        (&alice, "claude", false),
    ] {
        let (status, text) = chat(&gw, key, ask(model, stream)).await;
        statuses.push(status);
        if model != "broken" {
            assert_eq!(status, 200, "{model}: {text}");
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    assert!(statuses[3] >= 500, "broken answered {}", statuses[3]);

    // Written in batches: eventually there (bounded wait).
    let mut all = Vec::new();
    for _ in 0..200 {
        let (status, page) = logs(&gw, "?limit=500").await;
        assert_eq!(status, 200, "{page}");
        all = page["rows"].as_array().unwrap().clone();
        if all.len() >= 5 {
            assert!(page["next_before"].is_null(), "{page}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(all.len(), 5, "{all:?}");
    // Newest first.
    let order: Vec<(i64, i64)> = all
        .iter()
        .map(|r| {
            (
                r["created_at_ms"].as_i64().unwrap(),
                r["id"].as_i64().unwrap(),
            )
        })
        .collect();
    let mut sorted = order.clone();
    sorted.sort_by(|x, y| y.cmp(x));
    assert_eq!(order, sorted);
    // The newest row of `model`, or its oldest (the non-streamed `priced` request came first).
    let row = |model: &str, newest: bool| -> Value {
        let mut matching: Vec<&Value> = all.iter().filter(|r| r["model"] == model).collect();
        if !newest {
            matching.reverse();
        }
        (*matching.first().unwrap_or_else(|| panic!("no {model} row"))).clone()
    };

    // The fallback: A failed (500, nothing consumed), B answered; priced from B's usage.
    let served_cost =
        (f64::from(INPUT - CACHED) * 3.0 + f64::from(CACHED) * 0.3 + f64::from(COMPLETION) * 15.0)
            / 1e6;
    for stream in [false, true] {
        let r = row("priced", stream);
        assert_eq!(
            r["attempt_log"].as_array().map(Vec::len),
            Some(2),
            "stream {stream}: {r}"
        );
        let attempts = r["attempt_log"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "{r}");
        let (first, second) = (&attempts[0], &attempts[1]);
        assert_eq!(first["endpoint_id"], ea.as_str(), "{r}");
        assert_eq!(first["provider"], "openai_compat");
        assert_eq!(first["status"], 500);
        assert_eq!(first["error_type"], "http_status");
        assert_eq!(first["hedge"], false);
        assert_eq!(first["prompt_tokens"], 0);
        assert_eq!(first["cost_usd"], 0.0);
        assert!(first["latency_ms"].as_f64().unwrap() >= 0.0);
        assert_eq!(second["endpoint_id"], eb.as_str());
        assert_eq!(second["status"], 200);
        assert!(second["error_type"].is_null(), "{r}");
        assert_eq!(second["prompt_tokens"], INPUT);
        assert_eq!(second["completion_tokens"], COMPLETION);
        assert_eq!(second["cached_tokens"], CACHED);
        assert!(
            close(second["cost_usd"].as_f64().unwrap(), served_cost),
            "{r}"
        );
        assert!(close(r["cost_usd"].as_f64().unwrap(), served_cost), "{r}");
        assert_eq!(r["endpoint_id"], eb.as_str());
        assert_eq!(r["status"], 200);
        assert_eq!(r["attempts"], 2);
        assert_eq!(r["fell_back"], true);
        assert_eq!(r["prompt_tokens"], INPUT);
        assert_eq!(r["cached_tokens"], CACHED);
        assert_eq!(r["consumer"], "alice");
        assert_eq!(r["decision"]["strategy"], "fixed");
        assert_eq!(r["decision"]["order"], json!([ea, eb]));
        assert!(r["decision"]["seed"].is_u64(), "{r}");
        assert!(r["request_id"].is_string());
    }
    // No pricing: no cost. A failure on a priced route that consumed nothing: 0.
    let free = row("free", true);
    assert!(free["cost_usd"].is_null(), "{free}");
    assert!(free["attempt_log"][0]["cost_usd"].is_null());
    assert_eq!(
        free["decision"]["order"],
        json!([format!("free:local-{}", b.port)])
    );
    let broken = row("broken", true);
    assert_eq!(broken["cost_usd"], 0.0, "{broken}");
    assert!(broken["endpoint_id"].is_null());
    assert_eq!(broken["attempt_log"][0]["status"], 500);
    // Anthropic counts cache reads and writes apart from its input_tokens; each is charged once.
    let claude = row("claude", true);
    let claude_cost = (f64::from(INPUT - CACHED - WRITTEN) * 3.0
        + f64::from(CACHED) * 0.3
        + f64::from(WRITTEN) * 3.75
        + f64::from(COMPLETION) * 15.0)
        / 1e6;
    assert!(
        close(claude["cost_usd"].as_f64().unwrap(), claude_cost),
        "{claude}"
    );
    assert_eq!(claude["prompt_tokens"], INPUT);
    assert_eq!(claude["cached_tokens"], CACHED);
    assert_eq!(claude["attempt_log"][0]["endpoint_id"], ec.as_str());
    assert_eq!(claude["attempt_log"][0]["cache_write_tokens"], WRITTEN);
    assert_eq!(claude["attempt_log"][0]["provider"], "anthropic");

    // The cost counter agrees: B served `priced` twice.
    let metrics = gw.metrics(TOKEN).await;
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("switchyard_cost_usd_total{"))
        .filter(|l| l.contains("model=\"priced\"") && l.contains(&format!("endpoint=\"{eb}\"")))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum();
    assert!(close(counted, 2.0 * served_cost), "{counted}\n{metrics}");

    // Every filter returns exactly the rows it should, newest first.
    let s = |r: &Value, k: &str| r[k].as_str().map(str::to_owned);
    let mid = all[2]["created_at_ms"].as_i64().unwrap();
    let newest = all[0]["created_at_ms"].as_i64().unwrap();
    let route = s(&all[0], "route").expect("a route name");
    let request_id = s(&all[3], "request_id").unwrap();
    let cases: Vec<(String, Vec<i64>)> = vec![
        (
            "model=priced".into(),
            expected(&all, |r| r["model"] == "priced"),
        ),
        (
            format!("endpoint={eb}"),
            expected(&all, |r| r["endpoint_id"] == eb.as_str()),
        ),
        (
            "consumer=alice".into(),
            expected(&all, |r| r["consumer"] == "alice"),
        ),
        (
            "consumer=bob".into(),
            expected(&all, |r| r["consumer"] == "bob"),
        ),
        (format!("route={route}"), expected(&all, |_| true)),
        (
            format!("request_id={request_id}"),
            expected(&all, |r| s(r, "request_id").as_deref() == Some(&request_id)),
        ),
        ("status=200".into(), expected(&all, |r| r["status"] == 200)),
        ("status=2xx".into(), expected(&all, |r| r["status"] == 200)),
        (
            "status=5xx".into(),
            expected(&all, |r| r["model"] == "broken"),
        ),
        (
            format!("status={}", statuses[3]),
            expected(&all, |r| r["model"] == "broken"),
        ),
        ("status=4xx".into(), Vec::new()),
        (
            format!("since={mid}"),
            expected(&all, |r| r["created_at_ms"].as_i64().unwrap() >= mid),
        ),
        (
            format!("until={mid}"),
            expected(&all, |r| r["created_at_ms"].as_i64().unwrap() < mid),
        ),
        (
            format!("model=priced&since={mid}&until={}", newest + 1),
            expected(&all, |r| {
                let t = r["created_at_ms"].as_i64().unwrap();
                r["model"] == "priced" && t >= mid && t <= newest
            }),
        ),
        (
            "consumer=alice&status=200&model=claude".into(),
            expected(&all, |r| r["model"] == "claude"),
        ),
        ("model=nope".into(), Vec::new()),
    ];
    for (query, want) in cases {
        let (status, page) = logs(&gw, &format!("?{query}")).await;
        assert_eq!(status, 200, "{query}: {page}");
        assert_eq!(ids(&page), want, "{query}");
        assert!(page["next_before"].is_null(), "{query}: {page}");
    }

    // Paging: `before` walks the whole log, a page at a time, without gaps or repeats.
    for limit in [1, 2] {
        let mut walked = Vec::new();
        let mut query = format!("?limit={limit}");
        for _ in 0..10 {
            let (status, page) = logs(&gw, &query).await;
            assert_eq!(status, 200, "{page}");
            let page_ids = ids(&page);
            assert!(page_ids.len() <= limit, "{page}");
            walked.extend(page_ids);
            match page["next_before"].as_i64() {
                Some(before) => query = format!("?limit={limit}&before={before}"),
                None => break,
            }
        }
        assert_eq!(walked, expected(&all, |_| true), "limit {limit}");
    }
    // A cursor under a filter: the older `priced` row follows the newer.
    let newer = row("priced", true)["id"].as_i64().unwrap();
    let (_, page) = logs(&gw, &format!("?model=priced&limit=1&before={newer}")).await;
    assert_eq!(
        ids(&page),
        vec![row("priced", false)["id"].as_i64().unwrap()]
    );

    // Bad filters: 422 in the admin API's error shape, naming the parameter.
    for (query, param) in [
        ("status=abc", "status"),
        ("limit=0", "limit"),
        ("limit=100000", "limit"),
        ("colour=red", "colour"),
        ("since=yesterday", "since"),
        ("before=-3", "before"),
    ] {
        let (status, body) = logs(&gw, &format!("?{query}")).await;
        assert_eq!(status, 422, "{query}: {body}");
        assert_eq!(body["error"]["param"], param, "{query}: {body}");
        assert_eq!(body["error"]["code"], "validation_failed");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    // An admin endpoint: a consumer's key is not enough.
    let response = reqwest::Client::new()
        .get(gw.url("/admin/logs"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
}
