//! Session affinity: (caller, canonical model) → the endpoint that served it, with a sliding TTL, so
//! a conversation stays where its prefix cache is warm. A cache-locality optimisation, never a
//! promise: the pin moves whenever the endpoint errors, becomes unavailable or is backed up.
//!
//! In a fleet, pins are announced to the other replicas ([`super::peers::Peers`]) when they are
//! made or moved, and again whenever a quarter of the TTL passed since the last announcement (so
//! the shared record's TTL slides with use without a message per request); replicas apply them
//! with [`AffinityTable::apply_remote_pin`]. Reads stay local.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
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

/// The pinned endpoint, when the record expires, and when it was last announced to the fleet.
#[derive(Debug)]
struct Record {
    endpoint: String,
    expires: Instant,
    announced: Instant,
}

#[derive(Debug)]
pub struct AffinityTable {
    config: AffinityConfig,
    entries: Mutex<HashMap<Key, Record>>,
    peers: OnceLock<Arc<dyn super::peers::Peers>>,
}

impl AffinityTable {
    pub fn new(config: AffinityConfig) -> Self {
        Self {
            config,
            entries: Mutex::new(HashMap::new()),
            peers: OnceLock::new(),
        }
    }

    /// Announces pins to `peers` from now on.
    pub fn set_peers(&self, peers: Arc<dyn super::peers::Peers>) {
        let _ = self.peers.set(peers);
    }

    pub fn ttl(&self) -> Duration {
        self.config.ttl
    }

    /// Whether a record announced at `announced` is due to be announced again at `now`.
    fn due(&self, announced: Instant, now: Instant) -> bool {
        now.saturating_duration_since(announced) >= self.config.ttl / 4
    }

    fn announce(&self, caller: &str, model: &str, endpoint: &str) {
        if let Some(peers) = self.peers.get() {
            peers.affinity_pinned(caller, model, endpoint, self.config.ttl);
        }
    }

    /// Another replica pinned `caller` on `model` to `endpoint` until `expires`.
    pub fn apply_remote_pin(&self, caller: &str, model: &str, endpoint: &str, expires: Instant) {
        if !self.config.enabled {
            return;
        }
        let mut entries = self.entries.lock();
        entries.insert(
            (Arc::from(caller), model.to_owned()),
            Record {
                endpoint: endpoint.to_owned(),
                expires,
                // Announced by its maker just now; this replica re-announces only on its own use.
                announced: Instant::now(),
            },
        );
    }

    /// Another replica dropped the pin of `caller` on `model` to `endpoint`.
    pub fn apply_remote_drop(&self, caller: &str, model: &str, endpoint: &str) {
        let mut entries = self.entries.lock();
        let key = (Arc::from(caller), model.to_owned());
        if entries.get(&key).is_some_and(|r| r.endpoint == endpoint) {
            entries.remove(&key);
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
        let (endpoint, announce) = match entries.get_mut(&key) {
            Some(record) if now < record.expires => {
                record.expires = now + self.config.ttl;
                let announce = self.peers.get().is_some() && self.due(record.announced, now);
                if announce {
                    record.announced = now;
                }
                (record.endpoint.clone(), announce)
            }
            Some(_) => {
                entries.remove(&key);
                return None;
            }
            None => return None,
        };
        drop(entries);
        if announce {
            self.announce(caller, model, &endpoint);
        }
        Some(endpoint)
    }

    /// Pins `caller` on `model` to `endpoint`.
    pub fn set(&self, caller: &Arc<str>, model: &str, endpoint: &str, now: Instant) {
        if !self.config.enabled {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.len() > self.config.sweep_threshold {
            entries.retain(|_, r| now < r.expires);
        }
        let key = (caller.clone(), model.to_owned());
        let last_announced = entries
            .get(&key)
            .filter(|r| r.endpoint == endpoint && !self.due(r.announced, now))
            .map(|r| r.announced);
        entries.insert(
            key,
            Record {
                endpoint: endpoint.to_owned(),
                expires: now + self.config.ttl,
                announced: last_announced.unwrap_or(now),
            },
        );
        drop(entries);
        if last_announced.is_none() {
            self.announce(caller, model, endpoint);
        }
    }

    /// Drops the record if it still points at `endpoint` (after an error there).
    pub fn drop_if(&self, caller: &Arc<str>, model: &str, endpoint: &str) {
        let mut entries = self.entries.lock();
        let key = (caller.clone(), model.to_owned());
        if entries.get(&key).is_some_and(|r| r.endpoint == endpoint) {
            entries.remove(&key);
            drop(entries);
            if let Some(peers) = self.peers.get() {
                peers.affinity_dropped(caller, model, endpoint);
            }
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
