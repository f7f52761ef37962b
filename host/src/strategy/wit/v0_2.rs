//! `switchyard:router@0.2.0` (`wit/since_v0.2.0`, the newest): its bindings and their conversion to
//! and from the host's types, which follow it field for field.

mod image;

use switchyard_select_abi::{Direct, SelectFunc};
use wasmtime::Store;
use wasmtime::component::ResourceAny;

use super::{Call, Level, Reply, StoreState};
use crate::strategy::types;

// Exports are async so that a guest's WASI calls which may block (stderr writes on panic, sleeps)
// are awaited on the caller's runtime instead of blocking it. The host import (`log`) stays sync.
wasmtime::component::bindgen!({
    path: "../wit/since_v0.2.0",
    world: "switchyard:router/strategy-component",
    exports: { default: async },
});

use self::switchyard::router::host::LogLevel;
use self::switchyard::router::types as wit;

impl self::switchyard::router::host::Host for StoreState {
    fn log(&mut self, level: LogLevel, message: String) {
        let level = match level {
            LogLevel::Trace => Level::Trace,
            LogLevel::Debug => Level::Debug,
            LogLevel::Info => Level::Info,
            LogLevel::Warn => Level::Warn,
            LogLevel::Error => Level::Error,
        };
        StoreState::log(self, level, &message);
    }
}

impl self::switchyard::router::types::Host for StoreState {}

/// `select` as called on the request path: its arguments written by their images ([`image`]).
type Select = SelectFunc<wit::Request, wit::Candidate, (Result<wit::Decision, String>,)>;

/// A live 0.2.0 instance, with buffers reused from call to call so that converting the host's
/// types allocates nothing on the request path.
pub(in crate::strategy) struct Live {
    bindings: StrategyComponent,
    select: Select,
    candidates: Vec<Direct<wit::Candidate>>,
    observation: wit::Observation,
}

impl Live {
    pub(super) fn new(
        store: &Store<StoreState>,
        bindings: StrategyComponent,
    ) -> wasmtime::Result<Self> {
        let select = *bindings
            .switchyard_router_strategy()
            .router()
            .func_select()
            .func();
        Ok(Self {
            select: Select::new(store, select)?,
            bindings,
            candidates: Vec::new(),
            observation: wit::Observation {
                index: 0,
                success: false,
                ttft_ms: None,
                latency_ms: 0.0,
                prompt_tokens: 0,
                completion_tokens: 0,
                cached_prompt_tokens: 0,
                status: 0,
                strategy_metadata: String::new(),
                now_ms: 0,
            },
        })
    }

    pub(super) async fn info(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<types::StrategyInfo> {
        let info = self
            .bindings
            .switchyard_router_strategy()
            .call_info(store)
            .await?;
        Ok(types::StrategyInfo {
            name: info.name,
            version: info.version,
            description: info.description,
        })
    }

    pub(super) async fn params_schema(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<String> {
        self.bindings
            .switchyard_router_strategy()
            .call_params_schema(store)
            .await
    }

    pub(super) async fn create(
        &self,
        store: &mut Store<StoreState>,
        model_id: &str,
        params_json: &str,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        self.bindings
            .switchyard_router_strategy()
            .router()
            .call_create(store, model_id, params_json)
            .await
    }

    pub(super) async fn call(
        &mut self,
        store: &mut Store<StoreState>,
        router: ResourceAny,
        call: Call<'_>,
    ) -> wasmtime::Result<Reply> {
        let guest = self.bindings.switchyard_router_strategy().router();
        match call {
            Call::Upstreams(upstreams) => {
                let upstreams: Vec<wit::Upstream> = upstreams.iter().map(upstream).collect();
                guest
                    .call_refresh_upstreams(store, router, &upstreams)
                    .await?;
                Ok(Reply::Done)
            }
            Call::Select(request, candidates) => {
                self.candidates.clear();
                self.candidates
                    .extend(candidates.iter().map(|c| Direct(candidate(c))));
                let request = Direct(self::request(request));
                let (decision,) = self
                    .select
                    .typed()
                    .call_async(&mut *store, (router, &request, &self.candidates))
                    .await?;
                Ok(Reply::Decision(decision.map(|d| types::Decision {
                    order: d.order,
                    hedge: d.hedge.map(|h| types::HedgeRequest {
                        after_ms: h.after_ms,
                        backup: h.backup,
                    }),
                    strategy_metadata: d.strategy_metadata,
                })))
            }
            Call::Observe(o) => {
                let w = &mut self.observation;
                w.index = o.index;
                w.success = o.success;
                w.ttft_ms = o.ttft_ms;
                w.latency_ms = o.latency_ms;
                w.prompt_tokens = o.prompt_tokens;
                w.completion_tokens = o.completion_tokens;
                w.cached_prompt_tokens = o.cached_prompt_tokens;
                w.status = o.status;
                w.strategy_metadata.clear();
                w.strategy_metadata.push_str(&o.strategy_metadata);
                w.now_ms = o.now_ms;
                guest.call_observe(store, router, w).await?;
                Ok(Reply::Done)
            }
            Call::Status => Ok(Reply::Status(guest.call_status(store, router).await?)),
            Call::Tick(now_ms) => {
                guest.call_tick(store, router, now_ms).await?;
                Ok(Reply::Done)
            }
        }
    }
}

fn upstream(u: &types::UpstreamInfo) -> wit::Upstream {
    wit::Upstream {
        index: u.index,
        endpoint_id: u.endpoint_id.clone(),
        provider: u.provider.clone(),
        base_url: u.base_url.clone(),
        provider_model_id: u.provider_model_id.clone(),
        weight: u.weight,
        priority: u.priority,
        input_modalities: u.input_modalities.clone(),
        pricing: u.pricing.map(|p| wit::Pricing {
            prompt: p.prompt,
            completion: p.completion,
            input_cache_reads: p.input_cache_reads,
            input_cache_writes: p.input_cache_writes,
        }),
        metadata_json: u.metadata_json.clone(),
    }
}

fn modalities(m: types::Modalities) -> wit::Modalities {
    let mut out = wit::Modalities::empty();
    if m.contains(types::Modalities::IMAGE) {
        out |= wit::Modalities::IMAGE;
    }
    if m.contains(types::Modalities::AUDIO) {
        out |= wit::Modalities::AUDIO;
    }
    if m.contains(types::Modalities::VIDEO) {
        out |= wit::Modalities::VIDEO;
    }
    out
}

fn request(r: &types::Request) -> wit::Request {
    wit::Request {
        caller_hash: r.caller_hash,
        prompt_tokens: r.prompt_tokens,
        max_tokens: r.max_tokens,
        stream: r.stream,
        modalities: modalities(r.modalities),
        seed: r.seed,
        now_ms: r.now_ms,
        prefill: wit::PrefillPolicy {
            enabled: r.prefill.enabled,
            intervene_tokens: r.prefill.intervene_tokens,
            elephant_tokens: r.prefill.elephant_tokens,
            elephant_limit: r.prefill.elephant_limit,
        },
        remaining_budget_usd: r.remaining_budget_usd,
    }
}

fn candidate(c: &types::Candidate) -> wit::Candidate {
    wit::Candidate {
        index: c.index,
        weight: c.weight,
        priority: c.priority,
        availability: c.availability,
        circuit: match c.circuit {
            types::CircuitState::Closed => wit::CircuitState::Closed,
            types::CircuitState::Open => wit::CircuitState::Open,
            types::CircuitState::HalfOpen => wit::CircuitState::HalfOpen,
        },
        prefill_backlog_tokens: c.prefill_backlog_tokens,
        inflight_elephants: c.inflight_elephants,
        uncached_prompt_tokens: c.uncached_prompt_tokens,
        ttft_ms: c.ttft_ms,
        latency_ms: c.latency_ms,
        inflight_requests: c.inflight_requests,
        affinity_pinned: c.affinity_pinned,
    }
}
