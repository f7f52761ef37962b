//! The one storage interface of the configuration entities, implemented for SQLite
//! ([`super::sqlite::SqliteConfigStore`]) and PostgreSQL ([`super::postgres::PgConfigStore`]).
//! Each entity group has its own part, in its own file: [`InboundRouteStore`] (routes and plugin
//! configs), [`ConsumerStore`] (consumers and their keys), [`UpstreamStore`] (providers, upstreams,
//! upstream keys and models, key reservations), [`BudgetStore`] (budgets) and [`RouteWiseSettingsStore`] (kept in the RouteWise
//! room, [`crate::routewise::store`]); [`ConfigStore`] is all of them plus the version, the change
//! feed and the snapshot.
//!
//! Every write runs in one transaction that first bumps the `config_version` row: that serialises
//! configuration writes (so checks such as "is this path prefix taken?" cannot race), and gives the
//! change feed its version. Reads of single entities go straight to the pool; the request path
//! reads nothing from here per request, it uses a [`Snapshot`] instead.
//!
//! sqlx code generic over the database needs long where-clauses repeated on every function (Rust
//! does not imply them), so each part's implementation is instead a macro expanded once per
//! backend, with the backend's own types; [`impl_config_store!`] expands them all. What differs
//! between backends (how a write transaction starts, how the change is announced, how the feed is
//! watched) lives in each backend's module as inherent methods the macros call: `begin_write`,
//! `begin_read`, `committed`, `db_error`, `watch_feed`.

use async_trait::async_trait;
use tokio::sync::watch;

use super::StoreError;
use super::budgets::BudgetStore;
use super::consumers::ConsumerStore;
use super::inbound_routes::InboundRouteStore;
use super::snapshot::Snapshot;
use super::upstreams::UpstreamStore;
use crate::routewise::store::RouteWiseSettingsStore;

/// Configuration storage. Ids in paths that do not exist are [`StoreError::NotFound`]; bad input is
/// [`StoreError::Invalid`] naming the field; uniqueness clashes are [`StoreError::Conflict`].
#[async_trait]
pub trait ConfigStore:
    InboundRouteStore
    + ConsumerStore
    + UpstreamStore
    + BudgetStore
    + RouteWiseSettingsStore
    + Send
    + Sync
    + 'static
{
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;

    /// The configuration version: bumped by every write, by any process sharing the database.
    async fn version(&self) -> Result<i64, StoreError>;

    /// The latest configuration version this process knows of. It moves at once for writes made
    /// through this store, and within about half a second (SQLite: polling) or at once
    /// (PostgreSQL: LISTEN/NOTIFY) for writes made by other processes. The feed starts on the
    /// first call; it never goes backwards.
    fn watch(&self) -> watch::Receiver<i64>;

    /// How the change feed's watcher fares (never run: all zero).
    fn feed_health(&self) -> super::health::TaskHealth;

    /// Everything, read in one consistent transaction.
    async fn load_snapshot(&self) -> Result<Snapshot, StoreError>;
}

/// Implements [`ConfigStore`] and all its parts for `$store`, a backend over `$db`: first the
/// helpers every part uses, then each part's own macro.
macro_rules! impl_config_store {
    ($store:ty, $db:ty) => {
        use $crate::store::StoreError;
        use $crate::store::table::{Bind, Table};

        type Conn = <$db as sqlx::Database>::Connection;

        /// Inserts or updates (`sql`, from [`Table::insert`] or [`Table::update`]) one entity.
        async fn write<R: Bind<$db>>(
            conn: &mut Conn,
            sql: &str,
            entity: &R::Entity,
        ) -> Result<(), sqlx::Error> {
            R::bind(entity, sqlx::query::<$db>(sql))
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        /// `sql` reading rows of `R`, with `$1`, `$2`… bound to `binds` in order.
        fn rows_query<'q, R>(
            sql: &'q str,
            binds: &[&str],
        ) -> sqlx::query::QueryAs<'q, $db, R, <$db as sqlx::Database>::Arguments<'q>>
        where
            R: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
        {
            binds
                .iter()
                .fold(sqlx::query_as::<$db, R>(sql), |q, b| q.bind(b.to_string()))
        }

        /// Deletes one row; false when there was none.
        async fn delete_row(
            conn: &mut Conn,
            sql: &str,
            binds: &[&str],
        ) -> Result<bool, sqlx::Error> {
            let q = binds
                .iter()
                .fold(sqlx::query::<$db>(sql), |q, b| q.bind(b.to_string()));
            Ok(q.execute(&mut *conn).await?.rows_affected() > 0)
        }

        impl $store {
            /// The rows of `R` selected by `rest` (`WHERE`/`ORDER BY`, with `$1`, `$2`… bound to
            /// `binds` in order), read on `conn`.
            async fn select<R>(
                &self,
                conn: &mut Conn,
                rest: &str,
                binds: &[&str],
            ) -> Result<Vec<R::Entity>, StoreError>
            where
                R: Table + for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
            {
                let sql = R::select(rest);
                let rows = rows_query::<R>(&sql, binds)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(|e| self.db_error(e))?;
                rows.into_iter().map(R::decode).collect()
            }

            /// Like [`Self::select`] on a connection of the pool.
            async fn list<R>(
                &self,
                rest: &str,
                binds: &[&str],
            ) -> Result<Vec<R::Entity>, StoreError>
            where
                R: Table + for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
            {
                self.select::<R>(&mut *self.conn().await?, rest, binds)
                    .await
            }

            /// The row of `R` selected by `filter` (as for [`Self::select`]), if there is one.
            async fn find<R>(
                &self,
                conn: &mut Conn,
                filter: &str,
                binds: &[&str],
            ) -> Result<Option<R::Entity>, StoreError>
            where
                R: Table + for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
            {
                let sql = R::select(filter);
                rows_query::<R>(&sql, binds)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .map(R::decode)
                    .transpose()
            }

            /// Every row of `R`, oldest first, read on `conn` (the snapshot's transaction).
            async fn all_in<R>(&self, conn: &mut Conn) -> Result<Vec<R::Entity>, StoreError>
            where
                R: Table + for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
            {
                self.select::<R>(conn, &format!("ORDER BY created_at, {}", R::KEY), &[])
                    .await
            }

            async fn exists(
                &self,
                conn: &mut Conn,
                table: &str,
                id: &str,
            ) -> Result<bool, StoreError> {
                let sql = format!("SELECT 1 FROM {table} WHERE id = $1");
                Ok(sqlx::query::<$db>(&sql)
                    .bind(id)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .is_some())
            }

            /// A body field naming another entity that does not exist is bad input (422), not a
            /// missing resource (404).
            async fn require_ref(
                &self,
                conn: &mut Conn,
                table: &str,
                field: &str,
                what: &str,
                id: &str,
            ) -> Result<(), StoreError> {
                if self.exists(conn, table, id).await? {
                    Ok(())
                } else {
                    Err(StoreError::Invalid {
                        field: field.to_owned(),
                        message: format!("no {what} `{id}`"),
                    })
                }
            }

            async fn require_parent(
                &self,
                conn: &mut Conn,
                table: &str,
                id: &str,
                missing: fn(&str) -> StoreError,
            ) -> Result<(), StoreError> {
                if self.exists(conn, table, id).await? {
                    Ok(())
                } else {
                    Err(missing(id))
                }
            }

            async fn conn(&self) -> Result<sqlx::pool::PoolConnection<$db>, StoreError> {
                self.pool.acquire().await.map_err(|e| self.db_error(e))
            }

            async fn commit(
                &self,
                tx: sqlx::Transaction<'static, $db>,
                version: i64,
            ) -> Result<(), StoreError> {
                tx.commit().await.map_err(|e| self.db_error(e))?;
                self.committed(version);
                Ok(())
            }
        }

        $crate::store::inbound_routes::impl_inbound_route_store!($store, $db);
        $crate::store::consumers::impl_consumer_store!($store, $db);
        $crate::store::upstreams::impl_upstream_store!($store, $db);
        $crate::store::budgets::impl_budget_store!($store, $db);
        $crate::routewise::store::impl_routewise_settings_store!($store, $db);

        #[async_trait::async_trait]
        impl $crate::store::config_store::ConfigStore for $store {
            fn backend(&self) -> &'static str {
                BACKEND
            }

            async fn version(&self) -> Result<i64, StoreError> {
                sqlx::query_scalar::<$db, i64>("SELECT version FROM config_version WHERE id = 1")
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| self.db_error(e))
            }

            fn watch(&self) -> tokio::sync::watch::Receiver<i64> {
                self.watch_feed()
            }

            fn feed_health(&self) -> $crate::store::health::TaskHealth {
                self.feed.health.get()
            }

            async fn load_snapshot(&self) -> Result<$crate::store::snapshot::Snapshot, StoreError> {
                use $crate::store::budgets::BudgetRow;
                use $crate::store::consumers::{ConsumerKeyRow, ConsumerRow};
                use $crate::store::inbound_routes::{PluginConfigRow, RouteRow};
                use $crate::store::upstreams::{
                    KeyReservationRow, ProviderRow, UpstreamKeyRow, UpstreamModelRow, UpstreamRow,
                };

                let mut tx = self.begin_read().await?;
                let err = |e: sqlx::Error| self.db_error(e);
                let version: i64 = sqlx::query_scalar::<$db, i64>(
                    "SELECT version FROM config_version WHERE id = 1",
                )
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
                let rows = $crate::store::snapshot::SnapshotRows {
                    version,
                    routes: self.all_in::<RouteRow>(&mut tx).await?,
                    plugin_configs: self.all_in::<PluginConfigRow>(&mut tx).await?,
                    consumers: self.all_in::<ConsumerRow>(&mut tx).await?,
                    consumer_keys: self.all_in::<ConsumerKeyRow>(&mut tx).await?,
                    providers: self.all_in::<ProviderRow>(&mut tx).await?,
                    upstreams: self.all_in::<UpstreamRow>(&mut tx).await?,
                    upstream_keys: self.all_in::<UpstreamKeyRow>(&mut tx).await?,
                    upstream_models: self.all_in::<UpstreamModelRow>(&mut tx).await?,
                    key_reservations: self.all_in::<KeyReservationRow>(&mut tx).await?,
                    budgets: self
                        .select::<BudgetRow>(&mut tx, "ORDER BY created_at_ms, id", &[])
                        .await?,
                    routewise_settings: self.routewise_rows(&mut tx).await?,
                };
                tx.commit().await.map_err(err)?;
                let loaded_at = i64::try_from($crate::clock::unix_ms()).unwrap_or(i64::MAX);
                Ok($crate::store::snapshot::Snapshot::build(rows, loaded_at))
            }
        }
    };
}

pub(crate) use impl_config_store;
