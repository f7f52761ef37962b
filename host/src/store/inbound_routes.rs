//! Inbound routes (`routes`) and their plugin configs (`plugin_configs`): the tables, and the
//! [`InboundRouteStore`] part of [`super::ConfigStore`].

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::StoreError;
use super::table::{Codec, Json, Word, conflict, not_found, table, to_json};
use crate::entity::{
    LegacyToken, NewPluginConfig, NewRoute, PluginConfig, PluginConfigPatch, Route, RoutePatch,
};

table! {
    /// A `routes` row.
    RouteRow: Route = "routes" {
        id: String,
        tenant_id: String,
        name: String,
        path_prefix: String,
        disabled_at: Option<i64>,
        disable_auth: bool,
        passthrough_auth_token: bool,
        legacy_bearer_auth_tokens: String = LegacyTokens,
        protocol_transformation_type: String = Word,
        groups: String = Json,
        labels: String = Json,
        metadata: String = Json,
        max_attempts: i64,
        created_at: i64,
        updated_at: i64,
    }
}

table! {
    /// A `plugin_configs` row.
    PluginConfigRow: PluginConfig = "plugin_configs" {
        id: String,
        route_id: String,
        plugin: String,
        config: String = Json,
        enabled: bool,
        created_at: i64,
        updated_at: i64,
    }
}

/// Legacy tokens are stored with their hashes (JSON `[{sha256, hint}]`), unlike their API form,
/// which shows the hints only.
pub(crate) struct LegacyTokens;

impl Codec<Vec<LegacyToken>> for LegacyTokens {
    type Stored = String;

    fn encode(tokens: &Vec<LegacyToken>) -> String {
        let stored: Vec<serde_json::Value> = tokens.iter().map(LegacyToken::stored).collect();
        to_json(&stored)
    }

    fn decode(stored: String) -> Result<Vec<LegacyToken>, String> {
        <Json as Codec<_>>::decode(stored)
    }
}

/// Inbound routes and their plugin configs; part of every [`super::ConfigStore`].
#[async_trait]
pub trait InboundRouteStore: Send + Sync {
    async fn list_routes(&self) -> Result<Vec<Route>, StoreError>;
    async fn get_route(&self, id: &str) -> Result<Route, StoreError>;
    async fn create_route(&self, new: NewRoute) -> Result<Route, StoreError>;
    async fn update_route(&self, id: &str, patch: RoutePatch) -> Result<Route, StoreError>;
    /// Also deletes the route's plugin configs.
    async fn delete_route(&self, id: &str) -> Result<(), StoreError>;

    async fn list_plugin_configs(&self, route_id: &str) -> Result<Vec<PluginConfig>, StoreError>;
    async fn get_plugin_config(&self, route_id: &str, id: &str)
    -> Result<PluginConfig, StoreError>;
    async fn create_plugin_config(
        &self,
        route_id: &str,
        new: NewPluginConfig,
    ) -> Result<PluginConfig, StoreError>;
    async fn update_plugin_config(
        &self,
        route_id: &str,
        id: &str,
        patch: PluginConfigPatch,
    ) -> Result<PluginConfig, StoreError>;
    async fn delete_plugin_config(&self, route_id: &str, id: &str) -> Result<(), StoreError>;

    /// The route's enabled plugin configs as `plugin name → config`, what the runtime applies.
    async fn route_plugins(
        &self,
        route_id: &str,
    ) -> Result<BTreeMap<String, serde_json::Value>, StoreError> {
        let plugins = self.list_plugin_configs(route_id).await?;
        Ok(plugins
            .into_iter()
            .filter(|p| p.enabled)
            .map(|p| (p.plugin, p.config))
            .collect())
    }
}

pub(crate) fn route_not_found(id: &str) -> StoreError {
    not_found("route", id)
}

pub(crate) fn plugin_not_found(id: &str) -> StoreError {
    not_found("plugin config", id)
}

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

/// Implements [`InboundRouteStore`] for `$store` over `$db`, inside `impl_config_store!` (whose
/// helpers it uses).
macro_rules! impl_inbound_route_store {
    ($store:ty, $db:ty) => {
        mod inbound_routes {
            use super::*;
            use $crate::entity::{
                NewPluginConfig, NewRoute, PluginConfig, PluginConfigPatch, Route, RoutePatch,
                generate_id, now,
            };
            use $crate::store::inbound_routes::*;
            use $crate::store::table::unique_or;

            impl $store {
                async fn route_in(&self, conn: &mut Conn, id: &str) -> Result<Route, StoreError> {
                    self.find::<RouteRow>(conn, "WHERE id = $1", &[id])
                        .await?
                        .ok_or_else(|| route_not_found(id))
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
                    self.find::<PluginConfigRow>(conn, "WHERE id = $1 AND route_id = $2", &[id, route_id])
                        .await?
                        .ok_or_else(|| plugin_not_found(id))
                }
            }

            #[async_trait::async_trait]
            impl InboundRouteStore for $store {
                async fn list_routes(&self) -> Result<Vec<Route>, StoreError> {
                    self.list::<RouteRow>("ORDER BY created_at, id", &[]).await
                }

                async fn get_route(&self, id: &str) -> Result<Route, StoreError> {
                    self.route_in(&mut *self.conn().await?, id).await
                }

                async fn create_route(&self, new: NewRoute) -> Result<Route, StoreError> {
                    let route = new.into_route(generate_id("rt"), now())?;
                    let (mut tx, version) = self.begin_write().await?;
                    self.check_path_prefix(&mut tx, &route).await?;
                    write::<RouteRow>(&mut tx, &RouteRow::insert(), &route)
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
                    write::<RouteRow>(&mut tx, &RouteRow::update(), &route)
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

                async fn list_plugin_configs(&self, route_id: &str) -> Result<Vec<PluginConfig>, StoreError> {
                    self.require_parent(&mut *self.conn().await?, "routes", route_id, route_not_found)
                        .await?;
                    self.list::<PluginConfigRow>("WHERE route_id = $1 ORDER BY plugin, id", &[route_id])
                        .await
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
                    write::<PluginConfigRow>(&mut tx, &PluginConfigRow::insert(), &plugin)
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
                    write::<PluginConfigRow>(&mut tx, &PluginConfigRow::update(), &plugin)
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
            }
        }
    };
}

pub(crate) use impl_inbound_route_store;
