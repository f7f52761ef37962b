//! A simulation of a prefill-bound deployment, driven through the real routing pipeline.
//!
//! Four replicas each prefill uncached prompt tokens first-in first-out at a fixed rate and keep a
//! per-session prefix cache; time to first token is queueing plus the replica's own prefill. The
//! workload mixes small one-shot prompts, multi-turn sessions (continuations grow the prompt) and a
//! few elephant sessions (150k–400k tokens). Each request goes through `select_at` with the real
//! `fixed` component, the real prefill tracker and the real affinity table, in virtual time; leases
//! are released at the simulated first token.
//!
//! Run: `cargo xtask build-strategies && cargo bench -p switchyard --bench prefill_sim`
//! (`-- --quick` for a shorter run). Prints a markdown table and writes
//! `target/prefill_sim.json`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use switchyard::config::Config;
use switchyard::gateway::Routing;
use switchyard::routing::RoutingContext;
use switchyard::routing::prefill::PrefillLease;
use switchyard::routing::select::{RequestFacts, select_at};

const REPLICAS: usize = 4;
/// Uncached prompt tokens one replica prefills per second.
const PREFILL_TOKENS_PER_S: f64 = 20_000.0;
/// Prefix-cache capacity per replica, in tokens (least recently used sessions are evicted).
const CACHE_TOKENS: u64 = 2_000_000;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Small,
    FirstTurn,
    Continuation,
    Elephant,
}

#[derive(Debug, Clone)]
struct Arrival {
    at: f64,
    caller: Arc<str>,
    session: Option<u64>,
    prompt: u64,
    kind: Kind,
}

fn workload(seconds: f64, seed: u64) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(seed);
    let exp = |rate: f64, rng: &mut StdRng| -> f64 { -(1.0 - rng.random::<f64>()).ln() / rate };
    let mut arrivals = Vec::new();
    // One-shot small prompts from many callers.
    let mut t = 0.0;
    let mut n = 0u64;
    while t < seconds {
        t += exp(2.0, &mut rng);
        n += 1;
        arrivals.push(Arrival {
            at: t,
            caller: format!("oneshot-{n}").into(),
            session: None,
            prompt: rng.random_range(300..3_000),
            kind: Kind::Small,
        });
    }
    // Sessions: a first turn, then continuations that grow the prompt.
    let mut t = 0.0;
    let mut id = 0u64;
    while t < seconds {
        t += exp(0.3, &mut rng);
        id += 1;
        let elephant = rng.random_bool(0.03);
        let mut prompt: u64 = if elephant {
            rng.random_range(150_000..400_000)
        } else {
            rng.random_range(2_000..12_000)
        };
        let turns = 1 + (exp(1.0 / 5.0, &mut rng) as u32).min(20);
        let mut at = t;
        for turn in 0..turns {
            arrivals.push(Arrival {
                at,
                caller: format!("session-{id}").into(),
                session: Some(id),
                prompt,
                kind: match (turn, elephant) {
                    (0, true) => Kind::Elephant,
                    (0, false) => Kind::FirstTurn,
                    _ => Kind::Continuation,
                },
            });
            prompt += rng.random_range(300..3_000);
            at += 4.0 + exp(1.0 / 8.0, &mut rng);
        }
    }
    arrivals.retain(|a| a.at < seconds);
    arrivals.sort_by(|a, b| a.at.total_cmp(&b.at));
    arrivals
}

#[derive(Default)]
struct Replica {
    busy_until: f64,
    cache: HashMap<u64, u64>,
    lru: VecDeque<u64>,
    cached_tokens: u64,
}

impl Replica {
    fn uncached(&self, session: Option<u64>, prompt: u64) -> u64 {
        match session.and_then(|s| self.cache.get(&s)) {
            Some(&cached) if cached <= prompt => prompt - cached,
            _ => prompt,
        }
    }

    fn remember(&mut self, session: Option<u64>, prompt: u64) {
        let Some(s) = session else { return };
        if let Some(old) = self.cache.insert(s, prompt) {
            self.cached_tokens -= old;
            self.lru.retain(|x| *x != s);
        }
        self.cached_tokens += prompt;
        self.lru.push_back(s);
        while self.cached_tokens > CACHE_TOKENS {
            let Some(evict) = self.lru.pop_front() else {
                break;
            };
            if let Some(len) = self.cache.remove(&evict) {
                self.cached_tokens -= len;
            }
        }
    }
}

/// A lease released at the request's simulated first token.
struct Pending {
    first_token: f64,
    lease: PrefillLease,
    caller: Arc<str>,
    endpoint: String,
    prompt: u64,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.first_token == other.first_token
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        other.first_token.total_cmp(&self.first_token)
    }
}

struct Mode {
    name: &'static str,
    prefill_aware: bool,
    affinity: bool,
}

#[derive(Debug, Default, serde::Serialize)]
struct Summary {
    mode: String,
    requests: usize,
    p50_s: f64,
    p99_s: f64,
    mean_s: f64,
    small_p99_s: f64,
    continuation_p50_s: f64,
    prefilled_mtokens: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn strategies_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("strategies")
}

async fn run(mode: &Mode, arrivals: &[Arrival]) -> Summary {
    let routes: String = (0..REPLICAS)
        .map(|i| {
            format!(
                "      - kind: openai_compat\n        base_url: http://127.0.0.1:{}/v1\n",
                7100 + i
            )
        })
        .collect();
    let yaml = format!(
        "strategies:\n  builtin_dir: {}\nrouting:\n  affinity: {{ enabled: {} }}\n  prefill: {{ enabled: {} }}\nmodels:\n  - id: m\n    router: fixed\n    route:\n{routes}",
        strategies_dir().display(),
        mode.affinity,
        mode.prefill_aware
    );
    let config = Config::from_yaml(Path::new("prefill_sim.yaml"), &yaml, &|_| None).unwrap();
    let routing = Routing::build(&config, switchyard::gateway::DirLoad::Now)
        .await
        .unwrap();
    let ctx = RoutingContext::new(&config);
    let model = routing.table.resolve("m").unwrap().clone();
    let base = Instant::now();
    let at = |t: f64| base + Duration::from_secs_f64(t);

    let mut replicas: Vec<Replica> = (0..REPLICAS).map(|_| Replica::default()).collect();
    let mut pending: BinaryHeap<Pending> = BinaryHeap::new();
    let mut ttfts: Vec<(Kind, f64)> = Vec::with_capacity(arrivals.len());
    let mut prefilled = 0u64;
    for a in arrivals {
        // Everything that reached its first token before this arrival releases its lease and
        // leaves a warm-continuation hint, as the gateway does.
        while pending.peek().is_some_and(|p| p.first_token <= a.at) {
            let Some(p) = pending.pop() else { break };
            drop(p.lease);
            ctx.prefill
                .remember(Some(&p.caller), &p.endpoint, p.prompt, at(p.first_token));
        }
        let facts = RequestFacts {
            caller: Some(a.caller.clone()),
            caller_hash: 0,
            prompt_tokens: a.prompt.min(u64::from(u32::MAX)) as u32,
            max_tokens: None,
            stream: true,
            ..RequestFacts::default()
        };
        let plan = select_at(&model, &facts, &ctx, None, at(a.at))
            .await
            .unwrap();
        let route = &model.upstreams()[plan.order[0]];
        let r = route.index as usize;
        let estimate =
            ctx.prefill
                .uncached_estimate(Some(&a.caller), &route.endpoint_id, a.prompt, at(a.at));
        let lease = ctx
            .prefill
            .acquire(Some(a.caller.clone()), &route.endpoint_id, estimate);
        let replica = &mut replicas[r];
        let uncached = replica.uncached(a.session, a.prompt);
        prefilled += uncached;
        let start = replica.busy_until.max(a.at);
        let first_token = start + uncached as f64 / PREFILL_TOKENS_PER_S;
        replica.busy_until = first_token;
        replica.remember(a.session, a.prompt);
        ttfts.push((a.kind, first_token - a.at));
        pending.push(Pending {
            first_token,
            lease,
            caller: a.caller.clone(),
            endpoint: route.endpoint_id.clone(),
            prompt: a.prompt,
        });
    }
    let sorted = |filter: &dyn Fn(Kind) -> bool| {
        let mut v: Vec<f64> = ttfts
            .iter()
            .filter(|(k, _)| filter(*k))
            .map(|(_, t)| *t)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let all = sorted(&|_| true);
    let small = sorted(&|k| k == Kind::Small);
    let cont = sorted(&|k| k == Kind::Continuation);
    Summary {
        mode: mode.name.to_owned(),
        requests: all.len(),
        p50_s: percentile(&all, 0.5),
        p99_s: percentile(&all, 0.99),
        mean_s: all.iter().sum::<f64>() / all.len().max(1) as f64,
        small_p99_s: percentile(&small, 0.99),
        continuation_p50_s: percentile(&cont, 0.5),
        prefilled_mtokens: prefilled as f64 / 1e6,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `-- --quick` shortens the run.
    let quick = std::env::args().any(|a| a == "--quick");
    let seconds = if quick { 300.0 } else { 1800.0 };
    let arrivals = workload(seconds, 7);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let modes = [
        Mode {
            name: "weighted",
            prefill_aware: false,
            affinity: false,
        },
        Mode {
            name: "weighted + affinity",
            prefill_aware: false,
            affinity: true,
        },
        Mode {
            name: "prefill-aware",
            prefill_aware: true,
            affinity: false,
        },
        Mode {
            name: "prefill-aware + affinity",
            prefill_aware: true,
            affinity: true,
        },
    ];
    let summaries: Vec<Summary> = modes
        .iter()
        .map(|m| runtime.block_on(run(m, &arrivals)))
        .collect();
    println!(
        "prefill simulation: {REPLICAS} replicas at {PREFILL_TOKENS_PER_S} uncached tokens/s each, {} requests over {seconds} s (seed 7)\n",
        arrivals.len()
    );
    println!(
        "| routing | TTFT p50 | TTFT p99 | TTFT mean | small-prompt p99 | continuation p50 | tokens prefilled |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for s in &summaries {
        println!(
            "| {} | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.1} M |",
            s.mode,
            s.p50_s,
            s.p99_s,
            s.mean_s,
            s.small_p99_s,
            s.continuation_p50_s,
            s.prefilled_mtokens
        );
    }
    let out = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("prefill_sim.json");
    if let Ok(json) = serde_json::to_string_pretty(&summaries) {
        let _ = std::fs::write(&out, json);
        println!("\nwritten to {}", out.display());
    }
}
