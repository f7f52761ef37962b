//! Where limit counters live: the [`LimitStore`] trait the request path calls, and the
//! in-process store. A store shared by a fleet (Redis) implements the same trait, so the request
//! path does not change when it arrives.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;

use super::gcra;

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKind {
    /// Requests per minute (GCRA, one cell per request).
    Requests,
    /// Tokens per minute (GCRA, one cell per token).
    Tokens,
    /// Requests in flight (a counter, released when the request ends).
    Concurrent,
}

impl LimitKind {
    /// The short name in `rate_limited_by` and the metric's `limit` label.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Requests => "rpm",
            LimitKind::Tokens => "tpm",
            LimitKind::Concurrent => "concurrency",
        }
    }
}

/// One limit as one request meets it: the counter's key, its size, and what the request takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// Names the counter; equal keys share one counter (the kind is part of it).
    pub key: String,
    pub kind: LimitKind,
    /// Per minute, or at once for [`LimitKind::Concurrent`].
    pub limit: u64,
    /// Cells taken at admission: 1 request, the prompt estimate in tokens, 1 slot.
    pub amount: u64,
}

/// What a counter has left after a decision, for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub limit: u64,
    pub remaining: u64,
    /// Until the whole limit is back (0 for a concurrency limit).
    pub reset: Duration,
}

/// A request that one of its limits refused; nothing was taken from any of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The refusing charge's position in the request's charges.
    pub index: usize,
    /// When the request would fit (a concurrency limit: unknown, one second is suggested).
    pub retry_after: Duration,
    /// The request alone is more than the limit: waiting does not help.
    pub never: bool,
    /// Every charge's counter as it stands, in the request's order.
    pub standings: Vec<Standing>,
}

/// The counters behind the `rate-limit` plugin.
///
/// `check_and_reserve` is all or nothing: a request is admitted by every one of its charges or
/// takes nothing from any. `reconcile` and `release` never wait: a store that needs the network
/// sends them in the background.
#[async_trait]
pub trait LimitStore: Send + Sync {
    /// Admits the request if every charge fits, taking each one's amount; else takes nothing
    /// and says which charge refused. Returns each counter's standing, in order.
    async fn check_and_reserve(&self, charges: &[Charge]) -> Result<Vec<Standing>, Refusal>;
    /// Corrects a token charge by `delta` tokens once the real usage is known: a positive delta
    /// is taken even past the limit, a negative one given back.
    fn reconcile(&self, charge: &Charge, delta: i64);
    /// Ends a concurrency charge (the request is over).
    fn release(&self, charge: &Charge);
}

/// Below this many keys the in-process store never sweeps.
const SWEEP_FLOOR: usize = 4096;

/// The counters of one process, exact within it: each replica of a fleet limits on its own.
///
/// Memory is bounded by the keys active in the last minute or two: a rate counter whose TAT has
/// passed is the same as an absent one and a concurrency counter at 0 is removed at once, so a
/// sweep (when the map has doubled since the last one, or a minute after it) drops them without
/// changing any decision. Sweeps run inside `check_and_reserve`, so no task or timer is needed.
pub struct InProcessLimits {
    epoch: Instant,
    inner: Mutex<Counters>,
}

struct Counters {
    /// GCRA TATs (nanoseconds since `epoch`) of rate counters.
    tats: HashMap<String, u64>,
    /// Requests in flight of concurrency counters (never 0: removed instead).
    in_flight: HashMap<String, u64>,
    /// Sweep when the maps hold more keys than this…
    sweep_at: usize,
    /// …or more than the floor and the last sweep is a minute old.
    last_sweep: u64,
}

impl Default for InProcessLimits {
    fn default() -> Self {
        InProcessLimits {
            epoch: Instant::now(),
            inner: Mutex::new(Counters {
                tats: HashMap::new(),
                in_flight: HashMap::new(),
                sweep_at: SWEEP_FLOOR,
                last_sweep: 0,
            }),
        }
    }
}

impl InProcessLimits {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Keys held, for tests of the sweep.
    #[cfg(test)]
    fn keys(&self) -> usize {
        let c = self.inner.lock();
        c.tats.len() + c.in_flight.len()
    }

    /// [`LimitStore::check_and_reserve`] at `now` (nanoseconds since the epoch).
    fn check_at(&self, charges: &[Charge], now: u64) -> Result<Vec<Standing>, Refusal> {
        let mut c = self.inner.lock();
        c.sweep(now);
        // Decide every charge first, commit only if all admit.
        let mut next_tats: Vec<Option<u64>> = Vec::with_capacity(charges.len());
        let mut refusal: Option<(usize, Duration, bool)> = None;
        for (i, charge) in charges.iter().enumerate() {
            match charge.kind {
                LimitKind::Requests | LimitKind::Tokens => {
                    let tat = c.tats.get(&charge.key).copied().unwrap_or(0);
                    match gcra::check(tat, now, charge.limit, charge.amount) {
                        gcra::Decision::Admit { tat } => next_tats.push(Some(tat)),
                        gcra::Decision::Refuse {
                            retry_after_ns,
                            never,
                        } => {
                            next_tats.push(None);
                            if refusal.is_none() {
                                refusal = Some((i, Duration::from_nanos(retry_after_ns), never));
                            }
                        }
                    }
                }
                LimitKind::Concurrent => {
                    next_tats.push(None);
                    let held = c.in_flight.get(&charge.key).copied().unwrap_or(0);
                    if held.saturating_add(charge.amount) > charge.limit && refusal.is_none() {
                        refusal = Some((i, Duration::from_secs(1), charge.amount > charge.limit));
                    }
                }
            }
        }
        if let Some((index, retry_after, never)) = refusal {
            return Err(Refusal {
                index,
                retry_after,
                never,
                standings: charges.iter().map(|ch| c.standing(ch, now)).collect(),
            });
        }
        // Each counter is looked up once more, to commit, and its standing follows from what was
        // committed: these maps SipHash (callers name the keys), and a third lookup per counter
        // and a copy of its key for every commit were paid on each request.
        let standings = charges
            .iter()
            .zip(next_tats)
            .map(|(charge, tat)| match tat {
                Some(tat) => {
                    c.set_tat(&charge.key, tat);
                    rate_standing(tat, now, charge.limit)
                }
                None => {
                    let held = c.add_in_flight(&charge.key, charge.amount);
                    concurrency_standing(held, charge.limit)
                }
            })
            .collect();
        Ok(standings)
    }

    fn reconcile_at(&self, charge: &Charge, delta: i64, now: u64) {
        if delta == 0 || charge.kind != LimitKind::Tokens {
            return;
        }
        let mut c = self.inner.lock();
        let tat = c.tats.get(&charge.key).copied().unwrap_or(0);
        let n = delta.unsigned_abs();
        let tat = if delta > 0 {
            gcra::charge(tat, now, charge.limit, n)
        } else {
            gcra::refund(tat, now, charge.limit, n)
        };
        c.set_tat(&charge.key, tat);
    }
}

fn rate_standing(tat: u64, now: u64, limit: u64) -> Standing {
    let s = gcra::standing(tat, now, limit);
    Standing {
        limit: s.limit,
        remaining: s.remaining,
        reset: Duration::from_nanos(s.reset_ns),
    }
}

fn concurrency_standing(held: u64, limit: u64) -> Standing {
    Standing {
        limit,
        remaining: limit.saturating_sub(held),
        reset: Duration::ZERO,
    }
}

impl Counters {
    fn standing(&self, charge: &Charge, now: u64) -> Standing {
        match charge.kind {
            LimitKind::Requests | LimitKind::Tokens => {
                let tat = self.tats.get(&charge.key).copied().unwrap_or(0);
                rate_standing(tat, now, charge.limit)
            }
            LimitKind::Concurrent => {
                let held = self.in_flight.get(&charge.key).copied().unwrap_or(0);
                concurrency_standing(held, charge.limit)
            }
        }
    }

    /// Adds `amount` to a concurrency counter and returns what it holds, copying its key only
    /// when the counter is new.
    fn add_in_flight(&mut self, key: &str, amount: u64) -> u64 {
        match self.in_flight.get_mut(key) {
            Some(held) => {
                *held = held.saturating_add(amount);
                *held
            }
            None => {
                self.in_flight.insert(key.to_owned(), amount);
                amount
            }
        }
    }

    /// Sets a rate counter's TAT, copying its key only when the counter is new.
    fn set_tat(&mut self, key: &str, tat: u64) {
        match self.tats.get_mut(key) {
            Some(held) => *held = tat,
            None => {
                self.tats.insert(key.to_owned(), tat);
            }
        }
    }

    /// Drops rate counters that are full again (TAT passed) once the maps have doubled since the
    /// last sweep, or a minute after it (so a burst of one-off keys goes within about a minute).
    fn sweep(&mut self, now: u64) {
        let held = self.tats.len() + self.in_flight.len();
        let stale = now.saturating_sub(self.last_sweep) >= gcra::WINDOW_NS;
        if held <= SWEEP_FLOOR || (held <= self.sweep_at && !stale) {
            return;
        }
        self.last_sweep = now;
        self.tats.retain(|_, tat| *tat > now);
        self.sweep_at = (2 * (self.tats.len() + self.in_flight.len())).max(SWEEP_FLOOR);
    }
}

#[async_trait]
impl LimitStore for InProcessLimits {
    async fn check_and_reserve(&self, charges: &[Charge]) -> Result<Vec<Standing>, Refusal> {
        self.check_at(charges, self.now())
    }

    fn reconcile(&self, charge: &Charge, delta: i64) {
        self.reconcile_at(charge, delta, self.now());
    }

    fn release(&self, charge: &Charge) {
        if charge.kind != LimitKind::Concurrent {
            return;
        }
        let mut c = self.inner.lock();
        if let Some(held) = c.in_flight.get_mut(&charge.key) {
            *held = held.saturating_sub(charge.amount);
            if *held == 0 {
                c.in_flight.remove(&charge.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn charge(key: &str, kind: LimitKind, limit: u64, amount: u64) -> Charge {
        Charge {
            key: key.into(),
            kind,
            limit,
            amount,
        }
    }

    #[test]
    fn a_request_is_admitted_by_all_its_limits_or_takes_from_none() {
        let store = InProcessLimits::default();
        let now = 5 * S;
        let rpm = charge("a:rpm", LimitKind::Requests, 10, 1);
        let tpm = charge("a:tpm", LimitKind::Tokens, 100, 60);
        let ok = store.check_at(&[rpm.clone(), tpm.clone()], now).unwrap();
        assert_eq!((ok[0].remaining, ok[1].remaining), (9, 40));
        // 60 more tokens do not fit: the request charge must not be taken either.
        let refused = store
            .check_at(&[rpm.clone(), tpm.clone()], now)
            .unwrap_err();
        assert_eq!(refused.index, 1);
        assert!(!refused.never);
        assert_eq!(
            refused.retry_after,
            Duration::from_secs(12),
            "20 tokens × 0.6 s"
        );
        assert_eq!(
            (
                refused.standings[0].remaining,
                refused.standings[1].remaining
            ),
            (9, 40)
        );
        let small = charge("a:tpm", LimitKind::Tokens, 100, 40);
        let ok = store.check_at(&[rpm, small], now).unwrap();
        assert_eq!((ok[0].remaining, ok[1].remaining), (8, 0));
    }

    #[test]
    fn concurrency_is_held_until_released() {
        let store = InProcessLimits::default();
        let slot = charge("r:conc", LimitKind::Concurrent, 2, 1);
        let one = std::slice::from_ref(&slot);
        assert_eq!(store.check_at(one, 0).unwrap()[0].remaining, 1);
        assert_eq!(store.check_at(one, 0).unwrap()[0].remaining, 0);
        let refused = store.check_at(one, 0).unwrap_err();
        assert_eq!(refused.retry_after, Duration::from_secs(1));
        store.release(&slot);
        assert!(store.check_at(one, 0).is_ok());
        store.release(&slot);
        store.release(&slot);
        assert_eq!(store.keys(), 0, "a counter at 0 is removed");
        // Releasing more than was taken does not bank slots.
        store.release(&slot);
        assert_eq!(store.check_at(one, 0).unwrap()[0].remaining, 1);
    }

    #[test]
    fn reconciling_moves_only_the_token_counter() {
        let store = InProcessLimits::default();
        let tpm = charge("k:tpm", LimitKind::Tokens, 1000, 100);
        store.check_at(std::slice::from_ref(&tpm), 0).unwrap();
        store.reconcile_at(&tpm, 250, 0);
        let probe = charge("k:tpm", LimitKind::Tokens, 1000, 0);
        assert_eq!(
            store.check_at(std::slice::from_ref(&probe), 0).unwrap()[0].remaining,
            650
        );
        store.reconcile_at(&tpm, -300, 0);
        assert_eq!(
            store.check_at(std::slice::from_ref(&probe), 0).unwrap()[0].remaining,
            950
        );
        // Past the limit: the next request waits.
        store.reconcile_at(&tpm, 2000, 0);
        let refused = store
            .check_at(&[charge("k:tpm", LimitKind::Tokens, 1000, 1)], 0)
            .unwrap_err();
        assert!(refused.retry_after > Duration::from_secs(60));
    }

    #[test]
    fn idle_keys_are_swept_without_changing_a_decision() {
        let store = InProcessLimits::default();
        for i in 0..(SWEEP_FLOOR + 1) {
            store
                .check_at(&[charge(&format!("ip:{i}"), LimitKind::Requests, 60, 1)], 0)
                .unwrap();
        }
        // One key still busy after a minute: it is two minutes of tokens in debt.
        let busy = charge("busy", LimitKind::Tokens, 10, 10);
        store.check_at(std::slice::from_ref(&busy), 0).unwrap();
        store.reconcile_at(&busy, 10, 0);
        assert_eq!(store.keys(), SWEEP_FLOOR + 2);
        // A minute on, every one-request key is full again (swept); `busy` is not (kept).
        let later = 61 * S;
        let one_token = charge("busy", LimitKind::Tokens, 10, 1);
        assert!(
            store
                .check_at(std::slice::from_ref(&one_token), later)
                .is_err()
        );
        assert_eq!(store.keys(), 1, "only the busy key is kept");
        assert!(
            store
                .check_at(&[charge("ip:0", LimitKind::Requests, 60, 60)], later)
                .is_ok(),
            "a swept key is full"
        );
    }
}
