//! Prometheus metrics through the `metrics` facade and `metrics-exporter-prometheus`, which
//! renders the text exposition format (nothing here writes it by hand).
//!
//! Names follow the OpenTelemetry GenAI semantic conventions in their Prometheus form
//! (`gen_ai.server.request.duration` → `gen_ai_server_request_duration_seconds`): the gateway is a
//! GenAI *server* to its callers (per request) and a GenAI *client* of its upstreams (per
//! attempt). What only a routing gateway has is `switchyard_*`.
//!
//! Labels are bounded by the configuration: model ids, endpoint ids, protocols, status classes and
//! closed vocabularies. Never a caller, a key or a prompt.
//!
//! Counters and histograms are recorded where things happen; gauges that mirror live state
//! (breakers, backlog, affinity, quiet keys, quota) are set by the scrape handler just before it
//! renders, from the structures themselves, so the request path pays nothing for them.
//!
//! The request path records through handles it looks up once per label set ([`HotPath`]): a
//! `histogram!(name, labels)` call builds a `Key` from owned label strings, which the exporter
//! clones, hashes and finds in its registry, on every call; a cached handle only records.
//!
//! Until [`install`] runs (unit tests, `switchyard check`), every recording function is a no-op.

use std::sync::OnceLock;
use std::time::Duration;

use hashbrown::hash_map::RawEntryMut;
use metrics::{Counter, Histogram, Label, counter, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use parking_lot::RwLock;

/// Every metric name, in one place (the README's "Observing Switchyard" lists them).
pub mod names {
    /// Histogram, seconds: a request from arrival to its last byte (a stream's end).
    pub const SERVER_REQUEST_DURATION: &str = "gen_ai_server_request_duration_seconds";
    /// Histogram, seconds: arrival to the first token the client gets.
    pub const SERVER_TIME_TO_FIRST_TOKEN: &str = "gen_ai_server_time_to_first_token_seconds";
    /// Histogram, seconds: (duration − TTFT) / (output tokens − 1), streams with 2+ tokens.
    pub const SERVER_TIME_PER_OUTPUT_TOKEN: &str = "gen_ai_server_time_per_output_token_seconds";
    /// Histogram, seconds: one attempt against one upstream.
    pub const CLIENT_OPERATION_DURATION: &str = "gen_ai_client_operation_duration_seconds";
    /// Histogram, tokens: what an upstream reported per attempt, by `type` input/output/cached.
    pub const CLIENT_TOKEN_USAGE: &str = "gen_ai_client_token_usage";
    /// Histogram, seconds: time spent in the gateway itself, not waiting on an upstream.
    pub const GATEWAY_OVERHEAD: &str = "switchyard_gateway_overhead_seconds";
    /// Counter: requests answered with an error, by `error_type` (closed vocabulary).
    pub const ERRORS: &str = "switchyard_errors_total";
    /// Histogram: attempts a request made (1 = first try).
    pub const REQUEST_ATTEMPTS: &str = "switchyard_request_attempts";
    /// Counter: requests served by a later upstream after an earlier one failed.
    pub const FALLBACKS: &str = "switchyard_fallbacks_total";
    /// Counter: hedge backups sent (the primary had not answered in time).
    pub const HEDGES_SENT: &str = "switchyard_hedges_sent_total";
    /// Counter: hedges whose backup answered first.
    pub const HEDGES_WON: &str = "switchyard_hedges_won_total";
    /// Counter: upstream answers that rejected a pool key (401/402/403/429); the key is quieted.
    pub const CREDENTIAL_REJECTIONS: &str = "switchyard_upstream_credential_rejections_total";
    /// Gauge: 0 closed, 1 half-open, 2 open.
    pub const ENDPOINT_CIRCUIT_STATE: &str = "switchyard_endpoint_circuit_state";
    /// Gauge, 0..1: the endpoint's decayed success rate.
    pub const ENDPOINT_AVAILABILITY: &str = "switchyard_endpoint_availability";
    /// Gauge: attempts in flight.
    pub const ENDPOINT_IN_FLIGHT: &str = "switchyard_endpoint_in_flight";
    /// Gauge, tokens: uncached prompt tokens in prefill.
    pub const PREFILL_BACKLOG: &str = "switchyard_prefill_backlog_tokens";
    /// Gauge: in-flight prompts above `elephant_tokens`.
    pub const PREFILL_ELEPHANTS: &str = "switchyard_prefill_elephants";
    /// Gauge: session-affinity entries.
    pub const AFFINITY_ENTRIES: &str = "switchyard_affinity_entries";
    /// Gauge: keys of a pool out of rotation.
    pub const QUIET_KEYS: &str = "switchyard_key_pool_quiet_keys";
    /// Gauge, requests: what a quota route may still send this period (limit − used).
    pub const QUOTA_HEADROOM: &str = "switchyard_quota_headroom_requests";
    /// Histogram, seconds: a strategy's `select` call.
    pub const STRATEGY_SELECT_DURATION: &str = "switchyard_strategy_select_duration_seconds";
    /// Counter: `select`s the host answered without calling the strategy (one candidate, and the
    /// strategy declared `select-single`).
    pub const STRATEGY_SELECTS_SKIPPED: &str = "switchyard_strategy_selects_skipped_total";
    /// Counter: strategy calls that failed, by `kind` (trap, timeout, memory, rejected,
    /// invalid_decision, engine).
    pub const STRATEGY_FAILURES: &str = "switchyard_strategy_failures_total";
    /// Counter: `select` failures answered by declared order instead.
    pub const STRATEGY_FALLBACKS: &str = "switchyard_strategy_fallbacks_total";
    /// Counter: strategy instances re-created after a failure (their state was reset).
    pub const STRATEGY_RESETS: &str = "switchyard_strategy_instance_resets_total";
    /// Histogram, seconds: a model's shadow strategy's `select` call (`strategy` is the shadow's).
    pub const SHADOW_SELECT_DURATION: &str = "switchyard_shadow_select_duration_seconds";
    /// Counter: shadow decisions by `outcome`: same_order, same_primary (the primary agrees, the
    /// order does not), different_primary, failed (the shadow trapped, timed out or erred),
    /// dropped (the shadow's queue was full).
    pub const SHADOW_SELECTS: &str = "switchyard_shadow_selects_total";
    /// Counter: sampled strategy decisions by `outcome` written, dropped (the writer's queue was
    /// full), failed (the file could not be written).
    pub const DECISION_RECORDS: &str = "switchyard_decision_records_total";
    /// Counter: client connections refused at the connection cap (`server.max_connections`)
    /// with a 503, before any request was read.
    pub const CONNECTIONS_REFUSED: &str = "switchyard_connections_refused_total";
    /// Counter: HTTP/1 client connections closed because a write of their answer moved nothing
    /// for `server.client_write_timeout_seconds` (the client stopped reading).
    pub const CLIENT_WRITE_TIMEOUTS: &str = "switchyard_client_write_timeouts_total";
    /// Counter: requests a limit of the route's `rate-limit` plugin refused, by `route` (its name)
    /// and `limit` (`consumer:rpm`: scope, `per_model`, kind; a closed vocabulary).
    pub const RATE_LIMITED: &str = "switchyard_rate_limited_total";
    /// Counter: requests refused (402) because a hard budget of the caller was spent, by `scope`
    /// (`consumer` or `group`).
    pub const BUDGET_REFUSED: &str = "switchyard_budget_refused_total";
    /// Gauge, USD: what a budget's current period has spent, by `budget` (its id; bounded by the
    /// configuration), set at scrape.
    pub const BUDGET_SPENT: &str = "switchyard_budget_spent_usd";
    /// Counter: soft budgets crossed (once per budget and period in each process), by `scope`.
    pub const BUDGET_SOFT_EXCEEDED: &str = "switchyard_budget_soft_exceeded_total";
    /// Counter: request-log rows by `outcome` written, dropped (queue full), failed (database).
    pub const REQUEST_LOG_ROWS: &str = "switchyard_request_log_rows_total";
    /// Counter, USD: what attempts cost at their upstream's `pricing`. Only ever grows, but is
    /// exported as a gauge: the recorder's counters count whole numbers.
    pub const COST_USD: &str = "switchyard_cost_usd_total";
    /// Counter: spans the trace exporter handled, by `outcome` exported, failed (the collector
    /// refused them or did not answer in time), dropped (the export queue was full).
    pub const TRACE_SPANS: &str = "switchyard_trace_spans_total";
    /// Gauge: database configuration versions the served snapshot is behind.
    pub const CONFIG_SYNC_VERSIONS_BEHIND: &str = "switchyard_config_sync_versions_behind";
    /// Gauge, seconds: since the served configuration snapshot was last loaded.
    pub const CONFIG_SYNC_AGE: &str = "switchyard_config_sync_age_seconds";
    /// Gauge: consecutive failed configuration loads.
    pub const CONFIG_SYNC_FAILURES: &str = "switchyard_config_sync_consecutive_failures";
    /// Gauge: 1 while the fleet's Redis answers, 0 while this replica serves on local state
    /// (absent without a fleet).
    pub const FLEET_CONNECTED: &str = "switchyard_fleet_connected";
    /// Gauge: replicas whose prefill publication is fresh, this one included.
    pub const FLEET_REPLICAS: &str = "switchyard_fleet_replicas";
    /// Counter: fleet messages by `direction` published, received, dropped (queue full, or Redis
    /// unreachable).
    pub const FLEET_EVENTS: &str = "switchyard_fleet_events_total";
    /// Counter: probe claims and admissions by `outcome` local_fallback (Redis unreachable: the
    /// replica decided alone) and timeout (Redis slow: the stateful route was skipped).
    pub const FLEET_DECISIONS: &str = "switchyard_fleet_degraded_decisions_total";

    /// Every name above.
    pub const ALL: &[&str] = &[
        SERVER_REQUEST_DURATION,
        SERVER_TIME_TO_FIRST_TOKEN,
        SERVER_TIME_PER_OUTPUT_TOKEN,
        CLIENT_OPERATION_DURATION,
        CLIENT_TOKEN_USAGE,
        GATEWAY_OVERHEAD,
        ERRORS,
        REQUEST_ATTEMPTS,
        FALLBACKS,
        HEDGES_SENT,
        HEDGES_WON,
        CREDENTIAL_REJECTIONS,
        ENDPOINT_CIRCUIT_STATE,
        ENDPOINT_AVAILABILITY,
        ENDPOINT_IN_FLIGHT,
        PREFILL_BACKLOG,
        PREFILL_ELEPHANTS,
        AFFINITY_ENTRIES,
        QUIET_KEYS,
        QUOTA_HEADROOM,
        STRATEGY_SELECT_DURATION,
        STRATEGY_SELECTS_SKIPPED,
        STRATEGY_FAILURES,
        STRATEGY_FALLBACKS,
        STRATEGY_RESETS,
        SHADOW_SELECT_DURATION,
        SHADOW_SELECTS,
        DECISION_RECORDS,
        CONNECTIONS_REFUSED,
        CLIENT_WRITE_TIMEOUTS,
        RATE_LIMITED,
        BUDGET_REFUSED,
        BUDGET_SPENT,
        BUDGET_SOFT_EXCEEDED,
        REQUEST_LOG_ROWS,
        COST_USD,
        TRACE_SPANS,
        CONFIG_SYNC_VERSIONS_BEHIND,
        CONFIG_SYNC_AGE,
        CONFIG_SYNC_FAILURES,
        FLEET_CONNECTED,
        FLEET_REPLICAS,
        FLEET_EVENTS,
        FLEET_DECISIONS,
    ];
}

use names::*;

// Bucket bounds: the GenAI conventions' advice where it gives one, else spread over the range the
// quantity takes in practice.
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92, 163.84,
];
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
];
const OVERHEAD_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
const SELECT_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
];
const ATTEMPT_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The request path's handles, bound to the recorder [`install`] set.
static HOT: OnceLock<HotPath> = OnceLock::new();

/// How often histogram samples are folded into their buckets when nobody scrapes: bounds the
/// memory they hold between scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the process-wide recorder. Once per process; a second call is an error.
pub fn install() -> Result<(), BuildError> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in [
        (SERVER_REQUEST_DURATION, DURATION_BUCKETS),
        (CLIENT_OPERATION_DURATION, DURATION_BUCKETS),
        (SERVER_TIME_TO_FIRST_TOKEN, TTFT_BUCKETS),
        (SERVER_TIME_PER_OUTPUT_TOKEN, TPOT_BUCKETS),
        (CLIENT_TOKEN_USAGE, TOKEN_BUCKETS),
        (GATEWAY_OVERHEAD, OVERHEAD_BUCKETS),
        (STRATEGY_SELECT_DURATION, SELECT_BUCKETS),
        (SHADOW_SELECT_DURATION, SELECT_BUCKETS),
        (REQUEST_ATTEMPTS, ATTEMPT_BUCKETS),
    ] {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)?;
    }
    let handle = builder.install_recorder()?;
    describe();
    let _ = HANDLE.set(handle);
    let _ = HOT.set(HotPath::default());
    Ok(())
}

/// Folds histogram samples into buckets now and then (rendering does it too); call once, inside
/// the runtime, after [`install`].
pub fn spawn_upkeep() {
    let Some(handle) = HANDLE.get() else {
        return;
    };
    tokio::spawn(async move {
        let mut timer = tokio::time::interval(UPKEEP_EVERY);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            timer.tick().await;
            handle.run_upkeep();
        }
    });
}

/// The metrics in the Prometheus text format; `None` when no recorder is installed.
pub fn render() -> Option<String> {
    HANDLE.get().map(PrometheusHandle::render)
}

/// `# HELP` lines.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        SERVER_REQUEST_DURATION,
        "Duration of a request at the gateway, arrival to last byte"
    );
    describe_histogram!(
        SERVER_TIME_TO_FIRST_TOKEN,
        "Arrival to the first output token sent to the client"
    );
    describe_histogram!(
        SERVER_TIME_PER_OUTPUT_TOKEN,
        "Time per output token after the first, streamed requests"
    );
    describe_histogram!(
        CLIENT_OPERATION_DURATION,
        "Duration of one attempt against one upstream"
    );
    describe_histogram!(
        CLIENT_TOKEN_USAGE,
        "Tokens an upstream reported for one attempt, by type (input, output, cached)"
    );
    describe_histogram!(
        GATEWAY_OVERHEAD,
        "Time a request spent in the gateway, not waiting on an upstream"
    );
    describe_counter!(ERRORS, "Requests answered with an error, by error_type");
    describe_histogram!(REQUEST_ATTEMPTS, "Upstream attempts per request");
    describe_counter!(
        FALLBACKS,
        "Requests served by a later upstream after an earlier one failed"
    );
    describe_counter!(HEDGES_SENT, "Hedge backups sent");
    describe_counter!(HEDGES_WON, "Hedges whose backup answered first");
    describe_counter!(
        CREDENTIAL_REJECTIONS,
        "Upstream rejections of a pool key (the key is quieted)"
    );
    describe_gauge!(
        ENDPOINT_CIRCUIT_STATE,
        "Breaker state: 0 closed, 1 half-open, 2 open"
    );
    describe_gauge!(ENDPOINT_AVAILABILITY, "Decayed success rate, 0..1");
    describe_gauge!(ENDPOINT_IN_FLIGHT, "Attempts in flight");
    describe_gauge!(PREFILL_BACKLOG, "Uncached prompt tokens in prefill");
    describe_gauge!(PREFILL_ELEPHANTS, "In-flight prompts above elephant_tokens");
    describe_gauge!(AFFINITY_ENTRIES, "Session-affinity entries");
    describe_gauge!(QUIET_KEYS, "Keys of a pool out of rotation");
    describe_gauge!(
        QUOTA_HEADROOM,
        "Requests a quota route may still send this period"
    );
    describe_histogram!(STRATEGY_SELECT_DURATION, "Duration of a strategy's select");
    describe_counter!(
        STRATEGY_SELECTS_SKIPPED,
        "Selects answered by the host for a strategy that declared select-single"
    );
    describe_counter!(STRATEGY_FAILURES, "Failed strategy calls, by kind");
    describe_counter!(
        STRATEGY_FALLBACKS,
        "Select failures answered by declared order"
    );
    describe_counter!(
        STRATEGY_RESETS,
        "Strategy instances re-created after a failure"
    );
    describe_histogram!(
        SHADOW_SELECT_DURATION,
        "Duration of a model's shadow strategy's select"
    );
    describe_counter!(
        SHADOW_SELECTS,
        "Shadow decisions, by outcome against the real decision"
    );
    describe_counter!(DECISION_RECORDS, "Sampled strategy decisions, by outcome");
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Client connections refused at the connection cap"
    );
    describe_counter!(
        CLIENT_WRITE_TIMEOUTS,
        "Client connections closed because their answer could not be written within the write timeout"
    );
    describe_counter!(
        RATE_LIMITED,
        "Requests refused by a rate limit, by route and limit"
    );
    describe_counter!(
        BUDGET_REFUSED,
        "Requests refused because a hard budget was spent, by scope"
    );
    describe_gauge!(BUDGET_SPENT, "USD spent in a budget's current period");
    describe_counter!(
        BUDGET_SOFT_EXCEEDED,
        "Soft budgets crossed, once per budget and period, by scope"
    );
    describe_counter!(REQUEST_LOG_ROWS, "Request-log rows, by outcome");
    describe_counter!(TRACE_SPANS, "Spans the trace exporter handled, by outcome");
    describe_gauge!(
        COST_USD,
        "USD spent on upstream attempts at their pricing (a counter: it only grows)"
    );
    describe_gauge!(
        CONFIG_SYNC_VERSIONS_BEHIND,
        "Database configuration versions the served snapshot is behind"
    );
    describe_gauge!(
        CONFIG_SYNC_AGE,
        "Seconds since the configuration snapshot was last loaded"
    );
    describe_gauge!(
        CONFIG_SYNC_FAILURES,
        "Consecutive failed configuration loads"
    );
    describe_gauge!(FLEET_CONNECTED, "1 while the fleet's Redis answers");
    describe_gauge!(FLEET_REPLICAS, "Replicas with a fresh prefill publication");
    describe_counter!(FLEET_EVENTS, "Fleet messages, by direction");
    describe_counter!(
        FLEET_DECISIONS,
        "Probe claims and admissions decided without Redis, by outcome"
    );
}

/// `2xx`, `4xx`, `5xx` (a bounded label for any status).
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// What kind of call a request was (GenAI's `gen_ai.operation.name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Chat,
    Embeddings,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Chat => "chat",
            Operation::Embeddings => "embeddings",
        }
    }
}

/// One request the gateway finished after it resolved the model: served, or failed.
#[derive(Debug, Clone, Copy)]
pub struct RequestDone<'a> {
    pub model: &'a str,
    pub operation: Operation,
    /// The client's protocol (`Dialect::as_str`).
    pub inbound_protocol: &'static str,
    /// The serving upstream's protocol (its kind); `none` when nothing served.
    pub upstream_protocol: &'a str,
    /// The serving endpoint; `none` when nothing served.
    pub endpoint: &'a str,
    pub status: u16,
    pub duration: Duration,
    /// Arrival to the first token; `None` when nothing was generated.
    pub time_to_first_token: Option<Duration>,
    pub output_tokens: u32,
    /// Attempts sent upstream (0 when none could be).
    pub attempts: usize,
}

/// Books a finished request: its duration, TTFT, time per output token, attempts and fallback.
pub fn request_done(r: &RequestDone<'_>) {
    if let Some(hot) = HOT.get() {
        hot.request_done(r);
    }
}

/// Time the request spent in the gateway itself (parsing, auth, selection, translation and the
/// relay's own work), not waiting on an upstream.
pub fn gateway_overhead(model: &str, inbound_protocol: &'static str, overhead: Duration) {
    if let Some(hot) = HOT.get() {
        hot.gateway_overhead(model, inbound_protocol, overhead);
    }
}

/// An error answer, by its closed-vocabulary type (`caller_*`, `gateway_*`, `upstream_*`).
pub fn request_error(error_type: &'static str, inbound_protocol: &'static str, status: u16) {
    counter!(
        ERRORS,
        "error_type" => error_type,
        "inbound_protocol" => inbound_protocol,
        "status_class" => status_class(status),
    )
    .increment(1);
}

/// A request refused by a rate limit of `route` (its name); `limit` is the limit's name
/// (`consumer:rpm`).
pub fn rate_limited(route: &str, limit: &str) {
    counter!(
        RATE_LIMITED,
        "route" => route.to_owned(),
        "limit" => limit.to_owned(),
    )
    .increment(1);
}

/// A request refused because a hard budget of `scope` (`consumer`, `group`) was spent.
pub fn budget_refused(scope: &'static str) {
    counter!(BUDGET_REFUSED, "scope" => scope).increment(1);
}

/// A soft budget of `scope` was crossed (once per budget and period).
pub fn budget_soft_exceeded(scope: &'static str) {
    counter!(BUDGET_SOFT_EXCEEDED, "scope" => scope).increment(1);
}

/// A client connection refused at the connection cap.
pub fn connection_refused() {
    counter!(CONNECTIONS_REFUSED).increment(1);
}

/// A client connection closed because its answer's write moved nothing within the write timeout.
pub fn client_write_timed_out() {
    counter!(CLIENT_WRITE_TIMEOUTS).increment(1);
}

/// One attempt against one upstream, as it ended.
#[derive(Debug, Clone, Copy)]
pub struct AttemptDone<'a> {
    pub model: &'a str,
    pub endpoint: &'a str,
    /// The upstream's protocol (its kind).
    pub upstream_protocol: &'static str,
    pub operation: Operation,
    /// The attempt's error type (`transport`, `timeout`, `http_status`, …); `None` when it
    /// succeeded.
    pub error_type: Option<&'static str>,
    /// The upstream's HTTP status; 0 when it gave none.
    pub status: u16,
    pub duration: Duration,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cached_input_tokens: u32,
}

/// Books an attempt: its duration by outcome and the tokens the upstream reported.
pub fn attempt_done(a: &AttemptDone<'_>) {
    if let Some(hot) = HOT.get() {
        hot.attempt_done(a);
    }
}

/// An attempt that cost `usd` at its upstream's pricing.
pub fn cost_usd(model: &str, endpoint: &str, usd: f64) {
    gauge!(COST_USD, "model" => model.to_owned(), "endpoint" => endpoint.to_owned()).increment(usd);
}

/// An upstream rejected a pool key with `status`.
pub fn credential_rejected(endpoint: &str, status: u16) {
    counter!(
        CREDENTIAL_REJECTIONS,
        "endpoint" => endpoint.to_owned(),
        "status" => status.to_string(),
    )
    .increment(1);
}

/// A hedge's backup was sent.
pub fn hedge_sent(model: &str) {
    counter!(HEDGES_SENT, "model" => model.to_owned()).increment(1);
}

/// A hedge's backup answered first.
pub fn hedge_won(model: &str) {
    counter!(HEDGES_WON, "model" => model.to_owned()).increment(1);
}

/// A strategy's `select` took `duration`.
pub fn strategy_select(model: &str, strategy: &str, duration: Duration) {
    if let Some(hot) = HOT.get() {
        hot.strategy_select(model, strategy, duration);
    }
}

/// The host answered a `select` for the strategy (one candidate, `select-single` declared).
pub fn strategy_select_skipped(model: &str, strategy: &str) {
    if let Some(hot) = HOT.get() {
        hot.strategy_select_skipped(model, strategy);
    }
}

/// A model's shadow strategy's `select` took `duration` (off the request path).
pub fn shadow_select(model: &str, strategy: &str, duration: Duration) {
    histogram!(
        SHADOW_SELECT_DURATION,
        "model" => model.to_owned(),
        "strategy" => strategy.to_owned(),
    )
    .record(duration.as_secs_f64());
}

/// A shadow decision ended in `outcome` (same_order, same_primary, different_primary, failed,
/// dropped).
pub fn shadow_outcome(model: &str, strategy: &str, outcome: &'static str) {
    counter!(
        SHADOW_SELECTS,
        "model" => model.to_owned(),
        "strategy" => strategy.to_owned(),
        "outcome" => outcome,
    )
    .increment(1);
}

/// A sampled decision was written, dropped or failed to be written.
pub fn decision_record(outcome: &'static str) {
    counter!(DECISION_RECORDS, "outcome" => outcome).increment(1);
}

/// A strategy call failed; `kind` is one of trap, timeout, memory, rejected, invalid_decision,
/// engine.
pub fn strategy_failure(model: &str, strategy: &str, call: &'static str, kind: &'static str) {
    counter!(
        STRATEGY_FAILURES,
        "model" => model.to_owned(),
        "strategy" => strategy.to_owned(),
        "call" => call,
        "kind" => kind,
    )
    .increment(1);
}

/// A failed `select` was answered by declared order.
pub fn strategy_fallback(model: &str, strategy: &str) {
    counter!(
        STRATEGY_FALLBACKS,
        "model" => model.to_owned(),
        "strategy" => strategy.to_owned(),
    )
    .increment(1);
}

/// A strategy instance was re-created after a failure.
pub fn strategy_reset(model: &str, strategy: &str) {
    counter!(
        STRATEGY_RESETS,
        "model" => model.to_owned(),
        "strategy" => strategy.to_owned(),
    )
    .increment(1);
}

/// Label names of the request metrics, in the order their series show them.
const REQUEST_LABELS: [&str; 6] = [
    "model",
    "operation",
    "inbound_protocol",
    "upstream_protocol",
    "endpoint",
    "status_class",
];
/// Label names of an attempt's duration.
const ATTEMPT_LABELS: [&str; 6] = [
    "model",
    "endpoint",
    "upstream_protocol",
    "operation",
    "status_class",
    "error_type",
];

/// `names[i] = values[i]` as the facade's labels (owned: this runs once per label set).
fn labelled(names: &[&'static str], values: &[&str]) -> Vec<Label> {
    names
        .iter()
        .zip(values)
        .map(|(name, value)| Label::new(*name, (*value).to_owned()))
        .collect()
}

/// The handles of the metrics recorded once per request, per attempt or per `select`, each
/// registered with the recorder the first time its label set is seen. A series that a label set
/// never records (TTFT of a failed request, a fallback) is registered only when first recorded,
/// so `/metrics` shows the same series as when every call went through the facade.
#[derive(Default)]
struct HotPath {
    requests: Series<RequestSeries>,
    overhead: Series<Histogram>,
    attempts: Series<AttemptSeries>,
    selects: Series<Histogram>,
    skipped_selects: Series<Counter>,
}

/// One request label set (`REQUEST_LABELS`).
struct RequestSeries {
    duration: Histogram,
    time_to_first_token: OnceLock<Histogram>,
    time_per_output_token: OnceLock<Histogram>,
    /// By model only.
    attempts: Histogram,
    fallbacks: OnceLock<Counter>,
}

/// One attempt label set (`ATTEMPT_LABELS`); the token histograms are by model, endpoint,
/// operation and type.
struct AttemptSeries {
    duration: Histogram,
    input_tokens: OnceLock<Histogram>,
    output_tokens: OnceLock<Histogram>,
    cached_tokens: OnceLock<Histogram>,
}

impl HotPath {
    fn request_done(&self, r: &RequestDone<'_>) {
        let values = [
            r.model,
            r.operation.as_str(),
            r.inbound_protocol,
            r.upstream_protocol,
            r.endpoint,
            status_class(r.status),
        ];
        let register = |v: &[&str]| RequestSeries {
            duration: histogram!(SERVER_REQUEST_DURATION, labelled(&REQUEST_LABELS, v)),
            time_to_first_token: OnceLock::new(),
            time_per_output_token: OnceLock::new(),
            attempts: histogram!(REQUEST_ATTEMPTS, labelled(&REQUEST_LABELS[..1], &v[..1])),
            fallbacks: OnceLock::new(),
        };
        // The status class says nothing new for served requests.
        let served_labels = || labelled(&REQUEST_LABELS[..5], &values[..5]);
        self.requests.with(&values, register, |s| {
            s.duration.record(r.duration.as_secs_f64());
            let served = (200..300).contains(&r.status);
            if let (true, Some(ttft)) = (served, r.time_to_first_token) {
                s.time_to_first_token
                    .get_or_init(|| histogram!(SERVER_TIME_TO_FIRST_TOKEN, served_labels()))
                    .record(ttft.as_secs_f64());
                if r.output_tokens > 1 && r.duration > ttft {
                    let per_token =
                        (r.duration - ttft).as_secs_f64() / f64::from(r.output_tokens - 1);
                    s.time_per_output_token
                        .get_or_init(|| histogram!(SERVER_TIME_PER_OUTPUT_TOKEN, served_labels()))
                        .record(per_token);
                }
            }
            s.attempts.record(r.attempts as f64);
            if served && r.attempts > 1 {
                s.fallbacks
                    .get_or_init(|| counter!(FALLBACKS, labelled(&["model"], &[r.model])))
                    .increment(1);
            }
        });
    }

    fn gateway_overhead(&self, model: &str, inbound_protocol: &'static str, overhead: Duration) {
        let register = |v: &[&str]| {
            histogram!(
                GATEWAY_OVERHEAD,
                labelled(&["model", "inbound_protocol"], v)
            )
        };
        self.overhead
            .with(&[model, inbound_protocol], register, |h| {
                h.record(overhead.as_secs_f64())
            });
    }

    fn attempt_done(&self, a: &AttemptDone<'_>) {
        let values = [
            a.model,
            a.endpoint,
            a.upstream_protocol,
            a.operation.as_str(),
            if a.status == 0 {
                "none"
            } else {
                status_class(a.status)
            },
            a.error_type.unwrap_or("none"),
        ];
        let register = |v: &[&str]| AttemptSeries {
            duration: histogram!(CLIENT_OPERATION_DURATION, labelled(&ATTEMPT_LABELS, v)),
            input_tokens: OnceLock::new(),
            output_tokens: OnceLock::new(),
            cached_tokens: OnceLock::new(),
        };
        let tokens = |kind: &'static str| {
            let mut labels = labelled(&["model", "endpoint"], &values[..2]);
            labels.push(Label::new("operation", a.operation.as_str()));
            labels.push(Label::new("type", kind));
            histogram!(CLIENT_TOKEN_USAGE, labels)
        };
        self.attempts.with(&values, register, |s| {
            s.duration.record(a.duration.as_secs_f64());
            if a.error_type.is_some() {
                return;
            }
            s.input_tokens
                .get_or_init(|| tokens("input"))
                .record(f64::from(a.input_tokens));
            s.output_tokens
                .get_or_init(|| tokens("output"))
                .record(f64::from(a.output_tokens));
            if a.cached_input_tokens > 0 {
                s.cached_tokens
                    .get_or_init(|| tokens("cached"))
                    .record(f64::from(a.cached_input_tokens));
            }
        });
    }

    fn strategy_select(&self, model: &str, strategy: &str, duration: Duration) {
        let register = |v: &[&str]| {
            histogram!(
                STRATEGY_SELECT_DURATION,
                labelled(&["model", "strategy"], v)
            )
        };
        self.selects.with(&[model, strategy], register, |h| {
            h.record(duration.as_secs_f64())
        });
    }

    fn strategy_select_skipped(&self, model: &str, strategy: &str) {
        let register = |v: &[&str]| {
            counter!(
                STRATEGY_SELECTS_SKIPPED,
                labelled(&["model", "strategy"], v)
            )
        };
        self.skipped_selects
            .with(&[model, strategy], register, |c| c.increment(1));
    }
}

/// Label sets one [`Series`] keeps at most. Its series are bounded by the configuration (model
/// and endpoint ids, closed vocabularies); the cap bounds the cache even when configuration
/// reloads churn through ids. Past it, a new label set registers its handles on every call: still
/// recorded, at the facade's cost.
const MAX_LABEL_SETS: usize = 4096;

/// Handles by label values. A hit hashes and compares the borrowed values and allocates nothing.
struct Series<V> {
    by_values: RwLock<hashbrown::HashMap<LabelValues, V>>,
    max_label_sets: usize,
}

impl<V> Default for Series<V> {
    fn default() -> Self {
        Series {
            by_values: RwLock::default(),
            max_label_sets: MAX_LABEL_SETS,
        }
    }
}

/// Owned label values, the key of a [`Series`]; hashes as the borrowed `[&str]` does.
#[derive(PartialEq, Eq, Hash)]
struct LabelValues(Box<[Box<str>]>);

/// Borrowed label values, to look up [`LabelValues`] without building one.
#[derive(Hash)]
struct Lookup<'a>(&'a [&'a str]);

impl hashbrown::Equivalent<LabelValues> for Lookup<'_> {
    fn equivalent(&self, key: &LabelValues) -> bool {
        self.0.len() == key.0.len() && self.0.iter().zip(&key.0).all(|(a, b)| *a == &**b)
    }
}

impl From<&Lookup<'_>> for LabelValues {
    fn from(lookup: &Lookup<'_>) -> Self {
        LabelValues(lookup.0.iter().map(|v| Box::from(*v)).collect())
    }
}

impl<V> Series<V> {
    /// Runs `record` on the handles of `values`, registering them with `register` the first time.
    fn with<R>(
        &self,
        values: &[&str],
        register: impl FnOnce(&[&str]) -> V,
        record: impl FnOnce(&V) -> R,
    ) -> R {
        let lookup = Lookup(values);
        if let Some(handles) = self.by_values.read().get(&lookup) {
            return record(handles);
        }
        let mut by_values = self.by_values.write();
        if by_values.len() >= self.max_label_sets && !by_values.contains_key(&lookup) {
            drop(by_values);
            return record(&register(values));
        }
        let handles = match by_values.raw_entry_mut().from_key(&lookup) {
            RawEntryMut::Occupied(entry) => entry.into_mut(),
            RawEntryMut::Vacant(entry) => {
                entry.insert(LabelValues::from(&lookup), register(values)).1
            }
        };
        record(handles)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_values.read().len()
    }
}

/// Spans the trace exporter handled: `exported`, `failed` or `dropped` (queue full).
pub fn trace_spans(outcome: &'static str, n: u64) {
    counter!(TRACE_SPANS, "outcome" => outcome).increment(n);
}

/// Scrape-time gauges and counters mirrored from live state.
pub mod state {
    use super::*;

    /// One endpoint's breaker, availability, in-flight attempts and prefill load.
    #[derive(Debug, Clone, Copy)]
    pub struct EndpointState<'a> {
        pub endpoint: &'a str,
        /// 0 closed, 1 half-open, 2 open.
        pub circuit: u8,
        pub availability: f64,
        pub in_flight: u32,
        pub backlog_tokens: u64,
        pub elephants: u32,
    }

    /// What a budget's current period has spent, USD.
    pub fn budget_spent(budget: &str, usd: f64) {
        gauge!(BUDGET_SPENT, "budget" => budget.to_owned()).set(usd);
    }

    pub fn endpoint(e: &EndpointState<'_>) {
        let endpoint = || [("endpoint", e.endpoint.to_owned())];
        gauge!(ENDPOINT_CIRCUIT_STATE, &endpoint()).set(f64::from(e.circuit));
        gauge!(ENDPOINT_AVAILABILITY, &endpoint()).set(e.availability);
        gauge!(ENDPOINT_IN_FLIGHT, &endpoint()).set(f64::from(e.in_flight));
        gauge!(PREFILL_BACKLOG, &endpoint()).set(e.backlog_tokens as f64);
        gauge!(PREFILL_ELEPHANTS, &endpoint()).set(f64::from(e.elephants));
    }

    /// The fleet's link and counters, as the fleet keeps them.
    #[derive(Debug, Clone, Copy)]
    pub struct FleetState {
        pub connected: bool,
        pub replicas: u64,
        pub published: u64,
        pub received: u64,
        pub dropped: u64,
        pub fallbacks: u64,
        pub timeouts: u64,
    }

    pub fn fleet(f: &FleetState) {
        gauge!(FLEET_CONNECTED).set(if f.connected { 1.0 } else { 0.0 });
        gauge!(FLEET_REPLICAS).set(f.replicas as f64);
        for (direction, n) in [
            ("published", f.published),
            ("received", f.received),
            ("dropped", f.dropped),
        ] {
            counter!(FLEET_EVENTS, "direction" => direction).absolute(n);
        }
        for (outcome, n) in [("local_fallback", f.fallbacks), ("timeout", f.timeouts)] {
            counter!(FLEET_DECISIONS, "outcome" => outcome).absolute(n);
        }
    }

    pub fn affinity_entries(entries: usize) {
        gauge!(AFFINITY_ENTRIES).set(entries as f64);
    }

    pub fn quiet_keys(pool: &str, quiet: usize) {
        gauge!(QUIET_KEYS, "pool" => pool.to_owned()).set(quiet as f64);
    }

    pub fn quota_headroom(model: &str, endpoint: &str, requests: f64) {
        gauge!(
            QUOTA_HEADROOM,
            "model" => model.to_owned(),
            "endpoint" => endpoint.to_owned(),
        )
        .set(requests);
    }

    /// The request log's running totals since start.
    pub fn request_log(written: u64, dropped: u64, failed: u64, pruned: u64) {
        for (outcome, n) in [
            ("written", written),
            ("dropped", dropped),
            ("failed", failed),
            ("pruned", pruned),
        ] {
            counter!(REQUEST_LOG_ROWS, "outcome" => outcome).absolute(n);
        }
    }

    pub fn config_sync(versions_behind: i64, age: Option<Duration>, consecutive_failures: u32) {
        gauge!(CONFIG_SYNC_VERSIONS_BEHIND).set(versions_behind.max(0) as f64);
        if let Some(age) = age {
            gauge!(CONFIG_SYNC_AGE).set(age.as_secs_f64());
        }
        gauge!(CONFIG_SYNC_FAILURES).set(f64::from(consecutive_failures));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metric names mentioned in `text`, without a histogram's `_bucket`/`_count`/`_sum`.
    fn mentioned(text: &str) -> std::collections::BTreeSet<String> {
        let name = regex::Regex::new(r"\b(?:gen_ai|switchyard)_[a-z_]*[a-z]").expect("regex");
        name.find_iter(text)
            .map(|m| {
                let n = m.as_str();
                ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| n.strip_suffix(s).filter(|b| names::ALL.contains(b)))
                    .unwrap_or(n)
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn the_readme_and_the_dashboard_name_the_metrics_that_exist() {
        let readme = include_str!("../../../README.md");
        let section = readme
            .split("## Observing Switchyard")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("README has the section");
        let in_readme = mentioned(section);
        for name in names::ALL {
            assert!(in_readme.contains(*name), "README does not list {name}");
        }
        let dashboard = include_str!("../../../docs/grafana/switchyard.json");
        let in_dashboard = mentioned(dashboard);
        for name in in_readme.iter().chain(&in_dashboard) {
            assert!(
                names::ALL.contains(&name.as_str()),
                "{name} is not a metric (README or docs/grafana/switchyard.json)"
            );
        }
        serde_json::from_str::<serde_json::Value>(dashboard).expect("the dashboard is JSON");
    }

    #[test]
    fn a_request_renders_as_histograms_with_bounded_labels() {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(SERVER_REQUEST_DURATION.to_owned()),
                DURATION_BUCKETS,
            )
            .expect("buckets")
            .build_recorder();
        let handle = recorder.handle();
        let hot = HotPath::default();
        metrics::with_local_recorder(&recorder, || {
            hot.request_done(&RequestDone {
                model: "m",
                operation: Operation::Chat,
                inbound_protocol: "openai",
                upstream_protocol: "anthropic",
                endpoint: "e1",
                status: 200,
                duration: Duration::from_millis(300),
                time_to_first_token: Some(Duration::from_millis(100)),
                output_tokens: 5,
                attempts: 2,
            });
            request_error("upstream_timeout", "anthropic", 504);
        });
        let text = handle.render();
        assert!(
            text.contains(
                "gen_ai_server_request_duration_seconds_bucket{model=\"m\",operation=\"chat\",inbound_protocol=\"openai\",upstream_protocol=\"anthropic\",endpoint=\"e1\",status_class=\"2xx\",le=\"0.32\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("switchyard_fallbacks_total{model=\"m\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("switchyard_errors_total{error_type=\"upstream_timeout\",inbound_protocol=\"anthropic\",status_class=\"5xx\"} 1"),
            "{text}"
        );
        // (300 − 100) ms over 4 tokens after the first.
        assert!(
            text.contains("gen_ai_server_time_per_output_token_seconds{model=\"m\",operation=\"chat\",inbound_protocol=\"openai\",upstream_protocol=\"anthropic\",endpoint=\"e1\",quantile=\"0.5\"} 0.05"),
            "{text}"
        );
    }

    fn request(endpoint: &str, status: u16) -> RequestDone<'_> {
        RequestDone {
            model: "m",
            operation: Operation::Chat,
            inbound_protocol: "openai",
            upstream_protocol: "openai",
            endpoint,
            status,
            duration: Duration::from_millis(300),
            time_to_first_token: (status == 200).then(|| Duration::from_millis(100)),
            output_tokens: 5,
            attempts: 1,
        }
    }

    /// The series of `name` in `text` (its `_count` lines for a summary or histogram).
    fn series<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
        let count = format!("{name}_count{{");
        text.lines().filter(|l| l.starts_with(&count)).collect()
    }

    #[test]
    fn cached_handles_record_each_label_set_into_its_own_series() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let hot = HotPath::default();
        metrics::with_local_recorder(&recorder, || {
            hot.request_done(&request("e1", 200));
            hot.request_done(&request("e1", 200));
            hot.request_done(&request("e2", 200));
            hot.request_done(&request("none", 503));
        });
        // Three label sets, each registered once.
        assert_eq!(hot.requests.len(), 3);
        let text = handle.render();
        let durations = series(&text, SERVER_REQUEST_DURATION);
        assert_eq!(durations.len(), 3, "{text}");
        assert!(
            durations.contains(&"gen_ai_server_request_duration_seconds_count{model=\"m\",operation=\"chat\",inbound_protocol=\"openai\",upstream_protocol=\"openai\",endpoint=\"e1\",status_class=\"2xx\"} 2"),
            "{text}"
        );
        // The failed request has no TTFT series and nobody fell back: those are registered only
        // when first recorded, as the facade did.
        let ttft = series(&text, SERVER_TIME_TO_FIRST_TOKEN);
        assert_eq!(ttft.len(), 2, "{text}");
        assert!(
            ttft.iter().all(|l| !l.contains("endpoint=\"none\"")),
            "{text}"
        );
        assert!(!text.contains(FALLBACKS), "{text}");
        // Attempts are by model only: one series for all four requests.
        assert_eq!(
            series(&text, REQUEST_ATTEMPTS),
            ["switchyard_request_attempts_count{model=\"m\"} 4"],
            "{text}"
        );
    }

    #[test]
    fn past_the_cap_a_label_set_is_still_recorded_but_not_kept() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let hot = HotPath {
            overhead: Series {
                max_label_sets: 1,
                ..Series::default()
            },
            ..HotPath::default()
        };
        metrics::with_local_recorder(&recorder, || {
            for model in ["a", "b", "b", "a"] {
                hot.gateway_overhead(model, "openai", Duration::from_micros(50));
            }
        });
        assert_eq!(hot.overhead.len(), 1);
        let text = handle.render();
        let overhead = series(&text, GATEWAY_OVERHEAD);
        assert!(
            overhead.contains(&"switchyard_gateway_overhead_seconds_count{model=\"a\",inbound_protocol=\"openai\"} 2"),
            "{text}"
        );
        assert!(
            overhead.contains(&"switchyard_gateway_overhead_seconds_count{model=\"b\",inbound_protocol=\"openai\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn an_attempt_records_its_duration_and_the_tokens_reported() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let hot = HotPath::default();
        let attempt = |error_type, cached_input_tokens| AttemptDone {
            model: "m",
            endpoint: "e1",
            upstream_protocol: "anthropic",
            operation: Operation::Chat,
            error_type,
            status: if error_type.is_some() { 0 } else { 200 },
            duration: Duration::from_millis(20),
            input_tokens: 12,
            output_tokens: 0,
            cached_input_tokens,
        };
        metrics::with_local_recorder(&recorder, || {
            hot.attempt_done(&attempt(None, 0));
            hot.attempt_done(&attempt(None, 4));
            hot.attempt_done(&attempt(Some("transport"), 0));
        });
        let text = handle.render();
        let durations = series(&text, CLIENT_OPERATION_DURATION);
        assert!(
            durations.contains(&"gen_ai_client_operation_duration_seconds_count{model=\"m\",endpoint=\"e1\",upstream_protocol=\"anthropic\",operation=\"chat\",status_class=\"2xx\",error_type=\"none\"} 2"),
            "{text}"
        );
        assert!(
            durations.contains(&"gen_ai_client_operation_duration_seconds_count{model=\"m\",endpoint=\"e1\",upstream_protocol=\"anthropic\",operation=\"chat\",status_class=\"none\",error_type=\"transport\"} 1"),
            "{text}"
        );
        // Input and output (even 0) for each served attempt, cached only when reported; nothing
        // for the failed one.
        let usage = series(&text, CLIENT_TOKEN_USAGE);
        for (kind, count) in [("input", 2), ("output", 2), ("cached", 1)] {
            let line = format!(
                "gen_ai_client_token_usage_count{{model=\"m\",endpoint=\"e1\",operation=\"chat\",type=\"{kind}\"}} {count}"
            );
            assert!(usage.contains(&line.as_str()), "{line} in {text}");
        }
        assert_eq!(usage.len(), 3, "{text}");
    }
}
