//! The request log: rows are queued by the request path and written in batches by a background task.
//! A slow or unreachable database never blocks a request; when the queue is full, rows are dropped
//! and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::health::{RequestLogHealth, SharedTaskHealth};
use super::retention::Retention;
use super::{Pool, Store};

/// Rows waiting to be written before new ones are dropped.
const QUEUE_CAPACITY: usize = 16384;
/// Rows per transaction. Each commit writes the rightmost pages of the table and of every index
/// again, whether it added 256 rows or 2,048; at 256 (a commit and its sync 36 times a second at
/// 9,000 requests a second) the log's file writes per row were half as many again as at 2,048. A
/// transaction of 2,048 rows holds the write lock for a few milliseconds (the thread spends about
/// 3 µs of CPU a row), which other writers wait out within the busy timeout.
const BATCH: usize = 2048;
/// Rows per INSERT statement: 21 placeholders a row stay under SQLite's 32,766 per statement.
const STATEMENT_ROWS: usize = 256;
/// How often a partial batch is flushed.
const FLUSH_EVERY: Duration = Duration::from_millis(250);

/// One answered (or failed) request.
#[derive(Debug, Clone, Default)]
pub struct ApiLogRow {
    pub created_at_ms: i64,
    /// The inbound route's name.
    pub route: Option<String>,
    /// The consumer whose key authenticated the request.
    pub consumer: Option<String>,
    pub model: String,
    pub endpoint_id: Option<String>,
    pub attempts: i32,
    pub fell_back: bool,
    pub status: i32,
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub error: Option<String>,
    /// The attempts that failed before the one that answered (or all of them), as a JSON array
    /// of `{provider, endpoint_id, error_type, error}`.
    pub failed_attempts: Option<String>,
    /// The request's id (`x-request-id`), as returned to the client and sent upstream.
    pub request_id: Option<String>,
    /// What the attempts cost at their upstreams' `pricing`, in USD; `None` when none has one.
    pub cost_usd: Option<f64>,
    /// Prompt-cache reads and writes of the attempt that answered (inside `prompt_tokens`).
    pub cached_tokens: Option<i32>,
    pub cache_write_tokens: Option<i32>,
    /// Every attempt, as a JSON array (`routing::dispatch::AttemptRecord`).
    pub attempt_log: Option<String>,
    /// The routing decision, as a JSON object (`routing::select::Decision`).
    pub decision: Option<String>,
    /// The `rate-limit` plugin's limit that refused the request (`consumer:rpm`); `None` when
    /// none did.
    pub rate_limited_by: Option<String>,
}

/// The sending side, cheap to clone into request handlers.
#[derive(Clone)]
pub struct ApiLog {
    tx: mpsc::Sender<ApiLogRow>,
    pub dropped: Arc<AtomicU64>,
    pub write_errors: Arc<AtomicU64>,
    /// Rows written since start.
    pub written: Arc<AtomicU64>,
    /// The batch writes: last success, failures since, last error.
    writes: SharedTaskHealth,
    /// Tells the writer to write what is queued now and stop (at exit).
    closing: Arc<tokio::sync::Notify>,
    /// The writer task, awaited once at exit.
    task: Arc<parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>>,
    /// What prunes the rows past `database.request_log_retention_days`.
    retention: Retention,
}

impl ApiLog {
    /// Starts the writer task for `store`, and the retention task when `retention_days` is set.
    pub fn start(store: Store, retention_days: Option<std::num::NonZeroU32>) -> ApiLog {
        let retention = Retention::start(store.clone(), retention_days);
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let counts = Counts::default();
        let writes = SharedTaskHealth::default();
        let closing = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn(writer(
            store,
            rx,
            counts.clone(),
            writes.clone(),
            closing.clone(),
        ));
        ApiLog {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
            write_errors: counts.failed,
            written: counts.written,
            writes,
            closing,
            task: Arc::new(parking_lot::Mutex::new(Some(task))),
            retention,
        }
    }

    /// Writes the rows still queued and stops the writer, waiting at most `within`. Called once the
    /// server has drained: rows queued in the writer's last interval were lost at exit before.
    pub async fn finish(&self, within: Duration) {
        let Some(task) = self.task.lock().take() else {
            return;
        };
        // `notify_one` keeps a permit if the writer is busy writing, so the signal is not missed.
        self.closing.notify_one();
        if tokio::time::timeout(within, task).await.is_err() {
            tracing::warn!(
                "api_logs: the last rows were not written within {within:?} of shutdown"
            );
        }
    }

    /// The writer's state, for `/health/deep`.
    pub fn health(&self) -> RequestLogHealth {
        RequestLogHealth {
            dropped_rows: self.dropped.load(Ordering::Relaxed),
            failed_rows: self.write_errors.load(Ordering::Relaxed),
            writes: self.writes.get(),
            retention: self.retention.health(),
        }
    }

    /// Rows (written, dropped because the queue was full, failed to write) since start.
    pub fn totals(&self) -> (u64, u64, u64) {
        (
            self.written.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
            self.write_errors.load(Ordering::Relaxed),
        )
    }

    /// Rows past the retention deleted since start.
    pub fn pruned_rows(&self) -> u64 {
        self.retention.pruned_rows()
    }

    /// Queues a row without waiting.
    pub fn record(&self, row: ApiLogRow) {
        if self.tx.try_send(row).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The writer's running totals.
#[derive(Clone, Default)]
struct Counts {
    written: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

/// Wakes on a timer and drains whatever queued since, rather than on every row: waking per row
/// cost a context switch per request and wrote tiny batches (found by profiling under load).
async fn writer(
    store: Store,
    mut rx: mpsc::Receiver<ApiLogRow>,
    counts: Counts,
    writes: SharedTaskHealth,
    closing: Arc<tokio::sync::Notify>,
) {
    let mut batch = Vec::with_capacity(STATEMENT_ROWS);
    let mut held = None;
    let mut timer = tokio::time::interval(FLUSH_EVERY);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut closed = tokio::select! {
            _ = timer.tick() => false,
            () = closing.notified() => true,
        };
        loop {
            match rx.try_recv() {
                Ok(row) => batch.push(row),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
            if batch.len() == BATCH {
                flush(&store, &mut held, &mut batch, &counts, &writes).await;
            }
        }
        flush(&store, &mut held, &mut batch, &counts, &writes).await;
        if closed {
            return;
        }
    }
}

async fn flush(
    store: &Store,
    held: &mut Option<WriterConnection>,
    batch: &mut Vec<ApiLogRow>,
    counts: &Counts,
    writes: &SharedTaskHealth,
) {
    if batch.is_empty() {
        return;
    }
    match write(store, held, batch).await {
        Ok(()) => {
            counts
                .written
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            writes.succeeded();
        }
        Err(e) => {
            counts
                .failed
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            tracing::warn!("api_logs: {} rows not written: {e}", batch.len());
            writes.failed(format!("{} rows not written: {e}", batch.len()));
        }
    }
    batch.clear();
}

/// `rows` in slices whose lengths are powers of two up to [`STATEMENT_ROWS`], largest first. Each
/// row count is its own INSERT statement, which the database parses and sqlx keeps per connection:
/// with any count, most flushes parsed a new statement (SQLite's parser showed in profiles) and
/// churned the statement cache; with powers of two there are at most nine statements, prepared
/// once.
fn chunks(mut rows: &[ApiLogRow]) -> impl Iterator<Item = &[ApiLogRow]> {
    std::iter::from_fn(move || {
        if rows.is_empty() {
            return None;
        }
        let (chunk, rest) = rows.split_at((1 << rows.len().ilog2()).min(STATEMENT_ROWS));
        rows = rest;
        Some(chunk)
    })
}

/// One transaction of multi-row INSERTs on a pool of database `$db`, `$postgres` telling its
/// placeholder style; only the query's database type differs between the backends.
///
/// The values go into one argument list reserved for the chunk, and text is bound as `&str`
/// borrowed from the rows: `Query::bind` grew its list one value at a time, and a bound `&String`
/// is cloned (sqlx encodes a `String` by value), one allocation and copy per text column.
macro_rules! insert_rows {
    ($db:ty, $postgres:expr, $conn:expr, $rows:expr) => {{
        use sqlx::Arguments as _;
        let mut tx = sqlx::Connection::begin(&mut **$conn).await?;
        for chunk in chunks($rows) {
            let mut args = <$db as sqlx::Database>::Arguments::default();
            args.reserve(chunk.len() * COLUMN_COUNT, 0);
            for r in chunk {
                (|| {
                    args.add(r.created_at_ms)?;
                    args.add(r.route.as_deref())?;
                    args.add(r.consumer.as_deref())?;
                    args.add(r.model.as_str())?;
                    args.add(r.endpoint_id.as_deref())?;
                    args.add(r.attempts)?;
                    args.add(r.fell_back)?;
                    args.add(r.status)?;
                    args.add(r.ttft_ms)?;
                    args.add(r.latency_ms)?;
                    args.add(r.prompt_tokens)?;
                    args.add(r.completion_tokens)?;
                    args.add(r.error.as_deref())?;
                    args.add(r.failed_attempts.as_deref())?;
                    args.add(r.request_id.as_deref())?;
                    args.add(r.cost_usd)?;
                    args.add(r.cached_tokens)?;
                    args.add(r.cache_write_tokens)?;
                    args.add(r.attempt_log.as_deref())?;
                    args.add(r.decision.as_deref())?;
                    args.add(r.rate_limited_by.as_deref())
                })()
                .map_err(sqlx::Error::Encode)?;
            }
            sqlx::query_with::<$db, _>(insert_sql($postgres, chunk.len()), args)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
    }};
}

const COLUMNS: &str = "api_logs (created_at_ms, route, consumer, model, endpoint_id, attempts, fell_back, status, ttft_ms, latency_ms, prompt_tokens, completion_tokens, error, failed_attempts, request_id, cost_usd, cached_tokens, cache_write_tokens, attempt_log, decision, rate_limited_by) VALUES ";
/// Bound values per row: the columns above.
const COLUMN_COUNT: usize = 21;

/// The INSERT of `rows` rows (a power of two up to [`STATEMENT_ROWS`]) with PostgreSQL's or
/// SQLite's placeholders, built once per count and backend. sqlx's `QueryBuilder` wrote the same
/// text again on every flush, one `write!` per placeholder and separator: 6,500 instructions per
/// row.
fn insert_sql(postgres: bool, rows: usize) -> &'static str {
    const COUNTS: usize = STATEMENT_ROWS.ilog2() as usize + 1;
    static TEXTS: [[std::sync::OnceLock<String>; COUNTS]; 2] =
        [const { [const { std::sync::OnceLock::new() }; COUNTS] }; 2];
    TEXTS[usize::from(postgres)][rows.ilog2() as usize].get_or_init(|| {
        // SQLite keeps a statement journal (a temporary file, opened and unlinked in every
        // transaction, and a copy of each page the statement first touches) for a multi-row
        // statement that may abort halfway through a transaction, so that the abort undoes its
        // rows alone; `OR FAIL` does not undo them, and needs none. A failed statement fails
        // the flush, whose transaction is rolled back whole, so nothing else changes.
        let mut sql = String::from(if postgres {
            "INSERT INTO "
        } else {
            "INSERT OR FAIL INTO "
        });
        sql.push_str(COLUMNS);
        let mut n = 0;
        for row in 0..rows {
            sql.push_str(if row == 0 { "(" } else { ", (" });
            for column in 0..COLUMN_COUNT {
                if column > 0 {
                    sql.push_str(", ");
                }
                n += 1;
                if postgres {
                    sql.push('$');
                    sql.push_str(&n.to_string());
                } else {
                    sql.push('?');
                }
            }
            sql.push(')');
        }
        sql
    })
}

/// The connection the writer keeps between flushes. Each row count's INSERT is a statement the
/// connection prepares and caches: taking any of the pool's connections for each flush prepared
/// them again on every connection, up to nine statements times the pool's size (`sqlite3Prepare`
/// showed 0 to 9,000 instructions per request in profiles, depending on which connection a flush
/// drew). The pools have one connection more for it (`Store::open`).
enum WriterConnection {
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
}

impl WriterConnection {
    async fn acquire(store: &Store) -> Result<Self, sqlx::Error> {
        Ok(match store.pool() {
            Pool::Sqlite(pool) => WriterConnection::Sqlite(pool.acquire().await?),
            Pool::Postgres(pool) => WriterConnection::Postgres(pool.acquire().await?),
        })
    }

    /// Writes `rows` in one transaction.
    async fn insert(&mut self, rows: &[ApiLogRow]) -> Result<(), sqlx::Error> {
        match self {
            WriterConnection::Sqlite(conn) => insert_rows!(sqlx::Sqlite, false, conn, rows),
            WriterConnection::Postgres(conn) => insert_rows!(sqlx::Postgres, true, conn, rows),
        }
        Ok(())
    }
}

/// Writes `rows` in one transaction on the writer's connection, taking one when it holds none. A
/// failed write gives the connection back to the pool (which checks it before lending it again);
/// when that connection was held from an earlier flush, the rows are tried once more on a fresh
/// one, as a database restarted since would otherwise cost a batch that a checked connection
/// would have written.
async fn write(
    store: &Store,
    held: &mut Option<WriterConnection>,
    rows: &[ApiLogRow],
) -> Result<(), sqlx::Error> {
    let reused = held.is_some();
    let mut conn = match held.take() {
        Some(conn) => conn,
        None => WriterConnection::acquire(store).await?,
    };
    match conn.insert(rows).await {
        Ok(()) => {
            *held = Some(conn);
            return Ok(());
        }
        Err(e) if !reused => return Err(e),
        Err(e) => tracing::debug!("api_logs: the writer's connection failed ({e}); another"),
    }
    drop(conn);
    let mut conn = WriterConnection::acquire(store).await?;
    conn.insert(rows).await?;
    *held = Some(conn);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_largest_first_and_cover_every_row() {
        let rows = vec![ApiLogRow::default(); 255];
        let sizes: Vec<usize> = chunks(&rows).map(<[ApiLogRow]>::len).collect();
        assert_eq!(sizes, [128, 64, 32, 16, 8, 4, 2, 1]);
        let rows = vec![ApiLogRow::default(); 256];
        assert_eq!(
            chunks(&rows).map(<[ApiLogRow]>::len).collect::<Vec<_>>(),
            [256]
        );
        // A transaction's rows go in statements of at most `STATEMENT_ROWS`.
        let rows = vec![ApiLogRow::default(); BATCH - 1];
        let sizes: Vec<usize> = chunks(&rows).map(<[ApiLogRow]>::len).collect();
        assert_eq!(
            sizes,
            [vec![STATEMENT_ROWS; 7], vec![128, 64, 32, 16, 8, 4, 2, 1]].concat()
        );
        assert_eq!(chunks(&[]).count(), 0);
    }

    #[test]
    fn insert_texts_have_a_placeholder_per_column_and_row() {
        let sqlite = insert_sql(false, 2);
        assert!(sqlite.starts_with("INSERT OR FAIL INTO api_logs ("));
        assert_eq!(sqlite.matches('?').count(), 2 * COLUMN_COUNT);
        assert_eq!(sqlite.matches('(').count(), 3);
        let postgres = insert_sql(true, 256);
        assert!(postgres.starts_with("INSERT INTO api_logs ("));
        assert!(
            postgres.ends_with(", $5376)"),
            "{}",
            &postgres[postgres.len() - 20..]
        );
        assert_eq!(postgres.matches('$').count(), 256 * COLUMN_COUNT);
        assert_eq!(insert_sql(true, 1).matches('$').count(), COLUMN_COUNT);
        assert_eq!(
            COLUMNS.matches(',').count() + 1,
            COLUMN_COUNT,
            "one bound value per column"
        );
        // Built once: the same text every time.
        assert!(std::ptr::eq(insert_sql(false, 2), sqlite));
    }
}
