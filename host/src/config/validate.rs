//! From raw YAML to runtime types: strict parsing with the key path of every error, then the
//! checks that need more than a type (ranges, uniqueness, URLs) and the defaults.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use super::knobs::{affinity_and_prefill, health_config, key_pool_config, pick};
use super::{
    Config, ConfigError, DEFAULT_GROUP, DatabaseModelsConfig, DefaultAuth, HealthCheckConfig,
    ModelConfig, ModelUpstream, PoolKey, RoutingConfig, ServerConfig, StrategiesConfig,
    UpstreamClientConfig, endpoint_id, raw,
};

pub(super) fn parse(path: &Path, text: &str) -> Result<raw::RawConfig, ConfigError> {
    // An empty file is a valid (if useless) config.
    let text = if text.trim().is_empty() { "{}" } else { text };
    let deserializer = serde_norway::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let key_path = err.path().to_string();
        let inner = err.into_inner();
        let location = inner
            .location()
            .map(|l| format!(":{}:{}", l.line(), l.column()))
            .unwrap_or_default();
        // serde_norway appends " at line X column Y"; the location already says it.
        let mut message = inner.to_string();
        if let Some(cut) = message.find(" at line ") {
            message.truncate(cut);
        }
        ConfigError::Parse {
            file: path.to_owned(),
            location,
            path: if key_path == "." || key_path.is_empty() {
                String::new()
            } else {
                format!("{key_path}: ")
            },
            message,
        }
    })
}

pub(super) fn validate(
    path: &Path,
    raw: raw::RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let invalid = |key: String, message: String| ConfigError::Invalid {
        file: path.to_owned(),
        path: key,
        message,
    };

    let default_router = raw.routing.default_router.trim().to_owned();
    if default_router.is_empty() {
        return Err(invalid(
            "routing.default_router".into(),
            "must name a strategy".into(),
        ));
    }

    let mut names: HashSet<String> = HashSet::new();
    let mut models = Vec::with_capacity(raw.models.len());
    for (mi, m) in raw.models.into_iter().enumerate() {
        let at = |key: &str| format!("models[{mi}] ({}).{key}", m.id);
        if m.id.trim().is_empty() {
            return Err(invalid(
                format!("models[{mi}].id"),
                "must not be empty".into(),
            ));
        }
        for name in std::iter::once(&m.id).chain(m.aliases.iter()) {
            if !names.insert(name.clone()) {
                return Err(invalid(
                    at(if name == &m.id { "id" } else { "aliases" }),
                    format!("`{name}` is already used by another model or alias"),
                ));
            }
        }
        let router_params = match m.router_params {
            None | Some(serde_json::Value::Null) => serde_json::Value::Object(Default::default()),
            Some(v @ serde_json::Value::Object(_)) => v,
            Some(_) => {
                return Err(invalid(
                    at("router_params"),
                    "must be a mapping of parameter names to values".into(),
                ));
            }
        };

        let mut seen_ids: BTreeMap<String, usize> = BTreeMap::new();
        let mut routes = Vec::with_capacity(m.route.len());
        for (ri, r) in m.route.into_iter().enumerate() {
            let rat = |key: &str| format!("models[{mi}] ({}).route[{ri}].{key}", m.id);
            if !r.weight.is_finite() || r.weight < 0.0 {
                return Err(invalid(
                    rat("weight"),
                    format!("must be a finite number >= 0, got {}", r.weight),
                ));
            }
            let url = url::Url::parse(r.base_url.trim())
                .map_err(|e| invalid(rat("base_url"), format!("`{}`: {e}", r.base_url)))?;
            if url.scheme() != "http" && url.scheme() != "https" {
                return Err(invalid(
                    rat("base_url"),
                    format!("`{}`: only http and https are supported", r.base_url),
                ));
            }
            if let Some(p) = &r.pricing {
                for (name, v) in [
                    ("prompt", p.prompt),
                    ("completion", p.completion),
                    ("input_cache_reads", p.input_cache_reads),
                    ("input_cache_writes", p.input_cache_writes),
                ] {
                    if !v.is_finite() || v < 0.0 {
                        return Err(invalid(
                            rat(&format!("pricing.{name}")),
                            format!("must be a finite price >= 0, got {v}"),
                        ));
                    }
                }
            }
            let base_id = endpoint_id(&m.id, r.kind, &url);
            // Two routes of one model at the same location would share health and latency state;
            // the later ones get a numeric suffix so each route keeps its own.
            let n = seen_ids.entry(base_id.clone()).or_insert(0);
            *n += 1;
            let endpoint_id = if *n == 1 {
                base_id
            } else {
                format!("{base_id}-{n}")
            };
            let is_loopback = endpoint_id::is_loopback(&url);
            // The pool: `api_key` then `api_keys`, unset ones skipped, a repeated key collapsed
            // into one slot with the strictest role.
            let mut keys: Vec<(String, crate::entity::Role)> = Vec::new();
            let declared = r
                .api_key
                .iter()
                .map(|k| (k.clone(), Default::default()))
                .chain(r.api_keys.iter().map(|k| match k {
                    raw::RawKey::Plain(k) => (k.clone(), Default::default()),
                    raw::RawKey::Reserved(k) => (k.key.clone(), k.min_role),
                }));
            for (key, role) in declared {
                let key = key.trim().to_owned();
                if key.is_empty() {
                    continue;
                }
                match keys.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, strictest)) => *strictest = (*strictest).max(role),
                    None => keys.push((key, role)),
                }
            }
            let template = ModelUpstream {
                index: 0,
                endpoint_id: endpoint_id.clone(),
                kind: r.kind,
                base_url: r.base_url.trim().trim_end_matches('/').to_owned(),
                provider_model_id: r.provider_model_id.unwrap_or_else(|| m.id.clone()),
                api_key: None,
                weight: r.weight,
                declared_weight: r.weight,
                weight_note: None,
                priority: r.priority,
                group: match r.group.as_deref().map(str::trim) {
                    None => DEFAULT_GROUP.to_owned(),
                    Some("") => return Err(invalid(rat("group"), "must not be empty".into())),
                    Some(g) => g.to_owned(),
                },
                min_role: crate::entity::Role::Free,
                key: None,
                input_modalities: r.input_modalities.unwrap_or_else(|| vec!["text".into()]),
                pricing: r.pricing,
                local_deployment: r.local_deployment.unwrap_or(is_loopback),
                metadata: r.metadata.unwrap_or_default(),
                capabilities: r
                    .capabilities
                    .unwrap_or_else(|| r.kind.default_capabilities()),
            };
            if keys.is_empty() {
                routes.push(ModelUpstream {
                    index: routes.len() as u32,
                    ..template
                });
                continue;
            }
            // The route's share of traffic is split evenly among its keys.
            let share = r.weight / keys.len() as f64;
            for (slot, (key, role)) in keys.into_iter().enumerate() {
                routes.push(ModelUpstream {
                    index: routes.len() as u32,
                    weight: share,
                    declared_weight: share,
                    min_role: role,
                    key: Some(PoolKey {
                        pool: endpoint_id.clone(),
                        slot,
                        fingerprint: crate::entity::hash_secret(&key),
                        label: format!("k{slot}"),
                        weighted: false,
                    }),
                    api_key: Some(key),
                    ..template.clone()
                });
            }
        }

        models.push(ModelConfig {
            router: m
                .router
                .map(|r| r.trim().to_owned())
                .unwrap_or_else(|| default_router.clone()),
            id: m.id,
            aliases: m.aliases,
            router_params,
            published: m.published,
            upstreams: routes,
        });
    }

    let health = health_config(path, &raw.health, env)?;
    if let Some(lf) = raw.routing.local_fraction
        && !(0.0..=1.0).contains(&lf)
    {
        return Err(invalid(
            "routing.local_fraction".into(),
            format!("must be between 0 and 1, got {lf}"),
        ));
    }
    let health_check = match &raw.routing.health_check {
        Some(h) if !h.interval_seconds.is_finite() || h.interval_seconds < 0.0 => {
            return Err(invalid(
                "routing.health_check.interval_seconds".into(),
                format!(
                    "must be a number of seconds >= 0, got {}",
                    h.interval_seconds
                ),
            ));
        }
        Some(h) if h.interval_seconds > 0.0 => Some(HealthCheckConfig {
            interval: Duration::from_secs_f64(h.interval_seconds),
            timeout: Duration::from_millis(h.timeout_ms.unwrap_or(2000)),
        }),
        _ => None,
    };
    let mut trusted_proxies = Vec::new();
    for (i, p) in raw.server.trusted_proxies.iter().enumerate() {
        let net = p
            .parse::<ipnet::IpNet>()
            .or_else(|_| p.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
            .map_err(|_| {
                invalid(
                    format!("server.trusted_proxies[{i}]"),
                    format!("`{p}` is not an IP address or CIDR range"),
                )
            })?;
        trusted_proxies.push(net);
    }
    let (affinity, prefill) = affinity_and_prefill(path, &raw.routing, env)?;
    let key_pools = key_pool_config(path, &raw.routing.key_pools, env)?;
    let mut routes = Vec::with_capacity(raw.routes.len());
    let mut prefixes: HashSet<String> = HashSet::new();
    for (i, r) in raw.routes.into_iter().enumerate() {
        let name = r.name.clone();
        let at = |field: &str| format!("routes[{i}] ({name}).{field}");
        let route = r
            .into_route(format!("yaml:{name}"), 0)
            .map_err(|e| invalid(at(&e.field), e.message))?;
        if routes
            .iter()
            .any(|r: &crate::entity::Route| r.name == route.name)
        {
            return Err(invalid(at("name"), "another route has this name".into()));
        }
        if !prefixes.insert(route.path_prefix.clone()) {
            return Err(invalid(
                at("path_prefix"),
                format!("`{}` is already used by another route", route.path_prefix),
            ));
        }
        routes.push(route);
    }
    let default_auth = pick(
        path,
        env,
        "SWITCHYARD_DEFAULT_AUTH",
        raw.server.default_auth,
        DefaultAuth::ConsumerKeys,
    )?;
    let default_max_attempts = raw.server.default_max_attempts.unwrap_or(2);
    if !(1..=10).contains(&default_max_attempts) {
        return Err(invalid(
            "server.default_max_attempts".into(),
            format!("must be between 1 and 10, got {default_max_attempts}"),
        ));
    }
    let database_models = {
        let d = raw.routing.database_models;
        let router = d
            .router
            .map(|r| r.trim().to_owned())
            .unwrap_or_else(|| "fixed".to_owned());
        let router_params = match d.router_params {
            Some(v @ serde_json::Value::Object(_)) => v,
            None | Some(serde_json::Value::Null) if router == "fixed" => {
                serde_json::json!({ "fallback_order": "weighted" })
            }
            None | Some(serde_json::Value::Null) => serde_json::Value::Object(Default::default()),
            Some(_) => {
                return Err(invalid(
                    "routing.database_models.router_params".into(),
                    "must be a mapping of parameter names to values".into(),
                ));
            }
        };
        DatabaseModelsConfig {
            router,
            router_params,
        }
    };
    let admin_token = env("SWITCHYARD_ADMIN_TOKEN")
        .or(raw.server.admin_token)
        .filter(|t| !t.trim().is_empty());
    let s = raw.strategies;
    let u = raw.upstream;
    Ok(Config {
        source: path.to_owned(),
        server: ServerConfig {
            listen: raw.server.listen,
            admin_token,
            trusted_proxies,
            default_auth,
            default_max_attempts: default_max_attempts as usize,
            max_body_bytes: (raw.server.max_body_mib.unwrap_or(32).max(1) as usize) << 20,
            request_limits: {
                let default = crate::protocol::json::Limits::DEFAULT;
                let limit = |v: Option<u64>, default: usize| {
                    v.map_or(default, |n| usize::try_from(n.max(1)).unwrap_or(usize::MAX))
                };
                crate::protocol::json::Limits {
                    max_messages: limit(raw.server.max_messages, default.max_messages),
                    max_content_parts: limit(
                        raw.server.max_content_parts,
                        default.max_content_parts,
                    ),
                }
            },
        },
        database_url: raw.database.url,
        strategies: StrategiesConfig {
            dir: s.dir,
            builtin_dir: s.builtin_dir,
            call_timeout: Duration::from_millis(s.call_timeout_ms.unwrap_or(5).max(1)),
            memory_limit_bytes: (s.memory_limit_mib.unwrap_or(64).max(1) as usize) << 20,
            tick_interval: match s.tick_interval_ms.unwrap_or(1000) {
                0 => None,
                ms => Some(Duration::from_millis(ms)),
            },
        },
        routing: RoutingConfig {
            default_router,
            public_routing_endpoint: raw.routing.public_routing_endpoint,
            local_fraction: raw.routing.local_fraction,
            health_check,
            affinity,
            prefill,
            database_models,
            key_pools,
        },
        health,
        upstream: UpstreamClientConfig {
            connect_timeout: Duration::from_millis(u.connect_timeout_ms.unwrap_or(2000)),
            first_byte_timeout: Duration::from_secs(u.first_byte_timeout_seconds.unwrap_or(300)),
            request_timeout: Duration::from_secs(u.request_timeout_seconds.unwrap_or(600)),
        },
        models,
        routes,
    })
}
