//! One behaviour suite for [`ConfigStore`], run against SQLite (a file in a temporary folder) and
//! against the machine's PostgreSQL (a fresh schema per test, dropped afterwards).
//!
//! PostgreSQL is expected at `postgres://postgres@127.0.0.1:5432/test` (override with
//! `SWITCHYARD_TEST_PG_URL`). When it is unreachable the PostgreSQL tests fail, saying so: CI starts
//! it, and a suite that skips silently would let the PostgreSQL backend rot.

use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::entity::*;

const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A database for one test: a SQLite file or a PostgreSQL schema, removed on drop.
pub(crate) struct TestDb {
    pub url: String,
    pub store: Store,
    _dir: Option<tempfile::TempDir>,
    schema: Option<PgSchema>,
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("switchyard.db").display());
        let store = Store::open(&url).await.unwrap();
        TestDb {
            url,
            store,
            _dir: Some(dir),
            schema: None,
        }
    }

    pub async fn postgres() -> TestDb {
        let schema = PgSchema::create().await;
        let url = schema.url.clone();
        let store = Store::open(&url).await.unwrap();
        TestDb {
            url,
            store,
            _dir: None,
            schema: Some(schema),
        }
    }

    /// Another store on the same database, as a second gateway process would have.
    pub async fn open_another(&self) -> Store {
        Store::open(&self.url).await.unwrap()
    }

    pub fn is_postgres(&self) -> bool {
        self.schema.is_some()
    }
}

/// A schema `sy_test_<random>` in the test database, dropped (with everything in it) on drop.
pub(crate) struct PgSchema {
    base: String,
    name: String,
    pub url: String,
}

impl PgSchema {
    pub async fn create() -> PgSchema {
        let base =
            std::env::var("SWITCHYARD_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_owned());
        let name = generate_id("sy_test");
        let mut conn = connect(&base).await;
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{name}");
        PgSchema { base, name, url }
    }
}

async fn connect(url: &str) -> sqlx::PgConnection {
    use sqlx::Connection;
    match tokio::time::timeout(Duration::from_secs(10), sqlx::PgConnection::connect(url)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => panic!(
            "PostgreSQL is unreachable at {url}: {e}\nThese tests need it (CI starts it). Start it with \
             `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or point \
             SWITCHYARD_TEST_PG_URL at another server."
        ),
        Err(_) => panic!("PostgreSQL at {url} did not answer within 10 s"),
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime, which cannot be blocked on; a thread with its own
        // runtime does the cleanup.
        let (base, name) = (self.base.clone(), self.name.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                use sqlx::Connection;
                if let Ok(mut conn) = sqlx::PgConnection::connect(&base).await {
                    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                        .execute(&mut conn)
                        .await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

fn route(name: &str, prefix: &str) -> NewRoute {
    serde_json::from_value(json!({ "name": name, "path_prefix": prefix })).unwrap()
}

fn patch<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>, expected_field: &str) {
    match result {
        Err(StoreError::Invalid { field, .. }) if field == expected_field => {}
        other => panic!("expected Invalid {{ field: {expected_field} }}, got {other:?}"),
    }
}

#[track_caller]
fn assert_conflict<T: std::fmt::Debug>(result: Result<T, StoreError>) -> String {
    match result {
        Err(e @ StoreError::Conflict { .. }) => e.to_string(),
        other => panic!("expected Conflict, got {other:?}"),
    }
}

#[track_caller]
fn assert_not_found<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    match result {
        Err(StoreError::NotFound { .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
}

/// Waits up to `within` for `check` to hold.
async fn eventually(within: Duration, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn raw_text(db: &TestDb, sql: &str) -> Vec<String> {
    match db.store.pool() {
        Pool::Sqlite(p) => sqlx::query_scalar(sql).fetch_all(p).await.unwrap(),
        Pool::Postgres(p) => sqlx::query_scalar(sql).fetch_all(p).await.unwrap(),
    }
}

// ---------------------------------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------------------------------

async fn routes_round_trip(db: &TestDb) {
    let s = db.store.config();
    let created = s.create_route(route("chat", "/v1/chat")).await.unwrap();
    assert!(created.id.starts_with("rt_"));
    assert_eq!(created.tenant_id, "default");
    assert_eq!(created.max_attempts, 2);
    assert_eq!(
        created.protocol_transformation_type,
        ProtocolTransformation::IfDifferentProtocol
    );
    assert_eq!(created.metadata, json!({}));
    assert!(created.enabled());
    assert_eq!(s.get_route(&created.id).await.unwrap(), created);

    let full: NewRoute = serde_json::from_value(json!({
        "tenant_id": "acme", "name": "full", "path_prefix": "/acme",
        "disable_auth": true, "passthrough_auth_token": true,
        "protocol_transformation_type": "never",
        "groups": ["g1", "g2"], "labels": {"team": "ml"},
        "metadata": {"nested": [1, {"a": null}]}, "max_attempts": 5,
    }))
    .unwrap();
    let full = s.create_route(full).await.unwrap();
    assert_eq!(s.get_route(&full.id).await.unwrap(), full);
    let listed = s.list_routes().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&created) && listed.contains(&full));

    let updated = s
        .update_route(
            &created.id,
            patch(json!({"name": "renamed", "labels": {"k": "v"}, "disabled": true})),
        )
        .await
        .unwrap();
    assert_eq!(updated.name, "renamed");
    assert_eq!(updated.path_prefix, "/v1/chat", "untouched fields stay");
    assert!(updated.disabled_at.is_some());
    assert_eq!(s.get_route(&created.id).await.unwrap(), updated);

    s.delete_route(&created.id).await.unwrap();
    assert_not_found(s.get_route(&created.id).await);
    assert_not_found(s.delete_route(&created.id).await);
    assert_not_found(s.update_route("rt_nope", RoutePatch::default()).await);
}

async fn route_constraints(db: &TestDb) {
    let s = db.store.config();
    assert_invalid(s.create_route(route("r", "v1")).await, "path_prefix");
    assert_invalid(s.create_route(route("", "/x")).await, "name");
    let mut bad = route("r", "/x");
    bad.max_attempts = 0;
    assert_invalid(s.create_route(bad).await, "max_attempts");
    let mut bad = route("r", "/x");
    bad.groups = vec!["ok".into(), " ".into()];
    assert_invalid(s.create_route(bad).await, "groups[1]");
    let mut bad = route("r", "/x");
    bad.metadata = json!([1]);
    assert_invalid(s.create_route(bad).await, "metadata");

    let a = s.create_route(route("a", "/same")).await.unwrap();
    let message = assert_conflict(s.create_route(route("b", "/same")).await);
    assert!(message.starts_with("path_prefix:"), "{message}");
    // A disabled route may share the prefix, but cannot be enabled while the other is.
    let mut disabled = route("b", "/same");
    disabled.disabled = true;
    let b = s.create_route(disabled).await.unwrap();
    assert_conflict(
        s.update_route(&b.id, patch(json!({"disabled": false})))
            .await,
    );
    s.update_route(&a.id, patch(json!({"disabled": true})))
        .await
        .unwrap();
    s.update_route(&b.id, patch(json!({"disabled": false})))
        .await
        .unwrap();
    // Moving a route onto a taken prefix is a conflict too; failed writes change nothing.
    let c = s.create_route(route("c", "/other")).await.unwrap();
    assert_conflict(
        s.update_route(&c.id, patch(json!({"path_prefix": "/same"})))
            .await,
    );
    assert_eq!(s.get_route(&c.id).await.unwrap(), c);
}

async fn legacy_tokens_are_stored_hashed(db: &TestDb) {
    let s = db.store.config();
    let mut new = route("legacy", "/legacy");
    new.legacy_bearer_auth_tokens = vec!["legacy-token-0123456789".into()];
    let r = s.create_route(new).await.unwrap();
    let shown = serde_json::to_value(&r).unwrap();
    assert_eq!(shown["legacy_bearer_auth_tokens"], json!(["legac…89"]));
    let stored = raw_text(db, "SELECT legacy_bearer_auth_tokens FROM routes").await;
    assert!(!stored[0].contains("legacy-token-0123456789"), "{stored:?}");
    let r = s.get_route(&r.id).await.unwrap();
    assert!(r.accepts_legacy_token("legacy-token-0123456789"));
    assert!(!r.accepts_legacy_token("legacy-token-0123456788"));
    assert_invalid(
        s.update_route(
            &r.id,
            patch(json!({"legacy_bearer_auth_tokens": ["ok-token", "with space"]})),
        )
        .await,
        "legacy_bearer_auth_tokens[1]",
    );
}

async fn plugin_configs(db: &TestDb) {
    let s = db.store.config();
    let r = s.create_route(route("r", "/r")).await.unwrap();
    let new = |plugin: &str, config: serde_json::Value| -> NewPluginConfig {
        serde_json::from_value(json!({"plugin": plugin, "config": config})).unwrap()
    };
    let limits = json!({"limits": [{"scope": "consumer", "requests_per_minute": 60}]});
    let limit = s
        .create_plugin_config(&r.id, new("rate-limit", limits.clone()))
        .await
        .unwrap();
    let cache = s
        .create_plugin_config(&r.id, new("cache", json!({"ttl": 5})))
        .await
        .unwrap();
    assert!(limit.enabled);
    assert_eq!(s.get_plugin_config(&r.id, &limit.id).await.unwrap(), limit);
    let listed = s.list_plugin_configs(&r.id).await.unwrap();
    assert_eq!(
        listed,
        vec![cache.clone(), limit.clone()],
        "ordered by plugin"
    );
    assert_conflict(s.create_plugin_config(&r.id, new("cache", json!({}))).await);
    assert_invalid(
        s.create_plugin_config(&r.id, new("x", json!([1]))).await,
        "config",
    );
    // A plugin the gateway runs checks its config.
    let fresh = s.create_route(route("fresh", "/fresh")).await.unwrap();
    assert_invalid(
        s.create_plugin_config(
            &fresh.id,
            new(
                "rate-limit",
                json!({"limits": [{"scope": "route", "requests_per_minute": 0}]}),
            ),
        )
        .await,
        "config.limits[0].requests_per_minute",
    );
    assert_invalid(
        s.update_plugin_config(&r.id, &limit.id, patch(json!({"config": {"rpm": 60}})))
            .await,
        "config.rpm",
    );
    assert_invalid(
        s.create_plugin_config(&r.id, new("has space", json!({})))
            .await,
        "plugin",
    );
    assert_not_found(
        s.create_plugin_config("rt_nope", new("cache", json!({})))
            .await,
    );
    assert_not_found(s.list_plugin_configs("rt_nope").await);
    // A plugin config is reachable only under its own route.
    let other = s.create_route(route("o", "/o")).await.unwrap();
    assert_not_found(s.get_plugin_config(&other.id, &limit.id).await);

    s.update_plugin_config(&r.id, &cache.id, patch(json!({"enabled": false})))
        .await
        .unwrap();
    let aggregated = s.route_plugins(&r.id).await.unwrap();
    assert_eq!(
        serde_json::to_value(&aggregated).unwrap(),
        json!({"rate-limit": limits})
    );
    let snapshot = s.load_snapshot().await.unwrap();
    assert_eq!(
        snapshot.route_plugin_map(&r.id),
        [("rate-limit", &limits)].into_iter().collect()
    );

    s.delete_plugin_config(&r.id, &limit.id).await.unwrap();
    assert_not_found(s.delete_plugin_config(&r.id, &limit.id).await);
    s.delete_route(&r.id).await.unwrap();
    assert_eq!(s.load_snapshot().await.unwrap().counts().plugin_configs, 0);
}

async fn consumers_and_keys(db: &TestDb) {
    let s = db.store.config();
    let c: NewConsumer =
        serde_json::from_value(json!({"name": "alice", "role": "superuser", "groups": ["a"]}))
            .unwrap();
    let alice = s.create_consumer(c).await.unwrap();
    assert_eq!(alice.role, Role::Free, "unknown roles are free");
    assert_eq!(s.get_consumer(&alice.id).await.unwrap(), alice);
    assert_conflict(
        s.create_consumer(serde_json::from_value(json!({"name": "alice"})).unwrap())
            .await,
    );
    let alice = s
        .update_consumer(&alice.id, patch(json!({"role": "admin"})))
        .await
        .unwrap();
    assert_eq!(alice.role, Role::Admin);

    let created = s
        .create_consumer_key(&alice.id, NewConsumerKey::default())
        .await
        .unwrap();
    let secret = created.secret.clone();
    assert!(secret.starts_with("sk-sy-"));
    assert_eq!(created.key.prefix, &secret[..8]);
    let shown = serde_json::to_value(&created).unwrap();
    assert_eq!(shown["secret"], json!(secret));
    assert!(shown.get("key_hash").is_none());
    // Only the hash is stored, and nothing returned later carries the secret.
    let stored = raw_text(db, "SELECT key_hash FROM consumer_api_keys").await;
    assert_eq!(stored, vec![hash_secret(&secret)]);
    let listed = serde_json::to_string(&s.list_consumer_keys(&alice.id).await.unwrap()).unwrap();
    assert!(
        !listed.contains(&secret[6..]) && !listed.contains("secret"),
        "{listed}"
    );

    let (consumer, key) = s.find_consumer_key(&secret).await.unwrap().unwrap();
    assert_eq!(
        (consumer.id.as_str(), key.id.as_str()),
        (alice.id.as_str(), created.key.id.as_str())
    );
    assert!(s.find_consumer_key("sk-sy-wrong").await.unwrap().is_none());

    let snapshot = s.load_snapshot().await.unwrap();
    let now = now();
    let auth = snapshot.authenticate(&secret, now).unwrap();
    assert_eq!(auth.consumer.role, Role::Admin);

    // Expiry and revocation.
    assert_invalid(
        s.create_consumer_key(
            &alice.id,
            NewConsumerKey {
                groups: vec![],
                expires_at: Some(now - 1),
            },
        )
        .await,
        "expires_at",
    );
    let expiring = s
        .create_consumer_key(
            &alice.id,
            NewConsumerKey {
                groups: vec!["g".into()],
                expires_at: Some(now + 3600),
            },
        )
        .await
        .unwrap();
    s.update_consumer_key(
        &alice.id,
        &expiring.key.id,
        patch(json!({"expires_at": now - 10})),
    )
    .await
    .unwrap();
    let revoked = s
        .update_consumer_key(&alice.id, &created.key.id, patch(json!({"revoked": true})))
        .await
        .unwrap();
    assert!(revoked.revoked_at.is_some());
    assert_invalid(
        s.update_consumer_key(&alice.id, &created.key.id, patch(json!({"revoked": false})))
            .await,
        "revoked",
    );
    let snapshot = s.load_snapshot().await.unwrap();
    assert_eq!(
        snapshot.authenticate(&secret, now).unwrap_err(),
        KeyRejection::Revoked
    );
    assert_eq!(
        snapshot.authenticate(&expiring.secret, now).unwrap_err(),
        KeyRejection::Expired
    );
    s.update_consumer_key(
        &alice.id,
        &expiring.key.id,
        patch(json!({"expires_at": null})),
    )
    .await
    .unwrap();
    s.update_consumer(&alice.id, patch(json!({"disabled": true})))
        .await
        .unwrap();
    let snapshot = s.load_snapshot().await.unwrap();
    assert_eq!(
        snapshot.authenticate(&expiring.secret, now).unwrap_err(),
        KeyRejection::ConsumerDisabled
    );

    // Keys live under their consumer only; deleting the consumer deletes them.
    let bob = s
        .create_consumer(serde_json::from_value(json!({"name": "bob"})).unwrap())
        .await
        .unwrap();
    assert_not_found(s.get_consumer_key(&bob.id, &expiring.key.id).await);
    assert_not_found(s.list_consumer_keys("cs_nope").await);
    s.delete_consumer(&alice.id).await.unwrap();
    assert!(
        s.find_consumer_key(&expiring.secret)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(s.load_snapshot().await.unwrap().counts().consumer_keys, 0);
}

async fn providers_upstreams_and_models(db: &TestDb) {
    let s = db.store.config();
    let provider = |name: &str, protocol: &str| -> NewProvider {
        serde_json::from_value(json!({"name": name, "protocol": protocol})).unwrap()
    };
    let openai = s
        .create_provider(provider("openai", "openai_compat"))
        .await
        .unwrap();
    assert_eq!(
        openai.default_capabilities,
        vec![
            Capability::ChatCompletions,
            Capability::Responses,
            Capability::Messages,
            Capability::Embeddings
        ]
    );
    let claude = s
        .create_provider(provider("claude", "anthropic"))
        .await
        .unwrap();
    assert_eq!(
        claude.default_capabilities,
        vec![
            Capability::ChatCompletions,
            Capability::Responses,
            Capability::Messages
        ]
    );
    assert_conflict(s.create_provider(provider("openai", "anthropic")).await);
    assert_eq!(s.get_provider(&openai.id).await.unwrap(), openai);

    let upstream = |provider_id: &str, url: &str, priority: i64| -> NewUpstream {
        serde_json::from_value(
            json!({"provider_id": provider_id, "base_url": url, "priority": priority}),
        )
        .unwrap()
    };
    assert_invalid(
        s.create_upstream(upstream("pv_nope", "http://a/v1", 0))
            .await,
        "provider_id",
    );
    assert_invalid(
        s.create_upstream(upstream(&openai.id, "ftp://a", 0)).await,
        "base_url",
    );
    let low = s
        .create_upstream(upstream(&openai.id, "http://127.0.0.1:9001/v1", 1))
        .await
        .unwrap();
    assert_eq!(
        (low.group.as_str(), low.lb_weight, low.enabled),
        ("default", 1.0, true)
    );
    let high = s
        .create_upstream(upstream(&claude.id, "https://api.example.com", 10))
        .await
        .unwrap();
    let high = s
        .update_upstream(
            &high.id,
            patch(json!({"capabilities": ["messages", "chat_completions"], "group": "eu"})),
        )
        .await
        .unwrap();
    assert_eq!(s.get_upstream(&high.id).await.unwrap(), high);
    assert_invalid(
        s.update_upstream(&high.id, patch(json!({"lb_weight": -1.0})))
            .await,
        "lb_weight",
    );
    // Stream deadlines: stored, cleared with `null`, and never 0.
    let deadlines = |u: &Upstream| {
        (
            u.first_token_timeout_seconds,
            u.idle_timeout_seconds,
            u.stream_timeout_seconds,
        )
    };
    assert_eq!(deadlines(&high), (None, None, None));
    let high = s
        .update_upstream(
            &high.id,
            patch(json!({"first_token_timeout_seconds": 1.5, "stream_timeout_seconds": 600})),
        )
        .await
        .unwrap();
    assert_eq!(deadlines(&high), (Some(1.5), None, Some(600.0)));
    assert_eq!(s.get_upstream(&high.id).await.unwrap(), high);
    let high = s
        .update_upstream(&high.id, patch(json!({"stream_timeout_seconds": null})))
        .await
        .unwrap();
    assert_eq!(deadlines(&high), (Some(1.5), None, None));
    assert_invalid(
        s.update_upstream(&high.id, patch(json!({"idle_timeout_seconds": 0})))
            .await,
        "idle_timeout_seconds",
    );

    // Keys: stored in full (they are sent upstream), masked whenever shown.
    let key: NewUpstreamKey = serde_json::from_value(
        json!({"secret": "sk-upstream-secret-value-xyz", "min_role": "pro", "lb_weight": 2.0}),
    )
    .unwrap();
    let key = s.create_upstream_key(&low.id, key).await.unwrap();
    assert_eq!(key.secret.expose(), "sk-upstream-secret-value-xyz");
    assert_eq!(
        serde_json::to_value(&key).unwrap()["secret"],
        json!("sk-up…yz")
    );
    assert_eq!(key.min_role, Role::Pro);
    assert_eq!(s.get_upstream_key(&low.id, &key.id).await.unwrap(), key);
    assert_not_found(s.get_upstream_key(&high.id, &key.id).await);
    let key = s
        .update_upstream_key(
            &low.id,
            &key.id,
            patch(json!({"lb_weight": null, "enabled": false})),
        )
        .await
        .unwrap();
    assert_eq!((key.lb_weight, key.enabled), (None, false));
    assert_eq!(
        s.list_upstream_keys(&low.id).await.unwrap(),
        vec![key.clone()]
    );

    // Model mappings: one per (model, upstream).
    let mapping = |model: &str, upstream_id: &str| -> NewUpstreamModel {
        serde_json::from_value(json!({"model": model, "upstream_id": upstream_id})).unwrap()
    };
    let m1 = s
        .create_upstream_model(mapping("gpt", &low.id))
        .await
        .unwrap();
    assert_eq!(m1.provider_model_id, "gpt", "defaults to the public name");
    let m2 = s
        .create_upstream_model(mapping("gpt", &high.id))
        .await
        .unwrap();
    let message = assert_conflict(s.create_upstream_model(mapping("gpt", &low.id)).await);
    assert!(message.starts_with("model:"), "{message}");
    assert_invalid(
        s.create_upstream_model(mapping("gpt", "up_nope")).await,
        "upstream_id",
    );
    assert_conflict(
        s.update_upstream_model(&m2.id, patch(json!({"upstream_id": low.id})))
            .await,
    );
    let m2 = s
        .update_upstream_model(&m2.id, patch(json!({"provider_model_id": "claude-x"})))
        .await
        .unwrap();
    assert_eq!(s.get_upstream_model(&m2.id).await.unwrap(), m2);
    assert_eq!(s.list_upstream_models().await.unwrap().len(), 2);

    let snapshot = s.load_snapshot().await.unwrap();
    let targets = snapshot.model_targets("gpt");
    let order: Vec<&str> = targets.iter().map(|t| t.upstream.id.as_str()).collect();
    assert_eq!(
        order,
        vec![high.id.as_str(), low.id.as_str()],
        "priority first"
    );
    assert_eq!(targets[0].provider.id, claude.id);
    assert_eq!(
        snapshot.capabilities(snapshot.upstream(&low.id).unwrap()),
        &[
            Capability::ChatCompletions,
            Capability::Responses,
            Capability::Messages,
            Capability::Embeddings
        ]
    );
    assert_eq!(
        snapshot.capabilities(snapshot.upstream(&high.id).unwrap()),
        &[Capability::Messages, Capability::ChatCompletions]
    );
    let keys: Vec<_> = snapshot.upstream_keys(&low.id).collect();
    assert_eq!(keys[0].secret.expose(), "sk-upstream-secret-value-xyz");

    // A provider in use cannot go; an upstream takes its keys and mappings with it.
    assert_conflict(s.delete_provider(&openai.id).await);
    s.delete_upstream(&low.id).await.unwrap();
    s.delete_provider(&openai.id).await.unwrap();
    assert_not_found(s.list_upstream_keys(&low.id).await);
    let counts = s.load_snapshot().await.unwrap().counts();
    assert_eq!(
        (
            counts.providers,
            counts.upstreams,
            counts.upstream_keys,
            counts.upstream_models
        ),
        (1, 1, 0, 1)
    );
    s.delete_upstream_model(&m2.id).await.unwrap();
    assert_not_found(s.get_upstream_model(&m2.id).await);
}

async fn snapshot_holds_everything(db: &TestDb) {
    let s = db.store.config();
    let empty = s.load_snapshot().await.unwrap();
    assert_eq!(
        empty.counts(),
        SnapshotCounts {
            routes: 0,
            plugin_configs: 0,
            consumers: 0,
            consumer_keys: 0,
            providers: 0,
            upstreams: 0,
            upstream_keys: 0,
            upstream_models: 0,
        }
    );
    let r = s.create_route(route("r", "/r")).await.unwrap();
    s.create_plugin_config(
        &r.id,
        serde_json::from_value(json!({"plugin": "p"})).unwrap(),
    )
    .await
    .unwrap();
    let c = s
        .create_consumer(serde_json::from_value(json!({"name": "c"})).unwrap())
        .await
        .unwrap();
    s.create_consumer_key(&c.id, NewConsumerKey::default())
        .await
        .unwrap();
    let p = s
        .create_provider(
            serde_json::from_value(json!({"name": "p", "protocol": "openai_responses"})).unwrap(),
        )
        .await
        .unwrap();
    let u = s
        .create_upstream(
            serde_json::from_value(json!({"provider_id": p.id, "base_url": "http://x"})).unwrap(),
        )
        .await
        .unwrap();
    s.create_upstream_key(
        &u.id,
        serde_json::from_value(json!({"secret": "k"})).unwrap(),
    )
    .await
    .unwrap();
    s.create_upstream_model(
        serde_json::from_value(json!({"model": "m", "upstream_id": u.id})).unwrap(),
    )
    .await
    .unwrap();
    let snapshot = s.load_snapshot().await.unwrap();
    assert_eq!(snapshot.version, s.version().await.unwrap());
    assert_eq!(
        snapshot.counts(),
        SnapshotCounts {
            routes: 1,
            plugin_configs: 1,
            consumers: 1,
            consumer_keys: 1,
            providers: 1,
            upstreams: 1,
            upstream_keys: 1,
            upstream_models: 1,
        }
    );
    assert_eq!(snapshot.route(&r.id), Some(&r));
    assert_eq!(snapshot.consumer(&c.id), Some(&c));
    assert_eq!(snapshot.provider(&p.id), Some(&p));
    assert_eq!(snapshot.upstream(&u.id), Some(&u));
    assert!(snapshot.loaded_at_ms > 0);
}

async fn every_write_bumps_the_version(db: &TestDb) {
    let s = db.store.config();
    let v0 = s.version().await.unwrap();
    let r = s.create_route(route("r", "/r")).await.unwrap();
    let v1 = s.version().await.unwrap();
    assert!(v1 > v0);
    // The local feed moves at once.
    assert_eq!(*s.watch().borrow(), v1);
    // Failed writes are rolled back, version included.
    assert_conflict(s.create_route(route("r2", "/r")).await);
    assert_not_found(s.delete_route("rt_nope").await);
    assert_eq!(s.version().await.unwrap(), v1);
    s.update_route(&r.id, patch(json!({"name": "x"})))
        .await
        .unwrap();
    s.delete_route(&r.id).await.unwrap();
    assert_eq!(s.version().await.unwrap(), v1 + 2);
}

/// The requirement behind the feed: a write in one process is seen by another within 2 s.
async fn another_process_sees_changes_within_two_seconds(db: &TestDb) {
    let other = db.open_another().await;
    other.spawn_sync();
    let mut feed = other.config().watch();
    eventually(Duration::from_secs(2), async || {
        other.snapshot().version >= 0
    })
    .await;
    let before = *feed.borrow_and_update();

    let r = db
        .store
        .config()
        .create_route(route("shared", "/shared"))
        .await
        .unwrap();
    let written = db.store.config().version().await.unwrap();
    let took = tokio::time::timeout(Duration::from_secs(2), async {
        while *feed.borrow_and_update() < written {
            feed.changed().await.unwrap();
        }
    })
    .await;
    assert!(
        took.is_ok(),
        "the other store's feed stayed at {before}, wanted {written}"
    );
    let took = eventually(Duration::from_secs(2), async || {
        other.snapshot().route(&r.id).is_some()
    })
    .await;
    let status = other.snapshots().status();
    assert_eq!(status.snapshot_version, Some(written), "{status:?}");
    assert!(status.last_loaded_at_ms.is_some() && status.last_error.is_none());
    if db.is_postgres() {
        // LISTEN/NOTIFY, not the 5 s safety poll.
        assert!(took < Duration::from_secs(1), "took {took:?}");
    }
}

/// A failed reload keeps the last good snapshot and says why.
async fn a_failed_reload_keeps_the_last_snapshot(db: &TestDb) {
    let s = &db.store;
    s.config().create_route(route("r", "/r")).await.unwrap();
    let good = s.snapshots().reload(s.config()).await.unwrap();
    assert_eq!(good.counts().routes, 1);
    match s.pool() {
        Pool::Sqlite(p) => p.close().await,
        Pool::Postgres(p) => p.close().await,
    }
    let err = s.snapshots().reload(s.config()).await.unwrap_err();
    assert!(matches!(err, StoreError::Database { .. }), "{err:?}");
    assert_eq!(s.snapshot().version, good.version);
    assert_eq!(s.snapshot().counts().routes, 1);
    let status = s.snapshots().status();
    assert_eq!(status.snapshot_version, Some(good.version));
    assert_eq!(status.consecutive_failures, 1);
    assert!(status.last_error.is_some() && status.last_error_at_ms.is_some());
    assert!(status.last_loaded_at_ms.is_some());
}

async fn budgets_round_trip(db: &TestDb) {
    let cfg = db.store.config();
    let alice = cfg
        .create_consumer(patch(json!({"name": "alice", "groups": ["gold"]})))
        .await
        .unwrap();
    let new = |v: serde_json::Value| -> NewBudget { patch(v) };
    let own = cfg
        .create_budget(new(json!({"scope": "consumer", "subject": alice.id,
                                  "period": "day", "limit_usd": 2.5})))
        .await
        .unwrap();
    assert!(own.id.starts_with("bg_"), "{}", own.id);
    assert_eq!(
        (own.mode, own.period),
        (BudgetMode::Hard, BudgetPeriod::Day)
    );
    assert!(own.created_at_ms > 1_000_000_000_000, "milliseconds");
    assert_eq!(cfg.get_budget(&own.id).await.unwrap(), own);

    // One budget per (scope, subject): 409 naming the subject.
    let message = assert_conflict(
        cfg.create_budget(new(json!({"scope": "consumer", "subject": alice.id,
                                     "period": "week", "limit_usd": 1})))
            .await,
    );
    assert!(message.starts_with("subject:"), "{message}");
    // A consumer that does not exist is bad input, not a missing resource.
    assert_invalid(
        cfg.create_budget(new(json!({"scope": "consumer", "subject": "cs_nope",
                                     "period": "day", "limit_usd": 1})))
            .await,
        "subject",
    );
    assert_invalid(
        cfg.create_budget(new(json!({"scope": "group", "subject": "gold",
                                     "period": "day", "limit_usd": 0})))
            .await,
        "limit_usd",
    );
    // A group's name need not be anyone's yet; the same subject in another scope is another budget.
    let gold = cfg
        .create_budget(new(
            json!({"scope": "group", "subject": "gold", "period": "month",
                                  "mode": "soft", "limit_usd": 100}),
        ))
        .await
        .unwrap();
    assert_eq!(gold.mode, BudgetMode::Soft);
    let ids: Vec<String> = cfg
        .list_budgets()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(ids, [own.id.clone(), gold.id.clone()]);

    let changed = cfg
        .update_budget(&own.id, patch(json!({"limit_usd": 5, "period": "never"})))
        .await
        .unwrap();
    assert_eq!(
        (changed.limit_usd, changed.period),
        (5.0, BudgetPeriod::Never)
    );
    assert!(changed.updated_at_ms >= own.updated_at_ms);
    assert_eq!(changed.created_at_ms, own.created_at_ms);
    assert_invalid(
        cfg.update_budget(&own.id, patch(json!({"limit_usd": -1})))
            .await,
        "limit_usd",
    );
    assert_not_found(cfg.update_budget("bg_nope", BudgetPatch::default()).await);
    assert_not_found(cfg.get_budget("bg_nope").await);

    // The snapshot: a consumer's own budget first, then its groups'.
    let snapshot = db.store.snapshots().reload(cfg).await.unwrap();
    let of: Vec<&str> = snapshot
        .budgets_of(&alice.id, &alice.groups)
        .map(|b| b.id.as_str())
        .collect();
    assert_eq!(of, [own.id.as_str(), gold.id.as_str()]);
    assert_eq!(snapshot.budgets_of("cs_other", &[]).count(), 0);

    // Deleting: 404 the second time; a consumer takes its budgets with it.
    cfg.delete_budget(&gold.id).await.unwrap();
    assert_not_found(cfg.delete_budget(&gold.id).await);
    cfg.delete_consumer(&alice.id).await.unwrap();
    assert_not_found(cfg.get_budget(&own.id).await);
    assert!(cfg.list_budgets().await.unwrap().is_empty());
}

/// More rows than one transaction takes, in statements of every size: each row is written once
/// with its values, in order.
async fn the_writer_writes_every_row_of_several_transactions(db: &TestDb) {
    let log = api_log::ApiLog::start(db.store.clone(), None);
    let rows = 2 * 2048 + 300;
    for i in 0..rows {
        log.record(api_log::ApiLogRow {
            created_at_ms: i as i64,
            model: format!("m{}", i % 3),
            status: if i % 7 == 0 { 502 } else { 200 },
            latency_ms: 1.5,
            request_id: Some(format!("req-{i}")),
            attempt_log: Some("[]".into()),
            ..Default::default()
        });
    }
    log.finish(Duration::from_secs(60)).await;
    assert_eq!(log.totals(), (rows as u64, 0, 0));
    let query = "SELECT COUNT(*), COUNT(DISTINCT request_id), MIN(created_at_ms), \
                 MAX(created_at_ms), SUM(CASE WHEN status = 502 THEN 1 ELSE 0 END) FROM api_logs";
    let counts: (i64, i64, i64, i64, i64) = match db.store.pool() {
        Pool::Sqlite(p) => sqlx::query_as(query).fetch_one(p).await.unwrap(),
        Pool::Postgres(p) => sqlx::query_as(query).fetch_one(p).await.unwrap(),
    };
    let failed = (0..rows).filter(|i| i % 7 == 0).count() as i64;
    assert_eq!(
        counts,
        (rows as i64, rows as i64, 0, rows as i64 - 1, failed)
    );
    let last = "SELECT model, request_id FROM api_logs WHERE created_at_ms = 4395";
    let row: (String, String) = match db.store.pool() {
        Pool::Sqlite(p) => sqlx::query_as(last).fetch_one(p).await.unwrap(),
        Pool::Postgres(p) => sqlx::query_as(last).fetch_one(p).await.unwrap(),
    };
    assert_eq!(row, ("m0".to_owned(), "req-4395".to_owned()));
}

async fn spend_is_read_back_from_the_request_log(db: &TestDb) {
    for (at, consumer, cost) in [
        (1_000_i64, "alice", Some(0.5)),
        (2_000, "alice", Some(0.25)),
        (2_500, "alice", None),
        (3_000, "bob", Some(1.0)),
        (500, "alice", Some(100.0)),
    ] {
        insert_log_row(db, at, Some(consumer), cost).await;
    }
    let spent = |names: &'static [&'static str], since: i64| {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let store = db.store.clone();
        async move {
            api_log_query::spent_since(&store, &names, since)
                .await
                .unwrap()
        }
    };
    assert_eq!(spent(&["alice"], 1_000).await, 0.75);
    assert_eq!(spent(&["alice", "bob"], 1_000).await, 1.75);
    assert_eq!(spent(&["carol"], 0).await, 0.0);
    assert_eq!(spent(&[], 0).await, 0.0);
}

/// Adds a request-log row made at `at` for `consumer`, costing `cost`.
async fn insert_log_row(db: &TestDb, at: i64, consumer: Option<&str>, cost: Option<f64>) {
    let insert = "INSERT INTO api_logs (created_at_ms, consumer, model, status, latency_ms, cost_usd) \
                  VALUES ($1, $2, 'm', 200, 1.0, $3)";
    macro_rules! insert {
        ($pool:expr) => {
            sqlx::query(insert)
                .bind(at)
                .bind(consumer)
                .bind(cost)
                .execute($pool)
                .await
                .map(drop)
        };
    }
    match db.store.pool() {
        Pool::Sqlite(p) => insert!(p),
        Pool::Postgres(p) => insert!(p),
    }
    .unwrap();
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    match db.store.pool() {
        Pool::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        Pool::Postgres(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
    }
}

/// Pruning moves rows' spend into per-day roll-ups: every budget period's spend (periods start at
/// UTC midnights) reads the same after every batch, even one that splits a day, and after two
/// passes racing each other to a cutoff inside a day.
async fn pruning_the_request_log_keeps_every_budgets_spend(db: &TestDb) {
    use crate::store::retention::{self, DAY_MS};
    const HOUR: i64 = 3_600_000;
    for day in 0..10_i64 {
        for (k, consumer) in [(0, "alice"), (1, "bob")] {
            for hour in [1_i64, 7, 23] {
                let at = day * DAY_MS + hour * HOUR + k;
                insert_log_row(db, at, Some(consumer), Some(0.125 * hour as f64)).await;
            }
        }
        insert_log_row(db, day * DAY_MS + 5, None, Some(9.0)).await;
        insert_log_row(db, day * DAY_MS + 6, Some("alice"), None).await;
    }
    let names: [&[&str]; 3] = [&["alice"], &["bob"], &["alice", "bob"]];
    let spends = || async {
        let mut all = Vec::new();
        for consumers in names {
            let consumers: Vec<String> = consumers.iter().map(|c| c.to_string()).collect();
            for since in [0, 3 * DAY_MS, 6 * DAY_MS, 9 * DAY_MS] {
                all.push(
                    api_log_query::spent_since(&db.store, &consumers, since)
                        .await
                        .unwrap(),
                );
            }
        }
        all
    };
    let before = spends().await;
    assert_eq!(before[0], 10.0 * 3.875, "alice since 0: {before:?}");

    // Six days in batches of 5 rows: most batches end inside a day.
    let cutoff = 6 * DAY_MS;
    let mut pruned = 0;
    loop {
        let rows = retention::prune_batch(&db.store, cutoff, 5).await.unwrap();
        pruned += rows;
        assert_eq!(spends().await, before, "after {pruned} rows");
        if rows < 5 {
            break;
        }
    }
    assert_eq!(pruned, 6 * 8);
    let old = format!("SELECT COUNT(*) FROM api_logs WHERE created_at_ms < {cutoff}");
    assert_eq!(scalar(db, &old).await, 0);
    assert_eq!(scalar(db, "SELECT COUNT(*) FROM api_logs").await, 4 * 8);
    let days: Vec<(String, i64, f64, i64)> = {
        let sql = "SELECT consumer, day_start_ms, cost_usd, requests FROM api_log_spend_days \
                   ORDER BY consumer, day_start_ms";
        match db.store.pool() {
            Pool::Sqlite(p) => sqlx::query_as(sql).fetch_all(p).await.unwrap(),
            Pool::Postgres(p) => sqlx::query_as(sql).fetch_all(p).await.unwrap(),
        }
    };
    let expected: Vec<(String, i64, f64, i64)> = ["alice", "bob"]
        .into_iter()
        .flat_map(|c| {
            (0..6).map(move |d| {
                (
                    c.to_owned(),
                    d * DAY_MS,
                    3.875,
                    if c == "alice" { 4 } else { 3 },
                )
            })
        })
        .collect();
    assert_eq!(days, expected, "rows without a consumer are not rolled up");
    assert_eq!(
        retention::prune_batch(&db.store, cutoff, 5).await.unwrap(),
        0,
        "nothing is left before the cutoff"
    );

    // Two passes at once, to a cutoff at noon: each row goes once, and the day it splits
    // still counts whole.
    let (a, b) = (
        std::sync::atomic::AtomicU64::new(0),
        std::sync::atomic::AtomicU64::new(0),
    );
    let (first, second) = tokio::join!(
        retention::pass(&db.store, 9 * DAY_MS + 12 * HOUR, &a),
        retention::pass(&db.store, 9 * DAY_MS + 12 * HOUR, &b)
    );
    assert_eq!(first.unwrap() + second.unwrap(), 3 * 8 + 6);
    assert_eq!(a.into_inner() + b.into_inner(), 3 * 8 + 6);
    assert_eq!(
        scalar(db, "SELECT COUNT(*) FROM api_logs").await,
        2,
        "the last day's 23:00 rows"
    );
    assert_eq!(spends().await, before);
}

macro_rules! suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let db = super::TestDb::sqlite().await;
                    super::$test(&db).await;
                }
            )*
        }
        mod postgres_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let db = super::TestDb::postgres().await;
                    super::$test(&db).await;
                }
            )*
        }
    };
}

suite!(
    routes_round_trip,
    route_constraints,
    legacy_tokens_are_stored_hashed,
    plugin_configs,
    consumers_and_keys,
    providers_upstreams_and_models,
    snapshot_holds_everything,
    every_write_bumps_the_version,
    another_process_sees_changes_within_two_seconds,
    a_failed_reload_keeps_the_last_snapshot,
    budgets_round_trip,
    spend_is_read_back_from_the_request_log,
    pruning_the_request_log_keeps_every_budgets_spend,
    the_writer_writes_every_row_of_several_transactions,
);

#[tokio::test]
async fn a_new_sqlite_file_has_16_kib_pages_and_an_old_one_keeps_its_own() {
    let db = TestDb::sqlite().await;
    assert_eq!(sqlite_page_size(&db.store).await, 16384);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .page_size(4096);
        let mut conn = sqlx::ConnectOptions::connect(&options).await.unwrap();
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let store = Store::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert_eq!(
        sqlite_page_size(&store).await,
        4096,
        "a file's page size stays as it was made"
    );
}

async fn sqlite_page_size(store: &Store) -> i64 {
    let Pool::Sqlite(pool) = store.pool() else {
        unreachable!("a SQLite store")
    };
    sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(pool)
        .await
        .unwrap()
}
