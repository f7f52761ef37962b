//! Storage: one SQLite file by default, PostgreSQL for fleets. Migrations are applied at start.

pub mod api_log;

use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};
use std::str::FromStr;
use std::time::Duration;

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
}

/// A connected, migrated database.
#[derive(Debug, Clone)]
pub enum Store {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl Store {
    /// Connects (creating a missing SQLite file) and applies pending migrations.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        let store = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(|source| StoreError::Connect {
                    backend: "sqlite",
                    source,
                })?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .map_err(|source| StoreError::Connect {
                    backend: "sqlite",
                    source,
                })?;
            Store::Sqlite(pool)
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
            Store::Postgres(pool)
        } else {
            return Err(StoreError::UnsupportedUrl(
                url.split("://").next().unwrap_or(url).to_owned(),
            ));
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Applies the migrations under `migrations/{sqlite,postgres}`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(pool) => sqlx::migrate!("../migrations/sqlite")
                .run(pool)
                .await
                .map_err(|source| StoreError::Migrate {
                    backend: "sqlite",
                    source,
                }),
            Store::Postgres(pool) => sqlx::migrate!("../migrations/postgres")
                .run(pool)
                .await
                .map_err(|source| StoreError::Migrate {
                    backend: "postgres",
                    source,
                }),
        }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }
}
