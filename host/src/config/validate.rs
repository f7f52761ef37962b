//! From raw YAML to runtime types: strict parsing with the key path of every error, then the
//! checks that need more than a type (ranges, uniqueness, URLs) and the defaults.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use crate::entity::mask_url_password;

use super::knobs::{affinity_and_prefill, health_config, key_pool_config, pick};
use super::{
    Config, ConfigError, DEFAULT_GROUP, DatabaseModelsConfig, DefaultAuth, EdgeConfig, FleetConfig,
    HealthCheckConfig, KeyLines, LogFormat, LoggingConfig, ModelConfig, ModelUpstream, PoolKey,
    RecordConfig, RoutingConfig, ServerConfig, ShadowConfig, StrategiesConfig, TelemetryConfig,
    UpstreamClientConfig, endpoint_id, interpolate, raw,
};

/// Days of request-log rows kept when the file and the environment are silent. A month of rows
/// answers "what happened" for any incident still being looked at; a log kept forever fills the
/// disk (about 850 bytes a row with its indexes: 70 GB a day at 1,000 requests a second). Budgets
/// do not need the rows: their spend is rolled up per day as rows are pruned.
pub const DEFAULT_REQUEST_LOG_RETENTION_DAYS: u32 = 30;

/// Parses `text` strictly, interpolating `${VAR}` from `env` into scalar values as they are read.
pub(super) fn parse(
    path: &Path,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<raw::RawConfig, ConfigError> {
    // An empty file is a valid (if useless) config.
    let text = if text.trim().is_empty() { "{}" } else { text };
    let cx = interpolate::Context::new(env);
    let deserializer =
        interpolate::Interpolating::new(serde_norway::Deserializer::from_str(text), &cx);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let key_path = err.path().to_string();
        let inner = err.into_inner();
        if let (Some(var), Some(l)) = (cx.missing_variable(), inner.location()) {
            return ConfigError::MissingVariable {
                file: path.to_owned(),
                line: l.line(),
                var,
            };
        }
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
    lines: KeyLines,
) -> Result<Config, ConfigError> {
    let invalid = |key: String, message: String| ConfigError::Invalid {
        file: path.to_owned(),
        location: String::new(),
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

    // Never below the default deadline: raising `call_timeout_ms` raises the cap with it.
    let max_call_timeout_ms = raw
        .strategies
        .max_call_timeout_ms
        .unwrap_or(50)
        .max(raw.strategies.call_timeout_ms.unwrap_or(5))
        .max(1);
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
        let shadow = match (m.router_shadow.as_deref().map(str::trim), m.shadow_params) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(invalid(
                    at("shadow_params"),
                    "is set but `router_shadow` is not: name the shadow strategy".into(),
                ));
            }
            (Some(""), _) => {
                return Err(invalid(at("router_shadow"), "must name a strategy".into()));
            }
            (Some(router), params) => Some(ShadowConfig {
                router: router.to_owned(),
                params: match params {
                    None | Some(serde_json::Value::Null) => {
                        serde_json::Value::Object(Default::default())
                    }
                    Some(v @ serde_json::Value::Object(_)) => v,
                    Some(_) => {
                        return Err(invalid(
                            at("shadow_params"),
                            "must be a mapping of parameter names to values".into(),
                        ));
                    }
                },
            }),
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
            let url = url::Url::parse(r.base_url.trim()).map_err(|e| {
                invalid(
                    rat("base_url"),
                    format!("`{}`: {e}", mask_url_password(&r.base_url)),
                )
            })?;
            if url.scheme() != "http" && url.scheme() != "https" {
                return Err(invalid(
                    rat("base_url"),
                    format!(
                        "`{}`: only http and https are supported",
                        mask_url_password(&r.base_url)
                    ),
                ));
            }
            if let Some(p) = &r.pricing {
                for (name, v) in [
                    ("prompt", p.prompt),
                    ("completion", p.completion),
                    ("input_cache_reads", p.input_cache_reads.unwrap_or(0.0)),
                    ("input_cache_writes", p.input_cache_writes.unwrap_or(0.0)),
                ] {
                    if !v.is_finite() || v < 0.0 {
                        return Err(invalid(
                            rat(&format!("pricing.{name}")),
                            format!("must be a finite price >= 0, got {v}"),
                        ));
                    }
                }
            }
            let stream_deadlines = crate::config::StreamDeadlineOverrides {
                first_token: seconds(r.first_token_timeout_seconds)
                    .map_err(|m| invalid(rat("first_token_timeout_seconds"), m))?,
                idle: seconds(r.idle_timeout_seconds)
                    .map_err(|m| invalid(rat("idle_timeout_seconds"), m))?,
                total: seconds(r.stream_timeout_seconds)
                    .map_err(|m| invalid(rat("stream_timeout_seconds"), m))?,
            };
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
                .map(|k| ("api_key".to_owned(), k.clone(), Default::default()))
                .chain(r.api_keys.iter().enumerate().map(|(i, k)| match k {
                    raw::RawKey::Plain(k) => {
                        (format!("api_keys[{i}]"), k.clone(), Default::default())
                    }
                    raw::RawKey::Reserved(k) => {
                        (format!("api_keys[{i}].key"), k.key.clone(), k.min_role)
                    }
                }));
            for (field, key, role) in declared {
                let key = key.trim().to_owned();
                if key.is_empty() {
                    continue;
                }
                if let Some(bad) = control_char(&key) {
                    return Err(invalid(
                        rat(&field),
                        format!(
                            "contains the control character {bad:?}; a key is sent in an HTTP \
                             header, where it would fail every request (check the variable or \
                             file it comes from)"
                        ),
                    ));
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
                stream_deadlines,
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

        let router_deadline = match m.router_deadline_ms {
            None => None,
            Some(ms) if ms == 0 || ms > max_call_timeout_ms => {
                return Err(invalid(
                    at("router_deadline_ms"),
                    format!(
                        "must be between 1 and strategies.max_call_timeout_ms ({max_call_timeout_ms})"
                    ),
                ));
            }
            Some(ms) => Some(Duration::from_millis(ms)),
        };
        models.push(ModelConfig {
            router_deadline,
            router: m
                .router
                .map(|r| r.trim().to_owned())
                .unwrap_or_else(|| default_router.clone()),
            id: m.id,
            aliases: m.aliases,
            router_params,
            shadow,
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
    let mut route_plugins = BTreeMap::new();
    for (i, mut r) in raw.routes.into_iter().enumerate() {
        let name = r.name.clone();
        let at = |field: &str| format!("routes[{i}] ({name}).{field}");
        let plugins = std::mem::take(&mut r.plugins);
        plugins
            .validate()
            .map_err(|e| invalid(at(&format!("plugins.{}", e.field)), e.message))?;
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
        if !plugins.is_empty() {
            route_plugins.insert(route.id.clone(), plugins);
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
    let logging = LoggingConfig {
        format: pick(
            path,
            env,
            "SWITCHYARD_LOG_FORMAT",
            raw.logging.format,
            LogFormat::Text,
        )?,
        level: match raw.logging.level.as_deref().map(str::trim) {
            None | Some("") => "info".to_owned(),
            Some(level) => {
                tracing_subscriber::EnvFilter::try_new(level)
                    .map_err(|e| invalid("logging.level".into(), format!("`{level}`: {e}")))?;
                level.to_owned()
            }
        },
    };
    let telemetry = telemetry_config(&raw.telemetry, env)
        .map_err(|(key, message)| invalid(key.to_owned(), message))?;
    let fleet = fleet_config(raw.fleet.as_ref(), env)
        .map_err(|(key, message)| invalid(key.to_owned(), message))?;
    let metrics_listen = match env("SWITCHYARD_METRICS_LISTEN") {
        Some(a) => Some(("environment variable SWITCHYARD_METRICS_LISTEN", a)),
        None => raw
            .server
            .metrics_listen
            .clone()
            .map(|a| ("server.metrics_listen", a)),
    }
    .map(|(key, a)| (key, a.trim().to_owned()))
    .filter(|(_, a)| !a.is_empty());
    if let Some((key, listen)) = &metrics_listen
        && let Err(message) = check_listen(listen)
    {
        return Err(invalid((*key).to_owned(), message));
    }
    let metrics_listen = metrics_listen.map(|(_, a)| a);
    let edge = edge_config(&raw.server).map_err(|(key, message)| invalid(key, message))?;
    let admin_token = match env("SWITCHYARD_ADMIN_TOKEN") {
        Some(t) => Some(("environment variable SWITCHYARD_ADMIN_TOKEN", t)),
        None => raw.server.admin_token.map(|t| ("server.admin_token", t)),
    }
    .filter(|(_, t)| !t.trim().is_empty());
    if let Some((key, token)) = &admin_token
        && let Some(bad) = control_char(token.trim())
    {
        return Err(invalid(
            (*key).to_owned(),
            format!(
                "contains the control character {bad:?}; a bearer token in an HTTP header \
                 cannot hold one, so no request could ever present it"
            ),
        ));
    }
    let admin_token = admin_token.map(|(_, t)| t);
    if let Err(message) = check_listen(&raw.server.listen) {
        return Err(invalid("server.listen".into(), message));
    }
    let s = raw.strategies;
    let record = match &s.record {
        None => None,
        Some(r) => Some(
            record_config(r)
                .map_err(|(key, message)| invalid(format!("strategies.record.{key}"), message))?,
        ),
    };
    if s.shadow_queue == Some(0) {
        return Err(invalid(
            "strategies.shadow_queue".into(),
            "must be at least 1".into(),
        ));
    }
    let u = raw.upstream;
    // A zero timeout does not mean "none": it fails every request (or every health check).
    for (key, value) in [
        ("upstream.connect_timeout_ms", u.connect_timeout_ms),
        (
            "upstream.first_byte_timeout_seconds",
            u.first_byte_timeout_seconds,
        ),
        (
            "upstream.request_timeout_seconds",
            u.request_timeout_seconds,
        ),
        (
            "routing.health_check.timeout_ms",
            raw.routing.health_check.as_ref().and_then(|h| h.timeout_ms),
        ),
    ] {
        if value == Some(0) {
            return Err(invalid(
                key.to_owned(),
                "must be greater than 0 (0 would fail every request at once)".into(),
            ));
        }
    }
    let upstream_seconds = |value: Option<f64>, key: &str, default: u64| {
        seconds(value)
            .map(|d| d.unwrap_or(Duration::from_secs(default)))
            .map_err(|m| invalid(format!("upstream.{key}"), m))
    };
    // Defaults a healthy provider never reaches: models that reason before they answer (without
    // streaming their reasoning) can take minutes to a first token, as long as a whole answer's
    // headers may take (`first_byte_timeout_seconds`); once content flows, providers send an
    // event (or a keep-alive) every few seconds; and a long answer (64k tokens at 30 tokens/s)
    // takes about 35 minutes.
    let stream_deadlines = crate::config::StreamDeadlines {
        first_token: upstream_seconds(
            u.first_token_timeout_seconds,
            "first_token_timeout_seconds",
            300,
        )?,
        idle: upstream_seconds(u.idle_timeout_seconds, "idle_timeout_seconds", 120)?,
        total: upstream_seconds(u.stream_timeout_seconds, "stream_timeout_seconds", 3600)?,
    };
    let request_log_retention_days = std::num::NonZeroU32::new(pick(
        path,
        env,
        "REQUEST_LOG_RETENTION_DAYS",
        raw.database.request_log_retention_days,
        DEFAULT_REQUEST_LOG_RETENTION_DAYS,
    )?);
    Ok(Config {
        source: path.to_owned(),
        server: ServerConfig {
            listen: raw.server.listen,
            admin_token,
            trusted_proxies,
            default_auth,
            default_max_attempts: default_max_attempts as usize,
            max_body_bytes: (raw.server.max_body_mib.unwrap_or(32).max(1) as usize) << 20,
            edge,
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
            metrics_listen,
        },
        logging,
        telemetry,
        fleet,
        database_url: resolve_sqlite_url(&raw.database.url, path),
        request_log_retention_days,
        strategies: StrategiesConfig {
            dir: s.dir,
            builtin_dir: s.builtin_dir,
            call_timeout: Duration::from_millis(s.call_timeout_ms.unwrap_or(5).max(1)),
            max_call_timeout: Duration::from_millis(max_call_timeout_ms),
            memory_limit_bytes: (s.memory_limit_mib.unwrap_or(64).max(1) as usize) << 20,
            tick_interval: match s.tick_interval_ms.unwrap_or(1000) {
                0 => None,
                ms => Some(Duration::from_millis(ms)),
            },
            // Long enough for an interpreted guest's cold compile (12-23 s measured).
            load_wait: Duration::from_millis(s.load_wait_ms.unwrap_or(30_000)),
            shadow_queue: s.shadow_queue.unwrap_or(256),
            record,
        },
        routing: RoutingConfig {
            default_router,
            public_routing_endpoint: raw.routing.public_routing_endpoint,
            public_health_deep: raw.routing.public_health_deep,
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
            stream_deadlines,
            // Well above any real completion; a limit only so that a broken or hostile upstream
            // cannot make the gateway hold gigabytes.
            max_body_bytes: (u.max_body_mib.unwrap_or(64).max(1) as usize) << 20,
            max_event_bytes: (u.max_event_kib.unwrap_or(1024).max(1) as usize) << 10,
        },
        models,
        routes,
        route_plugins,
        lines,
    })
}

/// The first control character in `value` (CR, LF, NUL, TAB, DEL…), if any.
fn control_char(value: &str) -> Option<char> {
    value.chars().find(|c| c.is_control())
}

/// `listen` must be `IP:PORT` or `HOST:PORT` (a host name is resolved when binding).
/// A relative SQLite file (`sqlite://sy.db`, `sqlite:sy.db`) is relative to the config file's
/// folder, like `strategies.dir`, not to whatever folder the process was started from. Absolute
/// paths, `:memory:` and other databases are left as written; a `?query` is kept.
pub(super) fn resolve_sqlite_url(url: &str, config_file: &Path) -> String {
    let Some(rest) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    else {
        return url.to_owned();
    };
    let (file, query) = match rest.split_once('?') {
        Some((file, query)) => (file, Some(query)),
        None => (rest, None),
    };
    if file.is_empty() || file.starts_with(':') || Path::new(file).is_absolute() {
        return url.to_owned();
    }
    let folder = config_file.parent().unwrap_or_else(|| Path::new("."));
    let resolved = folder.join(file);
    match query {
        Some(query) => format!("sqlite://{}?{query}", resolved.display()),
        None => format!("sqlite://{}", resolved.display()),
    }
}

fn check_listen(listen: &str) -> Result<(), String> {
    if listen.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let hint = "expected a socket address such as 127.0.0.1:8080, [::1]:8080 or localhost:8080";
    let Some((host, port)) = listen.rsplit_once(':') else {
        return Err(format!("`{listen}` is not a socket address: {hint}"));
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if host_ok && port.parse::<u16>().is_ok() {
        Ok(())
    } else {
        Err(format!("`{listen}` is not a socket address: {hint}"))
    }
}

/// `telemetry:` with OpenTelemetry's standard variables, which win over the file as the
/// gateway's own variables do: `OTEL_SDK_DISABLED=true` turns traces off,
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is used as written, `OTEL_EXPORTER_OTLP_ENDPOINT` and
/// `telemetry.otlp_endpoint` are base URLs that get `/v1/traces` (the OTLP/HTTP convention). An
/// error names the key or variable.
fn telemetry_config(
    raw: &raw::RawTelemetry,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<TelemetryConfig, (&'static str, String)> {
    let set = |var: &str| {
        env(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let disabled = set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let file = raw
        .otlp_endpoint
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let source = if disabled {
        None
    } else if let Some(url) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        Some((
            "environment variable OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            url,
            false,
        ))
    } else if let Some(url) = set("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Some((
            "environment variable OTEL_EXPORTER_OTLP_ENDPOINT",
            url,
            true,
        ))
    } else {
        file.map(|url| ("telemetry.otlp_endpoint", url.to_owned(), true))
    };
    let otlp_traces_endpoint = match source {
        None => None,
        Some((key, url, base)) => {
            let parsed = url::Url::parse(&url).ok().filter(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host_str().is_some_and(|h| !h.is_empty())
            });
            if parsed.is_none() {
                return Err((
                    key,
                    format!(
                        "`{}` is not an http:// or https:// URL (an OTLP/HTTP collector, such as http://127.0.0.1:4318)",
                        mask_url_password(&url)
                    ),
                ));
            }
            Some(if base {
                format!("{}/v1/traces", url.trim_end_matches('/'))
            } else {
                url
            })
        }
    };
    Ok(TelemetryConfig {
        otlp_traces_endpoint,
        service_name: set("OTEL_SERVICE_NAME").unwrap_or_else(|| "switchyard".to_owned()),
    })
}

/// `fleet:`, with `SWITCHYARD_REDIS_URL` winning over `fleet.redis_url` (and enough on its own).
/// An error names the key or variable.
fn fleet_config(
    raw: Option<&raw::RawFleet>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<FleetConfig>, (&'static str, String)> {
    let from_env = env("SWITCHYARD_REDIS_URL")
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .map(|url| ("environment variable SWITCHYARD_REDIS_URL", url));
    let from_file = raw
        .and_then(|r| r.redis_url.as_deref())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|url| ("fleet.redis_url", url.to_owned()));
    let Some((key, redis_url)) = from_env.or(from_file) else {
        return match raw {
            Some(_) => Err((
                "fleet.redis_url",
                "is required when `fleet:` is present (redis://host:6379)".into(),
            )),
            None => Ok(None),
        };
    };
    let scheme_ok = url::Url::parse(&redis_url).is_ok_and(|u| {
        matches!(u.scheme(), "redis" | "rediss") && u.host_str().is_some_and(|h| !h.is_empty())
    });
    if !scheme_ok {
        return Err((
            key,
            format!(
                "`{}` is not a redis:// or rediss:// URL (such as redis://127.0.0.1:6379)",
                mask_url_password(&redis_url)
            ),
        ));
    }
    let default = raw::RawFleet::default();
    let raw = raw.unwrap_or(&default);
    let key_prefix = raw.key_prefix.as_deref().unwrap_or("switchyard").trim();
    if key_prefix.is_empty()
        || key_prefix
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err((
            "fleet.key_prefix",
            format!("`{key_prefix}` must be non-empty, without spaces or control characters"),
        ));
    }
    let deadline_ms = raw.deadline_ms.unwrap_or(5);
    if !(1..=1000).contains(&deadline_ms) {
        return Err((
            "fleet.deadline_ms",
            format!("{deadline_ms} is outside 1..=1000 (milliseconds a request may wait on Redis)"),
        ));
    }
    let backlog_ms = raw.backlog_publish_ms.unwrap_or(200);
    if !(50..=10_000).contains(&backlog_ms) {
        return Err((
            "fleet.backlog_publish_ms",
            format!("{backlog_ms} is outside 50..=10000 (milliseconds)"),
        ));
    }
    Ok(Some(FleetConfig {
        redis_url,
        key_prefix: key_prefix.to_owned(),
        deadline: Duration::from_millis(deadline_ms),
        backlog_publish: Duration::from_millis(backlog_ms),
    }))
}

/// A number of seconds from the config: `None` stays `None`; it must be finite and above 0.
fn seconds(value: Option<f64>) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(v) if v.is_finite() && v > 0.0 => Ok(Some(Duration::from_secs_f64(v))),
        Some(v) => Err(format!("must be a number of seconds > 0, got {v}")),
    }
}

/// `server.*` bounds on client connections; an error names its key.
fn edge_config(server: &raw::RawServer) -> Result<EdgeConfig, (String, String)> {
    let d = EdgeConfig::default();
    let seconds = |key: &str, value: Option<f64>, default: Duration| match value {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err((
            format!("server.{key}"),
            format!("must be a number of seconds above 0 and at most 86400, got {s}"),
        )),
    };
    let max_connections = match server.max_connections {
        None => None,
        Some(0) => {
            return Err(("server.max_connections".into(), "must be at least 1".into()));
        }
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    Ok(EdgeConfig {
        header_read_timeout: seconds(
            "header_read_timeout_seconds",
            server.header_read_timeout_seconds,
            d.header_read_timeout,
        )?,
        request_body_timeout: seconds(
            "request_body_timeout_seconds",
            server.request_body_timeout_seconds,
            d.request_body_timeout,
        )?,
        client_write_timeout: seconds(
            "client_write_timeout_seconds",
            server.client_write_timeout_seconds,
            d.client_write_timeout,
        )?,
        max_connections,
        shutdown_grace: seconds(
            "shutdown_grace_seconds",
            server.shutdown_grace_seconds,
            d.shutdown_grace,
        )?,
    })
}

/// `strategies.record`, checked; an error names the key under `strategies.record`.
fn record_config(r: &raw::RawRecord) -> Result<RecordConfig, (&'static str, String)> {
    let sample_rate = r.sample_rate.unwrap_or(0.01);
    if !(sample_rate > 0.0 && sample_rate <= 1.0) {
        return Err((
            "sample_rate",
            format!(
                "must be a fraction in (0, 1], got {sample_rate} (remove `record:` to record nothing)"
            ),
        ));
    }
    let max_file_mib = r.max_file_mib.unwrap_or(64);
    if max_file_mib == 0 {
        return Err(("max_file_mib", "must be at least 1".into()));
    }
    let max_files = r.max_files.unwrap_or(4);
    if max_files == 0 {
        return Err(("max_files", "must be at least 1".into()));
    }
    let queue = r.queue.unwrap_or(1024);
    if queue == 0 {
        return Err(("queue", "must be at least 1".into()));
    }
    let path = r
        .path
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("decisions.jsonl"));
    if path.as_os_str().is_empty() {
        return Err(("path", "must name a file".into()));
    }
    Ok(RecordConfig {
        sample_rate,
        path,
        max_file_bytes: max_file_mib.saturating_mul(1 << 20),
        max_files,
        queue,
    })
}
