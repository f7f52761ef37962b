//! The attempt loop: the plan's upstreams in order, each admitted by its breaker again, until one
//! answers or `max_attempts` run out. Chat and embeddings share it; they differ only in the
//! [`Call`] that sends one attempt.

use std::sync::Arc;
use std::time::Instant;

use crate::config::ModelUpstream;
use crate::protocol::inbound::Inbound;
use crate::telemetry::trace::{AttemptFacts, RequestTrace};
use crate::upstream::{Attempt, AttemptError, ChatAnswer, UpstreamClient};

use super::super::RoutingContext;
use super::super::health::Ticket;
use super::super::peers::{Admission, AdmissionGuard};
use super::super::select::{Exclusion, Plan};
use super::super::table::ModelEntry;
use super::hedge::{self, Hedge};
use super::ledger::{AttemptLedger, RequestLedger};
use super::{Answer, AttemptLog, Attribution, DispatchError, FailedAttempt};

/// What one kind of request sends in one attempt.
pub(super) trait Call {
    type Answer;
    async fn send(
        &self,
        attempt: Attempt<'_>,
        ledger: AttemptLedger,
    ) -> Result<Self::Answer, AttemptError>;
}

struct ChatCall<'a>(&'a Inbound);

impl Call for ChatCall<'_> {
    type Answer = ChatAnswer;
    async fn send(
        &self,
        attempt: Attempt<'_>,
        ledger: AttemptLedger,
    ) -> Result<ChatAnswer, AttemptError> {
        attempt.chat(self.0, ledger).await
    }
}

struct EmbeddingsCall<'a> {
    body: &'a serde_json::Map<String, serde_json::Value>,
    public_model: &'a str,
}

impl Call for EmbeddingsCall<'_> {
    type Answer = bytes::Bytes;
    async fn send(
        &self,
        attempt: Attempt<'_>,
        ledger: AttemptLedger,
    ) -> Result<bytes::Bytes, AttemptError> {
        attempt
            .embeddings(self.body, self.public_model, ledger)
            .await
    }
}

/// Tries the plan's upstreams in order for a chat request in any dialect, hedging when the
/// strategy asked for it. Every attempt is written to `log` and is a child span of `trace`.
// The request log and the trace are two witnesses the handler keeps after dispatch returns.
#[allow(clippy::too_many_arguments)]
pub async fn chat(
    client: &UpstreamClient,
    ctx: &RoutingContext,
    caller: Option<Arc<str>>,
    model: &Arc<ModelEntry>,
    inbound: &Inbound,
    plan: Plan,
    log: &AttemptLog,
    trace: &RequestTrace,
) -> Result<Answer, DispatchError> {
    let dispatch = Dispatch {
        client,
        trace,
        call: ChatCall(inbound),
        ledger: RequestLedger {
            ctx,
            model,
            caller: caller.as_ref(),
            plan: &plan,
            prompt_tokens: inbound.prompt_tokens,
            chat: true,
            log,
        },
    };
    let hedge = hedge::planned(&plan, model.upstreams());
    let (answer, attribution) = dispatch.run(hedge).await?;
    Ok(match answer {
        ChatAnswer::Complete { body, usage } => Answer::Complete {
            body,
            attribution,
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
        },
        ChatAnswer::Stream { events, summary } => Answer::Stream {
            events,
            attribution,
            summary,
        },
    })
}

/// Tries the plan's upstreams for an embeddings request (OpenAI-compatible upstreams, no
/// streaming, no translation, no hedging). Every attempt is written to `log`.
pub async fn embeddings(
    client: &UpstreamClient,
    ctx: &RoutingContext,
    model: &Arc<ModelEntry>,
    body: &serde_json::Map<String, serde_json::Value>,
    plan: Plan,
    log: &AttemptLog,
    trace: &RequestTrace,
) -> Result<(bytes::Bytes, Attribution), DispatchError> {
    let public_model = body
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or_default();
    let dispatch = Dispatch {
        client,
        trace,
        call: EmbeddingsCall { body, public_model },
        ledger: RequestLedger {
            ctx,
            model,
            caller: None,
            plan: &plan,
            prompt_tokens: 0,
            chat: false,
            log,
        },
    };
    dispatch.run(None).await
}

/// One request's dispatch: the call it makes and the ledger that books it.
pub(super) struct Dispatch<'a, C> {
    client: &'a UpstreamClient,
    /// The request's trace: each attempt opens a child span in it.
    trace: &'a RequestTrace,
    call: C,
    pub(super) ledger: RequestLedger<'a>,
}

/// An attempt's permission to go: the breaker's ticket and, for a route whose capacity the fleet
/// shares, the fleet's guard (held until the attempt ends).
pub(super) struct Admitted {
    pub ticket: Ticket,
    pub guard: Option<AdmissionGuard>,
}

/// How one step of the loop ended: the attempt that decided it and what failed on the way.
pub(super) struct Step<T> {
    pub position: usize,
    pub result: Result<T, AttemptError>,
    /// Failures of other attempts (a hedge's first failure).
    pub failures: Vec<FailedAttempt>,
    /// The backup a hedge sent: it is not tried again.
    pub hedged: Option<usize>,
}

impl<C: Call> Dispatch<'_, C> {
    /// Sends one attempt to the upstream at `position` (a hedge's backup when `hedge`), booked
    /// by a ledger of its own and traced by a span of its own.
    pub(super) async fn attempt(
        &self,
        position: usize,
        admitted: Admitted,
        hedge: bool,
    ) -> Result<C::Answer, AttemptError> {
        let upstream = &self.ledger.model.upstreams()[position];
        let trace = self.trace.attempt(&AttemptFacts {
            endpoint: &upstream.endpoint_id,
            kind: upstream.kind.as_str(),
            model: &upstream.provider_model_id,
            base_url: &upstream.base_url,
            hedge,
        });
        let trace_headers = trace.headers().cloned();
        let ledger = self.ledger.open(position, upstream, admitted, hedge, trace);
        let credential = self.ledger.plan.credential.as_deref();
        let attempt = Attempt::new(self.client, upstream, credential).with_trace(trace_headers);
        // Boxed: an attempt's future (the HTTP exchange, the stream's opening) is the largest of
        // the request path, and inline it sized every future above it.
        Box::pin(self.call.send(attempt, ledger)).await
    }

    /// Every step consults the breaker, so a circuit that opened since selection is skipped here
    /// too (and recorded as excluded); a pinned request goes where the operator said. In a fleet,
    /// a half-open probe is claimed once across the replicas, and a route whose capacity the
    /// fleet shares (quota, concurrency) is admitted by the fleet.
    pub(super) async fn admit(
        &self,
        upstream: &ModelUpstream,
        excluded: &mut Vec<Exclusion>,
    ) -> Option<Admitted> {
        let ctx = self.ledger.ctx;
        let endpoint = upstream.endpoint_id.as_str();
        let ticket = if self.ledger.plan.pinned {
            Ticket::Normal
        } else {
            let Some(ticket) = ctx.health.claim(endpoint, Instant::now()) else {
                excluded.push(Exclusion {
                    endpoint_id: endpoint.to_owned(),
                    reason: "circuit open".into(),
                });
                return None;
            };
            ticket
        };
        let refuse = |excluded: &mut Vec<Exclusion>, reason: String| {
            ctx.health.release(endpoint, ticket);
            excluded.push(Exclusion {
                endpoint_id: endpoint.to_owned(),
                reason,
            });
            None
        };
        if let Ticket::Probe(_) = ticket
            && let Some(claim) = ctx
                .peers
                .claim_probe(endpoint, ctx.health.config().cooldown)
            && !claim.await
        {
            return refuse(
                excluded,
                "circuit half-open: another replica holds its probe".into(),
            );
        }
        let guard = match ctx.peers.admit(self.ledger.model.id(), upstream) {
            None => None,
            Some(admission) => match admission.await {
                Admission::Granted(guard) => guard,
                Admission::Refused(reason) => return refuse(excluded, reason),
            },
        };
        Some(Admitted { ticket, guard })
    }

    async fn run(
        &self,
        mut hedge: Option<Hedge>,
    ) -> Result<(C::Answer, Attribution), DispatchError> {
        let plan = self.ledger.plan;
        let routes = self.ledger.model.upstreams();
        let mut failed: Vec<FailedAttempt> = Vec::new();
        let mut excluded = plan.excluded.clone();
        let mut sent_backup: Option<usize> = None;
        let mut upstream_time = std::time::Duration::ZERO;
        for (n, &position) in plan.order.iter().enumerate() {
            if failed.len() >= plan.max_attempts {
                not_tried(&mut excluded, routes, &plan.order[n..], plan.max_attempts);
                break;
            }
            let Some(upstream) = routes.get(position) else {
                continue;
            };
            if sent_backup == Some(position) {
                continue;
            }
            let Some(admitted) = self.admit(upstream, &mut excluded).await else {
                continue;
            };
            let waited = Instant::now();
            let step = match hedge.take() {
                // Boxed, as the other large futures of the request path: a future holds its
                // largest await inline, and an inline hedge (rare) made every request's future
                // kilobytes larger, copied at every level on the way up (`memcpy` was a fifth of
                // a request's instructions in callgrind).
                Some(h) => Box::pin(self.hedged(position, admitted, h, &mut excluded)).await,
                None => Step {
                    position,
                    result: self.attempt(position, admitted, false).await,
                    failures: Vec::new(),
                    hedged: None,
                },
            };
            upstream_time += waited.elapsed();
            failed.extend(step.failures);
            sent_backup = step.hedged;
            let upstream = &routes[step.position];
            match step.result {
                Ok(answer) => {
                    self.ledger.served(step.position, upstream);
                    return Ok((answer, Attribution::new(upstream, failed, upstream_time)));
                }
                Err(e) => failed.push(FailedAttempt::new(upstream, &e)),
            }
        }
        Err(DispatchError {
            attempts: failed,
            excluded,
        })
    }
}

/// Records the upstreams left untried because the inbound route's `max_attempts` ran out.
fn not_tried(excluded: &mut Vec<Exclusion>, routes: &[ModelUpstream], rest: &[usize], max: usize) {
    for &p in rest {
        if let Some(upstream) = routes.get(p) {
            excluded.push(Exclusion {
                endpoint_id: upstream.endpoint_id.clone(),
                reason: format!("not tried: max_attempts ({max}) reached"),
            });
        }
    }
}
