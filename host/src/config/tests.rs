use std::path::Path;
use std::time::Duration;

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
        "test.yaml:6: models[0] (m).route[0].weight: must be a finite number >= 0, got -1"
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
fn request_log_retention_comes_from_env_then_file_then_thirty_days() {
    let days = |text: &str, env: &dyn Fn(&str) -> Option<String>| {
        Config::from_yaml(Path::new("t.yaml"), text, env)
            .map(|c| c.request_log_retention_days.map(std::num::NonZeroU32::get))
    };
    let none = |_: &str| None;
    assert_eq!(days("", &none).unwrap(), Some(30));
    let file = "database:\n  request_log_retention_days: 7\n";
    assert_eq!(days(file, &none).unwrap(), Some(7));
    let keep_all = "database:\n  request_log_retention_days: 0\n";
    assert_eq!(days(keep_all, &none).unwrap(), None, "0 keeps every row");
    let env = |name: &str| (name == "REQUEST_LOG_RETENTION_DAYS").then(|| "90".to_owned());
    assert_eq!(days(file, &env).unwrap(), Some(90), "environment wins");
    let negative = "database:\n  request_log_retention_days: -1\n";
    let err = days(negative, &none).unwrap_err().to_string();
    assert!(
        err.starts_with("t.yaml:2:") && err.contains("database.request_log_retention_days"),
        "{err}"
    );
}

#[test]
fn defaults_fill_in() {
    let c = load(
        "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1/\n",
    )
    .unwrap();
    assert_eq!(c.models[0].router, "fixed");
    let r = &c.models[0].upstreams[0];
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
        .upstreams
        .iter()
        .map(|r| r.endpoint_id.as_str())
        .collect();
    assert_eq!(ids, ["m:anthropic-api", "m:anthropic-api-2"]);
}

#[test]
fn every_example_config_parses() {
    // At run time: a test binary cargo did not rebuild for a new clone holds an earlier clone's path.
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../config");
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

#[test]
fn the_otlp_endpoint_comes_from_the_file_or_the_standard_variables_and_must_be_http() {
    let off = load("").unwrap();
    assert_eq!(off.telemetry.otlp_traces_endpoint, None);
    assert_eq!(off.telemetry.service_name, "switchyard");
    let file = load("telemetry:\n  otlp_endpoint: http://127.0.0.1:4318/\n").unwrap();
    assert_eq!(
        file.telemetry.otlp_traces_endpoint.as_deref(),
        Some("http://127.0.0.1:4318/v1/traces")
    );
    let yaml = "telemetry:\n  otlp_endpoint: http://file:4318\n";
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |var: &str| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let base = Config::from_yaml(
        Path::new("test.yaml"),
        yaml,
        &env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://env:4318/prefix"),
            ("OTEL_SERVICE_NAME", "gateway-eu"),
        ]),
    )
    .unwrap();
    assert_eq!(
        base.telemetry.otlp_traces_endpoint.as_deref(),
        Some("https://env:4318/prefix/v1/traces")
    );
    assert_eq!(base.telemetry.service_name, "gateway-eu");
    let signal = Config::from_yaml(
        Path::new("test.yaml"),
        yaml,
        &env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://env:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:9999/custom",
            ),
        ]),
    )
    .unwrap();
    assert_eq!(
        signal.telemetry.otlp_traces_endpoint.as_deref(),
        Some("http://traces:9999/custom")
    );
    let disabled = Config::from_yaml(
        Path::new("test.yaml"),
        yaml,
        &env(&[("OTEL_SDK_DISABLED", "true")]),
    )
    .unwrap();
    assert_eq!(disabled.telemetry.otlp_traces_endpoint, None);

    for bad in ["127.0.0.1:4318", "grpc://collector:4317", "http://"] {
        let err = load(&format!(
            "server: {{}}\ntelemetry:\n  otlp_endpoint: \"{bad}\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(&format!(
                "test.yaml:3: telemetry.otlp_endpoint: `{bad}` is not an http:// or https:// URL"
            )),
            "{err}"
        );
    }
    let err = Config::from_yaml(
        Path::new("test.yaml"),
        "",
        &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("test.yaml: environment variable OTEL_EXPORTER_OTLP_ENDPOINT: `collector:4318` is not an http"),
        "{err}"
    );
    let err = load("telemetry:\n  otlp_endpoints: http://x\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("telemetry: unknown field `otlp_endpoints`"),
        "{err}"
    );
}

#[test]
fn logging_and_the_metrics_listener_are_read_from_the_file_and_the_environment() {
    let config = load("server:\n  metrics_listen: 127.0.0.1:9464\nlogging:\n  format: json\n  level: warn,switchyard=debug\n").unwrap();
    assert_eq!(config.logging.format, LogFormat::Json);
    assert_eq!(config.logging.level, "warn,switchyard=debug");
    assert_eq!(
        config.server.metrics_listen.as_deref(),
        Some("127.0.0.1:9464")
    );
    let defaults = load("").unwrap();
    assert_eq!(defaults.logging.format, LogFormat::Text);
    assert_eq!(defaults.logging.level, "info");
    assert_eq!(defaults.server.metrics_listen, None);
    let env = |var: &str| match var {
        "SWITCHYARD_LOG_FORMAT" => Some("json".to_owned()),
        "SWITCHYARD_METRICS_LISTEN" => Some("0.0.0.0:9464".to_owned()),
        _ => None,
    };
    let from_env = Config::from_yaml(Path::new("test.yaml"), "", &env).unwrap();
    assert_eq!(from_env.logging.format, LogFormat::Json);
    assert_eq!(
        from_env.server.metrics_listen.as_deref(),
        Some("0.0.0.0:9464")
    );

    let err = load("logging:\n  format: xml\n").unwrap_err().to_string();
    assert!(
        err.contains("logging.format: unknown variant `xml`"),
        "{err}"
    );
    let err = load("logging:\n  level: switchyard=loud\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("test.yaml:2: logging.level: `switchyard=loud`"),
        "{err}"
    );
    let err = load("server:\n  metrics_listen: 9464\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("test.yaml:2: server.metrics_listen: `9464` is not a socket address"),
        "{err}"
    );
}

#[test]
fn variables_are_interpolated_into_scalar_values_with_their_types() {
    let env = |name: &str| match name {
        "KEY" => Some("sk-a #b".to_owned()),
        "PM" => Some("pm\nserver:\n  default_auth: disabled".to_owned()),
        "W" => Some("0.5".to_owned()),
        "P" => Some("-3".to_owned()),
        "LOCAL" => Some("true".to_owned()),
        "ALPHA" => Some("0.25".to_owned()),
        _ => None,
    };
    let c = Config::from_yaml(
        Path::new("t.yaml"),
        "models:\n  - id: m\n    router_params: { budget_alpha: \"${ALPHA}\", label: \"x ${W}\" }\n    route:\n      - kind: ${KIND:-anthropic}\n        base_url: http://127.0.0.1:9001\n        weight: ${W}\n        priority: ${P}\n        local_deployment: ${LOCAL}\n        api_key: ${KEY} # ${NOT_NEEDED}\n        provider_model_id: ${PM}\n",
        &env,
    )
    .unwrap();
    let r = &c.models[0].upstreams[0];
    assert_eq!(r.kind, ProviderKind::Anthropic);
    assert_eq!(r.weight, 0.5);
    assert_eq!(r.priority, -3);
    assert!(r.local_deployment);
    assert_eq!(r.api_key.as_deref(), Some("sk-a #b"));
    assert_eq!(r.provider_model_id, "pm\nserver:\n  default_auth: disabled");
    assert_eq!(c.server.default_auth, DefaultAuth::ConsumerKeys);
    assert_eq!(
        c.models[0].router_params,
        serde_json::json!({ "budget_alpha": 0.25, "label": "x 0.5" })
    );
}

#[test]
fn a_missing_variable_is_reported_at_its_line() {
    let err = load("server:\n  listen: 127.0.0.1:1\n  admin_token: ${NOPE}\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "test.yaml:3: environment variable NOPE is not set (write ${NOPE:-} to make it optional)"
    );
}

#[test]
fn client_connection_bounds_have_defaults_and_name_their_key_when_invalid() {
    let c = load("").unwrap();
    assert_eq!(c.server.edge.header_read_timeout, Duration::from_secs(30));
    assert_eq!(c.server.edge.request_body_timeout, Duration::from_secs(60));
    assert_eq!(c.server.edge.client_write_timeout, Duration::from_secs(60));
    assert_eq!(c.server.edge.shutdown_grace, Duration::from_secs(30));
    assert_eq!(c.server.edge.max_connections, None);
    let c = load(
        "server:\n  header_read_timeout_seconds: 2.5\n  client_write_timeout_seconds: 90\n  max_connections: 100\n  shutdown_grace_seconds: 5\n",
    )
    .unwrap();
    assert_eq!(c.server.edge.client_write_timeout, Duration::from_secs(90));
    assert_eq!(
        c.server.edge.header_read_timeout,
        Duration::from_millis(2500)
    );
    assert_eq!(c.server.edge.max_connections, Some(100));
    assert_eq!(c.server.edge.shutdown_grace, Duration::from_secs(5));
    let err = load("server:\n  request_body_timeout_seconds: 0\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "test.yaml:2: server.request_body_timeout_seconds: must be a number of seconds above 0 and at most 86400, got 0"
    );
    let err = load("server:\n  client_write_timeout_seconds: -1\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "test.yaml:2: server.client_write_timeout_seconds: must be a number of seconds above 0 and at most 86400, got -1"
    );
    let err = load("server:\n  max_connections: 0\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "test.yaml:2: server.max_connections: must be at least 1"
    );
}

#[test]
fn a_yaml_routes_plugins_are_read_and_checked_with_their_line() {
    let route = "routes:\n  - name: team\n    path_prefix: /team\n    plugins:\n      rate-limit:\n        limits:\n          - scope: api_key\n            per_model: true\n";
    let config = load(&format!("{route}            tokens_per_minute: 500\n")).unwrap();
    let plugins = &config.route_plugins["yaml:team"];
    let limits = &plugins.rate_limit.as_ref().unwrap().limits;
    assert_eq!(limits[0].scope, crate::entity::LimitScope::ApiKey);
    assert_eq!(limits[0].tokens_per_minute, Some(500));
    assert!(limits[0].per_model);
    // The route table carries it, parsed, and `/routing` shows it by plugin name.
    let set = crate::inbound_routes::RouteSet::build(&config, &crate::store::Snapshot::empty());
    let team = &set.routes()[0];
    assert_eq!(
        team.rate_limit.as_ref().unwrap().as_ref().unwrap().limits,
        *limits
    );
    assert_eq!(
        team.plugins["rate-limit"]["limits"][0]["tokens_per_minute"],
        500
    );

    let err = load(&format!("{route}            tokens_per_minute: 0\n"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "test.yaml:9: routes[0] (team).plugins.rate-limit.limits[0].tokens_per_minute: must be between 1 and 1000000000, got 0"
    );
    let err = load(&format!("{route}            tokens_per_minut: 5\n"))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("test.yaml:9:"), "{err}");
    assert!(
        err.contains("routes[0].plugins.rate-limit.limits[0]: unknown field `tokens_per_minut`"),
        "{err}"
    );
}

#[test]
fn fleet_is_optional_and_its_mistakes_name_the_key() {
    assert_eq!(load("").unwrap().fleet, None, "no fleet: state per process");
    let c = load("fleet:\n  redis_url: redis://127.0.0.1:6379/2\n").unwrap();
    let fleet = c.fleet.unwrap();
    assert_eq!(fleet.key_prefix, "switchyard");
    assert_eq!(fleet.deadline, Duration::from_millis(5));
    assert_eq!(fleet.backlog_publish, Duration::from_millis(200));

    let err = load("fleet:\n  redis_url: redis://r:6379\n  dedline_ms: 3\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("test.yaml:3:"), "{err}");
    assert!(err.contains("fleet: unknown field `dedline_ms`"), "{err}");
    let err = load("fleet:\n  redis_url: http://r:6379\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("fleet.redis_url: `http://r:6379` is not a redis:// or rediss:// URL"),
        "{err}"
    );
    let err = load("fleet:\n  redis_url: redis://:secret@r:6379\n  deadline_ms: 0\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("fleet.deadline_ms: 0 is outside 1..=1000"),
        "{err}"
    );
    let err = load("fleet:\n  key_prefix: sy\n").unwrap_err().to_string();
    assert!(err.contains("fleet.redis_url: is required"), "{err}");

    // The environment's URL wins, and is enough on its own.
    let env = |name: &str| (name == "SWITCHYARD_REDIS_URL").then(|| "redis://env:6379".to_owned());
    let c = Config::from_yaml(Path::new("t.yaml"), "", &env).unwrap();
    assert_eq!(c.fleet.unwrap().redis_url, "redis://env:6379");
    let bad = |name: &str| (name == "SWITCHYARD_REDIS_URL").then(|| "redis://u:pw@".to_owned());
    let err = Config::from_yaml(Path::new("t.yaml"), "", &bad)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("environment variable SWITCHYARD_REDIS_URL") && !err.contains("pw"),
        "the password is masked: {err}"
    );
}

#[test]
fn a_relative_sqlite_file_is_relative_to_the_config_file() {
    use super::validate::resolve_sqlite_url;
    let config = std::path::Path::new("/etc/switchyard/config.yaml");
    assert_eq!(
        resolve_sqlite_url("sqlite://sy.db", config),
        "sqlite:///etc/switchyard/sy.db"
    );
    assert_eq!(
        resolve_sqlite_url("sqlite:data/sy.db?mode=rwc", config),
        "sqlite:///etc/switchyard/data/sy.db?mode=rwc"
    );
    for kept in [
        "sqlite:///var/lib/switchyard/sy.db",
        "sqlite::memory:",
        "postgres://u@db/switchyard",
    ] {
        assert_eq!(resolve_sqlite_url(kept, config), kept);
    }
    // A config given by a relative path keeps the database beside it, relative to the same folder.
    assert_eq!(
        resolve_sqlite_url(
            "sqlite://switchyard.db",
            std::path::Path::new("config/switchyard.yaml")
        ),
        "sqlite://config/switchyard.db"
    );
}

#[test]
fn shadow_and_record_are_read_with_their_defaults_and_checked() {
    let route =
        "    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n";
    let c = load(&format!(
        "strategies:\n  record: {{sample_rate: 0.5}}\nmodels:\n  - id: m\n    router_shadow: round_robin\n{route}  - id: n\n{route}"
    ))
    .unwrap();
    let shadow = c.models[0].shadow.as_ref().unwrap();
    assert_eq!(shadow.router, "round_robin");
    assert_eq!(shadow.params, serde_json::json!({}));
    assert!(c.models[1].shadow.is_none());
    assert_eq!(c.strategies.shadow_queue, 256);
    assert_eq!(
        c.strategies.record,
        Some(RecordConfig {
            sample_rate: 0.5,
            path: "decisions.jsonl".into(),
            max_file_bytes: 64 << 20,
            max_files: 4,
            queue: 1024,
        })
    );
    assert!(load("models: []\n").unwrap().strategies.record.is_none());

    let err = load(&format!(
        "models:\n  - id: m\n    shadow_params: {{}}\n{route}"
    ))
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "test.yaml:3: models[0] (m).shadow_params: is set but `router_shadow` is not: name the shadow strategy"
    );
    let err = load(&format!(
        "models:\n  - id: m\n    router_shadow: fixed\n    shadow_params: [1]\n{route}"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("models[0] (m).shadow_params: must be a mapping"),
        "{err}"
    );
    let err = load("strategies:\n  record: {sample_rate: 0}\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("test.yaml:2: strategies.record.sample_rate: must be a fraction in (0, 1]"),
        "{err}"
    );
    let err = load("strategies:\n  record: {max_files: 0}\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("strategies.record.max_files: must be at least 1"),
        "{err}"
    );
    let err = load("strategies:\n  record: {sampel_rate: 1}\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `sampel_rate`"), "{err}");
}
