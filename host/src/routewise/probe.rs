//! The in-process prober (`routewise_probe_enabled`, off by default): latency evidence for
//! endpoints that the LP avoids and that real traffic therefore never measures.
//!
//! Every `routewise_probe_interval_sec`, for each published RouteWise model that enables it, the
//! prober picks the endpoint of the model that has been idle longest — idle meaning no attempt
//! finished there (live, replayed or probed) for at least `routewise_probe_idle_threshold_sec`,
//! counting from the router's creation when it never had one — and streams it a one-token `ping`
//! chat request (its own protocol, its own key; at most 30 s). The outcome goes to the router's
//! `observe` like a real attempt, without strategy metadata: time to the first token, or the 60 s
//! failure penalty the component gives any failure. Routes with weight 0 (disabled, failing a
//! health check) are not probed. Probes bypass the circuit breaker and the request log; they do
//! count against a `local_quota_fallback` pool, as any dispatched request does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::config::{ModelConfig, ModelUpstream};
use crate::protocol::inbound::Inbound;
use crate::protocol::ir;
use crate::routewise::quota::QuotaBoard;
use crate::routing::table::ModelTable;
use crate::strategy::{ModelRouter, Observation};
use crate::upstream::{
    Attempt, AttemptEnd, AttemptError, AttemptSink, ChatAnswer, UpstreamClient, upstream_dialect,
};

/// The longest a probe may take, from sending to the end of the stream.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the prober looks for due models.
const TICK: Duration = Duration::from_millis(250);

/// The probe knobs of one model, read from its params with the schema's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProbeSettings {
    pub enabled: bool,
    pub interval_sec: u64,
    pub idle_threshold_sec: u64,
}

impl ProbeSettings {
    pub fn from_params(params: &Value, schema: &Value) -> Self {
        let get = |key: &str| super::param(params, schema, key);
        ProbeSettings {
            enabled: get("routewise_probe_enabled").as_bool().unwrap_or(false),
            // A 0 s interval would probe on every tick; one second is the finest the key means.
            interval_sec: get("routewise_probe_interval_sec")
                .as_u64()
                .unwrap_or(300)
                .max(1),
            idle_threshold_sec: get("routewise_probe_idle_threshold_sec")
                .as_u64()
                .unwrap_or(900),
        }
    }
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeRecord {
    pub endpoint_id: String,
    /// When it ended, ms since the Unix epoch.
    pub at_ms: u64,
    pub success: bool,
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    /// HTTP status of the answer; 0 for a transport error or timeout.
    pub status: u16,
    pub error: Option<String>,
}

/// The prober's state of one model, for `/health/deep`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelProbes {
    /// When the model is next considered, ms since the Unix epoch.
    pub next_at_ms: u64,
    pub in_flight: Option<String>,
    pub probes: u64,
    pub failures: u64,
    pub last: Option<ProbeRecord>,
}

/// Per model, by canonical id.
pub type ProbeBoard = parking_lot::Mutex<BTreeMap<String, ModelProbes>>;

/// The endpoint of `model` to probe at `now_ms`: the longest idle among those idle for at least
/// the threshold, declared order breaking ties.
pub fn pick<'a>(
    model: &'a ModelConfig,
    router: &ModelRouter,
    settings: ProbeSettings,
    now_ms: u64,
) -> Option<&'a ModelUpstream> {
    let threshold = settings.idle_threshold_sec.saturating_mul(1_000);
    model
        .upstreams
        .iter()
        .filter(|r| r.weight > 0.0)
        .map(|r| {
            (
                r,
                now_ms.saturating_sub(router.last_activity_ms(&r.endpoint_id)),
            )
        })
        .filter(|(_, idle)| *idle >= threshold)
        .fold(
            None,
            |best: Option<(&ModelUpstream, u64)>, (r, idle)| match best {
                Some((_, best_idle)) if best_idle >= idle => best,
                _ => Some((r, idle)),
            },
        )
        .map(|(r, _)| r)
}

/// Streams a one-token `ping` to `route` through the same [`Attempt`] live traffic uses, and turns
/// the outcome into an observation.
pub async fn probe(client: &UpstreamClient, route: &ModelUpstream) -> (Observation, ProbeRecord) {
    let dialect = upstream_dialect(route.kind);
    let mut request = ir::Request::new(
        route.provider_model_id.clone(),
        dialect,
        vec![ir::Message::text(ir::Role::User, "ping")],
    );
    request.stream = true;
    request.max_output_tokens = Some(1);
    let prompt_estimate = request.prompt_token_estimate();
    let body = bytes::Bytes::from(dialect.build_request(&request, &route.provider_model_id));
    let inbound = Inbound {
        dialect,
        request,
        body,
        fields: None,
        prompt_tokens: prompt_estimate,
    };
    let started = Instant::now();
    let ended = Arc::new(parking_lot::Mutex::new(None));
    let sink = ProbeSink(ended.clone());
    let relayed = tokio::time::timeout(PROBE_TIMEOUT, async {
        if let ChatAnswer::Stream { mut events, .. } = Attempt::new(client, route, None)
            .chat(&inbound, sink)
            .await?
        {
            while events.next().await.is_some() {}
        }
        Ok::<(), AttemptError>(())
    })
    .await;
    let end = ended.lock().take();
    let (outcome, first_token, latency_ms, usage) = match (relayed, end) {
        (Ok(_), Some(end)) => (end.outcome, end.ttft_ms, end.latency_ms, end.usage),
        // Cut off by the deadline: the relay was dropped before it ended.
        _ => (
            Err(AttemptError::Timeout(PROBE_TIMEOUT)),
            None,
            started.elapsed().as_secs_f64() * 1000.0,
            ir::Usage::default(),
        ),
    };
    let now_ms = crate::clock::unix_ms();
    let (success, status, error) = match outcome {
        Ok(()) => (true, 200, None),
        Err(e) => (false, e.status(), Some(e.to_string())),
    };
    let observation = Observation {
        index: route.index,
        success,
        ttft_ms: first_token,
        latency_ms,
        prompt_tokens: if usage.input_tokens > 0 {
            usage.input_tokens
        } else {
            prompt_estimate
        },
        completion_tokens: usage.output_tokens,
        cached_prompt_tokens: usage.cached_input_tokens,
        status,
        strategy_metadata: String::new(),
        now_ms,
    };
    let record = ProbeRecord {
        endpoint_id: route.endpoint_id.clone(),
        at_ms: now_ms,
        success,
        ttft_ms: first_token,
        latency_ms,
        status,
        error,
    };
    (observation, record)
}

/// How a probe ended, as its attempt reported it.
struct ProbeEnd {
    outcome: Result<(), AttemptError>,
    ttft_ms: Option<f64>,
    latency_ms: f64,
    usage: ir::Usage,
}

/// A probe books nothing but its own outcome: it bypasses health, affinity and prefill.
struct ProbeSink(Arc<parking_lot::Mutex<Option<ProbeEnd>>>);

impl AttemptSink for ProbeSink {
    fn first_token(&mut self) {}

    fn end(&mut self, end: AttemptEnd<'_>) {
        *self.0.lock() = Some(ProbeEnd {
            outcome: end.outcome.map_err(Clone::clone),
            ttft_ms: end.ttft_ms,
            latency_ms: end.latency_ms,
            usage: end.usage,
        });
    }
}

/// Starts the prober. `table` gives the current route table, or `None` once the gateway is gone
/// (the loop ends).
pub fn spawn<F>(board: Arc<ProbeBoard>, client: UpstreamClient, quota: Arc<QuotaBoard>, table: F)
where
    F: Fn() -> Option<Arc<ModelTable>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut timer = tokio::time::interval(TICK);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            timer.tick().await;
            let Some(table) = table() else {
                return;
            };
            let now = crate::clock::unix_ms();
            for model in table.models() {
                if model.router.strategy.name != super::STRATEGY || !model.config.published {
                    continue;
                }
                let settings = ProbeSettings::from_params(
                    &model.config.router_params,
                    &model.router.strategy.params_schema,
                );
                if !settings.enabled {
                    continue;
                }
                let route = {
                    let mut probes = board.lock();
                    let state = probes.entry(model.id().to_owned()).or_insert_with(|| {
                        // The first probe waits one interval: a new router has just started.
                        ModelProbes {
                            next_at_ms: now + settings.interval_sec * 1_000,
                            ..ModelProbes::default()
                        }
                    });
                    if state.in_flight.is_some() || now < state.next_at_ms {
                        continue;
                    }
                    state.next_at_ms = now + settings.interval_sec * 1_000;
                    let Some(route) = pick(&model.config, &model.router, settings, now) else {
                        continue;
                    };
                    state.in_flight = Some(route.endpoint_id.clone());
                    route.clone()
                };
                let (board, client, quota) = (board.clone(), client.clone(), quota.clone());
                let (model_id, router) = (model.id().to_owned(), model.router.clone());
                tokio::spawn(async move {
                    quota.count_request(&route.endpoint_id);
                    let (observation, record) = probe(&client, &route).await;
                    router.observe(&observation).await;
                    if record.success {
                        tracing::debug!(model = %model_id, endpoint = %record.endpoint_id, ttft_ms = ?record.ttft_ms, "routewise probe");
                    } else {
                        tracing::info!(model = %model_id, endpoint = %record.endpoint_id, "routewise probe failed: {}", record.error.as_deref().unwrap_or(""));
                    }
                    let mut probes = board.lock();
                    let state = probes.entry(model_id).or_default();
                    state.in_flight = None;
                    state.probes += 1;
                    state.failures += u64::from(!record.success);
                    state.last = Some(record);
                });
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_default_off_and_clamp_the_interval() {
        let schema = json!({"properties": {
            "routewise_probe_enabled": {"default": false},
            "routewise_probe_interval_sec": {"default": 300},
            "routewise_probe_idle_threshold_sec": {"default": 900},
        }});
        assert_eq!(
            ProbeSettings::from_params(&json!({}), &schema),
            ProbeSettings {
                enabled: false,
                interval_sec: 300,
                idle_threshold_sec: 900
            }
        );
        let on = json!({"routewise_probe_enabled": true, "routewise_probe_interval_sec": 0,
                        "routewise_probe_idle_threshold_sec": 5});
        assert_eq!(
            ProbeSettings::from_params(&on, &schema),
            ProbeSettings {
                enabled: true,
                interval_sec: 1,
                idle_threshold_sec: 5
            }
        );
    }
}
