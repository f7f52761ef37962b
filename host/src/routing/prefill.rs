//! Prefill accounting: how many uncached prompt tokens each endpoint is prefilling right now, and a
//! per-(caller, endpoint) memory of the caller's last completed prompt so a warm continuation is not
//! mistaken for a cold elephant.
//!
//! A lease is taken when an attempt is dispatched and released at the first token (a long, cheap
//! decode is not prefill pressure), or on any end: success, error, timeout, client disconnect. The
//! release is in `Drop`, so no path can leak one. Nothing here blocks, rejects or queues a request.
//!
//! In a fleet, each replica publishes its own backlog and [`PrefillTracker::set_remote`] hands this
//! one the sum of the others', so [`PrefillTracker::load`] is the fleet's (as fresh as the last
//! publication); hints and leases stay per process.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::id_map::IdMap;

/// Prefill-aware routing knobs (`ROUTING_PREFILL_*`; environment wins over the config file).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillConfig {
    pub enabled: bool,
    pub intervene_tokens: u64,
    pub elephant_tokens: u64,
    pub elephant_limit: u32,
    pub affinity_ceiling: u64,
    pub hint_ttl: Duration,
}

impl Default for PrefillConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            intervene_tokens: 50_000,
            elephant_tokens: 200_000,
            elephant_limit: 1,
            affinity_ceiling: 150_000,
            hint_ttl: Duration::from_secs(1200),
        }
    }
}

/// Hints kept before expired ones are swept (at the next `remember`).
const HINTS_BEFORE_SWEEP: usize = 4096;

#[derive(Debug, Default)]
struct EndpointLoad {
    backlog_tokens: u64,
    elephants: u32,
    /// Uncached tokens in flight per caller, so a caller's own parallel turns can be discounted.
    by_caller: HashMap<Arc<str>, u64>,
}

#[derive(Debug, Default)]
struct State {
    endpoints: IdMap<String, EndpointLoad>,
    /// caller → endpoint → (prompt tokens of the last completed request, when). Two levels, so a
    /// lookup borrows both names: a `(caller, endpoint)` key had to be built, an `Arc` and a
    /// `String`, for every lookup (two per request), and SipHash went over both. The callers'
    /// level keeps the standard hasher: callers are what clients send.
    hints: HashMap<Arc<str>, IdMap<String, (u64, Instant)>>,
    /// Hints in `hints`, over all callers.
    hint_count: usize,
}

/// Load of one endpoint as the pipeline sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Load {
    pub backlog_tokens: u64,
    pub elephants: u32,
}

/// The process-wide prefill tracker.
#[derive(Debug)]
pub struct PrefillTracker {
    config: PrefillConfig,
    state: Arc<Mutex<State>>,
    /// The other replicas' load per endpoint, summed (empty without a fleet).
    remote: parking_lot::RwLock<IdMap<String, Load>>,
}

impl PrefillTracker {
    pub fn new(config: PrefillConfig) -> Self {
        Self {
            config,
            state: Arc::default(),
            remote: parking_lot::RwLock::default(),
        }
    }

    /// The other replicas' load per endpoint, summed; replaces the previous sum.
    pub fn set_remote(&self, remote: IdMap<String, Load>) {
        *self.remote.write() = remote;
    }

    /// The other replicas' load on `endpoint`.
    pub fn remote_load(&self, endpoint: &str) -> Load {
        self.remote
            .read()
            .get(endpoint)
            .copied()
            .unwrap_or_default()
    }

    pub fn config(&self) -> PrefillConfig {
        self.config
    }

    /// The endpoint's load across the fleet: this process's plus the others' last publication.
    pub fn load(&self, endpoint: &str) -> Load {
        let local = self.local_load(endpoint);
        let remote = self.remote_load(endpoint);
        Load {
            backlog_tokens: local.backlog_tokens + remote.backlog_tokens,
            elephants: local.elephants + remote.elephants,
        }
    }

    /// This process's own load on the endpoint.
    pub fn local_load(&self, endpoint: &str) -> Load {
        self.state
            .lock()
            .endpoints
            .get(endpoint)
            .map(|l| Load {
                backlog_tokens: l.backlog_tokens,
                elephants: l.elephants,
            })
            .unwrap_or_default()
    }

    /// This process's load on every endpoint it knows, sorted by id (for `/health/deep`, and
    /// what a replica publishes to its fleet).
    pub fn report(&self) -> Vec<(String, Load)> {
        let state = self.state.lock();
        let mut loads: Vec<(String, Load)> = state
            .endpoints
            .iter()
            .map(|(id, l)| {
                (
                    id.clone(),
                    Load {
                        backlog_tokens: l.backlog_tokens,
                        elephants: l.elephants,
                    },
                )
            })
            .collect();
        loads.sort_by(|a, b| a.0.cmp(&b.0));
        loads
    }

    /// The endpoint's backlog without `caller`'s own in-flight prefill (the affinity ceiling must
    /// not push a session off its warm endpoint because of its own parallel turns).
    pub fn backlog_excluding(&self, endpoint: &str, caller: Option<&str>) -> u64 {
        let state = self.state.lock();
        let remote = self.remote_load(endpoint).backlog_tokens;
        let Some(load) = state.endpoints.get(endpoint) else {
            return remote;
        };
        let own = caller
            .and_then(|c| load.by_caller.get(c))
            .copied()
            .unwrap_or(0);
        load.backlog_tokens.saturating_sub(own) + remote
    }

    /// This request's uncached prompt tokens on `endpoint`: the growth over the caller's last
    /// completed prompt there when that is fresh (a shrinking prompt is charged 0), else all of it.
    pub fn uncached_estimate(
        &self,
        caller: Option<&str>,
        endpoint: &str,
        prompt_tokens: u64,
        now: Instant,
    ) -> u64 {
        let Some(caller) = caller else {
            return prompt_tokens;
        };
        let state = self.state.lock();
        match state
            .hints
            .get(caller)
            .and_then(|hints| hints.get(endpoint))
        {
            Some(&(last, at)) if now.duration_since(at) <= self.config.hint_ttl => {
                prompt_tokens.saturating_sub(last)
            }
            _ => prompt_tokens,
        }
    }

    /// Takes a lease of `uncached` tokens on `endpoint`. Dropping the lease releases it.
    pub fn acquire(&self, caller: Option<Arc<str>>, endpoint: &str, uncached: u64) -> PrefillLease {
        let elephant = uncached >= self.config.elephant_tokens;
        let charge = |load: &mut EndpointLoad| {
            load.backlog_tokens += uncached;
            if elephant {
                load.elephants += 1;
            }
            if let Some(c) = &caller {
                *load.by_caller.entry(c.clone()).or_insert(0) += uncached;
            }
        };
        {
            let endpoints = &mut self.state.lock().endpoints;
            match endpoints.get_mut(endpoint) {
                Some(load) => charge(load),
                // The endpoint's name is copied only the first time it is seen.
                None => charge(endpoints.entry(endpoint.to_owned()).or_default()),
            }
        }
        PrefillLease {
            state: self.state.clone(),
            endpoint: endpoint.to_owned(),
            caller,
            uncached,
            elephant,
            released: false,
        }
    }

    /// Remembers a completed prompt (never an in-flight or failed one) for warm-continuation
    /// estimates. Expired hints are swept when the table grows.
    pub fn remember(&self, caller: Option<&str>, endpoint: &str, prompt_tokens: u64, now: Instant) {
        let Some(caller) = caller else { return };
        let mut state = self.state.lock();
        let State {
            hints, hint_count, ..
        } = &mut *state;
        if *hint_count > HINTS_BEFORE_SWEEP {
            let ttl = self.config.hint_ttl;
            hints.retain(|_, by_endpoint| {
                by_endpoint.retain(|_, (_, at)| now.duration_since(*at) <= ttl);
                !by_endpoint.is_empty()
            });
            *hint_count = hints.values().map(IdMap::len).sum();
        }
        let hint = (prompt_tokens, now);
        // Names are copied only for a pair not seen before.
        let added = match hints.get_mut(caller) {
            Some(by_endpoint) => match by_endpoint.get_mut(endpoint) {
                Some(known) => {
                    *known = hint;
                    false
                }
                None => {
                    by_endpoint.insert(endpoint.to_owned(), hint);
                    true
                }
            },
            None => {
                hints.insert(
                    Arc::from(caller),
                    IdMap::from_iter([(endpoint.to_owned(), hint)]),
                );
                true
            }
        };
        if added {
            *hint_count += 1;
        }
    }
}

/// Uncached tokens held in an endpoint's backlog until the first token or the end of the attempt.
#[derive(Debug)]
pub struct PrefillLease {
    state: Arc<Mutex<State>>,
    endpoint: String,
    caller: Option<Arc<str>>,
    uncached: u64,
    elephant: bool,
    released: bool,
}

impl PrefillLease {
    /// Releases the lease now (at the first token). Idempotent.
    pub fn release(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        let mut state = self.state.lock();
        if let Some(load) = state.endpoints.get_mut(&self.endpoint) {
            load.backlog_tokens = load.backlog_tokens.saturating_sub(self.uncached);
            if self.elephant {
                load.elephants = load.elephants.saturating_sub(1);
            }
            if let Some(c) = &self.caller
                && let Some(own) = load.by_caller.get_mut(c)
            {
                *own = own.saturating_sub(self.uncached);
                if *own == 0 {
                    load.by_caller.remove(c);
                }
            }
        }
    }
}

impl Drop for PrefillLease {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker() -> PrefillTracker {
        PrefillTracker::new(PrefillConfig::default())
    }

    #[test]
    fn warm_continuations_are_charged_their_growth() {
        let t = tracker();
        let now = Instant::now();
        t.remember(Some("k"), "e", 490_000, now);
        assert_eq!(t.uncached_estimate(Some("k"), "e", 500_000, now), 10_000);
        assert_eq!(
            t.uncached_estimate(Some("k"), "e", 400_000, now),
            0,
            "shrinking"
        );
        assert_eq!(
            t.uncached_estimate(Some("k"), "other", 500_000, now),
            500_000
        );
        assert_eq!(t.uncached_estimate(Some("x"), "e", 500_000, now), 500_000);
        let stale = now + Duration::from_secs(1201);
        assert_eq!(t.uncached_estimate(Some("k"), "e", 500_000, stale), 500_000);
    }

    #[test]
    fn leases_count_backlog_and_elephants_until_released_or_dropped() {
        let t = tracker();
        let mut small = t.acquire(Some("a".into()), "e", 1_000);
        let big = t.acquire(Some("b".into()), "e", 250_000);
        assert_eq!(
            t.load("e"),
            Load {
                backlog_tokens: 251_000,
                elephants: 1
            }
        );
        assert_eq!(
            t.backlog_excluding("e", Some("b")),
            1_000,
            "own load discounted"
        );
        small.release();
        small.release();
        assert_eq!(t.load("e").backlog_tokens, 250_000, "release is idempotent");
        drop(big);
        assert_eq!(t.load("e"), Load::default());
    }

    #[test]
    fn hints_are_bounded_by_sweeping_expired_ones() {
        let t = tracker();
        let then = Instant::now();
        for i in 0..=HINTS_BEFORE_SWEEP {
            t.remember(Some(&format!("c{}", i % 97)), &format!("e{i}"), 10, then);
        }
        // A pair seen again is updated, not added.
        t.remember(Some("c0"), "e0", 20, then);
        assert_eq!(t.state.lock().hint_count, HINTS_BEFORE_SWEEP + 1);
        let later = then + Duration::from_secs(1201);
        t.remember(Some("fresh"), "e", 100, later);
        let state = t.state.lock();
        assert_eq!(state.hint_count, 1, "the expired ones went");
        assert_eq!(state.hints.len(), 1, "callers left without hints went too");
        drop(state);
        assert_eq!(t.uncached_estimate(Some("fresh"), "e", 150, later), 50);
        assert_eq!(t.uncached_estimate(Some("c0"), "e0", 150, later), 150);
    }
}
