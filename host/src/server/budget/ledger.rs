//! Where budget spend is counted: the [`BudgetLedger`] trait the request path calls, and the
//! in-process ledger. The fleet's ledger ([`crate::fleet::budgets::FleetLedger`]) implements the
//! same trait on Redis, so the request path does not change with a fleet.

use std::collections::HashMap;

use async_trait::async_trait;
use parking_lot::Mutex;

/// One budget's spend in one period.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LedgerKey {
    pub budget_id: String,
    /// Unix ms; 0 for `never`.
    pub period_start_ms: i64,
    /// Unix ms, exclusive; `None` for `never`. Not part of the identity (a function of the
    /// budget and the start): kept so that a ledger can drop and expire periods that are over.
    pub period_end_ms: Option<i64>,
}

impl LedgerKey {
    /// Whether the period is over at `now_ms`.
    pub fn ended(&self, now_ms: i64) -> bool {
        self.period_end_ms.is_some_and(|end| end <= now_ms)
    }
}

/// Why seeding a period from the request log failed (the period then counts from 0).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The request log could not be read.
    #[error("reading the request log: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// The spend of every budget's current period.
///
/// `spent` and `charge` are on the request path and never wait: a ledger that keeps its counts
/// elsewhere (Redis) reads a local copy and sends charges in the background. `seed` is called
/// once per period, before the period's budget is enforced, with what the request log says was
/// spent so far; only the first seed of a period counts, and only if the period saw no charge
/// yet: a period charged before it was seeded is one that began while its budget was already
/// enforced (a new day), whose requests the ledger counted itself (the log holds the same ones).
#[async_trait]
pub trait BudgetLedger: Send + Sync {
    /// What the period has spent, as this process knows it now (0 for a period it never saw).
    fn spent(&self, key: &LedgerKey) -> f64;
    /// Adds `usd` to the period's spend.
    fn charge(&self, key: &LedgerKey, usd: f64);
    /// Whether [`BudgetLedger::seed`] ran for this period.
    fn is_seeded(&self, key: &LedgerKey) -> bool;
    /// Adds `usd`, the request log's spend for the period, unless the period was seeded or
    /// charged already.
    async fn seed(&self, key: &LedgerKey, usd: f64);
}

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    spent: f64,
    seeded: bool,
    charged: bool,
    end: Option<i64>,
}

/// Spend per (budget id, period start), in this process: each replica counts its own requests
/// (plus what the shared request log held when it seeded).
///
/// Memory: one entry per budget and period seen; entries of periods that are over are dropped
/// whenever a period is seeded (at least once per snapshot change).
#[derive(Default)]
pub struct InProcessLedger {
    entries: Mutex<HashMap<(String, i64), Entry>>,
}

impl InProcessLedger {
    fn id(key: &LedgerKey) -> (String, i64) {
        (key.budget_id.clone(), key.period_start_ms)
    }

    /// Drops the periods that are over at `now_ms`.
    pub fn sweep(&self, now_ms: i64) {
        self.entries
            .lock()
            .retain(|_, e| e.end.is_none_or(|end| end > now_ms));
    }

    /// Periods held, for tests of the sweep.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

#[async_trait]
impl BudgetLedger for InProcessLedger {
    fn spent(&self, key: &LedgerKey) -> f64 {
        self.entries
            .lock()
            .get(&Self::id(key))
            .map_or(0.0, |e| e.spent)
    }

    fn charge(&self, key: &LedgerKey, usd: f64) {
        if !usd.is_finite() || usd <= 0.0 {
            return;
        }
        let mut entries = self.entries.lock();
        let e = entries.entry(Self::id(key)).or_default();
        e.spent += usd;
        e.charged = true;
        e.end = key.period_end_ms;
    }

    fn is_seeded(&self, key: &LedgerKey) -> bool {
        self.entries
            .lock()
            .get(&Self::id(key))
            .is_some_and(|e| e.seeded)
    }

    async fn seed(&self, key: &LedgerKey, usd: f64) {
        self.sweep(i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX));
        let mut entries = self.entries.lock();
        let e = entries.entry(Self::id(key)).or_default();
        if e.seeded {
            return;
        }
        e.seeded = true;
        e.end = key.period_end_ms;
        if !e.charged && usd.is_finite() && usd > 0.0 {
            e.spent += usd;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, start: i64, end: Option<i64>) -> LedgerKey {
        LedgerKey {
            budget_id: id.into(),
            period_start_ms: start,
            period_end_ms: end,
        }
    }

    #[tokio::test]
    async fn charges_add_up_per_budget_and_period() {
        let ledger = InProcessLedger::default();
        let today = key("b1", 1_000, Some(i64::MAX));
        let tomorrow = key("b1", 2_000, Some(i64::MAX));
        let other = key("b2", 1_000, Some(i64::MAX));
        assert_eq!(ledger.spent(&today), 0.0);
        ledger.charge(&today, 0.25);
        ledger.charge(&today, 0.5);
        ledger.charge(&other, 1.0);
        // Nothing, a negative or a non-number is not a charge.
        ledger.charge(&today, 0.0);
        ledger.charge(&today, -3.0);
        ledger.charge(&today, f64::NAN);
        assert_eq!(ledger.spent(&today), 0.75);
        assert_eq!(ledger.spent(&other), 1.0);
        assert_eq!(ledger.spent(&tomorrow), 0.0, "a new period starts at 0");
    }

    #[tokio::test]
    async fn only_the_first_seed_of_an_uncharged_period_counts() {
        let ledger = InProcessLedger::default();
        let k = key("b1", 1_000, None);
        assert!(!ledger.is_seeded(&k));
        ledger.seed(&k, 2.0).await;
        assert!(ledger.is_seeded(&k));
        ledger.seed(&k, 2.0).await;
        ledger.charge(&k, 0.5);
        assert_eq!(ledger.spent(&k), 2.5);
        // A period that began while enforced (charged, then seeded at the next snapshot): its
        // requests are in the log and in the ledger already.
        let next = key("b1", 2_000, None);
        ledger.charge(&next, 0.5);
        ledger.seed(&next, 0.5).await;
        assert!(ledger.is_seeded(&next));
        assert_eq!(ledger.spent(&next), 0.5);
    }

    #[tokio::test]
    async fn periods_that_are_over_are_dropped() {
        let ledger = InProcessLedger::default();
        ledger.charge(&key("old", 0, Some(10)), 1.0);
        ledger.charge(&key("never", 0, None), 1.0);
        ledger.charge(&key("now", 0, Some(i64::MAX)), 1.0);
        assert_eq!(ledger.len(), 3);
        ledger.sweep(11);
        assert_eq!(ledger.len(), 2);
        assert_eq!(ledger.spent(&key("never", 0, None)), 1.0);
        assert!(key("old", 0, Some(10)).ended(10));
        assert!(!key("never", 0, None).ended(i64::MAX));
    }
}
