//! Attempts in flight per endpoint, in this process: what `select` tells a strategy as a candidate's
//! `inflight-requests`.
//!
//! An attempt holds the guard [`InFlight::enter`] returns for as long as it runs; dropping it (the
//! attempt finished, failed or was cancelled) counts it out. Counting is lock-free per endpoint; the
//! map of endpoints is only written the first time an endpoint is seen (endpoints come from config,
//! so it stays small).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::id_map::IdMap;

/// Per-endpoint counters of attempts in flight.
#[derive(Debug, Default)]
pub struct InFlight {
    endpoints: parking_lot::RwLock<IdMap<String, Arc<AtomicU32>>>,
}

/// One attempt in flight; counted out when dropped.
#[derive(Debug)]
#[must_use = "the attempt is counted out as soon as the guard is dropped"]
pub struct InFlightGuard(Arc<AtomicU32>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl InFlight {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one attempt on `endpoint_id` in, until the guard is dropped.
    pub fn enter(&self, endpoint_id: &str) -> InFlightGuard {
        let known = self.endpoints.read().get(endpoint_id).cloned();
        let counter = match known {
            Some(counter) => counter,
            None => self
                .endpoints
                .write()
                .entry(endpoint_id.to_owned())
                .or_default()
                .clone(),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(counter)
    }

    /// Attempts in flight on `endpoint_id` now.
    pub fn count(&self, endpoint_id: &str) -> u32 {
        self.endpoints
            .read()
            .get(endpoint_id)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_attempts_in_and_out_per_endpoint() {
        let inflight = InFlight::new();
        assert_eq!(inflight.count("m:a"), 0);
        let first = inflight.enter("m:a");
        let second = inflight.enter("m:a");
        let other = inflight.enter("m:b");
        assert_eq!(inflight.count("m:a"), 2);
        assert_eq!(inflight.count("m:b"), 1);
        drop(first);
        assert_eq!(inflight.count("m:a"), 1);
        drop((second, other));
        assert_eq!(inflight.count("m:a"), 0);
        assert_eq!(inflight.count("m:b"), 0);
    }

    #[test]
    fn a_guard_outlives_its_task() {
        let inflight = Arc::new(InFlight::new());
        let guard = inflight.enter("m:a");
        let handle = std::thread::spawn(move || drop(guard));
        let _ = handle.join();
        assert_eq!(inflight.count("m:a"), 0);
    }
}
