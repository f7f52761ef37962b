//! Stateful providers: concurrency slots and quota pools. Accounting is per router instance (one
//! gateway process); see `stateful_providers_single_worker_only`.

use std::collections::{BTreeMap, VecDeque};

use crate::metadata::QuotaSnapshot;

/// A slot acquired for a primary is released by the first observation of its request; one whose
/// observation never comes is freed after this long (above the host's default 600 s request
/// timeout, so a live request keeps its slot).
pub const CONCURRENCY_ACQUIRE_TIMEOUT_MS: u64 = 660_000;

/// Local quota dispatches kept per pool at most (oldest dropped).
pub const QUOTA_DISPATCH_LOG_MAX: usize = 1 << 20;

/// One held concurrency slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquisition {
    pub pool: String,
    /// Declared index of the route it was acquired for.
    pub index: u32,
    pub at_ms: u64,
}

/// In-flight primaries per concurrency pool, keyed by decision sequence number.
#[derive(Clone, Debug, Default)]
pub struct ConcurrencyPools {
    limits: BTreeMap<String, u64>,
    held: BTreeMap<u64, Acquisition>,
}

impl ConcurrencyPools {
    /// Replaces the pools' limits (held slots are kept, also for pools that disappeared, until
    /// released or expired).
    pub fn set_limits(&mut self, limits: BTreeMap<String, u64>) {
        self.limits = limits;
    }

    pub fn limit(&self, pool: &str) -> Option<u64> {
        self.limits.get(pool).copied()
    }

    pub fn in_flight(&self, pool: &str) -> u64 {
        self.held.values().filter(|a| a.pool == pool).count() as u64
    }

    pub fn has_free_slot(&self, pool: &str) -> bool {
        self.limit(pool)
            .is_some_and(|limit| self.in_flight(pool) < limit)
    }

    pub fn acquire(&mut self, seq: u64, pool: &str, index: u32, now_ms: u64) {
        self.held.insert(
            seq,
            Acquisition {
                pool: pool.to_owned(),
                index,
                at_ms: now_ms,
            },
        );
    }

    /// Releases the slot of decision `seq`; false when it held none (or was already released).
    pub fn release(&mut self, seq: u64) -> bool {
        self.held.remove(&seq).is_some()
    }

    /// Frees acquisitions older than `timeout_ms`; returns how many.
    pub fn expire(&mut self, now_ms: u64, timeout_ms: u64) -> usize {
        let before = self.held.len();
        self.held
            .retain(|_, a| now_ms < a.at_ms.saturating_add(timeout_ms));
        before - self.held.len()
    }

    /// (pool, limit, in flight) for every pool with a limit or a held slot.
    pub fn pools(&self) -> Vec<(String, Option<u64>, u64)> {
        let mut names: Vec<&String> = self.limits.keys().collect();
        names.extend(self.held.values().map(|a| &a.pool));
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|p| (p.clone(), self.limit(p), self.in_flight(p)))
            .collect()
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// What a quota pool allows right now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QuotaState {
    /// No snapshot from the host yet: usage unknown.
    NoSnapshot,
    /// Nothing remains (`used ≥ limit`).
    Exhausted { used: u64, limit: u64 },
    /// `used / limit` of the quota is gone.
    Available { used: u64, limit: u64 },
}

/// One quota pool: the route-declared limit, the host's latest snapshot and the requests this
/// router sent to it since that snapshot.
#[derive(Clone, Debug, Default)]
pub struct QuotaPool {
    /// Smallest `quota.limit` of the pool's routes (0: none declared).
    pub limit: u64,
    pub snapshot: Option<QuotaSnapshot>,
    dispatches: VecDeque<u64>,
    since_snapshot: u64,
}

impl QuotaPool {
    /// The snapshot's limit when it has one, else the declared limit.
    pub fn effective_limit(&self) -> u64 {
        self.snapshot
            .map(|s| s.limit)
            .filter(|&l| l > 0)
            .unwrap_or(self.limit)
    }

    /// Requests sent after the snapshot was taken (counted locally).
    pub fn since_snapshot(&self) -> u64 {
        self.since_snapshot
    }

    pub fn state(&self) -> QuotaState {
        let Some(snapshot) = self.snapshot else {
            return QuotaState::NoSnapshot;
        };
        let used = snapshot.used.saturating_add(self.since_snapshot);
        let limit = self.effective_limit();
        if used >= limit {
            QuotaState::Exhausted { used, limit }
        } else {
            QuotaState::Available { used, limit }
        }
    }

    fn recount(&mut self) {
        let at = self.snapshot.map_or(u64::MAX, |s| s.at_ms);
        self.since_snapshot = self.dispatches.iter().filter(|&&t| t > at).count() as u64;
    }

    fn record(&mut self, now_ms: u64) {
        self.dispatches.push_back(now_ms);
        if self.snapshot.is_some_and(|s| now_ms > s.at_ms) {
            self.since_snapshot += 1;
        }
        if self.dispatches.len() > QUOTA_DISPATCH_LOG_MAX {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        let at = self.snapshot.map_or(u64::MAX, |s| s.at_ms);
        if let Some(t) = self.dispatches.pop_front()
            && t > at
        {
            self.since_snapshot = self.since_snapshot.saturating_sub(1);
        }
    }

    /// Drops dispatches the snapshot already covers.
    fn trim(&mut self) {
        if let Some(snapshot) = self.snapshot {
            while self
                .dispatches
                .front()
                .is_some_and(|&t| t <= snapshot.at_ms)
            {
                self.pop_front();
            }
        }
    }
}

/// Every quota pool of the model.
#[derive(Clone, Debug, Default)]
pub struct QuotaPools {
    pools: BTreeMap<String, QuotaPool>,
}

impl QuotaPools {
    /// Rebuilds the pools from the route table: `(pool, declared limit, snapshot)` per quota route.
    /// A pool's limit is the smallest declared one, its snapshot the newest; local dispatches carry
    /// over and are recounted against a new snapshot.
    pub fn refresh<'a>(
        &mut self,
        routes: impl IntoIterator<Item = (&'a str, Option<u64>, Option<QuotaSnapshot>)>,
    ) {
        let mut pools: BTreeMap<String, QuotaPool> = BTreeMap::new();
        for (name, limit, snapshot) in routes {
            let pool = pools.entry(name.to_owned()).or_default();
            if let Some(limit) = limit.filter(|&l| l > 0) {
                pool.limit = if pool.limit == 0 {
                    limit
                } else {
                    pool.limit.min(limit)
                };
            }
            if let Some(snapshot) = snapshot
                && pool.snapshot.is_none_or(|s| snapshot.at_ms > s.at_ms)
            {
                pool.snapshot = Some(snapshot);
            }
        }
        for (name, pool) in &mut pools {
            if let Some(old) = self.pools.remove(name) {
                pool.dispatches = old.dispatches;
                // A snapshot the host did not resend stays the latest we know.
                if pool.snapshot.is_none() {
                    pool.snapshot = old.snapshot;
                }
            }
            pool.recount();
            pool.trim();
        }
        self.pools = pools;
    }

    pub fn get(&self, pool: &str) -> Option<&QuotaPool> {
        self.pools.get(pool)
    }

    /// Counts one request sent to `pool` at `now_ms`.
    pub fn record(&mut self, pool: &str, now_ms: u64) {
        if let Some(p) = self.pools.get_mut(pool) {
            p.record(now_ms);
        }
    }

    pub fn trim(&mut self) {
        for pool in self.pools.values_mut() {
            pool.trim();
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &QuotaPool)> {
        self.pools.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_acquire_release_expire() {
        let mut c = ConcurrencyPools::default();
        c.set_limits(BTreeMap::from([("p".to_owned(), 2)]));
        assert!(c.has_free_slot("p"));
        assert!(!c.has_free_slot("unknown"));
        c.acquire(1, "p", 0, 100);
        c.acquire(2, "p", 0, 200);
        assert_eq!(c.in_flight("p"), 2);
        assert!(!c.has_free_slot("p"));
        assert!(c.release(1));
        assert!(!c.release(1));
        assert!(c.has_free_slot("p"));
        c.acquire(3, "p", 0, 300);
        assert_eq!(c.expire(200 + 1_000 - 1, 1_000), 0);
        assert_eq!(c.expire(200 + 1_000, 1_000), 1);
        assert_eq!(c.in_flight("p"), 1);
        assert_eq!(c.pools(), vec![("p".to_owned(), Some(2), 1)]);
    }

    fn snap(used: u64, limit: u64, at_ms: u64) -> Option<QuotaSnapshot> {
        Some(QuotaSnapshot { used, limit, at_ms })
    }

    #[test]
    fn quota_needs_a_snapshot_and_counts_local_dispatches() {
        let mut q = QuotaPools::default();
        q.refresh([("a", Some(10), None)]);
        assert_eq!(
            q.get("a").map(QuotaPool::state),
            Some(QuotaState::NoSnapshot)
        );
        q.record("a", 50);
        q.refresh([("a", Some(10), snap(7, 0, 100))]);
        // The dispatch at 50 is covered by the snapshot taken at 100.
        assert_eq!(
            q.get("a").map(QuotaPool::state),
            Some(QuotaState::Available { used: 7, limit: 10 })
        );
        q.record("a", 150);
        q.record("a", 160);
        assert_eq!(
            q.get("a").map(QuotaPool::state),
            Some(QuotaState::Available { used: 9, limit: 10 })
        );
        q.record("a", 170);
        assert_eq!(
            q.get("a").map(QuotaPool::state),
            Some(QuotaState::Exhausted {
                used: 10,
                limit: 10
            })
        );
        // A newer snapshot (taken at 165) covers two of the three local dispatches.
        q.refresh([("a", Some(10), snap(8, 20, 165))]);
        let pool = q.get("a");
        assert_eq!(pool.map(QuotaPool::since_snapshot), Some(1));
        assert_eq!(
            pool.map(QuotaPool::state),
            Some(QuotaState::Available { used: 9, limit: 20 })
        );
        // Routes sharing a pool: smallest limit, newest snapshot; a route change without a
        // snapshot keeps the last one.
        q.refresh([("a", Some(30), None), ("a", Some(12), None)]);
        let pool = q.get("a");
        assert_eq!(pool.map(|p| p.limit), Some(12));
        assert_eq!(pool.and_then(|p| p.snapshot), snap(8, 20, 165));
    }
}
