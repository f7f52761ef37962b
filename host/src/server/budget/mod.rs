//! Budgets at the edge: before any upstream is contacted, a caller whose hard budget is spent is
//! refused (402); when a request ends, its cost (the request log's `cost_usd`: the sum over its
//! attempts) is charged to every budget that applies to its consumer. The spend is counted by a
//! [`BudgetLedger`]: this process's own, or the fleet's on Redis.
//!
//! A request's cost is known only when it ends, so a budget holds exactly up to the cost of the
//! requests in flight when it was reached: they were admitted under the limit and are charged
//! past it.

pub mod ledger;

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::entity::{Budget, BudgetMode, BudgetPeriod};
use crate::routing::dispatch::AttemptLog;
use crate::store::{Snapshot, Store};
use crate::telemetry::metrics;
pub use ledger::{BudgetLedger, InProcessLedger, LedgerError, LedgerKey};

fn now_ms() -> i64 {
    i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX)
}

/// The ledger's key for `budget`'s period at `now_ms`.
pub fn key(budget: &Budget, now_ms: i64) -> LedgerKey {
    let (start, end) = budget.period.bounds(now_ms);
    LedgerKey {
        budget_id: budget.id.clone(),
        period_start_ms: start,
        period_end_ms: end,
    }
}

/// Where a budget stands in its current period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    pub spent_usd: f64,
    /// `limit − spent`; below 0 once the limit was passed.
    pub remaining_usd: f64,
    pub period_start_ms: i64,
    /// `None` for `never`.
    pub period_end_ms: Option<i64>,
}

/// A hard budget of the caller is spent; nothing was sent upstream.
#[derive(Debug, Clone)]
pub struct BudgetExceeded {
    /// `budget:<scope>:<budget id>`: the request log's `rate_limited_by`.
    pub refused_by: String,
    /// `consumer` or `group`: the metric's label.
    pub scope: &'static str,
    /// The client's message: which budget, its limit and spend, and when it resets.
    pub message: String,
    /// Seconds until the period ends (at least 1); `None` for `never`.
    pub retry_after_seconds: Option<u64>,
}

/// The budgets' ledger, and which soft budgets this process already warned about.
pub struct Budgets {
    ledger: Arc<dyn BudgetLedger>,
    /// (budget id, period start) of soft budgets crossed, warned once each.
    warned: Mutex<HashSet<(String, i64)>>,
}

impl Budgets {
    pub fn new(ledger: Arc<dyn BudgetLedger>) -> Budgets {
        Budgets {
            ledger,
            warned: Mutex::new(HashSet::new()),
        }
    }

    pub fn ledger(&self) -> &dyn BudgetLedger {
        &*self.ledger
    }

    /// Where `budget` stands now.
    pub fn standing(&self, budget: &Budget) -> Standing {
        let key = key(budget, now_ms());
        let spent_usd = self.ledger.spent(&key);
        Standing {
            spent_usd,
            remaining_usd: budget.limit_usd - spent_usd,
            period_start_ms: key.period_start_ms,
            period_end_ms: key.period_end_ms,
        }
    }

    /// The smallest `remaining_usd` among `budgets` (hard or soft); `None` without budgets.
    pub fn remaining(&self, budgets: &[Budget]) -> Option<f64> {
        budgets
            .iter()
            .map(|b| self.standing(b).remaining_usd)
            .reduce(f64::min)
    }

    /// Refuses when a hard budget among `budgets` is spent (`spent >= limit`): the first such
    /// budget, in the order given (the consumer's own, then its groups'). Reads local state only.
    pub fn check(&self, budgets: &[Budget]) -> Result<(), BudgetExceeded> {
        let now = now_ms();
        for budget in budgets.iter().filter(|b| b.mode == BudgetMode::Hard) {
            let key = key(budget, now);
            let spent = self.ledger.spent(&key);
            if spent < budget.limit_usd {
                continue;
            }
            let retry_after_seconds = key
                .period_end_ms
                .map(|end| u64::try_from((end - now + 999) / 1000).unwrap_or(1).max(1));
            let resets = match key.period_end_ms {
                Some(end) => format!(
                    "it resets at {} (in {} s)",
                    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(end)
                        .unwrap_or_default()
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    retry_after_seconds.unwrap_or(0)
                ),
                None => "it never resets: raise its limit to continue".to_owned(),
            };
            let period = match budget.period {
                BudgetPeriod::Never => "in total".to_owned(),
                p => format!("per {}", p.as_str()),
            };
            return Err(BudgetExceeded {
                refused_by: format!("budget:{}:{}", budget.scope.as_str(), budget.id),
                scope: budget.scope.as_str(),
                message: format!(
                    "budget {} ({}) exceeded: {spent:.6} USD spent of {:.6} USD {period}; {resets}",
                    budget.id,
                    budget.describe(),
                    budget.limit_usd,
                ),
                retry_after_seconds,
            });
        }
        Ok(())
    }

    /// Charges `usd` to each of `budgets` in its current period, and warns (once per budget and
    /// period) about soft budgets this charge took past their limit.
    pub fn charge(&self, budgets: &[Budget], usd: f64) {
        if !usd.is_finite() || usd <= 0.0 {
            return;
        }
        let now = now_ms();
        for budget in budgets {
            let key = key(budget, now);
            self.ledger.charge(&key, usd);
            if budget.mode != BudgetMode::Soft {
                continue;
            }
            let spent = self.ledger.spent(&key);
            if spent < budget.limit_usd {
                continue;
            }
            let first = {
                // One entry per soft budget and period crossed: a few a day at most.
                self.warned
                    .lock()
                    .insert((budget.id.clone(), key.period_start_ms))
            };
            if first {
                metrics::budget_soft_exceeded(budget.scope.as_str());
                tracing::warn!(
                    budget = %budget.id,
                    subject = %budget.describe(),
                    spent_usd = spent,
                    limit_usd = budget.limit_usd,
                    "soft budget exceeded: requests are still served"
                );
            }
        }
    }

    /// A charge for one request to `budgets`, made when it is dropped (the request ended) from
    /// what its attempts cost. `None` without budgets.
    pub fn charge_on_drop(self: &Arc<Self>, budgets: &Arc<[Budget]>) -> Option<BudgetCharge> {
        (!budgets.is_empty()).then(|| BudgetCharge {
            budgets: self.clone(),
            applies_to: budgets.clone(),
            attempts: None,
        })
    }

    /// Seeds every budget of `snapshot` whose current period this process has not seeded, from
    /// the request log. Called before the snapshot is served, so a budget is never enforced
    /// unseeded (a restarted gateway knows what was spent before). A failed read is logged and
    /// the period counts from what was charged since.
    pub async fn seed(&self, snapshot: &Snapshot, store: &Store) {
        let now = now_ms();
        let mut seeds = Vec::new();
        for budget in snapshot.budgets() {
            let key = key(budget, now);
            if self.ledger.is_seeded(&key) {
                continue;
            }
            let usd = match self
                .spent_in_log(snapshot, store, budget, key.period_start_ms)
                .await
            {
                Ok(usd) => usd,
                Err(e) => {
                    tracing::warn!(
                        budget = %budget.id,
                        "cannot seed the budget's spend ({e}); it counts from now"
                    );
                    0.0
                }
            };
            seeds.push((key, usd));
        }
        // Together: a fleet ledger waits on Redis for each (at most 2 s when it is down).
        futures::future::join_all(seeds.iter().map(|(key, usd)| self.ledger.seed(key, *usd))).await;
    }

    /// Seeds one budget now (the admin API's create and update), so its first answer shows
    /// what was spent.
    pub async fn seed_one(&self, snapshot: &Snapshot, store: &Store, budget: &Budget) {
        let key = key(budget, now_ms());
        if self.ledger.is_seeded(&key) {
            return;
        }
        if let Ok(usd) = self
            .spent_in_log(snapshot, store, budget, key.period_start_ms)
            .await
        {
            self.ledger.seed(&key, usd).await;
        }
    }

    /// What the request log holds for `budget`'s consumers since `since_ms`. The log names
    /// consumers by name: a consumer budget reads its consumer's rows, a group budget those of
    /// every consumer in the group (`default`: consumers without groups).
    async fn spent_in_log(
        &self,
        snapshot: &Snapshot,
        store: &Store,
        budget: &Budget,
        since_ms: i64,
    ) -> Result<f64, LedgerError> {
        use crate::entity::BudgetScope;
        let names: Vec<String> = match budget.scope {
            BudgetScope::Consumer => snapshot
                .consumer(&budget.subject)
                .map(|c| c.name.clone())
                .into_iter()
                .collect(),
            BudgetScope::Group => snapshot
                .rows
                .consumers
                .iter()
                .filter(|c| {
                    c.groups.contains(&budget.subject)
                        || (c.groups.is_empty() && budget.subject == crate::config::DEFAULT_GROUP)
                })
                .map(|c| c.name.clone())
                .collect(),
        };
        Ok(crate::store::api_log_query::spent_since(store, &names, since_ms).await?)
    }

    /// Sets `switchyard_budget_spent_usd` for every budget of `snapshot` before a scrape.
    pub fn refresh_metrics(&self, snapshot: &Snapshot) {
        for budget in snapshot.budgets() {
            metrics::state::budget_spent(&budget.id, self.standing(budget).spent_usd);
        }
    }
}

/// One request's charge to its budgets, booked when dropped: the end of a whole answer, of a
/// stream (its summary task), or of a request whose client left.
pub struct BudgetCharge {
    budgets: Arc<Budgets>,
    applies_to: Arc<[Budget]>,
    attempts: Option<AttemptLog>,
}

impl BudgetCharge {
    /// The attempts whose cost is the request's.
    pub fn track(&mut self, attempts: &AttemptLog) {
        self.attempts = Some(attempts.clone());
    }
}

impl Drop for BudgetCharge {
    fn drop(&mut self) {
        let Some(attempts) = &self.attempts else {
            return;
        };
        if let Some(usd) = attempts.cost_usd() {
            self.budgets.charge(&self.applies_to, usd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::BudgetScope;

    fn budget(id: &str, mode: BudgetMode, period: BudgetPeriod, limit_usd: f64) -> Budget {
        Budget {
            id: id.into(),
            scope: BudgetScope::Consumer,
            subject: "cs_1".into(),
            period,
            mode,
            limit_usd,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    #[test]
    fn a_spent_hard_budget_refuses_and_says_when_it_resets() {
        let budgets = Budgets::new(Arc::new(InProcessLedger::default()));
        let day = budget("bg_day", BudgetMode::Hard, BudgetPeriod::Day, 1.0);
        let soft = budget("bg_soft", BudgetMode::Soft, BudgetPeriod::Day, 0.5);
        let all = [day.clone(), soft.clone()];
        assert!(budgets.check(&all).is_ok());
        assert_eq!(budgets.remaining(&all), Some(0.5));
        budgets.charge(&all, 0.75);
        // The soft budget is past its limit: still served.
        assert!(budgets.check(&all).is_ok());
        assert_eq!(budgets.remaining(&all), Some(-0.25));
        budgets.charge(&all, 0.25);
        let refused = budgets.check(&all).unwrap_err();
        assert_eq!(refused.refused_by, "budget:consumer:bg_day");
        assert_eq!(refused.scope, "consumer");
        let retry = refused.retry_after_seconds.unwrap();
        assert!((1..=86_400).contains(&retry), "{retry}");
        assert!(
            refused.message.contains("consumer:cs_1")
                && refused
                    .message
                    .contains("1.000000 USD spent of 1.000000 USD per day"),
            "{}",
            refused.message
        );
        // A `never` budget has no reset.
        let never = budget("bg_never", BudgetMode::Hard, BudgetPeriod::Never, 0.1);
        budgets.charge(std::slice::from_ref(&never), 0.1);
        let refused = budgets.check(&[never]).unwrap_err();
        assert_eq!(refused.retry_after_seconds, None);
        assert!(
            refused.message.contains("never resets"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_soft_budget_is_warned_about_once_per_period() {
        let budgets = Budgets::new(Arc::new(InProcessLedger::default()));
        let soft = [budget("bg_soft", BudgetMode::Soft, BudgetPeriod::Week, 0.5)];
        budgets.charge(&soft, 0.4);
        assert!(budgets.warned.lock().is_empty());
        budgets.charge(&soft, 0.2);
        budgets.charge(&soft, 0.2);
        assert_eq!(budgets.warned.lock().len(), 1);
    }
}
