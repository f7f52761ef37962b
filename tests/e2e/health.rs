//! Endpoint health, breakers, the selection pipeline and runtime routing changes, end to end.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use crate::harness::{Gateway, Mock, chat_body};

const ADMIN: &str = "test-admin-token";

fn routes(mocks: &[(&Mock, &str)]) -> String {
    mocks
        .iter()
        .map(|(m, extra)| {
            format!(
                "      - kind: openai_compat\n        base_url: {}\n{extra}",
                m.base_url()
            )
        })
        .collect()
}

fn config(head: &str, router: &str, routes: &str) -> String {
    format!(
        "server:\n  admin_token: {ADMIN}\n{head}models:\n  - id: m\n    aliases: [m-alias]\n    {router}\n    route:\n{routes}"
    )
}

fn start(body: &str) -> Gateway {
    Gateway::start(body)
}

async fn send(gw: &Gateway, n: usize, concurrency: usize, body: serde_json::Value) -> Vec<u16> {
    futures::stream::iter(0..n)
        .map(|_| {
            let body = body.clone();
            async move { gw.chat(body).await.0 }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

const RR_NO_SKIP: &str = "router: round_robin\n    router_params: { skip_open_circuits: false }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_opens_after_exactly_n_failures_probes_once_and_recovers() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "fail_status": 500 })).await;
    let gw = start(&config(
        "health:\n  failure_threshold: 3\n  cooldown_seconds: 1\n",
        RR_NO_SKIP,
        &routes(&[(&a, ""), (&b, "")]),
    ));
    // Round robin makes A primary on every other request until its breaker opens.
    let statuses = send(&gw, 10, 1, chat_body("m", false)).await;
    assert!(
        statuses.iter().all(|s| *s == 200),
        "zero client-visible errors: {statuses:?}"
    );
    assert_eq!(
        a.chat_requests().await,
        3,
        "the breaker opened after exactly 3 failures"
    );

    let deep: serde_json::Value = gw.deep(ADMIN).await;
    let a_id = format!("m:local-{}", a.port);
    let a_report = deep["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["endpoint_id"] == a_id.as_str())
        .unwrap()
        .clone();
    assert_eq!(a_report["circuit"], "open", "{deep}");
    assert!(a_report["seconds_to_half_open"].as_f64().unwrap() > 0.0);
    assert!(
        a_report["last_error"]
            .as_str()
            .unwrap()
            .contains("HTTP 500")
    );
    assert_eq!(deep["status"], "degraded");

    // After the cooldown exactly one probe goes out; it fails and the breaker reopens.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let statuses = send(&gw, 6, 1, chat_body("m", false)).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(a.chat_requests().await, 4, "one half-open probe");

    // A recovers: the next probe closes the breaker and A takes its turns again.
    a.behave(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let statuses = send(&gw, 8, 1, chat_body("m", false)).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let after = a.chat_requests().await;
    assert!(
        after >= 4 + 3,
        "A serves again after the successful probe: {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_half_open_probe_while_it_is_in_flight() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "fail_status": 500 })).await;
    let gw = start(&config(
        "health:\n  failure_threshold: 2\n  cooldown_seconds: 1\n",
        RR_NO_SKIP,
        &routes(&[(&a, ""), (&b, "")]),
    ));
    send(&gw, 4, 1, chat_body("m", false)).await;
    assert_eq!(a.chat_requests().await, 2);
    // A recovers but answers slowly, so the probe is still in flight while others arrive.
    a.behave(json!({ "ttft_ms": 600 })).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let statuses = send(&gw, 8, 8, chat_body("m", false)).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(a.chat_requests().await, 3, "exactly one probe reached A");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_storm_costs_clients_nothing_and_the_dead_upstream_only_probes() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let c = Mock::start(&[]);
    c.behave(json!({ "fail_status": 500 })).await;
    let gw = start(&config(
        "health:\n  failure_threshold: 3\n  cooldown_seconds: 1\n",
        "router: fixed",
        &routes(&[(&a, ""), (&b, ""), (&c, "")]),
    ));
    // Warm-up until C's breaker is open (three failures), one request at a time.
    let mut warmup = 0;
    while c.chat_requests().await < 3 {
        assert_eq!(gw.chat(chat_body("m", false)).await.0, 200);
        warmup += 1;
        assert!(warmup < 500, "C was never chosen");
    }
    let before = c.chat_requests().await;
    let started = Instant::now();
    let statuses = send(&gw, 3000, 32, chat_body("m", false)).await;
    let elapsed = started.elapsed();
    let errors = statuses.iter().filter(|s| **s != 200).count();
    assert_eq!(errors, 0, "client-visible errors under the storm");
    let probes = c.chat_requests().await - before;
    // At most one probe per cooldown period (plus one for the period in progress).
    let bound = elapsed.as_secs_f64().ceil() as u64 + 1;
    assert!(
        probes <= bound,
        "{probes} requests reached C in {elapsed:?}; bound {bound}"
    );
    let served = a.chat_requests().await + b.chat_requests().await;
    assert!(served >= 3000, "A and B served the storm: {served}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modality_filter_keeps_only_routes_that_accept_the_input() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = start(&config(
        "",
        "router: fixed",
        &routes(&[(&a, "        input_modalities: [text, image]\n"), (&b, "")]),
    ));
    let image = json!({
        "model": "m",
        "messages": [{ "role": "user", "content": [
            { "type": "text", "text": "what is this?" },
            { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } }
        ]}]
    });
    let statuses = send(&gw, 12, 4, image).await;
    assert!(statuses.iter().all(|s| *s == 200));
    assert_eq!(a.chat_requests().await, 12);
    assert_eq!(b.chat_requests().await, 0);

    let audio = json!({
        "model": "m",
        "messages": [{ "role": "user", "content": [
            { "type": "input_audio", "input_audio": { "data": "AAAA", "format": "wav" } }
        ]}]
    });
    let (status, body) = gw.chat(audio).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "unsupported_modality");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("audio"),
        "{body}"
    );
}

async fn chat_as(gw: &Gateway, token: Option<&str>, pin: &str) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("x-route-pin", pin)
        .json(&chat_body("m", false));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_pin_is_for_admins_and_never_falls_back() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = start(&config(
        "",
        "router: fixed",
        &routes(&[
            (&a, "        weight: 1\n"),
            (&b, "        weight: 0.000000001\n"),
        ]),
    ));
    let b_id = format!("m:local-{}", b.port);
    for _ in 0..5 {
        assert_eq!(chat_as(&gw, Some(ADMIN), &b_id).await.0, 200);
    }
    assert_eq!(b.chat_requests().await, 5, "the pin selected B");
    // A non-admin's pin is ignored.
    for _ in 0..5 {
        assert_eq!(chat_as(&gw, Some("not-admin"), &b_id).await.0, 200);
    }
    assert_eq!(b.chat_requests().await, 5);
    assert_eq!(a.chat_requests().await, 5);
    // A pinned request whose route fails is not rescued by another route.
    b.behave(json!({ "fail_status": 500 })).await;
    let (status, body) = chat_as(&gw, Some(ADMIN), &b_id).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(a.chat_requests().await, 5, "no fallback to A");
    // An unknown pin lists the endpoints.
    let (status, body) = chat_as(&gw, Some(ADMIN), "nowhere").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "pin_not_found");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(&b_id),
        "{body}"
    );
}

async fn admin(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new().request(method, gw.url(path));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.json().await.unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_overrides_and_disable_apply_without_restart() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = start(&config("", "router: fixed", &routes(&[(&a, ""), (&b, "")])));
    let a_id = format!("m:local-{}", a.port);
    let b_id = format!("m:local-{}", b.port);

    let (status, _) = admin(
        &gw,
        reqwest::Method::PUT,
        "/admin/routing/weights",
        None,
        Some(json!({"model": "m", "weights": {}})),
    )
    .await;
    assert_eq!(status, 401, "admin endpoints need the token");
    let (status, body) = admin(
        &gw,
        reqwest::Method::PUT,
        "/admin/routing/weights",
        Some(ADMIN),
        Some(json!({"model": "m", "weights": {"nope": 1}})),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("weights.nope:"),
        "{body}"
    );

    // Overrides set through an alias apply to the canonical model; 0 means never chosen.
    let (status, body) = admin(
        &gw,
        reqwest::Method::PUT,
        "/admin/routing/weights",
        Some(ADMIN),
        Some(json!({"model": "m-alias", "weights": {a_id.clone(): 0}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["weights"]["m"][&a_id], 0.0);
    send(&gw, 20, 4, chat_body("m", false)).await;
    assert_eq!(a.chat_requests().await, 0);
    assert_eq!(b.chat_requests().await, 20);
    // ... and not pinnable.
    let (status, body) = chat_as(&gw, Some(ADMIN), &a_id).await;
    assert_eq!(status, 503, "{body}");

    // Disable B, clear the override: everything goes to A.
    admin(
        &gw,
        reqwest::Method::PUT,
        "/admin/routing/weights",
        Some(ADMIN),
        Some(json!({"model": "m", "weights": {}})),
    )
    .await;
    let (status, _) = admin(
        &gw,
        reqwest::Method::POST,
        &format!("/admin/routing/providers/{b_id}/disable"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    send(&gw, 20, 4, chat_body("m", false)).await;
    assert_eq!(a.chat_requests().await, 20);
    assert_eq!(b.chat_requests().await, 20);

    let (_, routing) = admin(&gw, reqwest::Method::GET, "/routing", Some(ADMIN), None).await;
    let routes = routing["models"][0]["routes"].as_array().unwrap();
    assert_eq!(
        routes[1]["weight_note"], "disabled by an operator",
        "{routing}"
    );
    assert_eq!(routes[0]["share"], 1.0, "{routing}");
    let (status, _) = admin(&gw, reqwest::Method::GET, "/routing", None, None).await;
    assert_eq!(
        status, 401,
        "/routing shows upstream hosts: admin only by default"
    );

    let (status, _) = admin(
        &gw,
        reqwest::Method::POST,
        &format!("/admin/routing/providers/{b_id}/enable"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    send(&gw, 40, 4, chat_body("m", false)).await;
    assert!(b.chat_requests().await > 20, "B is back in rotation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_weight_updates_are_422s_naming_the_field() {
    let a = Mock::start(&[]);
    let gw = start(&config("", "router: fixed", &routes(&[(&a, "")])));
    let a_id = format!("m:local-{}", a.port);
    let put = |body: serde_json::Value| {
        admin(
            &gw,
            reqwest::Method::PUT,
            "/admin/routing/weights",
            Some(ADMIN),
            Some(body),
        )
    };
    for (body, param, message) in [
        (
            json!({"model": "m", "weights": {a_id.clone(): -1}}),
            format!("weights.{a_id}"),
            format!("weights.{a_id}: invalid value: integer `-1`, expected a number >= 0"),
        ),
        (
            json!({"model": "m", "weights": {a_id.clone(): "heavy"}}),
            format!("weights.{a_id}"),
            format!(r#"weights.{a_id}: invalid type: string "heavy", expected a number >= 0"#),
        ),
        (
            json!({"model": "m", "weights": {"nope": 1}}),
            "weights.nope".to_owned(),
            format!("weights.nope: not an endpoint of model `m`; its endpoints: {a_id}"),
        ),
        (
            json!({"model": "unknown", "weights": {}}),
            "model".to_owned(),
            "model: unknown model `unknown`".to_owned(),
        ),
        (
            json!({"weights": {}}),
            "model".to_owned(),
            "model: missing field `model`".to_owned(),
        ),
        (
            json!({"model": "m", "weights": {}, "weight": {}}),
            "weight".to_owned(),
            "weight: unknown field `weight`, expected `model` or `weights`".to_owned(),
        ),
    ] {
        let (status, answer) = put(body.clone()).await;
        assert_eq!(status, 422, "{body} -> {answer}");
        assert_eq!(
            answer,
            json!({"error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": "validation_failed",
            }}),
            "{body}"
        );
    }
    // Nothing was applied.
    let (status, overrides) = admin(
        &gw,
        reqwest::Method::GET,
        "/admin/routing/weights",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(overrides["weights"], json!({}), "{overrides}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_without_a_token_say_how_to_set_one() {
    let a = Mock::start(&[]);
    let gw = Gateway::start(&format!(
        "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
        a.base_url()
    ));
    let (status, body) = admin(
        &gw,
        reqwest::Method::GET,
        "/admin/routing/weights",
        Some("anything"),
        None,
    )
    .await;
    assert_eq!(status, 403);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("SWITCHYARD_ADMIN_TOKEN"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fraction_splits_local_and_remote_traffic() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let c = Mock::start(&[]);
    // A and B are local replicas, C stands in for a remote provider.
    let gw = start(&config(
        "routing:\n  local_fraction: 0.8\n",
        "router: fixed",
        &routes(&[
            (&a, "        weight: 9\n"),
            (&b, ""),
            (&c, "        local_deployment: false\n        weight: 50\n"),
        ]),
    ));
    let n = 1500;
    let statuses = send(&gw, n, 16, chat_body("m", false)).await;
    assert!(statuses.iter().all(|s| *s == 200));
    let (ca, cb, cc) = (
        a.chat_requests().await as f64,
        b.chat_requests().await as f64,
        c.chat_requests().await as f64,
    );
    let n = n as f64;
    assert!((cc / n - 0.2).abs() < 0.04, "remote share {:.3}", cc / n);
    assert!((ca / n - 0.4).abs() < 0.05, "local A share {:.3}", ca / n);
    assert!((cb / n - 0.4).abs() < 0.05, "local B share {:.3}", cb / n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_health_check_drains_a_local_deployment() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    let gw = start(&config(
        "routing:\n  health_check: { interval_seconds: 0.1 }\n",
        "router: fixed",
        &routes(&[(&a, ""), (&b, "")]),
    ));
    a.behave(json!({ "unhealthy": true })).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = a.chat_requests().await;
    send(&gw, 30, 4, chat_body("m", false)).await;
    assert_eq!(
        a.chat_requests().await,
        before,
        "A is drained while its check fails"
    );
    a.behave(json!({})).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    send(&gw, 30, 4, chat_body("m", false)).await;
    assert!(
        a.chat_requests().await > before,
        "A is back once its check passes"
    );
}

async fn endpoint_report(gw: &Gateway, id: &str) -> serde_json::Value {
    let deep: serde_json::Value = gw.deep(ADMIN).await;
    deep["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["endpoint_id"] == id)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

async fn drain_stream(gw: &Gateway) {
    let response = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat_body("m", true))
        .send()
        .await
        .unwrap();
    let _ = response.bytes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_a_success_at_its_first_token_not_its_role_delta() {
    let a = Mock::start(&["--tokens-per-s", "50"]);
    let gw = start(&config("", "router: fixed", &routes(&[(&a, "")])));
    let id = format!("m:local-{}", a.port);
    // Only the role delta, then the connection drops: a failure.
    a.behave(json!({ "break_stream_after_events": 1 })).await;
    drain_stream(&gw).await;
    let report = endpoint_report(&gw, &id).await;
    assert_eq!(report["failures"], 1, "{report}");
    assert_eq!(report["successes"], 0, "{report}");
    // A content delta before the drop: a success as far as health goes.
    a.behave(json!({ "break_stream_after_events": 3 })).await;
    drain_stream(&gw).await;
    let report = endpoint_report(&gw, &id).await;
    assert_eq!(report["successes"], 1, "{report}");
    assert_eq!(report["failures"], 1, "{report}");
}
