//! Session affinity: (caller, canonical model) → the endpoint that served it, with a sliding TTL, so
//! a conversation stays where its prefix cache is warm. A cache-locality optimisation, never a
//! promise: the pin moves whenever the endpoint errors, becomes unavailable or is backed up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// `AFFINITY_TTL_SECONDS`, `AFFINITY_SWEEP_THRESHOLD`, `ROUTING_AFFINITY_ENABLED`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityConfig {
    pub enabled: bool,
    pub ttl: Duration,
    /// The table is swept of expired entries lazily, once it holds more than this.
    pub sweep_threshold: usize,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ttl: Duration::from_secs(300),
            sweep_threshold: 1000,
        }
    }
}

/// (caller, canonical model).
type Key = (Arc<str>, String);

/// The pinned endpoint and when the record expires.
type Record = (String, Instant);

#[derive(Debug)]
pub struct AffinityTable {
    config: AffinityConfig,
    entries: Mutex<HashMap<Key, Record>>,
}

impl AffinityTable {
    pub fn new(config: AffinityConfig) -> Self {
        Self {
            config,
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// The pinned endpoint, if the record is alive; reading refreshes its TTL.
    pub fn get(&self, caller: &Arc<str>, model: &str, now: Instant) -> Option<String> {
        if !self.config.enabled {
            return None;
        }
        let mut entries = self.entries.lock();
        let key = (caller.clone(), model.to_owned());
        match entries.get_mut(&key) {
            Some((endpoint, expires)) if now < *expires => {
                *expires = now + self.config.ttl;
                Some(endpoint.clone())
            }
            Some(_) => {
                entries.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Pins `caller` on `model` to `endpoint`.
    pub fn set(&self, caller: &Arc<str>, model: &str, endpoint: &str, now: Instant) {
        if !self.config.enabled {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.len() > self.config.sweep_threshold {
            entries.retain(|_, (_, expires)| now < *expires);
        }
        entries.insert(
            (caller.clone(), model.to_owned()),
            (endpoint.to_owned(), now + self.config.ttl),
        );
    }

    /// Drops the record if it still points at `endpoint` (after an error there).
    pub fn drop_if(&self, caller: &Arc<str>, model: &str, endpoint: &str) {
        let mut entries = self.entries.lock();
        let key = (caller.clone(), model.to_owned());
        if entries.get(&key).is_some_and(|(e, _)| e == endpoint) {
            entries.remove(&key);
        }
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliding_ttl_and_lazy_sweep() {
        let t = AffinityTable::new(AffinityConfig {
            enabled: true,
            ttl: Duration::from_secs(10),
            sweep_threshold: 2,
        });
        let now = Instant::now();
        let k: Arc<str> = "k".into();
        t.set(&k, "m", "e1", now);
        // Reading at 9 s slides the expiry to 19 s.
        assert_eq!(
            t.get(&k, "m", now + Duration::from_secs(9)).as_deref(),
            Some("e1")
        );
        assert_eq!(
            t.get(&k, "m", now + Duration::from_secs(18)).as_deref(),
            Some("e1")
        );
        assert_eq!(t.get(&k, "m", now + Duration::from_secs(40)), None);
        for i in 0..3 {
            t.set(&format!("c{i}").into(), "m", "e", now);
        }
        t.set(&"late".into(), "m", "e", now + Duration::from_secs(60));
        assert_eq!(
            t.len(),
            1,
            "expired entries were swept once over the threshold"
        );
        t.drop_if(&"late".into(), "m", "other");
        assert_eq!(
            t.len(),
            1,
            "only a record pointing at the failed endpoint is dropped"
        );
        t.drop_if(&"late".into(), "m", "e");
        assert!(t.is_empty());
    }
}
