//! Routes, authentication, groups, key expansion, priority tiers, `max_attempts` and `/v1/models`,
//! configured through the management API of a real gateway process, with real mock upstreams.
//! Every scenario runs on SQLite and on PostgreSQL (a fresh schema on the machine's server).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::databases::{Db, on_both_databases};
use crate::harness::{Gateway, Mock, PgSchema, chat_body};

pub(crate) const TOKEN: &str = "routes-admin-token";

on_both_databases!(
    prefixes_and_each_auth_mode_in_priority_order,
    groups_intersect_route_consumer_and_key,
    keys_expand_into_candidates_and_lower_tiers_wait_for_higher_ones,
    models_list_aggregates_sorts_and_respects_groups,
    changes_reach_a_second_gateway_process_within_two_seconds,
);

fn start(db: &Db, extra_env: &[(&str, &str)]) -> Gateway {
    let mut env = vec![
        ("ROUTING_AFFINITY_ENABLED", "0"),
        ("SWITCHYARD_DEFAULT_AUTH", "consumer_keys"),
    ];
    env.extend_from_slice(extra_env);
    Gateway::start_on(
        Some(&db.url()),
        &format!("server:\n  admin_token: {TOKEN}\n"),
        &env,
    )
}

/// The management API of one gateway.
pub(crate) struct Admin {
    base: String,
}

impl Admin {
    pub(crate) fn of(gateway: &Gateway) -> Admin {
        Admin {
            base: gateway.url(""),
        }
    }

    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let mut request = reqwest::Client::new()
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(body) = &body {
            request = request.json(body);
        }
        let response = request.send().await.expect("gateway reachable");
        let status = response.status().as_u16();
        let value: Value = response.json().await.unwrap_or(Value::Null);
        assert!(
            (200..300).contains(&status),
            "{method} {path} {body:?} answered {status}: {value}"
        );
        value
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    pub(crate) async fn patch(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::PATCH, path, Some(body)).await
    }

    pub(crate) async fn provider(&self, name: &str, protocol: &str) -> String {
        id(self
            .post(
                "/admin/providers",
                json!({"name": name, "protocol": protocol}),
            )
            .await)
    }

    /// An upstream at `mock`, serving `models` under the same names.
    pub(crate) async fn upstream(
        &self,
        provider: &str,
        mock: &Mock,
        settings: Value,
        models: &[&str],
    ) -> String {
        let mut body = json!({"provider_id": provider, "base_url": mock.base_url()});
        if let (Some(b), Some(s)) = (body.as_object_mut(), settings.as_object()) {
            b.extend(s.clone());
        }
        let upstream = id(self.post("/admin/upstreams", body).await);
        for model in models {
            self.post(
                "/admin/upstream-models",
                json!({"model": model, "upstream_id": upstream, "provider_model_id": model}),
            )
            .await;
        }
        upstream
    }

    pub(crate) async fn upstream_key(
        &self,
        upstream: &str,
        secret: &str,
        lb_weight: Option<f64>,
    ) -> String {
        id(self
            .post(
                &format!("/admin/upstreams/{upstream}/keys"),
                json!({"secret": secret, "lb_weight": lb_weight}),
            )
            .await)
    }

    pub(crate) async fn route(&self, body: Value) -> String {
        id(self.post("/admin/routes", body).await)
    }

    /// A consumer with `groups` and one key with `key_groups`; returns (consumer id, key id,
    /// secret).
    pub(crate) async fn consumer(
        &self,
        name: &str,
        groups: &[&str],
        key_groups: &[&str],
    ) -> (String, String, String) {
        let consumer = id(self
            .post("/admin/consumers", json!({"name": name, "groups": groups}))
            .await);
        let key = self
            .post(
                &format!("/admin/consumers/{consumer}/keys"),
                json!({"groups": key_groups}),
            )
            .await;
        let secret = key["secret"]
            .as_str()
            .expect("secret shown once")
            .to_owned();
        (consumer, id(key), secret)
    }
}

pub(crate) fn id(v: Value) -> String {
    v["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {v}"))
        .to_owned()
}

/// How a test authenticates a request.
#[derive(Clone, Copy)]
pub(crate) enum Auth<'a> {
    None,
    Bearer(&'a str),
    ApiKey(&'a str),
}

pub(crate) async fn post(
    gateway: &Gateway,
    path: &str,
    auth: Auth<'_>,
    body: Value,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(gateway.url(path)).json(&body);
    request = match auth {
        Auth::None => request,
        Auth::Bearer(t) => request.bearer_auth(t),
        Auth::ApiKey(k) => request
            .header("x-api-key", k)
            .header("anthropic-version", "2023-06-01"),
    };
    let response = request.send().await.expect("gateway reachable");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub(crate) async fn chat(
    gateway: &Gateway,
    path: &str,
    auth: Auth<'_>,
    model: &str,
) -> (u16, Value) {
    post(gateway, path, auth, chat_body(model, false)).await
}

fn messages_body(model: &str) -> Value {
    json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]})
}

async fn models(gateway: &Gateway, path: &str, auth: Auth<'_>) -> (u16, Vec<String>) {
    let mut request = reqwest::Client::new().get(gateway.url(path));
    if let Auth::Bearer(t) = auth {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.expect("gateway reachable");
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let ids = body["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (status, ids)
}

/// Polls until `ready` returns true; panics after `within`. Returns how long it took.
pub(crate) async fn eventually<F, Fut>(within: Duration, what: &str, mut ready: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if ready().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every one of `keys` authenticates (the consumers reached the gateway's snapshot).
pub(crate) async fn known(gateway: &Gateway, keys: &[&str]) {
    for key in keys {
        eventually(
            Duration::from_secs(5),
            "the consumer key is known",
            || async { models(gateway, "/v1/models", Auth::Bearer(key)).await.0 == 200 },
        )
        .await;
    }
}

/// Waits until `path` serves `model` to `auth` (the database change reached the gateway).
pub(crate) async fn served(gateway: &Gateway, path: &str, auth: Auth<'_>, model: &str) {
    eventually(
        Duration::from_secs(5),
        &format!("{model} served on {path}"),
        || async { chat(gateway, path, auth, model).await.0 == 200 },
    )
    .await;
}

pub(crate) async fn credential_counts(mock: &Mock) -> Value {
    mock.stats().await["requests_by_credential"].clone()
}

async fn prefixes_and_each_auth_mode_in_priority_order(db: Db) {
    let mock = Mock::start(&[]);
    let gateway = start(&db, &[]);
    let admin = Admin::of(&gateway);
    let provider = admin.provider("p", "openai_compat").await;
    admin.upstream(&provider, &mock, json!({}), &["m"]).await;
    // Each flag set on a route with every lower-priority flag set too: the highest one decides.
    admin
        .route(
            json!({"name": "open", "path_prefix": "/open", "disable_auth": true,
                      "passthrough_auth_token": true, "legacy_bearer_auth_tokens": ["tok-open"]}),
        )
        .await;
    admin
        .route(json!({"name": "off", "path_prefix": "/open/off", "disabled": true, "disable_auth": true}))
        .await;
    admin
        .route(
            json!({"name": "pass", "path_prefix": "/pass", "passthrough_auth_token": true,
                      "legacy_bearer_auth_tokens": ["tok-pass"]}),
        )
        .await;
    admin
        .route(json!({"name": "legacy", "path_prefix": "/legacy",
                      "legacy_bearer_auth_tokens": ["tok-legacy-1", "tok-legacy-2"]}))
        .await;
    admin
        .route(json!({"name": "keys", "path_prefix": "/"}))
        .await;
    let (consumer, key_id, key) = admin.consumer("alice", &[], &[]).await;
    known(&gateway, &[&key]).await;

    served(&gateway, "/open/v1/chat/completions", Auth::None, "m").await;

    // Disabled beats the rest: no credential needed, and none is sent upstream.
    let (status, _) = chat(&gateway, "/open/chat/completions", Auth::None, "m").await;
    assert_eq!(status, 200, "the trimmed path works without /v1 too");
    assert_eq!(mock.stats().await["last_authorization"], Value::Null);

    // The longest prefix is disabled: 404, not the shorter `/open`.
    let (status, body) = chat(&gateway, "/open/off/v1/chat/completions", Auth::None, "m").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("route_disabled")),
        "{body}"
    );
    // A prefix only matches whole segments: `/openx/...` belongs to `/`, where it names no
    // endpoint (the open route would have served it).
    let (status, body) = chat(&gateway, "/openx/v1/chat/completions", Auth::None, "m").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("not_found")),
        "{body}"
    );

    // Pass-through beats legacy tokens: any bearer passes and is the upstream credential.
    let (status, body) = chat(&gateway, "/pass/v1/chat/completions", Auth::None, "m").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (401, &json!("missing_api_key")),
        "{body}"
    );
    let (status, _) = chat(
        &gateway,
        "/pass/v1/chat/completions",
        Auth::Bearer("client-own-key"),
        "m",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        mock.stats().await["last_authorization"],
        json!("Bearer client-own-key")
    );
    // An Anthropic client's x-api-key is passed on too, translated to the upstream's protocol.
    let (status, body) = post(
        &gateway,
        "/pass/v1/messages",
        Auth::ApiKey("anthropic-client-key"),
        messages_body("m"),
    )
    .await;
    assert_eq!((status, &body["type"]), (200, &json!("message")), "{body}");
    assert_eq!(
        mock.stats().await["last_authorization"],
        json!("Bearer anthropic-client-key")
    );

    // Legacy tokens beat consumer keys: a consumer key is not one of them.
    for token in ["tok-legacy-1", "tok-legacy-2"] {
        assert_eq!(
            chat(
                &gateway,
                "/legacy/v1/chat/completions",
                Auth::Bearer(token),
                "m"
            )
            .await
            .0,
            200
        );
    }
    assert_eq!(
        chat(
            &gateway,
            "/legacy/v1/chat/completions",
            Auth::Bearer(&key),
            "m"
        )
        .await
        .0,
        401
    );
    assert_eq!(
        chat(&gateway, "/legacy/v1/chat/completions", Auth::None, "m")
            .await
            .0,
        401
    );

    // Consumer keys (the default): Bearer or x-api-key; errors in the client's protocol.
    assert_eq!(
        chat(&gateway, "/v1/chat/completions", Auth::Bearer(&key), "m")
            .await
            .0,
        200
    );
    let (status, body) = post(
        &gateway,
        "/v1/messages",
        Auth::ApiKey(&key),
        messages_body("m"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = chat(
        &gateway,
        "/v1/chat/completions",
        Auth::Bearer("tok-legacy-1"),
        "m",
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (401, &json!("invalid_api_key")),
        "{body}"
    );
    let (status, body) = post(&gateway, "/v1/messages", Auth::None, messages_body("m")).await;
    assert_eq!(status, 401);
    assert_eq!(body["type"], "error", "Anthropic's error shape: {body}");
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");

    // Revoking the key shuts it out within the sync interval.
    admin
        .patch(
            &format!("/admin/consumers/{consumer}/keys/{key_id}"),
            json!({"revoked": true}),
        )
        .await;
    eventually(Duration::from_secs(3), "revoked key refused", || async {
        chat(&gateway, "/v1/chat/completions", Auth::Bearer(&key), "m")
            .await
            .0
            == 401
    })
    .await;

    // Operators see every route, longest prefix first, with its resolved auth mode.
    let routing = admin.call(reqwest::Method::GET, "/routing", None).await;
    let routes: Vec<(String, String)> = routing["inbound_routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path_prefix"].as_str().unwrap().to_owned(),
                r["auth"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("/open/off", "disabled"),
        ("/legacy", "legacy_bearer"),
        ("/open", "disabled"),
        ("/pass", "passthrough"),
        ("/", "consumer_keys"),
    ];
    assert_eq!(
        routes,
        expected
            .iter()
            .map(|(p, a)| ((*p).to_owned(), (*a).to_owned()))
            .collect::<Vec<_>>()
    );

    let log = gateway.log();
    for secret in [
        key.as_str(),
        "client-own-key",
        "anthropic-client-key",
        "tok-legacy-1",
        "tok-pass",
    ] {
        assert!(!log.contains(secret), "a secret reached the log: {secret}");
    }
}

async fn groups_intersect_route_consumer_and_key(db: Db) {
    let (in_default, in_g1, in_g2) = (Mock::start(&[]), Mock::start(&[]), Mock::start(&[]));
    let gateway = start(&db, &[]);
    let admin = Admin::of(&gateway);
    let provider = admin.provider("p", "openai_compat").await;
    admin
        .upstream(&provider, &in_default, json!({}), &["m"])
        .await;
    admin
        .upstream(&provider, &in_g1, json!({"group": "g1"}), &["m"])
        .await;
    admin
        .upstream(&provider, &in_g2, json!({"group": "g2"}), &["m"])
        .await;
    admin
        .route(json!({"name": "all", "path_prefix": "/"}))
        .await;
    admin
        .route(json!({"name": "team", "path_prefix": "/team", "groups": ["g1", "g2"]}))
        .await;
    let (_, _, unrestricted) = admin.consumer("unrestricted", &[], &[]).await;
    let (_, _, consumer_g1) = admin.consumer("consumer-g1", &["g1"], &[]).await;
    let (_, _, key_g2) = admin.consumer("key-g2", &[], &["g2"]).await;
    let (_, _, disjoint) = admin.consumer("disjoint", &["g1"], &["g2"]).await;
    known(&gateway, &[&unrestricted, &consumer_g1, &key_g2, &disjoint]).await;
    served(
        &gateway,
        "/v1/chat/completions",
        Auth::Bearer(&unrestricted),
        "m",
    )
    .await;

    let mocks = [&in_default, &in_g1, &in_g2];
    // Sends 12 requests and returns how many each upstream (default, g1, g2) received.
    let spread = |path: &'static str, key: String| {
        let gateway = &gateway;
        async move {
            let before = futures_counts(&mocks).await;
            for _ in 0..12 {
                let (status, body) = chat(gateway, path, Auth::Bearer(&key), "m").await;
                assert_eq!(status, 200, "{path}: {body}");
            }
            let after = futures_counts(&mocks).await;
            [
                after[0] - before[0],
                after[1] - before[1],
                after[2] - before[2],
            ]
        }
    };
    // Nothing constrained anywhere: the default group only.
    assert_eq!(
        spread("/v1/chat/completions", unrestricted.clone()).await,
        [12, 0, 0]
    );
    assert_eq!(
        spread("/v1/chat/completions", consumer_g1.clone()).await,
        [0, 12, 0]
    );
    assert_eq!(
        spread("/v1/chat/completions", key_g2.clone()).await,
        [0, 0, 12]
    );
    // The route allows g1 and g2; an unconstrained consumer gets both, never default.
    let team = spread("/team/v1/chat/completions", unrestricted.clone()).await;
    assert_eq!(team[0], 0, "{team:?}");
    assert!(
        team[1] > 0 && team[2] > 0,
        "both team groups used: {team:?}"
    );
    assert_eq!(
        spread("/team/v1/chat/completions", consumer_g1.clone()).await,
        [0, 12, 0]
    );
    assert_eq!(
        spread("/team/v1/chat/completions", key_g2.clone()).await,
        [0, 0, 12]
    );
    // Consumer g1 ∩ key g2 = nothing: the model is not available to this key.
    let (status, body) = chat(
        &gateway,
        "/v1/chat/completions",
        Auth::Bearer(&disjoint),
        "m",
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("model_not_found")),
        "{body}"
    );
    assert_eq!(
        models(&gateway, "/v1/models", Auth::Bearer(&disjoint)).await,
        (200, vec![])
    );
    assert_eq!(
        models(&gateway, "/team/v1/models", Auth::Bearer(&consumer_g1)).await,
        (200, vec!["m".to_owned()])
    );
}

async fn futures_counts(mocks: &[&Mock; 3]) -> [u64; 3] {
    [
        mocks[0].chat_requests().await,
        mocks[1].chat_requests().await,
        mocks[2].chat_requests().await,
    ]
}

async fn keys_expand_into_candidates_and_lower_tiers_wait_for_higher_ones(db: Db) {
    let (high, low) = (Mock::start(&[]), Mock::start(&[]));
    // Failures here are about fallback, not the breaker: keep every circuit closed.
    let gateway = start(
        &db,
        &[
            // One anonymous caller sends everything: key affinity would keep it on one key.
            ("ROUTING_KEY_AFFINITY_ENABLED", "0"),
            ("CIRCUIT_FAILURE_THRESHOLD", "100000"),
            ("CIRCUIT_MIN_AVAILABILITY", "0"),
        ],
    );
    let admin = Admin::of(&gateway);
    let provider = admin.provider("p", "openai_compat").await;
    let upstream_high = admin
        .upstream(
            &provider,
            &high,
            json!({"priority": 10, "lb_weight": 1.0}),
            &["m"],
        )
        .await;
    admin
        .upstream_key(&upstream_high, "key-heavy", Some(3.0))
        .await;
    // No key weight: the upstream's (1) applies.
    admin.upstream_key(&upstream_high, "key-light", None).await;
    admin
        .upstream(
            &provider,
            &low,
            json!({"priority": 0, "lb_weight": 100.0}),
            &["m"],
        )
        .await;
    admin
        .route(
            json!({"name": "three", "path_prefix": "/", "disable_auth": true, "max_attempts": 3}),
        )
        .await;
    admin
        .route(json!({"name": "two", "path_prefix": "/two", "disable_auth": true}))
        .await;
    served(&gateway, "/v1/chat/completions", Auth::None, "m").await;
    high.behave(json!({})).await;
    let base_high = credential_counts(&high).await;
    let base_low = low.chat_requests().await;

    // Two candidates from one upstream's two keys, weighted 3:1; the lower tier gets nothing
    // although its weight is 100.
    for _ in 0..400 {
        assert_eq!(
            chat(&gateway, "/v1/chat/completions", Auth::None, "m")
                .await
                .0,
            200
        );
    }
    let counts = credential_counts(&high).await;
    let heavy =
        counts["key-heavy"].as_u64().unwrap_or(0) - base_high["key-heavy"].as_u64().unwrap_or(0);
    let light =
        counts["key-light"].as_u64().unwrap_or(0) - base_high["key-light"].as_u64().unwrap_or(0);
    assert_eq!(heavy + light, 400);
    assert!(
        (260..=340).contains(&heavy),
        "3:1 split expected, got {heavy}:{light}"
    );
    assert_eq!(
        low.chat_requests().await,
        base_low,
        "lower tier used while the higher one served"
    );

    // One key rate-limited: it is quieted after its first 429 (for the answer's Retry-After), its
    // share goes to the other key of the same tier, never to the lower tier.
    high.behave(json!({"fail_credentials": {"key-heavy": 429}, "retry_after_seconds": 1}))
        .await;
    let before = credential_counts(&high).await;
    for _ in 0..40 {
        let (status, body) = chat(&gateway, "/v1/chat/completions", Auth::None, "m").await;
        assert_eq!(status, 200, "{body}");
    }
    let after = credential_counts(&high).await;
    let delta = |key: &str| after[key].as_u64().unwrap_or(0) - before[key].as_u64().unwrap_or(0);
    assert_eq!(delta("key-heavy"), 1, "asked once, then quieted: {after}");
    assert_eq!(delta("key-light"), 40);
    assert_eq!(
        low.chat_requests().await,
        base_low,
        "lower tier used while a higher key served"
    );
    // The quiet period ends by itself.
    high.behave(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let before = credential_counts(&high).await;
    for _ in 0..40 {
        assert_eq!(
            chat(&gateway, "/v1/chat/completions", Auth::None, "m")
                .await
                .0,
            200
        );
    }
    let after = credential_counts(&high).await;
    let delta = |key: &str| after[key].as_u64().unwrap_or(0) - before[key].as_u64().unwrap_or(0);
    assert!(delta("key-heavy") > 0, "the quieted key is back: {after}");

    // The whole higher tier fails: the lower tier serves, as the third attempt.
    high.behave(json!({"fail_status": 503})).await;
    let (status, body) = chat(&gateway, "/v1/chat/completions", Auth::None, "m").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(low.chat_requests().await, base_low + 1);

    // The same on a route with max_attempts 2: both tries go to the higher tier, and the request
    // fails with both attempts reported; the lower tier is left untried.
    let (status, body) = chat(&gateway, "/two/v1/chat/completions", Auth::None, "m").await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(
        body["error"]["attempts"].as_array().map(Vec::len),
        Some(2),
        "{body}"
    );
    let excluded = body["error"]["excluded"].to_string();
    assert!(excluded.contains("max_attempts (2) reached"), "{body}");
    assert_eq!(
        low.chat_requests().await,
        base_low + 1,
        "max_attempts exceeded"
    );
}

async fn models_list_aggregates_sorts_and_respects_groups(db: Db) {
    let (one, two, three) = (Mock::start(&[]), Mock::start(&[]), Mock::start(&[]));
    let gateway = Gateway::start_on(
        Some(&db.url()),
        &format!(
            "server:\n  admin_token: {TOKEN}\nmodels:\n  - id: mid\n    aliases: [mid-alias]\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
            one.base_url()
        ),
        &[("SWITCHYARD_DEFAULT_AUTH", "consumer_keys")],
    );
    let admin = Admin::of(&gateway);
    let provider = admin.provider("p", "openai_compat").await;
    admin
        .upstream(&provider, &one, json!({}), &["zeta", "alpha"])
        .await;
    admin
        .upstream(&provider, &two, json!({}), &["alpha", "beta"])
        .await;
    admin
        .upstream(&provider, &three, json!({"group": "g9"}), &["hidden"])
        .await;
    admin
        .route(json!({"name": "one-try", "path_prefix": "/", "max_attempts": 1}))
        .await;
    let (_, _, everyone) = admin.consumer("everyone", &[], &[]).await;
    let (_, _, g9) = admin.consumer("g9-only", &["g9"], &[]).await;
    known(&gateway, &[&everyone, &g9]).await;
    served(
        &gateway,
        "/v1/chat/completions",
        Auth::Bearer(&everyone),
        "zeta",
    )
    .await;
    let before = (
        one.stats().await["paths"].clone(),
        two.stats().await["paths"].clone(),
    );

    let expect = |ids: &[&str]| ids.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        models(&gateway, "/v1/models", Auth::Bearer(&everyone)).await,
        (200, expect(&["alpha", "beta", "mid", "mid-alias", "zeta"]))
    );
    assert_eq!(
        models(&gateway, "/v1/models", Auth::Bearer(&g9)).await,
        (200, expect(&["hidden"]))
    );
    assert_eq!(models(&gateway, "/v1/models", Auth::None).await.0, 401);
    // Answered locally: no upstream was asked for its list.
    assert_eq!(
        (
            one.stats().await["paths"].clone(),
            two.stats().await["paths"].clone()
        ),
        before
    );
}

async fn changes_reach_a_second_gateway_process_within_two_seconds(db: Db) {
    let mock = Mock::start(&[]);
    // Both processes share one database (on SQLite, one file).
    let url = db.url();
    let env = [
        ("ROUTING_AFFINITY_ENABLED", "0"),
        ("SWITCHYARD_DEFAULT_AUTH", "disabled"),
    ];
    let yaml = format!("server:\n  admin_token: {TOKEN}\n");
    let first = Gateway::start_on(Some(&url), &yaml, &env);
    let second = Gateway::start_on(Some(&url), &yaml, &env);
    let admin = Admin::of(&first);
    let provider = admin.provider("p", "openai_compat").await;
    let written = Instant::now();
    admin
        .upstream(&provider, &mock, json!({}), &["fresh"])
        .await;
    eventually(
        Duration::from_secs(2),
        "the second process serves the new model",
        || async {
            chat(&second, "/v1/chat/completions", Auth::None, "fresh")
                .await
                .0
                == 200
        },
    )
    .await;
    let took = written.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // A route added on the first process takes over paths on the second.
    admin
        .route(json!({"name": "locked", "path_prefix": "/", "legacy_bearer_auth_tokens": ["t"]}))
        .await;
    eventually(
        Duration::from_secs(2),
        "the second process enforces the new route",
        || async {
            chat(&second, "/v1/chat/completions", Auth::None, "fresh")
                .await
                .0
                == 401
        },
    )
    .await;
}

/// Restarts the machine's PostgreSQL while a gateway serves from it: requests keep being served
/// from the last good configuration, and changes flow again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_survives_a_postgres_restart() {
    let (_exclusive, _schema, mock, gateway) = restartable_postgres_gateway().await;
    let admin = Admin::of(&gateway);
    let provider = admin.provider("p", "openai_compat").await;
    admin
        .upstream(&provider, &mock, json!({}), &["before"])
        .await;
    served(&gateway, "/v1/chat/completions", Auth::None, "before").await;

    let restart = tokio::task::spawn_blocking(crate::harness::restart_postgres);
    // Requests during the restart are served from the snapshot in memory.
    let mut served_during = 0;
    while !restart.is_finished() {
        let (status, body) = chat(&gateway, "/v1/chat/completions", Auth::None, "before").await;
        assert_eq!(status, 200, "during the restart: {body}");
        served_during += 1;
    }
    restart.await.unwrap();
    assert!(served_during > 0);

    // The pool and the change feed reconnect: a new model shows up without a gateway restart.
    eventually(
        Duration::from_secs(20),
        "the admin API works again",
        || async {
            reqwest::Client::new()
                .get(gateway.url("/admin/providers"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;
    admin
        .upstream(&provider, &mock, json!({}), &["after"])
        .await;
    eventually(
        Duration::from_secs(10),
        "a change after the restart is served",
        || async {
            chat(&gateway, "/v1/chat/completions", Auth::None, "after")
                .await
                .0
                == 200
        },
    )
    .await;
    assert_eq!(
        chat(&gateway, "/v1/chat/completions", Auth::None, "before")
            .await
            .0,
        200
    );
}

/// A gateway on a schema of its own, for a test that restarts PostgreSQL: the guard keeps every
/// other test off the server until it is dropped.
async fn restartable_postgres_gateway() -> (
    tokio::sync::RwLockWriteGuard<'static, ()>,
    PgSchema,
    Mock,
    Gateway,
) {
    let exclusive = crate::harness::POSTGRES_IN_USE.write().await;
    let schema = PgSchema::create_unguarded().await;
    let mock = Mock::start(&[]);
    let gateway = Gateway::start_on(
        Some(&schema.url),
        &format!("server:\n  admin_token: {TOKEN}\n"),
        &[("SWITCHYARD_DEFAULT_AUTH", "disabled")],
    );
    (exclusive, schema, mock, gateway)
}

/// The request log's writer keeps its connection between flushes; after a PostgreSQL restart that
/// connection is dead, and the first batch after it is written on a fresh one rather than lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_logged_after_a_postgres_restart_is_kept() {
    let (_exclusive, _schema, mock, gateway) = restartable_postgres_gateway().await;
    let admin = Admin::of(&gateway);
    let provider = admin.provider("p", "openai_compat").await;
    admin.upstream(&provider, &mock, json!({}), &["m"]).await;
    served(&gateway, "/v1/chat/completions", Auth::None, "m").await;
    // Rows of model `m` in the log; `None` while the log cannot be read.
    let logged = || async {
        let (status, page) = crate::request_log::logs(&gateway, "?model=m").await;
        (status == 200).then(|| page["rows"].as_array().map_or(0, Vec::len))
    };
    eventually(Duration::from_secs(20), "the first row written", || async {
        logged().await >= Some(1)
    })
    .await;

    // No traffic during the restart: the writer's connection is not used until it is dead.
    tokio::task::spawn_blocking(crate::harness::restart_postgres)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the admin API works again",
        || async { logged().await.is_some() },
    )
    .await;
    let (status, body) = chat(&gateway, "/v1/chat/completions", Auth::None, "m").await;
    assert_eq!(status, 200, "{body}");
    eventually(
        Duration::from_secs(20),
        "the row after the restart",
        || async { logged().await >= Some(2) },
    )
    .await;
    let deep = gateway.deep(TOKEN).await;
    assert_eq!(
        deep["database"]["request_log"]["failed_rows"], 0,
        "{deep:#}"
    );
}

/// Routes declared in the YAML behave like database routes, and an open route on a non-loopback
/// address is warned about at startup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_routes_and_the_warning_for_open_non_loopback_serving() {
    let mock = Mock::start(&[]);
    let yaml = format!(
        "routes:\n  - name: open\n    path_prefix: /open\n    disable_auth: true\n  - name: locked\n    path_prefix: /\n    legacy_bearer_auth_tokens: [\"${{LOCKED_TOKEN}}\"]\n    groups: [gold]\nmodels:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n      - kind: anthropic\n        base_url: http://127.0.0.1:{}\n        group: gold\n",
        mock.base_url(),
        mock.port
    );
    let gateway = Gateway::start_with_env(&yaml, &[("LOCKED_TOKEN", "yaml-secret")]);
    assert_eq!(
        chat(&gateway, "/open/v1/chat/completions", Auth::None, "m")
            .await
            .0,
        200
    );
    // The open route is unrestricted: the default group, the OpenAI-protocol route.
    assert_eq!(mock.stats().await["last_path"], "/v1/chat/completions");
    assert_eq!(
        chat(&gateway, "/v1/chat/completions", Auth::None, "m")
            .await
            .0,
        401
    );
    assert_eq!(
        chat(
            &gateway,
            "/v1/chat/completions",
            Auth::Bearer("yaml-secret"),
            "m"
        )
        .await
        .0,
        200
    );
    // The locked route only reaches the gold group: the Anthropic route.
    assert_eq!(mock.stats().await["last_path"], "/v1/messages");
    assert!(
        !gateway.log().contains("not a loopback address"),
        "loopback serving warned"
    );
    drop(gateway);

    let dir = tempfile::tempdir().unwrap();
    let config = crate::harness::write_config(dir.path(), &yaml);
    let out = std::process::Command::new(crate::harness::binary())
        .args(["serve", "--listen", "0.0.0.0:0", "--config"])
        .arg(&config)
        .env("LOCKED_TOKEN", "yaml-secret")
        .env(
            "SWITCHYARD_BUILTIN_STRATEGIES",
            crate::harness::target_dir().join("strategies"),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once it announces its address it has warned (the warnings come first); then stop it and
    // read what it logged. A loaded machine may take seconds to get there: no fixed sleep.
    let mut out = out;
    let mut announced = String::new();
    if let Some(stdout) = out.stdout.take() {
        use std::io::BufRead;
        let _ = std::io::BufReader::new(stdout).read_line(&mut announced);
    }
    assert!(announced.contains("listening on"), "{announced:?}");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &out.id().to_string()])
        .status();
    let output = out.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(
        log.contains("serving without authentication") && log.contains("route=open"),
        "{log}"
    );
    assert!(!log.contains("yaml-secret"), "{log}");
}
