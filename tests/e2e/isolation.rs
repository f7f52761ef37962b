//! One caller cannot take an upstream away from the others, secrets stay out of what upstreams say,
//! the health endpoints tell probes what they need and no more, session affinity is a strategy's
//! signal, errors under Anthropic paths are Anthropic's, and `/routing`'s share follows the tiers.

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, chat_body};

const ADMIN: &str = "isolation-admin-token";

async fn post(gw: &Gateway, path: &str, bearer: Option<&str>, body: &Value) -> (u16, String) {
    let mut request = reqwest::Client::new().post(gw.url(path)).json(body);
    if let Some(key) = bearer {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("gateway reachable");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

async fn get(gw: &Gateway, path: &str, bearer: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new().get(gw.url(path));
    if let Some(key) = bearer {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("gateway reachable");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn endpoint<'a>(deep: &'a Value, id: &str) -> &'a Value {
    deep["endpoints"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["endpoint_id"] == id))
        .unwrap_or(&Value::Null)
}

// --- 1. pass-through credentials --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_through_callers_rejected_key_leaves_the_endpoint_to_everyone_else() {
    let mock = Mock::start(&[]);
    // The provider rejects these callers' own keys: two are junk, one is over its rate limit.
    mock.behave(json!({ "fail_credentials": {
        "junk-key-1": 401, "junk-key-2": 403, "junk-key-3": 402, "limited-key": 429,
    }}))
    .await;
    let gw = Gateway::start(&format!(
        "server:
  admin_token: {ADMIN}
health: {{ failure_threshold: 3, cooldown_seconds: 60 }}
routes:
  - {{ name: byok, path_prefix: /byok, passthrough_auth_token: true }}
  - {{ name: open, path_prefix: /, disable_auth: true }}
models:
  - id: m
    route:
      - kind: openai_compat
        base_url: {}
        api_key: gateway-own-key
",
        mock.base_url()
    ));
    let body = chat_body("m", false);
    for round in 0..3 {
        for (key, status) in [
            ("junk-key-1", 401),
            ("junk-key-2", 403),
            ("junk-key-3", 402),
            ("limited-key", 429),
        ] {
            let (got, text) = post(&gw, "/byok/v1/chat/completions", Some(key), &body).await;
            assert_eq!(got, status, "round {round}, {key}: relayed as is: {text}");
        }
    }
    // Twelve rejections reached the upstream (nothing was cut off by an open breaker)...
    let by_credential = mock.stats().await["requests_by_credential"].clone();
    assert_eq!(by_credential["junk-key-1"], 3, "{by_credential}");
    assert_eq!(by_credential["limited-key"], 3, "{by_credential}");
    // ...and the other route, on the same endpoint with the gateway's key, is served at once.
    for _ in 0..3 {
        let (status, text) = post(&gw, "/v1/chat/completions", None, &body).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(
        mock.stats().await["requests_by_credential"]["gateway-own-key"],
        3
    );
    let deep = gw.deep(ADMIN).await;
    let report = endpoint(&deep, &format!("m:local-{}", mock.port));
    assert_eq!(report["circuit"], "closed", "{deep}");
    assert_eq!(report["failures"], 0, "{report}");
    assert_eq!(report["consecutive_credential_rejections"], 0, "{report}");
    assert_eq!(report["availability"], 1.0, "{report}");
    // The caller's own valid key still works on the pass-through route.
    let (status, text) = post(&gw, "/byok/v1/chat/completions", Some("good-key"), &body).await;
    assert_eq!(status, 200, "{text}");
}

// --- 4 and 5. secrets -------------------------------------------------------------------------

/// An upstream that answers every request 401 with everything it received: each header (the
/// credential among them) and the body.
async fn echo_upstream() -> u16 {
    let app = axum::Router::new().fallback(|headers: HeaderMap, body: String| async move {
        let headers: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or_default())))
            .collect();
        let raw: String = headers
            .iter()
            .map(|(k, v)| format!("{k}: {}\n", v.as_str().unwrap_or_default()))
            .collect();
        (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({
                "error": {"message": format!("rejected; you sent:\n{raw}"), "headers": headers},
                "request_body": body,
            })),
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_an_upstream_echoes_never_leave_the_gateway() {
    // Every secret contains SECRET; no output may.
    let echo = echo_upstream().await;
    let gw = Gateway::start(&format!(
        "server:
  admin_token: {ADMIN}
routes:
  - {{ name: byok, path_prefix: /byok, passthrough_auth_token: true }}
  - {{ name: open, path_prefix: /, disable_auth: true }}
models:
  - id: pooled
    route:
      - kind: openai_compat
        base_url: http://alice:pw-SECRET-url@127.0.0.1:{echo}/v1
        api_keys: [sk-pool-SECRET-key-0001, pool-SECRET-key-0002]
  - id: streamed
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:{echo}/v1
        api_key: sk-stream-SECRET-0007
  - id: anthropic
    route:
      - kind: anthropic
        base_url: http://127.0.0.1:{echo}
        api_key: sk-ant-SECRET-anthropic-0003
  - id: dead
    route:
      - kind: openai_compat
        base_url: http://bob:pw-SECRET-dead@127.0.0.1:1/v1
        api_key: dead-SECRET-key-0004
"
    ));
    let mut outputs = Vec::new();
    for (path, key, model, stream) in [
        ("/v1/chat/completions", None, "pooled", false),
        ("/v1/chat/completions", None, "streamed", true),
        ("/v1/messages", None, "anthropic", false),
        ("/v1/chat/completions", None, "dead", false),
        (
            "/byok/v1/chat/completions",
            Some("caller-SECRET-key-0005"),
            "pooled",
            false,
        ),
        (
            "/byok/v1/messages",
            Some("caller-SECRET-key-0006"),
            "anthropic",
            true,
        ),
    ] {
        let body = if path.ends_with("/messages") {
            json!({"model": model, "max_tokens": 16, "stream": stream,
                   "messages": [{"role": "user", "content": "hi"}]})
        } else {
            chat_body(model, stream)
        };
        let (status, text) = post(&gw, path, key, &body).await;
        assert!(status >= 400, "{path} {model}: {status} {text}");
        // The upstream's text did reach the client, masked.
        if model != "dead" {
            assert!(text.contains("rejected; you sent"), "{text}");
        }
        outputs.push(format!("{path} {model}: {text}"));
    }
    let (status, deep) = get(&gw, "/health/deep", Some(ADMIN)).await;
    assert_eq!(status, 200);
    outputs.push(format!("/health/deep: {deep}"));
    let (status, routing) = get(&gw, "/routing", Some(ADMIN)).await;
    assert_eq!(status, 200);
    let shown = routing.to_string();
    assert!(
        shown.contains(&format!("http://alice:***@127.0.0.1:{echo}/v1")),
        "{shown}"
    );
    outputs.push(format!("/routing: {shown}"));

    let db = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        gw.dir.path().join("switchyard.db").display()
    ))
    .await
    .unwrap();
    let mut rows: Vec<(Option<String>,)> = Vec::new();
    for _ in 0..100 {
        rows = sqlx::query_as("SELECT error FROM api_logs")
            .fetch_all(&db)
            .await
            .unwrap();
        if rows.len() == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rows.len(), 6, "{rows:?}");
    outputs.push(format!("api_logs: {rows:?}"));
    outputs.push(format!("log: {}", gw.log()));

    for output in &outputs {
        assert!(!output.contains("SECRET"), "a secret leaked: {output}");
    }
    // The masks still tell the keys apart.
    let all = outputs.join("\n");
    for masked in ["sk-po…01", "pool-…02", "sk-an…03", "calle…05", "sk-st…07"] {
        assert!(all.contains(masked), "{masked} missing from {all}");
    }
}

// --- 6. health endpoints ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_deep_is_for_operators_and_readiness_is_for_everyone() {
    let mock = Mock::start(&[]);
    let model = format!(
        "models:
  - id: m
    route:
      - kind: openai_compat
        base_url: {}
",
        mock.base_url()
    );
    let gw = Gateway::start(&format!(
        "server: {{ admin_token: {ADMIN} }}
health: {{ failure_threshold: 2, cooldown_seconds: 60 }}
{model}"
    ));
    let (status, body) = get(&gw, "/health/deep", None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = get(&gw, "/health/deep", Some("not-the-token")).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(gw.deep(ADMIN).await["status"], "ok");
    let (status, body) = get(&gw, "/health", None).await;
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");

    let (status, ready) = get(&gw, "/health/ready", None).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(
        ready,
        json!({"status": "ready", "models": 1, "models_ready": 1, "endpoints": 1,
               "endpoints_circuit_open": 0})
    );
    // The only upstream fails until its breaker opens: not ready, and still nothing named.
    mock.behave(json!({ "fail_status": 500 })).await;
    for _ in 0..2 {
        assert_eq!(gw.chat(chat_body("m", false)).await.0, 502);
    }
    let (status, ready) = get(&gw, "/health/ready", None).await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["status"], "not_ready");
    assert_eq!(ready["endpoints_circuit_open"], 1);
    assert!(!ready.to_string().contains("local-"), "{ready}");

    // The switch opens it for those who want it open.
    let open = Gateway::start(&format!("routing: {{ public_health_deep: true }}\n{model}"));
    let (status, body) = get(&open, "/health/deep", None).await;
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");
}

// --- 2. session affinity as a strategy signal -------------------------------------------------

async fn chat_as(gw: &Gateway, caller: &str, model: &str) -> String {
    let (status, text) = post(
        gw,
        "/v1/chat/completions",
        Some(caller),
        &chat_body(model, false),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routewise_decides_what_affinity_is_worth_and_fixed_keeps_the_pin() {
    let slow = Mock::start(&["--ttft-ms", "150"]);
    let fast = Mock::start(&[]);
    let gw = Gateway::start_with_env(
        &format!(
            "models:
  - id: rw
    router: routewise
    router_params: {{ budget_alpha: 1 }}
    route:
      - kind: openai_compat
        base_url: {slow}
        pricing: {{ prompt: 0.1, completion: 0.4 }}
      - kind: openai_compat
        base_url: {fast}
        pricing: {{ prompt: 5.0, completion: 20.0 }}
  - id: fx
    router: fixed
    route:
      - kind: openai_compat
        base_url: {slow}
      - kind: openai_compat
        base_url: {fast}
",
            slow = slow.base_url(),
            fast = fast.base_url()
        ),
        // Affinity on, as by default; every request below comes from one caller (one key).
        &[("ROUTING_AFFINITY_ENABLED", "1")],
    );
    // RouteWise explores the cheap, slow endpoint first (and the caller is pinned there), then
    // the fast one; from then on budget_alpha 1 sends everything to the fast one, pin or not.
    for _ in 0..14 {
        chat_as(&gw, "repeat-caller", "rw").await;
    }
    let (slow_n, fast_n) = (slow.chat_requests().await, fast.chat_requests().await);
    assert_eq!(slow_n + fast_n, 14);
    assert!(
        fast_n >= 12,
        "the fast endpoint got {fast_n} of 14 (slow {slow_n})"
    );

    // `fixed` honours the pin: one caller stays on its first endpoint, 50/50 weights or not.
    let before = (slow.chat_requests().await, fast.chat_requests().await);
    for _ in 0..12 {
        chat_as(&gw, "fixed-caller", "fx").await;
    }
    let slow_fx = slow.chat_requests().await - before.0;
    let fast_fx = fast.chat_requests().await - before.1;
    assert!(
        (slow_fx, fast_fx) == (12, 0) || (slow_fx, fast_fx) == (0, 12),
        "fixed kept the caller on one endpoint: slow {slow_fx}, fast {fast_fx}"
    );
}

// --- 14. Anthropic paths answer in Anthropic's shape ------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_under_an_anthropic_path_is_in_anthropics_shape() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&format!(
        "routes:
  - {{ name: off, path_prefix: /off, disabled: true, disable_auth: true }}
  - {{ name: open, path_prefix: /, disable_auth: true }}
models:
  - id: m
    route:
      - kind: openai_compat
        base_url: {}
",
        mock.base_url()
    ));
    let body =
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    for path in [
        "/off/v1/messages",
        "/off/v1/messages/count_tokens",
        "/v1/messages/nope",
        "/v2/messages",
    ] {
        let (status, text) = post(&gw, path, None, &body).await;
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(status, 404, "{path}: {text}");
        assert_eq!(error["type"], "error", "{path}: {text}");
        assert_eq!(error["error"]["type"], "not_found_error", "{path}: {text}");
        assert!(error["error"]["message"].is_string(), "{path}: {text}");
    }
    // OpenAI paths keep OpenAI's shape.
    let (status, text) = post(&gw, "/off/v1/chat/completions", None, &body).await;
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (status, &error["error"]["code"]),
        (404, &json!("route_disabled")),
        "{text}"
    );
    assert_eq!(mock.chat_requests().await, 0);
}

// --- 15. /routing's share follows priority tiers ----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_share_is_what_the_strategy_produces() {
    let high = Mock::start(&[]);
    let low = Mock::start(&[]);
    let gw = Gateway::start(&format!(
        "server: {{ admin_token: {ADMIN} }}
models:
  - id: tiers
    route:
      - kind: openai_compat
        base_url: {h}
        priority: 1
      - kind: openai_compat
        base_url: {l}
        priority: 0
  - id: rr
    router: round_robin
    route:
      - kind: openai_compat
        base_url: {h}
        priority: 1
        weight: 3
      - kind: openai_compat
        base_url: {l}
  - id: rw
    router: routewise
    route:
      - kind: openai_compat
        base_url: {h}
        pricing: {{ prompt: 1.0, completion: 2.0 }}
",
        h = high.base_url(),
        l = low.base_url()
    ));
    for _ in 0..6 {
        assert_eq!(gw.chat(chat_body("tiers", false)).await.0, 200);
    }
    assert_eq!(
        (high.chat_requests().await, low.chat_requests().await),
        (6, 0)
    );
    let (status, routing) = get(&gw, "/routing", Some(ADMIN)).await;
    assert_eq!(status, 200, "{routing}");
    let model = |id: &str| {
        routing["models"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["id"] == id))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let shares = |m: &Value| -> Vec<Value> {
        m["routes"]
            .as_array()
            .map(|r| r.iter().map(|r| r["share"].clone()).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        shares(&model("tiers")),
        vec![json!(1.0), json!(0.0)],
        "{routing}"
    );
    assert_eq!(
        shares(&model("rr")),
        vec![json!(0.5), json!(0.5)],
        "{routing}"
    );
    assert_eq!(shares(&model("rw")), vec![Value::Null], "{routing}");
    assert!(
        model("rw")["share_basis"]
            .as_str()
            .unwrap()
            .contains("strategy_status")
    );
}
