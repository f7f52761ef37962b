//! Budgets, end to end: a consumer with a hard budget on a priced model is served until its spend
//! reaches the limit, then refused with a 402 in its client's dialect (with `Retry-After`) before
//! any upstream is contacted (counted at the mock), the request log says which budget refused,
//! and a restarted gateway on the same database still refuses (the spend is read back from the
//! request log). A soft budget keeps serving; two replicas of a fleet spend one budget through
//! Redis; a `never` budget keeps its spend once retention has pruned its rows. The admin API's
//! 422/404/409 rules.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, header, send};
use crate::routes::{Admin, TOKEN, eventually};

const REMAINING: &str = "x-switchyard-budget-remaining-usd";

/// Model `m` on `mock` at 1 USD per million prompt tokens; the mock reports a million per request,
/// so each request costs exactly 1 USD.
fn config(mock: &Mock) -> String {
    format!(
        "server:\n  admin_token: {TOKEN}\nmodels:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n        pricing: {{ prompt: 1.0, completion: 0.0 }}\n",
        mock.base_url()
    )
}

const ENV: &[(&str, &str)] = &[
    ("ROUTING_AFFINITY_ENABLED", "0"),
    ("SWITCHYARD_DEFAULT_AUTH", "consumer_keys"),
];

async fn priced_mock() -> Mock {
    let mock = Mock::start(&[]);
    mock.behave(json!({"input_tokens": 1_000_000})).await;
    mock
}

fn remaining(headers: &HeaderMap) -> f64 {
    header(headers, REMAINING)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {REMAINING} in {headers:?}"))
}

fn chat() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
}

fn messages() -> Value {
    json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]})
}

/// Waits until `key`'s answers carry the budget header: the budget reached the gateway's
/// snapshot (`/v1/models` is answered without an upstream).
async fn budgeted(gw: &Gateway, key: &str) {
    eventually(
        Duration::from_secs(10),
        "the budget is in force",
        || async {
            reqwest::Client::new()
                .get(gw.url("/v1/models"))
                .bearer_auth(key)
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 200 && r.headers().contains_key(REMAINING))
        },
    )
    .await;
}

/// `(status, rate_limited_by)` of every request-log row, once there are `rows` of them.
async fn rate_limited_by(db_file: &std::path::Path, rows: usize) -> Vec<(i64, Option<String>)> {
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", db_file.display()))
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

/// Consumer `alice` with a hard budget of `limit_usd` a `period`: (her id, her key, the budget as
/// created).
async fn alice_budgeted(gw: &Gateway, period: &str, limit_usd: f64) -> (String, String, Value) {
    let admin = Admin::of(gw);
    let (alice, _, key) = admin.consumer("alice", &[], &[]).await;
    let budget = admin
        .post(
            "/admin/budgets",
            json!({"scope": "consumer", "subject": alice, "period": period, "limit_usd": limit_usd}),
        )
        .await;
    (alice, key, budget)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_hard_budget_answers_402_in_each_dialect_and_survives_a_restart() {
    let mock = priced_mock().await;
    let mut gw = Gateway::start_on(None, &config(&mock), ENV);
    let admin = Admin::of(&gw);
    let (alice, key, budget) = alice_budgeted(&gw, "day", 2.5).await;
    let id = budget["id"].as_str().unwrap().to_owned();
    assert_eq!(budget["mode"], "hard", "{budget}");
    assert_eq!(budget["spent_usd"], 0.0, "{budget}");
    assert_eq!(budget["remaining_usd"], 2.5, "{budget}");
    let (start, end) = (
        budget["period_start_ms"].as_i64().unwrap(),
        budget["period_end_ms"].as_i64().unwrap(),
    );
    assert_eq!(end - start, 24 * 3600 * 1000, "{budget}");
    assert_eq!(start % (24 * 3600 * 1000), 0, "a UTC day: {budget}");
    budgeted(&gw, &key).await;

    // 1 USD each: served while under 2.5, each answer saying what is left after it.
    for left in [1.5, 0.5, -0.5] {
        let (status, h, body) = send(&gw, "/v1/chat/completions", Some(key.as_str()), chat()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(remaining(&h), left, "{h:?}");
    }
    // Spent: a 402 in OpenAI's shape, saying which budget and when it resets.
    let (status, h, body) = send(&gw, "/v1/chat/completions", Some(key.as_str()), chat()).await;
    assert_eq!(status, 402, "{body}");
    assert_eq!(body["error"]["type"], "budget_exceeded", "{body}");
    assert_eq!(body["error"]["code"], "budget_exceeded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    for part in [
        id.as_str(),
        &format!("consumer:{alice}"),
        "3.000000 USD spent of 2.500000 USD per day",
        "resets at",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    let retry_after: i64 = header(&h, "retry-after").unwrap().parse().unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (retry_after - (end - now_ms) / 1000).abs() <= 5,
        "retry-after {retry_after} is not the time to the period's end"
    );
    assert_eq!(remaining(&h), -0.5);
    // And in Anthropic's.
    let (status, h, body) = send(&gw, "/v1/messages", Some(key.as_str()), messages()).await;
    assert_eq!(status, 402, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "budget_exceeded_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("consumer:{alice}")),
        "{body}"
    );
    assert!(header(&h, "retry-after").is_some(), "{h:?}");
    assert_eq!(
        mock.chat_requests().await,
        3,
        "refusals never reach the upstream"
    );

    // The request log says which budget refused.
    let db_file = gw.dir.path().join("switchyard.db");
    let rows = rate_limited_by(&db_file, 5).await;
    let refused: Vec<_> = rows.iter().filter(|(status, _)| *status == 402).collect();
    assert_eq!(refused.len(), 2, "{rows:?}");
    let expected = format!("budget:consumer:{id}");
    assert!(
        refused
            .iter()
            .all(|(_, by)| by.as_deref() == Some(expected.as_str())),
        "{rows:?}"
    );
    let view = admin
        .call(reqwest::Method::GET, &format!("/admin/budgets/{id}"), None)
        .await;
    assert_eq!(
        (view["spent_usd"].as_f64(), view["remaining_usd"].as_f64()),
        (Some(3.0), Some(-0.5)),
        "{view}"
    );
    let metrics = gw.metrics(TOKEN).await;
    assert!(
        metrics.contains("switchyard_budget_refused_total{scope=\"consumer\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("switchyard_budget_spent_usd{{budget=\"{id}\"}} 3")),
        "{metrics}"
    );

    // Raising the limit lets the consumer in again.
    admin
        .patch(&format!("/admin/budgets/{id}"), json!({"limit_usd": 10}))
        .await;
    eventually(
        Duration::from_secs(10),
        "the new limit is in force",
        || async {
            send(&gw, "/v1/chat/completions", Some(key.as_str()), chat())
                .await
                .0
                == 200
        },
    )
    .await;
    admin
        .patch(&format!("/admin/budgets/{id}"), json!({"limit_usd": 2.5}))
        .await;

    // A restarted gateway on the same database reads the spend back from the request log.
    gw.terminate();
    assert!(
        gw.wait_exit(Duration::from_secs(30)).is_some(),
        "the gateway exits"
    );
    let url = format!("sqlite://{}", db_file.display());
    let again = Gateway::start_on(Some(&url), &config(&mock), ENV);
    let (status, h, body) = send(&again, "/v1/chat/completions", Some(key.as_str()), chat()).await;
    assert_eq!(status, 402, "{body}");
    assert_eq!(remaining(&h), -1.5, "{h:?}");
    let (status, _, body) = send(&again, "/v1/messages", Some(key.as_str()), messages()).await;
    assert_eq!(status, 402, "{body}");
    assert_eq!(
        mock.chat_requests().await,
        4,
        "nothing more reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_group_budget_keeps_serving_past_its_limit() {
    let mock = priced_mock().await;
    let gw = Gateway::start_on(None, &config(&mock), ENV);
    let admin = Admin::of(&gw);
    // `default` too: the model's upstream is in the default group.
    let (_, _, bob) = admin.consumer("bob", &["default", "gold"], &[]).await;
    let (_, _, carol) = admin.consumer("carol", &["gold", "default"], &[]).await;
    let (_, _, dave) = admin.consumer("dave", &[], &[]).await;
    let budget = admin
        .post(
            "/admin/budgets",
            json!({"scope": "group", "subject": "gold", "period": "month",
                   "mode": "soft", "limit_usd": 1.5}),
        )
        .await;
    let id = budget["id"].as_str().unwrap().to_owned();
    budgeted(&gw, &bob).await;

    // The group's consumers spend together; past the limit they are still served.
    let (status, h, _) = send(&gw, "/v1/chat/completions", Some(bob.as_str()), chat()).await;
    assert_eq!((status, remaining(&h)), (200, 0.5));
    let (status, h, _) = send(&gw, "/v1/messages", Some(carol.as_str()), messages()).await;
    assert_eq!((status, remaining(&h)), (200, -0.5));
    let (status, h, _) = send(&gw, "/v1/chat/completions", Some(bob.as_str()), chat()).await;
    assert_eq!(status, 200);
    assert!(remaining(&h) <= 0.0, "{h:?}");
    assert_eq!(mock.chat_requests().await, 3);
    // A consumer outside the group has no budget, and no header.
    let (status, h, _) = send(&gw, "/v1/chat/completions", Some(dave.as_str()), chat()).await;
    assert_eq!(status, 200);
    assert!(header(&h, REMAINING).is_none(), "{h:?}");

    let view = admin
        .call(reqwest::Method::GET, &format!("/admin/budgets/{id}"), None)
        .await;
    assert_eq!(view["spent_usd"], 3.0, "{view}");
    let metrics = gw.metrics(TOKEN).await;
    assert!(
        metrics.contains("switchyard_budget_soft_exceeded_total{scope=\"group\"} 1"),
        "warned once: {metrics}"
    );
    assert!(gw.log().contains("soft budget exceeded"), "{}", gw.log());
}

/// A non-2xx admin answer: (status, body).
async fn admin_error(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, gw.url(path))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_bad_budgets_with_422_404_and_409() {
    let mock = priced_mock().await;
    let gw = Gateway::start_on(None, &config(&mock), ENV);
    let admin = Admin::of(&gw);
    let (alice, _, _) = admin.consumer("alice", &[], &[]).await;
    use reqwest::Method;
    for (body, param) in [
        (
            json!({"scope": "consumer", "subject": alice, "period": "day", "limit_usd": 0}),
            "limit_usd",
        ),
        (
            json!({"scope": "consumer", "subject": alice, "period": "day", "limit_usd": -3}),
            "limit_usd",
        ),
        (
            json!({"scope": "consumer", "subject": "cs_nobody", "period": "day", "limit_usd": 1}),
            "subject",
        ),
        (
            json!({"scope": "consumer", "subject": alice, "period": "year", "limit_usd": 1}),
            "period",
        ),
        (
            json!({"scope": "team", "subject": alice, "period": "day", "limit_usd": 1}),
            "scope",
        ),
        (
            json!({"scope": "group", "subject": "", "period": "day", "limit_usd": 1}),
            "subject",
        ),
    ] {
        let (status, error) =
            admin_error(&gw, Method::POST, "/admin/budgets", Some(body.clone())).await;
        assert_eq!(status, 422, "{body}: {error}");
        assert_eq!(error["error"]["param"], param, "{body}: {error}");
    }
    let budget = admin
        .post(
            "/admin/budgets",
            json!({"scope": "consumer", "subject": alice, "period": "week", "limit_usd": 1}),
        )
        .await;
    let id = budget["id"].as_str().unwrap();
    let (status, error) = admin_error(
        &gw,
        Method::POST,
        "/admin/budgets",
        Some(json!({"scope": "consumer", "subject": alice, "period": "day", "limit_usd": 9})),
    )
    .await;
    assert_eq!(status, 409, "{error}");
    assert_eq!(error["error"]["param"], "subject", "{error}");
    let (status, error) = admin_error(
        &gw,
        Method::PATCH,
        &format!("/admin/budgets/{id}"),
        Some(json!({"subject": "someone-else"})),
    )
    .await;
    assert_eq!(status, 422, "what a budget is for cannot change: {error}");
    let (status, _) = admin_error(
        &gw,
        Method::PATCH,
        &format!("/admin/budgets/{id}"),
        Some(json!({"limit_usd": "lots"})),
    )
    .await;
    assert_eq!(status, 422);
    for method in [Method::GET, Method::DELETE] {
        let (status, _) = admin_error(&gw, method, "/admin/budgets/bg_nope", None).await;
        assert_eq!(status, 404);
    }
    let (status, _) = admin_error(
        &gw,
        Method::PATCH,
        "/admin/budgets/bg_nope",
        Some(json!({"limit_usd": 2})),
    )
    .await;
    assert_eq!(status, 404);
    let list = admin.call(Method::GET, "/admin/budgets", None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["period"], "week", "{list}");
    admin
        .call(Method::DELETE, &format!("/admin/budgets/{id}"), None)
        .await;
    let (status, _) = admin_error(&gw, Method::DELETE, &format!("/admin/budgets/{id}"), None).await;
    assert_eq!(status, 404);
    // The document describes the resource.
    let doc = admin.call(Method::GET, "/admin/openapi.json", None).await;
    assert!(
        doc["paths"]["/admin/budgets/{id}"]["patch"].is_object(),
        "{}",
        doc["paths"]
    );
}

/// Two replicas on one PostgreSQL schema and one Redis: one budget, whichever replica serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_a_fleet_spend_one_budget() {
    let mock = priced_mock().await;
    let schema = crate::harness::PgSchema::create().await;
    let prefix = format!("sy-e2e-budgets-{:016x}", rand::random::<u64>());
    let body = format!(
        "fleet:\n  redis_url: redis://127.0.0.1:6379\n  key_prefix: {prefix}\n{}",
        config(&mock)
    );
    // One at a time: the first one migrates the schema.
    let a = Gateway::start_on(Some(&schema.url), &body, ENV);
    let b = Gateway::start_on(Some(&schema.url), &body, ENV);
    let admin = Admin::of(&a);
    let (alice, _, key) = admin.consumer("alice", &[], &[]).await;
    let budget = admin
        .post(
            "/admin/budgets",
            json!({"scope": "consumer", "subject": alice, "period": "week", "limit_usd": 2.5}),
        )
        .await;
    let id = budget["id"].as_str().unwrap().to_owned();
    budgeted(&a, &key).await;
    budgeted(&b, &key).await;

    for (replica, left) in [(&a, 1.5), (&b, 0.5), (&a, -0.5)] {
        let (status, h, body) =
            send(replica, "/v1/chat/completions", Some(key.as_str()), chat()).await;
        assert_eq!(status, 200, "{body}");
        // The replica that served knows at once; the spend before it came from the other one
        // (read back within a second, which the requests here leave time for or not).
        assert!(remaining(&h) >= left, "{h:?}");
    }
    // Within a refresh, both replicas count all three requests (read without spending: a chat
    // sent to a replica that has not seen the other's spend yet would be served) and refuse.
    for replica in [&a, &b] {
        eventually(
            Duration::from_secs(5),
            "the replica sees the fleet's spend",
            || async {
                reqwest::Client::new()
                    .get(replica.url("/v1/models"))
                    .bearer_auth(&key)
                    .send()
                    .await
                    .is_ok_and(|r| r.headers().get(REMAINING).is_some_and(|v| v == "-0.500000"))
            },
        )
        .await;
        let (status, h, body) =
            send(replica, "/v1/chat/completions", Some(key.as_str()), chat()).await;
        assert_eq!(status, 402, "{body}");
        assert_eq!(remaining(&h), -0.5);
    }
    assert_eq!(
        mock.chat_requests().await,
        3,
        "three served between the two replicas"
    );
    let view = Admin::of(&b)
        .call(reqwest::Method::GET, &format!("/admin/budgets/{id}"), None)
        .await;
    assert_eq!(view["spent_usd"], 3.0, "{view}");
}

/// Request-log retention, on the real binary: rows past `REQUEST_LOG_RETENTION_DAYS` are deleted
/// (`/health/deep` and the metrics count them) and their spend is rolled up per day, so a `never`
/// budget read back by a restarted gateway, with none of its rows left, still counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_budget_keeps_its_spend_once_its_rows_are_pruned() {
    const DAY_MS: i64 = 86_400_000;
    let mock = priced_mock().await;
    let mut gw = Gateway::start_on(None, &config(&mock), ENV);
    let (_, key, budget) = alice_budgeted(&gw, "never", 3.5).await;
    let id = budget["id"].as_str().unwrap().to_owned();
    budgeted(&gw, &key).await;
    for left in [2.5, 1.5] {
        let (status, h, body) = send(&gw, "/v1/chat/completions", Some(key.as_str()), chat()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(remaining(&h), left, "{h:?}");
    }
    let db_file = gw.dir.path().join("switchyard.db");
    assert_eq!(rate_limited_by(&db_file, 2).await.len(), 2);
    gw.terminate();
    assert!(gw.wait_exit(Duration::from_secs(30)).is_some());

    // The two requests (and a row of no consumer) become 40 days old.
    let url = format!("sqlite://{}", db_file.display());
    let db = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query("UPDATE api_logs SET created_at_ms = created_at_ms - $1")
        .bind(40 * DAY_MS)
        .execute(&db)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO api_logs (created_at_ms, model, status, latency_ms) \
         SELECT MIN(created_at_ms), 'm', 200, 1.0 FROM api_logs",
    )
    .execute(&db)
    .await
    .unwrap();

    // A gateway keeping 30 days prunes them.
    let keeping_30_days = [ENV, &[("REQUEST_LOG_RETENTION_DAYS", "30")]].concat();
    let mut pruning = Gateway::start_on(Some(&url), &config(&mock), &keeping_30_days);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let deep = loop {
        let deep = pruning.deep(TOKEN).await;
        if deep["database"]["request_log"]["retention"]["pruned_rows"] == 3 {
            break deep;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old rows are not pruned within 30 s: {deep}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let retention = &deep["database"]["request_log"]["retention"];
    assert_eq!(retention["keep_days"], 30, "{deep}");
    assert_eq!(retention["consecutive_failures"], 0, "{deep}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let cutoff = retention["cutoff_ms"].as_i64().unwrap();
    assert!(
        (now_ms - 30 * DAY_MS - cutoff).abs() < 60_000,
        "30 days back: {deep}"
    );
    assert_eq!(deep["database"]["status"], "ok", "{deep}");
    let metrics = pruning.metrics(TOKEN).await;
    assert!(
        metrics.contains("switchyard_request_log_rows_total{outcome=\"pruned\"} 3"),
        "{metrics}"
    );
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM api_logs")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(left, 0);
    let days: Vec<(String, f64, i64)> =
        sqlx::query_as("SELECT consumer, cost_usd, requests FROM api_log_spend_days")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(
        days,
        [("alice".to_owned(), 2.0, 2)],
        "the row of no consumer is not kept"
    );
    pruning.terminate();
    assert!(pruning.wait_exit(Duration::from_secs(30)).is_some());

    // Started again, the gateway reads the spend back from the roll-up alone.
    let again = Gateway::start_on(Some(&url), &config(&mock), &keeping_30_days);
    let view = Admin::of(&again)
        .call(reqwest::Method::GET, &format!("/admin/budgets/{id}"), None)
        .await;
    assert_eq!(view["spent_usd"], 2.0, "{view}");
    let (status, h, body) = send(&again, "/v1/chat/completions", Some(key.as_str()), chat()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(remaining(&h), 0.5, "{h:?}");
    let (status, _, body) = send(&again, "/v1/chat/completions", Some(key.as_str()), chat()).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = send(&again, "/v1/chat/completions", Some(key.as_str()), chat()).await;
    assert_eq!(status, 402, "{body}");
}
