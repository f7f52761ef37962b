//! The one storage interface of the configuration entities, implemented for SQLite
//! ([`super::sqlite::SqliteConfigStore`]) and PostgreSQL ([`super::postgres::PgConfigStore`]).
//!
//! Every write runs in one transaction that first bumps the `config_version` row: that serialises
//! configuration writes (so checks such as "is this path prefix taken?" cannot race), and gives the
//! change feed its version. Reads of single entities go straight to the pool; the request path
//! reads nothing from here per request, it uses a [`Snapshot`] instead.

use async_trait::async_trait;
use tokio::sync::watch;

use super::StoreError;
use super::model::*;
use super::snapshot::Snapshot;

/// Configuration storage. Ids in paths that do not exist are [`StoreError::NotFound`]; bad input is
/// [`StoreError::Invalid`] naming the field; uniqueness clashes are [`StoreError::Conflict`].
#[async_trait]
pub trait ConfigStore:
    super::routewise_settings::RouteWiseSettingsStore + Send + Sync + 'static
{
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;

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
    ) -> Result<std::collections::BTreeMap<String, serde_json::Value>, StoreError>;

    async fn list_consumers(&self) -> Result<Vec<Consumer>, StoreError>;
    async fn get_consumer(&self, id: &str) -> Result<Consumer, StoreError>;
    async fn create_consumer(&self, new: NewConsumer) -> Result<Consumer, StoreError>;
    async fn update_consumer(&self, id: &str, patch: ConsumerPatch)
    -> Result<Consumer, StoreError>;
    /// Also deletes the consumer's keys.
    async fn delete_consumer(&self, id: &str) -> Result<(), StoreError>;

    async fn list_consumer_keys(&self, consumer_id: &str) -> Result<Vec<ConsumerKey>, StoreError>;
    async fn get_consumer_key(
        &self,
        consumer_id: &str,
        id: &str,
    ) -> Result<ConsumerKey, StoreError>;
    /// Generates the secret; the result is the only place it is ever shown.
    async fn create_consumer_key(
        &self,
        consumer_id: &str,
        new: NewConsumerKey,
    ) -> Result<CreatedConsumerKey, StoreError>;
    async fn update_consumer_key(
        &self,
        consumer_id: &str,
        id: &str,
        patch: ConsumerKeyPatch,
    ) -> Result<ConsumerKey, StoreError>;
    async fn delete_consumer_key(&self, consumer_id: &str, id: &str) -> Result<(), StoreError>;
    /// The key whose secret is `secret`, and its consumer, whatever their state (the caller decides
    /// what revoked, expired or disabled means for it). One indexed lookup by hash.
    async fn find_consumer_key(
        &self,
        secret: &str,
    ) -> Result<Option<(Consumer, ConsumerKey)>, StoreError>;

    async fn list_providers(&self) -> Result<Vec<Provider>, StoreError>;
    async fn get_provider(&self, id: &str) -> Result<Provider, StoreError>;
    async fn create_provider(&self, new: NewProvider) -> Result<Provider, StoreError>;
    async fn update_provider(&self, id: &str, patch: ProviderPatch)
    -> Result<Provider, StoreError>;
    /// A provider that still has upstreams is a [`StoreError::Conflict`].
    async fn delete_provider(&self, id: &str) -> Result<(), StoreError>;

    async fn list_upstreams(&self) -> Result<Vec<Upstream>, StoreError>;
    async fn get_upstream(&self, id: &str) -> Result<Upstream, StoreError>;
    async fn create_upstream(&self, new: NewUpstream) -> Result<Upstream, StoreError>;
    async fn update_upstream(&self, id: &str, patch: UpstreamPatch)
    -> Result<Upstream, StoreError>;
    /// Also deletes the upstream's keys and model mappings.
    async fn delete_upstream(&self, id: &str) -> Result<(), StoreError>;

    async fn list_upstream_keys(&self, upstream_id: &str) -> Result<Vec<UpstreamKey>, StoreError>;
    async fn get_upstream_key(
        &self,
        upstream_id: &str,
        id: &str,
    ) -> Result<UpstreamKey, StoreError>;
    async fn create_upstream_key(
        &self,
        upstream_id: &str,
        new: NewUpstreamKey,
    ) -> Result<UpstreamKey, StoreError>;
    async fn update_upstream_key(
        &self,
        upstream_id: &str,
        id: &str,
        patch: UpstreamKeyPatch,
    ) -> Result<UpstreamKey, StoreError>;
    async fn delete_upstream_key(&self, upstream_id: &str, id: &str) -> Result<(), StoreError>;

    async fn list_upstream_models(&self) -> Result<Vec<UpstreamModel>, StoreError>;
    async fn get_upstream_model(&self, id: &str) -> Result<UpstreamModel, StoreError>;
    async fn create_upstream_model(
        &self,
        new: NewUpstreamModel,
    ) -> Result<UpstreamModel, StoreError>;
    async fn update_upstream_model(
        &self,
        id: &str,
        patch: UpstreamModelPatch,
    ) -> Result<UpstreamModel, StoreError>;
    async fn delete_upstream_model(&self, id: &str) -> Result<(), StoreError>;

    /// The configuration version: bumped by every write, by any process sharing the database.
    /// Reservations of keys configured outside the database, by hash.
    async fn list_key_reservations(&self) -> Result<Vec<KeyReservation>, StoreError>;
    /// Sets the reservation of the key with this hash; `free` removes it (free is no
    /// reservation). Returns the stored reservation, if any.
    async fn set_key_reservation(
        &self,
        key_hash: &str,
        hint: &str,
        min_role: Role,
    ) -> Result<Option<KeyReservation>, StoreError>;

    async fn version(&self) -> Result<i64, StoreError>;

    /// The latest configuration version this process knows of. It moves at once for writes made
    /// through this store, and within about half a second (SQLite: polling) or at once
    /// (PostgreSQL: LISTEN/NOTIFY) for writes made by other processes. The feed starts on the
    /// first call; it never goes backwards.
    fn watch(&self) -> watch::Receiver<i64>;

    /// Everything, read in one consistent transaction.
    async fn load_snapshot(&self) -> Result<Snapshot, StoreError>;
}
