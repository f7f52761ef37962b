//! The models of the YAML registry and of the database (`upstream_models`), as one list of
//! [`ModelConfig`]s: the same runtime type whichever side declared a route.
//!
//! Each enabled upstream serving a public model becomes one route per enabled key (key expansion):
//! the key's `lb_weight` when set and > 0, else the upstream's; the upstream's priority and group.
//! An upstream without keys is one route without a credential. A database model whose name is a
//! YAML model's id or alias adds its routes after the YAML ones; any other name becomes a model
//! routed by `routing.database_models`.

use std::collections::BTreeMap;

use crate::config::{Capability, Config, ModelConfig, ModelUpstream};
use crate::entity as db;
use crate::store::Snapshot;

/// The database's routes for the public model `name`, indexed from `first_index`.
fn database_routes(snapshot: &Snapshot, name: &str, first_index: u32) -> Vec<ModelUpstream> {
    let mut routes = Vec::new();
    for target in snapshot.model_targets(name) {
        let upstream = target.upstream;
        if !upstream.enabled {
            continue;
        }
        let keys: Vec<&db::UpstreamKey> = snapshot.upstream_keys(&upstream.id).collect();
        let enabled: Vec<&db::UpstreamKey> = keys.iter().copied().filter(|k| k.enabled).collect();
        if !keys.is_empty() && enabled.is_empty() {
            // Every key is switched off: sending without one would only collect 401s.
            continue;
        }
        let capabilities: Vec<Capability> = snapshot.capabilities(upstream).to_vec();
        let weighted = enabled.iter().any(|k| k.lb_weight.is_some_and(|w| w > 0.0));
        let slots: Vec<Option<&db::UpstreamKey>> = if enabled.is_empty() {
            vec![None]
        } else {
            // The same secret twice in one upstream is one slot (its strictest role wins below).
            let mut seen = std::collections::HashSet::new();
            enabled
                .into_iter()
                .filter(|k| seen.insert(k.secret.expose().to_owned()))
                .map(Some)
                .collect()
        };
        for (slot, key) in slots.into_iter().enumerate() {
            let weight = key
                .and_then(|k| k.lb_weight)
                .filter(|w| *w > 0.0)
                .unwrap_or(upstream.lb_weight);
            // Every key of the upstream shares its endpoint: health, prefill load and session
            // affinity belong to the server; the key pool picks among its keys.
            let endpoint_id = format!("{name}:{}", upstream.id);
            let mut metadata = serde_json::Map::new();
            metadata.insert("upstream_id".into(), upstream.id.clone().into());
            if let Some(k) = key {
                metadata.insert("upstream_key_id".into(), k.id.clone().into());
            }
            routes.push(ModelUpstream {
                index: first_index + routes.len() as u32,
                endpoint_id,
                kind: target.provider.protocol.into(),
                base_url: upstream.base_url.trim_end_matches('/').to_owned(),
                provider_model_id: target.mapping.provider_model_id.clone(),
                api_key: key.map(|k| k.secret.expose().to_owned()),
                weight,
                declared_weight: weight,
                weight_note: None,
                priority: i32::try_from(upstream.priority).unwrap_or(if upstream.priority > 0 {
                    i32::MAX
                } else {
                    i32::MIN
                }),
                group: upstream.group.clone(),
                min_role: key.map(|k| k.min_role).unwrap_or_default(),
                key: key.map(|k| crate::config::PoolKey {
                    pool: format!("upstream:{}", upstream.id),
                    slot,
                    fingerprint: db::hash_secret(k.secret.expose()),
                    label: k.id.clone(),
                    weighted,
                }),
                // The database does not describe modalities: let the upstream judge.
                input_modalities: ["text", "image", "audio", "video"]
                    .map(String::from)
                    .to_vec(),
                pricing: None,
                local_deployment: url::Url::parse(&upstream.base_url)
                    .is_ok_and(|u| crate::config::is_loopback(&u)),
                metadata,
                capabilities: capabilities.clone(),
                stream_deadlines: crate::config::StreamDeadlineOverrides {
                    first_token: seconds(upstream.first_token_timeout_seconds),
                    idle: seconds(upstream.idle_timeout_seconds),
                    total: seconds(upstream.stream_timeout_seconds),
                },
            });
        }
    }
    routes
}

/// The YAML models with the database's routes added, then the models only the database knows,
/// sorted by name.
pub fn merged_models(config: &Config, snapshot: &Snapshot) -> Vec<ModelConfig> {
    let mut models = config.models.clone();
    let mut names: Vec<&str> = snapshot
        .rows
        .upstream_models
        .iter()
        .map(|m| m.model.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut extra: BTreeMap<&str, ModelConfig> = BTreeMap::new();
    for name in names {
        if let Some(model) = models
            .iter_mut()
            .find(|m| m.id == name || m.aliases.iter().any(|a| a == name))
        {
            let next = model.upstreams.len() as u32;
            model
                .upstreams
                .extend(database_routes(snapshot, name, next));
            continue;
        }
        let d = &config.routing.database_models;
        extra.insert(
            name,
            ModelConfig {
                id: name.to_owned(),
                aliases: Vec::new(),
                router: d.router.clone(),
                router_params: d.router_params.clone(),
                router_deadline: None,
                shadow: None,
                published: true,
                upstreams: database_routes(snapshot, name, 0),
            },
        );
    }
    models.extend(extra.into_values());
    apply_strictest_reservations(&mut models, snapshot);
    models
}

/// One credential configured in several places (YAML, database keys, a reservation by hash) is
/// reserved for the strictest role any of them declares, whatever the order.
fn apply_strictest_reservations(models: &mut [ModelConfig], snapshot: &Snapshot) {
    let mut strictest: std::collections::HashMap<String, db::Role> = snapshot
        .rows
        .key_reservations
        .iter()
        .map(|r| (r.key_hash.clone(), r.min_role))
        .collect();
    // Database keys count even when disabled: a declaration is a declaration.
    for k in &snapshot.rows.upstream_keys {
        let role = strictest
            .entry(db::hash_secret(k.secret.expose()))
            .or_default();
        *role = (*role).max(k.min_role);
    }
    for route in models.iter().flat_map(|m| m.upstreams.iter()) {
        if let Some(key) = &route.key {
            let role = strictest.entry(key.fingerprint.clone()).or_default();
            *role = (*role).max(route.min_role);
        }
    }
    for route in models.iter_mut().flat_map(|m| m.upstreams.iter_mut()) {
        if let Some(key) = &route.key {
            route.min_role = strictest
                .get(&key.fingerprint)
                .copied()
                .unwrap_or(route.min_role);
        }
    }
}

/// A deadline column: validated on write, so anything else is left to the config's default.
fn seconds(value: Option<f64>) -> Option<std::time::Duration> {
    value
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(std::time::Duration::from_secs_f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderKind;
    use crate::entity::{Provider, Secret, Upstream, UpstreamKey, UpstreamModel};
    use crate::store::snapshot::SnapshotRows;

    fn upstream(id: &str, priority: i64, lb_weight: f64, group: &str, enabled: bool) -> Upstream {
        Upstream {
            id: id.into(),
            provider_id: "p".into(),
            base_url: format!("http://127.0.0.1:9/{id}/v1/"),
            group: group.into(),
            priority,
            lb_weight,
            capabilities: None,
            enabled,
            first_token_timeout_seconds: None,
            idle_timeout_seconds: None,
            stream_timeout_seconds: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn key(id: &str, upstream: &str, lb_weight: Option<f64>, enabled: bool) -> UpstreamKey {
        UpstreamKey {
            id: id.into(),
            upstream_id: upstream.into(),
            secret: Secret::new(format!("secret-{id}")),
            lb_weight,
            min_role: db::Role::Free,
            enabled,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn mapping(id: &str, model: &str, upstream: &str) -> UpstreamModel {
        UpstreamModel {
            id: id.into(),
            model: model.into(),
            upstream_id: upstream.into(),
            provider_model_id: format!("{model}-upstream"),
            created_at: 0,
            updated_at: 0,
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot::build(
            SnapshotRows {
                version: 1,
                providers: vec![Provider {
                    id: "p".into(),
                    name: "p".into(),
                    protocol: db::Protocol::Anthropic,
                    default_capabilities: vec![db::Capability::Messages],
                    created_at: 0,
                    updated_at: 0,
                }],
                upstreams: vec![
                    upstream("u-keys", 5, 2.0, "g1", true),
                    upstream("u-plain", 0, 1.5, "default", true),
                    upstream("u-off", 9, 1.0, "default", false),
                    upstream("u-dead-keys", 9, 1.0, "default", true),
                ],
                upstream_keys: vec![
                    key("k1", "u-keys", Some(3.0), true),
                    key("k2", "u-keys", None, true),
                    key("k3", "u-keys", Some(0.0), true),
                    key("k4", "u-keys", Some(7.0), false),
                    key("k5", "u-dead-keys", None, false),
                ],
                upstream_models: vec![
                    mapping("m1", "db-only", "u-keys"),
                    mapping("m2", "db-only", "u-plain"),
                    mapping("m3", "db-only", "u-off"),
                    mapping("m4", "db-only", "u-dead-keys"),
                    mapping("m5", "yaml-alias", "u-plain"),
                ],
                ..SnapshotRows::default()
            },
            0,
        )
    }

    fn config() -> Config {
        let yaml = "models:\n  - id: yaml-model\n    aliases: [yaml-alias]\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:1/v1\n";
        Config::from_yaml(std::path::Path::new("t.yaml"), yaml, &|_| None).unwrap()
    }

    #[test]
    fn keys_expand_with_their_weights_and_the_upstreams_priority_and_group() {
        let models = merged_models(&config(), &snapshot());
        let db_only = models.iter().find(|m| m.id == "db-only").unwrap();
        assert_eq!(db_only.router, "fixed");
        assert_eq!(
            db_only.router_params,
            serde_json::json!({"fallback_order": "weighted"})
        );
        let summary: Vec<(&str, f64, i32, &str, Option<&str>)> = db_only
            .upstreams
            .iter()
            .map(|r| {
                (
                    r.endpoint_id.as_str(),
                    r.weight,
                    r.priority,
                    r.group.as_str(),
                    r.api_key.as_deref(),
                )
            })
            .collect();
        // Highest priority first; disabled upstreams and upstreams whose keys are all disabled
        // are left out; a key weight of 0 or none falls back to the upstream's.
        assert_eq!(
            summary,
            vec![
                ("db-only:u-keys", 3.0, 5, "g1", Some("secret-k1")),
                ("db-only:u-keys", 2.0, 5, "g1", Some("secret-k2")),
                ("db-only:u-keys", 2.0, 5, "g1", Some("secret-k3")),
                ("db-only:u-plain", 1.5, 0, "default", None),
            ]
        );
        let indexes: Vec<u32> = db_only.upstreams.iter().map(|r| r.index).collect();
        assert_eq!(indexes, vec![0, 1, 2, 3]);
        let first = &db_only.upstreams[0];
        assert_eq!(first.kind, ProviderKind::Anthropic);
        assert_eq!(first.base_url, "http://127.0.0.1:9/u-keys/v1");
        assert_eq!(first.provider_model_id, "db-only-upstream");
        assert_eq!(first.capabilities, vec![Capability::Messages]);
    }

    #[test]
    fn a_database_name_of_a_yaml_model_adds_routes_after_the_yaml_ones() {
        let models = merged_models(&config(), &snapshot());
        assert_eq!(
            models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
            vec!["yaml-model", "db-only"]
        );
        let yaml = &models[0];
        assert_eq!(yaml.upstreams.len(), 2);
        assert_eq!(yaml.upstreams[1].index, 1);
        assert_eq!(yaml.upstreams[1].endpoint_id, "yaml-alias:u-plain");
        assert_eq!(yaml.upstreams[0].group, "default");
    }
}
