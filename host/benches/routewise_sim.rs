//! A simulation in the spirit of the published RouteWise evaluation (BurstGPT, 24 h, SLO 3 s),
//! driven through the real strategy engine in virtual time.
//!
//! One model with five routes: a subscription plan with a daily request quota (and a monthly fee),
//! own GPUs with a fixed number of concurrent slots, and three pay-per-token providers (cheap with a
//! heavy TTFT tail, a middle one, fast and expensive). Traffic is bursty (Poisson within on/off
//! periods, about 14 000 requests a day, the published trace's size) with varied prompt and output
//! lengths. The policies see the same requests and the same per-route luck (common random numbers):
//!
//! - RouteWise at `budget_alpha` 0, 0.5 and 1 as shipped in `config/examples/models.routewise.yaml`
//!   (`latency_hedge_mode: probability_target`, `routewise_probe_enabled: true`), and `fixed`
//!   (every route weight 1, `fallback_order: weighted`): the real `routewise.wasm` and `fixed.wasm`
//!   behind `ModelRouter` — `select`, `observe` with TTFT, latency, tokens, status and the
//!   decision's strategy metadata, `tick`, a `refresh-upstreams` carrying the quota snapshot every
//!   60 s, the decision's hedge raced as the host races it, and the host's prober;
//! - three baselines that act on what a real router knows — prices, the GPUs' declared slot count
//!   against their own requests in flight, the latencies they observed and the 429s and 5xx they
//!   received, nothing else: greedy-cost (cheapest first), greedy-latency (lowest mean of its last
//!   observed TTFTs, untried routes first) and an OpenRouter-style latency sort (the providers it
//!   observed in the last 5 minutes by median TTFT, the others by price, a provider that failed in
//!   the last 30 s last). Greedy-cost and greedy-latency bench a route for 30 s after a 429 or 5xx.
//!
//! Each of several workload seeds is a fresh day with fresh routers; the report gives the mean and
//! standard deviation over the seeds, each ordering claim of the published evaluation with the
//! number of seeds it holds in, and the per-seed rows in `routewise_sim.json`.
//!
//! A second scenario (first seed only) gives all the traffic to one consumer with a daily budget,
//! passed to the strategy as the request's remaining budget as the host does (refused once it is
//! spent), and compares RouteWise α = 0.75 with budget pressure (the default
//! `budget_pressure_requests` 20, and 2 000) and without (`budget_pressure_requests: 0`). The
//! budget is what α = 0.75 without pressure spends in the first 60 % of the day (measured by a
//! third, unbudgeted run).
//!
//! Run: `cargo xtask build-strategies && cargo bench --profile dev -p switchyard --bench
//! routewise_sim` (`-- --quick` for 4-hour days and two seeds). Prints markdown tables and writes
//! `routewise_sim.json` to the target directory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
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

/// Workload seeds: each one's arrivals, sizes, per-route luck and strategy seeds derive from it.
const SEEDS: [u64; 5] = [11, 12, 13, 14, 15];
/// Virtual start: 2026-01-01T00:00:00Z, the start of the quota day.
const T0_MS: u64 = 1_767_225_600_000;
/// The SLO the report counts violations of (the published evaluation's).
const SLO_S: f64 = 3.0;
/// Requests per quota day the plan allows (scaled down with a shorter run).
const QUOTA_PER_DAY: u64 = 2_000;
/// The plan's subscription fee, prorated over the run and added to every policy's cost.
const PLAN_FEE_USD_PER_MONTH: f64 = 20.0;
/// Concurrent requests the own GPUs serve; more wait first-in first-out.
const GPU_SLOTS: usize = 4;
/// How often the host would refresh the quota snapshot (`quota_snapshot_refresh_interval_sec`).
const SNAPSHOT_EVERY_S: f64 = 60.0;
/// The host's default tick interval.
const TICK_EVERY_S: f64 = 1.0;
/// How long an over-quota request takes to be refused (429).
const QUOTA_REFUSAL_S: f64 = 0.15;
/// The prober's defaults (`routewise_probe_interval_sec`, `routewise_probe_idle_threshold_sec`).
const PROBE_EVERY_S: f64 = 300.0;
const PROBE_IDLE_S: f64 = 900.0;
/// A probe is a one-token `ping`: about this many prompt tokens.
const PROBE_PROMPT_TOKENS: u32 = 8;
/// Greedy-cost and greedy-latency leave a route that answered 429 or 5xx alone this long.
const GREEDY_COOLDOWN_S: f64 = 30.0;
/// Greedy-latency ranks by the mean of this many last observed TTFTs per route.
const GREEDY_LATENCY_SAMPLES: usize = 10;
/// The latency sort ranks providers by their median TTFT over this window...
const SORT_WINDOW_S: f64 = 300.0;
/// ...and puts a provider that failed this recently last.
const SORT_OUTAGE_S: f64 = 30.0;
/// The greedy baselines guess this many completion tokens to rank per-token prices (the order of
/// the three on-demand routes does not depend on it: their prices share one ratio).
const GUESSED_OUTPUT_TOKENS: u32 = 250;
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

fn luck(rng: &mut StdRng) -> Luck {
    Luck {
        z: normal(rng),
        fail: rng.random(),
        fail_after_s: rng.random_range(0.2..2.0),
    }
}

/// Bursty traffic: a quiet state (0.075 requests/s, mean 10 min) alternating with bursts (0.75
/// requests/s, mean 90 s), about 14 000 requests a day like the published BurstGPT day; prompts
/// lognormal around 1 500 tokens (50–100 000), outputs around 250 (1–4 000).
fn workload(seconds: f64, seed: u64) -> Vec<Arrival> {
    const QUIET_RATE: f64 = 0.075;
    const BURST_RATE: f64 = 0.75;
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
        let luck = std::array::from_fn(|_| luck(&mut rng));
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

/// How one attempt ends, decided when it starts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    /// Refused (429) or failed (5xx) at `at`, before any token.
    Fail { at: f64, status: u16 },
    /// First token at `first_token`, last at `done`.
    Serve { first_token: f64, done: f64 },
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

    /// Sends `prompt`/`output` to `route` at `t` with `luck`: the plan refuses once its quota is
    /// used (a 429, which does not count), a failing attempt fails before any token, and the GPUs
    /// queue beyond their slots. Returns the outcome and the GPU slot taken (with its start).
    fn start(
        &mut self,
        route: usize,
        prompt: u32,
        output: u32,
        luck: Luck,
        t: f64,
    ) -> (Outcome, Option<(usize, f64)>) {
        let spec = &ROUTES[route];
        if route == QUOTA_ROUTE {
            if self.quota_used >= self.quota_limit {
                let at = t + QUOTA_REFUSAL_S;
                return (Outcome::Fail { at, status: 429 }, None);
            }
            self.quota_used += 1;
            if self.quota_used == self.quota_limit {
                self.quota_gone_at = Some(t);
            }
        }
        if luck.fail < spec.failure_rate {
            let at = t + luck.fail_after_s;
            return (Outcome::Fail { at, status: 500 }, None);
        }
        let base = spec.ttft_median_s * (spec.ttft_sigma * luck.z).exp()
            + f64::from(prompt) / spec.prefill_tps;
        let decode = f64::from(output) / spec.decode_tps;
        let (start, slot) = if route == GPU_ROUTE {
            // The earliest free slot, first come first served.
            let slot = (0..GPU_SLOTS)
                .min_by(|&x, &y| self.gpu_free_at[x].total_cmp(&self.gpu_free_at[y]))
                .unwrap_or(0);
            let start = self.gpu_free_at[slot].max(t);
            self.gpu_free_at[slot] = start + base + decode;
            (start, Some((slot, start)))
        } else {
            (t, None)
        };
        let first_token = start + base;
        (
            Outcome::Serve {
                first_token,
                done: first_token + decode,
            },
            slot,
        )
    }

    /// A cancelled GPU attempt frees its slot at `t`, unless another request was queued behind it.
    fn cancel(&mut self, slot: Option<(usize, f64)>, done: f64, t: f64) {
        if let Some((slot, start)) = slot
            && self.gpu_free_at[slot] == done
        {
            self.gpu_free_at[slot] = t.max(start);
        }
    }
}

/// What a real (non-learning or simply learning) router knows: its own observations.
#[derive(Debug, Default)]
struct Seen {
    /// Per route: (end time, TTFT s) of its successful attempts, newest last, at most a window's.
    ttft: [VecDeque<(f64, f64)>; N],
    /// Per route: when it last answered 429 or 5xx.
    failed_at: [Option<f64>; N],
    /// Attempts in flight on the GPUs (the router's own, against their declared slot count).
    gpu_in_flight: usize,
}

impl Seen {
    fn success(&mut self, route: usize, ttft: f64, t: f64) {
        let samples = &mut self.ttft[route];
        samples.push_back((t, ttft));
        while samples.len() > 10_000 || samples.front().is_some_and(|&(at, _)| at < t - 3_600.0) {
            samples.pop_front();
        }
    }

    /// Mean of the last [`GREEDY_LATENCY_SAMPLES`] TTFTs; 0 for a route never tried (greedy
    /// latency routers try those first).
    fn recent_mean(&self, route: usize) -> f64 {
        let samples = &self.ttft[route];
        let n = samples.len().min(GREEDY_LATENCY_SAMPLES);
        if n == 0 {
            return 0.0;
        }
        samples.iter().rev().take(n).map(|&(_, v)| v).sum::<f64>() / n as f64
    }

    /// Median TTFT over the last [`SORT_WINDOW_S`]; `None` for a provider not observed in it.
    fn window_median(&self, route: usize, t: f64) -> Option<f64> {
        let mut v: Vec<f64> = self.ttft[route]
            .iter()
            .filter(|&&(at, _)| at >= t - SORT_WINDOW_S)
            .map(|&(_, v)| v)
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    fn failed_within(&self, route: usize, t: f64, seconds: f64) -> bool {
        self.failed_at[route].is_some_and(|at| t - at < seconds)
    }

    fn gpus_full(&self) -> bool {
        self.gpu_in_flight >= GPU_SLOTS
    }
}

/// How a policy orders the routes.
enum Policy {
    /// A wasm strategy behind the host's `ModelRouter`; `probes` runs the host's prober for it.
    Strategy {
        router: Arc<ModelRouter>,
        routes: Vec<Route>,
        probes: bool,
    },
    GreedyCost,
    GreedyLatency,
    LatencySort,
}

#[derive(Clone, Copy)]
enum PolicyKind {
    /// A built-in strategy, its `router_params` in YAML; every route has weight 1.
    Strategy(&'static str, &'static str),
    GreedyCost,
    GreedyLatency,
    LatencySort,
}

struct PolicySpec {
    name: &'static str,
    kind: PolicyKind,
}

/// RouteWise as `config/examples/models.routewise.yaml` ships it: hedging and probes on.
const POLICIES: [PolicySpec; 7] = [
    PolicySpec {
        name: "RouteWise α=0",
        kind: PolicyKind::Strategy(
            "routewise",
            "{ budget_alpha: 0, latency_hedge_mode: probability_target, routewise_probe_enabled: true }",
        ),
    },
    PolicySpec {
        name: "RouteWise α=0.5",
        kind: PolicyKind::Strategy(
            "routewise",
            "{ budget_alpha: 0.5, latency_hedge_mode: probability_target, routewise_probe_enabled: true }",
        ),
    },
    PolicySpec {
        name: "RouteWise α=1",
        kind: PolicyKind::Strategy(
            "routewise",
            "{ budget_alpha: 1, latency_hedge_mode: probability_target, routewise_probe_enabled: true }",
        ),
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
        name: "latency sort (OpenRouter-style)",
        kind: PolicyKind::LatencySort,
    },
    PolicySpec {
        name: "fixed (weighted)",
        kind: PolicyKind::Strategy("fixed", "{ fallback_order: weighted }"),
    },
];

/// The published evaluation's four policies, by position in [`POLICIES`].
const RW0: usize = 0;
const RW1: usize = 2;
const GREEDY_COST: usize = 3;
const GREEDY_LATENCY: usize = 4;

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

/// One config holding, for each group, a model per strategy policy, all with the same routes:
/// fresh routers for every group (a router learns during its run), one compilation of each
/// component for all of them.
async fn build_policies(quota_limit: u64, groups: &[&[PolicySpec]]) -> Vec<Vec<Policy>> {
    let routes = route_yaml(quota_limit);
    let mut yaml = format!(
        // A generous deadline: a call that times out on a busy machine would fall back to declared
        // order and make the run depend on the machine.
        "strategies:\n  builtin_dir: {}\n  call_timeout_ms: 1000\n  tick_interval_ms: 0\nmodels:\n",
        target_dir().join("strategies").display()
    );
    for (g, specs) in groups.iter().enumerate() {
        for (i, policy) in specs.iter().enumerate() {
            if let PolicyKind::Strategy(router, params) = policy.kind {
                yaml += &format!(
                    "  - id: g{g}p{i}\n    router: {router}\n    router_params: {params}\n    route:\n{routes}"
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
    groups
        .iter()
        .enumerate()
        .map(|(g, specs)| {
            specs
                .iter()
                .enumerate()
                .map(|(i, policy)| match policy.kind {
                    PolicyKind::Strategy(_, params) => {
                        let model = routing.table.resolve(&format!("g{g}p{i}")).unwrap();
                        Policy::Strategy {
                            router: model.router.clone(),
                            routes: upstream_table(model.upstreams()),
                            probes: params.contains("routewise_probe_enabled: true"),
                        }
                    }
                    PolicyKind::GreedyCost => Policy::GreedyCost,
                    PolicyKind::GreedyLatency => Policy::GreedyLatency,
                    PolicyKind::LatencySort => Policy::LatencySort,
                })
                .collect()
        })
        .collect()
}

fn ms(t: f64) -> u64 {
    T0_MS + (t * 1000.0).round() as u64
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum EventKind {
    Arrive,
    /// Send step `k` of the request's order.
    Attempt(usize),
    /// The request's hedge timer.
    Hedge,
    /// An attempt (by id) produced its first token, failed, or finished.
    FirstToken(usize),
    Fail(usize),
    Done(usize),
    /// The prober's periodic look for an idle endpoint.
    Probe,
    /// A probe of `route` ended.
    ProbeEnd {
        route: usize,
        started: f64,
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

/// One attempt of a request (or of a hedge).
#[derive(Debug, Clone, Copy)]
struct Attempt {
    request: usize,
    route: usize,
    start: f64,
    outcome: Outcome,
    gpu: Option<(usize, f64)>,
    cancelled: bool,
    ended: bool,
}

/// One request's progress.
#[derive(Debug, Clone, Default)]
struct Progress {
    order: Vec<usize>,
    metadata: String,
    /// The decision's hedge: (seconds after the primary was sent, backup route).
    hedge: Option<(f64, usize)>,
    /// The order step in flight (the hedge backup is not a step).
    step: usize,
    /// The primary attempt's id, while the hedge may still fire.
    primary: Option<usize>,
    /// The backup's route once the hedge fired; it is not tried again as a fallback.
    hedged: Option<usize>,
    /// Attempts still running.
    running: Vec<usize>,
    /// A first token arrived.
    resolved: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
struct RouteShare {
    route: String,
    share: f64,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
struct Summary {
    policy: String,
    seed: u64,
    requests: usize,
    /// Everything: served on-demand requests, cancelled hedges, probes and the prorated plan fee.
    cost_usd: f64,
    /// Of which: the plan's fee prorated over the run.
    plan_fee_usd: f64,
    /// Of which: hedge attempts cancelled because the other side answered first (their prompt).
    hedge_waste_usd: f64,
    /// Of which: probes.
    probe_usd: f64,
    ttft_mean_s: f64,
    ttft_p50_s: f64,
    ttft_p99_s: f64,
    /// Share of requests whose TTFT exceeded the SLO, failed requests included.
    slo_violation_rate: f64,
    failed: usize,
    /// Attempts after the first one (fallbacks; hedges not included).
    fallbacks: usize,
    /// Request attempts the plan refused with 429 (probes not included).
    rate_limited: usize,
    /// Hedges sent, and those whose backup answered first.
    hedges: usize,
    hedges_won: usize,
    probes: usize,
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
#[derive(Debug, Default, Clone, serde::Serialize)]
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

/// A baseline's order from what it observed: routes it would not send to now (benched after a
/// 429/5xx, or the GPUs full of its own requests) go last, in the same key order.
fn baseline_order(policy: &Policy, seen: &Seen, a: &Arrival, t: f64) -> Vec<usize> {
    let price = |r: usize| ROUTES[r].cost(a.prompt, GUESSED_OUTPUT_TOKENS);
    let held_back = |r: usize| {
        let failed = match policy {
            Policy::LatencySort => seen.failed_within(r, t, SORT_OUTAGE_S),
            _ => seen.failed_within(r, t, GREEDY_COOLDOWN_S),
        };
        failed || (r == GPU_ROUTE && seen.gpus_full())
    };
    let key = |r: usize| -> (f64, f64) {
        match policy {
            Policy::GreedyCost => (price(r), seen.recent_mean(r)),
            Policy::GreedyLatency => (seen.recent_mean(r), price(r)),
            // Observed providers by median (a TTFT, below any price key of the others, which are
            // offset past every latency), the others by price.
            _ => match seen.window_median(r, t) {
                Some(median) => (median, 0.0),
                None => (1e9 + price(r), 0.0),
            },
        }
    };
    let mut order: Vec<usize> = (0..N).collect();
    order.sort_by(|&x, &y| {
        held_back(x)
            .cmp(&held_back(y))
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

/// What `run` needs to know about the day.
#[derive(Clone, Copy)]
struct Day {
    seed: u64,
    seconds: f64,
    quota_limit: u64,
}

/// Replays `arrivals` through `policy`. With `budget` (USD), every request is the one consumer's:
/// it is refused at arrival once the spend reached the limit, and otherwise carries the remaining
/// budget to the strategy; `spend` then receives `(seconds, cumulative USD)` at every charge (it
/// is filled without a budget too).
async fn run(
    name: &str,
    policy: &Policy,
    arrivals: &[Arrival],
    day: Day,
    budget: Option<f64>,
    spend: &mut Vec<(f64, f64)>,
) -> Summary {
    let quota_limit = day.quota_limit;
    let mut world = World::new(quota_limit);
    let mut seen = Seen::default();
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
    let (router, routes, probes) = match policy {
        Policy::Strategy {
            router,
            routes,
            probes,
        } => (Some(router), Some(routes), *probes),
        _ => (None, None, false),
    };
    if probes {
        push(&mut events, PROBE_EVERY_S, usize::MAX, EventKind::Probe);
    }
    // The prober's own luck, apart from the requests' (the baselines send no probes).
    let mut probe_rng = StdRng::seed_from_u64(day.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut progress: Vec<Progress> = vec![Progress::default(); arrivals.len()];
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut ttft: Vec<Option<f64>> = vec![None; arrivals.len()];
    let mut served_by = [0usize; N];
    // When an attempt last ended on each route (the prober's idleness), from the router's start.
    let mut last_end = [0.0f64; N];
    let mut s = Summary {
        policy: name.to_owned(),
        seed: day.seed,
        requests: arrivals.len(),
        plan_fee_usd: PLAN_FEE_USD_PER_MONTH * day.seconds / (30.0 * 86_400.0),
        ..Summary::default()
    };
    let (mut spent, mut refused, mut budget_gone_at) = (0.0, 0usize, None);
    let mut next_tick = 0.0;
    let mut next_snapshot = 0.0;
    let all = candidates();

    while let Some(event) = events.pop() {
        let t = event.at;
        if let (Some(router), Some(routes)) = (router, routes) {
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
                let a = &arrivals[event.request];
                if budget.is_some_and(|limit| limit - spent <= 0.0) {
                    refused += 1;
                    continue;
                }
                let p = &mut progress[event.request];
                match router {
                    Some(router) => {
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
                                // As the host: a hedge naming the primary is ignored.
                                p.hedge = decision
                                    .hedge
                                    .map(|h| (f64::from(h.after_ms) / 1000.0, h.backup as usize))
                                    .filter(|&(_, b)| p.order.first() != Some(&b));
                            }
                            // As the host does; counted in `strategy_failures`.
                            Err(_) => p.order = (0..N).collect(),
                        }
                    }
                    None => p.order = baseline_order(policy, &seen, a, t),
                }
                push(&mut events, t, event.request, EventKind::Attempt(0));
            }
            EventKind::Attempt(step) => {
                let a = &arrivals[event.request];
                let p = &mut progress[event.request];
                let r = p.order[step];
                p.step = step;
                if step > 0 {
                    s.fallbacks += 1;
                }
                let id =
                    start_attempt(&mut world, &mut seen, &mut attempts, event.request, a, r, t);
                p.running.push(id);
                if step == 0
                    && let Some((after, _)) = p.hedge
                {
                    p.primary = Some(id);
                    push(&mut events, t + after, event.request, EventKind::Hedge);
                }
                push_outcome(&mut push, &mut events, &attempts[id], id);
            }
            EventKind::Hedge => {
                let a = &arrivals[event.request];
                let p = &mut progress[event.request];
                // Only while the primary is still silent and running.
                let waiting = p.primary.is_some_and(|id| !attempts[id].ended);
                if p.resolved || !waiting || p.hedged.is_some() {
                    continue;
                }
                let Some((_, backup)) = p.hedge else { continue };
                p.hedged = Some(backup);
                s.hedges += 1;
                let id = start_attempt(
                    &mut world,
                    &mut seen,
                    &mut attempts,
                    event.request,
                    a,
                    backup,
                    t,
                );
                p.running.push(id);
                push_outcome(&mut push, &mut events, &attempts[id], id);
            }
            EventKind::FirstToken(id) => {
                if attempts[id].cancelled {
                    continue;
                }
                let request = attempts[id].request;
                let a = &arrivals[request];
                let p = &mut progress[request];
                p.resolved = true;
                ttft[request] = Some(t - a.at);
                served_by[attempts[id].route] += 1;
                if p.hedged.is_some() && p.primary != Some(id) {
                    s.hedges_won += 1;
                }
                // The first token wins: the other side is cancelled, unobserved; its prompt is
                // charged (a provider bills the prefill it started).
                for other in std::mem::take(&mut p.running) {
                    if other == id {
                        continue;
                    }
                    let loser = &mut attempts[other];
                    loser.cancelled = true;
                    loser.ended = true;
                    s.hedge_waste_usd += ROUTES[loser.route].cost(a.prompt, 0);
                    if let Outcome::Serve { done, .. } = loser.outcome {
                        world.cancel(loser.gpu, done, t);
                    }
                    if loser.route == GPU_ROUTE {
                        seen.gpu_in_flight -= 1;
                    }
                }
                p.running = vec![id];
                if router.is_none() {
                    seen.success(attempts[id].route, t - attempts[id].start, t);
                }
                if let Outcome::Serve { done, .. } = attempts[id].outcome {
                    push(&mut events, done, request, EventKind::Done(id));
                }
            }
            EventKind::Fail(id) | EventKind::Done(id) => {
                if attempts[id].cancelled {
                    continue;
                }
                let success = matches!(event.kind, EventKind::Done(_));
                let attempt = attempts[id];
                attempts[id].ended = true;
                let request = attempt.request;
                let a = &arrivals[request];
                let r = attempt.route;
                last_end[r] = t;
                if r == GPU_ROUTE {
                    seen.gpu_in_flight -= 1;
                }
                let status = match attempt.outcome {
                    Outcome::Fail { status, .. } => status,
                    Outcome::Serve { .. } => 200,
                };
                if status == 429 {
                    s.rate_limited += 1;
                }
                if !success && router.is_none() {
                    seen.failed_at[r] = Some(t);
                }
                if let Some(router) = router {
                    let first_token = match attempt.outcome {
                        Outcome::Serve { first_token, .. } => Some(first_token - attempt.start),
                        Outcome::Fail { .. } => None,
                    };
                    router
                        .observe(&Observation {
                            index: r as u32,
                            success,
                            ttft_ms: first_token.map(|v| v * 1000.0),
                            latency_ms: (t - attempt.start) * 1000.0,
                            prompt_tokens: a.prompt,
                            completion_tokens: if success { a.output } else { 0 },
                            cached_prompt_tokens: 0,
                            status,
                            strategy_metadata: progress[request].metadata.clone(),
                            now_ms: ms(t),
                        })
                        .await;
                }
                let p = &mut progress[request];
                p.running.retain(|&x| x != id);
                if success {
                    let cost = ROUTES[r].cost(a.prompt, a.output);
                    s.cost_usd += cost;
                    spent += cost;
                    spend.push((t, spent));
                    if budget_gone_at.is_none() && budget.is_some_and(|limit| spent >= limit) {
                        budget_gone_at = Some(t);
                    }
                } else if p.running.is_empty() {
                    // (While the other side of a hedge runs, it decides.)
                    let next = (p.step + 1..p.order.len()).find(|&k| Some(p.order[k]) != p.hedged);
                    match next {
                        Some(k) => push(&mut events, t, request, EventKind::Attempt(k)),
                        None => s.failed += 1,
                    }
                }
            }
            EventKind::Probe => {
                if t + PROBE_EVERY_S < day.seconds {
                    push(&mut events, t + PROBE_EVERY_S, usize::MAX, EventKind::Probe);
                }
                // The endpoint idle longest, if idle for the threshold.
                let Some(r) = (0..N)
                    .filter(|&r| t - last_end[r] >= PROBE_IDLE_S)
                    .min_by(|&x, &y| last_end[x].total_cmp(&last_end[y]).then(x.cmp(&y)))
                else {
                    continue;
                };
                // On the GPUs a probe waits for a slot like any request but does not hold one
                // (one token); it costs its tokens on a paid route and a request on the plan.
                let (outcome, gpu) =
                    world.start(r, PROBE_PROMPT_TOKENS, 1, luck(&mut probe_rng), t);
                if let Outcome::Serve { done, .. } = outcome {
                    world.cancel(gpu, done, t);
                }
                s.probes += 1;
                s.probe_usd += ROUTES[r].cost(PROBE_PROMPT_TOKENS, 1);
                attempts.push(Attempt {
                    request: usize::MAX,
                    route: r,
                    start: t,
                    outcome,
                    gpu: None,
                    cancelled: false,
                    ended: false,
                });
                let end = match outcome {
                    Outcome::Fail { at, .. } => at,
                    Outcome::Serve { done, .. } => done,
                };
                push(
                    &mut events,
                    end,
                    attempts.len() - 1,
                    EventKind::ProbeEnd {
                        route: r,
                        started: t,
                    },
                );
            }
            EventKind::ProbeEnd { route, started } => {
                last_end[route] = t;
                let outcome = attempts[event.request].outcome;
                if let Some(router) = router {
                    let (success, first_token, status) = match outcome {
                        Outcome::Serve { first_token, .. } => {
                            (true, Some(first_token - started), 200)
                        }
                        Outcome::Fail { status, .. } => (false, None, status),
                    };
                    // As the prober reports it: no strategy metadata.
                    router
                        .observe(&Observation {
                            index: route as u32,
                            success,
                            ttft_ms: first_token.map(|v| v * 1000.0),
                            latency_ms: (t - started) * 1000.0,
                            prompt_tokens: PROBE_PROMPT_TOKENS,
                            completion_tokens: u32::from(success),
                            cached_prompt_tokens: 0,
                            status,
                            strategy_metadata: String::new(),
                            now_ms: ms(t),
                        })
                        .await;
                }
            }
        }
    }

    let mut sorted: Vec<f64> = ttft.iter().flatten().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let violations = ttft.iter().filter(|t| t.is_none_or(|t| t > SLO_S)).count();
    let requests = arrivals.len().max(1);
    let pressured_decisions = match router {
        Some(router) => router.status().await["counters"]["budget_pressured"]
            .as_u64()
            .unwrap_or(0),
        None => 0,
    };
    s.cost_usd += s.hedge_waste_usd + s.probe_usd + s.plan_fee_usd;
    s.ttft_mean_s = sorted.iter().sum::<f64>() / sorted.len().max(1) as f64;
    s.ttft_p50_s = percentile(&sorted, 0.5);
    s.ttft_p99_s = percentile(&sorted, 0.99);
    s.slo_violation_rate = violations as f64 / requests as f64;
    s.share = ROUTES
        .iter()
        .zip(served_by)
        .map(|(spec, n)| RouteShare {
            route: spec.name.to_owned(),
            share: n as f64 / requests as f64,
        })
        .collect();
    s.quota_gone_h = world.quota_gone_at.map(|t| t / 3_600.0);
    s.strategy_failures = router.map_or(0, |router| {
        router
            .stats
            .failures
            .load(std::sync::atomic::Ordering::Relaxed)
    });
    s.budget = budget.map(|limit_usd| BudgetOutcome {
        limit_usd,
        admitted: arrivals.len() - refused,
        refused,
        spent_usd: spent,
        gone_h: budget_gone_at.map(|t| t / 3_600.0),
        pressured_decisions,
    });
    s
}

/// Sends `a` to `route` at `t`, recording the attempt; returns its id.
fn start_attempt(
    world: &mut World,
    seen: &mut Seen,
    attempts: &mut Vec<Attempt>,
    request: usize,
    a: &Arrival,
    route: usize,
    t: f64,
) -> usize {
    let (outcome, gpu) = world.start(route, a.prompt, a.output, a.luck[route], t);
    if route == GPU_ROUTE {
        seen.gpu_in_flight += 1;
    }
    attempts.push(Attempt {
        request,
        route,
        start: t,
        outcome,
        gpu,
        cancelled: false,
        ended: false,
    });
    attempts.len() - 1
}

/// Schedules the attempt's first token, or its failure.
fn push_outcome(
    push: &mut impl FnMut(&mut BinaryHeap<Event>, f64, usize, EventKind),
    events: &mut BinaryHeap<Event>,
    attempt: &Attempt,
    id: usize,
) {
    match attempt.outcome {
        Outcome::Fail { at, .. } => push(events, at, attempt.request, EventKind::Fail(id)),
        Outcome::Serve { first_token, .. } => {
            push(
                events,
                first_token,
                attempt.request,
                EventKind::FirstToken(id),
            );
        }
    }
}

fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// `mean ± sd` of one metric of one policy over the seeds, with `decimals` and a unit suffix.
fn cell(
    per_seed: &[Vec<Summary>],
    policy: usize,
    metric: impl Fn(&Summary) -> f64,
    decimals: usize,
    unit: &str,
) -> String {
    let values: Vec<f64> = per_seed.iter().map(|row| metric(&row[policy])).collect();
    let (mean, sd) = mean_sd(&values);
    format!("{mean:.decimals$} ± {sd:.decimals$}{unit}")
}

/// One claim of the published evaluation, checked on one seed's summaries (indexed as
/// [`POLICIES`]).
struct Claim {
    text: &'static str,
    published: &'static str,
    holds: fn(&[Summary]) -> bool,
}

const CLAIMS: [Claim; 9] = [
    Claim {
        text: "greedy-cost is the cheapest of the four",
        published: "$1.88 vs $2.18 / $4.26 / $4.35",
        holds: |s| {
            [RW0, RW1, GREEDY_LATENCY]
                .iter()
                .all(|&p| s[GREEDY_COST].cost_usd < s[p].cost_usd)
        },
    },
    Claim {
        text: "greedy-cost has the highest mean TTFT of the four",
        published: "\"the slowest\"",
        holds: |s| {
            [RW0, RW1, GREEDY_LATENCY]
                .iter()
                .all(|&p| s[GREEDY_COST].ttft_mean_s > s[p].ttft_mean_s)
        },
    },
    Claim {
        text: "greedy-cost's P99 is far outside the SLO (> 2 × 3 s)",
        published: "14.5 s",
        holds: |s| s[GREEDY_COST].ttft_p99_s > 2.0 * SLO_S,
    },
    Claim {
        text: "greedy-cost meets 429s from the exhausted plan",
        published: "2 831",
        holds: |s| s[GREEDY_COST].rate_limited > 0,
    },
    Claim {
        text: "RouteWise α=1 costs less than greedy-latency",
        published: "$4.26 vs $4.35",
        holds: |s| s[RW1].cost_usd < s[GREEDY_LATENCY].cost_usd,
    },
    Claim {
        text: "RouteWise α=1 has a lower mean TTFT than greedy-latency",
        published: "563 ms vs 676 ms",
        holds: |s| s[RW1].ttft_mean_s < s[GREEDY_LATENCY].ttft_mean_s,
    },
    Claim {
        text: "RouteWise α=0 costs between greedy-cost and α=1",
        published: "$1.88 < $2.18 < $4.26",
        holds: |s| s[GREEDY_COST].cost_usd < s[RW0].cost_usd && s[RW0].cost_usd < s[RW1].cost_usd,
    },
    Claim {
        text: "RouteWise α=0 keeps P99 within the SLO",
        published: "2.5 s",
        holds: |s| s[RW0].ttft_p99_s <= SLO_S,
    },
    Claim {
        text: "RouteWise α=0's P99 is below greedy-cost's",
        published: "2.5 s vs 14.5 s",
        holds: |s| s[RW0].ttft_p99_s < s[GREEDY_COST].ttft_p99_s,
    },
];

/// The published four, in ascending order of a metric's mean over the seeds.
fn ordering(per_seed: &[Vec<Summary>], metric: fn(&Summary) -> f64) -> String {
    let mut four: Vec<(usize, f64)> = [GREEDY_COST, RW0, RW1, GREEDY_LATENCY]
        .iter()
        .map(|&p| {
            let values: Vec<f64> = per_seed.iter().map(|row| metric(&row[p])).collect();
            (p, mean_sd(&values).0)
        })
        .collect();
    four.sort_by(|a, b| a.1.total_cmp(&b.1));
    let seeds_agreeing = per_seed
        .iter()
        .filter(|row| {
            four.windows(2)
                .all(|w| metric(&row[w[0].0]) <= metric(&row[w[1].0]))
        })
        .count();
    format!(
        "{} ({seeds_agreeing} of {} seeds in this order)",
        four.iter()
            .map(|(p, _)| POLICIES[*p].name)
            .collect::<Vec<_>>()
            .join(" < "),
        per_seed.len()
    )
}

fn print_comparison(per_seed: &[Vec<Summary>]) {
    println!(
        "| policy | cost (USD) | TTFT mean (s) | TTFT p99 (s) | TTFT > {SLO_S} s | 429s | hedges (backup won) | probes | plan | gpus | cheap | middle | fast | quota gone at |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (p, spec) in POLICIES.iter().enumerate() {
        let share = |r: usize| cell(per_seed, p, |s| s.share[r].share * 100.0, 1, " %");
        let gone: Vec<f64> = per_seed
            .iter()
            .filter_map(|row| row[p].quota_gone_h)
            .collect();
        let gone = if gone.is_empty() {
            "–".to_owned()
        } else {
            format!(
                "{:.1} h ({} of {})",
                mean_sd(&gone).0,
                gone.len(),
                per_seed.len()
            )
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} | {} |",
            spec.name,
            cell(per_seed, p, |s| s.cost_usd, 2, ""),
            cell(per_seed, p, |s| s.ttft_mean_s, 3, ""),
            cell(per_seed, p, |s| s.ttft_p99_s, 2, ""),
            cell(per_seed, p, |s| s.slo_violation_rate * 100.0, 1, " %"),
            cell(per_seed, p, |s| s.rate_limited as f64, 0, ""),
            cell(per_seed, p, |s| s.hedges as f64, 0, ""),
            cell(per_seed, p, |s| s.hedges_won as f64, 0, ""),
            cell(per_seed, p, |s| s.probes as f64, 0, ""),
            share(0),
            share(1),
            share(2),
            share(3),
            share(4),
            gone,
        );
    }
    println!(
        "\nOf the cost: the plan's prorated fee {:.2} USD for every policy; cancelled hedges and probes:",
        per_seed[0][0].plan_fee_usd
    );
    for (p, spec) in POLICIES
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s.kind, PolicyKind::Strategy("routewise", _)))
    {
        println!(
            "- {}: hedges {} USD, probes {} USD, failed requests {}",
            spec.name,
            cell(per_seed, p, |s| s.hedge_waste_usd, 3, ""),
            cell(per_seed, p, |s| s.probe_usd, 4, ""),
            cell(per_seed, p, |s| s.failed as f64, 1, ""),
        );
    }
    println!("\nOrderings of the published four (mean over the seeds):\n");
    println!("- cost: {}", ordering(per_seed, |s| s.cost_usd));
    println!("- TTFT mean: {}", ordering(per_seed, |s| s.ttft_mean_s));
    println!("- TTFT p99: {}", ordering(per_seed, |s| s.ttft_p99_s));
    println!(
        "- TTFT > {SLO_S} s: {}",
        ordering(per_seed, |s| s.slo_violation_rate)
    );
    println!("\n| published claim | published | holds in |\n|---|---|---:|");
    for claim in &CLAIMS {
        let n = per_seed.iter().filter(|row| (claim.holds)(row)).count();
        println!(
            "| {} | {} | {n} of {} seeds |",
            claim.text,
            claim.published,
            per_seed.len()
        );
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
    // `cargo bench` passes `--bench`; `-- --quick` shortens the day and takes two seeds.
    let quick = std::env::args().any(|a| a == "--quick");
    let hours = if quick { 4.0 } else { 24.0 };
    let seeds: &[u64] = if quick { &SEEDS[..2] } else { &SEEDS };
    let seconds = hours * 3_600.0;
    // The quota keeps its share of the traffic when the run is shorter than a day.
    let quota_limit = (QUOTA_PER_DAY as f64 * hours / 24.0).round() as u64;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let mut requests = Vec::new();
    let (per_seed, budget_summaries, spends) = runtime.block_on(async {
        let mut groups: Vec<&[PolicySpec]> = vec![&POLICIES[..]; seeds.len()];
        groups.push(&BUDGET_POLICIES[..]);
        let mut built = build_policies(quota_limit, &groups).await;
        let budget_policies = built.pop().unwrap_or_default();
        let mut per_seed: Vec<Vec<Summary>> = Vec::new();
        for (&seed, policies) in seeds.iter().zip(&built) {
            let arrivals = workload(seconds, seed);
            requests.push(arrivals.len());
            let day = Day {
                seed,
                seconds,
                quota_limit,
            };
            let mut row = Vec::new();
            for (spec, policy) in POLICIES.iter().zip(policies) {
                row.push(run(spec.name, policy, &arrivals, day, None, &mut Vec::new()).await);
            }
            per_seed.push(row);
        }
        // The budget scenario, on the first seed's day. The budget: what α = 0.75 without
        // pressure spends in the first 60 % of the run.
        let arrivals = workload(seconds, seeds[0]);
        let day = Day {
            seed: seeds[0],
            seconds,
            quota_limit,
        };
        let mut calibration = Vec::new();
        let calibration_policy = BUDGET_POLICIES.len() - 1;
        run(
            BUDGET_POLICIES[calibration_policy].name,
            &budget_policies[calibration_policy],
            &arrivals,
            day,
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
            budget_summaries
                .push(run(spec.name, policy, &arrivals, day, Some(limit), &mut spend).await);
            spends.push(spend);
        }
        (per_seed, budget_summaries, spends)
    });
    println!(
        "RouteWise simulation: {} seeds ({}) of {hours} h, {} requests each, quota {quota_limit} requests, {GPU_SLOTS} GPU slots, SLO {SLO_S} s, plan fee {PLAN_FEE_USD_PER_MONTH} USD/month; {:.1} s wall\n",
        seeds.len(),
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        requests
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(" / "),
        started.elapsed().as_secs_f64()
    );
    println!("Mean ± standard deviation over the seeds:\n");
    print_comparison(&per_seed);
    print_budget(&budget_summaries, &spends, hours);
    let failures: u64 = per_seed
        .iter()
        .flatten()
        .chain(&budget_summaries)
        .map(|s| s.strategy_failures)
        .sum();
    if failures > 0 {
        println!(
            "\nwarning: {failures} strategy calls failed (those requests used declared order)"
        );
    }
    let out = target_dir().join("routewise_sim.json");
    let all: Vec<&Summary> = per_seed.iter().flatten().chain(&budget_summaries).collect();
    if let Ok(json) = serde_json::to_string_pretty(&all) {
        let _ = std::fs::write(&out, json);
        println!("\nwritten to {}", out.display());
    }
}
