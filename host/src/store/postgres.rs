//! The PostgreSQL backend. Every write sends `NOTIFY switchyard_config` in its transaction
//! (delivered at commit, dropped on rollback); every process LISTENs and learns of other
//! processes' writes at once. A slow poll of `config_version` backs this up, for notifications
//! lost while the listening connection was being re-established.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Postgres, Transaction};

use super::feed::Feed;

const BACKEND: &str = "postgres";
/// NOTIFY channels are per database, not per schema: the payload is `<schema>:<version>` and
/// listeners ignore other schemas' changes.
const CHANNEL: &str = "switchyard_config";
const SAFETY_POLL: Duration = Duration::from_secs(5);

/// Configuration storage in a PostgreSQL database (the schema first on the connection's
/// `search_path`).
#[derive(Debug)]
pub struct PgConfigStore {
    pool: PgPool,
    schema: String,
    feed: Arc<Feed>,
}

impl PgConfigStore {
    /// `pool` must be migrated.
    pub async fn new(pool: PgPool) -> Result<PgConfigStore, super::StoreError> {
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&pool)
            .await
            .map_err(|source| super::StoreError::Database {
                backend: BACKEND,
                source,
            })?;
        Ok(PgConfigStore {
            pool,
            schema,
            feed: Arc::new(Feed::default()),
        })
    }

    fn db_error(&self, source: sqlx::Error) -> super::StoreError {
        super::StoreError::Database {
            backend: BACKEND,
            source,
        }
    }

    /// Bumping the version first takes its row lock, which serialises configuration writes from
    /// every process until commit.
    async fn begin_write(
        &self,
    ) -> Result<(Transaction<'static, Postgres>, i64), super::StoreError> {
        let mut tx = self.pool.begin().await.map_err(|e| self.db_error(e))?;
        let version = sqlx::query_scalar::<Postgres, i64>(
            "UPDATE config_version SET version = version + 1 WHERE id = 1 RETURNING version",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| self.db_error(e))?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(format!("{}:{version}", self.schema))
            .execute(&mut *tx)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok((tx, version))
    }

    /// One snapshot of the whole database for every statement of the transaction.
    async fn begin_read(&self) -> Result<Transaction<'static, Postgres>, super::StoreError> {
        self.pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(|e| self.db_error(e))
    }

    fn committed(&self, version: i64) {
        self.feed.publish(version);
    }

    fn watch_feed(&self) -> tokio::sync::watch::Receiver<i64> {
        if self.feed.claim_start() {
            tokio::spawn(listen(
                self.pool.clone(),
                self.schema.clone(),
                Arc::downgrade(&self.feed),
            ));
        }
        self.feed.subscribe()
    }
}

/// Listens until the store is dropped, re-creating the listener after errors.
async fn listen(pool: PgPool, schema: String, feed: Weak<Feed>) {
    let mut failures = 0u32;
    while feed.strong_count() > 0 {
        match listen_once(&pool, &schema, &feed, &mut failures).await {
            Ok(()) => return,
            Err(e) => {
                if let Some(feed) = feed.upgrade() {
                    feed.health
                        .failed(format!("listening for configuration changes: {e}"));
                }
                failures += 1;
                if failures == 1 {
                    tracing::warn!(
                        "postgres: listening for configuration changes failed, retrying: {e}"
                    );
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Reads the version into the feed; false when the store is gone.
async fn refresh(pool: &PgPool, feed: &Weak<Feed>) -> Result<bool, sqlx::Error> {
    let version =
        sqlx::query_scalar::<Postgres, i64>("SELECT version FROM config_version WHERE id = 1")
            .fetch_one(pool)
            .await?;
    match feed.upgrade() {
        Some(feed) => {
            feed.health.succeeded();
            feed.publish(version);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Ok when the store is gone; Err when the listener broke.
async fn listen_once(
    pool: &PgPool,
    schema: &str,
    feed: &Weak<Feed>,
    failures: &mut u32,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    // Writes committed before LISTEN took effect sent no notification we could see.
    if !refresh(pool, feed).await? {
        return Ok(());
    }
    if *failures > 0 {
        tracing::info!("postgres: listening for configuration changes again");
        *failures = 0;
    }
    // A stream keeps the in-flight receive inside itself, so losing a `select!` race to the
    // timer below does not drop a half-read notification.
    let mut notifications = Box::pin(futures::stream::unfold(listener, |mut l| async move {
        let next = l.try_recv().await;
        Some((next, l))
    }));
    let mut safety = tokio::time::interval(SAFETY_POLL);
    safety.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(next) = notifications.next() => match next? {
                Some(n) => {
                    let version = n
                        .payload()
                        .rsplit_once(':')
                        .filter(|(s, _)| *s == schema)
                        .and_then(|(_, v)| v.parse::<i64>().ok());
                    if let Some(version) = version {
                        let Some(feed) = feed.upgrade() else {
                            return Ok(());
                        };
                        feed.publish(version);
                    }
                }
                // The connection dropped and was re-established: anything sent in between is lost.
                None => {
                    if !refresh(pool, feed).await? {
                        return Ok(());
                    }
                }
            },
            _ = safety.tick() => {
                match refresh(pool, feed).await {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    Err(e) => {
                        tracing::debug!("postgres: polling the configuration version: {e}");
                        if let Some(feed) = feed.upgrade() {
                            feed.health.failed(format!("polling the configuration version: {e}"));
                        }
                    }
                }
            }
        }
    }
}

super::config_store::impl_config_store!(PgConfigStore, sqlx::Postgres);
