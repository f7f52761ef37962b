//! The management API in-process, over real HTTP on loopback, with a real store (SQLite in a
//! temporary folder; the cross-process PostgreSQL case is in the e2e tests).

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use super::management_router;
use crate::config::Config;
use crate::gateway::{Gateway, Routing};
use crate::store::tests::TestDb;

const TOKEN: &str = "admin-token-for-tests";

/// A gateway with no models (the management API needs none) serving only the management routes.
struct Server {
    base: String,
    client: reqwest::Client,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(db: &TestDb, admin_token: Option<&str>) -> Server {
    serve_router(db, admin_token, management_router()).await
}

async fn serve_router(
    db: &TestDb,
    admin_token: Option<&str>,
    router: axum::Router<Arc<Gateway>>,
) -> Server {
    let server = match admin_token {
        Some(t) => format!("server:\n  admin_token: {t}\n"),
        None => String::new(),
    };
    let yaml = format!("strategies:\n  builtin_dir: /nonexistent\n{server}");
    let config = Config::from_yaml(Path::new("admin-test.yaml"), &yaml, &|_| None).unwrap();
    let routing = Routing::build(&config, crate::gateway::DirLoad::Now)
        .await
        .unwrap();
    let gateway = Arc::new(Gateway::new(config, routing, Some(db.store.clone())).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router.with_state(gateway);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Server {
        base: format!("http://{addr}"),
        client: reqwest::Client::new(),
        task,
    }
}

impl Server {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(b) = bearer {
            request = request.bearer_auth(b);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let json = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("non-JSON ({e}): {text}"))
        };
        (status, json)
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, Some(TOKEN), None)
            .await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(TOKEN), Some(body))
            .await
    }

    async fn patch(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::PATCH, path, Some(TOKEN), Some(body))
            .await
    }

    async fn delete(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::DELETE, path, Some(TOKEN), None)
            .await
    }

    /// Creates a consumer with `role` and returns a fresh key's secret.
    async fn consumer_key(&self, name: &str, role: &str) -> (String, String, String) {
        let (status, consumer) = self
            .post("/admin/consumers", json!({"name": name, "role": role}))
            .await;
        assert_eq!(status, 201, "{consumer}");
        let id = consumer["id"].as_str().unwrap().to_owned();
        let (status, key) = self
            .post(&format!("/admin/consumers/{id}/keys"), json!({}))
            .await;
        assert_eq!(status, 201, "{key}");
        (
            id,
            key["id"].as_str().unwrap().to_owned(),
            key["secret"].as_str().unwrap().to_owned(),
        )
    }
}

#[tokio::test]
async fn admin_token_or_admin_consumer_key_is_required() {
    let db = TestDb::sqlite().await;
    let s = serve(&db, Some(TOKEN)).await;
    let get = reqwest::Method::GET;

    assert_eq!(s.get("/admin/routes").await, (200, json!([])));
    let (status, body) = s.call(get.clone(), "/admin/routes", None, None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["type"], "authentication_error");
    let (status, _) = s
        .call(get.clone(), "/admin/routes", Some("wrong"), None)
        .await;
    assert_eq!(status, 401);

    let (_, _, admin_secret) = s.consumer_key("ops", "admin").await;
    let (consumer, key, pro_secret) = s.consumer_key("user", "pro").await;
    let (status, _) = s
        .call(get.clone(), "/admin/routes", Some(&admin_secret), None)
        .await;
    assert_eq!(status, 200, "an admin consumer's key works");
    let (status, _) = s
        .call(get.clone(), "/admin/routes", Some(&pro_secret), None)
        .await;
    assert_eq!(status, 401, "a non-admin consumer's key does not");

    // Promoting the consumer takes effect at once; revoking its key too.
    s.patch(
        &format!("/admin/consumers/{consumer}"),
        json!({"role": "admin"}),
    )
    .await;
    let (status, _) = s
        .call(get.clone(), "/admin/routes", Some(&pro_secret), None)
        .await;
    assert_eq!(status, 200);
    s.patch(
        &format!("/admin/consumers/{consumer}/keys/{key}"),
        json!({"revoked": true}),
    )
    .await;
    let (status, _) = s
        .call(get.clone(), "/admin/routes", Some(&pro_secret), None)
        .await;
    assert_eq!(status, 401, "revoked");

    // Without an admin token, only an admin consumer key opens the API; anything else is 403 with
    // the same message as the other admin endpoints.
    let open = serve(&db, None).await;
    let (status, body) = open.call(get.clone(), "/admin/routes", None, None).await;
    assert_eq!(status, 403);
    assert_eq!(
        body["error"]["message"],
        super::auth::Denied::NotConfigured.to_string()
    );
    let (status, _) = open
        .call(get.clone(), "/admin/routes", Some(TOKEN), None)
        .await;
    assert_eq!(status, 403);
    let (status, _) = open
        .call(get, "/admin/routes", Some(&admin_secret), None)
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn runtime_routing_endpoints_follow_the_same_rule() {
    let db = TestDb::sqlite().await;
    let s = serve_router(&db, Some(TOKEN), super::router()).await;
    let get = reqwest::Method::GET;
    let (_, _, admin_secret) = s.consumer_key("ops", "admin").await;
    let (_, _, pro_secret) = s.consumer_key("user", "pro").await;
    for path in ["/admin/routing/weights", "/routing"] {
        let (status, body) = s.call(get.clone(), path, Some(TOKEN), None).await;
        assert_eq!(status, 200, "{path}: {body}");
        let (status, body) = s.call(get.clone(), path, Some(&admin_secret), None).await;
        assert_eq!(status, 200, "{path}: an admin consumer's key works: {body}");
        let (status, body) = s.call(get.clone(), path, Some(&pro_secret), None).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert_eq!(
            body["error"],
            json!({
                "message": super::auth::Denied::Unauthorized.to_string(),
                "type": "authentication_error",
                "param": null,
                "code": 401,
            }),
            "{path}"
        );
    }
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            "/admin/routing/providers/nowhere/disable",
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("not_found")));

    let open = serve_router(&db, None, super::router()).await;
    let (status, body) = open
        .call(get.clone(), "/admin/routing/weights", Some(TOKEN), None)
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        body["error"]["message"],
        super::auth::Denied::NotConfigured.to_string()
    );
    assert_eq!(body["error"]["code"], 403);
    let (status, _) = open
        .call(get, "/admin/routing/weights", Some(&admin_secret), None)
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn bad_input_is_422_with_the_field_unknown_ids_404_clashes_409() {
    let db = TestDb::sqlite().await;
    let s = serve(&db, Some(TOKEN)).await;
    let (status, body) = s
        .post("/admin/routes", json!({"name": "r", "path_prefix": "v1"}))
        .await;
    assert_eq!(status, 422);
    assert_eq!(
        body,
        json!({"error": {
            "message": "path_prefix: must start with /",
            "type": "invalid_request_error",
            "param": "path_prefix",
            "code": "validation_failed",
        }})
    );
    let (status, body) = s.post("/admin/routes", json!({"name": "r"})).await;
    assert_eq!(
        (status, &body["error"]["param"]),
        (422, &json!("path_prefix"))
    );
    let (status, body) = s
        .post(
            "/admin/routes",
            json!({"name": "r", "path_prefix": "/r", "max_attempts": "two"}),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["param"]),
        (422, &json!("max_attempts"))
    );
    let (status, body) = s
        .post(
            "/admin/providers",
            json!({"name": "p", "protocol": "carrier_pigeon"}),
        )
        .await;
    assert_eq!((status, &body["error"]["param"]), (422, &json!("protocol")));
    let (status, body) = s
        .post(
            "/admin/upstreams",
            json!({"provider_id": "pv_nope", "base_url": "http://x"}),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["param"]),
        (422, &json!("provider_id"))
    );

    let (status, body) = s.get("/admin/routes/rt_nope").await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("not_found")));
    let (status, _) = s.patch("/admin/consumers/cs_nope", json!({})).await;
    assert_eq!(status, 404);
    let (status, _) = s.delete("/admin/upstreams/up_nope").await;
    assert_eq!(status, 404);
    let (status, _) = s.get("/admin/routes/rt_nope/plugins").await;
    assert_eq!(status, 404);

    let (status, _) = s
        .post("/admin/routes", json!({"name": "a", "path_prefix": "/dup"}))
        .await;
    assert_eq!(status, 201);
    let (status, body) = s
        .post("/admin/routes", json!({"name": "b", "path_prefix": "/dup"}))
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["param"], "path_prefix");
    assert_eq!(body["error"]["code"], "conflict");
}

#[tokio::test]
async fn secrets_are_shown_once_and_masked_afterwards() {
    let db = TestDb::sqlite().await;
    let s = serve(&db, Some(TOKEN)).await;
    let (consumer, key, secret) = s.consumer_key("alice", "free").await;
    assert!(secret.starts_with("sk-sy-"));
    for path in [
        format!("/admin/consumers/{consumer}/keys"),
        format!("/admin/consumers/{consumer}/keys/{key}"),
    ] {
        let (status, body) = s.get(&path).await;
        assert_eq!(status, 200);
        let text = body.to_string();
        assert!(!text.contains(&secret[6..]), "{text}");
        assert!(!text.contains("secret") && !text.contains("hash"), "{text}");
        assert!(text.contains(&secret[..8]), "the prefix is shown: {text}");
    }

    let (_, provider) = s
        .post(
            "/admin/providers",
            json!({"name": "openai", "protocol": "openai_compat"}),
        )
        .await;
    let (_, upstream) = s
        .post(
            "/admin/upstreams",
            json!({"provider_id": provider["id"], "base_url": "https://api.example.com/v1"}),
        )
        .await;
    let upstream_id = upstream["id"].as_str().unwrap();
    let upstream_secret = "sk-proj-abcdefghijklmnopqrstuvwxyz";
    let (status, created) = s
        .post(
            &format!("/admin/upstreams/{upstream_id}/keys"),
            json!({"secret": upstream_secret}),
        )
        .await;
    assert_eq!(status, 201);
    assert_eq!(created["secret"], "sk-pr…yz");
    let key_id = created["id"].as_str().unwrap();
    let (_, patched) = s
        .patch(
            &format!("/admin/upstreams/{upstream_id}/keys/{key_id}"),
            json!({"secret": "sk-other-0123456789abcdef", "min_role": "pro"}),
        )
        .await;
    assert_eq!(patched["secret"], "sk-ot…ef");
    let (_, listed) = s.get(&format!("/admin/upstreams/{upstream_id}/keys")).await;
    assert_eq!(listed[0]["secret"], "sk-ot…ef");
    assert_eq!(listed[0]["min_role"], "pro");
    // The request path still gets the real secret.
    let snapshot = db.store.config().load_snapshot().await.unwrap();
    let keys: Vec<_> = snapshot.upstream_keys(upstream_id).collect();
    assert_eq!(keys[0].secret.expose(), "sk-other-0123456789abcdef");
}

#[tokio::test]
async fn every_resource_round_trips_over_http() {
    let db = TestDb::sqlite().await;
    let s = serve(&db, Some(TOKEN)).await;

    let (status, route) = s
        .post(
            "/admin/routes",
            json!({"name": "chat", "path_prefix": "/chat", "labels": {"a": "b"}}),
        )
        .await;
    assert_eq!(status, 201, "{route}");
    let rid = route["id"].as_str().unwrap();
    assert_eq!(
        route["protocol_transformation_type"],
        "if-different-protocol"
    );
    assert_eq!(route["max_attempts"], 2);
    assert_eq!(
        s.get(&format!("/admin/routes/{rid}")).await,
        (200, route.clone())
    );
    let (_, patched) = s
        .patch(&format!("/admin/routes/{rid}"), json!({"max_attempts": 3}))
        .await;
    assert_eq!(patched["max_attempts"], 3);
    assert!(
        route.get("plugins").is_none(),
        "plugins are their own resource"
    );

    let (status, plugin) = s
        .post(
            &format!("/admin/routes/{rid}/plugins"),
            json!({"plugin": "cache", "config": {"ttl": 10}}),
        )
        .await;
    assert_eq!(status, 422, "no plugin named cache runs: {plugin}");
    assert_eq!(plugin["error"]["param"], "plugin");
    let message = plugin["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("unknown plugin `cache`; known plugins: rate-limit, test-noop"),
        "{message}"
    );
    let (status, plugin) = s
        .post(
            &format!("/admin/routes/{rid}/plugins"),
            json!({"plugin": "rate-limit", "config": {"limits": [{"scope": "consumer", "requests_per_minute": 0}]}}),
        )
        .await;
    assert_eq!(status, 422, "{plugin}");
    assert_eq!(
        plugin["error"]["param"],
        "config.limits[0].requests_per_minute"
    );
    // A route's body may not carry plugins: they are their own resource.
    let (status, body) = s
        .post(
            "/admin/routes",
            json!({"name": "p", "path_prefix": "/p", "plugins": {"rate-limit": {"limits": [{"scope": "route", "concurrent_requests": 1}]}}}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["param"], "plugins");
    let (status, plugin) = s
        .post(
            &format!("/admin/routes/{rid}/plugins"),
            json!({"plugin": "test-noop", "config": {"rpm": 10}}),
        )
        .await;
    assert_eq!(status, 201, "{plugin}");
    let pid = plugin["id"].as_str().unwrap();
    let (_, plugin) = s
        .patch(
            &format!("/admin/routes/{rid}/plugins/{pid}"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(plugin["enabled"], false);
    assert_eq!(
        s.get(&format!("/admin/routes/{rid}/plugins/{pid}")).await,
        (200, plugin.clone())
    );
    assert_eq!(
        s.get(&format!("/admin/routes/{rid}/plugins")).await.1,
        json!([plugin])
    );
    assert_eq!(
        s.delete(&format!("/admin/routes/{rid}/plugins/{pid}"))
            .await
            .0,
        204
    );

    let (_, provider) = s
        .post(
            "/admin/providers",
            json!({"name": "claude", "protocol": "anthropic"}),
        )
        .await;
    let pvid = provider["id"].as_str().unwrap();
    assert_eq!(
        provider["default_capabilities"],
        json!(["chat_completions", "responses", "messages"])
    );
    let (_, provider) = s
        .patch(
            &format!("/admin/providers/{pvid}"),
            json!({"default_capabilities": ["messages", "chat_completions"]}),
        )
        .await;
    assert_eq!(s.get("/admin/providers").await.1, json!([provider]));
    let (status, upstream) = s
        .post(
            "/admin/upstreams",
            json!({"provider_id": pvid, "base_url": "https://api.anthropic.com", "priority": 5}),
        )
        .await;
    assert_eq!(status, 201, "{upstream}");
    let uid = upstream["id"].as_str().unwrap();
    assert_eq!(
        (&upstream["group"], &upstream["lb_weight"]),
        (&json!("default"), &json!(1.0))
    );
    let (_, upstream) = s
        .patch(
            &format!("/admin/upstreams/{uid}"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(s.get(&format!("/admin/upstreams/{uid}")).await.1, upstream);
    assert_eq!(s.get("/admin/upstreams").await.1, json!([upstream]));

    let (status, model) = s
        .post(
            "/admin/upstream-models",
            json!({"model": "claude", "upstream_id": uid, "provider_model_id": "claude-x"}),
        )
        .await;
    assert_eq!(status, 201, "{model}");
    let mid = model["id"].as_str().unwrap();
    let (status, body) = s
        .post(
            "/admin/upstream-models",
            json!({"model": "claude", "upstream_id": uid}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    let (_, model) = s
        .patch(
            &format!("/admin/upstream-models/{mid}"),
            json!({"provider_model_id": "claude-y"}),
        )
        .await;
    assert_eq!(
        s.get(&format!("/admin/upstream-models/{mid}")).await.1,
        model
    );
    assert_eq!(s.get("/admin/upstream-models").await.1, json!([model]));

    let (status, body) = s.delete(&format!("/admin/providers/{pvid}")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        s.delete(&format!("/admin/upstream-models/{mid}")).await.0,
        204
    );
    assert_eq!(s.delete(&format!("/admin/upstreams/{uid}")).await.0, 204);
    assert_eq!(s.delete(&format!("/admin/providers/{pvid}")).await.0, 204);

    let (cid, kid, _) = s.consumer_key("c", "internal").await;
    let (_, consumer) = s.get(&format!("/admin/consumers/{cid}")).await;
    assert_eq!(consumer["role"], "internal");
    let (_, key) = s
        .patch(
            &format!("/admin/consumers/{cid}/keys/{kid}"),
            json!({"groups": ["beta"], "expires_at": 4_000_000_000i64}),
        )
        .await;
    assert_eq!(
        (&key["groups"], &key["expires_at"]),
        (&json!(["beta"]), &json!(4_000_000_000i64))
    );
    assert_eq!(
        s.delete(&format!("/admin/consumers/{cid}/keys/{kid}"))
            .await
            .0,
        204
    );
    assert_eq!(s.delete(&format!("/admin/consumers/{cid}")).await.0, 204);
    assert_eq!(s.delete(&format!("/admin/routes/{rid}")).await.0, 204);
    assert_eq!(s.get("/admin/routes").await.1, json!([]));
}

#[tokio::test]
async fn the_openapi_document_lists_every_path() {
    let db = TestDb::sqlite().await;
    let s = serve(&db, Some(TOKEN)).await;
    let (status, doc) = s.get("/admin/openapi.json").await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, methods) in [
        ("/admin/routes", &["get", "post"][..]),
        ("/admin/routes/{id}", &["get", "patch", "delete"]),
        ("/admin/routes/{id}/plugins", &["get", "post"]),
        (
            "/admin/routes/{id}/plugins/{plugin_id}",
            &["get", "patch", "delete"],
        ),
        ("/admin/consumers", &["get", "post"]),
        ("/admin/consumers/{id}", &["get", "patch", "delete"]),
        ("/admin/consumers/{id}/keys", &["get", "post"]),
        (
            "/admin/consumers/{id}/keys/{key_id}",
            &["get", "patch", "delete"],
        ),
        ("/admin/budgets", &["get", "post"]),
        ("/admin/budgets/{id}", &["get", "patch", "delete"]),
        ("/admin/providers", &["get", "post"]),
        ("/admin/providers/{id}", &["get", "patch", "delete"]),
        ("/admin/upstreams", &["get", "post"]),
        ("/admin/upstreams/{id}", &["get", "patch", "delete"]),
        ("/admin/upstreams/{id}/keys", &["get", "post"]),
        (
            "/admin/upstreams/{id}/keys/{key_id}",
            &["get", "patch", "delete"],
        ),
        ("/admin/upstream-models", &["get", "post"]),
        ("/admin/upstream-models/{id}", &["get", "patch", "delete"]),
        ("/admin/store/status", &["get"]),
        ("/admin/logs", &["get"]),
        ("/admin/openapi.json", &["get"]),
        ("/admin/provider-keys", &["get", "post"]),
        ("/admin/provider-keys/min-role-env", &["post"]),
        ("/admin/provider-keys/{key_id}/min-role", &["post"]),
        ("/admin/routewise/settings", &["get", "patch"]),
        ("/admin/routewise/model-settings", &["get"]),
        (
            "/admin/routewise/model-settings/{key}",
            &["patch", "delete"],
        ),
    ] {
        let item = paths.get(path).unwrap_or_else(|| panic!("{path} missing"));
        for m in methods {
            let op = &item[*m];
            assert!(op.is_object(), "{m} {path} missing");
            assert!(op["responses"]["401"].is_object(), "{m} {path}: no 401");
        }
    }
    assert_eq!(paths.len(), 27, "{:?}", paths.keys().collect::<Vec<_>>());
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for schema in [
        "Route",
        "NewRoute",
        "CreatedConsumerKey",
        "UpstreamKey",
        "BudgetView",
        "NewBudget",
        "ErrorBody",
    ] {
        assert!(schemas.contains_key(schema), "{schema} missing");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let create = &paths["/admin/routes"]["post"];
    assert!(create["responses"]["422"].is_object());
    // Every path the router serves is documented, and nothing else.
    let (status, _) = s.get("/admin/routes/x/plugins/y").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn store_status_reports_this_process_snapshot() {
    let db = TestDb::sqlite().await;
    db.store.spawn_sync();
    let s = serve(&db, Some(TOKEN)).await;
    s.post("/admin/routes", json!({"name": "r", "path_prefix": "/r"}))
        .await;
    let version = db.store.config().version().await.unwrap();
    let started = std::time::Instant::now();
    loop {
        let (status, body) = s.get("/admin/store/status").await;
        assert_eq!(status, 200);
        assert_eq!(body["backend"], "sqlite");
        if body["sync"]["snapshot_version"] == json!(version) {
            assert_eq!(body["snapshot"]["routes"], 1);
            assert!(body["sync"]["last_loaded_at_ms"].is_i64());
            assert!(body["sync"]["last_error"].is_null());
            break;
        }
        assert!(started.elapsed().as_secs() < 2, "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
