//! RouteWise settings through the management API of real gateway processes, on SQLite and on
//! PostgreSQL: per-model overrides and the global fallback layer change the routers' params
//! without a restart (in a second process too), aliases and `/` in model ids, the 404 and 422
//! answers, and a stored combination the strategy refuses that must not take the model down.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::databases::{Db, on_both_databases};
use crate::harness::{Gateway, Mock, chat_body};

pub const TOKEN: &str = "routewise-admin-token";

on_both_databases!(
    overrides_and_the_global_layer_reach_every_process_without_restart,
    bad_models_keys_and_values_are_refused,
    a_stored_combination_the_strategy_refuses_keeps_the_previous_router,
);

fn config(a: &Mock, b: &Mock) -> String {
    format!(
        "server:
  admin_token: {TOKEN}
models:
  - id: org/chat
    aliases: [chat]
    router: routewise
    router_params: {{ latency_slo_sec: 2 }}
    route:
      - {{ kind: openai_compat, base_url: {a}, pricing: {{ prompt: 0.1, completion: 0.4 }} }}
      - {{ kind: openai_compat, base_url: {b}, pricing: {{ prompt: 5.0, completion: 20.0 }} }}
  - id: other
    router: routewise
    router_params: {{ budget_alpha: 0.3 }}
    route:
      - {{ kind: openai_compat, base_url: {a} }}
  - id: plain
    router: fixed
    route:
      - {{ kind: openai_compat, base_url: {b} }}
",
        a = a.base_url(),
        b = b.base_url()
    )
}

fn start(db: &Db, yaml: &str) -> Gateway {
    Gateway::start_on(Some(&db.url()), yaml, &[("ROUTING_AFFINITY_ENABLED", "0")])
}

/// `(status, body)` of an admin call.
pub async fn call(
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
    let response = request.send().await.expect("gateway reachable");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

pub async fn ok(gw: &Gateway, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let (status, value) = call(gw, method.clone(), path, body).await;
    assert_eq!(status, 200, "{method} {path}: {value}");
    value
}

/// The strategy status of `model` in `/routing`.
pub async fn status(gw: &Gateway, model: &str) -> Value {
    let routing = ok(gw, reqwest::Method::GET, "/routing", None).await;
    routing["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == model)
        .unwrap_or_else(|| panic!("{model} not in {routing}"))["strategy_status"]
        .clone()
}

/// Polls until `model`'s status has `key` = `value`; panics after 5 s.
async fn eventually_status(gw: &Gateway, model: &str, key: &str, value: Value) -> Duration {
    let start = Instant::now();
    loop {
        let s = status(gw, model).await;
        if s[key] == value {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{model}: {key} is {} not {value}: {s}",
            s[key]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const SETTINGS: &str = "/admin/routewise/settings";

fn model_settings(model: &str) -> String {
    format!(
        "/admin/routewise/model-settings?model_id={}",
        urlencode(model)
    )
}

pub fn model_setting(key: &str, model: &str) -> String {
    format!(
        "/admin/routewise/model-settings/{key}?model_id={}",
        urlencode(model)
    )
}

fn urlencode(s: &str) -> String {
    s.replace('/', "%2F")
}

fn param(view: &Value, key: &str) -> (Value, Value) {
    (
        view["params"][key]["value"].clone(),
        view["params"][key]["source"].clone(),
    )
}

async fn overrides_and_the_global_layer_reach_every_process_without_restart(db: Db) {
    use reqwest::Method;
    let (a, b) = (Mock::start(&[]), Mock::start(&["--ttft-ms", "20"]));
    let yaml = config(&a, &b);
    let first = start(&db, &yaml);
    let second = start(&db, &yaml);

    let view = ok(&first, Method::GET, &model_settings("org/chat"), None).await;
    assert_eq!(view["model_id"], "org/chat");
    assert_eq!(
        param(&view, "budget_alpha"),
        (json!(0.75), json!("default"))
    );
    assert_eq!(param(&view, "latency_slo_sec"), (json!(2), json!("config")));
    assert_eq!(view["overrides"], json!({}));
    assert_eq!(view["serving"]["applied"], true, "{view}");
    assert_eq!(status(&first, "org/chat").await["budget_alpha"], 0.75);

    // An override through the alias lands on the canonical model; `/routing` shows it as soon as
    // the PATCH answers, and the other process within 2 s.
    let view = ok(
        &first,
        Method::PATCH,
        &model_setting("budget_alpha", "chat"),
        Some(json!({"value": 0.2})),
    )
    .await;
    assert_eq!(view["model_id"], "org/chat");
    assert_eq!(param(&view, "budget_alpha"), (json!(0.2), json!("model")));
    assert_eq!(view["overrides"], json!({"budget_alpha": 0.2}));
    assert_eq!(
        view["router_params"],
        json!({"latency_slo_sec": 2, "budget_alpha": 0.2})
    );
    assert_eq!(view["serving"]["applied"], true, "{view}");
    assert_eq!(status(&first, "org/chat").await["budget_alpha"], 0.2);
    let took = eventually_status(&second, "org/chat", "budget_alpha", json!(0.2)).await;
    assert!(
        took < Duration::from_secs(2),
        "second process took {took:?}"
    );
    // The model keeps serving with its new router.
    let (code, body) = first.chat(chat_body("chat", false)).await;
    assert_eq!(code, 200, "{body}");

    // The global layer: a fallback for keys that neither an override nor the config sets.
    let global = ok(
        &first,
        Method::PATCH,
        SETTINGS,
        Some(json!({"budget_alpha": 0.9, "fallback_mode": "strict"})),
    )
    .await;
    assert_eq!(
        global["settings"],
        json!({"budget_alpha": 0.9, "fallback_mode": "strict"})
    );
    assert_eq!(
        param(&global, "budget_alpha"),
        (json!(0.9), json!("global"))
    );
    assert_eq!(
        param(&global, "latency_slo_sec"),
        (json!(3.0), json!("default"))
    );
    let s = status(&first, "org/chat").await;
    assert_eq!(
        (&s["budget_alpha"], &s["fallback_mode"]),
        (&json!(0.2), &json!("strict")),
        "override wins"
    );
    let s = status(&first, "other").await;
    assert_eq!(
        (&s["budget_alpha"], &s["fallback_mode"]),
        (&json!(0.3), &json!("strict")),
        "config wins"
    );
    eventually_status(&second, "other", "fallback_mode", json!("strict")).await;

    // DELETE restores the inherited value: now the global one.
    let view = ok(
        &first,
        Method::DELETE,
        &model_setting("budget_alpha", "org/chat"),
        None,
    )
    .await;
    assert_eq!(param(&view, "budget_alpha"), (json!(0.9), json!("global")));
    assert_eq!(
        param(&view, "fallback_mode"),
        (json!("strict"), json!("global"))
    );
    assert_eq!(view["overrides"], json!({}));
    assert_eq!(status(&first, "org/chat").await["budget_alpha"], 0.9);
    // Deleting again changes nothing and is not an error.
    let again = ok(
        &first,
        Method::DELETE,
        &model_setting("budget_alpha", "org/chat"),
        None,
    )
    .await;
    assert_eq!(again["params"], view["params"]);

    // A null in the merge patch removes a global key: back to the default.
    let global = ok(
        &first,
        Method::PATCH,
        SETTINGS,
        Some(json!({"budget_alpha": null, "fallback_mode": null})),
    )
    .await;
    assert_eq!(global["settings"], json!({}));
    let s = status(&first, "org/chat").await;
    assert_eq!(
        (&s["budget_alpha"], &s["fallback_mode"]),
        (&json!(0.75), &json!("policy"))
    );
    eventually_status(&second, "org/chat", "budget_alpha", json!(0.75)).await;
    eventually_status(&second, "other", "fallback_mode", json!("policy")).await;
    let got = ok(&second, Method::GET, SETTINGS, None).await;
    assert_eq!(got["models"], json!(["org/chat", "other"]));
}

async fn bad_models_keys_and_values_are_refused(db: Db) {
    use reqwest::Method;
    let (a, b) = (Mock::start(&[]), Mock::start(&[]));
    let gw = start(&db, &config(&a, &b));
    let value = |v: Value| Some(json!({ "value": v }));

    let (code, body) = call(&gw, Method::GET, &model_settings("nope"), None).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["message"], "no model `nope`");
    let (code, _) = call(
        &gw,
        Method::PATCH,
        &model_setting("budget_alpha", "org/nope"),
        value(json!(0.5)),
    )
    .await;
    assert_eq!(code, 404);
    let (code, _) = call(
        &gw,
        Method::DELETE,
        &model_setting("budget_alpha", "nope"),
        None,
    )
    .await;
    assert_eq!(code, 404);

    for (path, body, param, needle) in [
        // Not a key of the schema.
        (
            model_setting("budget_alfa", "chat"),
            value(json!(0.5)),
            "budget_alfa",
            "not a parameter of routewise",
        ),
        // A value the schema rejects.
        (
            model_setting("budget_alpha", "chat"),
            value(json!("high")),
            "budget_alpha",
            "budget_alpha",
        ),
        (
            model_setting("fallback_mode", "chat"),
            value(json!("sometimes")),
            "fallback_mode",
            "fallback_mode",
        ),
        // A combination only the strategy's create can judge (upper percentile defaults to 90).
        (
            model_setting("envelope_lower_percentile", "chat"),
            value(json!(95)),
            "envelope_lower_percentile",
            "must be below envelope_upper_percentile",
        ),
        // A removed key: the schema keeps it, create names its replacement.
        (
            model_setting("daily_quota", "chat"),
            value(json!(100)),
            "daily_quota",
            "route[].quota.limit",
        ),
        // Not a RouteWise model, or no model at all.
        (
            model_setting("budget_alpha", "plain"),
            value(json!(0.5)),
            "model_id",
            "routed by `fixed`",
        ),
        (
            "/admin/routewise/model-settings/budget_alpha".to_owned(),
            value(json!(0.5)),
            "model_id",
            "required",
        ),
        // The body itself.
        (
            model_setting("budget_alpha", "chat"),
            Some(json!({"valeu": 1})),
            "valeu",
            "unknown field",
        ),
        // The global layer: keys, values, and what every model would get.
        (
            SETTINGS.to_owned(),
            Some(json!({"budget_alpha": 0.5, "nope": 1})),
            "nope",
            "not a parameter",
        ),
        (
            SETTINGS.to_owned(),
            Some(json!({"latency_window_sec": -5})),
            "latency_window_sec",
            "latency_window_sec",
        ),
        (
            SETTINGS.to_owned(),
            Some(json!({"envelope_lower_percentile": 95})),
            "envelope_lower_percentile",
            "would reject",
        ),
    ] {
        let (code, answer) = call(&gw, Method::PATCH, &path, body.clone()).await;
        assert_eq!(code, 422, "{path} {body:?}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{path} {body:?}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{path} {body:?}: {message}");
    }
    let (code, answer) = call(
        &gw,
        Method::DELETE,
        &model_setting("budget_alfa", "chat"),
        None,
    )
    .await;
    assert_eq!(
        (code, &answer["error"]["param"]),
        (422, &json!("budget_alfa")),
        "{answer}"
    );
    let (code, answer) = call(&gw, Method::GET, &model_settings("plain"), None).await;
    assert_eq!(
        (code, &answer["error"]["param"]),
        (422, &json!("model_id")),
        "{answer}"
    );

    // Nothing was written, and the gateway serves as before.
    assert_eq!(
        ok(&gw, Method::GET, SETTINGS, None).await["settings"],
        json!({})
    );
    let view = ok(&gw, Method::GET, &model_settings("org/chat"), None).await;
    assert_eq!(view["overrides"], json!({}));
    assert_eq!(status(&gw, "org/chat").await["budget_alpha"], 0.75);
    // Without the admin token: 401.
    let code = reqwest::Client::new()
        .get(gw.url(SETTINGS))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(code, 401);
}

async fn a_stored_combination_the_strategy_refuses_keeps_the_previous_router(db: Db) {
    use reqwest::Method;
    let (a, b) = (Mock::start(&[]), Mock::start(&[]));
    let gw = start(&db, &config(&a, &b));
    ok(
        &gw,
        Method::PATCH,
        &model_setting("budget_alpha", "org/chat"),
        Some(json!({"value": 0.4})),
    )
    .await;
    for _ in 0..3 {
        let (code, body) = gw.chat(chat_body("org/chat", false)).await;
        assert_eq!(code, 200, "{body}");
    }
    let decisions = status(&gw, "org/chat").await["counters"]["decisions"].clone();
    assert_eq!(decisions, 3);

    // Percentiles out of order, written behind the API's back.
    db.execute(
        "INSERT INTO routewise_model_settings (model_id, param, value, updated_at) \
         VALUES ('org/chat', 'envelope_lower_percentile', '95', 0)",
    )
    .await;
    let start = Instant::now();
    let problems = loop {
        let deep: Value = gw.deep(TOKEN).await;
        let problems = deep["routewise"]["settings_problems"].clone();
        if problems.as_array().is_some_and(|p| !p.is_empty()) {
            break problems;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{deep}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(problems[0]["model"], "org/chat", "{problems}");
    let problem = problems[0]["problem"].as_str().unwrap();
    assert!(problem.contains("envelope_lower_percentile"), "{problem}");
    assert!(
        gw.log().contains("are not applied"),
        "the problem is logged"
    );

    // The model keeps its router, with its state: the same params, counters still counting.
    let s = status(&gw, "org/chat").await;
    assert_eq!(s["budget_alpha"], 0.4);
    assert_eq!(s["counters"]["decisions"], 3, "{s}");
    let (code, body) = gw.chat(chat_body("chat", false)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(status(&gw, "org/chat").await["counters"]["decisions"], 4);
    let view = ok(&gw, Method::GET, &model_settings("org/chat"), None).await;
    assert_eq!(view["serving"]["applied"], false, "{view}");
    assert_eq!(view["serving"]["router_params"]["budget_alpha"], 0.4);
    assert!(view["serving"]["problem"].is_string(), "{view}");

    // Removing the bad key through the API heals it.
    let view = ok(
        &gw,
        Method::DELETE,
        &model_setting("envelope_lower_percentile", "org/chat"),
        None,
    )
    .await;
    assert_eq!(view["serving"]["applied"], true, "{view}");
    assert!(view["serving"]["problem"].is_null(), "{view}");
    let deep: Value = gw.deep(TOKEN).await;
    assert_eq!(deep["routewise"]["settings_problems"], json!([]));
}
