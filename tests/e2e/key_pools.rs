//! Upstream key pools against real mock upstreams that reject keys on command: reservations by
//! role, quieting with Retry-After, key affinity, exhaustion and the breaker, reservations by hash
//! and strictest-wins. The gateway's log and admin answers never contain a secret.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Gateway, Mock};
use crate::routes::{Admin, Auth, TOKEN, chat, credential_counts, eventually, known, served};

const FREE: &str = "sk-free-shared-1";
const FREE_2: &str = "sk-free-shared-2";
const PRO: &str = "sk-pro-reserved";
const INTERNAL: &str = "sk-internal-reserved";

/// A gateway whose model `m` has one YAML route with four keys: two shared, one for `pro` and
/// above, one for `internal` and above. Routes: `/` (consumer keys) and `/open` (no identity).
fn pool_gateway(mock: &Mock, env: &[(&str, &str)]) -> Gateway {
    let yaml = format!(
        "server:\n  admin_token: {TOKEN}\nroutes:\n  - name: keys\n    path_prefix: /\n  - name: open\n    path_prefix: /open\n    disable_auth: true\nmodels:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n        api_key: {FREE}\n        api_keys:\n          - {{key: {PRO}, min_role: pro}}\n          - {{key: {INTERNAL}, min_role: internal}}\n          - {FREE_2}\n",
        mock.base_url()
    );
    let mut all = vec![("ROUTING_AFFINITY_ENABLED", "0")];
    all.extend_from_slice(env);
    Gateway::start_with_env(&yaml, &all)
}

async fn consumer(admin: &Admin, name: &str, role: &str) -> String {
    let consumer = crate::routes::id(
        admin
            .post("/admin/consumers", json!({"name": name, "role": role}))
            .await,
    );
    let key = admin
        .post(&format!("/admin/consumers/{consumer}/keys"), json!({}))
        .await;
    key["secret"].as_str().unwrap().to_owned()
}

/// Which upstream key served each of `n` requests of `caller` (by the mock's per-key counts).
async fn keys_used(
    gateway: &Gateway,
    mock: &Mock,
    path: &str,
    caller: Auth<'_>,
    n: usize,
) -> Vec<(String, u64)> {
    let before = credential_counts(mock).await;
    for _ in 0..n {
        let (status, body) = chat(gateway, path, caller, "m").await;
        assert_eq!(status, 200, "{body}");
    }
    let after = credential_counts(mock).await;
    let mut used: Vec<(String, u64)> = after
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    used.sort();
    used
}

fn only(key: &str, n: u64) -> Vec<(String, u64)> {
    vec![(key.to_owned(), n)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_order_keys_by_tier_and_quieting_ends_by_itself() {
    let mock = Mock::start(&[]);
    let gateway = pool_gateway(&mock, &[]);
    let admin = Admin::of(&gateway);
    let free = consumer(&admin, "free-user", "free").await;
    let pro = consumer(&admin, "pro-user", "pro").await;
    let internal = consumer(&admin, "internal-user", "internal").await;
    known(&gateway, &[&free, &pro, &internal]).await;
    served(&gateway, "/v1/chat/completions", Auth::Bearer(&free), "m").await;

    // Each tier drains the most reserved key it may use; a free caller never sees reserved keys.
    let path = "/v1/chat/completions";
    assert_eq!(
        keys_used(&gateway, &mock, path, Auth::Bearer(&free), 5).await,
        only(FREE, 5)
    );
    assert_eq!(
        keys_used(&gateway, &mock, path, Auth::Bearer(&pro), 5).await,
        only(PRO, 5)
    );
    assert_eq!(
        keys_used(&gateway, &mock, path, Auth::Bearer(&internal), 5).await,
        only(INTERNAL, 5)
    );
    // No user identity: unrestricted, so the most reserved key of all.
    assert_eq!(
        keys_used(&gateway, &mock, "/open/v1/chat/completions", Auth::None, 3).await,
        only(INTERNAL, 3)
    );

    // The internal key is rate-limited for 1 s: the internal caller falls back to the next most
    // reserved key it may use (pro), after one 429.
    mock.behave(json!({"fail_credentials": {INTERNAL: 429}, "retry_after_seconds": 1}))
        .await;
    let used = keys_used(&gateway, &mock, path, Auth::Bearer(&internal), 6).await;
    assert_eq!(
        used,
        vec![(INTERNAL.to_owned(), 1), (PRO.to_owned(), 6)],
        "one 429, then the pro key"
    );
    mock.behave(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        keys_used(&gateway, &mock, path, Auth::Bearer(&internal), 3).await,
        only(INTERNAL, 3),
        "back after Retry-After"
    );

    // A quieted shared key falls back only to the other shared key for a free caller.
    mock.behave(json!({"fail_credentials": {FREE: 429}, "retry_after_seconds": 30}))
        .await;
    let used = keys_used(&gateway, &mock, path, Auth::Bearer(&free), 6).await;
    assert_eq!(used, vec![(FREE.to_owned(), 1), (FREE_2.to_owned(), 6)]);
    let listing = admin
        .call(reqwest::Method::GET, "/admin/provider-keys", None)
        .await;
    let quieted: Vec<&Value> = listing["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| !k["quieted"].is_null())
        .collect();
    assert_eq!(quieted.len(), 1, "{listing}");
    assert_eq!(quieted[0]["quieted"]["status"], 429);

    let log = gateway.log();
    for secret in [FREE, FREE_2, PRO, INTERNAL, &free, &pro, &internal] {
        assert!(!log.contains(secret), "a secret reached the log");
        assert!(
            !listing.to_string().contains(secret),
            "a secret in the listing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_affinity_survives_traffic_and_quiet_periods_and_drops_on_declaration_changes() {
    let mock = Mock::start(&[]);
    let gateway = Gateway::start_with_env(
        &format!("server:\n  admin_token: {TOKEN}\n"),
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("SWITCHYARD_DEFAULT_AUTH", "consumer_keys"),
        ],
    );
    let admin = Admin::of(&gateway);
    let provider = admin.provider("p", "openai_compat").await;
    let upstream = admin.upstream(&provider, &mock, json!({}), &["m"]).await;
    admin.upstream_key(&upstream, "sk-db-a", None).await;
    admin.upstream_key(&upstream, "sk-db-b", None).await;
    let free = consumer(&admin, "free-user", "free").await;
    let pro = consumer(&admin, "pro-user", "pro").await;
    known(&gateway, &[&free, &pro]).await;
    // Waited for as the admin: a caller of its own, so the test callers have no binding yet.
    served(&gateway, "/v1/chat/completions", Auth::Bearer(TOKEN), "m").await;
    let path = "/v1/chat/completions";

    // Both callers' first choice is key a (declaration order); while a is rate-limited they are
    // served by b and get bound to it.
    mock.behave(json!({"fail_credentials": {"sk-db-a": 429}, "retry_after_seconds": 1}))
        .await;
    for caller in [&free, &pro] {
        let used = keys_used(&gateway, &mock, path, Auth::Bearer(caller), 1).await;
        assert!(used.contains(&("sk-db-b".to_owned(), 1)), "{used:?}");
    }
    mock.behave(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Key a is back, but ordinary traffic does not move a bound caller: prompt caches stay warm.
    for caller in [&free, &pro] {
        assert_eq!(
            keys_used(&gateway, &mock, path, Auth::Bearer(caller), 5).await,
            only("sk-db-b", 5)
        );
    }
    // A quiet period of the bound key is walked around, and the binding survives it.
    mock.behave(json!({"fail_credentials": {"sk-db-b": 429}, "retry_after_seconds": 1}))
        .await;
    let used = keys_used(&gateway, &mock, path, Auth::Bearer(&free), 3).await;
    assert_eq!(
        used,
        vec![("sk-db-a".to_owned(), 3), ("sk-db-b".to_owned(), 1)]
    );
    mock.behave(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        keys_used(&gateway, &mock, path, Auth::Bearer(&free), 3).await,
        only("sk-db-b", 3),
        "back on its key after the quiet period"
    );

    // A pro-reserved key is added: the pro caller's preferred key changes, so its binding is
    // dropped and it moves to the reserved key; the free caller's preferred key is the same, so
    // it stays where it is.
    admin
        .post(
            "/admin/provider-keys",
            json!({"upstream_id": upstream, "secret": "sk-db-pro", "min_role": "pro"}),
        )
        .await;
    eventually(Duration::from_secs(10), "the pro caller moves", || async {
        let used = keys_used(&gateway, &mock, path, Auth::Bearer(&pro), 1).await;
        used == only("sk-db-pro", 1)
    })
    .await;
    assert_eq!(
        keys_used(&gateway, &mock, path, Auth::Bearer(&free), 3).await,
        only("sk-db-b", 3)
    );
    assert!(
        gateway.log().contains("key bindings dropped"),
        "the drop is logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_restricted_pools_do_not_open_the_breaker_but_exhausted_ones_do() {
    let (reserved, shared) = (Mock::start(&[]), Mock::start(&[]));
    let yaml = format!(
        "server:\n  admin_token: {TOKEN}\nmodels:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n        priority: 1\n        api_keys: [{{key: sk-only-pro, min_role: pro}}]\n      - kind: openai_compat\n        base_url: http://localhost:{}/v1\n        api_key: sk-shared\n",
        reserved.base_url(),
        shared.port
    );
    let gateway = Gateway::start_with_env(
        &yaml,
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("SWITCHYARD_DEFAULT_AUTH", "consumer_keys"),
            ("CIRCUIT_FAILURE_THRESHOLD", "2"),
        ],
    );
    let admin = Admin::of(&gateway);
    let free = consumer(&admin, "free-user", "free").await;
    let pro = consumer(&admin, "pro-user", "pro").await;
    known(&gateway, &[&free, &pro]).await;
    served(&gateway, "/v1/chat/completions", Auth::Bearer(&pro), "m").await;
    let reserved_endpoint = format!("local-{}", reserved.port);
    let circuit = || async {
        let routing: Value = reqwest::Client::new()
            .get(gateway.url("/routing"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let route = routing["models"][0]["routes"]
            .as_array()
            .and_then(|routes| {
                routes
                    .iter()
                    .find(|r| {
                        r["endpoint_id"]
                            .as_str()
                            .is_some_and(|id| id.ends_with(&reserved_endpoint))
                    })
                    .cloned()
            })
            .unwrap_or_else(|| panic!("{routing}"));
        (
            route["circuit"].to_string(),
            route["availability"].as_f64().unwrap_or(-1.0),
        )
    };
    let before = circuit().await;

    // A burst of free traffic: the reserved pool is invisible to it (KeyPoolRoleRestricted), so it
    // goes to the shared route and the reserved endpoint's health does not move.
    let shared_before = shared.chat_requests().await;
    for _ in 0..20 {
        let (status, body) = chat(&gateway, "/v1/chat/completions", Auth::Bearer(&free), "m").await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(shared.chat_requests().await, shared_before + 20);
    assert_eq!(
        circuit().await,
        before,
        "role-restricted traffic touched the breaker"
    );
    // The high tier keeps being served by its reserved key.
    assert_eq!(
        keys_used(
            &gateway,
            &reserved,
            "/v1/chat/completions",
            Auth::Bearer(&pro),
            3
        )
        .await,
        only("sk-only-pro", 3)
    );

    // The only key is rate-limited for a minute: each pro request now finds the pool exhausted,
    // which counts as a failure of the endpoint; two open the breaker (threshold 2).
    reserved
        .behave(json!({"fail_credentials": {"sk-only-pro": 429}, "retry_after_seconds": 60}))
        .await;
    for _ in 0..3 {
        let (status, body) = chat(&gateway, "/v1/chat/completions", Auth::Bearer(&pro), "m").await;
        assert_eq!(status, 200, "served by the fallback: {body}");
    }
    assert_eq!(circuit().await.0, "\"open\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_by_hash_survive_the_key_leaving_and_the_strictest_declaration_wins() {
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("shared.db").display());
    let with_key = format!(
        "server:\n  admin_token: {TOKEN}\nmodels:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: {}\n        api_keys: [\"${{ENV_KEY}}\", sk-other]\n",
        mock.base_url()
    );
    let env = [
        ("ROUTING_AFFINITY_ENABLED", "0"),
        ("ROUTING_KEY_AFFINITY_ENABLED", "0"),
        ("SWITCHYARD_DEFAULT_AUTH", "consumer_keys"),
        ("ENV_KEY", "sk-from-env"),
    ];
    let gateway = Gateway::start_on(Some(&db), &with_key, &env);
    let admin = Admin::of(&gateway);
    let free = consumer(&admin, "free-user", "free").await;
    let pro = consumer(&admin, "pro-user", "pro").await;
    known(&gateway, &[&free, &pro]).await;
    served(&gateway, "/v1/chat/completions", Auth::Bearer(&free), "m").await;
    let path = "/v1/chat/completions";
    // Reserve the environment key by value (only its hash is stored).
    let reservation = admin
        .post(
            "/admin/provider-keys/min-role-env",
            json!({"key": "sk-from-env", "min_role": "pro"}),
        )
        .await;
    assert!(!reservation.to_string().contains("sk-from-env"));
    let hash = reservation["key_hash"].as_str().unwrap().to_owned();
    eventually(
        Duration::from_secs(3),
        "the reservation applies",
        || async {
            keys_used(&gateway, &mock, path, Auth::Bearer(&free), 4).await == only("sk-other", 4)
        },
    )
    .await;
    assert_eq!(
        keys_used(&gateway, &mock, path, Auth::Bearer(&pro), 2).await,
        only("sk-from-env", 2)
    );
    drop(gateway);

    // The key leaves the configuration: the reservation stays, listed as not configured.
    let without_key = with_key.replace("\"${ENV_KEY}\", ", "");
    let gateway = Gateway::start_on(Some(&db), &without_key, &env);
    let admin = Admin::of(&gateway);
    let listing = admin
        .call(reqwest::Method::GET, "/admin/provider-keys", None)
        .await;
    let entry = listing["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key_hash"] == hash.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(
        (entry["configured"].clone(), entry["min_role"].clone()),
        (json!(false), json!("pro"))
    );
    drop(gateway);

    // It comes back, and so does the reservation. The same credential is also declared in the
    // YAML a second time as `internal`: the strictest declaration wins, whatever the order.
    let stricter = with_key.replace(
        "api_keys: [\"${ENV_KEY}\", sk-other]",
        "api_keys: [\"${ENV_KEY}\", sk-other, {key: \"${ENV_KEY}\", min_role: internal}]",
    );
    let gateway = Gateway::start_on(Some(&db), &stricter, &env);
    served(&gateway, path, Auth::Bearer(&free), "m").await;
    assert_eq!(
        keys_used(&gateway, &mock, path, Auth::Bearer(&pro), 3).await,
        only("sk-other", 3),
        "internal wins over pro"
    );
    let admin = Admin::of(&gateway);
    let listing = admin
        .call(reqwest::Method::GET, "/admin/provider-keys", None)
        .await;
    let key = listing["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key_hash"] == hash.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(key["min_role"], "internal", "{listing}");
    assert!(!listing.to_string().contains("sk-from-env"));
    // `free` removes the reservation.
    let status = reqwest::Client::new()
        .post(gateway.url("/admin/provider-keys/min-role-env"))
        .bearer_auth(TOKEN)
        .json(&json!({"key_hash": hash, "min_role": "free"}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 204);
    assert!(!gateway.log().contains("sk-from-env"));
}
