//! The SQL shared by both backends. Both schemas have the same columns and portable types, and
//! SQLite accepts PostgreSQL's `$1` placeholders, so each statement is written once.
//!
//! sqlx code generic over the database needs long where-clauses repeated on every function (Rust
//! does not imply them), so the implementation is instead a macro expanded once per backend, with
//! the backend's own types. What differs between backends (how a write transaction starts, how the
//! change is announced, how the feed is watched) lives in each backend's module as inherent
//! methods the macro calls: `begin_write`, `begin_read`, `committed`, `db_error`, `watch_feed`.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;

use super::StoreError;
use super::model::*;

/// A `key_reservations` row.
pub(crate) fn reservation_of(
    (key_hash, hint, min_role, created_at, updated_at): (String, String, String, i64, i64),
) -> KeyReservation {
    KeyReservation {
        key_hash,
        hint,
        min_role: Role::parse(&min_role),
        created_at,
        updated_at,
    }
}

pub(crate) const ROUTE_COLUMNS: &str = "id, tenant_id, name, path_prefix, disabled_at, disable_auth, passthrough_auth_token, legacy_bearer_auth_tokens, protocol_transformation_type, groups, labels, metadata, max_attempts, created_at, updated_at";
pub(crate) const PLUGIN_COLUMNS: &str =
    "id, route_id, plugin, config, enabled, created_at, updated_at";
pub(crate) const CONSUMER_COLUMNS: &str =
    "id, name, groups, role, disabled, created_at, updated_at";
pub(crate) const CONSUMER_KEY_COLUMNS: &str =
    "id, consumer_id, key_hash, prefix, groups, expires_at, revoked_at, created_at, updated_at";
pub(crate) const PROVIDER_COLUMNS: &str =
    "id, name, protocol, default_capabilities, created_at, updated_at";
pub(crate) const UPSTREAM_COLUMNS: &str = "id, provider_id, base_url, group_name, priority, lb_weight, capabilities, enabled, created_at, updated_at";
pub(crate) const UPSTREAM_KEY_COLUMNS: &str =
    "id, upstream_id, secret, lb_weight, min_role, enabled, created_at, updated_at";
pub(crate) const UPSTREAM_MODEL_COLUMNS: &str =
    "id, model, upstream_id, provider_model_id, created_at, updated_at";

/// `$1, $2, … $n`.
pub(crate) fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `INSERT INTO table (columns) VALUES ($1…)`.
pub(crate) fn insert_sql(table: &str, columns: &str) -> String {
    let n = columns.split(',').count();
    format!(
        "INSERT INTO {table} ({columns}) VALUES ({})",
        placeholders(n)
    )
}

/// `UPDATE table SET c2 = $2, … WHERE id = $1` (the first column is the id).
pub(crate) fn update_sql(table: &str, columns: &str) -> String {
    let sets: Vec<String> = columns
        .split(',')
        .map(str::trim)
        .enumerate()
        .skip(1)
        .map(|(i, c)| format!("{c} = ${}", i + 1))
        .collect();
    format!("UPDATE {table} SET {} WHERE id = $1", sets.join(", "))
}

fn corrupt(table: &'static str, id: &str, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        table,
        id: id.to_owned(),
        message: format!("{what}: {e}"),
    }
}

fn from_json<T: DeserializeOwned>(
    table: &'static str,
    id: &str,
    column: &str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(table, id, column, e))
}

/// Enums are stored as their JSON string without quotes.
fn from_word<T: DeserializeOwned>(
    table: &'static str,
    id: &str,
    column: &str,
    word: &str,
) -> Result<T, StoreError> {
    serde_json::from_value(serde_json::Value::String(word.to_owned()))
        .map_err(|e| corrupt(table, id, column, e))
}

fn to_json(value: &impl serde::Serialize) -> String {
    // Serialising maps of strings, lists and JSON values cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

fn word(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct RouteRow {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub path_prefix: String,
    pub disabled_at: Option<i64>,
    pub disable_auth: bool,
    pub passthrough_auth_token: bool,
    pub legacy_bearer_auth_tokens: String,
    pub protocol_transformation_type: String,
    pub groups: String,
    pub labels: String,
    pub metadata: String,
    pub max_attempts: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

impl RouteRow {
    pub fn decode(self) -> Result<Route, StoreError> {
        const T: &str = "routes";
        let id = &self.id;
        Ok(Route {
            legacy_bearer_auth_tokens: from_json(
                T,
                id,
                "legacy_bearer_auth_tokens",
                &self.legacy_bearer_auth_tokens,
            )?,
            protocol_transformation_type: from_word(
                T,
                id,
                "protocol_transformation_type",
                &self.protocol_transformation_type,
            )?,
            groups: from_json(T, id, "groups", &self.groups)?,
            labels: from_json::<BTreeMap<String, String>>(T, id, "labels", &self.labels)?,
            metadata: from_json(T, id, "metadata", &self.metadata)?,
            id: self.id,
            tenant_id: self.tenant_id,
            name: self.name,
            path_prefix: self.path_prefix,
            disabled_at: self.disabled_at,
            disable_auth: self.disable_auth,
            passthrough_auth_token: self.passthrough_auth_token,
            max_attempts: self.max_attempts,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn encode(r: &Route) -> RouteRow {
        let tokens: Vec<serde_json::Value> = r
            .legacy_bearer_auth_tokens
            .iter()
            .map(LegacyToken::stored)
            .collect();
        RouteRow {
            id: r.id.clone(),
            tenant_id: r.tenant_id.clone(),
            name: r.name.clone(),
            path_prefix: r.path_prefix.clone(),
            disabled_at: r.disabled_at,
            disable_auth: r.disable_auth,
            passthrough_auth_token: r.passthrough_auth_token,
            legacy_bearer_auth_tokens: to_json(&tokens),
            protocol_transformation_type: word(&r.protocol_transformation_type),
            groups: to_json(&r.groups),
            labels: to_json(&r.labels),
            metadata: to_json(&r.metadata),
            max_attempts: r.max_attempts,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct PluginRow {
    pub id: String,
    pub route_id: String,
    pub plugin: String,
    pub config: String,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl PluginRow {
    pub fn decode(self) -> Result<PluginConfig, StoreError> {
        Ok(PluginConfig {
            config: from_json("plugin_configs", &self.id, "config", &self.config)?,
            id: self.id,
            route_id: self.route_id,
            plugin: self.plugin,
            enabled: self.enabled,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn encode(p: &PluginConfig) -> PluginRow {
        PluginRow {
            id: p.id.clone(),
            route_id: p.route_id.clone(),
            plugin: p.plugin.clone(),
            config: to_json(&p.config),
            enabled: p.enabled,
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct ConsumerRow {
    pub id: String,
    pub name: String,
    pub groups: String,
    pub role: String,
    pub disabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl ConsumerRow {
    pub fn decode(self) -> Result<Consumer, StoreError> {
        Ok(Consumer {
            groups: from_json("consumers", &self.id, "groups", &self.groups)?,
            role: Role::parse(&self.role),
            id: self.id,
            name: self.name,
            disabled: self.disabled,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn encode(c: &Consumer) -> ConsumerRow {
        ConsumerRow {
            id: c.id.clone(),
            name: c.name.clone(),
            groups: to_json(&c.groups),
            role: c.role.as_str().to_owned(),
            disabled: c.disabled,
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct ConsumerKeyRow {
    pub id: String,
    pub consumer_id: String,
    pub key_hash: String,
    pub prefix: String,
    pub groups: String,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl ConsumerKeyRow {
    pub fn decode(self) -> Result<ConsumerKey, StoreError> {
        Ok(ConsumerKey {
            groups: from_json("consumer_api_keys", &self.id, "groups", &self.groups)?,
            id: self.id,
            consumer_id: self.consumer_id,
            key_hash: self.key_hash,
            prefix: self.prefix,
            expires_at: self.expires_at,
            revoked_at: self.revoked_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn encode(k: &ConsumerKey) -> ConsumerKeyRow {
        ConsumerKeyRow {
            id: k.id.clone(),
            consumer_id: k.consumer_id.clone(),
            key_hash: k.key_hash.clone(),
            prefix: k.prefix.clone(),
            groups: to_json(&k.groups),
            expires_at: k.expires_at,
            revoked_at: k.revoked_at,
            created_at: k.created_at,
            updated_at: k.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct ProviderRow {
    pub id: String,
    pub name: String,
    pub protocol: String,
    pub default_capabilities: String,
    pub created_at: i64,
    pub updated_at: i64,
}

impl ProviderRow {
    pub fn decode(self) -> Result<Provider, StoreError> {
        const T: &str = "providers";
        Ok(Provider {
            protocol: from_word(T, &self.id, "protocol", &self.protocol)?,
            default_capabilities: from_json(
                T,
                &self.id,
                "default_capabilities",
                &self.default_capabilities,
            )?,
            id: self.id,
            name: self.name,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn encode(p: &Provider) -> ProviderRow {
        ProviderRow {
            id: p.id.clone(),
            name: p.name.clone(),
            protocol: p.protocol.as_str().to_owned(),
            default_capabilities: to_json(&p.default_capabilities),
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct UpstreamRow {
    pub id: String,
    pub provider_id: String,
    pub base_url: String,
    pub group_name: String,
    pub priority: i64,
    pub lb_weight: f64,
    pub capabilities: Option<String>,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl UpstreamRow {
    pub fn decode(self) -> Result<Upstream, StoreError> {
        let capabilities = match &self.capabilities {
            Some(text) => Some(from_json("upstreams", &self.id, "capabilities", text)?),
            None => None,
        };
        Ok(Upstream {
            capabilities,
            id: self.id,
            provider_id: self.provider_id,
            base_url: self.base_url,
            group: self.group_name,
            priority: self.priority,
            lb_weight: self.lb_weight,
            enabled: self.enabled,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn encode(u: &Upstream) -> UpstreamRow {
        UpstreamRow {
            id: u.id.clone(),
            provider_id: u.provider_id.clone(),
            base_url: u.base_url.clone(),
            group_name: u.group.clone(),
            priority: u.priority,
            lb_weight: u.lb_weight,
            capabilities: u.capabilities.as_ref().map(to_json),
            enabled: u.enabled,
            created_at: u.created_at,
            updated_at: u.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct UpstreamKeyRow {
    pub id: String,
    pub upstream_id: String,
    pub secret: String,
    pub lb_weight: Option<f64>,
    pub min_role: String,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl UpstreamKeyRow {
    pub fn decode(self) -> Result<UpstreamKey, StoreError> {
        Ok(UpstreamKey {
            id: self.id,
            upstream_id: self.upstream_id,
            secret: Secret::new(self.secret),
            lb_weight: self.lb_weight,
            min_role: Role::parse(&self.min_role),
            enabled: self.enabled,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn encode(k: &UpstreamKey) -> UpstreamKeyRow {
        UpstreamKeyRow {
            id: k.id.clone(),
            upstream_id: k.upstream_id.clone(),
            secret: k.secret.expose().to_owned(),
            lb_weight: k.lb_weight,
            min_role: k.min_role.as_str().to_owned(),
            enabled: k.enabled,
            created_at: k.created_at,
            updated_at: k.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct UpstreamModelRow {
    pub id: String,
    pub model: String,
    pub upstream_id: String,
    pub provider_model_id: String,
    pub created_at: i64,
    pub updated_at: i64,
}

impl UpstreamModelRow {
    pub fn decode(self) -> Result<UpstreamModel, StoreError> {
        Ok(UpstreamModel {
            id: self.id,
            model: self.model,
            upstream_id: self.upstream_id,
            provider_model_id: self.provider_model_id,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn encode(m: &UpstreamModel) -> UpstreamModelRow {
        UpstreamModelRow {
            id: m.id.clone(),
            model: m.model.clone(),
            upstream_id: m.upstream_id.clone(),
            provider_model_id: m.provider_model_id.clone(),
            created_at: m.created_at,
            updated_at: m.updated_at,
        }
    }
}

pub(crate) fn decode_all<R, T>(
    rows: Vec<R>,
    decode: impl Fn(R) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    rows.into_iter().map(decode).collect()
}

/// A unique-index violation becomes `conflict`; anything else a database error.
pub(crate) fn unique_or(
    backend: &'static str,
    e: sqlx::Error,
    conflict: impl FnOnce() -> StoreError,
) -> StoreError {
    if e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
    {
        conflict()
    } else {
        StoreError::Database { backend, source: e }
    }
}

fn not_found(entity: &'static str, id: &str) -> StoreError {
    StoreError::NotFound {
        entity,
        id: id.to_owned(),
    }
}

pub(crate) fn route_not_found(id: &str) -> StoreError {
    not_found("route", id)
}

pub(crate) fn plugin_not_found(id: &str) -> StoreError {
    not_found("plugin config", id)
}

pub(crate) fn consumer_not_found(id: &str) -> StoreError {
    not_found("consumer", id)
}

pub(crate) fn consumer_key_not_found(id: &str) -> StoreError {
    not_found("consumer key", id)
}

pub(crate) fn provider_not_found(id: &str) -> StoreError {
    not_found("provider", id)
}

pub(crate) fn upstream_not_found(id: &str) -> StoreError {
    not_found("upstream", id)
}

pub(crate) fn upstream_key_not_found(id: &str) -> StoreError {
    not_found("upstream key", id)
}

pub(crate) fn upstream_model_not_found(id: &str) -> StoreError {
    not_found("upstream model", id)
}

pub(crate) fn conflict(field: &str, message: String) -> StoreError {
    StoreError::Conflict {
        field: Some(field.to_owned()),
        message,
    }
}

/// Implements [`super::config_store::ConfigStore`] for `$store`, a backend over `$db`.
macro_rules! impl_config_store {
    ($store:ty, $db:ty) => {
        use $crate::store::model::*;
        use $crate::store::snapshot::{Snapshot, SnapshotRows};
        use $crate::store::sql::*;
        use $crate::store::StoreError;

        type Conn = <$db as sqlx::Database>::Connection;

        async fn fetch_opt<R>(
            conn: &mut Conn,
            sql: &str,
            id: &str,
        ) -> Result<Option<R>, sqlx::Error>
        where
            R: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin,
        {
            sqlx::query_as::<$db, R>(sql).bind(id).fetch_optional(&mut *conn).await
        }

        async fn write_route(conn: &mut Conn, sql: &str, r: &Route) -> Result<(), sqlx::Error> {
            let row = RouteRow::encode(r);
            sqlx::query::<$db>(sql)
                .bind(row.id)
                .bind(row.tenant_id)
                .bind(row.name)
                .bind(row.path_prefix)
                .bind(row.disabled_at)
                .bind(row.disable_auth)
                .bind(row.passthrough_auth_token)
                .bind(row.legacy_bearer_auth_tokens)
                .bind(row.protocol_transformation_type)
                .bind(row.groups)
                .bind(row.labels)
                .bind(row.metadata)
                .bind(row.max_attempts)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        async fn write_plugin(
            conn: &mut Conn,
            sql: &str,
            p: &PluginConfig,
        ) -> Result<(), sqlx::Error> {
            let row = PluginRow::encode(p);
            sqlx::query::<$db>(sql)
                .bind(row.id)
                .bind(row.route_id)
                .bind(row.plugin)
                .bind(row.config)
                .bind(row.enabled)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        async fn write_consumer(
            conn: &mut Conn,
            sql: &str,
            c: &Consumer,
        ) -> Result<(), sqlx::Error> {
            let row = ConsumerRow::encode(c);
            sqlx::query::<$db>(sql)
                .bind(row.id)
                .bind(row.name)
                .bind(row.groups)
                .bind(row.role)
                .bind(row.disabled)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        async fn write_consumer_key(
            conn: &mut Conn,
            sql: &str,
            k: &ConsumerKey,
        ) -> Result<(), sqlx::Error> {
            let row = ConsumerKeyRow::encode(k);
            sqlx::query::<$db>(sql)
                .bind(row.id)
                .bind(row.consumer_id)
                .bind(row.key_hash)
                .bind(row.prefix)
                .bind(row.groups)
                .bind(row.expires_at)
                .bind(row.revoked_at)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        async fn write_provider(
            conn: &mut Conn,
            sql: &str,
            p: &Provider,
        ) -> Result<(), sqlx::Error> {
            let row = ProviderRow::encode(p);
            sqlx::query::<$db>(sql)
                .bind(row.id)
                .bind(row.name)
                .bind(row.protocol)
                .bind(row.default_capabilities)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        async fn write_upstream(
            conn: &mut Conn,
            sql: &str,
            u: &Upstream,
        ) -> Result<(), sqlx::Error> {
            let row = UpstreamRow::encode(u);
            sqlx::query::<$db>(sql)
                .bind(row.id)
                .bind(row.provider_id)
                .bind(row.base_url)
                .bind(row.group_name)
                .bind(row.priority)
                .bind(row.lb_weight)
                .bind(row.capabilities)
                .bind(row.enabled)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        async fn write_upstream_key(
            conn: &mut Conn,
            sql: &str,
            k: &UpstreamKey,
        ) -> Result<(), sqlx::Error> {
            let row = UpstreamKeyRow::encode(k);
            sqlx::query::<$db>(sql)
                .bind(row.id)
                .bind(row.upstream_id)
                .bind(row.secret)
                .bind(row.lb_weight)
                .bind(row.min_role)
                .bind(row.enabled)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        async fn write_upstream_model(
            conn: &mut Conn,
            sql: &str,
            m: &UpstreamModel,
        ) -> Result<(), sqlx::Error> {
            let row = UpstreamModelRow::encode(m);
            sqlx::query::<$db>(sql)
                .bind(row.id)
                .bind(row.model)
                .bind(row.upstream_id)
                .bind(row.provider_model_id)
                .bind(row.created_at)
                .bind(row.updated_at)
                .execute(&mut *conn)
                .await
                .map(|_| ())
        }

        /// Deletes one row; false when there was none.
        async fn delete_row(conn: &mut Conn, sql: &str, binds: &[&str]) -> Result<bool, sqlx::Error> {
            let mut q = sqlx::query::<$db>(sql);
            for b in binds {
                q = q.bind(b.to_string());
            }
            Ok(q.execute(&mut *conn).await?.rows_affected() > 0)
        }

        async fn exists(conn: &mut Conn, sql: &str, id: &str) -> Result<bool, sqlx::Error> {
            Ok(sqlx::query::<$db>(sql)
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?
                .is_some())
        }

        impl $store {
            async fn route_in(&self, conn: &mut Conn, id: &str) -> Result<Route, StoreError> {
                let sql = format!("SELECT {ROUTE_COLUMNS} FROM routes WHERE id = $1");
                fetch_opt::<RouteRow>(conn, &sql, id)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .ok_or_else(|| route_not_found(id))?
                    .decode()
            }

            /// 409 when another enabled route has the prefix (the unique index is the backstop).
            async fn check_path_prefix(&self, conn: &mut Conn, r: &Route) -> Result<(), StoreError> {
                if !r.enabled() {
                    return Ok(());
                }
                let other: Option<(String,)> = sqlx::query_as::<$db, (String,)>(
                    "SELECT id FROM routes WHERE path_prefix = $1 AND disabled_at IS NULL AND id <> $2",
                )
                .bind(&r.path_prefix)
                .bind(&r.id)
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| self.db_error(e))?;
                match other {
                    Some((id,)) => Err(prefix_conflict(&r.path_prefix, Some(&id))),
                    None => Ok(()),
                }
            }

            async fn plugin_in(
                &self,
                conn: &mut Conn,
                route_id: &str,
                id: &str,
            ) -> Result<PluginConfig, StoreError> {
                let sql = format!(
                    "SELECT {PLUGIN_COLUMNS} FROM plugin_configs WHERE id = $1 AND route_id = $2"
                );
                sqlx::query_as::<$db, PluginRow>(&sql)
                    .bind(id)
                    .bind(route_id)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .ok_or_else(|| plugin_not_found(id))?
                    .decode()
            }

            async fn consumer_in(&self, conn: &mut Conn, id: &str) -> Result<Consumer, StoreError> {
                let sql = format!("SELECT {CONSUMER_COLUMNS} FROM consumers WHERE id = $1");
                fetch_opt::<ConsumerRow>(conn, &sql, id)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .ok_or_else(|| consumer_not_found(id))?
                    .decode()
            }

            async fn consumer_key_in(
                &self,
                conn: &mut Conn,
                consumer_id: &str,
                id: &str,
            ) -> Result<ConsumerKey, StoreError> {
                let sql = format!(
                    "SELECT {CONSUMER_KEY_COLUMNS} FROM consumer_api_keys WHERE id = $1 AND consumer_id = $2"
                );
                sqlx::query_as::<$db, ConsumerKeyRow>(&sql)
                    .bind(id)
                    .bind(consumer_id)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .ok_or_else(|| consumer_key_not_found(id))?
                    .decode()
            }

            async fn provider_in(&self, conn: &mut Conn, id: &str) -> Result<Provider, StoreError> {
                let sql = format!("SELECT {PROVIDER_COLUMNS} FROM providers WHERE id = $1");
                fetch_opt::<ProviderRow>(conn, &sql, id)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .ok_or_else(|| provider_not_found(id))?
                    .decode()
            }

            async fn upstream_in(&self, conn: &mut Conn, id: &str) -> Result<Upstream, StoreError> {
                let sql = format!("SELECT {UPSTREAM_COLUMNS} FROM upstreams WHERE id = $1");
                fetch_opt::<UpstreamRow>(conn, &sql, id)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .ok_or_else(|| upstream_not_found(id))?
                    .decode()
            }

            async fn upstream_key_in(
                &self,
                conn: &mut Conn,
                upstream_id: &str,
                id: &str,
            ) -> Result<UpstreamKey, StoreError> {
                let sql = format!(
                    "SELECT {UPSTREAM_KEY_COLUMNS} FROM upstream_api_keys WHERE id = $1 AND upstream_id = $2"
                );
                sqlx::query_as::<$db, UpstreamKeyRow>(&sql)
                    .bind(id)
                    .bind(upstream_id)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .ok_or_else(|| upstream_key_not_found(id))?
                    .decode()
            }

            async fn upstream_model_in(
                &self,
                conn: &mut Conn,
                id: &str,
            ) -> Result<UpstreamModel, StoreError> {
                let sql = format!("SELECT {UPSTREAM_MODEL_COLUMNS} FROM upstream_models WHERE id = $1");
                fetch_opt::<UpstreamModelRow>(conn, &sql, id)
                    .await
                    .map_err(|e| self.db_error(e))?
                    .ok_or_else(|| upstream_model_not_found(id))?
                    .decode()
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
                let sql = format!("SELECT 1 FROM {table} WHERE id = $1");
                if exists(conn, &sql, id).await.map_err(|e| self.db_error(e))? {
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
                let sql = format!("SELECT 1 FROM {table} WHERE id = $1");
                if exists(conn, &sql, id).await.map_err(|e| self.db_error(e))? {
                    Ok(())
                } else {
                    Err(missing(id))
                }
            }

            async fn list<R, T>(
                &self,
                sql: &str,
                bind: Option<&str>,
                decode: fn(R) -> Result<T, StoreError>,
            ) -> Result<Vec<T>, StoreError>
            where
                R: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin,
            {
                let mut q = sqlx::query_as::<$db, R>(sql);
                if let Some(b) = bind {
                    q = q.bind(b.to_owned());
                }
                let rows = q.fetch_all(&self.pool).await.map_err(|e| self.db_error(e))?;
                decode_all(rows, decode)
            }

            async fn all_in<R, T>(
                &self,
                conn: &mut Conn,
                columns: &str,
                table: &str,
                decode: fn(R) -> Result<T, StoreError>,
            ) -> Result<Vec<T>, StoreError>
            where
                R: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin,
            {
                let sql = format!("SELECT {columns} FROM {table} ORDER BY created_at, id");
                let rows = sqlx::query_as::<$db, R>(&sql)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(|e| self.db_error(e))?;
                decode_all(rows, decode)
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

        #[async_trait::async_trait]
        impl $crate::store::config_store::ConfigStore for $store {
            fn backend(&self) -> &'static str {
                BACKEND
            }

            // ---- routes ----

            async fn list_routes(&self) -> Result<Vec<Route>, StoreError> {
                let sql = format!("SELECT {ROUTE_COLUMNS} FROM routes ORDER BY created_at, id");
                self.list(&sql, None, RouteRow::decode).await
            }

            async fn get_route(&self, id: &str) -> Result<Route, StoreError> {
                self.route_in(&mut *self.conn().await?, id).await
            }

            async fn create_route(&self, new: NewRoute) -> Result<Route, StoreError> {
                let route = new.into_route(generate_id("rt"), now())?;
                let (mut tx, version) = self.begin_write().await?;
                self.check_path_prefix(&mut tx, &route).await?;
                write_route(&mut tx, &insert_sql("routes", ROUTE_COLUMNS), &route)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || prefix_conflict(&route.path_prefix, None)))?;
                self.commit(tx, version).await?;
                Ok(route)
            }

            async fn update_route(&self, id: &str, patch: RoutePatch) -> Result<Route, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                let mut route = self.route_in(&mut tx, id).await?;
                patch.apply(&mut route, now())?;
                self.check_path_prefix(&mut tx, &route).await?;
                write_route(&mut tx, &update_sql("routes", ROUTE_COLUMNS), &route)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || prefix_conflict(&route.path_prefix, None)))?;
                self.commit(tx, version).await?;
                Ok(route)
            }

            async fn delete_route(&self, id: &str) -> Result<(), StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                // Explicit rather than trusting ON DELETE CASCADE, which SQLite only honours with
                // foreign keys switched on for the connection.
                delete_row(&mut tx, "DELETE FROM plugin_configs WHERE route_id = $1", &[id])
                    .await
                    .map_err(|e| self.db_error(e))?;
                if !delete_row(&mut tx, "DELETE FROM routes WHERE id = $1", &[id])
                    .await
                    .map_err(|e| self.db_error(e))?
                {
                    return Err(route_not_found(id));
                }
                self.commit(tx, version).await
            }

            // ---- plugin configs ----

            async fn list_plugin_configs(&self, route_id: &str) -> Result<Vec<PluginConfig>, StoreError> {
                self.require_parent(&mut *self.conn().await?, "routes", route_id, route_not_found)
                    .await?;
                let sql = format!(
                    "SELECT {PLUGIN_COLUMNS} FROM plugin_configs WHERE route_id = $1 ORDER BY plugin, id"
                );
                self.list(&sql, Some(route_id), PluginRow::decode).await
            }

            async fn get_plugin_config(&self, route_id: &str, id: &str) -> Result<PluginConfig, StoreError> {
                let mut conn = self.conn().await?;
                self.require_parent(&mut conn, "routes", route_id, route_not_found).await?;
                self.plugin_in(&mut conn, route_id, id).await
            }

            async fn create_plugin_config(
                &self,
                route_id: &str,
                new: NewPluginConfig,
            ) -> Result<PluginConfig, StoreError> {
                let plugin = new.into_plugin_config(generate_id("pl"), route_id.to_owned(), now())?;
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "routes", route_id, route_not_found).await?;
                write_plugin(&mut tx, &insert_sql("plugin_configs", PLUGIN_COLUMNS), &plugin)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || plugin_conflict(&plugin)))?;
                self.commit(tx, version).await?;
                Ok(plugin)
            }

            async fn update_plugin_config(
                &self,
                route_id: &str,
                id: &str,
                patch: PluginConfigPatch,
            ) -> Result<PluginConfig, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "routes", route_id, route_not_found).await?;
                let mut plugin = self.plugin_in(&mut tx, route_id, id).await?;
                patch.apply(&mut plugin, now())?;
                write_plugin(&mut tx, &update_sql("plugin_configs", PLUGIN_COLUMNS), &plugin)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || plugin_conflict(&plugin)))?;
                self.commit(tx, version).await?;
                Ok(plugin)
            }

            async fn delete_plugin_config(&self, route_id: &str, id: &str) -> Result<(), StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "routes", route_id, route_not_found).await?;
                if !delete_row(
                    &mut tx,
                    "DELETE FROM plugin_configs WHERE id = $1 AND route_id = $2",
                    &[id, route_id],
                )
                .await
                .map_err(|e| self.db_error(e))?
                {
                    return Err(plugin_not_found(id));
                }
                self.commit(tx, version).await
            }

            async fn route_plugins(
                &self,
                route_id: &str,
            ) -> Result<std::collections::BTreeMap<String, serde_json::Value>, StoreError> {
                let plugins = self.list_plugin_configs(route_id).await?;
                Ok(plugins
                    .into_iter()
                    .filter(|p| p.enabled)
                    .map(|p| (p.plugin, p.config))
                    .collect())
            }

            // ---- consumers ----

            async fn list_consumers(&self) -> Result<Vec<Consumer>, StoreError> {
                let sql = format!("SELECT {CONSUMER_COLUMNS} FROM consumers ORDER BY created_at, id");
                self.list(&sql, None, ConsumerRow::decode).await
            }

            async fn get_consumer(&self, id: &str) -> Result<Consumer, StoreError> {
                self.consumer_in(&mut *self.conn().await?, id).await
            }

            async fn create_consumer(&self, new: NewConsumer) -> Result<Consumer, StoreError> {
                let consumer = new.into_consumer(generate_id("cs"), now())?;
                let (mut tx, version) = self.begin_write().await?;
                write_consumer(&mut tx, &insert_sql("consumers", CONSUMER_COLUMNS), &consumer)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || name_conflict("consumer", &consumer.name)))?;
                self.commit(tx, version).await?;
                Ok(consumer)
            }

            async fn update_consumer(&self, id: &str, patch: ConsumerPatch) -> Result<Consumer, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                let mut consumer = self.consumer_in(&mut tx, id).await?;
                patch.apply(&mut consumer, now())?;
                write_consumer(&mut tx, &update_sql("consumers", CONSUMER_COLUMNS), &consumer)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || name_conflict("consumer", &consumer.name)))?;
                self.commit(tx, version).await?;
                Ok(consumer)
            }

            async fn delete_consumer(&self, id: &str) -> Result<(), StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                delete_row(&mut tx, "DELETE FROM consumer_api_keys WHERE consumer_id = $1", &[id])
                    .await
                    .map_err(|e| self.db_error(e))?;
                if !delete_row(&mut tx, "DELETE FROM consumers WHERE id = $1", &[id])
                    .await
                    .map_err(|e| self.db_error(e))?
                {
                    return Err(consumer_not_found(id));
                }
                self.commit(tx, version).await
            }

            // ---- consumer keys ----

            async fn list_consumer_keys(&self, consumer_id: &str) -> Result<Vec<ConsumerKey>, StoreError> {
                self.require_parent(&mut *self.conn().await?, "consumers", consumer_id, consumer_not_found)
                    .await?;
                let sql = format!(
                    "SELECT {CONSUMER_KEY_COLUMNS} FROM consumer_api_keys WHERE consumer_id = $1 ORDER BY created_at, id"
                );
                self.list(&sql, Some(consumer_id), ConsumerKeyRow::decode).await
            }

            async fn get_consumer_key(&self, consumer_id: &str, id: &str) -> Result<ConsumerKey, StoreError> {
                let mut conn = self.conn().await?;
                self.require_parent(&mut conn, "consumers", consumer_id, consumer_not_found).await?;
                self.consumer_key_in(&mut conn, consumer_id, id).await
            }

            async fn create_consumer_key(
                &self,
                consumer_id: &str,
                new: NewConsumerKey,
            ) -> Result<CreatedConsumerKey, StoreError> {
                let (key, secret) = new.into_key(generate_id("ck"), consumer_id.to_owned(), now())?;
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "consumers", consumer_id, consumer_not_found).await?;
                write_consumer_key(&mut tx, &insert_sql("consumer_api_keys", CONSUMER_KEY_COLUMNS), &key)
                    .await
                    .map_err(|e| self.db_error(e))?;
                self.commit(tx, version).await?;
                Ok(CreatedConsumerKey { key, secret })
            }

            async fn update_consumer_key(
                &self,
                consumer_id: &str,
                id: &str,
                patch: ConsumerKeyPatch,
            ) -> Result<ConsumerKey, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "consumers", consumer_id, consumer_not_found).await?;
                let mut key = self.consumer_key_in(&mut tx, consumer_id, id).await?;
                patch.apply(&mut key, now())?;
                write_consumer_key(&mut tx, &update_sql("consumer_api_keys", CONSUMER_KEY_COLUMNS), &key)
                    .await
                    .map_err(|e| self.db_error(e))?;
                self.commit(tx, version).await?;
                Ok(key)
            }

            async fn delete_consumer_key(&self, consumer_id: &str, id: &str) -> Result<(), StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "consumers", consumer_id, consumer_not_found).await?;
                if !delete_row(
                    &mut tx,
                    "DELETE FROM consumer_api_keys WHERE id = $1 AND consumer_id = $2",
                    &[id, consumer_id],
                )
                .await
                .map_err(|e| self.db_error(e))?
                {
                    return Err(consumer_key_not_found(id));
                }
                self.commit(tx, version).await
            }

            async fn find_consumer_key(
                &self,
                secret: &str,
            ) -> Result<Option<(Consumer, ConsumerKey)>, StoreError> {
                let mut conn = self.conn().await?;
                let sql = format!(
                    "SELECT {CONSUMER_KEY_COLUMNS} FROM consumer_api_keys WHERE key_hash = $1"
                );
                let Some(row) = fetch_opt::<ConsumerKeyRow>(&mut conn, &sql, &hash_secret(secret))
                    .await
                    .map_err(|e| self.db_error(e))?
                else {
                    return Ok(None);
                };
                let key = row.decode()?;
                let consumer = self.consumer_in(&mut conn, &key.consumer_id).await?;
                Ok(Some((consumer, key)))
            }

            // ---- providers ----

            async fn list_providers(&self) -> Result<Vec<Provider>, StoreError> {
                let sql = format!("SELECT {PROVIDER_COLUMNS} FROM providers ORDER BY created_at, id");
                self.list(&sql, None, ProviderRow::decode).await
            }

            async fn get_provider(&self, id: &str) -> Result<Provider, StoreError> {
                self.provider_in(&mut *self.conn().await?, id).await
            }

            async fn create_provider(&self, new: NewProvider) -> Result<Provider, StoreError> {
                let provider = new.into_provider(generate_id("pv"), now())?;
                let (mut tx, version) = self.begin_write().await?;
                write_provider(&mut tx, &insert_sql("providers", PROVIDER_COLUMNS), &provider)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || name_conflict("provider", &provider.name)))?;
                self.commit(tx, version).await?;
                Ok(provider)
            }

            async fn update_provider(&self, id: &str, patch: ProviderPatch) -> Result<Provider, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                let mut provider = self.provider_in(&mut tx, id).await?;
                patch.apply(&mut provider, now())?;
                write_provider(&mut tx, &update_sql("providers", PROVIDER_COLUMNS), &provider)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || name_conflict("provider", &provider.name)))?;
                self.commit(tx, version).await?;
                Ok(provider)
            }

            async fn delete_provider(&self, id: &str) -> Result<(), StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                let users: Vec<(String,)> = sqlx::query_as::<$db, (String,)>(
                    "SELECT id FROM upstreams WHERE provider_id = $1 ORDER BY id",
                )
                .bind(id)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.db_error(e))?;
                if !users.is_empty() {
                    let ids: Vec<String> = users.into_iter().map(|(u,)| u).collect();
                    return Err(StoreError::Conflict {
                        field: None,
                        message: format!(
                            "provider `{id}` still has upstreams ({}); delete or move them first",
                            ids.join(", ")
                        ),
                    });
                }
                if !delete_row(&mut tx, "DELETE FROM providers WHERE id = $1", &[id])
                    .await
                    .map_err(|e| self.db_error(e))?
                {
                    return Err(provider_not_found(id));
                }
                self.commit(tx, version).await
            }

            // ---- upstreams ----

            async fn list_upstreams(&self) -> Result<Vec<Upstream>, StoreError> {
                let sql = format!("SELECT {UPSTREAM_COLUMNS} FROM upstreams ORDER BY created_at, id");
                self.list(&sql, None, UpstreamRow::decode).await
            }

            async fn get_upstream(&self, id: &str) -> Result<Upstream, StoreError> {
                self.upstream_in(&mut *self.conn().await?, id).await
            }

            async fn create_upstream(&self, new: NewUpstream) -> Result<Upstream, StoreError> {
                let upstream = new.into_upstream(generate_id("up"), now())?;
                let (mut tx, version) = self.begin_write().await?;
                self.require_ref(&mut tx, "providers", "provider_id", "provider", &upstream.provider_id)
                    .await?;
                write_upstream(&mut tx, &insert_sql("upstreams", UPSTREAM_COLUMNS), &upstream)
                    .await
                    .map_err(|e| self.db_error(e))?;
                self.commit(tx, version).await?;
                Ok(upstream)
            }

            async fn update_upstream(&self, id: &str, patch: UpstreamPatch) -> Result<Upstream, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                let mut upstream = self.upstream_in(&mut tx, id).await?;
                patch.apply(&mut upstream, now())?;
                self.require_ref(&mut tx, "providers", "provider_id", "provider", &upstream.provider_id)
                    .await?;
                write_upstream(&mut tx, &update_sql("upstreams", UPSTREAM_COLUMNS), &upstream)
                    .await
                    .map_err(|e| self.db_error(e))?;
                self.commit(tx, version).await?;
                Ok(upstream)
            }

            async fn delete_upstream(&self, id: &str) -> Result<(), StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                for sql in [
                    "DELETE FROM upstream_api_keys WHERE upstream_id = $1",
                    "DELETE FROM upstream_models WHERE upstream_id = $1",
                ] {
                    delete_row(&mut tx, sql, &[id]).await.map_err(|e| self.db_error(e))?;
                }
                if !delete_row(&mut tx, "DELETE FROM upstreams WHERE id = $1", &[id])
                    .await
                    .map_err(|e| self.db_error(e))?
                {
                    return Err(upstream_not_found(id));
                }
                self.commit(tx, version).await
            }

            // ---- upstream keys ----

            async fn list_upstream_keys(&self, upstream_id: &str) -> Result<Vec<UpstreamKey>, StoreError> {
                self.require_parent(&mut *self.conn().await?, "upstreams", upstream_id, upstream_not_found)
                    .await?;
                let sql = format!(
                    "SELECT {UPSTREAM_KEY_COLUMNS} FROM upstream_api_keys WHERE upstream_id = $1 ORDER BY created_at, id"
                );
                self.list(&sql, Some(upstream_id), UpstreamKeyRow::decode).await
            }

            async fn get_upstream_key(&self, upstream_id: &str, id: &str) -> Result<UpstreamKey, StoreError> {
                let mut conn = self.conn().await?;
                self.require_parent(&mut conn, "upstreams", upstream_id, upstream_not_found).await?;
                self.upstream_key_in(&mut conn, upstream_id, id).await
            }

            async fn create_upstream_key(
                &self,
                upstream_id: &str,
                new: NewUpstreamKey,
            ) -> Result<UpstreamKey, StoreError> {
                let key = new.into_key(generate_id("uk"), upstream_id.to_owned(), now())?;
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "upstreams", upstream_id, upstream_not_found).await?;
                write_upstream_key(&mut tx, &insert_sql("upstream_api_keys", UPSTREAM_KEY_COLUMNS), &key)
                    .await
                    .map_err(|e| self.db_error(e))?;
                self.commit(tx, version).await?;
                Ok(key)
            }

            async fn update_upstream_key(
                &self,
                upstream_id: &str,
                id: &str,
                patch: UpstreamKeyPatch,
            ) -> Result<UpstreamKey, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "upstreams", upstream_id, upstream_not_found).await?;
                let mut key = self.upstream_key_in(&mut tx, upstream_id, id).await?;
                patch.apply(&mut key, now())?;
                write_upstream_key(&mut tx, &update_sql("upstream_api_keys", UPSTREAM_KEY_COLUMNS), &key)
                    .await
                    .map_err(|e| self.db_error(e))?;
                self.commit(tx, version).await?;
                Ok(key)
            }

            async fn delete_upstream_key(&self, upstream_id: &str, id: &str) -> Result<(), StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                self.require_parent(&mut tx, "upstreams", upstream_id, upstream_not_found).await?;
                if !delete_row(
                    &mut tx,
                    "DELETE FROM upstream_api_keys WHERE id = $1 AND upstream_id = $2",
                    &[id, upstream_id],
                )
                .await
                .map_err(|e| self.db_error(e))?
                {
                    return Err(upstream_key_not_found(id));
                }
                self.commit(tx, version).await
            }

            // ---- upstream models ----

            async fn list_upstream_models(&self) -> Result<Vec<UpstreamModel>, StoreError> {
                let sql = format!(
                    "SELECT {UPSTREAM_MODEL_COLUMNS} FROM upstream_models ORDER BY model, created_at, id"
                );
                self.list(&sql, None, UpstreamModelRow::decode).await
            }

            async fn get_upstream_model(&self, id: &str) -> Result<UpstreamModel, StoreError> {
                self.upstream_model_in(&mut *self.conn().await?, id).await
            }

            async fn create_upstream_model(&self, new: NewUpstreamModel) -> Result<UpstreamModel, StoreError> {
                let model = new.into_model(generate_id("um"), now())?;
                let (mut tx, version) = self.begin_write().await?;
                self.require_ref(&mut tx, "upstreams", "upstream_id", "upstream", &model.upstream_id)
                    .await?;
                write_upstream_model(&mut tx, &insert_sql("upstream_models", UPSTREAM_MODEL_COLUMNS), &model)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || mapping_conflict(&model)))?;
                self.commit(tx, version).await?;
                Ok(model)
            }

            async fn update_upstream_model(
                &self,
                id: &str,
                patch: UpstreamModelPatch,
            ) -> Result<UpstreamModel, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                let mut model = self.upstream_model_in(&mut tx, id).await?;
                patch.apply(&mut model, now())?;
                self.require_ref(&mut tx, "upstreams", "upstream_id", "upstream", &model.upstream_id)
                    .await?;
                write_upstream_model(&mut tx, &update_sql("upstream_models", UPSTREAM_MODEL_COLUMNS), &model)
                    .await
                    .map_err(|e| unique_or(BACKEND, e, || mapping_conflict(&model)))?;
                self.commit(tx, version).await?;
                Ok(model)
            }

            async fn delete_upstream_model(&self, id: &str) -> Result<(), StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                if !delete_row(&mut tx, "DELETE FROM upstream_models WHERE id = $1", &[id])
                    .await
                    .map_err(|e| self.db_error(e))?
                {
                    return Err(upstream_model_not_found(id));
                }
                self.commit(tx, version).await
            }

            // ---- key reservations ----

            async fn list_key_reservations(&self) -> Result<Vec<KeyReservation>, StoreError> {
                let rows = sqlx::query_as::<$db, (String, String, String, i64, i64)>(
                    "SELECT key_hash, hint, min_role, created_at, updated_at FROM key_reservations ORDER BY created_at, key_hash",
                )
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db_error(e))?;
                Ok(rows.into_iter().map(reservation_of).collect())
            }

            async fn set_key_reservation(
                &self,
                key_hash: &str,
                hint: &str,
                min_role: Role,
            ) -> Result<Option<KeyReservation>, StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                let err = |e: sqlx::Error| self.db_error(e);
                if min_role == Role::Free {
                    sqlx::query("DELETE FROM key_reservations WHERE key_hash = $1")
                        .bind(key_hash)
                        .execute(&mut *tx)
                        .await
                        .map_err(err)?;
                    self.commit(tx, version).await?;
                    return Ok(None);
                }
                let now = now();
                sqlx::query(
                    "INSERT INTO key_reservations (key_hash, hint, min_role, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) \
                     ON CONFLICT (key_hash) DO UPDATE SET hint = excluded.hint, min_role = excluded.min_role, updated_at = excluded.updated_at",
                )
                .bind(key_hash)
                .bind(hint)
                .bind(min_role.as_str())
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
                let row = sqlx::query_as::<$db, (String, String, String, i64, i64)>(
                    "SELECT key_hash, hint, min_role, created_at, updated_at FROM key_reservations WHERE key_hash = $1",
                )
                .bind(key_hash)
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
                self.commit(tx, version).await?;
                Ok(Some(reservation_of(row)))
            }

            // ---- change feed and snapshot ----

            async fn version(&self) -> Result<i64, StoreError> {
                sqlx::query_scalar::<$db, i64>("SELECT version FROM config_version WHERE id = 1")
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| self.db_error(e))
            }

            fn watch(&self) -> tokio::sync::watch::Receiver<i64> {
                self.watch_feed()
            }

            async fn load_snapshot(&self) -> Result<Snapshot, StoreError> {
                let mut tx = self.begin_read().await?;
                let err = |e: sqlx::Error| self.db_error(e);
                let version: i64 =
                    sqlx::query_scalar::<$db, i64>("SELECT version FROM config_version WHERE id = 1")
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(err)?;
                let rows = SnapshotRows {
                    version,
                    routes: self.all_in(&mut tx, ROUTE_COLUMNS, "routes", RouteRow::decode).await?,
                    plugin_configs: self
                        .all_in(&mut tx, PLUGIN_COLUMNS, "plugin_configs", PluginRow::decode)
                        .await?,
                    consumers: self
                        .all_in(&mut tx, CONSUMER_COLUMNS, "consumers", ConsumerRow::decode)
                        .await?,
                    consumer_keys: self
                        .all_in(&mut tx, CONSUMER_KEY_COLUMNS, "consumer_api_keys", ConsumerKeyRow::decode)
                        .await?,
                    providers: self
                        .all_in(&mut tx, PROVIDER_COLUMNS, "providers", ProviderRow::decode)
                        .await?,
                    upstreams: self
                        .all_in(&mut tx, UPSTREAM_COLUMNS, "upstreams", UpstreamRow::decode)
                        .await?,
                    upstream_keys: self
                        .all_in(&mut tx, UPSTREAM_KEY_COLUMNS, "upstream_api_keys", UpstreamKeyRow::decode)
                        .await?,
                    upstream_models: self
                        .all_in(&mut tx, UPSTREAM_MODEL_COLUMNS, "upstream_models", UpstreamModelRow::decode)
                        .await?,
                    key_reservations: sqlx::query_as::<$db, (String, String, String, i64, i64)>(
                        "SELECT key_hash, hint, min_role, created_at, updated_at FROM key_reservations ORDER BY created_at, key_hash",
                    )
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(err)?
                    .into_iter()
                    .map(reservation_of)
                    .collect(),
                    routewise_settings: self.routewise_rows(&mut tx).await?,
                };
                tx.commit().await.map_err(err)?;
                let loaded_at = i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX);
                Ok(Snapshot::build(rows, loaded_at))
            }
        }
    };
}

pub(crate) use impl_config_store;

pub(crate) fn prefix_conflict(prefix: &str, other: Option<&str>) -> StoreError {
    let by = other
        .map(|id| format!(" (route `{id}`)"))
        .unwrap_or_default();
    conflict(
        "path_prefix",
        format!("path_prefix: `{prefix}` is already used by an enabled route{by}"),
    )
}

pub(crate) fn plugin_conflict(p: &PluginConfig) -> StoreError {
    conflict(
        "plugin",
        format!(
            "plugin: route `{}` already has a `{}` config",
            p.route_id, p.plugin
        ),
    )
}

pub(crate) fn name_conflict(what: &str, name: &str) -> StoreError {
    conflict("name", format!("name: a {what} named `{name}` exists"))
}

pub(crate) fn mapping_conflict(m: &UpstreamModel) -> StoreError {
    conflict(
        "model",
        format!(
            "model: `{}` is already mapped to upstream `{}`",
            m.model, m.upstream_id
        ),
    )
}
