//! Loading the YAML config: read, interpolate `${VAR}`, parse strictly, validate into runtime types.
//!
//! Every error names the file; parse errors also give the line and the key path
//! (`models[0].route[1]: unknown field ...`), validation errors the model id and key.

mod endpoint_id;
mod interpolate;
pub mod raw;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use endpoint_id::{endpoint_id, is_loopback};
pub use raw::{Capability, DefaultAuth, ProviderKind};

/// A config that could not be loaded. The message always names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read config: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    /// `${VAR}` named a variable that is not set and has no default.
    #[error(
        "{file}:{line}: environment variable {var} is not set (write ${{{var}:-}} to make it optional)"
    )]
    MissingVariable {
        file: PathBuf,
        line: usize,
        var: String,
    },
    /// The YAML is malformed or does not match the schema (unknown key, wrong type).
    #[error("{file}{location}: {path}{message}")]
    Parse {
        file: PathBuf,
        location: String,
        path: String,
        message: String,
    },
    /// The YAML parsed but a value is not acceptable.
    #[error("{file}: {path}: {message}")]
    Invalid {
        file: PathBuf,
        path: String,
        message: String,
    },
}

/// The group of upstreams and routes that declare none, and the group callers without any group
/// constraint may use.
pub const DEFAULT_GROUP: &str = "default";

/// The validated, runtime form of the config.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this config came from; relative paths inside it resolve against its folder.
    pub source: PathBuf,
    pub server: ServerConfig,
    pub database_url: String,
    pub strategies: StrategiesConfig,
    pub routing: RoutingConfig,
    pub upstream: UpstreamConfig,
    pub health: crate::routing::health::HealthConfig,
    pub models: Vec<ModelConfig>,
    /// Inbound routes declared in the file, validated like the database's (ids `yaml:NAME`).
    pub routes: Vec<crate::entity::Route>,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: String,
    pub admin_token: Option<String>,
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Authentication of the implicit `/` route (no route declared anywhere).
    pub default_auth: DefaultAuth,
    /// `max_attempts` of the implicit route.
    pub default_max_attempts: usize,
    pub max_body_bytes: usize,
}

/// The strategy of models that exist only in the database.
#[derive(Debug, Clone)]
pub struct DatabaseModelsConfig {
    pub router: String,
    pub router_params: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct StrategiesConfig {
    pub dir: Option<PathBuf>,
    pub builtin_dir: Option<PathBuf>,
    pub call_timeout: Duration,
    pub memory_limit_bytes: usize,
    pub tick_interval: Option<Duration>,
}

#[derive(Debug, Clone)]
pub struct RoutingConfig {
    pub default_router: String,
    pub public_routing_endpoint: bool,
    pub local_fraction: Option<f64>,
    pub health_check: Option<HealthCheckConfig>,
    pub affinity: crate::routing::affinity::AffinityConfig,
    pub prefill: crate::routing::prefill::PrefillConfig,
    pub database_models: DatabaseModelsConfig,
    pub key_pools: crate::upstream::key_pool::KeyPoolConfig,
}

#[derive(Debug, Clone, Copy)]
pub struct HealthCheckConfig {
    pub interval: Duration,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub request_timeout: Duration,
}

/// One public model and its routes, in declared order.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub id: String,
    pub aliases: Vec<String>,
    pub router: String,
    pub router_params: serde_json::Value,
    pub published: bool,
    pub routes: Vec<RouteConfig>,
}

/// One upstream a model can be served by.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Position in the model's `route:` list.
    pub index: u32,
    /// `{model_id}:{location}`: the key of health, latency profiles and logs.
    pub endpoint_id: String,
    pub kind: ProviderKind,
    /// Without a trailing slash; paths such as `/chat/completions` are appended.
    pub base_url: String,
    pub provider_model_id: String,
    pub api_key: Option<String>,
    /// The effective weight: declared, then rewritten by policy, overrides, disables and health
    /// checks (see `routing::policy`).
    pub weight: f64,
    /// The weight written in the config.
    pub declared_weight: f64,
    /// Why `weight` is 0, when it was set to 0 by something other than the config.
    pub weight_note: Option<&'static str>,
    pub priority: i32,
    /// The upstream group (`default` unless declared); callers limited to other groups skip it.
    pub group: String,
    /// The least role a caller needs for this route's key: the strictest declaration of the
    /// key anywhere (YAML, database key, reservation by hash).
    pub min_role: crate::entity::Role,
    /// The key pool slot this route stands for; `None` without a key.
    pub key: Option<PoolKey>,
    pub input_modalities: Vec<String>,
    pub pricing: Option<raw::RawPricing>,
    pub local_deployment: bool,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The inbound calls this route serves.
    pub capabilities: Vec<Capability>,
}

/// One key of a pool: every key of an upstream (or of a YAML route's `api_key`/`api_keys`) is a
/// candidate of its own; the pool ties them together for reservations, quieting and key affinity.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolKey {
    /// `{model}:{location}` for a YAML route, `upstream:{id}` for a database upstream.
    pub pool: String,
    /// Position in the pool's declaration order (ties among equally reserved keys).
    pub slot: usize,
    /// SHA-256 (hex) of the secret: how reservations by hash and quieting find it.
    pub fingerprint: String,
    /// The key's own id for logs (`k{slot}` in YAML, the database key id).
    pub label: String,
    /// The keys carry their own weights (database `lb_weight`): among equally reserved keys the
    /// weighted order of the strategy decides instead of declaration order.
    pub weighted: bool,
}

impl Config {
    /// Reads and validates `path`, interpolating `${VAR}` from the process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_owned(),
            source,
        })?;
        Self::from_yaml(path, &text, &|name| std::env::var(name).ok())
    }

    /// Parses `text` as if it were the file `path`; `env` looks up interpolated variables.
    pub fn from_yaml(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let text = interpolate::interpolate(text, env).map_err(|missing| {
            ConfigError::MissingVariable {
                file: path.to_owned(),
                line: missing.line,
                var: missing.var,
            }
        })?;
        let raw = parse(path, &text)?;
        validate(path, raw, env)
    }

    /// Resolves a path written in the config relative to the config file's folder.
    pub fn resolve_path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.source
                .parent()
                .unwrap_or_else(|| Path::new("."))
                .join(p)
        }
    }
}

fn parse(path: &Path, text: &str) -> Result<raw::RawConfig, ConfigError> {
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

fn validate(
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
            let template = RouteConfig {
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
                routes.push(RouteConfig {
                    index: routes.len() as u32,
                    ..template
                });
                continue;
            }
            // The route's share of traffic is split evenly among its keys.
            let share = r.weight / keys.len() as f64;
            for (slot, (key, role)) in keys.into_iter().enumerate() {
                routes.push(RouteConfig {
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
            routes,
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
        upstream: UpstreamConfig {
            connect_timeout: Duration::from_millis(u.connect_timeout_ms.unwrap_or(2000)),
            first_byte_timeout: Duration::from_secs(u.first_byte_timeout_seconds.unwrap_or(300)),
            request_timeout: Duration::from_secs(u.request_timeout_seconds.unwrap_or(600)),
        },
        models,
        routes,
    })
}

/// `1/0`, `true/false`, `yes/no`, `on/off`.
#[derive(Debug, Clone, Copy)]
struct Flag(bool);

impl std::str::FromStr for Flag {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Flag(true)),
            "0" | "false" | "no" | "off" => Ok(Flag(false)),
            _ => Err(()),
        }
    }
}

/// An environment variable (when set), else the file's value, else the default.
fn pick<T: std::str::FromStr + Copy>(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    var: &str,
    file: Option<T>,
    default: T,
) -> Result<T, ConfigError> {
    match env(var).filter(|v| !v.trim().is_empty()) {
        Some(v) => v.trim().parse().map_err(|_| ConfigError::Invalid {
            file: path.to_owned(),
            path: format!("environment variable {var}"),
            message: format!("`{v}` is not a valid value"),
        }),
        None => Ok(file.unwrap_or(default)),
    }
}

/// Key-pool knobs: environment first, then `routing.key_pools`.
fn key_pool_config(
    path: &Path,
    raw: &raw::RawKeyPools,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<crate::upstream::key_pool::KeyPoolConfig, ConfigError> {
    let d = crate::upstream::key_pool::KeyPoolConfig::default();
    let seconds = |var: &str, file: Option<f64>, default: Duration| {
        pick(path, env, var, file, default.as_secs_f64())
            .map(|s| Duration::from_secs_f64(s.max(0.0)))
    };
    Ok(crate::upstream::key_pool::KeyPoolConfig {
        affinity_enabled: pick(
            path,
            env,
            "ROUTING_KEY_AFFINITY_ENABLED",
            raw.affinity_enabled.map(Flag),
            Flag(d.affinity_enabled),
        )?
        .0,
        affinity_ttl: seconds(
            "KEY_AFFINITY_TTL_SECONDS",
            raw.affinity_ttl_seconds,
            d.affinity_ttl,
        )?,
        rate_limited_quiet: seconds(
            "KEY_QUIET_RATE_LIMITED_SECONDS",
            raw.rate_limited_quiet_seconds,
            d.rate_limited_quiet,
        )?,
        rejected_quiet: seconds(
            "KEY_QUIET_REJECTED_SECONDS",
            raw.rejected_quiet_seconds,
            d.rejected_quiet,
        )?,
    })
}

/// Affinity and prefill knobs: environment first, then `routing.affinity` / `routing.prefill`.
fn affinity_and_prefill(
    path: &Path,
    raw: &raw::RawRouting,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<
    (
        crate::routing::affinity::AffinityConfig,
        crate::routing::prefill::PrefillConfig,
    ),
    ConfigError,
> {
    let a = crate::routing::affinity::AffinityConfig::default();
    let (ra, rp) = (&raw.affinity, &raw.prefill);
    let affinity = crate::routing::affinity::AffinityConfig {
        enabled: pick(
            path,
            env,
            "ROUTING_AFFINITY_ENABLED",
            ra.enabled.map(Flag),
            Flag(a.enabled),
        )?
        .0,
        ttl: Duration::from_secs_f64(
            pick(
                path,
                env,
                "AFFINITY_TTL_SECONDS",
                ra.ttl_seconds,
                a.ttl.as_secs_f64(),
            )?
            .max(0.0),
        ),
        sweep_threshold: pick(
            path,
            env,
            "AFFINITY_SWEEP_THRESHOLD",
            ra.sweep_threshold,
            a.sweep_threshold,
        )?,
    };
    let p = crate::routing::prefill::PrefillConfig::default();
    let prefill = crate::routing::prefill::PrefillConfig {
        enabled: pick(
            path,
            env,
            "ROUTING_PREFILL_AWARE_ENABLED",
            rp.enabled.map(Flag),
            Flag(p.enabled),
        )?
        .0,
        intervene_tokens: pick(
            path,
            env,
            "ROUTING_PREFILL_INTERVENE_TOKENS",
            rp.intervene_tokens,
            p.intervene_tokens,
        )?,
        elephant_tokens: pick(
            path,
            env,
            "ROUTING_PREFILL_ELEPHANT_TOKENS",
            rp.elephant_tokens,
            p.elephant_tokens,
        )?,
        elephant_limit: pick(
            path,
            env,
            "ROUTING_PREFILL_ELEPHANT_LIMIT",
            rp.elephant_limit,
            p.elephant_limit,
        )?,
        affinity_ceiling: pick(
            path,
            env,
            "ROUTING_PREFILL_AFFINITY_CEILING",
            rp.affinity_ceiling,
            p.affinity_ceiling,
        )?,
        hint_ttl: Duration::from_secs_f64(
            pick(
                path,
                env,
                "ROUTING_PREFILL_HINT_TTL_SEC",
                rp.hint_ttl_seconds,
                p.hint_ttl.as_secs_f64(),
            )?
            .max(0.0),
        ),
    };
    Ok((affinity, prefill))
}

/// Breaker knobs: environment first, then the config file, then defaults.
fn health_config(
    path: &Path,
    raw: &raw::RawHealth,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<crate::routing::health::HealthConfig, ConfigError> {
    let d = crate::routing::health::HealthConfig::default();
    let threshold = pick(
        path,
        env,
        "CIRCUIT_FAILURE_THRESHOLD",
        raw.failure_threshold,
        d.failure_threshold,
    )?;
    let cooldown = pick(
        path,
        env,
        "CIRCUIT_COOLDOWN_SECONDS",
        raw.cooldown_seconds,
        d.cooldown.as_secs_f64(),
    )?;
    let min_availability = pick(
        path,
        env,
        "CIRCUIT_MIN_AVAILABILITY",
        raw.min_availability,
        d.min_availability,
    )?;
    let alpha = pick(
        path,
        env,
        "ROUTER_HEALTH_EWMA_ALPHA",
        raw.ewma_alpha,
        d.ewma_alpha,
    )?;
    let bad = |key: &str, message: String| ConfigError::Invalid {
        file: path.to_owned(),
        path: format!("health.{key}"),
        message,
    };
    if threshold == 0 {
        return Err(bad("failure_threshold", "must be at least 1".into()));
    }
    if !cooldown.is_finite() || cooldown < 0.0 {
        return Err(bad(
            "cooldown_seconds",
            format!("must be >= 0, got {cooldown}"),
        ));
    }
    if !(0.0..=1.0).contains(&min_availability) {
        return Err(bad(
            "min_availability",
            format!("must be between 0 and 1, got {min_availability}"),
        ));
    }
    if !(alpha > 0.0 && alpha <= 1.0) {
        return Err(bad("ewma_alpha", format!("must be in (0, 1], got {alpha}")));
    }
    Ok(crate::routing::health::HealthConfig {
        failure_threshold: threshold,
        cooldown: Duration::from_secs_f64(cooldown),
        min_availability,
        ewma_alpha: alpha,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(Path::new("test.yaml"), text, &|_| None)
    }

    #[test]
    fn unknown_key_names_file_line_and_path() {
        let err = load(
            "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n        wieght: 2\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("test.yaml:6:"), "{err}");
        assert!(
            err.contains("models[0].route[0]: unknown field `wieght`"),
            "{err}"
        );
    }

    #[test]
    fn bad_weight_names_model_and_key() {
        let err = load(
            "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n        weight: -1\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "test.yaml: models[0] (m).route[0].weight: must be a finite number >= 0, got -1"
        );
    }

    #[test]
    fn duplicate_alias_is_rejected() {
        let err = load("models:\n  - id: a\n    aliases: [x]\n  - id: b\n    aliases: [x]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("models[1] (b).aliases"), "{err}");
    }

    #[test]
    fn health_knobs_come_from_env_then_file_then_defaults() {
        let text = "health:\n  failure_threshold: 5\n  cooldown_seconds: 2\n";
        let env = |name: &str| (name == "CIRCUIT_FAILURE_THRESHOLD").then(|| "7".to_owned());
        let c = Config::from_yaml(Path::new("t.yaml"), text, &env).unwrap();
        assert_eq!(c.health.failure_threshold, 7, "environment wins");
        assert_eq!(c.health.cooldown, Duration::from_secs(2), "then the file");
        assert_eq!(c.health.min_availability, 0.7, "then the default");
        let bad = |name: &str| (name == "ROUTER_HEALTH_EWMA_ALPHA").then(|| "fast".to_owned());
        let err = Config::from_yaml(Path::new("t.yaml"), "", &bad)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "t.yaml: environment variable ROUTER_HEALTH_EWMA_ALPHA: `fast` is not a valid value"
        );
    }

    #[test]
    fn defaults_fill_in() {
        let c = load(
            "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1/\n",
        )
        .unwrap();
        assert_eq!(c.models[0].router, "fixed");
        let r = &c.models[0].routes[0];
        assert_eq!(r.endpoint_id, "m:local-9001");
        assert_eq!(r.base_url, "http://127.0.0.1:9001/v1");
        assert_eq!(r.provider_model_id, "m");
        assert_eq!(r.weight, 1.0);
        assert!(r.local_deployment);
        assert_eq!(r.input_modalities, vec!["text"]);
    }

    #[test]
    fn duplicate_locations_get_distinct_endpoint_ids() {
        let c = load(
            "models:\n  - id: m\n    route:\n      - kind: anthropic\n        base_url: https://api.anthropic.com\n      - kind: anthropic\n        base_url: https://api.anthropic.com\n",
        )
        .unwrap();
        let ids: Vec<_> = c.models[0]
            .routes
            .iter()
            .map(|r| r.endpoint_id.as_str())
            .collect();
        assert_eq!(ids, ["m:anthropic-api", "m:anthropic-api-2"]);
    }

    #[test]
    fn every_example_config_parses() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
        let mut seen = 0;
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let p = entry.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    Config::from_yaml(&p, &text, &|_| None)
                        .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                    seen += 1;
                }
            }
        }
        assert!(seen >= 1, "no example configs found");
    }
}
