//! Plugin configs name plugins the gateway runs: a row for any other name would be stored and
//! shown by `/routing` while protecting nothing. A plugin's config is checked when it is written.

use serde_json::{Value, json};

use crate::harness::Gateway;

const ADMIN: &str = "plugins-admin";

async fn post(gw: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(gw.url(path))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_config_for_a_plugin_that_does_not_run_is_refused() {
    let gw = Gateway::start(&format!("server:\n  admin_token: {ADMIN}\n"));
    let (status, route) = post(
        &gw,
        "/admin/routes",
        json!({"name": "team", "path_prefix": "/team"}),
    )
    .await;
    assert_eq!(status, 201, "{route}");
    let id = route["id"].as_str().unwrap();
    let (status, body) = post(
        &gw,
        &format!("/admin/routes/{id}/plugins"),
        json!({"plugin": "cache", "config": {"ttl": 1}}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["param"], "plugin", "{body}");
    assert_eq!(
        body["error"]["message"], "plugin: unknown plugin `cache`; known plugins: rate-limit",
        "{body}"
    );
    // A plugin that runs refuses a config it could not use, naming the field.
    let (status, body) = post(
        &gw,
        &format!("/admin/routes/{id}/plugins"),
        json!({"plugin": "rate-limit", "config": {"limits": [{"scope": "team", "requests_per_minute": 1}]}}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["param"], "config.limits[0].scope", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown variant `team`"),
        "{body}"
    );
    // Nothing was stored, so `/routing` shows no plugin on the route.
    let routing: Value = reqwest::Client::new()
        .get(gw.url("/routing"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let routes = routing["inbound_routes"].as_array().unwrap();
    let team = routes.iter().find(|r| r["name"] == "team");
    if let Some(team) = team {
        assert_eq!(team["plugins"], json!({}), "{routing}");
    }
    let listed: Value = reqwest::Client::new()
        .get(gw.url(&format!("/admin/routes/{id}/plugins")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_row_limits_its_route_and_a_patch_is_checked_too() {
    let mock = crate::harness::Mock::start(&[]);
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN}\nmodels:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
        mock.base_url()
    ));
    let (status, route) = post(
        &gw,
        "/admin/routes",
        json!({"name": "open", "path_prefix": "/open", "disable_auth": true, "disabled": true}),
    )
    .await;
    assert_eq!(status, 201, "{route}");
    let id = route["id"].as_str().unwrap();
    let (status, plugin) = post(
        &gw,
        &format!("/admin/routes/{id}/plugins"),
        json!({"plugin": "rate-limit", "config": {"limits": [{"scope": "route", "requests_per_minute": 1}]}}),
    )
    .await;
    assert_eq!(status, 201, "{plugin}");
    // Enabled once its plugin exists, so no snapshot has the route without it.
    let enabled = reqwest::Client::new()
        .patch(gw.url(&format!("/admin/routes/{id}")))
        .bearer_auth(ADMIN)
        .json(&json!({"disabled": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(enabled.status(), 200);
    let chat = || async {
        reqwest::Client::new()
            .post(gw.url("/open/v1/chat/completions"))
            .json(&crate::harness::chat_body("m", false))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    // The route and its plugin reach the gateway's snapshot (polling spends the one request).
    crate::routes::eventually(
        std::time::Duration::from_secs(10),
        "the route serves",
        || async { chat().await == 200 },
    )
    .await;
    assert_eq!(chat().await, 429);
    assert_eq!(mock.chat_requests().await, 1);

    let pid = plugin["id"].as_str().unwrap();
    let response = reqwest::Client::new()
        .patch(gw.url(&format!("/admin/routes/{id}/plugins/{pid}")))
        .bearer_auth(ADMIN)
        .json(&json!({"config": {"limits": [{"scope": "route", "concurrent_requests": 0}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["error"]["param"], "config.limits[0].concurrent_requests",
        "{body}"
    );
}
