//! Shadow mode: a second strategy (`router_shadow`) decides on a model's live traffic after the
//! real decision, off the request path, and is never acted on. What it would have done is compared
//! with what was done: how often its primary and its whole order agree, and what its `select`
//! costs.
//!
//! The request path only offers calls to a bounded queue (`strategies.shadow_queue`); a full queue
//! drops the call and counts it. One task per shadow drains the queue in order, so a stateful
//! shadow sees the model's traffic in the order it came. A shadow that traps or times out is
//! re-created by its router on the next call, exactly as a model's router is; the request it
//! shadowed was answered long before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::router::ModelRouter;
use super::types::{Candidate, Observation, Request, UpstreamInfo};
use crate::telemetry::metrics as telemetry;

/// Select latencies kept for the `/routing` percentiles (the most recent ones).
const LATENCY_WINDOW: usize = 1024;

/// One call waiting for the shadow.
enum Job {
    /// Decide for this request; `served` is the real strategy's order.
    Select {
        request: Request,
        candidates: Vec<Candidate>,
        served: Vec<u32>,
    },
    /// An attempt of the model finished. The real strategy's metadata is not the shadow's, so it
    /// goes without (as a replayed observation does).
    Observe(Observation),
    Tick(u64),
    Upstreams(Vec<UpstreamInfo>),
}

/// How the shadow's decisions compared with the real ones.
#[derive(Debug, Default)]
pub struct ShadowStats {
    /// Same order as the real decision (so the same primary too).
    pub same_order: AtomicU64,
    /// Same primary, another order behind it.
    pub same_primary: AtomicU64,
    pub different_primary: AtomicU64,
    /// The shadow trapped, timed out, erred or returned an invalid order.
    pub failed: AtomicU64,
    /// Calls dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Durations of the most recent selects, in microseconds (a ring of [`LATENCY_WINDOW`]).
    latencies: parking_lot::Mutex<(Vec<u32>, usize)>,
}

impl ShadowStats {
    fn latency(&self, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        let mut ring = self.latencies.lock();
        let (samples, next) = &mut *ring;
        if samples.len() < LATENCY_WINDOW {
            samples.push(micros);
        } else {
            samples[*next] = micros;
        }
        *next = (*next + 1) % LATENCY_WINDOW;
    }

    /// p50, p99 and max of the recent selects in microseconds, and how many there are.
    fn percentiles(&self) -> Option<(u32, u32, u32, usize)> {
        let mut samples = self.latencies.lock().0.clone();
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Some((at(0.5), at(0.99), at(1.0), samples.len()))
    }
}

/// A model's shadow strategy and the queue in front of it. Dropping it ends its task once the
/// queue is drained.
pub struct Shadow {
    pub router: Arc<ModelRouter>,
    pub stats: Arc<ShadowStats>,
    jobs: mpsc::Sender<Job>,
    capacity: usize,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow")
            .field("router", &self.router)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Shadow {
    /// Starts the shadow's task on the current runtime; at most `capacity` calls wait for it.
    pub fn start(router: ModelRouter, capacity: usize) -> Shadow {
        let router = Arc::new(router.into_shadow());
        let stats = Arc::new(ShadowStats::default());
        let (jobs, queue) = mpsc::channel(capacity.max(1));
        tokio::spawn(drain(router.clone(), stats.clone(), queue));
        Shadow {
            router,
            stats,
            jobs,
            capacity,
        }
    }

    fn offer(&self, job: Job) {
        if self.jobs.try_send(job).is_err() {
            // Full (or the task is gone): never wait on the request path.
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            telemetry::shadow_outcome(&self.router.model_id, &self.router.strategy.name, "dropped");
        }
    }

    /// Hands the shadow the request the real strategy just decided, and the order it chose.
    pub fn select(&self, request: &Request, candidates: &[Candidate], served: &[u32]) {
        self.offer(Job::Select {
            request: *request,
            candidates: candidates.to_vec(),
            served: served.to_vec(),
        });
    }

    /// Tells the shadow about a finished attempt (without the real strategy's metadata).
    pub fn observe(&self, observation: &Observation) {
        self.offer(Job::Observe(Observation {
            strategy_metadata: String::new(),
            ..observation.clone()
        }));
    }

    pub fn tick(&self, now_ms: u64) {
        self.offer(Job::Tick(now_ms));
    }

    /// Pushes a new upstream table to the shadow.
    pub fn refresh_upstreams(&self, upstreams: Vec<UpstreamInfo>) {
        self.offer(Job::Upstreams(upstreams));
    }

    /// What `/routing` shows about the shadow.
    pub fn report(&self) -> serde_json::Value {
        let s = &self.stats;
        let same_order = s.same_order.load(Ordering::Relaxed);
        let same_primary = same_order + s.same_primary.load(Ordering::Relaxed);
        let compared = same_primary + s.different_primary.load(Ordering::Relaxed);
        let ratio = |n: u64| (compared > 0).then(|| n as f64 / compared as f64);
        let latency = s.percentiles().map(|(p50, p99, max, samples)| {
            serde_json::json!({ "p50_us": p50, "p99_us": p99, "max_us": max, "samples": samples })
        });
        serde_json::json!({
            "router": self.router.strategy.name,
            "router_version": self.router.strategy.version,
            "compared": compared,
            "same_primary": same_primary,
            "same_order": same_order,
            "primary_agreement": ratio(same_primary),
            "order_agreement": ratio(same_order),
            "failed": s.failed.load(Ordering::Relaxed),
            "dropped": s.dropped.load(Ordering::Relaxed),
            "queue_capacity": self.capacity,
            "select_latency": latency,
            "last_failure": *self.router.stats.last_failure.lock(),
        })
    }
}

/// The shadow's task: one call at a time, in the order they were offered.
async fn drain(router: Arc<ModelRouter>, stats: Arc<ShadowStats>, mut queue: mpsc::Receiver<Job>) {
    while let Some(job) = queue.recv().await {
        match job {
            Job::Select {
                request,
                candidates,
                served,
            } => {
                let started = Instant::now();
                let result = router.select(&request, &candidates).await;
                stats.latency(started.elapsed());
                let outcome = match result {
                    Err(_) => {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        "failed"
                    }
                    Ok(decision) => match compare(&decision.order, &served) {
                        Agreement::SameOrder => {
                            stats.same_order.fetch_add(1, Ordering::Relaxed);
                            "same_order"
                        }
                        Agreement::SamePrimary => {
                            stats.same_primary.fetch_add(1, Ordering::Relaxed);
                            "same_primary"
                        }
                        Agreement::DifferentPrimary => {
                            stats.different_primary.fetch_add(1, Ordering::Relaxed);
                            "different_primary"
                        }
                    },
                };
                telemetry::shadow_outcome(&router.model_id, &router.strategy.name, outcome);
            }
            Job::Observe(observation) => router.observe(&observation).await,
            Job::Tick(now_ms) => router.tick(now_ms).await,
            Job::Upstreams(upstreams) => {
                // A failure is in the router's stats (and `last_failure` in `/routing`).
                let _ = router.refresh_upstreams(upstreams).await;
            }
        }
    }
}

/// How one order compares with another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    SameOrder,
    SamePrimary,
    DifferentPrimary,
}

/// Compares a decision's order with the one served.
pub fn compare(order: &[u32], served: &[u32]) -> Agreement {
    if order == served {
        Agreement::SameOrder
    } else if order.first() == served.first() {
        Agreement::SamePrimary
    } else {
        Agreement::DifferentPrimary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_compare_by_primary_then_whole_order() {
        assert_eq!(compare(&[1, 0, 2], &[1, 0, 2]), Agreement::SameOrder);
        assert_eq!(compare(&[1, 2, 0], &[1, 0, 2]), Agreement::SamePrimary);
        assert_eq!(compare(&[0, 1, 2], &[1, 0, 2]), Agreement::DifferentPrimary);
        assert_eq!(compare(&[], &[]), Agreement::SameOrder);
    }

    #[test]
    fn latency_percentiles_come_from_the_recent_window() {
        let stats = ShadowStats::default();
        assert!(stats.percentiles().is_none());
        for us in 1..=100u64 {
            stats.latency(Duration::from_micros(us));
        }
        assert_eq!(stats.percentiles(), Some((51, 99, 100, 100)));
        // The window keeps the newest LATENCY_WINDOW samples only.
        for _ in 0..LATENCY_WINDOW {
            stats.latency(Duration::from_micros(7));
        }
        assert_eq!(stats.percentiles(), Some((7, 7, 7, LATENCY_WINDOW)));
    }
}
