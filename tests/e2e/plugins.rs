//! Plugin configs name plugins the gateway runs: a row for any other name would be stored and
//! shown by `/routing` while protecting nothing.

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
        json!({"plugin": "rate-limit", "config": {"rpm": 1}}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["param"], "plugin", "{body}");
    assert_eq!(
        body["error"]["message"],
        "plugin: unknown plugin `rate-limit`; known plugins: none (this version runs no plugins)",
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
