//! `routewise`: cost-aware routing by a latency-minimising budget LP.
//!
//! For each request every feasible candidate gets an effective cost `c_j` (on-demand: its token
//! price for the prompt and the predicted completion; quota: a scarcity shadow price; concurrency: 0
//! while a slot is free) and a TTFT estimate (mean of its live latency profile). The LP
//! ([`lp`]) minimises mean TTFT subject to `Σ π_j c_j ≤ B` with
//! `B = c_min + α (c_max − c_min)`; the primary is drawn from the resulting (at most two-route)
//! mixture with the request's seed. An endpoint with no samples is explored once per lease, with the
//! probability that keeps the decision's expected cost within `B` (so never above the cheapest at
//! α = 0, as in the reference). Session
//! affinity is a tie-break: the caller's pinned candidate stays primary only while the plan gives
//! it a share (every member of the optimal mixture is as good as the draw); one the plan leaves out
//! (at `budget_alpha` 1 everything goes to the fastest) loses the pin. Budget pressure: a caller
//! whose remaining budget `r` covers fewer than `N = budget_pressure_requests` requests at `B`
//! is planned at `α' = α · clamp(r / (N · B), 0, 1)`, and routes costing more than `r` alone
//! leave the plan while a cheaper one is feasible. See
//! `docs/routewise.md` for the formulas, params, metadata and what the host supplies.
//!
//! Everything runs inside the component from the WIT inputs; time is the host's `now-ms`.

mod capacity;
mod learn;
pub mod lp;
mod metadata;
mod name;
mod params;

#[cfg(test)]
mod tests;

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::{Value, json};
use switchyard_sdk::{
    Candidate, Decision, LogLevel, Observation, Pricing, Request, Rng, Strategy, StrategyInfo,
    Upstream, declared_positions_into, log,
};

pub use capacity::{CONCURRENCY_ACQUIRE_TIMEOUT_MS, QuotaState};
pub use learn::{ENVELOPE_MAX_SAMPLES, FAILURE_PENALTY_MS};
pub use lp::{LpStatus, Plan};
pub use metadata::{ProviderKind, QuotaSnapshot, RouteMeta};
pub use params::{FallbackMode, HedgeMode, RouteWiseParams};

use capacity::{ConcurrencyPools, QuotaPools};
use learn::{
    Bounds, CostEnvelope, EnvelopeSettings, LatencyProfile, OutputPredictor, OutputThresholds,
};
use name::SharedName;

/// A hedge is planned only where the request then meets the SLO with at least this probability.
pub const HEDGE_TARGET: f64 = 0.99;
/// Samples the primary's and a backup's latency profiles each need before a hedge is planned
/// (the reference's 5).
pub const HEDGE_MIN_SAMPLES: usize = 5;
/// Time from the host deciding to send the backup to the backup's request leaving, subtracted from
/// the time the backup has left (the reference's calibrated 5 ms).
pub const HEDGE_DISPATCH_OVERHEAD_MS: f64 = 5.0;

/// Server-side failures in a row (no success between them) that bench an endpoint.
pub const COOLDOWN_AFTER_FAILURES: u32 = 3;
/// How long a benched endpoint is left out of plans and hedges; each further failure restarts it,
/// a success ends it.
pub const COOLDOWN_MS: u64 = 30_000;

/// How long an exploration lease keeps other requests from exploring the same endpoint.
pub const EXPLORATION_LEASE_MS: u64 = 60_000;

/// Identifies one decision in `decision.strategy-metadata`; the host hands it back in `observe`.
///
/// Encoded as `rw1:<epoch 8 hex>-<seq>:<primary index>:<predicted cost USD>:<flags>`, e.g.
/// `rw1:1f2e3d4c-42:2:0.00035:c`. `epoch` is fixed per router instance (so a re-created instance
/// ignores its predecessor's decisions), `seq` counts decisions; the cost is the shortest text
/// that reads back as the same `f64` (as JSON writes it; tags before that wrote `3.5e-4`, which
/// still parses); flags are `e` (exploration), `c` (a concurrency slot was acquired for the
/// primary) or `-`.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionTag {
    pub epoch: u32,
    pub seq: u64,
    pub primary: u32,
    pub predicted_cost: f64,
    pub explore: bool,
    pub slot: bool,
}

impl DecisionTag {
    pub fn encode(&self) -> String {
        let flags = match (self.explore, self.slot) {
            (true, true) => "ec",
            (true, false) => "e",
            (false, true) => "c",
            (false, false) => "-",
        };
        // Written piece by piece into a string sized up front: `write!` with five arguments, and
        // then `{:e}` for the cost alone, were each a tenth of what `select` and `observe` cost
        // together (natively; more in wasm). `zmij` and `itoa` are what serde_json writes with.
        let mut tag = String::with_capacity(64);
        tag.push_str("rw1:");
        for shift in (0..8).rev() {
            tag.push(HEX_DIGITS[(self.epoch >> (shift * 4)) as usize & 0xf] as char);
        }
        tag.push('-');
        tag.push_str(itoa::Buffer::new().format(self.seq));
        tag.push(':');
        tag.push_str(itoa::Buffer::new().format(self.primary));
        tag.push(':');
        tag.push_str(zmij::Buffer::new().format(self.predicted_cost));
        tag.push(':');
        tag.push_str(flags);
        tag
    }

    /// `None` for anything this strategy did not produce. Anything after a `;` is ignored (builds
    /// against WIT 0.1.0 appended their hedge request there as `;hedge=<ms>@<index>`).
    pub fn parse(text: &str) -> Option<Self> {
        let key = TagKey::parse(text)?;
        Some(Self {
            epoch: key.epoch,
            seq: key.seq,
            primary: key.primary,
            predicted_cost: key.cost.parse().ok()?,
            explore: key.flags.contains(&b'e'),
            slot: key.flags.contains(&b'c'),
        })
    }
}

/// The part of a [`DecisionTag`] `observe` reads: which decision it was, and its primary. The cost
/// is checked to look like a number but not converted (in wasm, reading the `f64` was about a third
/// of what reading the whole tag cost).
#[derive(Debug, PartialEq)]
struct TagKey<'a> {
    epoch: u32,
    seq: u64,
    primary: u32,
    cost: &'a str,
    flags: &'a [u8],
}

impl<'a> TagKey<'a> {
    /// One pass over the bytes, the integers read by hand as they go by (`str::parse`, `split`
    /// and a scan for each field's end were most of what reading a tag cost).
    fn parse(text: &'a str) -> Option<Self> {
        let rest = text.strip_prefix("rw1:")?;
        let mut reader = TagReader { text: rest, at: 0 };
        let epoch = u32::try_from(reader.number(16, b'-')?).ok()?;
        let seq = reader.number(10, b':')?;
        let primary = u32::try_from(reader.number(10, b':')?).ok()?;
        let cost = reader.cost()?;
        let flags = reader.flags()?;
        Some(Self {
            epoch,
            seq,
            primary,
            cost,
            flags,
        })
    }
}

/// A tag after its `rw1:`, and how far it has been read.
struct TagReader<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> TagReader<'a> {
    /// Reads digits in `radix` (at least one; 10 or 16, lower-case) and the `end` after them;
    /// `None` on anything else, or past `u64`.
    fn number(&mut self, radix: u64, end: u8) -> Option<u64> {
        // So many digits cannot overflow a u64, so only those after them are checked: in wasm a
        // checked u64 multiply is a call to a 128-bit multiply, and it was one per digit.
        let unchecked = if radix == 16 { 15 } else { 19 };
        let (start, mut value) = (self.at, 0u64);
        for &b in &self.text.as_bytes()[start..] {
            let digit = u64::from(match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' if radix == 16 => b - b'a' + 10,
                _ if b == end && self.at > start => {
                    self.at += 1;
                    return Some(value);
                }
                _ => return None,
            });
            value = if self.at - start < unchecked {
                value * radix + digit
            } else {
                value.checked_mul(radix)?.checked_add(digit)?
            };
            self.at += 1;
        }
        None
    }

    /// The cost's text up to the `:` after it, which it reads too: digits and `.eE+-`, or what
    /// a non-finite cost is written as.
    fn cost(&mut self) -> Option<&'a str> {
        let start = self.at;
        let mut numeric = true;
        for &b in &self.text.as_bytes()[start..] {
            if b == b':' {
                let cost = self.text.get(start..self.at)?;
                self.at += 1;
                let number = numeric && !cost.is_empty();
                return (number || matches!(cost, "inf" | "-inf" | "NaN")).then_some(cost);
            }
            numeric &= b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-');
            self.at += 1;
        }
        None
    }

    /// The flags: the rest, up to a `;` (what 0.1.0 builds appended), with no `:` in them.
    fn flags(&mut self) -> Option<&'a [u8]> {
        let rest = &self.text.as_bytes()[self.at..];
        let end = rest
            .iter()
            .position(|&b| b == b';' || b == b':')
            .unwrap_or(rest.len());
        (rest.get(end) != Some(&b':')).then_some(&rest[..end])
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// One route of the table, as RouteWise keeps it.
#[derive(Clone, Debug)]
struct RouteEntry {
    /// Shared with every decision's [`Evaluated`] entries and with the latency profile's key: a
    /// decision copies no endpoint id, and finds its profile by pointer.
    endpoint_id: SharedName,
    pricing: Option<Pricing>,
    meta: Result<RouteMeta, String>,
}

/// One candidate after costing, for a single decision.
#[derive(Clone, Debug)]
struct Evaluated {
    index: u32,
    endpoint_id: SharedName,
    kind: Option<ProviderKind>,
    pool: Option<String>,
    cost: f64,
    unpriced: bool,
    excluded: Option<&'static str>,
    ttft_ms: f64,
    samples: usize,
}

/// The last decision, for `status`.
#[derive(Clone, Debug)]
struct LastDecision {
    at_ms: u64,
    plan: Plan,
    feasible: Vec<Evaluated>,
    excluded: Vec<Evaluated>,
    explored: Option<String>,
    /// The exploration target's draw probability, when there was a target with q > 0.
    exploration_probability: Option<f64>,
    primary: Option<u32>,
    predicted_output_tokens: u32,
    output_source: &'static str,
    envelope: Bounds,
    /// The α the plan used (below `budget_alpha` under budget pressure).
    alpha: f64,
    /// The request's remaining budget, as the host passed it.
    remaining_budget_usd: Option<f64>,
    /// Feasible endpoints left out of the plan because each alone costs more than that.
    above_remaining_budget: Vec<String>,
}

/// Server-side failures of one endpoint, for the cooldown.
#[derive(Clone, Copy, Debug, Default)]
struct Streak {
    failures: u32,
    /// Left out of plans until then (ms); 0 when not benched.
    cooldown_until_ms: u64,
}

/// Whether a failed attempt's status is the endpoint's fault: a transport error or timeout (0), a
/// 408 or 429, a 5xx, or a broken answer after a success status. Other 4xx are about the request
/// (a bad body, a model it does not serve, a caller's credential) and teach nothing about the
/// endpoint, as in the reference, which penalises only server-side failures.
pub fn server_side_failure(status: u16) -> bool {
    !(400..500).contains(&status) || status == 408 || status == 429
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    decisions: u64,
    explorations: u64,
    no_feasible: u64,
    cheapest_fallback: u64,
    observations: u64,
    foreign_observations: u64,
    slots_released: u64,
    slots_expired: u64,
    leases_expired: u64,
    hedges_planned: u64,
    /// Exploration draws that went to the cheapest route instead (the budget allowed exploring
    /// with a probability below 1).
    explorations_declined: u64,
    /// Endpoints benched after three server-side failures in a row.
    cooldowns: u64,
    /// Failed attempts about the request (4xx other than 408/429): no latency penalty.
    request_failures: u64,
    /// Decisions that kept the caller's affinity-pinned candidate as the primary.
    affinity_kept: u64,
    /// Decisions whose plan the caller's remaining budget changed (α lowered, or routes costing
    /// more than the remaining budget left out).
    budget_pressured: u64,
}

/// Buffers a decision fills and the next one reuses (cleared, never shrunk).
#[derive(Debug, Default)]
struct Scratch {
    /// Candidate positions in declared order, then `feasible` positions in fallback order.
    positions: Vec<usize>,
    /// Positions into `feasible` the plan weighs, and those the remaining budget leaves out.
    in_plan: Vec<usize>,
    unaffordable: Vec<usize>,
    /// Cost and TTFT of the `in_plan` routes, the LP's inputs.
    costs: Vec<f64>,
    ttft: Vec<f64>,
}

/// The router of one model.
#[derive(Debug)]
pub struct RouteWise {
    model: SharedName,
    params: RouteWiseParams,
    routes: BTreeMap<u32, RouteEntry>,
    latency: BTreeMap<SharedName, LatencyProfile>,
    /// Exploration leases: endpoint → until (ms).
    leases: BTreeMap<String, u64>,
    /// Server-side failure streaks and cooldowns by endpoint.
    streaks: BTreeMap<String, Streak>,
    output: OutputPredictor,
    envelope: CostEnvelope,
    concurrency: ConcurrencyPools,
    quotas: QuotaPools,
    epoch: Option<u32>,
    seq: u64,
    last: Option<LastDecision>,
    counters: Counters,
    /// Latest `now-ms` seen, for `status`.
    now_ms: u64,
    scratch: Scratch,
}

/// `(prompt − cached) · prompt + cached · cache_reads + completion · completion` per million, in
/// USD; `None` for unusable pricing (negative or non-finite).
fn token_cost(pricing: &Pricing, prompt: u64, cached: u64, completion: u64) -> Option<f64> {
    let prices = [
        pricing.prompt,
        pricing.completion,
        pricing.input_cache_reads,
    ];
    if prices.iter().any(|p| !p.is_finite() || *p < 0.0) {
        return None;
    }
    let cached = cached.min(prompt);
    let uncached = prompt - cached;
    Some(
        (pricing.prompt * uncached as f64
            + pricing.input_cache_reads * cached as f64
            + pricing.completion * completion as f64)
            / 1e6,
    )
}

/// TTFT estimate and live sample count of an endpoint's profile (`unprofiled` without samples).
fn ttft_of(profile: Option<&LatencyProfile>, unprofiled: f64) -> (f64, usize) {
    match profile {
        Some(profile) => (profile.mean().unwrap_or(unprofiled), profile.len()),
        None => (unprofiled, 0),
    }
}

fn float_order(a: f64, b: f64) -> Ordering {
    a.partial_cmp(&b).unwrap_or(Ordering::Equal)
}

/// The probability that a request meets `slo_ms` when a backup is sent `elapsed_ms` after the
/// primary, which has not answered by then (the reference's rule): the primary's own chance,
/// conditioned on its survival, plus, where it would miss, the backup's chance in the time left
/// after [`HEDGE_DISPATCH_OVERHEAD_MS`]. Where the profile says the primary should have answered
/// already, the observation wins and the backup alone counts. Failures are samples of 60 s, so
/// they count as misses on both sides.
pub(crate) fn hedge_success(
    primary: &LatencyProfile,
    backup: &LatencyProfile,
    elapsed_ms: f64,
    slo_ms: f64,
) -> f64 {
    let remaining = slo_ms - elapsed_ms - HEDGE_DISPATCH_OVERHEAD_MS;
    let backup_meets = if remaining > 0.0 {
        backup.cdf(remaining).unwrap_or(0.0)
    } else {
        0.0
    };
    let (at_elapsed, at_slo) = (
        primary.cdf(elapsed_ms).unwrap_or(0.0),
        primary.cdf(slo_ms).unwrap_or(0.0),
    );
    let survival = (1.0 - at_elapsed).max(0.0);
    if survival <= lp::LP_EPS {
        return backup_meets.clamp(0.0, 1.0);
    }
    let primary_meets = (at_slo - at_elapsed).max(0.0) / survival;
    let primary_misses = (1.0 - at_slo).max(0.0) / survival;
    (primary_meets + primary_misses * backup_meets).clamp(0.0, 1.0)
}

/// The probability of exploring a route of cost `cost` with budget `budget` (the reference's rule):
/// 1 within the budget, else `(B − c_min) / (cost − c_min)`, the share that keeps the expected cost
/// of {cheapest, explored} at `B`; 0 at α = 0 for a route dearer than the cheapest.
pub fn exploration_probability(cost: f64, c_min: f64, budget: f64) -> f64 {
    if cost <= budget + lp::LP_EPS {
        1.0
    } else if cost > c_min {
        ((budget - c_min) / (cost - c_min)).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

impl RouteWise {
    fn window_ms(&self) -> u64 {
        u64::from(self.params.latency_window_sec) * 1_000
    }

    fn envelope_settings(&self) -> EnvelopeSettings {
        EnvelopeSettings {
            window_ms: self.params.envelope_window_ms(),
            lower_percentile: self.params.envelope_lower_percentile,
            upper_percentile: self.params.envelope_upper_percentile,
            min_samples: self.params.envelope_min_samples,
        }
    }

    fn output_thresholds(&self) -> OutputThresholds {
        OutputThresholds {
            bucket: self.params.output_min_bucket_samples,
            model: self.params.output_min_model_samples,
            global: self.params.output_min_global_samples,
            default_tokens: self.params.output_default_tokens,
        }
    }

    /// TTFT estimate and live sample count of an endpoint.
    fn ttft_estimate(&self, endpoint_id: &str) -> (f64, usize) {
        ttft_of(
            self.latency.get(endpoint_id),
            self.params.latency_unprofiled_ttft_ms,
        )
    }

    fn cooling_down(&self, endpoint_id: &str, now_ms: u64) -> bool {
        self.streaks
            .get(endpoint_id)
            .is_some_and(|s| now_ms < s.cooldown_until_ms)
    }

    fn leased(&self, endpoint_id: &str, now_ms: u64) -> bool {
        self.leases
            .get(endpoint_id)
            .is_some_and(|&until| now_ms < until)
    }

    /// Frees stale concurrency slots and exploration leases.
    fn expire(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        let expired = self
            .concurrency
            .expire(now_ms, CONCURRENCY_ACQUIRE_TIMEOUT_MS);
        self.counters.slots_expired += expired as u64;
        let before = self.leases.len();
        self.leases.retain(|_, until| now_ms < *until);
        self.counters.leases_expired += (before - self.leases.len()) as u64;
    }

    fn evaluate(
        &mut self,
        request: &Request,
        candidate: &Candidate,
        output_tokens: u32,
        envelope: Bounds,
    ) -> Evaluated {
        let window = self.window_ms();
        let Some(route) = self.routes.get(&candidate.index) else {
            let (ttft_ms, samples) = (self.params.latency_unprofiled_ttft_ms, 0);
            return Evaluated {
                index: candidate.index,
                endpoint_id: format!("#{}", candidate.index).as_str().into(),
                kind: None,
                pool: None,
                cost: 0.0,
                unpriced: true,
                excluded: Some("unknown_route"),
                ttft_ms,
                samples,
            };
        };
        let endpoint_id = route.endpoint_id.clone();
        // Trimmed and read through one lookup.
        let profile = self.latency.get_mut(&endpoint_id).map(|profile| {
            profile.trim(request.now_ms, window);
            &*profile
        });
        let (ttft_ms, samples) = ttft_of(profile, self.params.latency_unprofiled_ttft_ms);
        let mut evaluated = Evaluated {
            index: candidate.index,
            endpoint_id,
            kind: None,
            pool: None,
            cost: 0.0,
            unpriced: false,
            excluded: None,
            ttft_ms,
            samples,
        };
        let meta = match &route.meta {
            Ok(meta) => meta,
            Err(_) => {
                evaluated.excluded = Some("invalid_metadata");
                return evaluated;
            }
        };
        evaluated.kind = Some(meta.kind);
        match meta.kind {
            ProviderKind::OnDemand => {
                let prompt = u64::from(request.prompt_tokens);
                let cached = if self.params.prefix_cache_cost_adjustment_enabled {
                    prompt.saturating_sub(candidate.uncached_prompt_tokens)
                } else {
                    0
                };
                match route
                    .pricing
                    .as_ref()
                    .and_then(|p| token_cost(p, prompt, cached, u64::from(output_tokens)))
                {
                    Some(cost) => evaluated.cost = cost,
                    None => evaluated.unpriced = true,
                }
            }
            ProviderKind::Quota => {
                evaluated.pool = Some(meta.pool.clone());
                let state = self.quotas.get(&meta.pool).map(capacity::QuotaPool::state);
                match state {
                    None | Some(QuotaState::NoSnapshot) => {
                        evaluated.excluded = Some("quota_no_snapshot");
                    }
                    Some(QuotaState::Exhausted { .. }) => {
                        evaluated.excluded = Some("quota_exhausted");
                    }
                    Some(QuotaState::Available { used, limit }) => {
                        match envelope.shadow_price(used as f64 / limit as f64) {
                            Some(price) => evaluated.cost = price,
                            None => evaluated.excluded = Some("quota_envelope_uncalibrated"),
                        }
                    }
                }
            }
            ProviderKind::Concurrency => {
                evaluated.pool = Some(meta.pool.clone());
                if !self.concurrency.has_free_slot(&meta.pool) {
                    evaluated.excluded = Some("concurrency_full");
                }
            }
        }
        if evaluated.excluded.is_none() && self.cooling_down(&evaluated.endpoint_id, request.now_ms)
        {
            evaluated.excluded = Some("cooldown");
        }
        evaluated
    }

    /// The latency hedge for a request whose primary is `feasible[primary]`, by the reference's
    /// rule: at the checkpoints 25 %, 27.5 % … 90 % of the SLO, latest first, the cheapest other
    /// feasible route with which the request meets the SLO with probability ≥ [`HEDGE_TARGET`]
    /// ([`hedge_success`]: the primary given that it has not answered yet, else the backup sent
    /// then). Both profiles need [`HEDGE_MIN_SAMPLES`]. The host dispatches it at that checkpoint
    /// if the primary has produced no first token by then; the first token wins. Positions in
    /// `skip` (routes the caller cannot afford) are never backups.
    fn hedge(&self, feasible: &[Evaluated], primary: usize, skip: &[usize]) -> Option<(u64, u32)> {
        if self.params.latency_hedge_mode != HedgeMode::ProbabilityTarget
            || self.params.fallback_mode == FallbackMode::Strict
            // No other route to race: no profile to look up.
            || feasible.len() < 2
        {
            return None;
        }
        let trusted = |e: &Evaluated| {
            self.latency
                .get(&e.endpoint_id)
                .filter(|profile| profile.len() >= HEDGE_MIN_SAMPLES)
        };
        let primary_profile = trusted(&feasible[primary])?;
        let slo_ms = self.params.latency_slo_sec * 1_000.0;
        let backups: Vec<(&Evaluated, &LatencyProfile)> = feasible
            .iter()
            .enumerate()
            .filter(|(p, e)| {
                *p != primary && e.index != feasible[primary].index && !skip.contains(p)
            })
            .filter_map(|(_, e)| trusted(e).map(|profile| (e, profile)))
            .collect();
        for step in (0..=26).rev() {
            let at_ms = slo_ms * (0.25 + 0.025 * f64::from(step));
            let best = backups
                .iter()
                .filter_map(|&(e, profile)| {
                    let p = hedge_success(primary_profile, profile, at_ms, slo_ms);
                    (p >= HEDGE_TARGET - lp::LP_EPS).then_some((e, p))
                })
                .min_by(|(a, pa), (b, pb)| {
                    float_order(a.cost, b.cost)
                        .then(float_order(*pb, *pa))
                        .then(float_order(a.ttft_ms, b.ttft_ms))
                        .then(a.index.cmp(&b.index))
                });
            if let Some((backup, _)) = best {
                return Some((at_ms.round() as u64, backup.index));
            }
        }
        None
    }

    /// Mixture routes by (weight desc, TTFT, cost, index); then the others by (over budget, TTFT,
    /// cost, index). Positions into `feasible`, written to `positions`.
    fn fallback_positions(feasible: &[Evaluated], plan: &Plan, positions: &mut Vec<usize>) {
        let weight = |p: usize| plan.weights.get(p).copied().unwrap_or(0.0);
        let by_speed_then_cost = |a: &Evaluated, b: &Evaluated| {
            float_order(a.ttft_ms, b.ttft_ms)
                .then(float_order(a.cost, b.cost))
                .then(a.index.cmp(&b.index))
        };
        let over = |p: usize| feasible[p].cost > plan.budget + lp::LP_EPS;
        positions.clear();
        positions.extend(0..feasible.len());
        // One sort, the mixture's routes first: what sorting each side of a partition did.
        positions.sort_by(|&a, &b| {
            let (in_a, in_b) = (weight(a) > 0.0, weight(b) > 0.0);
            in_b.cmp(&in_a).then_with(|| {
                if in_a {
                    float_order(weight(b), weight(a))
                } else {
                    over(a).cmp(&over(b))
                }
                .then_with(|| by_speed_then_cost(&feasible[a], &feasible[b]))
            })
        });
    }

    /// The cheapest on-demand cost of a served request, or the reference price when the model has no
    /// priced on-demand route.
    fn envelope_sample(&self, observation: &Observation) -> f64 {
        let prompt = u64::from(observation.prompt_tokens);
        let completion = u64::from(observation.completion_tokens);
        let cached = if self.params.prefix_cache_cost_adjustment_enabled {
            u64::from(observation.cached_prompt_tokens)
        } else {
            0
        };
        self.routes
            .values()
            .filter(|r| {
                r.meta
                    .as_ref()
                    .is_ok_and(|m| m.kind == ProviderKind::OnDemand)
            })
            .filter_map(|r| r.pricing.as_ref())
            .filter_map(|p| token_cost(p, prompt, cached, completion))
            .min_by(|a, b| float_order(*a, *b))
            .unwrap_or_else(|| self.params.reference_api_price * (prompt + completion) as f64 / 1e6)
    }

    fn evaluated_json(e: &Evaluated, weight: Option<f64>) -> Value {
        json!({
            "index": e.index,
            "endpoint_id": &*e.endpoint_id,
            "provider_type": e.kind.map(ProviderKind::as_str),
            "pool": e.pool,
            "cost": e.cost,
            "unpriced": e.unpriced,
            "ttft_ms": e.ttft_ms,
            "samples": e.samples,
            "weight": weight,
            "excluded": e.excluded,
        })
    }

    fn last_decision_json(&self) -> Value {
        let Some(last) = &self.last else {
            return Value::Null;
        };
        let mixture: serde_json::Map<String, Value> = last
            .feasible
            .iter()
            .zip(&last.plan.weights)
            .filter(|(_, w)| **w > 0.0)
            .map(|(e, w)| (e.endpoint_id.to_string(), json!(w)))
            .collect();
        let mut candidates: Vec<Value> = last
            .feasible
            .iter()
            .enumerate()
            .map(|(p, e)| Self::evaluated_json(e, last.plan.weights.get(p).copied()))
            .collect();
        candidates.extend(last.excluded.iter().map(|e| Self::evaluated_json(e, None)));
        json!({
            "at_ms": last.at_ms,
            "lp_status": last.plan.status.as_str(),
            "alpha": last.alpha,
            "remaining_budget_usd": last.remaining_budget_usd,
            "above_remaining_budget": last.above_remaining_budget,
            "mixture": mixture,
            "budget": last.plan.budget,
            "c_min": last.plan.c_min,
            "c_max": last.plan.c_max,
            "expected_cost": last.plan.expected_cost,
            "mean_ttft_ms": last.plan.mean_ttft_ms,
            "primary": last.primary,
            "explored": last.explored,
            "exploration_probability": last.exploration_probability,
            "predicted_output_tokens": last.predicted_output_tokens,
            "output_source": last.output_source,
            "envelope_calibrated": last.envelope.calibrated,
            "candidates": candidates,
        })
    }
}

impl Strategy for RouteWise {
    type Params = RouteWiseParams;

    fn info() -> StrategyInfo {
        StrategyInfo::new(
            "routewise",
            env!("CARGO_PKG_VERSION"),
            "Cost-aware: minimises mean TTFT under a cost budget (LP over on-demand, quota and \
             concurrency routes), samples the primary from the optimal mixture.",
        )
    }

    fn create(model_id: &str, params: RouteWiseParams) -> Result<Self, String> {
        Ok(Self {
            model: model_id.into(),
            params: params.validate()?,
            routes: BTreeMap::new(),
            latency: BTreeMap::new(),
            leases: BTreeMap::new(),
            streaks: BTreeMap::new(),
            output: OutputPredictor::default(),
            envelope: CostEnvelope::default(),
            concurrency: ConcurrencyPools::default(),
            quotas: QuotaPools::default(),
            epoch: None,
            seq: 0,
            last: None,
            counters: Counters::default(),
            now_ms: 0,
            scratch: Scratch::default(),
        })
    }

    fn refresh_upstreams(&mut self, routes: &[Upstream]) {
        self.routes = routes
            .iter()
            .map(|r| {
                let meta = RouteMeta::parse(&self.model, &r.endpoint_id, &r.metadata_json);
                if let Err(error) = &meta {
                    log(
                        LogLevel::Warn,
                        &format!(
                            "routewise: route {} ({}) excluded: {error}",
                            r.index, r.endpoint_id
                        ),
                    );
                }
                (
                    r.index,
                    RouteEntry {
                        // The profile's own key when there is one, so that lookups by the
                        // route's id meet it by pointer.
                        endpoint_id: self
                            .latency
                            .get_key_value(r.endpoint_id.as_str())
                            .map_or_else(|| r.endpoint_id.as_str().into(), |(k, _)| k.clone()),
                        pricing: r.pricing,
                        meta,
                    },
                )
            })
            .collect();
        let mut limits: BTreeMap<String, u64> = BTreeMap::new();
        let mut quota_routes = Vec::new();
        for entry in self.routes.values() {
            let Ok(meta) = &entry.meta else { continue };
            match meta.kind {
                ProviderKind::Concurrency => {
                    let limit = meta.limit.unwrap_or(0);
                    limits
                        .entry(meta.pool.clone())
                        .and_modify(|l| *l = (*l).min(limit))
                        .or_insert(limit);
                }
                ProviderKind::Quota => {
                    quota_routes.push((meta.pool.as_str(), meta.limit, meta.snapshot));
                }
                ProviderKind::OnDemand => {}
            }
        }
        self.quotas.refresh(quota_routes);
        self.concurrency.set_limits(limits);
    }

    fn select(&mut self, request: &Request, candidates: &[Candidate]) -> Result<Decision, String> {
        let now = request.now_ms;
        self.expire(now);
        // Fixed per instance, from the first request: decisions of a predecessor never match.
        let epoch = *self.epoch.get_or_insert_with(|| {
            Rng::new(request.seed ^ request.now_ms.rotate_left(32)).next_u64() as u32
        });
        let seq = self.seq;
        self.seq += 1;
        self.counters.decisions += 1;
        // Equivalent to `Rng::for_request` on the seed with `random_seed` XORed in.
        let mut rng = Rng::new(request.seed ^ self.params.random_seed.unwrap_or(0));
        let u = rng.next_f64();

        let (output_tokens, output_source) = self.output.predict(
            &self.model,
            request.prompt_tokens,
            request.max_tokens,
            self.output_thresholds(),
        );
        let envelope = self.envelope.bounds(now, self.envelope_settings());
        // The buffers of the last decision and of the scratch space, reused: a decision allocates
        // little more than what it hands to the host (its order and tag). In wasm every
        // allocation is a call into the guest's allocator, and ten a decision were a tenth of it.
        let mut scratch = std::mem::take(&mut self.scratch);
        let (mut feasible, mut excluded) = self
            .last
            .take()
            .map(|last| (last.feasible, last.excluded))
            .unwrap_or_default();
        feasible.clear();
        excluded.clear();
        declared_positions_into(candidates, &mut scratch.positions);
        for &p in &scratch.positions {
            let evaluated = self.evaluate(request, &candidates[p], output_tokens, envelope);
            match evaluated.excluded {
                None => feasible.push(evaluated),
                Some(_) => excluded.push(evaluated),
            }
        }
        // A route another request is exploring (no samples yet, a live lease) leaves the plan
        // until its answer comes, as in the reference, while another route is feasible. When
        // every feasible route is being explored they stay (the reference refuses then), so a
        // concurrency route keeps counting its slots.
        let explored_now = |e: &Evaluated| e.samples == 0 && self.leased(&e.endpoint_id, now);
        if feasible.iter().any(|e| !explored_now(e)) && feasible.iter().any(explored_now) {
            let (plan_routes, leased): (Vec<Evaluated>, Vec<Evaluated>) =
                feasible.into_iter().partition(|e| !explored_now(e));
            feasible = plan_routes;
            excluded.extend(leased.into_iter().map(|mut e| {
                e.excluded = Some("exploration_lease");
                e
            }));
            excluded.sort_by_key(|e| e.index);
        }

        // Budget pressure (a caller near its cap): routes that alone cost more than what the
        // caller has left leave the plan while a cheaper one is feasible, and α slides towards 0
        // once the remaining budget covers fewer than `budget_pressure_requests` requests at B.
        let remaining = request
            .remaining_budget_usd
            .filter(|r| !r.is_nan() && self.params.budget_pressure_requests > 0);
        let Scratch {
            positions,
            in_plan,
            unaffordable,
            costs,
            ttft,
        } = &mut scratch;
        in_plan.clear();
        unaffordable.clear();
        match remaining {
            Some(r) => {
                for (p, e) in feasible.iter().enumerate() {
                    if e.cost <= r {
                        in_plan.push(p);
                    } else {
                        unaffordable.push(p);
                    }
                }
            }
            None => in_plan.extend(0..feasible.len()),
        }
        if in_plan.is_empty() {
            in_plan.extend(0..feasible.len());
            unaffordable.clear();
        }
        costs.clear();
        costs.extend(in_plan.iter().map(|&p| feasible[p].cost));
        ttft.clear();
        ttft.extend(in_plan.iter().map(|&p| feasible[p].ttft_ms));
        let alpha = lp::pressured_alpha(
            self.params.budget_alpha,
            lp::budget(costs, self.params.budget_alpha),
            remaining,
            self.params.budget_pressure_requests,
        );
        let mut plan = lp::plan(costs, ttft, alpha);
        if !unaffordable.is_empty() {
            let mut weights = vec![0.0; feasible.len()];
            for (&p, &w) in in_plan.iter().zip(&plan.weights) {
                weights[p] = w;
            }
            plan.weights = weights;
        }
        if alpha < self.params.budget_alpha || !unaffordable.is_empty() {
            self.counters.budget_pressured += 1;
        }
        match plan.status {
            LpStatus::NoFeasibleCandidates => self.counters.no_feasible += 1,
            LpStatus::CheapestFallback => self.counters.cheapest_fallback += 1,
            LpStatus::SingleProvider | LpStatus::Optimal => {}
        }

        // Exploration (the reference's rule): the cheapest feasible endpoint without samples and
        // without a lease is the target, drawn with probability q = 1 when it fits the budget,
        // else (B − c_min) / (c_target − c_min), so the decision's expected cost stays within B;
        // the other draws go to the cheapest route. At α = 0 only a route as cheap as the
        // cheapest is explored.
        let by_cost = |&a: &usize, &b: &usize| {
            float_order(feasible[a].cost, feasible[b].cost)
                .then(feasible[a].index.cmp(&feasible[b].index))
        };
        let target = in_plan
            .iter()
            .copied()
            .filter(|&p| feasible[p].samples == 0 && !self.leased(&feasible[p].endpoint_id, now))
            .min_by(by_cost);
        let exploring = target
            .map(|p| {
                (
                    p,
                    exploration_probability(feasible[p].cost, plan.c_min, plan.budget),
                )
            })
            .filter(|&(_, q)| q > 0.0);
        let explore = exploring.filter(|&(_, q)| u < q).map(|(p, _)| p);
        let cheapest_instead = if exploring.is_some() && explore.is_none() {
            self.counters.explorations_declined += 1;
            in_plan.iter().copied().min_by(by_cost)
        } else {
            None
        };
        // Session affinity as a tie-break: the caller's warm endpoint stays primary while the plan
        // gives it a share; one the optimum leaves out loses the pin (the host moves it).
        let pinned = candidates
            .iter()
            .find(|c| c.affinity_pinned)
            .and_then(|c| feasible.iter().position(|e| e.index == c.index))
            .filter(|&p| plan.weights.get(p).is_some_and(|&w| w > lp::LP_EPS));
        if exploring.is_none() && pinned.is_some() {
            self.counters.affinity_kept += 1;
        }
        let primary = match exploring {
            Some(_) => explore.or(cheapest_instead),
            None => pinned.or_else(|| lp::sample(&plan.weights, u)),
        };

        Self::fallback_positions(&feasible, &plan, positions);
        let mut order: Vec<u32> = Vec::with_capacity(feasible.len() + excluded.len());
        order.extend(positions.iter().map(|&p| feasible[p].index));
        // Excluded candidates last, in declared order: a last resort rather than no answer (and the
        // only way a model whose routes are all excluded still gets traffic to learn from).
        order.extend(excluded.iter().map(|e| e.index));
        if let Some(p) = primary {
            let index = feasible[p].index;
            order.retain(|&i| i != index);
            order.insert(0, index);
        }
        if self.params.fallback_mode == FallbackMode::Strict {
            order.truncate(1);
        }

        let mut slot = false;
        if let Some(p) = primary {
            let chosen = &feasible[p];
            if explore.is_some() {
                self.leases.insert(
                    chosen.endpoint_id.to_string(),
                    now.saturating_add(EXPLORATION_LEASE_MS),
                );
                self.counters.explorations += 1;
            }
            match (chosen.kind, &chosen.pool) {
                (Some(ProviderKind::Concurrency), Some(pool)) => {
                    self.concurrency.acquire(seq, pool, chosen.index, now);
                    slot = true;
                }
                (Some(ProviderKind::Quota), Some(pool)) => self.quotas.record(pool, now),
                _ => {}
            }
        }

        let metadata = match order.first() {
            Some(&first) => DecisionTag {
                epoch,
                seq,
                primary: first,
                predicted_cost: primary.map_or(0.0, |p| feasible[p].cost),
                explore: explore.is_some(),
                slot,
            }
            .encode(),
            None => String::new(),
        };
        let hedge = primary.and_then(|p| self.hedge(&feasible, p, unaffordable));
        if hedge.is_some() {
            self.counters.hedges_planned += 1;
        }
        let above_remaining_budget = unaffordable
            .iter()
            .map(|&p| feasible[p].endpoint_id.to_string())
            .collect();
        self.last = Some(LastDecision {
            at_ms: now,
            explored: explore.map(|p| feasible[p].endpoint_id.to_string()),
            exploration_probability: exploring.map(|(_, q)| q),
            primary: order.first().copied(),
            plan,
            feasible,
            excluded,
            predicted_output_tokens: output_tokens,
            output_source: output_source.as_str(),
            envelope,
            alpha,
            remaining_budget_usd: request.remaining_budget_usd,
            above_remaining_budget,
        });
        self.scratch = scratch;
        let decision = Decision::new(order).with_metadata(metadata);
        Ok(match hedge {
            Some((at_ms, backup)) => {
                decision.with_hedge(u32::try_from(at_ms).unwrap_or(u32::MAX), backup)
            }
            None => decision,
        })
    }

    fn observe(&mut self, observation: &Observation) {
        let now = observation.now_ms;
        self.now_ms = self.now_ms.max(now);
        self.counters.observations += 1;
        let tag =
            TagKey::parse(&observation.strategy_metadata).filter(|t| Some(t.epoch) == self.epoch);
        match &tag {
            // Attempts are sequential: any attempt of the request means the primary's is over.
            Some(tag) => {
                if self.concurrency.release(tag.seq) {
                    self.counters.slots_released += 1;
                }
            }
            None => self.counters.foreign_observations += 1,
        }
        let Some(route) = self.routes.get(&observation.index) else {
            return;
        };
        let endpoint_id = route.endpoint_id.clone();
        let quota_pool = route
            .meta
            .as_ref()
            .ok()
            .filter(|m| m.kind == ProviderKind::Quota)
            .map(|m| m.pool.clone());

        // What the attempt says about the endpoint (as in the reference): a first token is a TTFT
        // sample and ends a failure streak; a server-side failure before it is the 60 s penalty,
        // and any server-side failure a step towards the cooldown; a failure about the request
        // (a 4xx other than 408/429) says nothing.
        let first_token = observation.ttft_ms.filter(|t| t.is_finite() && *t >= 0.0);
        let server_failure = !observation.success && server_side_failure(observation.status);
        let sample = if observation.success {
            Some(first_token.unwrap_or(observation.latency_ms))
        } else if server_failure {
            Some(first_token.unwrap_or(FAILURE_PENALTY_MS))
        } else {
            self.counters.request_failures += 1;
            None
        };
        if let Some(sample) = sample {
            let (window, max) = (
                self.window_ms(),
                self.params.latency_max_samples_per_profile as usize,
            );
            let profile = match self.latency.get_mut(&endpoint_id) {
                Some(profile) => profile,
                None => self.latency.entry(endpoint_id.clone()).or_default(),
            };
            profile.push(now, sample, window, max);
            if !profile.is_empty() {
                self.leases.remove(&*endpoint_id);
            }
            if observation.success || first_token.is_some() {
                // An absent streak reads as a default one everywhere (`status` shows 0), so the
                // map stays empty while endpoints answer and the request path looks nothing up.
                self.streaks.remove(&*endpoint_id);
            }
            if server_failure {
                let streak = match self.streaks.get_mut(&*endpoint_id) {
                    Some(streak) => streak,
                    None => self.streaks.entry(endpoint_id.to_string()).or_default(),
                };
                streak.failures += 1;
                if streak.failures >= COOLDOWN_AFTER_FAILURES {
                    if now >= streak.cooldown_until_ms {
                        self.counters.cooldowns += 1;
                    }
                    streak.cooldown_until_ms = streak
                        .cooldown_until_ms
                        .max(now.saturating_add(COOLDOWN_MS));
                }
            }
        }

        if observation.success {
            self.output.record(
                &self.model,
                observation.prompt_tokens,
                observation.completion_tokens,
            );
            let cost = self.envelope_sample(observation);
            self.envelope.record(now, cost);
        }
        // The primary was counted when it was chosen; fallback attempts are counted here.
        if let Some(pool) = quota_pool
            && tag.as_ref().is_none_or(|t| t.primary != observation.index)
        {
            self.quotas.record(&pool, now);
        }
    }

    fn status(&self) -> String {
        let now = self.now_ms;
        let slo_ms = self.params.latency_slo_sec * 1_000.0;
        let mut latency = serde_json::Map::new();
        let mut routes = Vec::new();
        for (index, entry) in &self.routes {
            let profile = self.latency.get(&*entry.endpoint_id);
            let (estimate, samples) = self.ttft_estimate(&entry.endpoint_id);
            latency.insert(
                entry.endpoint_id.to_string(),
                json!({
                    "samples": samples,
                    "mean_ttft_ms": profile.and_then(LatencyProfile::mean),
                    "estimate_ms": estimate,
                    "slo_share": profile.and_then(|p| p.slo_share(slo_ms)),
                    "exploration_lease_until_ms": self.leases.get(&*entry.endpoint_id)
                        .filter(|&&until| now < until),
                    "failure_streak": self.streaks.get(&*entry.endpoint_id)
                        .map_or(0, |s| s.failures),
                    "cooldown_until_ms": self.streaks.get(&*entry.endpoint_id)
                        .map(|s| s.cooldown_until_ms)
                        .filter(|&until| now < until),
                }),
            );
            routes.push(match &entry.meta {
                Ok(meta) => json!({
                    "index": index,
                    "endpoint_id": &*entry.endpoint_id,
                    "provider_type": meta.kind.as_str(),
                    "pool": (meta.kind != ProviderKind::OnDemand).then_some(&meta.pool),
                    "priced": entry.pricing.is_some(),
                }),
                Err(error) => json!({
                    "index": index,
                    "endpoint_id": &*entry.endpoint_id,
                    "metadata_error": error,
                }),
            });
        }
        let stale_after_ms = u64::from(self.params.quota_snapshot_refresh_interval_sec) * 2_000;
        let quota: serde_json::Map<String, Value> = self
            .quotas
            .iter()
            .map(|(name, pool)| {
                let state = pool.state();
                let (used, remaining) = match state {
                    QuotaState::NoSnapshot => (None, None),
                    QuotaState::Exhausted { used, .. } => (Some(used), Some(0)),
                    QuotaState::Available { used, limit } => (Some(used), Some(limit - used)),
                };
                (
                    name.clone(),
                    json!({
                        "limit": pool.effective_limit(),
                        "declared_limit": pool.limit,
                        "snapshot": pool.snapshot.map(|s| json!({
                            "used": s.used, "limit": s.limit, "at_ms": s.at_ms,
                        })),
                        "snapshot_stale": pool.snapshot
                            .map(|s| now.saturating_sub(s.at_ms) > stale_after_ms),
                        "local_since_snapshot": pool.since_snapshot(),
                        "used_estimate": used,
                        "remaining": remaining,
                        "state": match state {
                            QuotaState::NoSnapshot => "no_snapshot",
                            QuotaState::Exhausted { .. } => "exhausted",
                            QuotaState::Available { .. } => "available",
                        },
                    }),
                )
            })
            .collect();
        let concurrency: serde_json::Map<String, Value> = self
            .concurrency
            .pools()
            .into_iter()
            .map(|(name, limit, in_flight)| {
                (name, json!({ "limit": limit, "in_flight": in_flight }))
            })
            .collect();
        let bounds = self.envelope.last_bounds();
        let buckets: serde_json::Map<String, Value> = self
            .output
            .buckets(&self.model)
            .map(|(b, s)| {
                (
                    b.to_string(),
                    json!({ "samples": s.count, "mean": s.mean() }),
                )
            })
            .collect();
        let model_stat = self.output.model(&self.model);
        let c = self.counters;
        json!({
            "strategy": "routewise",
            "model": self.model.as_str(),
            "now_ms": now,
            "budget_alpha": self.params.budget_alpha,
            "budget_pressure_requests": self.params.budget_pressure_requests,
            "fallback_mode": self.params.fallback_mode,
            "last_decision": self.last_decision_json(),
            "envelope": {
                "pool": self.model.as_str(),
                "calibrated": bounds.calibrated,
                "samples": bounds.samples,
                "min_samples": self.params.envelope_min_samples,
                "lower": bounds.lower,
                "upper": bounds.upper,
                "lower_fixed": bounds.lower_fixed,
                "window_hours": self.params.envelope_window_hours,
            },
            "latency": latency,
            "quota": quota,
            "concurrency": concurrency,
            "output": {
                "model_samples": model_stat.count,
                "model_mean": model_stat.mean(),
                "global_samples": self.output.global().count,
                "buckets_log2": buckets,
            },
            "routes": routes,
            "host_side": {
                "stateful_providers_single_worker_only":
                    self.params.stateful_providers_single_worker_only,
                "latency_hedge_mode": self.params.latency_hedge_mode,
                "latency_slo_sec": self.params.latency_slo_sec,
                "routewise_probe_enabled": self.params.routewise_probe_enabled,
                "db_bootstrap_enabled": self.params.db_bootstrap_enabled,
            },
            "counters": {
                "decisions": c.decisions,
                "explorations": c.explorations,
                "affinity_kept": c.affinity_kept,
                "budget_pressured": c.budget_pressured,
                "no_feasible_candidates": c.no_feasible,
                "cheapest_fallback": c.cheapest_fallback,
                "observations": c.observations,
                "foreign_observations": c.foreign_observations,
                "slots_held": self.concurrency.held(),
                "slots_released": c.slots_released,
                "slots_expired": c.slots_expired,
                "leases_expired": c.leases_expired,
                "hedges_planned": c.hedges_planned,
                "explorations_declined": c.explorations_declined,
                "cooldowns": c.cooldowns,
                "request_failures": c.request_failures,
            },
        })
        .to_string()
    }

    fn tick(&mut self, now_ms: u64) {
        self.expire(now_ms);
        let window = self.window_ms();
        let known: Vec<&str> = self.routes.values().map(|r| &*r.endpoint_id).collect();
        self.latency.retain(|endpoint, profile| {
            profile.trim(now_ms, window);
            !profile.is_empty() || known.contains(&endpoint.as_str())
        });
        let settings = self.envelope_settings();
        self.envelope.bounds(now_ms, settings);
        self.quotas.trim();
    }
}

switchyard_sdk::export_strategy!(RouteWise);

// A decision allocates a handful of blocks (its tag, its order, the call's lowered arguments):
// through wasi-libc each allocation and free went through two shims before dlmalloc, about a
// quarter of the guest's allocation cost.
#[cfg(target_family = "wasm")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;
