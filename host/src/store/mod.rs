//! Storage: one SQLite file by default, PostgreSQL for fleets. Migrations are applied at start.
//!
//! - [`api_log`]: the request log, written in batches off the request path.
//! - [`ConfigStore`]: the configuration entities ([`crate::entity`]), one trait with a SQLite and a
//!   PostgreSQL implementation, and a change feed ([`ConfigStore::watch`]). Its parts are one file
//!   per entity group: `inbound_routes.rs` (routes, plugin configs), `consumers.rs` (consumers and
//!   their keys), `upstreams.rs` (providers, upstreams, their keys and models, key reservations);
//!   each declares its tables once with `table!` (`table.rs` says how to add a column). The
//!   RouteWise settings' part lives in its room ([`crate::routewise::store`]); `config_store.rs`
//!   requires and expands it like the others.
//! - [`Snapshot`] / [`SnapshotCache`]: the whole configuration in memory for the request path,
//!   reloaded on every change by [`Store::spawn_sync`].

pub mod api_log;
mod config_store;
mod consumers;
mod feed;
mod inbound_routes;
pub mod postgres;
pub mod snapshot;
pub mod sqlite;
mod table;
mod upstreams;

#[cfg(test)]
pub(crate) mod tests;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

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
        let pool = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(|source| StoreError::Connect {
                    backend: "sqlite",
                    source,
                })?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5))
                // Deletes cascade to children; relied on only as a backstop.
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .map_err(|source| StoreError::Connect {
                    backend: "sqlite",
                    source,
                })?;
            Pool::Sqlite(pool)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(5))
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
    /// background task that ends when the last clone of this store is dropped. Idempotent. Must be
    /// called inside a Tokio runtime.
    pub fn spawn_sync(&self) {
        if self.inner.sync_started.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(SnapshotCache::run(
            Arc::downgrade(&self.inner.snapshots),
            Arc::downgrade(&self.inner.config),
        ));
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
