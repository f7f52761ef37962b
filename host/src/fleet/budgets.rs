//! Budgets' spend on the fleet's Redis: one counter per budget and period,
//! `{prefix}:budget:{id}:{period_start_ms}`, that every replica adds its requests' cost to
//! (`INCRBYFLOAT`, in the background) and reads back every second into a local copy. The request
//! path reads the copy only: no round trip per request.
//!
//! So a replica sees the others' spend at most a second late (plus the requests still in flight,
//! whose cost is known only when they end). While Redis is unreachable, charges wait in the local
//! copy (still counted by this replica) and go out when it is back.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::Fleet;
use crate::server::budget::{BudgetLedger, LedgerKey};

/// How often the local copy is read back from Redis.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// How long a period's counter outlives its period in Redis (a replica that seeds late still
/// finds it; `never` counters do not expire).
const KEEP_AFTER_END_MS: i64 = 24 * 3600 * 1000;

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    /// The counter as Redis last gave it.
    shared: f64,
    /// Charges sent, not yet confirmed.
    sending: f64,
    /// Charges Redis did not take (unreachable): the next refresh sends them.
    unsent: f64,
    seeded: bool,
    /// The request log's spend, when Redis could not be told at seeding: the next refresh sets
    /// the counter to it unless another replica did.
    seed_unsent: Option<f64>,
    end: Option<i64>,
}

/// The budgets' ledger of a fleet replica.
pub struct FleetLedger {
    fleet: Arc<Fleet>,
    entries: Mutex<HashMap<(String, i64), Entry>>,
    this: Weak<FleetLedger>,
}

impl FleetLedger {
    /// The ledger, and its refresh task (which ends with the ledger).
    pub fn start(fleet: Arc<Fleet>) -> Arc<FleetLedger> {
        let ledger = Arc::new_cyclic(|this| FleetLedger {
            fleet,
            entries: Mutex::new(HashMap::new()),
            this: this.clone(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(refresh(Arc::downgrade(&ledger)));
        }
        ledger
    }

    fn redis_key(&self, id: &(String, i64)) -> String {
        self.fleet.key(&format!("budget:{}:{}", id.0, id.1))
    }

    fn id(key: &LedgerKey) -> (String, i64) {
        (key.budget_id.clone(), key.period_start_ms)
    }

    /// Sends `usd` (already counted as `sending`) of the period `id` to Redis; on success the
    /// local copy takes the new total, on failure the amount becomes unsent, for the next refresh.
    async fn send(&self, id: (String, i64), usd: f64, end: Option<i64>) {
        let key = self.redis_key(&id);
        let mut conn = self.fleet.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("INCRBYFLOAT").arg(&key).arg(usd);
        if let Some(end) = end {
            pipe.cmd("PEXPIREAT")
                .arg(&key)
                .arg(end.saturating_add(KEEP_AFTER_END_MS))
                .ignore();
        }
        let sent = tokio::time::timeout(
            Duration::from_secs(2),
            pipe.query_async::<(f64,)>(&mut conn),
        )
        .await;
        let mut entries = self.entries.lock();
        let e = entries.entry(id).or_default();
        e.sending -= usd;
        match sent {
            Ok(Ok((total,))) => e.shared = e.shared.max(total),
            _ => e.unsent += usd,
        }
    }

    /// `SET NX` of a period's counter to the request log's spend, and the counter as it is then.
    async fn set_seed(&self, id: &(String, i64), usd: f64, end: Option<i64>) -> Option<f64> {
        let redis_key = self.redis_key(id);
        let mut conn = self.fleet.conn.clone();
        let mut pipe = redis::pipe();
        let set = pipe.cmd("SET").arg(&redis_key).arg(usd.max(0.0)).arg("NX");
        if let Some(end) = end {
            set.arg("PXAT").arg(end.saturating_add(KEEP_AFTER_END_MS));
        }
        set.ignore();
        pipe.cmd("GET").arg(&redis_key);
        tokio::time::timeout(
            Duration::from_secs(2),
            pipe.query_async::<(Option<f64>,)>(&mut conn),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|(v,)| v)
    }

    /// Retries unsent charges and reads every counter back.
    async fn refresh_once(&self) {
        let now = i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX);
        type Pending = Vec<((String, i64), f64, Option<i64>)>;
        if !self.fleet.is_connected() {
            return;
        }
        let (ids, seeds, retries): (Vec<(String, i64)>, Pending, Pending) = {
            let mut entries = self.entries.lock();
            entries.retain(|_, e| {
                e.end.is_none_or(|end| end > now) || e.unsent > 0.0 || e.sending > 0.0
            });
            let ids = entries.keys().cloned().collect();
            let seeds = entries
                .iter_mut()
                .filter_map(|(id, e)| Some((id.clone(), e.seed_unsent.take()?, e.end)))
                .collect();
            // Moved to `sending` here: `send` makes them unsent again if Redis refuses.
            let retries = entries
                .iter_mut()
                .filter(|(_, e)| e.unsent > 0.0)
                .map(|(id, e)| {
                    let usd = std::mem::take(&mut e.unsent);
                    e.sending += usd;
                    (id.clone(), usd, e.end)
                })
                .collect();
            (ids, seeds, retries)
        };
        if ids.is_empty() {
            return;
        }
        for (id, usd, end) in seeds {
            if self.set_seed(&id, usd, end).await.is_none()
                && let Some(e) = self.entries.lock().get_mut(&id)
            {
                e.seed_unsent = Some(usd);
            }
        }
        for (id, usd, end) in retries {
            self.send(id, usd, end).await;
        }
        let keys: Vec<String> = ids.iter().map(|id| self.redis_key(id)).collect();
        let mut conn = self.fleet.conn.clone();
        let mut mget = redis::cmd("MGET");
        mget.arg(&keys);
        let Ok(Ok(values)) = tokio::time::timeout(
            Duration::from_secs(2),
            mget.query_async::<Vec<Option<f64>>>(&mut conn),
        )
        .await
        else {
            return;
        };
        let mut entries = self.entries.lock();
        for (id, value) in ids.into_iter().zip(values) {
            if let (Some(e), Some(v)) = (entries.get_mut(&id), value) {
                e.shared = v;
            }
        }
    }
}

async fn refresh(ledger: Weak<FleetLedger>) {
    let mut timer = tokio::time::interval(REFRESH_EVERY);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        timer.tick().await;
        let Some(ledger) = ledger.upgrade() else {
            return;
        };
        ledger.refresh_once().await;
    }
}

#[async_trait]
impl BudgetLedger for FleetLedger {
    fn spent(&self, key: &LedgerKey) -> f64 {
        let mut entries = self.entries.lock();
        // A period read for the first time is read back from Redis from the next refresh on.
        let e = entries.entry(Self::id(key)).or_insert_with(|| Entry {
            end: key.period_end_ms,
            ..Entry::default()
        });
        e.shared + e.sending + e.unsent
    }

    fn charge(&self, key: &LedgerKey, usd: f64) {
        if !usd.is_finite() || usd <= 0.0 {
            return;
        }
        let id = Self::id(key);
        let runtime = tokio::runtime::Handle::try_current().ok();
        let send = self.fleet.is_connected() && runtime.is_some();
        {
            let mut entries = self.entries.lock();
            let e = entries.entry(id.clone()).or_default();
            e.end = key.period_end_ms;
            if send {
                e.sending += usd;
            } else {
                // The first refresh after Redis is back sends it.
                e.unsent += usd;
                return;
            }
        }
        let (Some(this), Some(runtime)) = (self.this.upgrade(), runtime) else {
            return;
        };
        let end = key.period_end_ms;
        runtime.spawn(async move {
            this.send(id, usd, end).await;
        });
    }

    fn is_seeded(&self, key: &LedgerKey) -> bool {
        self.entries
            .lock()
            .get(&Self::id(key))
            .is_some_and(|e| e.seeded)
    }

    /// The first replica to seed a period sets its counter (`SET NX`); the others, and a replica
    /// that restarts mid-period, find it set and read it. Redis unreachable: the request log's
    /// spend counts here, and the counter is set to it once Redis answers.
    async fn seed(&self, key: &LedgerKey, usd: f64) {
        let id = Self::id(key);
        let shared = self.set_seed(&id, usd, key.period_end_ms).await;
        let mut entries = self.entries.lock();
        let e = entries.entry(id).or_default();
        if e.seeded {
            return;
        }
        e.seeded = true;
        e.end = key.period_end_ms;
        if shared.is_none() && (e.shared > 0.0 || e.sending > 0.0 || e.unsent > 0.0) {
            // Charged before it was seeded (a period that began while enforced): counted already.
            return;
        }
        match shared {
            Some(v) => e.shared = v,
            None => {
                e.shared = usd.max(0.0);
                e.seed_unsent = Some(usd.max(0.0));
            }
        }
    }
}
