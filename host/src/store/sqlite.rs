//! The SQLite backend. Other processes' writes are noticed by polling the `config_version` row
//! every 500 ms: SQLite has no notifications across processes, and one indexed single-row read
//! twice a second costs nothing.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::{Sqlite, SqlitePool, Transaction};

use super::feed::Feed;

const BACKEND: &str = "sqlite";
const POLL_EVERY: Duration = Duration::from_millis(500);

/// Configuration storage in a SQLite database.
#[derive(Debug)]
pub struct SqliteConfigStore {
    pool: SqlitePool,
    feed: Arc<Feed>,
}

impl SqliteConfigStore {
    /// `pool` must be migrated.
    pub fn new(pool: SqlitePool) -> SqliteConfigStore {
        SqliteConfigStore {
            pool,
            feed: Arc::new(Feed::default()),
        }
    }

    fn db_error(&self, source: sqlx::Error) -> super::StoreError {
        super::StoreError::Database {
            backend: BACKEND,
            source,
        }
    }

    /// `BEGIN IMMEDIATE` takes the write lock up front (waiting out the busy timeout), so two
    /// writers never both read and then fail to upgrade; then bumps the version.
    async fn begin_write(&self) -> Result<(Transaction<'static, Sqlite>, i64), super::StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.db_error(e))?;
        let version = sqlx::query_scalar::<Sqlite, i64>(
            "UPDATE config_version SET version = version + 1 WHERE id = 1 RETURNING version",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| self.db_error(e))?;
        Ok((tx, version))
    }

    /// In WAL mode a read transaction sees one consistent state from its first read on.
    async fn begin_read(&self) -> Result<Transaction<'static, Sqlite>, super::StoreError> {
        self.pool.begin().await.map_err(|e| self.db_error(e))
    }

    fn committed(&self, version: i64) {
        self.feed.publish(version);
    }

    fn watch_feed(&self) -> tokio::sync::watch::Receiver<i64> {
        if self.feed.claim_start() {
            tokio::spawn(poll(self.pool.clone(), Arc::downgrade(&self.feed)));
        }
        self.feed.subscribe()
    }
}

/// Polls until the store is dropped. Errors are logged once per outage.
async fn poll(pool: SqlitePool, feed: Weak<Feed>) {
    let mut timer = tokio::time::interval(POLL_EVERY);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        timer.tick().await;
        let Some(feed) = feed.upgrade() else {
            return;
        };
        match sqlx::query_scalar::<Sqlite, i64>("SELECT version FROM config_version WHERE id = 1")
            .fetch_one(&pool)
            .await
        {
            Ok(version) => {
                if failing {
                    tracing::info!("sqlite: reading the configuration version works again");
                }
                failing = false;
                feed.health.succeeded();
                feed.publish(version);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("sqlite: cannot read the configuration version: {e}");
                }
                failing = true;
                feed.health
                    .failed(format!("reading the configuration version: {e}"));
            }
        }
    }
}

super::config_store::impl_config_store!(SqliteConfigStore, sqlx::Sqlite);
