//! One live strategy instance per model: the router resource, its store, and recovery after a trap.
//!
//! Each model owns its instance behind its own lock, held only for the duration of one call, so a
//! model's strategy state stays whole (cursors, learned profiles) without serialising other models.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::Store;
use wasmtime::component::ResourceAny;

use super::StrategyError;
use super::catalog::LoadedStrategy;
use super::engine::{DeadlineElapsed, SETUP_TIMEOUT, StrategyEngine, arm, wall_backstop};
use super::types::{Candidate, Decision, Observation, Request, UpstreamInfo};
use super::wit::{Call, Guest, Reply, StoreState};
use crate::telemetry::metrics as telemetry;

struct LiveInstance {
    store: Store<StoreState>,
    guest: Guest,
    router: ResourceAny,
}

/// Counters shown in health endpoints.
#[derive(Debug, Default)]
pub struct RouterStats {
    pub selects: AtomicU64,
    /// Of `selects`, those the host answered for the strategy (one candidate, `select-single`).
    pub selects_skipped: AtomicU64,
    /// Calls that trapped, timed out, ran out of memory, returned an error or an invalid order.
    pub failures: AtomicU64,
    /// Times the instance was re-created after a trap (its state was reset).
    pub resets: AtomicU64,
    pub last_failure: parking_lot::Mutex<Option<String>>,
}

/// Observations queued while a model's instance is busy, at most; beyond it an observation waits
/// for the instance in a task of its own.
const MAX_QUEUED_OBSERVATIONS: usize = 1024;

/// A model's router: the strategy instance plus what is needed to rebuild it.
pub struct ModelRouter {
    pub model_id: String,
    pub strategy: Arc<LoadedStrategy>,
    engine: StrategyEngine,
    params_json: String,
    /// The last upstream table pushed, re-pushed into a fresh instance after a trap.
    upstreams: parking_lot::Mutex<Vec<UpstreamInfo>>,
    /// `None` after a failure killed the instance, until the next call re-creates it. An async
    /// lock: a call may await a guest's WASI I/O, and other models never wait on this one.
    instance: tokio::sync::Mutex<Option<LiveInstance>>,
    /// Observations that found the instance busy, delivered in order at the start of the next
    /// call on it (before anything that could read the state they change). Waiting for the
    /// instance instead was a task parked on another serving thread and woken from this one.
    queued: parking_lot::Mutex<Vec<Observation>>,
    /// Whether `queued` may hold something, so a call looks at it only then.
    any_queued: AtomicBool,
    pub stats: RouterStats,
    /// When each endpoint (by id) last finished an attempt, and when the router was created, in
    /// ms since the Unix epoch: what the RouteWise prober calls idle.
    activity: parking_lot::Mutex<(u64, crate::id_map::IdMap<String, u64>)>,
    /// A model's shadow ([`super::shadow`]): its selects and failures are the shadow's metrics,
    /// not the model's strategy's, and nothing falls back to declared order.
    shadow: bool,
}

impl std::fmt::Debug for ModelRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRouter")
            .field("model_id", &self.model_id)
            .field("strategy", &self.strategy.name)
            .finish_non_exhaustive()
    }
}

impl ModelRouter {
    /// Instantiates the strategy for `model_id` and calls `create` with the (already validated) params.
    pub async fn new(
        engine: &StrategyEngine,
        strategy: Arc<LoadedStrategy>,
        model_id: &str,
        params: &serde_json::Value,
        upstreams: Vec<UpstreamInfo>,
    ) -> Result<Self, StrategyError> {
        let router = ModelRouter {
            model_id: model_id.to_owned(),
            engine: engine.clone(),
            params_json: params.to_string(),
            upstreams: parking_lot::Mutex::new(upstreams),
            instance: tokio::sync::Mutex::new(None),
            queued: parking_lot::Mutex::new(Vec::new()),
            any_queued: AtomicBool::new(false),
            stats: RouterStats::default(),
            activity: parking_lot::Mutex::new((crate::clock::unix_ms(), Default::default())),
            strategy,
            shadow: false,
        };
        let live = router.instantiate().await?;
        *router.instance.lock().await = Some(live);
        Ok(router)
    }

    async fn instantiate(&self) -> Result<LiveInstance, StrategyError> {
        let s = &self.strategy;
        let _running = self.engine.guest_running();
        let mut store = self.engine.new_store(&s.label());
        let mut guest = match bounded(SETUP_TIMEOUT, s.pre.instantiate(&mut store)).await {
            Ok(g) => g,
            Err(e) => return Err(self.trap("instantiate", &store, e)),
        };
        arm(&mut store, SETUP_TIMEOUT);
        let created = bounded(
            SETUP_TIMEOUT,
            guest.create(&mut store, &self.model_id, &self.params_json),
        )
        .await;
        let router = match created {
            Ok(Ok(router)) => router,
            Ok(Err(message)) => {
                return Err(StrategyError::Rejected {
                    strategy: s.label(),
                    call: "create",
                    message,
                });
            }
            Err(e) => return Err(self.trap("create", &store, e)),
        };
        let upstreams = self.upstreams.lock().clone();
        let call = Call::Upstreams(&upstreams);
        arm(&mut store, SETUP_TIMEOUT);
        let refreshed = bounded(SETUP_TIMEOUT, guest.call(&mut store, router, call)).await;
        if let Err(e) = refreshed {
            return Err(self.trap(call.name(guest.version()), &store, e));
        }
        Ok(LiveInstance {
            store,
            guest,
            router,
        })
    }

    /// Locks the instance, re-creating it first if a previous call killed it.
    async fn acquire(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<LiveInstance>>, StrategyError> {
        let mut slot = self.instance.lock().await;
        self.revive(&mut slot).await?;
        if self.any_queued.load(Ordering::Acquire) {
            // Boxed, like the re-creation: it would otherwise size every call's future.
            Box::pin(self.deliver_queued(&mut slot)).await?;
        }
        Ok(slot)
    }

    /// Delivers the observations queued while the instance was busy, oldest first. A failed one
    /// is recorded like any `observe` failure; a trap re-creates the instance for the rest.
    async fn deliver_queued(
        &self,
        slot: &mut tokio::sync::MutexGuard<'_, Option<LiveInstance>>,
    ) -> Result<(), StrategyError> {
        self.any_queued.store(false, Ordering::Release);
        let queued = std::mem::take(&mut *self.queued.lock());
        for observation in &queued {
            if let Err(e) = self.call_in(slot, Call::Observe(observation)).await {
                self.record_failure(&e);
            }
            self.revive(slot).await?;
        }
        Ok(())
    }

    /// Queues `observation` when the instance is busy (and the queue has room), to be delivered
    /// at the start of the next call; gives it back when the instance is free, for the caller to
    /// deliver now. The prober's activity is noted either way.
    pub fn queue_if_busy(&self, observation: Observation) -> Option<Observation> {
        if self.instance.try_lock().is_ok() {
            return Some(observation);
        }
        let mut queued = self.queued.lock();
        if queued.len() >= MAX_QUEUED_OBSERVATIONS {
            return Some(observation);
        }
        self.note_activity(observation.index, observation.now_ms);
        queued.push(observation);
        self.any_queued.store(true, Ordering::Release);
        None
    }

    /// Re-creates the instance if a previous call killed it.
    async fn revive(
        &self,
        slot: &mut tokio::sync::MutexGuard<'_, Option<LiveInstance>>,
    ) -> Result<(), StrategyError> {
        if slot.is_none() {
            // Boxed: the rare re-creation would otherwise size every call's future.
            let live = Box::pin(self.instantiate()).await?;
            self.stats.resets.fetch_add(1, Ordering::Relaxed);
            if !self.shadow {
                telemetry::strategy_reset(&self.model_id, &self.strategy.name);
            }
            tracing::warn!(
                model = %self.model_id,
                strategy = %self.strategy.label(),
                "strategy instance re-created after a failure; its state was reset"
            );
            **slot = Some(live);
        }
        Ok(())
    }

    /// Turns a call's outcome into ours. A trap leaves the instance dead (wasmtime refuses to
    /// re-enter it), so it is dropped and re-created on the next call.
    fn settle<T>(
        &self,
        slot: &mut Option<LiveInstance>,
        call: &'static str,
        result: wasmtime::Result<T>,
    ) -> Result<T, StrategyError> {
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                let err = match slot.as_ref() {
                    Some(live) => self.trap(call, &live.store, e),
                    None => StrategyError::Engine(format!("{e:?}")),
                };
                *slot = None;
                Err(err)
            }
        }
    }

    fn trap(
        &self,
        call: &'static str,
        store: &Store<StoreState>,
        e: wasmtime::Error,
    ) -> StrategyError {
        let interrupted = matches!(
            e.downcast_ref::<wasmtime::Trap>(),
            Some(wasmtime::Trap::Interrupt)
        ) || e.downcast_ref::<DeadlineElapsed>().is_some();
        let reason = if interrupted {
            format!(
                "exceeded its deadline of {} ms of CPU time",
                self.engine.limits().call_timeout.as_millis()
            )
        } else {
            let text = format!("{e:?}");
            if text.contains("memory") && text.contains("grow") {
                format!(
                    "exceeded its memory cap of {} MiB",
                    self.engine.limits().memory_limit_bytes >> 20
                )
            } else {
                text.lines().next().unwrap_or("trap").to_owned()
            }
        };
        let stderr = store.data().stderr.contents();
        let stderr = String::from_utf8_lossy(&stderr);
        let stderr = stderr.trim();
        StrategyError::Trap {
            strategy: self.strategy.label(),
            call,
            reason: if stderr.is_empty() {
                reason
            } else {
                format!("{reason}; guest stderr: {}", last_chars(stderr, 500))
            },
        }
    }

    /// The deadline of this router's calls (`StrategyEngine::deadline_for`).
    pub fn deadline(&self) -> Duration {
        self.engine.limits().call_timeout
    }

    /// Asks the strategy for an order. The result is checked: every index must be one of the
    /// candidates' and appear once. On any error the caller falls back to declared order.
    ///
    /// A strategy that declares `select-single` is not called for one candidate: the host gives
    /// the answer the strategy promised (that candidate, no hedge, no metadata).
    pub async fn select(
        &self,
        request: &Request,
        candidates: &[Candidate],
    ) -> Result<Decision, StrategyError> {
        if let [only] = candidates
            && self.strategy.skips.select_single
        {
            self.stats.selects.fetch_add(1, Ordering::Relaxed);
            self.stats.selects_skipped.fetch_add(1, Ordering::Relaxed);
            if !self.shadow {
                telemetry::strategy_select_skipped(&self.model_id, &self.strategy.name);
            }
            return Ok(Decision {
                order: vec![only.index],
                hedge: None,
                strategy_metadata: String::new(),
            });
        }
        self.select_in_guest(request, candidates).await
    }

    /// [`Self::select`] through the guest whatever it declared (the contract suite checks the
    /// declaration against it).
    pub(crate) async fn select_in_guest(
        &self,
        request: &Request,
        candidates: &[Candidate],
    ) -> Result<Decision, StrategyError> {
        self.stats.selects.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let result = self
            .call(Call::Select(request, candidates))
            .await
            .and_then(|reply| match reply {
                Reply::Decision(decision) => Ok(decision),
                _ => Err(StrategyError::Engine("select: unexpected reply".into())),
            })
            .and_then(|r| {
                r.map_err(|message| StrategyError::Rejected {
                    strategy: self.strategy.label(),
                    call: "select",
                    message,
                })
            })
            .and_then(|d| {
                check_order(&d.order, candidates)
                    .map(|()| d)
                    .map_err(|reason| StrategyError::InvalidDecision {
                        strategy: self.strategy.label(),
                        reason,
                    })
            });
        if self.shadow {
            telemetry::shadow_select(&self.model_id, &self.strategy.name, started.elapsed());
        } else {
            telemetry::strategy_select(&self.model_id, &self.strategy.name, started.elapsed());
        }
        if let Err(e) = &result {
            self.record_failure(e);
            if !self.shadow {
                // The caller (routing's selection) answers every select failure with declared order.
                telemetry::strategy_fallback(&self.model_id, &self.strategy.name);
            }
        }
        result
    }

    /// The one way into the live instance: re-creates it if a trap killed it, arms the call's
    /// deadline, runs the call bounded by its wall-clock backstop, and settles the outcome (a trap
    /// drops the instance).
    async fn call(&self, call: Call<'_>) -> Result<Reply, StrategyError> {
        let mut slot = self.acquire().await?;
        self.call_in(&mut slot, call).await
    }

    /// [`Self::call`] on an instance already locked.
    async fn call_in(
        &self,
        slot: &mut tokio::sync::MutexGuard<'_, Option<LiveInstance>>,
        call: Call<'_>,
    ) -> Result<Reply, StrategyError> {
        let Some(live) = slot.as_mut() else {
            return Err(StrategyError::Engine("instance slot empty".into()));
        };
        let deadline = match call {
            // Off the request path, and a strategy may build tables from them.
            Call::Upstreams(_) => SETUP_TIMEOUT,
            _ => self.engine.limits().call_timeout,
        };
        let name = call.name(live.guest.version());
        let _running = self.engine.guest_running();
        arm(&mut live.store, deadline);
        // Boxed: wasmtime's call future is kilobytes, and inline it sized the future of every
        // request's selection.
        let result = Box::pin(bounded(
            deadline,
            live.guest.call(&mut live.store, live.router, call),
        ))
        .await;
        self.settle(slot, name, result)
    }

    /// Makes this router a model's shadow: its calls are reported as the shadow's.
    pub(crate) fn into_shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// The upstream table last pushed to the strategy (what a recorded decision is replayed with).
    pub fn upstreams(&self) -> Vec<UpstreamInfo> {
        self.upstreams.lock().clone()
    }

    /// The params the strategy was created with, as JSON text.
    pub fn params_json(&self) -> &str {
        &self.params_json
    }

    /// Replaces the upstream table and pushes it to the strategy.
    pub async fn refresh_upstreams(
        &self,
        upstreams: Vec<UpstreamInfo>,
    ) -> Result<(), StrategyError> {
        *self.upstreams.lock() = upstreams.clone();
        let result = self.call(Call::Upstreams(&upstreams)).await.map(drop);
        if let Err(e) = &result {
            self.record_failure(e);
        }
        result
    }

    /// Whether the strategy wants `observe` (it did not declare it skipped).
    pub fn observes(&self) -> bool {
        !self.strategy.skips.observe
    }

    pub async fn observe(&self, observation: &Observation) {
        self.note_activity(observation.index, observation.now_ms);
        if !self.observes() {
            return;
        }
        let result = self.call(Call::Observe(observation)).await;
        if let Err(e) = &result {
            self.record_failure(e);
        }
    }

    /// Records that the upstream at `index` finished an attempt at `at_ms` (what
    /// [`Self::last_activity_ms`] reads), whether or not the strategy observes it.
    pub(crate) fn note_activity(&self, index: u32, at_ms: u64) {
        let table = self.upstreams.lock();
        let Some(route) = table.iter().find(|r| r.index == index) else {
            return;
        };
        let mut activity = self.activity.lock();
        match activity.1.get_mut(&route.endpoint_id) {
            Some(last) => *last = (*last).max(at_ms),
            None => {
                activity.1.insert(route.endpoint_id.clone(), at_ms);
            }
        }
    }

    /// When `endpoint_id` last finished an attempt observed by this router (replayed history
    /// included), else when the router was created; ms since the Unix epoch.
    pub fn last_activity_ms(&self, endpoint_id: &str) -> u64 {
        let activity = self.activity.lock();
        activity.1.get(endpoint_id).copied().unwrap_or(activity.0)
    }

    /// The strategy's status text, as the guest returned it.
    pub async fn status_text(&self) -> Result<String, StrategyError> {
        let result = self.call(Call::Status).await.and_then(|reply| match reply {
            Reply::Status(text) => Ok(text),
            _ => Err(StrategyError::Engine("status: unexpected reply".into())),
        });
        if let Err(e) = &result {
            self.record_failure(e);
        }
        result
    }

    /// The strategy's status as JSON; a string when it is not JSON, `{"error": ...}` on failure.
    pub async fn status(&self) -> serde_json::Value {
        match self.status_text().await {
            Ok(text) => serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        }
    }

    pub async fn tick(&self, now_ms: u64) {
        if self.strategy.skips.tick {
            return;
        }
        let result = self.call(Call::Tick(now_ms)).await;
        if let Err(e) = &result {
            self.record_failure(e);
        }
    }

    fn record_failure(&self, e: &StrategyError) {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        let (call, kind) = failure_kind(e);
        if self.shadow {
            // Counted by the shadow as a failed select; it never touched a request.
            tracing::debug!(model = %self.model_id, strategy = %self.strategy.label(), "shadow strategy failure: {e}");
        } else {
            telemetry::strategy_failure(&self.model_id, &self.strategy.name, call, kind);
            tracing::warn!(model = %self.model_id, strategy = %self.strategy.label(), "strategy failure: {e}");
        }
        *self.stats.last_failure.lock() = Some(e.to_string());
    }
}

/// The failed call and the kind of failure, for `switchyard_strategy_failures_total`.
fn failure_kind(e: &StrategyError) -> (&'static str, &'static str) {
    match e {
        StrategyError::Trap { call, reason, .. } => (
            *call,
            if reason.starts_with("exceeded its deadline") {
                "timeout"
            } else if reason.starts_with("exceeded its memory cap") {
                "memory"
            } else {
                "trap"
            },
        ),
        StrategyError::Rejected { call, .. } => (*call, "rejected"),
        StrategyError::InvalidDecision { .. } => ("select", "invalid_decision"),
        StrategyError::Engine(_)
        | StrategyError::Load { .. }
        | StrategyError::UnsupportedApi { .. } => ("unknown", "engine"),
    }
}

/// A call awaiting a host future (a guest blocked on WASI I/O) is not interrupted by epochs, which
/// only tick inside wasm code; a timer at the wall-clock backstop bounds it too.
///
/// A synchronous guest (every strategy that does no I/O) finishes within the first poll, which
/// therefore runs without the timer: arming and cancelling one per call showed in profiles.
async fn bounded<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = wasmtime::Result<T>>,
) -> wasmtime::Result<T> {
    let mut call = std::pin::pin!(call);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(result) = first {
        return result;
    }
    match tokio::time::timeout(wall_backstop(deadline), call).await {
        Ok(result) => result,
        Err(_) => Err(wasmtime::Error::new(DeadlineElapsed)),
    }
}

/// A valid order lists candidate indexes only, each at most once, and at least one when there are
/// candidates.
pub fn check_order(order: &[u32], candidates: &[Candidate]) -> Result<(), String> {
    if order.is_empty() && !candidates.is_empty() {
        return Err("empty order".into());
    }
    for (pos, idx) in order.iter().enumerate() {
        if !candidates.iter().any(|c| c.index == *idx) {
            return Err(format!("index {idx} is not a candidate"));
        }
        if order[..pos].contains(idx) {
            return Err(format!("index {idx} appears twice"));
        }
    }
    Ok(())
}

fn last_chars(s: &str, n: usize) -> &str {
    match s.char_indices().rev().nth(n.saturating_sub(1)) {
        Some((i, _)) if s.chars().count() > n => &s[i..],
        _ => s,
    }
}
