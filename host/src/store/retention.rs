//! Request-log retention: rows older than `database.request_log_retention_days` are deleted by a
//! background task, in batches of [`BATCH_ROWS`]. The same transaction adds what each batch's rows
//! cost to `api_log_spend_days` (per consumer and the UTC day the row was made in, migration 0024).
//! Every budget period starts at a UTC midnight, and a row made after a midnight is in a day that
//! starts at or after it, so a budget's spend (the log's rows since its start plus the rolled-up
//! days since its start, [`super::api_log_query::spent_since`]) is the same before and after any
//! prune, even one that splits a day: every row is counted in exactly one of the two tables.
//!
//! Deleted rows' pages are reused by later rows: a SQLite file stops growing once it holds the
//! retention's worth of rows, but does not shrink (`VACUUM` would rewrite it whole, holding the
//! write lock throughout).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use utoipa::ToSchema;

use super::health::{SharedTaskHealth, TaskHealth};
use super::{Pool, Store, StoreError};
use crate::entity::BudgetPeriod;

/// A UTC day, in milliseconds.
pub const DAY_MS: i64 = 86_400_000;
/// Rows deleted per transaction. A SQLite transaction holds the file's write lock, which the
/// request-log writer waits out (its queue holds 16,384 rows); a batch of 2,000 rows with their
/// indexes takes tens of milliseconds.
pub const BATCH_ROWS: i64 = 2_000;
/// Between passes. The cutoff moves with the clock, so a pass deletes about a minute's rows: the
/// work is spread over the day rather than due at once.
const PASS_EVERY: Duration = Duration::from_secs(60);
/// The first pass, once the gateway has started.
const FIRST_PASS_AFTER: Duration = Duration::from_secs(1);
/// The first retry after a failed pass ([`retry_after`]).
const RETRY_FIRST: Duration = Duration::from_secs(5);
/// The least pause between two batches of a pass. A pause is at least twice as long as the batch
/// took, so that catching up on a backlog (retention turned on for a large log, or a database
/// back after an outage) holds the write lock and a core at most a third of the time: at half,
/// the gateway served 0.72× its requests a second while it pruned (`bench/retention.py`).
const MIN_PAUSE: Duration = Duration::from_millis(20);

/// The first moment whose rows are kept: `keep_days` days of 24 hours before `now_ms`.
pub fn cutoff_ms(now_ms: i64, keep_days: u32) -> i64 {
    now_ms.saturating_sub(i64::from(keep_days).saturating_mul(DAY_MS))
}

/// What the retention task has done, for `/health/deep`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RetentionHealth {
    /// Days kept before today (`database.request_log_retention_days`); `null`: every row is kept.
    pub keep_days: Option<u32>,
    /// Rows older than this (Unix ms) are pruned; `null` when none are.
    pub cutoff_ms: Option<i64>,
    /// Rows this process pruned since start.
    pub pruned_rows: u64,
    /// The passes: when one last finished, and how they failed since.
    #[serde(flatten)]
    pub passes: TaskHealth,
}

/// The retention task's shared state: its setting and counters.
#[derive(Debug, Clone, Default)]
pub struct Retention {
    keep_days: Option<u32>,
    pruned: Arc<AtomicU64>,
    passes: SharedTaskHealth,
}

impl Retention {
    /// Starts pruning `store`'s request log to `keep_days` (none: keeps every row, starts nothing).
    pub fn start(store: Store, keep_days: Option<std::num::NonZeroU32>) -> Retention {
        let retention = Retention {
            keep_days: keep_days.map(std::num::NonZeroU32::get),
            ..Retention::default()
        };
        match retention.keep_days {
            // Said at start: an upgrade from a version that kept every row starts deleting.
            Some(days) => {
                tracing::info!(
                    "api_logs: rows older than {days} days are pruned \
                     (database.request_log_retention_days; 0 keeps every row)"
                );
                tokio::spawn(run(store, days, retention.clone()));
            }
            None => tracing::info!("api_logs: every row is kept (request_log_retention_days: 0)"),
        }
        retention
    }

    /// Rows pruned since start.
    pub fn pruned_rows(&self) -> u64 {
        self.pruned.load(Ordering::Relaxed)
    }

    pub fn health(&self) -> RetentionHealth {
        RetentionHealth {
            keep_days: self.keep_days,
            cutoff_ms: self
                .keep_days
                .map(|days| cutoff_ms(super::health::now_ms(), days)),
            pruned_rows: self.pruned_rows(),
            passes: self.passes.get(),
        }
    }
}

async fn run(store: Store, keep_days: u32, retention: Retention) {
    let mut wait = FIRST_PASS_AFTER;
    loop {
        tokio::time::sleep(wait).await;
        let cutoff = cutoff_ms(super::health::now_ms(), keep_days);
        match pass(&store, cutoff, &retention.pruned).await {
            Ok(rows) => {
                if rows > 0 {
                    tracing::info!(
                        rows,
                        cutoff_ms = cutoff,
                        "api_logs: pruned rows older than {keep_days} days"
                    );
                }
                retention.passes.succeeded();
                wait = PASS_EVERY;
            }
            Err(e) => {
                tracing::warn!("api_logs: pruning rows older than {keep_days} days failed: {e}");
                retention.passes.failed(format!("pruning: {e}"));
                wait = retry_after(retention.passes.get().consecutive_failures);
            }
        }
    }
}

/// The wait before the next pass after `failures` failed ones in a row: 5 s, doubling up to
/// [`PASS_EVERY`], so that a database that was briefly unwritable is pruned (and `/health/deep`
/// says so) within seconds of its return, and one that stays broken is not hammered.
fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (RETRY_FIRST * 2_u32.pow(doublings)).min(PASS_EVERY)
}

/// Prunes every row created before `cutoff_ms`, a batch at a time, pausing between batches;
/// returns how many it pruned (also added to `pruned` batch by batch).
pub async fn pass(store: &Store, cutoff_ms: i64, pruned: &AtomicU64) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let started = Instant::now();
        let rows = prune_batch(store, cutoff_ms, BATCH_ROWS).await?;
        pruned.fetch_add(rows, Ordering::Relaxed);
        total += rows;
        if rows < BATCH_ROWS as u64 {
            return Ok(total);
        }
        tokio::time::sleep((started.elapsed() * 2).max(MIN_PAUSE)).await;
    }
}

/// One deleted row: what its day's roll-up needs.
type Gone = (Option<String>, i64, Option<f64>);

/// Deletes up to `rows` of the oldest rows created before `cutoff_ms` and adds their spend to
/// their consumers' days, in one transaction; returns how many rows it deleted.
///
/// The rows come back from the `DELETE` itself (`RETURNING`), so only the transaction that
/// deleted a row rolls it up: on PostgreSQL, replicas pruning at once take disjoint batches
/// (`SKIP LOCKED`) and never count a row twice; on SQLite the transaction holds the write lock
/// from its start.
pub async fn prune_batch(store: &Store, cutoff_ms: i64, rows: i64) -> Result<u64, StoreError> {
    macro_rules! prune {
        ($db:ty, $tx:expr, $delete:expr) => {{
            let gone: Vec<Gone> = sqlx::query_as::<$db, Gone>($delete)
                .bind(cutoff_ms)
                .bind(rows)
                .fetch_all(&mut *$tx)
                .await?;
            for ((consumer, day), (usd, requests)) in roll_up(&gone) {
                sqlx::query::<$db>(UPSERT_DAY)
                    .bind(consumer)
                    .bind(day)
                    .bind(usd)
                    .bind(requests)
                    .execute(&mut *$tx)
                    .await?;
            }
            $tx.commit().await?;
            gone.len() as u64
        }};
    }
    let result: Result<u64, sqlx::Error> = async {
        Ok(match store.pool() {
            Pool::Sqlite(pool) => {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                prune!(sqlx::Sqlite, tx, DELETE_SQLITE)
            }
            Pool::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                prune!(sqlx::Postgres, tx, DELETE_POSTGRES)
            }
        })
    }
    .await;
    result.map_err(|source| StoreError::Database {
        backend: store.backend(),
        source,
    })
}

/// The oldest rows first, along the `created_at_ms` index.
const DELETE_SQLITE: &str = "DELETE FROM api_logs WHERE id IN \
     (SELECT id FROM api_logs WHERE created_at_ms < $1 ORDER BY created_at_ms LIMIT $2) \
     RETURNING consumer, created_at_ms, cost_usd";
const DELETE_POSTGRES: &str = "DELETE FROM api_logs WHERE id IN \
     (SELECT id FROM api_logs WHERE created_at_ms < $1 ORDER BY created_at_ms LIMIT $2 \
      FOR UPDATE SKIP LOCKED) \
     RETURNING consumer, created_at_ms, cost_usd";
const UPSERT_DAY: &str = "INSERT INTO api_log_spend_days (consumer, day_start_ms, cost_usd, requests) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, day_start_ms) DO UPDATE SET \
     cost_usd = api_log_spend_days.cost_usd + excluded.cost_usd, \
     requests = api_log_spend_days.requests + excluded.requests";

/// The deleted rows' spend and count per (consumer, UTC day); rows without a consumer belong to
/// no budget and are not kept.
fn roll_up(gone: &[Gone]) -> BTreeMap<(&str, i64), (f64, i64)> {
    let mut days = BTreeMap::new();
    for (consumer, created_at_ms, cost_usd) in gone {
        let Some(consumer) = consumer.as_deref() else {
            continue;
        };
        // The budgets' own day, so a day period and its roll-up can never disagree on a row.
        let (day, _) = BudgetPeriod::Day.bounds(*created_at_ms);
        let entry = days.entry((consumer, day)).or_insert((0.0, 0));
        entry.0 += cost_usd.unwrap_or(0.0);
        entry.1 += 1;
    }
    days
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cutoff_is_whole_days_back() {
        let noon = 20 * DAY_MS + DAY_MS / 2;
        assert_eq!(cutoff_ms(noon, 1), 19 * DAY_MS + DAY_MS / 2);
        assert_eq!(cutoff_ms(noon, 30), -10 * DAY_MS + DAY_MS / 2);
        assert_eq!(cutoff_ms(i64::MIN, 1), i64::MIN, "saturates");
    }

    #[test]
    fn a_failed_pass_is_retried_soon_then_less_often() {
        let waits: Vec<u64> = (1..=10).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60, 60, 60, 60, 60]);
        assert_eq!(retry_after(u32::MAX), PASS_EVERY);
    }

    #[test]
    fn deleted_rows_roll_up_per_consumer_and_day() {
        let at = |day: i64, ms: i64| day * DAY_MS + ms;
        let gone: Vec<Gone> = vec![
            (Some("alice".into()), at(3, 5), Some(0.5)),
            (Some("alice".into()), at(3, DAY_MS - 1), Some(0.25)),
            (Some("alice".into()), at(4, 0), None),
            (Some("bob".into()), at(3, 7), Some(1.0)),
            (None, at(3, 9), Some(8.0)),
        ];
        let days: Vec<_> = roll_up(&gone).into_iter().collect();
        assert_eq!(
            days,
            [
                (("alice", 3 * DAY_MS), (0.75, 2)),
                (("alice", 4 * DAY_MS), (0.0, 1)),
                (("bob", 3 * DAY_MS), (1.0, 1)),
            ]
        );
    }
}
