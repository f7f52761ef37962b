//! The database a scenario runs on, for tests that run every scenario on SQLite and on
//! PostgreSQL and share one database between several gateway processes.

use sqlx::Connection;

use crate::harness::PgSchema;

/// Which database a scenario runs on; holds the SQLite folder or the PostgreSQL schema while the
/// test lives.
pub enum Db {
    Sqlite(tempfile::TempDir),
    Postgres(PgSchema),
}

impl Db {
    pub fn sqlite() -> Db {
        Db::Sqlite(tempfile::tempdir().unwrap())
    }

    pub async fn postgres() -> Db {
        Db::Postgres(PgSchema::create().await)
    }

    /// One database shared by every gateway of the scenario.
    pub fn url(&self) -> String {
        match self {
            Db::Sqlite(dir) => format!("sqlite://{}", dir.path().join("shared.db").display()),
            Db::Postgres(schema) => schema.url.clone(),
        }
    }

    /// The first column of the first row of `sql`, an integer (`SELECT COUNT(*) ...`).
    pub async fn scalar(&self, sql: &str) -> i64 {
        match self {
            Db::Sqlite(_) => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url()).await.unwrap();
                sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
            }
            Db::Postgres(schema) => {
                let mut conn = sqlx::PgConnection::connect(&schema.url).await.unwrap();
                sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
            }
        }
    }

    /// Runs `sql` on the database directly, as a hand edit (or another version's process) would,
    /// and bumps the configuration version so the gateways reload.
    pub async fn execute(&self, sql: &str) {
        const BUMP: &str = "UPDATE config_version SET version = version + 1 WHERE id = 1";
        match self {
            Db::Sqlite(_) => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url()).await.unwrap();
                sqlx::query(sql).execute(&mut conn).await.unwrap();
                sqlx::query(BUMP).execute(&mut conn).await.unwrap();
            }
            Db::Postgres(schema) => {
                let mut conn = sqlx::PgConnection::connect(&schema.url).await.unwrap();
                sqlx::query(sql).execute(&mut conn).await.unwrap();
                sqlx::query(BUMP).execute(&mut conn).await.unwrap();
                // What every write sends: `<schema>:<version>` (see store::postgres).
                sqlx::query(
                    "SELECT pg_notify('switchyard_config', current_schema() || ':' || \
                     (SELECT version FROM config_version WHERE id = 1))",
                )
                .execute(&mut conn)
                .await
                .unwrap();
            }
        }
    }
}

/// Runs a scenario `async fn NAME(db: Db)` once per database (the caller imports [`Db`]).
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Db::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Db::postgres().await).await;
                }
            )*
        }
    };
}

pub(crate) use on_both_databases;
