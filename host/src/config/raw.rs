//! The config file as written: strict serde structs, one per YAML section.
//!
//! Every struct rejects unknown keys so a typo fails at startup instead of silently becoming a default.
//! Validation that needs more than one field (duplicate ids, URLs, weights) happens in [`super::load`].

use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub database: RawDatabase,
    #[serde(default)]
    pub strategies: RawStrategies,
    #[serde(default)]
    pub routing: RawRouting,
    #[serde(default)]
    pub upstream: RawUpstreamClient,
    #[serde(default)]
    pub health: RawHealth,
    #[serde(default)]
    pub logging: RawLogging,
    #[serde(default)]
    pub telemetry: RawTelemetry,
    /// Shared routing state across replicas (Redis); absent: everything stays per process.
    pub fleet: Option<RawFleet>,
    /// Inbound routes (path prefixes and their authentication), beside those in the database.
    #[serde(default)]
    pub routes: Vec<crate::entity::NewRoute>,
    #[serde(default)]
    pub models: Vec<RawModel>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Bearer token of the admin API; `SWITCHYARD_ADMIN_TOKEN` wins when set.
    pub admin_token: Option<String>,
    /// Peers (addresses or CIDR ranges) whose `X-Forwarded-For` is believed.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Authentication of the implicit `/` route used when no route is declared anywhere;
    /// `SWITCHYARD_DEFAULT_AUTH` wins when set.
    #[serde(default)]
    pub default_auth: Option<DefaultAuth>,
    /// `max_attempts` of that implicit route (default 2).
    pub default_max_attempts: Option<i64>,
    /// Largest request body accepted, in MiB (default 32: room for base64 images).
    pub max_body_mib: Option<u64>,
    /// Time a client has to send a request's head, counted from when its connection opened or
    /// its previous response ended; so also how long an idle keep-alive connection stays open
    /// (default 30).
    pub header_read_timeout_seconds: Option<f64>,
    /// Time a client has to send a whole request body once its head is in (default 60).
    pub request_body_timeout_seconds: Option<f64>,
    /// Time a write of an answer to a client may move nothing before the connection is closed
    /// (the client stopped reading; default 60).
    pub client_write_timeout_seconds: Option<f64>,
    /// Client connections held at once; more are answered 503 and closed (default: derived from
    /// the process's file limit).
    pub max_connections: Option<u64>,
    /// After SIGTERM, how long in-flight requests may run before they are ended (default 30).
    pub shutdown_grace_seconds: Option<f64>,
    /// Most messages in one chat request (default 100,000).
    pub max_messages: Option<u64>,
    /// Most content parts and other nested JSON objects in one chat request (default 200,000).
    pub max_content_parts: Option<u64>,
    /// A second listener that serves only `GET /metrics`, without the admin token (for a
    /// scraper on a private network); `SWITCHYARD_METRICS_LISTEN` wins when set.
    pub metrics_listen: Option<String>,
}

/// `logging:`: how the process logs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLogging {
    /// `text` (default) or `json` (one object per line); `SWITCHYARD_LOG_FORMAT` wins when set.
    pub format: Option<LogFormat>,
    /// An `EnvFilter` directive such as `info` or `info,switchyard=debug` (default `info`);
    /// `RUST_LOG` wins when set.
    pub level: Option<String>,
}

/// `telemetry:`: what the process exports besides its logs and `/metrics`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// The OTLP/HTTP collector's base URL (`http://collector:4318`): spans are POSTed to
    /// `/v1/traces` under it. Unset (and no `OTEL_EXPORTER_OTLP_ENDPOINT`): no traces.
    pub otlp_endpoint: Option<String>,
}

/// `fleet:`: the replicas that serve as one gateway, and the Redis they share routing state on.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFleet {
    /// `redis://host:port/db` (or `rediss://`); `SWITCHYARD_REDIS_URL` wins when set.
    pub redis_url: Option<String>,
    /// Prefix of every key and channel, so several fleets can share one Redis (default
    /// `switchyard`).
    pub key_prefix: Option<String>,
    /// The most a request waits on Redis, in milliseconds (default 5): a probe claim or a stateful
    /// route's admission that takes longer falls back as documented in the README.
    pub deadline_ms: Option<u64>,
    /// How often each replica publishes its prefill backlog and reads the others' (default 200).
    pub backlog_publish_ms: Option<u64>,
}

/// The log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with the request span's fields.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.trim() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(()),
        }
    }
}

/// How the implicit route authenticates callers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DefaultAuth {
    /// Consumer API keys from the database: secure by default.
    #[default]
    ConsumerKeys,
    /// Anyone who can reach the port may call.
    Disabled,
}

impl std::str::FromStr for DefaultAuth {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.trim() {
            "consumer_keys" => Ok(DefaultAuth::ConsumerKeys),
            "disabled" => Ok(DefaultAuth::Disabled),
            _ => Err(()),
        }
    }
}

impl Default for RawServer {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            admin_token: None,
            trusted_proxies: Vec::new(),
            default_auth: None,
            default_max_attempts: None,
            max_body_mib: None,
            metrics_listen: None,
            header_read_timeout_seconds: None,
            request_body_timeout_seconds: None,
            client_write_timeout_seconds: None,
            max_connections: None,
            shutdown_grace_seconds: None,
            max_messages: None,
            max_content_parts: None,
        }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDatabase {
    #[serde(default = "default_database_url")]
    pub url: String,
    /// Days of request-log rows kept (`REQUEST_LOG_RETENTION_DAYS`); 0 keeps every row.
    pub request_log_retention_days: Option<u32>,
}

impl Default for RawDatabase {
    fn default() -> Self {
        Self {
            url: default_database_url(),
            request_log_retention_days: None,
        }
    }
}

fn default_database_url() -> String {
    "sqlite://switchyard.db".to_owned()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStrategies {
    /// Extra folder scanned for `*.wasm` strategies, relative to the config file.
    pub dir: Option<PathBuf>,
    /// Folder of the built-in strategies; defaults to the build output beside the binary.
    pub builtin_dir: Option<PathBuf>,
    /// Deadline of one strategy call.
    pub call_timeout_ms: Option<u64>,
    /// The longest deadline a strategy may declare or a model may set (`router_deadline_ms`).
    pub max_call_timeout_ms: Option<u64>,
    /// Linear-memory cap of one strategy instance.
    pub memory_limit_mib: Option<u64>,
    /// Interval of the `tick` call; 0 disables it.
    pub tick_interval_ms: Option<u64>,
    /// How long a request for a model whose strategy is still loading waits for it before it
    /// answers 503 `strategy_loading`.
    pub load_wait_ms: Option<u64>,
    /// Shadow calls (selects, observations, ticks) waiting for a model's shadow strategy; when
    /// full, a call is dropped and counted, never waited for (default 256).
    pub shadow_queue: Option<usize>,
    /// Record a sample of strategy decisions for `strategies replay`; absent: nothing is recorded.
    pub record: Option<RawRecord>,
}

/// `strategies.record`: a sampled, bounded record of strategy decisions (inputs and output) in
/// rotating JSON-lines files.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRecord {
    /// Fraction of strategy decisions recorded, 0..1 (default 0.01).
    pub sample_rate: Option<f64>,
    /// The file decisions are appended to, relative to the config file (default
    /// `decisions.jsonl`); full files become `PATH.1`, `PATH.2`, ...
    pub path: Option<PathBuf>,
    /// Size at which the file is rotated, in MiB (default 64).
    pub max_file_mib: Option<u64>,
    /// Files kept, the one being written included (default 4): at most
    /// `max_files × max_file_mib` on disk.
    pub max_files: Option<u32>,
    /// Decisions waiting for the writer; when full, a decision is dropped and counted
    /// (default 1024).
    pub queue: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouting {
    #[serde(default = "default_router")]
    pub default_router: String,
    /// Serve `GET /routing` without the admin token (it shows upstream hosts).
    #[serde(default)]
    pub public_routing_endpoint: bool,
    /// Serve `GET /health/deep` without the admin token (it shows upstream ids, their last
    /// errors and strategy paths). `/health` and `/health/ready` are always public.
    #[serde(default)]
    pub public_health_deep: bool,
    /// Deployment weight policy: local deployments share this fraction of traffic (models whose
    /// router is `fixed` only).
    pub local_fraction: Option<f64>,
    pub health_check: Option<RawHealthCheck>,
    #[serde(default)]
    pub affinity: RawAffinity,
    #[serde(default)]
    pub prefill: RawPrefill,
    /// The strategy of models that exist only in the database (`upstream_models`).
    #[serde(default)]
    pub database_models: RawDatabaseModels,
    #[serde(default)]
    pub key_pools: RawKeyPools,
}

/// Key-pool knobs; the environment variables named on each field win.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeyPools {
    /// `ROUTING_KEY_AFFINITY_ENABLED`: keep a caller on its key of a pool.
    pub affinity_enabled: Option<bool>,
    /// `KEY_AFFINITY_TTL_SECONDS` (300)
    pub affinity_ttl_seconds: Option<f64>,
    /// `KEY_QUIET_RATE_LIMITED_SECONDS`: quiet period after a 429 without Retry-After (30).
    pub rate_limited_quiet_seconds: Option<f64>,
    /// `KEY_QUIET_REJECTED_SECONDS`: quiet period after a 401/402/403 without Retry-After (300).
    pub rejected_quiet_seconds: Option<f64>,
}

/// How models known only from the database are routed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDatabaseModels {
    /// Strategy name; `fixed` when absent.
    pub router: Option<String>,
    /// Its params; for `fixed`, `{fallback_order: weighted}` when absent.
    pub router_params: Option<serde_json::Value>,
}

/// Session affinity knobs; the environment variables named on each field win.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAffinity {
    /// `ROUTING_AFFINITY_ENABLED`
    pub enabled: Option<bool>,
    /// `AFFINITY_TTL_SECONDS`
    pub ttl_seconds: Option<f64>,
    /// `AFFINITY_SWEEP_THRESHOLD`
    pub sweep_threshold: Option<usize>,
}

/// Prefill-aware routing knobs; the environment variables named on each field win.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrefill {
    /// `ROUTING_PREFILL_AWARE_ENABLED`
    pub enabled: Option<bool>,
    /// `ROUTING_PREFILL_INTERVENE_TOKENS`
    pub intervene_tokens: Option<u64>,
    /// `ROUTING_PREFILL_ELEPHANT_TOKENS`
    pub elephant_tokens: Option<u64>,
    /// `ROUTING_PREFILL_ELEPHANT_LIMIT`
    pub elephant_limit: Option<u32>,
    /// `ROUTING_PREFILL_AFFINITY_CEILING`
    pub affinity_ceiling: Option<u64>,
    /// `ROUTING_PREFILL_HINT_TTL_SEC`
    pub hint_ttl_seconds: Option<f64>,
}

impl Default for RawRouting {
    fn default() -> Self {
        Self {
            default_router: default_router(),
            public_routing_endpoint: false,
            public_health_deep: false,
            local_fraction: None,
            health_check: None,
            affinity: RawAffinity::default(),
            prefill: RawPrefill::default(),
            database_models: RawDatabaseModels::default(),
            key_pools: RawKeyPools::default(),
        }
    }
}

/// Polls each local deployment's `/health`; a failing one gets weight 0 until it passes again.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealthCheck {
    /// 0 disables the loop.
    pub interval_seconds: f64,
    pub timeout_ms: Option<u64>,
}

/// Circuit breaker and availability knobs; the environment variables named on each field win.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    /// `CIRCUIT_FAILURE_THRESHOLD`
    pub failure_threshold: Option<u32>,
    /// `CIRCUIT_COOLDOWN_SECONDS`
    pub cooldown_seconds: Option<f64>,
    /// `CIRCUIT_MIN_AVAILABILITY`
    pub min_availability: Option<f64>,
    /// `ROUTER_HEALTH_EWMA_ALPHA`
    pub ewma_alpha: Option<f64>,
}

fn default_router() -> String {
    "fixed".to_owned()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamClient {
    /// TCP connect timeout to an upstream.
    pub connect_timeout_ms: Option<u64>,
    /// Time allowed until the upstream's response headers arrive.
    pub first_byte_timeout_seconds: Option<u64>,
    /// Time allowed for a whole non-streaming answer.
    pub request_timeout_seconds: Option<u64>,
    /// Default time from dispatch to a stream's first content or tool-call delta.
    pub first_token_timeout_seconds: Option<f64>,
    /// Default longest silence between a stream's events once its content flows.
    pub idle_timeout_seconds: Option<f64>,
    /// Default longest time a whole stream may take.
    pub stream_timeout_seconds: Option<f64>,
    /// Largest whole (non-streaming) answer read from an upstream, in MiB.
    pub max_body_mib: Option<u64>,
    /// Largest single event (or line) of an upstream stream, in KiB.
    pub max_event_kib: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub id: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Strategy name; `routing.default_router` when absent.
    pub router: Option<String>,
    #[serde(default)]
    pub router_params: Option<serde_json::Value>,
    /// Deadline of this model's `select` (and other calls), over the strategy's own and
    /// `strategies.call_timeout_ms`; at most `strategies.max_call_timeout_ms`.
    pub router_deadline_ms: Option<u64>,
    /// A second strategy run on the model's live traffic after the real decision, off the
    /// request path and never acted on; its agreement shows in `/routing` and the metrics.
    pub router_shadow: Option<String>,
    /// The shadow strategy's params (`{}` when absent).
    pub shadow_params: Option<serde_json::Value>,
    /// Unpublished models keep their router but are not served or listed.
    #[serde(default = "yes")]
    pub published: bool,
    #[serde(default)]
    pub route: Vec<RawUpstream>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    OpenaiCompat,
    OpenaiResponses,
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenaiCompat => "openai_compat",
            ProviderKind::OpenaiResponses => "openai_responses",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub kind: ProviderKind,
    #[serde(default = "default_weight")]
    pub weight: f64,
    pub base_url: String,
    /// The model name the upstream knows; the public model id when absent.
    pub provider_model_id: Option<String>,
    pub api_key: Option<String>,
    /// A pool of keys for this upstream, used after `api_key`: each a string or
    /// `{key, min_role}` (`free` = not reserved). Empty strings (unset `${VAR:-}`) are skipped.
    #[serde(default)]
    pub api_keys: Vec<RawKey>,
    #[serde(default)]
    pub priority: i32,
    /// The upstream group this route belongs to; callers restricted to other groups never reach
    /// it.
    pub group: Option<String>,
    pub input_modalities: Option<Vec<String>>,
    pub pricing: Option<RawPricing>,
    /// Marks a non-loopback deployment as local for deployment-level weight policies.
    pub local_deployment: Option<bool>,
    /// Free-form resource metadata handed to strategies as JSON.
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The inbound calls this route can serve; replaces the provider kind's default set.
    pub capabilities: Option<Vec<Capability>>,
    /// Overrides `upstream.first_token_timeout_seconds` for this upstream.
    pub first_token_timeout_seconds: Option<f64>,
    /// Overrides `upstream.idle_timeout_seconds` for this upstream.
    pub idle_timeout_seconds: Option<f64>,
    /// Overrides `upstream.stream_timeout_seconds` for this upstream.
    pub stream_timeout_seconds: Option<f64>,
}

pub use crate::entity::Capability;

/// One key of a route's pool.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawKey {
    Plain(String),
    Reserved(RawReservedKey),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReservedKey {
    pub key: String,
    /// The least role a caller needs to spend this key.
    #[serde(default)]
    pub min_role: crate::entity::Role,
}

impl ProviderKind {
    /// What a provider of this kind serves unless a route says otherwise: the same defaults as a
    /// database provider of the matching protocol.
    pub fn default_capabilities(self) -> Vec<Capability> {
        crate::entity::Protocol::from(self).default_capabilities()
    }
}

impl From<ProviderKind> for crate::entity::Protocol {
    fn from(kind: ProviderKind) -> Self {
        use crate::entity::Protocol;
        match kind {
            ProviderKind::OpenaiCompat => Protocol::OpenaiCompat,
            ProviderKind::OpenaiResponses => Protocol::OpenaiResponses,
            ProviderKind::Anthropic => Protocol::Anthropic,
        }
    }
}

impl From<crate::entity::Protocol> for ProviderKind {
    fn from(protocol: crate::entity::Protocol) -> Self {
        use crate::entity::Protocol;
        match protocol {
            Protocol::OpenaiCompat => ProviderKind::OpenaiCompat,
            Protocol::OpenaiResponses => ProviderKind::OpenaiResponses,
            Protocol::Anthropic => ProviderKind::Anthropic,
        }
    }
}

fn default_weight() -> f64 {
    1.0
}

/// An upstream's prices in USD per million tokens.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPricing {
    /// Input tokens read fresh (neither from nor into a prompt cache).
    pub prompt: f64,
    pub completion: f64,
    /// Input tokens read from a prompt cache. Unset: strategies see 0; the request log charges
    /// them at `prompt` (no discount it was not told about).
    #[serde(default)]
    pub input_cache_reads: Option<f64>,
    /// Input tokens written to a prompt cache (Anthropic). Unset: as `input_cache_reads`.
    #[serde(default)]
    pub input_cache_writes: Option<f64>,
}
