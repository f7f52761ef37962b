//! Quota sources behind the real gateway: snapshots read from a provider's usage endpoint (a
//! loopback stand-in) and from the local counter reach RouteWise; selectors that cannot resolve
//! are named by `check`, the log and `/health/deep`; the cold-start and single-process guards
//! refuse to start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, chat_body, check_with_env, serve_refuses};

/// (path, `Authorization` header) of each call to the usage stand-in.
type Calls = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A stand-in for the providers' usage APIs: Chutes' and MiniMax's paths, with fixed answers,
/// recording the `Authorization` header of each call.
struct UsageApi {
    port: u16,
    calls: Calls,
}

impl UsageApi {
    async fn start(chutes: (u16, Value), minimax: (u16, Value)) -> UsageApi {
        let calls: Calls = Arc::default();
        let answer = |path: &'static str, (status, body): (u16, Value)| {
            let calls = calls.clone();
            get(move |headers: HeaderMap| {
                let (calls, body) = (calls.clone(), body.clone());
                async move {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    calls.lock().push((path.to_owned(), auth));
                    (StatusCode::from_u16(status).unwrap(), axum::Json(body))
                }
            })
        };
        let app = axum::Router::new()
            .route(
                "/users/me/quota_usage/me",
                answer("/users/me/quota_usage/me", chutes),
            )
            .route(
                "/v1/api/openplatform/coding_plan/remains",
                answer("minimax", minimax),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        UsageApi { port, calls }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

async fn get_json(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

/// Polls `url` until `done` holds for its JSON, for at most 20 s.
async fn wait_for(url: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let value = get_json(url).await;
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {value}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const CHUTES_SELECTOR: &str =
    "quota_source: { provider: chutes, usage_label: Daily requests, unit: requests }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_from_a_usage_endpoint_and_the_local_counter_reach_routewise() {
    let usage = UsageApi::start(
        (200, json!({ "quota": 300, "used": 42.0 })),
        (404, json!({})),
    )
    .await;
    let on_demand = Mock::start(&[]);
    let chutes = Mock::start(&[]);
    let counted = Mock::start(&[]);
    let gw = Gateway::start_with_env(
        &format!(
            "server: {{ admin_token: secret }}
routing: {{ public_routing_endpoint: true, public_health_deep: true }}
models:
  - id: m
    router: routewise
    router_params: {{ quota_snapshot_refresh_interval_sec: 1 }}
    route:
      - kind: openai_compat
        base_url: {}
        pricing: {{ prompt: 1.0, completion: 2.0 }}
      - kind: openai_compat
        base_url: {}
        metadata:
          provider_type: quota
          quota: {{ limit: 1000 }}
          quota_pool: chutes-account
          {CHUTES_SELECTOR}
      - kind: openai_compat
        base_url: {}
        metadata:
          provider_type: quota
          quota: {{ limit: 50 }}
          local_quota_fallback: true
",
            on_demand.base_url(),
            chutes.base_url(),
            counted.base_url()
        ),
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("CHUTES_API_KEY", "chutes-test-key"),
            ("CHUTES_API_BASE", usage.base().as_str()),
        ],
    );
    // The fetched snapshot reaches the component: the provider's limit (300) wins over the
    // declared one.
    let routing = wait_for(&gw.url("/routing"), "the chutes snapshot", |v| {
        v["models"][0]["strategy_status"]["quota"]["chutes-account"]["snapshot"]["used"] == 42
    })
    .await;
    let pool = &routing["models"][0]["strategy_status"]["quota"]["chutes-account"];
    assert_eq!(pool["snapshot"]["limit"], 300, "{pool}");
    assert_eq!(pool["limit"], 300, "{pool}");
    assert_eq!(pool["state"], "available", "{pool}");
    let calls = usage.calls.lock().clone();
    assert!(
        calls
            .iter()
            .any(|(path, auth)| path == "/users/me/quota_usage/me"
                && auth.as_deref() == Some("Bearer chutes-test-key")),
        "{calls:?}"
    );

    // The local counter: two requests pinned to the counted route are its pool's usage.
    let endpoint = format!("m:local-{}", counted.port);
    for _ in 0..2 {
        let response = reqwest::Client::new()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth("secret")
            .header("x-route-pin", &endpoint)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(counted.chat_requests().await, 2);
    let local_pool = format!("m:{endpoint}");
    let routing = wait_for(&gw.url("/routing"), "the local snapshot", |v| {
        v["models"][0]["strategy_status"]["quota"][&local_pool]["snapshot"]["used"] == 2
    })
    .await;
    assert_eq!(
        routing["models"][0]["strategy_status"]["quota"][&local_pool]["snapshot"]["limit"],
        50
    );

    // An admin change rebuilds the table; the snapshots survive it.
    let response = reqwest::Client::new()
        .put(gw.url("/admin/routing/weights"))
        .bearer_auth("secret")
        .json(&json!({ "model": "m", "weights": { (format!("m:local-{}", on_demand.port)): 0.5 } }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let routing = get_json(&gw.url("/routing")).await;
    let status = &routing["models"][0]["strategy_status"];
    assert_eq!(
        status["quota"]["chutes-account"]["snapshot"]["used"], 42,
        "{status}"
    );

    let deep = get_json(&gw.url("/health/deep")).await;
    let quota = &deep["quota"];
    assert_eq!(quota["unresolved"], 0, "{quota}");
    assert_eq!(quota["routes"][0]["source"], "chutes", "{quota}");
    assert_eq!(quota["routes"][0]["state"], "ok", "{quota}");
    assert_eq!(
        quota["routes"][0]["key_from"], "env CHUTES_API_KEY",
        "{quota}"
    );
    assert_eq!(quota["routes"][1]["source"], "local", "{quota}");
    assert!(
        !deep.to_string().contains("chutes-test-key"),
        "the key is never shown"
    );
    // The model has on-demand traffic to calibrate from: it starts, degraded, and says so once.
    let log = gw.log();
    assert_eq!(log.matches("model starts degraded").count(), 1, "{log}");
}

/// One model whose quota routes each fail to resolve for a different reason.
fn unresolved_config(usage_base: &str) -> String {
    format!(
        "routing: {{ public_health_deep: true }}
models:
  - id: m
    router: routewise
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:9001/v1
        pricing: {{ prompt: 1.0, completion: 2.0 }}
      - kind: openai_compat
        base_url: http://127.0.0.1:9002/v1
        metadata:
          provider_type: quota
          quota: {{ limit: 100 }}
          quota_source: {{ provider: local, usage_label: Daily requests, unit: requests }}
      - kind: openai_compat
        base_url: http://127.0.0.1:9003/v1
        metadata:
          provider_type: quota
          quota: {{ limit: 100 }}
          quota_source: {{ provider: chutes, usage_label: Daily request, unit: requests }}
      - kind: openai_compat
        base_url: http://127.0.0.1:9004/v1
        metadata:
          provider_type: quota
          quota: {{ limit: 100 }}
          quota_source: {{ provider: minimax, usage_label: \"5-hour requests: MiniMax-M*\", unit: requests }}
      - kind: openai_compat
        base_url: {usage_base}/v1
        metadata:
          provider_type: quota
          quota: {{ limit: 100 }}
          {CHUTES_SELECTOR}
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolved_selectors_are_named_by_check_the_log_and_health_deep() {
    let usage = UsageApi::start((503, json!({ "detail": "maintenance" })), (404, json!({}))).await;
    let config = unresolved_config(&usage.base());
    let base = usage.base();
    let env = [
        ("CHUTES_API_KEY", "chutes-test-key"),
        ("CHUTES_API_BASE", base.as_str()),
    ];

    // `check` knows everything but the fetch, and passes with warnings.
    let out = check_with_env(&config, &env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = [
        "warning: model `m`, endpoint `m:local-9002` (quota pool `m:m:local-9002`): no quota \
         snapshot: unknown quota_source provider `local`: the registered fetchers are chutes and \
         minimax (`local` is not a fetcher: set `local_quota_fallback: true`",
        "warning: model `m`, endpoint `m:local-9003` (quota pool `m:m:local-9003`): no quota \
         snapshot: the chutes fetcher emits no record labelled `Daily request` in unit \
         `requests`; it emits `Daily requests` in unit `requests`",
        "warning: model `m`, endpoint `m:local-9004` (quota pool `m:m:local-9004`): no quota \
         snapshot: no API key for the minimax fetcher: set MINIMAX_API_KEY",
    ];
    for line in expected {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    assert_eq!(stdout.matches("warning:").count(), 3, "{stdout}");

    // Served, the failed fetch joins them; each route is logged once.
    let gw = Gateway::start_with_env(&config, &env);
    let fetched = format!("m:local-{}", usage.port);
    let deep = wait_for(&gw.url("/health/deep"), "the failed fetch", |v| {
        v["quota"]["unresolved"] == 4
    })
    .await;
    let routes = deep["quota"]["routes"].as_array().unwrap().clone();
    let kinds: Vec<(&str, &str)> = routes
        .iter()
        .map(|r| {
            (
                r["endpoint_id"].as_str().unwrap(),
                r["reason_kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("m:local-9002", "unknown_provider"),
            ("m:local-9003", "unknown_label"),
            ("m:local-9004", "no_key"),
            (fetched.as_str(), "fetch_failed"),
        ]
    );
    let failed = routes[3]["reason"].as_str().unwrap();
    assert!(
        failed.contains("the last chutes usage fetch failed: GET ")
            && failed.contains("/users/me/quota_usage/me: HTTP 503: {\"detail\":\"maintenance\"}"),
        "{failed}"
    );
    assert_eq!(routes[3]["model"], "m");
    let log = gw.log();
    for endpoint in [
        "m:local-9002",
        "m:local-9003",
        "m:local-9004",
        fetched.as_str(),
    ] {
        assert_eq!(
            log.matches(&format!("endpoint `{endpoint}`")).count(),
            1,
            "{endpoint} should be logged once:\n{log}"
        );
    }
}

const ALL_QUOTA: &str = "models:
  - id: q
    router: routewise
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:9001/v1
        metadata: { provider_type: quota, quota: { limit: 100 }, local_quota_fallback: true }
";

#[test]
fn a_model_with_only_quota_routes_refuses_to_start_uncalibrated() {
    let stderr = serve_refuses(ALL_QUOTA, &[]);
    for part in [
        "EnvelopeNotCalibratedError: model `q` (routewise) has only quota routes",
        "quota routes are priced from the model's cost envelope, which is not calibrated (0 of 20 samples)",
        "Add an on-demand route",
        "db_bootstrap_enabled",
    ] {
        assert!(stderr.contains(part), "missing {part:?} in:\n{stderr}");
    }
    let out = check_with_env(ALL_QUOTA, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("EnvelopeNotCalibratedError"));
}

const STATEFUL: &str = "models:
  - id: s
    router: routewise
    router_params: { stateful_providers_single_worker_only: SINGLE }
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:9001/v1
        pricing: { prompt: 1.0, completion: 2.0 }
      - kind: openai_compat
        base_url: http://127.0.0.1:9002/v1
        metadata: { provider_type: concurrency, concurrency: { limit: 2 } }
";

#[test]
fn stateful_routes_refuse_several_processes_unless_opted_out() {
    let stderr = serve_refuses(
        &STATEFUL.replace("SINGLE", "true"),
        &[("WEB_CONCURRENCY", "4")],
    );
    assert!(
        stderr.contains(
            "SingleWorkerGuardError: WEB_CONCURRENCY=4 says this is one of 4 gateway processes"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("model `s` (s:local-9002 concurrency)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("stateful_providers_single_worker_only: false"),
        "{stderr}"
    );
    // Opting out accepts per-process accounting (`start` panics unless the gateway listens).
    let _gw = Gateway::start_with_env(
        &STATEFUL.replace("SINGLE", "false"),
        &[("SWITCHYARD_REPLICAS", "3")],
    );
}
