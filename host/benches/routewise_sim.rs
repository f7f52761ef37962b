//! A simulation in the spirit of the published RouteWise evaluation, driven through the real
//! strategy engine in virtual time.
//!
//! One model with five routes: a subscription plan with a daily request quota, own GPUs with a
//! fixed number of concurrent slots, and three pay-per-token providers (cheap with a heavy TTFT
//! tail, a middle one, fast and expensive). Traffic is bursty (Poisson within on/off periods) with
//! varied prompt and output lengths. Six policies see the same requests and the same per-route luck
//! (common random numbers): RouteWise at `budget_alpha` 0, 0.5 and 1 and `fixed` (every route
//! weight 1, `fallback_order: weighted`) — the real `routewise.wasm` and `fixed.wasm` behind
//! `ModelRouter`: `select`, `observe` with TTFT, latency, tokens and the decision's strategy
//! metadata, `tick`, and a `refresh-route-table` carrying the quota snapshot every 60 s, as the host
//! would — and two oracles written here that know the true state of the quota and the GPUs:
//! greedy-cost (the cheapest route that can take the request now) and greedy-latency (the lowest
//! true median TTFT that can take it now).
//!
//! The host's breakers, affinity and prefill tracker are not involved: the strategies see every
//! route as a healthy candidate, so the comparison is between ordering policies alone.
//!
//! A second scenario gives all the traffic to one consumer with a daily budget, passed to the
//! strategy as the request's remaining budget as the host does (refused once it is spent), and
//! compares RouteWise α = 0.75 with budget pressure (the default `budget_pressure_requests` 20,
//! and 2 000) and without (`budget_pressure_requests: 0`). The budget is what α = 0.75 without pressure spends
//! in the first 60 % of the day (measured by a third, unbudgeted run).
//!
//! Run: `cargo xtask build-strategies && cargo bench --profile dev -p switchyard --bench
//! routewise_sim` (`-- --quick` for a 4-hour instead of a 24-hour day). Prints markdown tables and
//! writes `routewise_sim.json` to the target directory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use switchyard::config::Config;
use switchyard::gateway::Routing;
use switchyard::strategy::{
    Candidate, CircuitState, Modalities, ModelRouter, Observation, PrefillPolicy, Request,
    UpstreamInfo as Route, upstream_table,
};

/// Workload seed: the arrivals, sizes, per-route luck and strategy seeds all derive from it.
const SEED: u64 = 11;
/// Virtual start: 2026-01-01T00:00:00Z, the start of the quota day.
const T0_MS: u64 = 1_767_225_600_000;
/// The SLO the report counts violations of.
const SLO_S: f64 = 3.0;
/// Requests per quota day the plan allows (scaled down with a shorter run).
const QUOTA_PER_DAY: u64 = 8_000;
/// Concurrent requests the own GPUs serve; more wait first-in first-out.
const GPU_SLOTS: usize = 4;
/// How often the host would refresh the quota snapshot (`quota_snapshot_refresh_interval_sec`).
const SNAPSHOT_EVERY_S: f64 = 60.0;
/// The host's default tick interval.
const TICK_EVERY_S: f64 = 1.0;
/// How long an over-quota request takes to be refused (429).
const QUOTA_REFUSAL_S: f64 = 0.15;
/// The budget scenario's budget: what RouteWise α = 0.75 without pressure spends in this share of
/// the run.
const BUDGET_GONE_SHARE: f64 = 0.6;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Billing {
    /// A daily request quota, paid for up front: no per-request cost.
    Quota,
    /// Own GPUs with a fixed number of slots: no per-request cost.
    Slots,
    /// Pay per token.
    OnDemand { prompt: f64, completion: f64 },
}

/// One route's behaviour. TTFT = lognormal(median, sigma) + prompt / prefill rate (+ queueing on
/// the GPUs); the answer then streams at `decode_tps`.
#[derive(Debug, Clone, Copy)]
struct RouteSpec {
    name: &'static str,
    billing: Billing,
    ttft_median_s: f64,
    /// Standard deviation of ln(TTFT): 0.3 is a tight provider, 0.9 a heavy tail (P99 ≈ 8× median).
    ttft_sigma: f64,
    prefill_tps: f64,
    decode_tps: f64,
    /// Chance an attempt fails (5xx) after `fail_after`, before any token.
    failure_rate: f64,
}

/// Providers of one model differ in price by a few times, not by tens (cheap to fast: 6×).
const ROUTES: [RouteSpec; 5] = [
    RouteSpec {
        name: "plan (quota)",
        billing: Billing::Quota,
        ttft_median_s: 1.0,
        ttft_sigma: 0.45,
        prefill_tps: 12_000.0,
        decode_tps: 60.0,
        failure_rate: 0.005,
    },
    RouteSpec {
        name: "gpus (4 slots)",
        billing: Billing::Slots,
        ttft_median_s: 0.35,
        ttft_sigma: 0.3,
        prefill_tps: 8_000.0,
        decode_tps: 35.0,
        failure_rate: 0.002,
    },
    RouteSpec {
        name: "cheap",
        billing: Billing::OnDemand {
            prompt: 0.25,
            completion: 1.00,
        },
        ttft_median_s: 1.6,
        ttft_sigma: 0.9,
        prefill_tps: 6_000.0,
        decode_tps: 40.0,
        failure_rate: 0.01,
    },
    RouteSpec {
        name: "middle",
        billing: Billing::OnDemand {
            prompt: 0.60,
            completion: 2.40,
        },
        ttft_median_s: 0.8,
        ttft_sigma: 0.5,
        prefill_tps: 15_000.0,
        decode_tps: 80.0,
        failure_rate: 0.005,
    },
    RouteSpec {
        name: "fast",
        billing: Billing::OnDemand {
            prompt: 1.50,
            completion: 6.00,
        },
        ttft_median_s: 0.3,
        ttft_sigma: 0.3,
        prefill_tps: 30_000.0,
        decode_tps: 120.0,
        failure_rate: 0.002,
    },
];
const N: usize = ROUTES.len();
const QUOTA_ROUTE: usize = 0;
const GPU_ROUTE: usize = 1;

impl RouteSpec {
    /// The request's median TTFT on an idle route, in seconds.
    fn median_ttft(&self, prompt: u32) -> f64 {
        self.ttft_median_s + f64::from(prompt) / self.prefill_tps
    }

    /// USD for a served request (0 for the prepaid routes).
    fn cost(&self, prompt: u32, completion: u32) -> f64 {
        match self.billing {
            Billing::OnDemand {
                prompt: p,
                completion: c,
            } => (p * f64::from(prompt) + c * f64::from(completion)) / 1e6,
            Billing::Quota | Billing::Slots => 0.0,
        }
    }
}

/// What one route would do with one request: drawn once, shared by every policy.
#[derive(Debug, Clone, Copy)]
struct Luck {
    /// A standard normal draw for the route's TTFT.
    z: f64,
    /// Uniform in [0, 1): the attempt fails when below the route's failure rate.
    fail: f64,
    /// Seconds until a failing attempt reports its error.
    fail_after_s: f64,
}

#[derive(Debug, Clone)]
struct Arrival {
    at: f64,
    prompt: u32,
    output: u32,
    seed: u64,
    luck: [Luck; N],
}

fn exp(rng: &mut StdRng, rate: f64) -> f64 {
    -(1.0 - rng.random::<f64>()).ln() / rate
}

fn normal(rng: &mut StdRng) -> f64 {
    // Box–Muller; 1 - u keeps the logarithm finite.
    let u = 1.0 - rng.random::<f64>();
    let v = rng.random::<f64>();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// Bursty traffic: a quiet state (0.3 requests/s, mean 10 min) alternating with bursts (3 requests/s,
/// mean 90 s); prompts lognormal around 1 500 tokens (50–100 000), outputs around 250 (1–4 000).
fn workload(seconds: f64, seed: u64) -> Vec<Arrival> {
    const QUIET_RATE: f64 = 0.3;
    const BURST_RATE: f64 = 3.0;
    const QUIET_MEAN_S: f64 = 600.0;
    const BURST_MEAN_S: f64 = 90.0;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut arrivals = Vec::new();
    let mut t = 0.0;
    let mut bursting = false;
    let mut switch_at = exp(&mut rng, 1.0 / QUIET_MEAN_S);
    while t < seconds {
        let rate = if bursting { BURST_RATE } else { QUIET_RATE };
        let next = t + exp(&mut rng, rate);
        if next >= switch_at {
            // Memoryless: restarting the draw at the switch is exact.
            t = switch_at;
            bursting = !bursting;
            let mean = if bursting { BURST_MEAN_S } else { QUIET_MEAN_S };
            switch_at = t + exp(&mut rng, 1.0 / mean);
            continue;
        }
        t = next;
        if t >= seconds {
            break;
        }
        let prompt = (1_500.0 * (1.0 * normal(&mut rng)).exp()).clamp(50.0, 100_000.0) as u32;
        let output = (250.0 * (0.8 * normal(&mut rng)).exp()).clamp(1.0, 4_000.0) as u32;
        let luck = std::array::from_fn(|_| Luck {
            z: normal(&mut rng),
            fail: rng.random(),
            fail_after_s: rng.random_range(0.2..2.0),
        });
        arrivals.push(Arrival {
            at: t,
            prompt,
            output,
            seed: rng.random(),
            luck,
        });
    }
    arrivals
}

/// The simulated world: the quota's usage and the GPUs' slots as the providers see them.
struct World {
    quota_limit: u64,
    quota_used: u64,
    /// When the last request of the quota was taken.
    quota_gone_at: Option<f64>,
    /// When each GPU slot becomes free (reservations included).
    gpu_free_at: [f64; GPU_SLOTS],
}

impl World {
    fn new(quota_limit: u64) -> Self {
        Self {
            quota_limit,
            quota_used: 0,
            quota_gone_at: None,
            gpu_free_at: [0.0; GPU_SLOTS],
        }
    }

    /// Whether a route can take a request at `t` without a refusal or a queue (what the greedy
    /// oracles know and the strategies do not).
    fn ready(&self, route: usize, t: f64) -> bool {
        match route {
            QUOTA_ROUTE => self.quota_used < self.quota_limit,
            GPU_ROUTE => self.gpu_free_at.iter().any(|&free| free <= t),
            _ => true,
        }
    }
}

/// How a policy orders the routes.
enum Policy {
    /// A wasm strategy behind the host's `ModelRouter`.
    Strategy {
        router: Arc<ModelRouter>,
        routes: Vec<Route>,
    },
    /// The cheapest route that is ready; ties to the lower median TTFT.
    GreedyCost,
    /// The lowest true median TTFT among ready routes; ties to the cheaper.
    GreedyLatency,
}

enum PolicyKind {
    /// A built-in strategy, its `router_params` in YAML; every route has weight 1.
    Strategy(&'static str, &'static str),
    GreedyCost,
    GreedyLatency,
}

struct PolicySpec {
    name: &'static str,
    kind: PolicyKind,
}

const POLICIES: [PolicySpec; 6] = [
    PolicySpec {
        name: "RouteWise α=0",
        kind: PolicyKind::Strategy("routewise", "{ budget_alpha: 0 }"),
    },
    PolicySpec {
        name: "RouteWise α=0.5",
        kind: PolicyKind::Strategy("routewise", "{ budget_alpha: 0.5 }"),
    },
    PolicySpec {
        name: "RouteWise α=1",
        kind: PolicyKind::Strategy("routewise", "{ budget_alpha: 1 }"),
    },
    PolicySpec {
        name: "greedy-cost",
        kind: PolicyKind::GreedyCost,
    },
    PolicySpec {
        name: "greedy-latency",
        kind: PolicyKind::GreedyLatency,
    },
    PolicySpec {
        name: "fixed (weighted)",
        kind: PolicyKind::Strategy("fixed", "{ fallback_order: weighted }"),
    },
];

/// The budget scenario: one consumer with a daily budget. The last runs without a budget and
/// sets it (the others must be routers of their own: a router learns during its run).
const BUDGET_POLICIES: [PolicySpec; 4] = [
    PolicySpec {
        name: "RouteWise α=0.75, budget pressure (N = 20)",
        kind: PolicyKind::Strategy("routewise", "{ budget_alpha: 0.75 }"),
    },
    PolicySpec {
        name: "RouteWise α=0.75, budget pressure (N = 2000)",
        kind: PolicyKind::Strategy(
            "routewise",
            "{ budget_alpha: 0.75, budget_pressure_requests: 2000 }",
        ),
    },
    PolicySpec {
        name: "RouteWise α=0.75, no pressure (N = 0)",
        kind: PolicyKind::Strategy(
            "routewise",
            "{ budget_alpha: 0.75, budget_pressure_requests: 0 }",
        ),
    },
    PolicySpec {
        name: "calibration (no budget)",
        kind: PolicyKind::Strategy(
            "routewise",
            "{ budget_alpha: 0.75, budget_pressure_requests: 0 }",
        ),
    },
];

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

fn route_yaml(quota_limit: u64) -> String {
    let mut yaml = String::new();
    for (i, spec) in ROUTES.iter().enumerate() {
        // Loopback base URLs only give each route a distinct endpoint id; nothing is contacted.
        yaml += &format!(
            "      - kind: openai_compat\n        base_url: http://127.0.0.1:{}/v1\n",
            7300 + i
        );
        match spec.billing {
            Billing::Quota => {
                yaml += &format!(
                    "        metadata: {{ provider_type: quota, quota: {{ limit: {quota_limit} }} }}\n"
                );
            }
            Billing::Slots => {
                yaml += &format!(
                    "        metadata: {{ provider_type: concurrency, concurrency: {{ limit: {GPU_SLOTS} }} }}\n"
                );
            }
            Billing::OnDemand { prompt, completion } => {
                yaml +=
                    &format!("        pricing: {{ prompt: {prompt}, completion: {completion} }}\n");
            }
        }
    }
    yaml
}

/// One config holding a model per strategy policy, all with the same routes: the comparison's
/// policies, then the budget scenario's.
async fn build_policies(quota_limit: u64) -> (Vec<Policy>, Vec<Policy>) {
    let routes = route_yaml(quota_limit);
    let mut yaml = format!(
        // A generous deadline: a call that times out on a busy machine would fall back to declared
        // order and make the run depend on the machine.
        "strategies:\n  builtin_dir: {}\n  call_timeout_ms: 1000\n  tick_interval_ms: 0\nmodels:\n",
        target_dir().join("strategies").display()
    );
    for (prefix, specs) in [("p", &POLICIES[..]), ("b", &BUDGET_POLICIES[..])] {
        for (i, policy) in specs.iter().enumerate() {
            if let PolicyKind::Strategy(router, params) = policy.kind {
                yaml += &format!(
                    "  - id: {prefix}{i}\n    router: {router}\n    router_params: {params}\n    route:\n{routes}"
                );
            }
        }
    }
    let config = Config::from_yaml(Path::new("routewise_sim.yaml"), &yaml, &|_| None).unwrap();
    let routing = Routing::build(&config, switchyard::gateway::DirLoad::Now)
        .await
        .unwrap_or_else(|e| {
            panic!("{e}\n(build the strategies first: cargo xtask build-strategies)")
        });
    let policies = |prefix: &str, specs: &[PolicySpec]| -> Vec<Policy> {
        specs
            .iter()
            .enumerate()
            .map(|(i, policy)| match policy.kind {
                PolicyKind::Strategy(..) => {
                    let model = routing.table.resolve(&format!("{prefix}{i}")).unwrap();
                    Policy::Strategy {
                        router: model.router.clone(),
                        routes: upstream_table(model.upstreams()),
                    }
                }
                PolicyKind::GreedyCost => Policy::GreedyCost,
                PolicyKind::GreedyLatency => Policy::GreedyLatency,
            })
            .collect()
    };
    (policies("p", &POLICIES), policies("b", &BUDGET_POLICIES))
}

fn ms(t: f64) -> u64 {
    T0_MS + (t * 1000.0).round() as u64
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum EventKind {
    Arrive,
    /// Try step `k` of the request's order.
    Attempt(usize),
    /// Step `k` ended with this HTTP status (200: served) and is reported.
    Finish {
        step: usize,
        status: u16,
    },
}

#[derive(Debug, Clone, Copy)]
struct Event {
    at: f64,
    /// Insertion order: equal times are handled first come, first served.
    seq: u64,
    request: usize,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        // A max-heap: the earliest event is the greatest.
        other.at.total_cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

/// One request's progress.
#[derive(Debug, Clone, Default)]
struct Progress {
    order: Vec<usize>,
    metadata: String,
    /// Start of the current attempt and its TTFT and latency from that start.
    attempt_start: f64,
    attempt_ttft: f64,
    attempt_latency: f64,
}

#[derive(Debug, serde::Serialize)]
struct RouteShare {
    route: String,
    share: f64,
}

#[derive(Debug, Default, serde::Serialize)]
struct Summary {
    policy: String,
    requests: usize,
    cost_usd: f64,
    ttft_mean_s: f64,
    ttft_p50_s: f64,
    ttft_p99_s: f64,
    /// Share of requests whose TTFT exceeded the SLO, failed requests included.
    slo_violation_rate: f64,
    failed: usize,
    /// Attempts after the first one (fallbacks).
    fallbacks: usize,
    /// The share of requests each route served, in route order.
    share: Vec<RouteShare>,
    /// Hours into the run when the quota ran out, if it did.
    quota_gone_h: Option<f64>,
    /// Strategy calls that failed (timeouts, traps, invalid orders); 0 expected.
    strategy_failures: u64,
    /// The budget scenario's outcome (`None` without a budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    budget: Option<BudgetOutcome>,
}

/// How a policy fared against the consumer's budget.
#[derive(Debug, Default, serde::Serialize)]
struct BudgetOutcome {
    limit_usd: f64,
    /// Requests admitted (served or failed on every route).
    admitted: usize,
    /// Requests refused at admission because the budget was spent (the host's 402).
    refused: usize,
    /// USD charged to the budget: each served request's cost when it ends, as the host charges.
    spent_usd: f64,
    /// Hours into the run when the spend first reached the limit.
    gone_h: Option<f64>,
    /// Decisions whose plan the remaining budget changed (`counters.budget_pressured`).
    pressured_decisions: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The greedy oracles' order: ready routes by the policy's key, then the others by it.
fn greedy_order(policy: &Policy, world: &World, a: &Arrival, t: f64) -> Vec<usize> {
    let key = |r: usize| {
        let spec = &ROUTES[r];
        let (cost, ttft) = (spec.cost(a.prompt, a.output), spec.median_ttft(a.prompt));
        match policy {
            Policy::GreedyCost => (cost, ttft),
            _ => (ttft, cost),
        }
    };
    let mut order: Vec<usize> = (0..N).collect();
    order.sort_by(|&x, &y| {
        world
            .ready(y, t)
            .cmp(&world.ready(x, t))
            .then(key(x).0.total_cmp(&key(y).0))
            .then(key(x).1.total_cmp(&key(y).1))
            .then(x.cmp(&y))
    });
    order
}

fn candidates() -> Vec<Candidate> {
    (0..N as u32)
        .map(|index| Candidate {
            index,
            weight: 1.0,
            priority: 0,
            availability: 1.0,
            circuit: CircuitState::Closed,
            prefill_backlog_tokens: 0,
            inflight_elephants: 0,
            uncached_prompt_tokens: 0,
            ttft_ms: None,
            latency_ms: None,
            inflight_requests: 0,
            affinity_pinned: false,
        })
        .collect()
}

/// The route table with the quota route's snapshot, as the host's refresh would push it.
fn with_snapshot(routes: &[Route], used: u64, limit: u64, at_ms: u64) -> Vec<Route> {
    let mut routes = routes.to_vec();
    let route = &mut routes[QUOTA_ROUTE];
    let mut metadata: serde_json::Value = serde_json::from_str(&route.metadata_json).unwrap();
    metadata["quota_snapshot"] =
        serde_json::json!({ "used": used, "limit": limit, "at_ms": at_ms });
    route.metadata_json = metadata.to_string();
    routes
}

/// Replays `arrivals` through `policy`. With `budget` (USD), every request is the one consumer's:
/// it is refused at arrival once the spend reached the limit, and otherwise carries the remaining
/// budget to the strategy; `spend` then receives `(seconds, cumulative USD)` at every charge (it
/// is filled without a budget too).
async fn run(
    name: &str,
    policy: &Policy,
    arrivals: &[Arrival],
    quota_limit: u64,
    budget: Option<f64>,
    spend: &mut Vec<(f64, f64)>,
) -> Summary {
    let mut world = World::new(quota_limit);
    let mut events: BinaryHeap<Event> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |events: &mut BinaryHeap<Event>, at: f64, request: usize, kind: EventKind| {
        seq += 1;
        events.push(Event {
            at,
            seq,
            request,
            kind,
        });
    };
    for (i, a) in arrivals.iter().enumerate() {
        push(&mut events, a.at, i, EventKind::Arrive);
    }
    let mut progress: Vec<Progress> = vec![Progress::default(); arrivals.len()];
    let mut ttft: Vec<Option<f64>> = vec![None; arrivals.len()];
    let mut served_by = [0usize; N];
    let (mut cost, mut failed, mut fallbacks) = (0.0, 0usize, 0usize);
    let (mut spent, mut refused, mut budget_gone_at) = (0.0, 0usize, None);
    let mut next_tick = 0.0;
    let mut next_snapshot = 0.0;
    let all = candidates();

    while let Some(event) = events.pop() {
        let t = event.at;
        let a = &arrivals[event.request];
        if let Policy::Strategy { router, routes } = policy {
            // Nothing changes between events, so the host's periodic calls that fell due since the
            // last event are made now, at the latest due time (one call stands for a run of them).
            if t >= next_snapshot {
                let due = next_snapshot
                    + ((t - next_snapshot) / SNAPSHOT_EVERY_S).floor() * SNAPSHOT_EVERY_S;
                let table = with_snapshot(routes, world.quota_used, quota_limit, ms(due));
                // A failure is counted in the router's stats and reported.
                let _ = router.refresh_upstreams(table).await;
                next_snapshot = due + SNAPSHOT_EVERY_S;
            }
            if t >= next_tick {
                let due = next_tick + ((t - next_tick) / TICK_EVERY_S).floor() * TICK_EVERY_S;
                router.tick(ms(due)).await;
                next_tick = due + TICK_EVERY_S;
            }
        }
        match event.kind {
            EventKind::Arrive => {
                if budget.is_some_and(|limit| limit - spent <= 0.0) {
                    refused += 1;
                    continue;
                }
                let p = &mut progress[event.request];
                match policy {
                    Policy::Strategy { router, .. } => {
                        let request = Request {
                            caller_hash: 0,
                            prompt_tokens: a.prompt,
                            max_tokens: None,
                            stream: true,
                            modalities: Modalities::empty(),
                            seed: a.seed,
                            now_ms: ms(t),
                            prefill: PrefillPolicy {
                                enabled: true,
                                intervene_tokens: 50_000,
                                elephant_tokens: 200_000,
                                elephant_limit: 1,
                            },
                            remaining_budget_usd: budget.map(|limit| limit - spent),
                        };
                        match router.select(&request, &all).await {
                            Ok(decision) => {
                                p.order = decision.order.iter().map(|&i| i as usize).collect();
                                p.metadata = decision.strategy_metadata;
                            }
                            // As the host does; counted in `strategy_failures`.
                            Err(_) => p.order = (0..N).collect(),
                        }
                    }
                    Policy::GreedyCost | Policy::GreedyLatency => {
                        p.order = greedy_order(policy, &world, a, t);
                    }
                }
                push(&mut events, t, event.request, EventKind::Attempt(0));
            }
            EventKind::Attempt(step) => {
                let r = progress[event.request].order[step];
                let spec = &ROUTES[r];
                let luck = a.luck[r];
                if step > 0 {
                    fallbacks += 1;
                }
                let p = &mut progress[event.request];
                p.attempt_start = t;
                if r == QUOTA_ROUTE && world.quota_used >= quota_limit {
                    push(
                        &mut events,
                        t + QUOTA_REFUSAL_S,
                        event.request,
                        EventKind::Finish { step, status: 429 },
                    );
                    continue;
                }
                if r == QUOTA_ROUTE {
                    world.quota_used += 1;
                    if world.quota_used == quota_limit {
                        world.quota_gone_at = Some(t);
                    }
                }
                if luck.fail < spec.failure_rate {
                    push(
                        &mut events,
                        t + luck.fail_after_s,
                        event.request,
                        EventKind::Finish { step, status: 500 },
                    );
                    continue;
                }
                let base = spec.ttft_median_s * (spec.ttft_sigma * luck.z).exp()
                    + f64::from(a.prompt) / spec.prefill_tps;
                let decode = f64::from(a.output) / spec.decode_tps;
                let start = if r == GPU_ROUTE {
                    // The earliest free slot, first come first served.
                    let slot = (0..GPU_SLOTS)
                        .min_by(|&x, &y| world.gpu_free_at[x].total_cmp(&world.gpu_free_at[y]))
                        .unwrap_or(0);
                    let start = world.gpu_free_at[slot].max(t);
                    world.gpu_free_at[slot] = start + base + decode;
                    start
                } else {
                    t
                };
                p.attempt_ttft = start - t + base;
                p.attempt_latency = p.attempt_ttft + decode;
                ttft[event.request] = Some(t + p.attempt_ttft - a.at);
                served_by[r] += 1;
                cost += spec.cost(a.prompt, a.output);
                push(
                    &mut events,
                    t + p.attempt_latency,
                    event.request,
                    EventKind::Finish { step, status: 200 },
                );
            }
            EventKind::Finish { step, status } => {
                let success = status == 200;
                let p = &progress[event.request];
                let r = p.order[step];
                if let Policy::Strategy { router, .. } = policy {
                    router
                        .observe(&Observation {
                            index: r as u32,
                            success,
                            ttft_ms: success.then_some(p.attempt_ttft * 1000.0),
                            latency_ms: if success {
                                p.attempt_latency * 1000.0
                            } else {
                                (t - p.attempt_start) * 1000.0
                            },
                            prompt_tokens: a.prompt,
                            completion_tokens: if success { a.output } else { 0 },
                            cached_prompt_tokens: 0,
                            status,
                            strategy_metadata: p.metadata.clone(),
                            now_ms: ms(t),
                        })
                        .await;
                }
                if success {
                    spent += ROUTES[r].cost(a.prompt, a.output);
                    spend.push((t, spent));
                    if budget_gone_at.is_none() && budget.is_some_and(|limit| spent >= limit) {
                        budget_gone_at = Some(t);
                    }
                }
                if !success {
                    if step + 1 < p.order.len() {
                        push(&mut events, t, event.request, EventKind::Attempt(step + 1));
                    } else {
                        failed += 1;
                    }
                }
            }
        }
    }

    let mut sorted: Vec<f64> = ttft.iter().flatten().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let violations = ttft.iter().filter(|t| t.is_none_or(|t| t > SLO_S)).count();
    let requests = arrivals.len().max(1);
    let pressured_decisions = match policy {
        Policy::Strategy { router, .. } => router.status().await["counters"]["budget_pressured"]
            .as_u64()
            .unwrap_or(0),
        _ => 0,
    };
    Summary {
        policy: name.to_owned(),
        requests: arrivals.len(),
        cost_usd: cost,
        ttft_mean_s: sorted.iter().sum::<f64>() / sorted.len().max(1) as f64,
        ttft_p50_s: percentile(&sorted, 0.5),
        ttft_p99_s: percentile(&sorted, 0.99),
        slo_violation_rate: violations as f64 / requests as f64,
        failed,
        fallbacks,
        share: ROUTES
            .iter()
            .zip(served_by)
            .map(|(spec, n)| RouteShare {
                route: spec.name.to_owned(),
                share: n as f64 / requests as f64,
            })
            .collect(),
        quota_gone_h: world.quota_gone_at.map(|t| t / 3_600.0),
        strategy_failures: match policy {
            Policy::Strategy { router, .. } => router
                .stats
                .failures
                .load(std::sync::atomic::Ordering::Relaxed),
            _ => 0,
        },
        budget: budget.map(|limit_usd| BudgetOutcome {
            limit_usd,
            admitted: arrivals.len() - refused,
            refused,
            spent_usd: spent,
            gone_h: budget_gone_at.map(|t| t / 3_600.0),
            pressured_decisions,
        }),
    }
}

/// The cumulative spend at `t` seconds from a run's `(seconds, cumulative USD)` charges.
fn spend_at(spend: &[(f64, f64)], t: f64) -> f64 {
    let i = spend.partition_point(|&(at, _)| at <= t);
    if i == 0 { 0.0 } else { spend[i - 1].1 }
}

/// A bar of `width` characters for `value` out of `full`.
fn bar(value: f64, full: f64, width: usize) -> String {
    let filled = ((value / full).clamp(0.0, 1.0) * width as f64).round() as usize;
    format!("{}{}", "█".repeat(filled), "·".repeat(width - filled))
}

/// The budget scenario's tables: one row per policy, then the cumulative spend over the day.
fn print_budget(summaries: &[Summary], spends: &[Vec<(f64, f64)>], hours: f64) {
    let Some(limit) = summaries
        .iter()
        .find_map(|s| s.budget.as_ref().map(|b| b.limit_usd))
    else {
        return;
    };
    println!(
        "\nBudget scenario: one consumer, daily budget {limit:.2} USD (RouteWise α=0.75 without pressure spends it in {:.0} % of the day); refused = the host's 402\n",
        BUDGET_GONE_SHARE * 100.0
    );
    println!(
        "| policy | served | refused (budget) | failed | cost (USD) | TTFT mean | TTFT p99 | budget gone at | decisions pressured |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in summaries {
        let Some(b) = &s.budget else { continue };
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} s | {:.2} s | {} | {} |",
            s.policy,
            b.admitted - s.failed,
            b.refused,
            s.failed,
            b.spent_usd,
            s.ttft_mean_s,
            s.ttft_p99_s,
            b.gone_h
                .map_or_else(|| "never".to_owned(), |h| format!("{h:.1} h")),
            b.pressured_decisions,
        );
    }
    let step_h = hours / 12.0;
    let names: Vec<&str> = summaries
        .iter()
        .filter(|s| s.budget.is_some())
        .map(|s| s.policy.as_str())
        .collect();
    println!(
        "\nCumulative spend (USD; each bar is the budget, {limit:.2} USD)\n\n| hour | {} |",
        names
            .iter()
            .map(|n| format!("{n} | "))
            .collect::<String>()
            .trim_end_matches(" | ")
    );
    println!("|---:|{}", "---|".repeat(names.len()));
    for row in 1..=12 {
        let t = f64::from(row) * step_h * 3_600.0;
        let cells: Vec<String> = spends
            .iter()
            .map(|spend| {
                let spent = spend_at(spend, t);
                format!("`{}` {spent:.2}", bar(spent, limit, 20))
            })
            .collect();
        println!("| {:.1} | {} |", f64::from(row) * step_h, cells.join(" | "));
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `-- --quick` shortens the day.
    let quick = std::env::args().any(|a| a == "--quick");
    let hours = if quick { 4.0 } else { 24.0 };
    let seconds = hours * 3_600.0;
    // The quota keeps its share of the traffic when the run is shorter than a day.
    let quota_limit = (QUOTA_PER_DAY as f64 * hours / 24.0).round() as u64;
    let arrivals = workload(seconds, SEED);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let (summaries, budget_summaries, spends) = runtime.block_on(async {
        let (policies, budget_policies) = build_policies(quota_limit).await;
        let mut summaries = Vec::new();
        for (spec, policy) in POLICIES.iter().zip(&policies) {
            let mut spend = Vec::new();
            summaries.push(run(spec.name, policy, &arrivals, quota_limit, None, &mut spend).await);
        }
        // The budget: what α = 0.75 without pressure spends in the first 60 % of the run.
        let mut calibration = Vec::new();
        let calibration_policy = BUDGET_POLICIES.len() - 1;
        run(
            BUDGET_POLICIES[calibration_policy].name,
            &budget_policies[calibration_policy],
            &arrivals,
            quota_limit,
            None,
            &mut calibration,
        )
        .await;
        let limit = spend_at(&calibration, seconds * BUDGET_GONE_SHARE);
        let (mut budget_summaries, mut spends) = (Vec::new(), Vec::new());
        for (spec, policy) in BUDGET_POLICIES
            .iter()
            .zip(&budget_policies)
            .take(calibration_policy)
        {
            let mut spend = Vec::new();
            budget_summaries.push(
                run(
                    spec.name,
                    policy,
                    &arrivals,
                    quota_limit,
                    Some(limit),
                    &mut spend,
                )
                .await,
            );
            spends.push(spend);
        }
        (summaries, budget_summaries, spends)
    });
    println!(
        "RouteWise simulation: {} requests over {hours} h (seed {SEED}), quota {quota_limit} requests, {GPU_SLOTS} GPU slots, SLO {SLO_S} s; {:.1} s wall\n",
        arrivals.len(),
        started.elapsed().as_secs_f64()
    );
    let names: Vec<&str> = ROUTES.iter().map(|r| r.name).collect();
    println!(
        "| policy | cost (USD) | TTFT mean | TTFT p50 | TTFT p99 | TTFT > {SLO_S} s | {} | failed | quota gone at |",
        names.join(" | ")
    );
    println!(
        "|---|---:|---:|---:|---:|---:|{}---:|---:|",
        "---:|".repeat(N)
    );
    for s in &summaries {
        let shares: Vec<String> = s
            .share
            .iter()
            .map(|r| format!("{:.1} %", r.share * 100.0))
            .collect();
        println!(
            "| {} | {:.2} | {:.2} s | {:.2} s | {:.2} s | {:.1} % | {} | {} | {} |",
            s.policy,
            s.cost_usd,
            s.ttft_mean_s,
            s.ttft_p50_s,
            s.ttft_p99_s,
            s.slo_violation_rate * 100.0,
            shares.join(" | "),
            s.failed,
            s.quota_gone_h
                .map_or_else(|| "–".to_owned(), |h| format!("{h:.1} h"))
        );
    }
    print_budget(&budget_summaries, &spends, hours);
    let failures: u64 = summaries
        .iter()
        .chain(&budget_summaries)
        .map(|s| s.strategy_failures)
        .sum();
    if failures > 0 {
        println!(
            "\nwarning: {failures} strategy calls failed (those requests used declared order)"
        );
    }
    let out = target_dir().join("routewise_sim.json");
    let all: Vec<&Summary> = summaries.iter().chain(&budget_summaries).collect();
    if let Ok(json) = serde_json::to_string_pretty(&all) {
        let _ = std::fs::write(&out, json);
        println!("\nwritten to {}", out.display());
    }
}
