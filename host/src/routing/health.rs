//! Endpoint health: an EWMA of each endpoint's success rate and a circuit breaker, in one
//! process-wide registry shared by every model's router.
//!
//! The EWMAs are per process (each replica judges from its own traffic). Breaker transitions are
//! announced to the fleet's other replicas when a fleet is configured ([`super::peers::Peers`]),
//! which apply them with [`HealthRegistry::apply_remote_open`] and
//! [`HealthRegistry::apply_remote_close`]; alone, replicas behind a load balancer each learn alone.
//!
//! The breaker opens after `failure_threshold` consecutive failures (or when availability falls below
//! `min_availability`), stays open `cooldown`, then admits exactly one half-open probe: the first
//! dispatch after the cooldown claims it, everyone else keeps skipping the endpoint until the probe
//! reports. Success closes the breaker, failure reopens it. A claim expires after `cooldown`, so a
//! probe whose caller vanished cannot wedge the endpoint.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::id_map::IdMap;

/// Breaker and EWMA knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthConfig {
    pub failure_threshold: u32,
    pub cooldown: Duration,
    pub min_availability: f64,
    pub ewma_alpha: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 3,
            cooldown: Duration::from_secs(30),
            min_availability: 0.7,
            ewma_alpha: 0.1,
        }
    }
}

/// How an attempt ended, as far as health is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// 408, 429, 5xx, transport errors, timeouts, broken or unparsable answers.
    Failure,
    /// 401/403: counts as a failure and in the credential-rejection counter.
    CredentialRejected,
    /// The client's own fault (other 4xx): says nothing about the endpoint.
    Neutral,
}

impl Outcome {
    /// Classifies an upstream HTTP status (0 = no answer: transport error or timeout).
    pub fn from_status(status: u16) -> Outcome {
        match status {
            200..=299 => Outcome::Success,
            401 | 403 => Outcome::CredentialRejected,
            408 | 429 => Outcome::Failure,
            400..=499 => Outcome::Neutral,
            _ => Outcome::Failure,
        }
    }
}

/// The breaker's state as shown to strategies and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug, Clone, Copy)]
enum Breaker {
    Closed,
    Open {
        until: Instant,
    },
    /// Cooldown over; `probe` is the live claim, if any.
    HalfOpen {
        probe: Option<(u64, Instant)>,
    },
}

#[derive(Debug)]
struct EndpointState {
    availability: f64,
    consecutive_failures: u32,
    consecutive_credential_rejections: u32,
    breaker: Breaker,
    last_error: Option<(String, std::time::SystemTime)>,
    successes: u64,
    failures: u64,
}

impl Default for EndpointState {
    fn default() -> Self {
        Self {
            availability: 1.0,
            consecutive_failures: 0,
            consecutive_credential_rejections: 0,
            breaker: Breaker::Closed,
            last_error: None,
            successes: 0,
            failures: 0,
        }
    }
}

/// Permission to send one attempt to an endpoint, returned by [`HealthRegistry::claim`]. A probe
/// ticket must be reported (or released) by its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ticket {
    Normal,
    Probe(u64),
}

/// A snapshot of one endpoint for health endpoints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EndpointReport {
    pub endpoint_id: String,
    pub availability: f64,
    pub healthy: bool,
    pub circuit: CircuitState,
    /// Seconds until an open breaker admits its half-open probe.
    pub seconds_to_half_open: Option<f64>,
    pub consecutive_failures: u32,
    pub consecutive_credential_rejections: u32,
    pub successes: u64,
    pub failures: u64,
    pub last_error: Option<String>,
    /// Unix seconds of the last error.
    pub last_error_at: Option<u64>,
}

/// Every endpoint's health, keyed by endpoint id.
#[derive(Debug)]
pub struct HealthRegistry {
    config: HealthConfig,
    endpoints: RwLock<IdMap<String, Arc<Mutex<EndpointState>>>>,
    next_probe: AtomicU64,
    /// Told of every breaker transition this process decides (set once, by the fleet).
    peers: OnceLock<Arc<dyn super::peers::Peers>>,
}

impl HealthRegistry {
    pub fn new(config: HealthConfig) -> Self {
        Self {
            config,
            endpoints: RwLock::new(IdMap::default()),
            next_probe: AtomicU64::new(1),
            peers: OnceLock::new(),
        }
    }

    /// Announces this process's breaker transitions to `peers` from now on.
    pub fn set_peers(&self, peers: Arc<dyn super::peers::Peers>) {
        let _ = self.peers.set(peers);
    }

    /// Another replica opened `endpoint`'s breaker until `until`: skip it here too. A breaker
    /// whose probe is out here is left to that probe.
    pub fn apply_remote_open(&self, endpoint: &str, until: Instant) {
        let entry = self.entry(endpoint);
        let mut state = entry.lock();
        match state.breaker {
            Breaker::Closed => state.breaker = Breaker::Open { until },
            Breaker::Open { until: mine } if mine < until => {
                state.breaker = Breaker::Open { until };
            }
            Breaker::HalfOpen { probe: None } => state.breaker = Breaker::Open { until },
            _ => {}
        }
    }

    /// Another replica's probe was answered: the endpoint serves again.
    pub fn apply_remote_close(&self, endpoint: &str) {
        let entry = self.entry(endpoint);
        let mut state = entry.lock();
        if !matches!(state.breaker, Breaker::Closed) {
            state.breaker = Breaker::Closed;
            state.consecutive_failures = 0;
        }
    }

    pub fn config(&self) -> HealthConfig {
        self.config
    }

    fn entry(&self, endpoint: &str) -> Arc<Mutex<EndpointState>> {
        if let Some(e) = self.endpoints.read().get(endpoint) {
            return e.clone();
        }
        self.endpoints
            .write()
            .entry(endpoint.to_owned())
            .or_default()
            .clone()
    }

    /// Whether selection may consider the endpoint now. Asking consumes nothing: an open breaker
    /// past its cooldown is admitted here and only the first dispatch claims the probe.
    pub fn admits(&self, endpoint: &str, now: Instant) -> Option<CircuitState> {
        let Some(state) = self.endpoints.read().get(endpoint).cloned() else {
            return Some(CircuitState::Closed);
        };
        let state = state.lock();
        match state.breaker {
            Breaker::Closed => Some(CircuitState::Closed),
            Breaker::Open { until } if now < until => None,
            Breaker::Open { .. } => Some(CircuitState::HalfOpen),
            Breaker::HalfOpen {
                probe: Some((_, expires)),
            } if now < expires => None,
            Breaker::HalfOpen { .. } => Some(CircuitState::HalfOpen),
        }
    }

    /// Claims the right to send one attempt. `None` when the breaker is open or its single probe is
    /// already out; the caller skips the endpoint.
    pub fn claim(&self, endpoint: &str, now: Instant) -> Option<Ticket> {
        let entry = self.entry(endpoint);
        let mut state = entry.lock();
        let free_probe = match state.breaker {
            Breaker::Closed => return Some(Ticket::Normal),
            Breaker::Open { until } => now >= until,
            Breaker::HalfOpen { probe } => probe.is_none_or(|(_, expires)| now >= expires),
        };
        if !free_probe {
            return None;
        }
        let id = self.next_probe.fetch_add(1, Ordering::Relaxed);
        state.breaker = Breaker::HalfOpen {
            probe: Some((id, now + self.config.cooldown)),
        };
        Some(Ticket::Probe(id))
    }

    /// Gives back a probe that was never sent (or whose outcome is unknown, e.g. the client left),
    /// so the next request can probe. Only the holder of the current claim can release it.
    pub fn release(&self, endpoint: &str, ticket: Ticket) {
        let Ticket::Probe(id) = ticket else { return };
        let entry = self.entry(endpoint);
        let mut state = entry.lock();
        if let Breaker::HalfOpen {
            probe: Some((held, _)),
        } = state.breaker
            && held == id
        {
            state.breaker = Breaker::HalfOpen { probe: None };
        }
    }

    /// Records how an attempt ended.
    pub fn record(&self, endpoint: &str, ticket: Ticket, outcome: Outcome, error: Option<&str>) {
        self.record_at(endpoint, ticket, outcome, error, Instant::now());
    }

    pub fn record_at(
        &self,
        endpoint: &str,
        ticket: Ticket,
        outcome: Outcome,
        error: Option<&str>,
        now: Instant,
    ) {
        let entry = self.entry(endpoint);
        let mut state = entry.lock();
        let was_closed = matches!(state.breaker, Breaker::Closed);
        let was_open = matches!(state.breaker, Breaker::Open { .. });
        let alpha = self.config.ewma_alpha;
        let holds_probe = |state: &EndpointState| match (ticket, state.breaker) {
            (
                Ticket::Probe(id),
                Breaker::HalfOpen {
                    probe: Some((held, _)),
                },
            ) => held == id,
            _ => false,
        };
        match outcome {
            Outcome::Neutral => {
                // Says nothing about the endpoint, but a probe that got an answer did reach it.
                if holds_probe(&state) {
                    state.breaker = Breaker::Closed;
                }
            }
            Outcome::Success => {
                state.availability = alpha + (1.0 - alpha) * state.availability;
                state.consecutive_failures = 0;
                state.consecutive_credential_rejections = 0;
                state.successes += 1;
                if holds_probe(&state) {
                    state.breaker = Breaker::Closed;
                }
            }
            Outcome::Failure | Outcome::CredentialRejected => {
                state.availability *= 1.0 - alpha;
                state.consecutive_failures += 1;
                state.failures += 1;
                if outcome == Outcome::CredentialRejected {
                    state.consecutive_credential_rejections += 1;
                } else {
                    state.consecutive_credential_rejections = 0;
                }
                if let Some(e) = error {
                    state.last_error = Some((e.to_owned(), std::time::SystemTime::now()));
                }
                let open = Breaker::Open {
                    until: now + self.config.cooldown,
                };
                match state.breaker {
                    Breaker::Closed
                        if state.consecutive_failures >= self.config.failure_threshold
                            || state.availability < self.config.min_availability =>
                    {
                        state.breaker = open;
                    }
                    Breaker::HalfOpen { .. } if holds_probe(&state) => state.breaker = open,
                    _ => {}
                }
            }
        }
        let opened = !was_open && matches!(state.breaker, Breaker::Open { .. });
        let closed = !was_closed && matches!(state.breaker, Breaker::Closed);
        drop(state);
        if let Some(peers) = self.peers.get() {
            if opened {
                peers.breaker_opened(endpoint, self.config.cooldown);
            } else if closed {
                peers.breaker_closed(endpoint);
            }
        }
    }

    /// The breaker state right now (for candidates and reports).
    pub fn circuit(&self, endpoint: &str, now: Instant) -> CircuitState {
        match self.admits(endpoint, now) {
            Some(state) => state,
            None => CircuitState::Open,
        }
    }

    pub fn availability(&self, endpoint: &str) -> f64 {
        self.endpoints
            .read()
            .get(endpoint)
            .map(|s| s.lock().availability)
            .unwrap_or(1.0)
    }

    /// A report per known endpoint, sorted by id.
    pub fn report(&self) -> Vec<EndpointReport> {
        let now = Instant::now();
        let mut reports: Vec<EndpointReport> = self
            .endpoints
            .read()
            .iter()
            .map(|(id, state)| {
                let s = state.lock();
                let (circuit, seconds_to_half_open) = match s.breaker {
                    Breaker::Closed => (CircuitState::Closed, None),
                    Breaker::Open { until } if now < until => {
                        (CircuitState::Open, Some((until - now).as_secs_f64()))
                    }
                    Breaker::Open { .. } | Breaker::HalfOpen { .. } => {
                        (CircuitState::HalfOpen, Some(0.0))
                    }
                };
                EndpointReport {
                    endpoint_id: id.clone(),
                    availability: s.availability,
                    healthy: s.availability >= self.config.min_availability
                        && circuit == CircuitState::Closed,
                    circuit,
                    seconds_to_half_open,
                    consecutive_failures: s.consecutive_failures,
                    consecutive_credential_rejections: s.consecutive_credential_rejections,
                    successes: s.successes,
                    failures: s.failures,
                    last_error: s.last_error.as_ref().map(|(e, _)| e.clone()),
                    last_error_at: s.last_error.as_ref().and_then(|(_, at)| {
                        at.duration_since(std::time::UNIX_EPOCH)
                            .ok()
                            .map(|d| d.as_secs())
                    }),
                }
            })
            .collect();
        reports.sort_by(|a, b| a.endpoint_id.cmp(&b.endpoint_id));
        reports
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(threshold: u32) -> HealthRegistry {
        HealthRegistry::new(HealthConfig {
            failure_threshold: threshold,
            cooldown: Duration::from_secs(30),
            ..HealthConfig::default()
        })
    }

    #[test]
    fn client_errors_leave_availability_unchanged() {
        let h = registry(3);
        for status in [400, 404, 422] {
            h.record("e", Ticket::Normal, Outcome::from_status(status), None);
        }
        assert_eq!(h.availability("e"), 1.0);
        for status in [408, 429, 500, 503, 0] {
            assert_eq!(Outcome::from_status(status), Outcome::Failure, "{status}");
        }
    }

    #[test]
    fn four_straight_failures_drop_below_the_floor_at_alpha_point_one() {
        let h = registry(100);
        let now = Instant::now();
        for i in 1..=4 {
            h.record_at("e", Ticket::Normal, Outcome::Failure, Some("boom"), now);
            let a = h.availability("e");
            assert_eq!(a < 0.7, i == 4, "after {i} failures availability is {a}");
        }
        // Below min_availability the breaker opens even though the threshold (100) is far.
        assert_eq!(h.circuit("e", now), CircuitState::Open);
    }

    #[test]
    fn credential_rejections_are_counted_from_the_first() {
        let h = registry(3);
        h.record(
            "e",
            Ticket::Normal,
            Outcome::from_status(401),
            Some("HTTP 401"),
        );
        let r = &h.report()[0];
        assert_eq!(r.consecutive_credential_rejections, 1);
        assert!(r.availability < 1.0);
        h.record("e", Ticket::Normal, Outcome::Success, None);
        assert_eq!(h.report()[0].consecutive_credential_rejections, 0);
    }

    #[test]
    fn opens_after_exactly_the_threshold() {
        let h = registry(3);
        let now = Instant::now();
        // A success in between resets the run.
        h.record_at("e", Ticket::Normal, Outcome::Failure, None, now);
        h.record_at("e", Ticket::Normal, Outcome::Success, None, now);
        h.record_at("e", Ticket::Normal, Outcome::Failure, None, now);
        h.record_at("e", Ticket::Normal, Outcome::Failure, None, now);
        assert_eq!(h.circuit("e", now), CircuitState::Closed);
        h.record_at("e", Ticket::Normal, Outcome::Failure, None, now);
        assert_eq!(h.circuit("e", now), CircuitState::Open);
        assert_eq!(h.claim("e", now), None);
    }

    fn open(h: &HealthRegistry, now: Instant) {
        for _ in 0..3 {
            h.record_at("e", Ticket::Normal, Outcome::Failure, None, now);
        }
    }

    #[test]
    fn half_open_admits_without_consuming_and_one_claimant_wins() {
        let h = Arc::new(registry(3));
        let start = Instant::now();
        open(&h, start);
        let later = start + Duration::from_secs(31);
        for _ in 0..5 {
            assert_eq!(h.admits("e", later), Some(CircuitState::HalfOpen));
        }
        let winners: Vec<Option<Ticket>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let h = h.clone();
                    s.spawn(move || h.claim("e", later))
                })
                .collect();
            handles.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(
            winners.iter().filter(|w| w.is_some()).count(),
            1,
            "{winners:?}"
        );
        assert_eq!(h.admits("e", later), None, "the probe is out");
    }

    #[test]
    fn probe_success_closes_failure_reopens() {
        let h = registry(3);
        let start = Instant::now();
        open(&h, start);
        let t1 = start + Duration::from_secs(31);
        let probe = h.claim("e", t1).unwrap();
        h.record_at("e", probe, Outcome::Failure, None, t1);
        assert_eq!(h.circuit("e", t1), CircuitState::Open);
        let t2 = t1 + Duration::from_secs(31);
        let probe = h.claim("e", t2).unwrap();
        h.record_at("e", probe, Outcome::Success, None, t2);
        assert_eq!(h.circuit("e", t2), CircuitState::Closed);
        assert_eq!(h.claim("e", t2), Some(Ticket::Normal));
    }

    #[test]
    fn a_claim_expires_and_only_its_holder_releases_it() {
        let h = registry(3);
        let start = Instant::now();
        open(&h, start);
        let t1 = start + Duration::from_secs(31);
        let first = h.claim("e", t1).unwrap();
        // A stranger's ticket neither releases nor closes it.
        h.release("e", Ticket::Probe(9999));
        h.record_at("e", Ticket::Normal, Outcome::Success, None, t1);
        assert_eq!(h.admits("e", t1), None);
        // After the cooldown the stale claim expires and a new probe can go out.
        let t2 = t1 + Duration::from_secs(31);
        let second = h.claim("e", t2).unwrap();
        assert_ne!(first, second);
        // The first holder's late report no longer decides anything.
        h.record_at("e", first, Outcome::Success, None, t2);
        assert_eq!(h.admits("e", t2), None);
        h.release("e", second);
        assert_eq!(h.admits("e", t2), Some(CircuitState::HalfOpen));
    }

    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl crate::routing::peers::Peers for Recorder {
        fn breaker_opened(&self, endpoint: &str, cooldown: Duration) {
            self.0
                .lock()
                .push(format!("open {endpoint} {}", cooldown.as_secs()));
        }
        fn breaker_closed(&self, endpoint: &str) {
            self.0.lock().push(format!("closed {endpoint}"));
        }
    }

    #[test]
    fn transitions_are_announced_once_and_remote_ones_are_applied_silently() {
        let h = registry(3);
        let peers = Arc::new(Recorder::default());
        h.set_peers(peers.clone());
        let start = Instant::now();
        open(&h, start);
        // A fourth failure while open changes nothing to announce.
        h.record_at("e", Ticket::Normal, Outcome::Failure, None, start);
        let t1 = start + Duration::from_secs(31);
        let probe = h.claim("e", t1).unwrap();
        h.record_at("e", probe, Outcome::Success, None, t1);
        assert_eq!(*peers.0.lock(), vec!["open e 30", "closed e"]);

        // Another replica's breaker: skipped here until its `until`, then closed by its probe.
        h.apply_remote_open("f", t1 + Duration::from_secs(5));
        assert_eq!(h.admits("f", t1), None);
        assert_eq!(
            h.admits("f", t1 + Duration::from_secs(6)),
            Some(CircuitState::HalfOpen)
        );
        h.apply_remote_close("f");
        assert_eq!(h.admits("f", t1), Some(CircuitState::Closed));
        assert_eq!(peers.0.lock().len(), 2, "remote changes are not echoed");
    }
}
