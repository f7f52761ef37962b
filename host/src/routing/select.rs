//! The selection pipeline, in order: modality filter → explicit pin → weight and breaker admission
//! → the model's strategy. A strategy that cannot answer is replaced by declared order.

use std::time::Instant;

use crate::config::{Capability, ModelUpstream};
use crate::protocol::ir::Modalities;
use crate::strategy::{
    Candidate, CircuitState as CandidateCircuit, HedgeRequest, PrefillPolicy, Request,
};

use super::RoutingContext;
use super::health::{CircuitState, HealthRegistry, Outcome};
use super::policy::zero_reason;
use super::table::ModelEntry;
use crate::routing::key_pools::{KeyPools, PoolTally, order_within_pools};

/// What the pipeline knows about a request before choosing, reduced to what routing needs.
#[derive(Debug, Clone, Default)]
pub struct RequestFacts {
    /// The caller's affinity key; `None` for internal traffic.
    pub caller: Option<std::sync::Arc<str>>,
    /// Stable hash of the caller's affinity key; 0 for internal traffic.
    pub caller_hash: u64,
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    pub stream: bool,
    pub modalities: Modalities,
    /// The inbound call; upstreams that cannot serve it are not candidates.
    pub call: Capability,
    /// The upstream groups the caller may reach; `None` (internal traffic) reaches all.
    pub groups: Option<std::sync::Arc<[String]>>,
    /// How many upstreams may be tried (the inbound route's `max_attempts`); `None`: all of them.
    pub max_attempts: Option<usize>,
    /// The caller's tier for reserved keys; `None` (no user identity) may use every key.
    pub role: Option<crate::entity::Role>,
    /// The caller's own credential goes upstream (pass-through route): key pools do not apply.
    pub own_credential: bool,
    /// The smallest remaining USD among the caller's budgets, hard or soft (below 0 once one is
    /// passed); `None` for a caller without budgets. Strategies see it as `remaining-budget-usd`.
    pub remaining_budget_usd: Option<f64>,
}

/// A upstream left out before or during dispatch, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Exclusion {
    pub endpoint_id: String,
    pub reason: String,
}

/// Why a request cannot be routed at all.
#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    /// No upstream accepts the request's input modalities.
    #[error("no upstream of model `{model}` accepts {} input", missing.join(" and "))]
    MissingModality {
        model: String,
        missing: Vec<&'static str>,
        excluded: Vec<Exclusion>,
    },
    /// `X-Route-Pin` named nothing this model upstreams to.
    #[error("X-Route-Pin `{pin}` matches no upstream of model `{model}`; its endpoints: {}", endpoints.join(", "))]
    PinNotFound {
        model: String,
        pin: String,
        endpoints: Vec<String>,
    },
    /// Every upstream was excluded; the list says which and why.
    #[error(
        "no upstream of model `{model}` can take this request: {}",
        describe(excluded)
    )]
    NoAdmissibleUpstream {
        model: String,
        excluded: Vec<Exclusion>,
    },
}

pub fn describe(excluded: &[Exclusion]) -> String {
    if excluded.is_empty() {
        return "the model has no upstreams".into();
    }
    excluded
        .iter()
        .map(|e| format!("{} ({})", e.endpoint_id, e.reason))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The upstreams to try, in order, as positions in the model's upstream list.
#[derive(Debug, Clone)]
pub struct Plan {
    pub order: Vec<usize>,
    /// The strategy's latency hedge for the primary, as it decided it.
    pub hedge: Option<HedgeRequest>,
    pub strategy_metadata: String,
    /// Set when the strategy failed and declared order was used instead.
    pub strategy_error: Option<String>,
    /// An operator pinned the upstream: no fallback, and the breaker is not consulted.
    pub pinned: bool,
    /// Upstreams excluded before the strategy ran.
    pub excluded: Vec<Exclusion>,
    /// The endpoint this caller is pinned to by session affinity after this selection; an error
    /// there drops the pin.
    pub affinity_endpoint: Option<String>,
    /// What session affinity did for this request.
    pub affinity: AffinityUse,
    /// At most this many upstreams are tried.
    pub max_attempts: usize,
    /// On pass-through routes, the client's own credential, used instead of every upstream's key.
    pub credential: Option<std::sync::Arc<str>>,
    /// The caller's tier, for the key binding made when a pool key serves.
    pub role: Option<crate::entity::Role>,
    /// The key pools' declaration generation this plan was made under: a binding is only made
    /// if no declaration changed meanwhile (else a request in flight would undo a drop).
    pub key_generation: u64,
    /// The random seed the strategy was given; `None` when no strategy ran (a pin). The request
    /// log and the trace name the draw that made this order by it.
    pub seed: Option<u64>,
}

impl Plan {
    /// What was decided, kept by value for the request's log row: that row is written after the
    /// answer, and its JSON is built then ([`DecisionRecord::to_json`]), not on the way upstream.
    pub fn decision_record(&self) -> DecisionRecord {
        DecisionRecord {
            order: self.order.clone(),
            pinned: self.pinned,
            seed: self.seed,
            strategy_error: self.strategy_error.clone(),
        }
    }
}

/// A plan's decision: who ordered the upstreams, in which order, with which seed.
#[derive(Debug, Clone)]
pub struct DecisionRecord {
    order: Vec<usize>,
    pinned: bool,
    seed: Option<u64>,
    strategy_error: Option<String>,
}

impl DecisionRecord {
    /// The decision with the names `model` gives its upstreams.
    fn decision<'a>(&'a self, model: &'a ModelEntry) -> Decision<'a> {
        let upstreams = model.upstreams();
        Decision {
            strategy: if self.pinned {
                "pin"
            } else {
                &model.router.strategy.name
            },
            order: self
                .order
                .iter()
                .filter_map(|&p| upstreams.get(p))
                .map(|u| u.endpoint_id.as_str())
                .collect(),
            seed: self.seed,
            strategy_error: self.strategy_error.as_deref(),
        }
    }

    /// As `api_logs.decision` keeps it.
    pub fn to_json(&self, model: &ModelEntry) -> String {
        self.decision(model).to_json()
    }
}

/// A plan's decision as `api_logs.decision` keeps it (JSON).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Decision<'a> {
    /// The model's strategy, or `pin` for an operator's `X-Route-Pin`.
    pub strategy: &'a str,
    /// The endpoint ids in the order they were to be tried (one per candidate: an upstream with
    /// several keys appears once per key).
    pub order: Vec<&'a str>,
    pub seed: Option<u64>,
    /// Set when the strategy failed and `order` is the declared order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy_error: Option<&'a str>,
}

impl Decision<'_> {
    /// As `api_logs.decision` keeps it: the derived `Serialize`'s JSON, with the keys written as
    /// the constants they are (the derive sends each through `serde_json`'s escaper, on every
    /// request) and each value by `serde_json`.
    pub fn to_json(&self) -> String {
        use crate::protocol::json::{push_entry, push_str, push_str_entry};
        let mut out =
            Vec::with_capacity(64 + self.order.iter().map(|o| o.len() + 3).sum::<usize>());
        push_str_entry(&mut out, "{\"strategy\":", self.strategy);
        out.extend_from_slice(b",\"order\":[");
        for (i, endpoint) in self.order.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            push_str(&mut out, endpoint);
        }
        out.push(b']');
        push_entry(&mut out, ",\"seed\":", &self.seed);
        if let Some(error) = self.strategy_error {
            push_str_entry(&mut out, ",\"strategy_error\":", error);
        }
        out.push(b'}');
        // Only JSON text went in.
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The seed handed to a strategy: 53 random bits, so that it is the same number wherever the
/// request log's JSON is read (JavaScript's numbers hold integers exactly up to 2^53).
fn strategy_seed() -> u64 {
    rand::random::<u64>() >> 11
}

/// How session affinity took part in a selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AffinityUse {
    /// Off, pinned by an operator, or no caller identity.
    #[default]
    None,
    /// No live record: the strategy chose and the choice was recorded.
    New,
    /// The recorded endpoint was reused.
    Reused,
    /// The recorded endpoint was unavailable; the strategy chose again.
    Replaced,
    /// The recorded endpoint was backed up beyond the ceiling; rerouted and the pin moved.
    Moved,
    /// The strategy saw the pin and put another endpoint first; the pin moved to it.
    Declined,
}

const MODALITIES: [(Modalities, &str); 3] = [
    (Modalities::IMAGE, "image"),
    (Modalities::AUDIO, "audio"),
    (Modalities::VIDEO, "video"),
];

/// The request's non-text modalities this upstream does not accept.
pub fn missing_modalities(upstream: &ModelUpstream, wanted: Modalities) -> Vec<&'static str> {
    MODALITIES
        .iter()
        .filter(|(flag, name)| {
            wanted.contains(*flag) && !upstream.input_modalities.iter().any(|m| m == name)
        })
        .map(|(_, name)| *name)
        .collect()
}

/// Runs the pipeline for one request. `pin` is an admin caller's `X-Route-Pin`.
pub async fn select(
    model: &ModelEntry,
    facts: &RequestFacts,
    ctx: &RoutingContext,
    pin: Option<&str>,
) -> Result<Plan, SelectionError> {
    select_at(model, facts, ctx, pin, Instant::now()).await
}

/// [`select`] at a given instant (simulations drive time themselves).
pub async fn select_at(
    model: &ModelEntry,
    facts: &RequestFacts,
    ctx: &RoutingContext,
    pin: Option<&str>,
    now: Instant,
) -> Result<Plan, SelectionError> {
    let health: &HealthRegistry = &ctx.health;
    let upstreams = model.upstreams();
    let mut excluded = Vec::new();

    // 1. Groups, capabilities, then modalities.
    let mut admitted: Vec<&ModelUpstream> = Vec::with_capacity(upstreams.len());
    let mut missing_everywhere: Vec<&'static str> = Vec::new();
    let mut capable = 0;
    let max_attempts = facts.max_attempts.unwrap_or(usize::MAX).max(1);
    for upstream in upstreams {
        if let Some(groups) = &facts.groups
            && !groups.contains(&upstream.group)
        {
            excluded.push(Exclusion {
                endpoint_id: upstream.endpoint_id.clone(),
                reason: format!("group `{}` is not open to this caller", upstream.group),
            });
            continue;
        }
        if !upstream.capabilities.contains(&facts.call) {
            excluded.push(Exclusion {
                endpoint_id: upstream.endpoint_id.clone(),
                reason: format!("cannot serve {}", facts.call.as_str()),
            });
            continue;
        }
        capable += 1;
        let missing = missing_modalities(upstream, facts.modalities);
        if missing.is_empty() {
            admitted.push(upstream);
        } else {
            for m in &missing {
                if !missing_everywhere.contains(m) {
                    missing_everywhere.push(m);
                }
            }
            excluded.push(Exclusion {
                endpoint_id: upstream.endpoint_id.clone(),
                reason: format!("does not accept {} input", missing.join(" and ")),
            });
        }
    }
    if capable == 0 {
        return Err(SelectionError::NoAdmissibleUpstream {
            model: model.id().to_owned(),
            excluded,
        });
    }
    if admitted.is_empty() {
        return Err(SelectionError::MissingModality {
            model: model.id().to_owned(),
            missing: missing_everywhere,
            excluded,
        });
    }

    // 2. An operator's pin selects one upstream directly; weight 0 still means "not pinnable".
    if let Some(pin) = pin {
        let hit = admitted
            .iter()
            .find(|r| r.endpoint_id == pin)
            .or_else(|| admitted.iter().find(|r| r.kind.as_str() == pin));
        return match hit {
            Some(upstream) if upstream.weight > 0.0 => Ok(Plan {
                order: vec![position(upstreams, upstream.index)],
                hedge: None,
                strategy_metadata: String::new(),
                strategy_error: None,
                pinned: true,
                excluded,
                affinity_endpoint: None,
                affinity: AffinityUse::None,
                max_attempts: 1,
                credential: None,
                role: facts.role,
                key_generation: model.key_generation,
                seed: None,
            }),
            Some(upstream) => Err(SelectionError::NoAdmissibleUpstream {
                model: model.id().to_owned(),
                excluded: vec![Exclusion {
                    endpoint_id: upstream.endpoint_id.clone(),
                    reason: format!("pinned, but {}", zero_reason(upstream)),
                }],
            }),
            None => Err(SelectionError::PinNotFound {
                model: model.id().to_owned(),
                pin: pin.to_owned(),
                endpoints: upstreams.iter().map(|r| r.endpoint_id.clone()).collect(),
            }),
        };
    }

    // 3. Key pools: keys reserved above the caller are invisible to it, quieted keys sit out.
    if !facts.own_credential {
        admit_keys(ctx, facts, &mut admitted, &mut excluded, now);
    }

    // 4. Weight and breaker admission.
    let mut candidates = Vec::with_capacity(admitted.len());
    for upstream in admitted {
        if upstream.weight <= 0.0 {
            excluded.push(Exclusion {
                endpoint_id: upstream.endpoint_id.clone(),
                reason: zero_reason(upstream).to_owned(),
            });
            continue;
        }
        let circuit = match health.admits(&upstream.endpoint_id, now) {
            None => {
                excluded.push(Exclusion {
                    endpoint_id: upstream.endpoint_id.clone(),
                    reason: "circuit open".into(),
                });
                continue;
            }
            Some(CircuitState::HalfOpen) => CandidateCircuit::HalfOpen,
            Some(_) => CandidateCircuit::Closed,
        };
        let load = ctx.prefill.load(&upstream.endpoint_id);
        candidates.push(Candidate {
            index: upstream.index,
            weight: upstream.weight,
            priority: upstream.priority,
            availability: health.availability(&upstream.endpoint_id),
            circuit,
            prefill_backlog_tokens: load.backlog_tokens,
            inflight_elephants: load.elephants,
            uncached_prompt_tokens: ctx.prefill.uncached_estimate(
                facts.caller.as_deref(),
                &upstream.endpoint_id,
                u64::from(facts.prompt_tokens),
                now,
            ),
            ttft_ms: None,
            latency_ms: None,
            inflight_requests: ctx.inflight.count(&upstream.endpoint_id),
            affinity_pinned: false,
        });
    }
    if candidates.is_empty() {
        return Err(SelectionError::NoAdmissibleUpstream {
            model: model.id().to_owned(),
            excluded,
        });
    }

    // 5. Session affinity: reuse the caller's endpoint while it is admitted and not backed up.
    let caller = facts.caller.as_ref().filter(|_| ctx.affinity.enabled());
    let recorded = caller.and_then(|c| ctx.affinity.get(c, model.id(), now));
    let mut affinity = match (&caller, &recorded) {
        (None, _) => AffinityUse::None,
        (Some(_), None) => AffinityUse::New,
        (Some(_), Some(_)) => AffinityUse::Reused,
    };
    let mut sticky: Option<u32> = None;
    if let Some(endpoint) = &recorded {
        let index = upstreams
            .iter()
            .find(|r| &r.endpoint_id == endpoint)
            .map(|r| r.index)
            .filter(|i| candidates.iter().any(|c| c.index == *i));
        match index {
            None => affinity = AffinityUse::Replaced,
            Some(i) => {
                let backlog = ctx
                    .prefill
                    .backlog_excluding(endpoint, caller.map(|c| &**c));
                if backlog > ctx.prefill.config().affinity_ceiling && candidates.len() > 1 {
                    // Backed up: reroute excluding it; the pin follows the new choice.
                    candidates.retain(|c| c.index != i);
                    excluded.push(Exclusion {
                        endpoint_id: endpoint.clone(),
                        reason: format!("affinity endpoint has {backlog} tokens pending"),
                    });
                    affinity = AffinityUse::Moved;
                } else {
                    sticky = Some(i);
                }
            }
        }
    }

    if let Some(i) = sticky
        && let Some(pinned) = candidates.iter_mut().find(|c| c.index == i)
    {
        pinned.affinity_pinned = true;
    }

    // 6. The strategy orders what is left.
    let p = ctx.prefill.config();
    let request = Request {
        caller_hash: facts.caller_hash,
        prompt_tokens: facts.prompt_tokens,
        max_tokens: facts.max_tokens,
        stream: facts.stream,
        modalities: facts.modalities,
        seed: strategy_seed(),
        now_ms: crate::clock::unix_ms(),
        prefill: PrefillPolicy {
            enabled: p.enabled,
            intervene_tokens: p.intervene_tokens,
            elephant_tokens: p.elephant_tokens,
            elephant_limit: p.elephant_limit,
        },
        remaining_budget_usd: facts.remaining_budget_usd,
    };
    let decided = model.router.select(&request, &candidates).await;
    // Beside the request, never in its way: both only queue what they are handed.
    if let (Some(shadow), Ok(decision)) = (&model.shadow, &decided) {
        shadow.select(&request, &candidates, &decision.order);
    }
    if let Some(recorder) = &ctx.recorder {
        recorder.offer(&model.router, &request, &candidates, &decided);
    }
    let (mut order, hedge, strategy_metadata, strategy_error) = match decided {
        Ok(decision) => (
            decision.order,
            decision.hedge,
            decision.strategy_metadata,
            None,
        ),
        // A broken strategy never fails the request: declared order keeps it served.
        Err(e) => (
            candidates.iter().map(|c| c.index).collect(),
            None,
            String::new(),
            Some(e.to_string()),
        ),
    };
    if let Some(i) = sticky {
        // A strategy that sees the pin decides what it is worth (`fixed` keeps it first, an
        // optimising one may prefer a faster endpoint). One that cannot see it (WIT 0.1.0), or
        // that failed, gets the host's policy: the warm endpoint first, its fallbacks as ordered.
        if strategy_error.is_some() || !model.router.strategy.sees_affinity() {
            order.retain(|&x| x != i);
            order.insert(0, i);
        } else if order.first() != Some(&i) {
            affinity = AffinityUse::Declined;
        }
    }
    let mut order: Vec<usize> = order.iter().map(|&i| position(upstreams, i)).collect();
    // 7. Within each key pool: the caller's bound key, then the most reserved keys.
    if !facts.own_credential {
        order_keys(ctx, facts, upstreams, &mut order, now);
    }
    let affinity_endpoint = match (caller, order.first()) {
        (Some(c), Some(&first)) => {
            let endpoint = upstreams[first].endpoint_id.clone();
            if recorded.as_deref() != Some(endpoint.as_str()) {
                ctx.affinity.set(c, model.id(), &endpoint, now);
            }
            Some(endpoint)
        }
        _ => None,
    };
    Ok(Plan {
        order,
        hedge,
        strategy_metadata,
        strategy_error,
        pinned: false,
        excluded,
        affinity_endpoint,
        affinity,
        max_attempts,
        credential: None,
        role: facts.role,
        key_generation: model.key_generation,
        seed: Some(request.seed),
    })
}

/// Drops the candidates whose key the caller may not or cannot spend now, and charges an
/// exhausted pool's endpoint one failure (a reserved-only pool is not charged: nothing was sent
/// and it still serves the tiers that own its keys).
fn admit_keys(
    ctx: &RoutingContext,
    facts: &RequestFacts,
    admitted: &mut Vec<&ModelUpstream>,
    excluded: &mut Vec<Exclusion>,
    now: Instant,
) {
    let mut tallies: Vec<(&str, &str, PoolTally)> = Vec::new();
    admitted.retain(|upstream| {
        let Some(key) = &upstream.key else {
            return true;
        };
        let at = match tallies.iter().position(|(pool, _, _)| *pool == key.pool) {
            Some(at) => at,
            None => {
                tallies.push((&key.pool, &upstream.endpoint_id, PoolTally::default()));
                tallies.len() - 1
            }
        };
        let tally = &mut tallies[at].2;
        let quiet = ctx.keys.quiet_until(&key.fingerprint, now);
        let reason = if !KeyPools::visible(upstream.min_role, facts.role) {
            if quiet.is_none() {
                tally.role_restricted += 1;
            } else {
                tally.quieted += 1;
            }
            format!(
                "key {} is reserved for {} callers and above (KeyPoolRoleRestricted)",
                key.label,
                upstream.min_role.as_str()
            )
        } else if let Some(q) = quiet {
            tally.quieted += 1;
            format!(
                "key {} quieted for {:.0} s after HTTP {}",
                key.label,
                q.until.saturating_duration_since(now).as_secs_f64(),
                q.status
            )
        } else {
            tally.usable += 1;
            return true;
        };
        excluded.push(Exclusion {
            endpoint_id: upstream.endpoint_id.clone(),
            reason,
        });
        false
    });
    for (pool, endpoint, tally) in tallies {
        if tally.usable == 0 && tally.role_restricted == 0 {
            // KeyPoolExhausted: to the breaker, a pool nobody can use is a failing upstream.
            if let Some(ticket) = ctx.health.claim(endpoint, now) {
                ctx.health.record_at(
                    endpoint,
                    ticket,
                    Outcome::Failure,
                    Some(&format!(
                        "KeyPoolExhausted: every key of pool {pool} is quieted"
                    )),
                    now,
                );
            }
        }
    }
}

/// Orders each pool's keys within the positions the strategy gave the pool (dispatch binds the
/// caller to the key that serves it).
fn order_keys(
    ctx: &RoutingContext,
    facts: &RequestFacts,
    upstreams: &[ModelUpstream],
    order: &mut [usize],
    now: Instant,
) {
    let caller = facts.caller.as_ref();
    order_within_pools(upstreams, order, &|pool| {
        caller.and_then(|c| ctx.keys.binding(c, pool, facts.role, now))
    });
}

/// Position of a declared index in the upstream list (they coincide for config-built tables).
fn position(upstreams: &[ModelUpstream], index: u32) -> usize {
    upstreams
        .iter()
        .position(|r| r.index == index)
        .unwrap_or(index as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_is_written_as_its_derived_serialize_writes_it() {
        let cases = [
            Decision {
                strategy: "routewise",
                order: vec!["a", "b/c", "quote\"d"],
                seed: Some(9_007_199_254_740_991),
                strategy_error: None,
            },
            Decision {
                strategy: "pin",
                order: vec![],
                seed: None,
                strategy_error: Some("trap: \u{1}\n"),
            },
        ];
        for decision in cases {
            assert_eq!(
                decision.to_json(),
                serde_json::to_string(&decision).expect("serialises")
            );
        }
    }
}
