//! The validated, runtime form of the config: what the rest of the host reads.

use std::path::PathBuf;
use std::time::Duration;

use super::{Capability, DefaultAuth, ProviderKind, raw};

/// The validated, runtime form of the config.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this config came from; relative paths inside it resolve against its folder.
    pub source: PathBuf,
    pub server: ServerConfig,
    pub database_url: String,
    /// Days (of 24 hours) of request-log rows kept; `None` keeps every row.
    pub request_log_retention_days: Option<std::num::NonZeroU32>,
    pub strategies: StrategiesConfig,
    pub routing: RoutingConfig,
    pub upstream: UpstreamClientConfig,
    pub health: crate::routing::health::HealthConfig,
    pub logging: LoggingConfig,
    pub telemetry: TelemetryConfig,
    /// `fleet:` (or `SWITCHYARD_REDIS_URL`); `None`: routing state is per process.
    pub fleet: Option<FleetConfig>,
    pub models: Vec<ModelConfig>,
    /// Inbound routes declared in the file, validated like the database's (ids `yaml:NAME`).
    pub routes: Vec<crate::entity::Route>,
    /// The plugins of the file's routes (`routes[].plugins`), by route id; routes without any are
    /// absent.
    pub route_plugins: std::collections::BTreeMap<String, crate::entity::RoutePlugins>,
    /// The file's text, to give later errors (a model's strategy) the line of their key.
    pub lines: super::KeyLines,
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
    /// Client connections: head and body deadlines, the connection cap, the drain deadline.
    pub edge: EdgeConfig,
    /// Most messages and nested parts of one chat request, checked as its body is read.
    pub request_limits: crate::protocol::json::Limits,
    /// The metrics-only listener's address (`server.metrics_listen`).
    pub metrics_listen: Option<String>,
}

/// Bounds on what a client connection may hold (`server.*` in the file).
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// The whole request head, from connection open or the end of the previous response (the
    /// keep-alive idle time counts).
    pub header_read_timeout: Duration,
    /// The whole request body, from the end of its head.
    pub request_body_timeout: Duration,
    /// A write of an answer that moves nothing (the client stopped reading).
    pub client_write_timeout: Duration,
    /// Connections held at once; `None` derives the cap from the process's file limit.
    pub max_connections: Option<usize>,
    /// From SIGTERM to the end of the requests still in flight.
    pub shutdown_grace: Duration,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            request_body_timeout: Duration::from_secs(60),
            client_write_timeout: Duration::from_secs(60),
            max_connections: None,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// `logging:`, validated.
#[derive(Debug, Clone)]
pub struct LoggingConfig {
    pub format: super::LogFormat,
    /// An `EnvFilter` directive.
    pub level: String,
}

/// `telemetry:`, validated, with the standard OpenTelemetry environment variables applied.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// Where spans are POSTed (OTLP/HTTP protobuf), the `/v1/traces` path included; `None`:
    /// tracing is off.
    pub otlp_traces_endpoint: Option<String>,
    /// `service.name` of the exported spans (`OTEL_SERVICE_NAME`, default `switchyard`).
    pub service_name: String,
}

/// `fleet:`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    pub redis_url: String,
    pub key_prefix: String,
    /// The most a request waits on Redis.
    pub deadline: Duration,
    /// How often the prefill backlog is published and read.
    pub backlog_publish: Duration,
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
    /// The longest deadline a strategy may declare or a model may set.
    pub max_call_timeout: Duration,
    pub memory_limit_bytes: usize,
    pub tick_interval: Option<Duration>,
    /// How long a request waits for its model's strategy while strategies load.
    pub load_wait: Duration,
    /// Calls waiting for one model's shadow strategy before new ones are dropped.
    pub shadow_queue: usize,
    /// `None`: no decision is recorded.
    pub record: Option<RecordConfig>,
}

/// `strategies.record`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordConfig {
    /// Fraction of decisions recorded, in (0, 1].
    pub sample_rate: f64,
    /// As written; relative to the config file (`Config::resolve_path`).
    pub path: PathBuf,
    pub max_file_bytes: u64,
    pub max_files: u32,
    pub queue: usize,
}

/// A model's shadow strategy (`router_shadow` and `shadow_params`).
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowConfig {
    pub router: String,
    pub params: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct RoutingConfig {
    pub default_router: String,
    pub public_routing_endpoint: bool,
    /// `GET /health/deep` without admin credentials.
    pub public_health_deep: bool,
    pub local_fraction: Option<f64>,
    pub health_check: Option<HealthCheckConfig>,
    pub affinity: crate::routing::affinity::AffinityConfig,
    pub prefill: crate::routing::prefill::PrefillConfig,
    pub database_models: DatabaseModelsConfig,
    pub key_pools: crate::routing::key_pools::KeyPoolConfig,
}

#[derive(Debug, Clone, Copy)]
pub struct HealthCheckConfig {
    pub interval: Duration,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct UpstreamClientConfig {
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub request_timeout: Duration,
    /// The stream deadlines of upstreams that set none of their own.
    pub stream_deadlines: StreamDeadlines,
    /// Largest whole answer read from an upstream.
    pub max_body_bytes: usize,
    /// Largest single event (or line) of an upstream stream.
    pub max_event_bytes: usize,
}

/// How long a stream may take at each stage. Before its first content only `first_token` and
/// `total` apply (a reasoning model may think silently for minutes); after it, `idle` and `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamDeadlines {
    /// From dispatch to the first content or tool-call delta.
    pub first_token: Duration,
    /// Between two upstream events once content flows.
    pub idle: Duration,
    /// From dispatch to the end of the stream.
    pub total: Duration,
}

/// An upstream's own stream deadlines; `None` keeps the `upstream:` section's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamDeadlineOverrides {
    pub first_token: Option<Duration>,
    pub idle: Option<Duration>,
    pub total: Option<Duration>,
}

impl StreamDeadlines {
    /// These deadlines with `overrides` applied.
    pub fn with(self, overrides: &StreamDeadlineOverrides) -> StreamDeadlines {
        StreamDeadlines {
            first_token: overrides.first_token.unwrap_or(self.first_token),
            idle: overrides.idle.unwrap_or(self.idle),
            total: overrides.total.unwrap_or(self.total),
        }
    }
}

/// One public model and its upstreams (YAML `route:`), in declared order.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub id: String,
    pub aliases: Vec<String>,
    pub router: String,
    pub router_params: serde_json::Value,
    /// `router_deadline_ms`: the deadline of this model's strategy calls, when set.
    pub router_deadline: Option<Duration>,
    /// `router_shadow`: a strategy that decides beside the real one, never acted on.
    pub shadow: Option<ShadowConfig>,
    pub published: bool,
    pub upstreams: Vec<ModelUpstream>,
}

/// One upstream a model can be served by.
#[derive(Debug, Clone)]
pub struct ModelUpstream {
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
    /// Stream deadlines of this upstream's own, over the `upstream:` section's.
    pub stream_deadlines: StreamDeadlineOverrides,
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
