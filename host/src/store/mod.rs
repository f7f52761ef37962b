//! Storage: one SQLite file by default, PostgreSQL for fleets. Migrations are applied at start.
//!
//! - [`api_log`]: the request log, written in batches off the request path; [`api_log_query`]
//!   reads it back a page at a time (`GET /admin/logs`).
//! - [`ConfigStore`]: the configuration entities ([`crate::entity`]), one trait with a SQLite and a
//!   PostgreSQL implementation, and a change feed ([`ConfigStore::watch`]). Its parts are one file
//!   per entity group: `inbound_routes.rs` (routes, plugin configs), `consumers.rs` (consumers and
//!   their keys), `upstreams.rs` (providers, upstreams, their keys and models, key reservations),
//!   `budgets.rs` (budgets);
//!   each declares its tables once with `table!` (`table.rs` says how to add a column). The
//!   RouteWise settings' part lives in its room ([`crate::routewise::store`]); `config_store.rs`
//!   requires and expands it like the others.
//! - [`Snapshot`] / [`SnapshotCache`]: the whole configuration in memory for the request path,
//!   reloaded on every change by [`Store::spawn_sync`].
//! - [`health`]: how the background work above stands, for `/health/deep`.

pub mod api_log;
pub mod api_log_query;
mod budgets;
mod config_store;
mod consumers;
mod feed;
pub mod health;
mod inbound_routes;
pub mod postgres;
pub mod retention;
pub mod snapshot;
pub mod sqlite;
mod table;
mod upstreams;

#[cfg(test)]
pub(crate) mod tests;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, Database, PgPool, SqlitePool, TransactionManager};

use health::{DatabaseFileHealth, TaskHealth};

pub use budgets::BudgetStore;
pub use config_store::ConfigStore;
pub use consumers::ConsumerStore;
pub use inbound_routes::InboundRouteStore;
pub use snapshot::{
    Authenticated, KeyRejection, ModelTarget, Snapshot, SnapshotCache, SnapshotCounts, SyncStatus,
};
pub use upstreams::UpstreamStore;

/// A storage failure, with the database URL's scheme for context (never the credentials).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL is neither `sqlite:` nor `postgres:`.
    #[error("unsupported database url `{0}`: use sqlite://FILE or postgres://...")]
    UnsupportedUrl(String),
    /// Connecting failed.
    #[error("cannot connect to the {backend} database: {source}")]
    Connect {
        backend: &'static str,
        source: sqlx::Error,
    },
    /// A migration failed.
    #[error("migrating the {backend} database failed: {source}")]
    Migrate {
        backend: &'static str,
        source: sqlx::migrate::MigrateError,
    },
    /// A statement failed (connection lost, timeout, ...).
    #[error("the {backend} database failed: {source}")]
    Database {
        backend: &'static str,
        source: sqlx::Error,
    },
    /// No entity with this id (or not under this parent).
    #[error("no {entity} `{id}`")]
    NotFound { entity: &'static str, id: String },
    /// The input is invalid; `field` is its path (`path_prefix`, `groups[2]`, ...).
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// The write clashes with existing rows (a unique name, prefix or mapping, or a row still in
    /// use). `message` is complete and names the field when there is one.
    #[error("{message}")]
    Conflict {
        field: Option<String>,
        message: String,
    },
    /// A stored row cannot be decoded (edited by hand, or by a newer version).
    #[error("{table} row `{id}` is unreadable: {message}")]
    Corrupt {
        table: &'static str,
        id: String,
        message: String,
    },
}

impl From<crate::entity::InvalidField> for StoreError {
    fn from(e: crate::entity::InvalidField) -> StoreError {
        StoreError::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

/// The pools, for code that writes its own SQL (the request log).
#[derive(Debug, Clone)]
pub enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A connected, migrated database: its pool, its configuration store and the configuration
/// snapshot cache. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    config: Arc<dyn ConfigStore>,
    snapshots: Arc<SnapshotCache>,
    sync_started: AtomicBool,
    /// SQLite: the file the pool opened, watched for deletion.
    file: Option<FileWatch>,
}

/// How often the SQLite file's path is compared with the file the pool holds open.
const FILE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// The SQLite database file as opened: its path and identity (device and inode). Deleting or
/// replacing the file does not disturb the open connections, which keep writing to the old inode,
/// so nothing fails: the only sign is that the path no longer leads to that inode.
struct FileWatch {
    path: PathBuf,
    identity: (u64, u64),
    state: Mutex<(&'static str, TaskHealth)>,
}

impl FileWatch {
    fn open(path: &Path) -> Option<FileWatch> {
        let identity = file_identity(path).ok()?;
        let mut checks = TaskHealth::default();
        checks.succeeded();
        Some(FileWatch {
            path: path.to_owned(),
            identity,
            state: Mutex::new(("ok", checks)),
        })
    }

    fn check(&self) {
        let state = match file_identity(&self.path) {
            Ok(identity) if identity == self.identity => "ok",
            Ok(_) => "replaced",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing",
            Err(e) => {
                tracing::debug!("checking {}: {e}", self.path.display());
                return;
            }
        };
        let mut current = self.state.lock();
        if current.0 != state {
            match state {
                "ok" => tracing::info!("the database file {} is back", self.path.display()),
                _ => tracing::error!(
                    "the database file {} is {state}: this process keeps using the file it opened, \
                     which is no longer at that path",
                    self.path.display()
                ),
            }
        }
        current.0 = state;
        if state == "ok" {
            current.1.succeeded();
        } else {
            current.1.failed(format!("the database file is {state}"));
        }
    }

    fn health(&self) -> DatabaseFileHealth {
        let state = self.state.lock();
        DatabaseFileHealth {
            path: self.path.clone(),
            state: state.0,
            checks: state.1.clone(),
        }
    }
}

/// Fails a new SQLite connection that cannot write. SQLite opens a file it may not write
/// read-only rather than failing, and such a connection stays read-only after the file is
/// writable again: one opened during a brief outage made every later write through it fail with
/// "attempt to write a readonly database" until restart. Its `BEGIN IMMEDIATE` still succeeds;
/// only a write fails, so the probe rewrites the header's `user_version` with its own value inside
/// a transaction it rolls back: nothing reaches the file.
async fn refuse_read_only(conn: &mut sqlx::SqliteConnection) -> Result<(), sqlx::Error> {
    use sqlx::Executor;
    if let Err(e) = conn.execute("BEGIN IMMEDIATE").await {
        // Busy (another writer holds the lock) says nothing about this connection.
        return if is_read_only(&e) { Err(e) } else { Ok(()) };
    }
    let probe = async {
        let version: i64 = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&mut *conn)
            .await?;
        conn.execute(format!("PRAGMA user_version = {version}").as_str())
            .await
            .map(|_| ())
    }
    .await;
    conn.execute("ROLLBACK").await?;
    match probe {
        Err(e) if is_read_only(&e) => Err(e),
        _ => Ok(()),
    }
}

/// SQLITE_READONLY or one of its extended codes.
fn is_read_only(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| c & 0xff == 8)
}

fn file_identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Returns a released connection to the pool only if it is outside any transaction. When a
/// statement or COMMIT fails with an error after which SQLite has already rolled back by itself
/// (an I/O error, a full disk), sqlx's ROLLBACK on drop fails too and leaves its transaction depth
/// above zero: every later `begin_with` on that connection then failed with "attempted to call
/// begin_with at non-zero transaction depth", until restart. The ping first lets the rollback that
/// the dropped transaction queued run, so only a connection it could not clean is closed.
fn release_clean<DB: Database>(
    conn: &mut DB::Connection,
) -> BoxFuture<'_, Result<bool, sqlx::Error>> {
    Box::pin(async move {
        conn.ping().await?;
        // The (documented, if hidden) trait is the only way to read sqlx's own depth count.
        let depth = <DB::TransactionManager as TransactionManager>::get_transaction_depth(&*conn);
        if depth > 0 {
            tracing::warn!(
                "closing a database connection left inside a failed transaction (depth {depth})"
            );
        }
        Ok(depth == 0)
    })
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend())
            .field("snapshots", &self.inner.snapshots)
            .finish()
    }
}

impl Store {
    /// Connects (creating a missing SQLite file) and applies pending migrations. For PostgreSQL,
    /// `?options=-c%20search_path%3DNAME` in the URL selects the schema.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        let mut file = None;
        let pool = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(|source| StoreError::Connect {
                    backend: "sqlite",
                    source,
                })?
                .create_if_missing(true)
                // A new file's pages are 16 KiB rather than SQLite's 4 KiB: the request log's
                // commits go out in fewer, larger WAL frames, each a write of its own (about a
                // third as many writes a row, and 40 % less of the log thread's CPU in the
                // kernel). A file's page size is fixed once it holds a table, so older files keep
                // theirs.
                .page_size(16384)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5))
                // Deletes cascade to children; relied on only as a backstop.
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new()
                // Four for everything, and one the request log's writer keeps.
                .max_connections(5)
                // A connection refused by `refuse_read_only` is retried until this deadline; as
                // long as the busy timeout, not sqlx's 30 s.
                .acquire_timeout(Duration::from_secs(5))
                .after_connect(|conn, _| Box::pin(refuse_read_only(conn)))
                .after_release(|conn, _| release_clean::<sqlx::Sqlite>(conn))
                .connect_with(options.clone())
                .await
                .map_err(|source| StoreError::Connect {
                    backend: "sqlite",
                    source,
                })?;
            file = FileWatch::open(options.get_filename());
            Pool::Sqlite(pool)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let pool = PgPoolOptions::new()
                // Eight for everything, and one the request log's writer keeps.
                .max_connections(9)
                .acquire_timeout(Duration::from_secs(5))
                .after_release(|conn, _| release_clean::<sqlx::Postgres>(conn))
                .connect(url)
                .await
                .map_err(|source| StoreError::Connect {
                    backend: "postgres",
                    source,
                })?;
            Pool::Postgres(pool)
        } else {
            return Err(StoreError::UnsupportedUrl(
                url.split("://").next().unwrap_or(url).to_owned(),
            ));
        };
        migrate(&pool).await?;
        let config: Arc<dyn ConfigStore> = match &pool {
            Pool::Sqlite(p) => Arc::new(sqlite::SqliteConfigStore::new(p.clone())),
            Pool::Postgres(p) => Arc::new(postgres::PgConfigStore::new(p.clone()).await?),
        };
        Ok(Store {
            inner: Arc::new(Inner {
                pool,
                config,
                snapshots: Arc::new(SnapshotCache::default()),
                sync_started: AtomicBool::new(false),
                file,
            }),
        })
    }

    /// Applies the migrations under `migrations/{sqlite,postgres}`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate(&self.inner.pool).await
    }

    pub fn backend(&self) -> &'static str {
        match self.inner.pool {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }

    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The configuration entities: CRUD, change feed, snapshot loading.
    pub fn config(&self) -> &dyn ConfigStore {
        &*self.inner.config
    }

    /// The snapshot cache. It stays empty until [`Store::spawn_sync`] (or an explicit
    /// [`SnapshotCache::reload`]) loads it.
    pub fn snapshots(&self) -> &SnapshotCache {
        &self.inner.snapshots
    }

    /// The current configuration snapshot (the last one that loaded).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.snapshots.current()
    }

    /// Loads the snapshot and keeps reloading it whenever the configuration version moves, in a
    /// background task that ends when the last clone of this store is dropped; on SQLite, also
    /// watches the database file for deletion. Idempotent. Must be called inside a Tokio runtime.
    pub fn spawn_sync(&self) {
        if self.inner.sync_started.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(SnapshotCache::run(
            Arc::downgrade(&self.inner.snapshots),
            Arc::downgrade(&self.inner.config),
        ));
        if self.inner.file.is_some() {
            tokio::spawn(watch_file(Arc::downgrade(&self.inner)));
        }
    }

    /// The snapshot's reloads and the change feed that triggers them.
    pub fn sync_status(&self) -> SyncStatus {
        let mut status = self.inner.snapshots.status();
        status.change_feed = self.inner.config.feed_health();
        status
    }

    /// SQLite: whether the database file is still at its path (`None` for PostgreSQL and
    /// in-memory databases).
    pub fn file_health(&self) -> Option<DatabaseFileHealth> {
        self.inner.file.as_ref().map(FileWatch::health)
    }
}

async fn watch_file(inner: Weak<Inner>) {
    let mut timer = tokio::time::interval(FILE_CHECK_EVERY);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        timer.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if let Some(file) = &inner.file {
            file.check();
        }
    }
}

async fn migrate(pool: &Pool) -> Result<(), StoreError> {
    match pool {
        Pool::Sqlite(pool) => sqlx::migrate!("../migrations/sqlite")
            .run(pool)
            .await
            .map_err(|source| StoreError::Migrate {
                backend: "sqlite",
                source,
            }),
        Pool::Postgres(pool) => sqlx::migrate!("../migrations/postgres")
            .run(pool)
            .await
            .map_err(|source| StoreError::Migrate {
                backend: "postgres",
                source,
            }),
    }
}
