//! The ledger: what each attempt's outcome means for routing's state. Endpoint health and the
//! breaker, key quieting and key affinity, session affinity, prefill load, the gateway extension's
//! attempt hook (RouteWise's local quota counter) and the strategy's observation are all booked
//! here, and nowhere else.

use std::sync::Arc;
use std::task::Context;
use std::time::Instant;

use crate::config::ModelUpstream;
use crate::protocol::ir;
use crate::strategy::{ModelRouter, Observation};
use crate::telemetry::metrics as telemetry;
use crate::telemetry::trace::{AttemptOutcome, AttemptTrace};
use crate::upstream::{AttemptEnd, AttemptError, AttemptSink};

use super::super::RoutingContext;
use super::super::health::{Outcome, Ticket};
use super::super::inflight::InFlightGuard;
use super::super::key_pools::is_key_rejection;
use super::super::peers::AdmissionGuard;
use super::super::prefill::PrefillLease;
use super::super::select::Plan;
use super::super::table::ModelEntry;
use super::attempt_log::{self, AttemptLog};
use super::attempts::Admitted;

/// The books of one request: opens an [`AttemptLedger`] per attempt and books what the attempt
/// loop itself decides (a served caller's key binding, a cancelled hedge).
pub(super) struct RequestLedger<'a> {
    pub ctx: &'a RoutingContext,
    pub model: &'a Arc<ModelEntry>,
    pub caller: Option<&'a Arc<str>>,
    pub plan: &'a Plan,
    /// The gateway's estimate, used where the upstream reports no prompt tokens.
    pub prompt_tokens: u32,
    /// Chat attempts hold prefill leases, move session affinity and are observed by the strategy;
    /// embeddings only touch health, keys and the quota counter.
    pub chat: bool,
    /// Where each attempt's outcome is written for the request log.
    pub log: &'a AttemptLog,
}

impl RequestLedger<'_> {
    /// Opens the books of an attempt at the upstream at `position` of the model's list, admitted
    /// by `admitted`: counts it in flight and against the local quota and, for chat, takes its
    /// prefill lease. `hedge`: the backup of a latency hedge; `trace` is the attempt's span,
    /// ended with the attempt.
    pub fn open(
        &self,
        position: usize,
        upstream: &ModelUpstream,
        admitted: Admitted,
        hedge: bool,
        trace: AttemptTrace,
    ) -> AttemptLedger {
        let Admitted { ticket, guard } = admitted;
        let ctx = self.ctx;
        let in_flight = ctx.inflight.enter(&upstream.endpoint_id);
        ctx.attempts.on_attempt(&upstream.endpoint_id); // RouteWise's local quota counter
        let lease = self.chat.then(|| {
            // Released at the first token, or wherever the attempt ends (drop).
            let uncached = ctx.prefill.uncached_estimate(
                self.caller.map(|c| &**c),
                &upstream.endpoint_id,
                u64::from(self.prompt_tokens),
                Instant::now(),
            );
            ctx.prefill
                .acquire(self.caller.cloned(), &upstream.endpoint_id, uncached)
        });
        AttemptLedger {
            ctx: ctx.clone(),
            model: self.model.clone(),
            position,
            caller: self.caller.cloned(),
            uses_pool_key: self.plan.credential.is_none(),
            ticket,
            health_pending: true,
            lease,
            prompt_tokens: self.prompt_tokens,
            strategy_metadata: self.chat.then(|| self.plan.strategy_metadata.clone()),
            log_slot: Some(self.log.open(position, upstream, hedge)),
            log: self.log.clone(),
            trace,
            _in_flight: in_flight,
            _admission: guard,
        }
    }

    /// Key affinity: a caller served by a pool key keeps that key, unless it already has a live
    /// binding in the pool (a binding to a key that is merely quieted survives; the pool walks
    /// around it until it is back).
    pub fn served(&self, position: usize, upstream: &ModelUpstream) {
        self.log.served(position);
        let (Some(caller), Some(key)) = (self.caller, upstream.key.as_ref()) else {
            return;
        };
        let plan = self.plan;
        if plan.credential.is_some() {
            return;
        }
        let now = Instant::now();
        let keys = &self.ctx.keys;
        if keys.binding(caller, &key.pool, plan.role, now).is_none() {
            keys.bind(
                caller,
                &key.pool,
                &key.fingerprint,
                plan.role,
                plan.key_generation,
                now,
            );
        }
    }

    /// A hedged attempt that lost the race is cancelled: it says nothing about its endpoint, but a
    /// probe it held did reach it. Called before the attempt (and its ledger) is dropped.
    pub fn cancelled(&self, upstream: &ModelUpstream, ticket: Ticket) {
        self.ctx
            .health
            .record(&upstream.endpoint_id, ticket, Outcome::Neutral, None);
    }
}

/// The books of one attempt, handed to the attempt as its [`AttemptSink`].
pub(super) struct AttemptLedger {
    ctx: RoutingContext,
    model: Arc<ModelEntry>,
    /// The upstream's position in the model's list.
    position: usize,
    caller: Option<Arc<str>>,
    /// The upstream's own (pool) key was sent, not the client's (pass-through route): a rejection
    /// quiets that key; a rejection of the client's key is the client's alone.
    uses_pool_key: bool,
    ticket: Ticket,
    /// The endpoint's health has not heard of this attempt yet.
    health_pending: bool,
    lease: Option<PrefillLease>,
    prompt_tokens: u32,
    /// `Some` when the strategy observes this attempt (chat).
    strategy_metadata: Option<String>,
    /// The attempt's entry in the request's attempt log; `None` once it ended.
    log_slot: Option<usize>,
    log: AttemptLog,
    /// The attempt's span (a no-op when tracing is off).
    trace: AttemptTrace,
    /// Counts the attempt in flight until it is dropped: with the relay, for a stream.
    _in_flight: InFlightGuard,
    /// The fleet's admission of a stateful route (a concurrency slot), given back on drop.
    _admission: Option<AdmissionGuard>,
}

impl AttemptLedger {
    fn upstream(&self) -> &ModelUpstream {
        &self.model.upstreams()[self.position]
    }

    /// What a failed attempt says about the endpoint. A key rejected by the upstream
    /// (401/402/403/429) is the key's problem and the endpoint hears nothing (`Neutral`): a pool
    /// key is quieted; a pass-through caller's own key is that caller's (the answer is relayed to
    /// it), so one caller's junk or rate-limited key never opens the breaker for everyone else.
    fn failure_outcome(&self, e: &AttemptError) -> Outcome {
        let AttemptError::Status {
            status,
            retry_after,
            ..
        } = e
        else {
            return Outcome::Failure;
        };
        if !self.uses_pool_key && is_key_rejection(*status) {
            return Outcome::Neutral;
        }
        let key = self.upstream().key.as_ref().filter(|_| self.uses_pool_key);
        match key {
            Some(key) if is_key_rejection(*status) => {
                telemetry::credential_rejected(&self.upstream().endpoint_id, *status);
                self.ctx
                    .keys
                    .quiet(key, *status, *retry_after, Instant::now());
                Outcome::Neutral
            }
            _ => Outcome::from_status(*status),
        }
    }
}

impl AttemptSink for AttemptLedger {
    fn first_token(&mut self) {
        if let Some(slot) = self.log_slot {
            self.log.first_token(slot);
        }
        if std::mem::take(&mut self.health_pending) {
            let upstream = &self.model.upstreams()[self.position];
            self.ctx
                .health
                .record(&upstream.endpoint_id, self.ticket, Outcome::Success, None);
        }
        // Prefill is over once tokens flow; a long decode is not prefill pressure.
        if let Some(lease) = &mut self.lease {
            lease.release();
        }
    }

    fn end(&mut self, end: AttemptEnd<'_>) {
        self.trace.end(&AttemptOutcome {
            status: end.status,
            error_type: end.outcome.err().map(AttemptError::error_type),
            time_to_first_token: end
                .ttft_ms
                .map(|ms| std::time::Duration::from_secs_f64(ms.max(0.0) / 1000.0)),
            input_tokens: end.usage.input_tokens,
            output_tokens: end.usage.output_tokens,
            response_model: end.response_model,
        });
        let health_pending = std::mem::take(&mut self.health_pending);
        let strategy_metadata = self.strategy_metadata.take();
        let log_slot = self.log_slot.take();
        let ctx = &self.ctx;
        let upstream = self.upstream();
        let endpoint_id = upstream.endpoint_id.as_str();
        telemetry::attempt_done(&telemetry::AttemptDone {
            model: self.model.id(),
            endpoint: endpoint_id,
            upstream_protocol: upstream.kind.as_str(),
            operation: if strategy_metadata.is_some() {
                telemetry::Operation::Chat
            } else {
                telemetry::Operation::Embeddings
            },
            error_type: end.outcome.err().map(AttemptError::error_type),
            status: end.status,
            duration: std::time::Duration::from_secs_f64(end.latency_ms.max(0.0) / 1000.0),
            input_tokens: end.usage.input_tokens,
            output_tokens: end.usage.output_tokens,
            cached_input_tokens: end.usage.cached_input_tokens,
        });
        let cost_usd = upstream
            .pricing
            .map(|pricing| attempt_log::cost_usd(&pricing, &end.usage));
        if let Some(usd) = cost_usd.filter(|usd| *usd > 0.0) {
            telemetry::cost_usd(self.model.id(), endpoint_id, usd);
        }
        if let Some(slot) = log_slot {
            self.log.end(slot, &end, cost_usd);
        }
        // A pass-through caller's own key rejected: nothing about the endpoint for the strategy
        // to learn either.
        let caller_key_rejected = !self.uses_pool_key && is_key_rejection(end.status);
        match end.outcome {
            Ok(()) => {
                if health_pending {
                    ctx.health
                        .record(endpoint_id, self.ticket, Outcome::Success, None);
                }
                if strategy_metadata.is_some() {
                    // Only a completed prompt becomes a warm-continuation hint.
                    ctx.prefill.remember(
                        self.caller.as_deref(),
                        endpoint_id,
                        u64::from(prompt_tokens(&end.usage, self.prompt_tokens)),
                        Instant::now(),
                    );
                }
            }
            Err(e) if health_pending => {
                let outcome = self.failure_outcome(e);
                ctx.health
                    .record(endpoint_id, self.ticket, outcome, Some(&e.to_string()));
                // An error from the affinity endpoint drops the pin; the next request re-pins.
                if let (Some(c), Some(_)) = (&self.caller, &strategy_metadata) {
                    ctx.affinity.drop_if(c, self.model.id(), endpoint_id);
                }
                tracing::debug!(endpoint = %endpoint_id, "attempt failed: {e}");
            }
            // Health heard a success at the first token; a deadline that ran out (or an
            // oversized event) after it is still the endpoint's failure. A connection that broke
            // mid-stream is not charged again.
            Err(
                e @ (AttemptError::IdleTimeout(_)
                | AttemptError::TotalTimeout(_)
                | AttemptError::ResponseTooLarge { .. }),
            ) => {
                ctx.health.record(
                    endpoint_id,
                    Ticket::Normal,
                    Outcome::Failure,
                    Some(&e.to_string()),
                );
                tracing::debug!(endpoint = %endpoint_id, "stream failed: {e}");
            }
            Err(_) => {}
        }
        if let Some(strategy_metadata) = strategy_metadata.filter(|_| !caller_key_rejected) {
            let observation = Observation {
                index: upstream.index,
                success: end.outcome.is_ok(),
                ttft_ms: end.ttft_ms,
                latency_ms: end.latency_ms,
                prompt_tokens: prompt_tokens(&end.usage, self.prompt_tokens),
                completion_tokens: end.usage.output_tokens,
                cached_prompt_tokens: end.usage.cached_input_tokens,
                status: end.status,
                strategy_metadata,
                now_ms: crate::clock::unix_ms(),
            };
            if let Some(shadow) = &self.model.shadow {
                shadow.observe(&observation);
            }
            report(&self.model.router, observation);
        }
    }
}

impl Drop for AttemptLedger {
    fn drop(&mut self) {
        // Abandoned (the client left, or a hedge was cancelled): a probe claim is given back.
        // The lease is released by its own Drop.
        if let Some(slot) = self.log_slot {
            self.log.cancelled(slot);
        }
        if self.health_pending {
            let upstream = &self.model.upstreams()[self.position];
            self.ctx.health.release(&upstream.endpoint_id, self.ticket);
        }
    }
}

/// The upstream's count when it reported one, else the gateway's estimate.
fn prompt_tokens(usage: &ir::Usage, estimate: u32) -> u32 {
    if usage.input_tokens > 0 {
        usage.input_tokens
    } else {
        estimate
    }
}

/// Hands an observation to the strategy. When another call holds the model's instance, it is
/// queued for the next call to deliver first. Otherwise `observe`, a short synchronous wasm call
/// that almost always completes in its first poll, runs here; only when it has to wait (the
/// instance was taken meanwhile, a guest waits on host I/O, the queue is full) does it become a
/// task of its own. A task per request was a wake-up of another serving thread on every request.
fn report(router: &Arc<ModelRouter>, observation: Observation) {
    if !router.observes() {
        // Declared `observe` skipped: no call, no future; the activity the prober reads is kept.
        router.note_activity(observation.index, observation.now_ms);
        return;
    }
    let Some(observation) = router.queue_if_busy(observation) else {
        return;
    };
    let router = router.clone();
    let mut call = Box::pin(async move { router.observe(&observation).await });
    let mut cx = Context::from_waker(std::task::Waker::noop());
    if call.as_mut().poll(&mut cx).is_pending() {
        tokio::spawn(call);
    }
}
