//! The provider side: providers (`providers`), their upstreams (`upstreams`), the upstreams' keys
//! (`upstream_api_keys`) and model mappings (`upstream_models`), and reservations of keys
//! configured outside the database (`key_reservations`): the tables, and the [`UpstreamStore`]
//! part of [`super::ConfigStore`].

use async_trait::async_trait;

use super::StoreError;
use super::table::{Codec, Json, NullableJson, Word, conflict, not_found, table};
use crate::entity::{
    KeyReservation, NewProvider, NewUpstream, NewUpstreamKey, NewUpstreamModel, Provider,
    ProviderPatch, Role, Secret, Upstream, UpstreamKey, UpstreamKeyPatch, UpstreamModel,
    UpstreamModelPatch, UpstreamPatch,
};

table! {
    /// A `providers` row.
    ProviderRow: Provider = "providers" {
        id: String,
        name: String,
        protocol: String = Word,
        default_capabilities: String = Json,
        created_at: i64,
        updated_at: i64,
    }
}

table! {
    /// An `upstreams` row.
    UpstreamRow: Upstream = "upstreams" {
        id: String,
        provider_id: String,
        base_url: String,
        group_name as group: String,
        priority: i64,
        lb_weight: f64,
        capabilities: Option<String> = NullableJson,
        enabled: bool,
        first_token_timeout_seconds: Option<f64>,
        idle_timeout_seconds: Option<f64>,
        stream_timeout_seconds: Option<f64>,
        created_at: i64,
        updated_at: i64,
    }
}

table! {
    /// An `upstream_api_keys` row.
    UpstreamKeyRow: UpstreamKey = "upstream_api_keys" {
        id: String,
        upstream_id: String,
        secret: String = SecretText,
        lb_weight: Option<f64>,
        min_role: String = Word,
        enabled: bool,
        created_at: i64,
        updated_at: i64,
    }
}

table! {
    /// An `upstream_models` row.
    UpstreamModelRow: UpstreamModel = "upstream_models" {
        id: String,
        model: String,
        upstream_id: String,
        provider_model_id: String,
        created_at: i64,
        updated_at: i64,
    }
}

table! {
    /// A `key_reservations` row.
    KeyReservationRow: KeyReservation = "key_reservations" {
        key_hash: String,
        hint: String,
        min_role: String = Word,
        created_at: i64,
        updated_at: i64,
    }
}

/// An upstream key is stored as it is: it is sent upstream.
pub(crate) struct SecretText;

impl Codec<Secret> for SecretText {
    type Stored = String;

    fn encode(secret: &Secret) -> String {
        secret.expose().to_owned()
    }

    fn decode(stored: String) -> Result<Secret, String> {
        Ok(Secret::new(stored))
    }
}

/// Providers, upstreams, upstream keys and models, key reservations; part of every
/// [`super::ConfigStore`].
#[async_trait]
pub trait UpstreamStore: Send + Sync {
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

pub(crate) fn mapping_conflict(m: &UpstreamModel) -> StoreError {
    conflict(
        "model",
        format!(
            "model: `{}` is already mapped to upstream `{}`",
            m.model, m.upstream_id
        ),
    )
}

/// Implements [`UpstreamStore`] for `$store` over `$db`, inside `impl_config_store!` (whose
/// helpers it uses).
macro_rules! impl_upstream_store {
    ($store:ty, $db:ty) => {
        mod upstreams {
            use super::*;
            use $crate::entity::{
                KeyReservation, NewProvider, NewUpstream, NewUpstreamKey, NewUpstreamModel,
                Provider, ProviderPatch, Role, Upstream, UpstreamKey, UpstreamKeyPatch,
                UpstreamModel, UpstreamModelPatch, UpstreamPatch, generate_id, now,
            };
            use $crate::store::table::{name_conflict, unique_or};
            use $crate::store::upstreams::*;

            impl $store {
                async fn provider_in(&self, conn: &mut Conn, id: &str) -> Result<Provider, StoreError> {
                    self.find::<ProviderRow>(conn, "WHERE id = $1", &[id])
                        .await?
                        .ok_or_else(|| provider_not_found(id))
                }

                async fn upstream_in(&self, conn: &mut Conn, id: &str) -> Result<Upstream, StoreError> {
                    self.find::<UpstreamRow>(conn, "WHERE id = $1", &[id])
                        .await?
                        .ok_or_else(|| upstream_not_found(id))
                }

                async fn upstream_key_in(
                    &self,
                    conn: &mut Conn,
                    upstream_id: &str,
                    id: &str,
                ) -> Result<UpstreamKey, StoreError> {
                    self.find::<UpstreamKeyRow>(conn, "WHERE id = $1 AND upstream_id = $2", &[id, upstream_id])
                        .await?
                        .ok_or_else(|| upstream_key_not_found(id))
                }

                async fn upstream_model_in(
                    &self,
                    conn: &mut Conn,
                    id: &str,
                ) -> Result<UpstreamModel, StoreError> {
                    self.find::<UpstreamModelRow>(conn, "WHERE id = $1", &[id])
                        .await?
                        .ok_or_else(|| upstream_model_not_found(id))
                }
            }

            #[async_trait::async_trait]
            impl UpstreamStore for $store {
                // ---- providers ----

                async fn list_providers(&self) -> Result<Vec<Provider>, StoreError> {
                    self.list::<ProviderRow>("ORDER BY created_at, id", &[]).await
                }

                async fn get_provider(&self, id: &str) -> Result<Provider, StoreError> {
                    self.provider_in(&mut *self.conn().await?, id).await
                }

                async fn create_provider(&self, new: NewProvider) -> Result<Provider, StoreError> {
                    let provider = new.into_provider(generate_id("pv"), now())?;
                    let (mut tx, version) = self.begin_write().await?;
                    write::<ProviderRow>(&mut tx, &ProviderRow::insert(), &provider)
                        .await
                        .map_err(|e| unique_or(BACKEND, e, || name_conflict("provider", &provider.name)))?;
                    self.commit(tx, version).await?;
                    Ok(provider)
                }

                async fn update_provider(&self, id: &str, patch: ProviderPatch) -> Result<Provider, StoreError> {
                    let (mut tx, version) = self.begin_write().await?;
                    let mut provider = self.provider_in(&mut tx, id).await?;
                    patch.apply(&mut provider, now())?;
                    write::<ProviderRow>(&mut tx, &ProviderRow::update(), &provider)
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
                    self.list::<UpstreamRow>("ORDER BY created_at, id", &[]).await
                }

                async fn get_upstream(&self, id: &str) -> Result<Upstream, StoreError> {
                    self.upstream_in(&mut *self.conn().await?, id).await
                }

                async fn create_upstream(&self, new: NewUpstream) -> Result<Upstream, StoreError> {
                    let upstream = new.into_upstream(generate_id("up"), now())?;
                    let (mut tx, version) = self.begin_write().await?;
                    self.require_ref(&mut tx, "providers", "provider_id", "provider", &upstream.provider_id)
                        .await?;
                    write::<UpstreamRow>(&mut tx, &UpstreamRow::insert(), &upstream)
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
                    write::<UpstreamRow>(&mut tx, &UpstreamRow::update(), &upstream)
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
                    self.list::<UpstreamKeyRow>("WHERE upstream_id = $1 ORDER BY created_at, id", &[upstream_id])
                        .await
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
                    write::<UpstreamKeyRow>(&mut tx, &UpstreamKeyRow::insert(), &key)
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
                    write::<UpstreamKeyRow>(&mut tx, &UpstreamKeyRow::update(), &key)
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
                    self.list::<UpstreamModelRow>("ORDER BY model, created_at, id", &[]).await
                }

                async fn get_upstream_model(&self, id: &str) -> Result<UpstreamModel, StoreError> {
                    self.upstream_model_in(&mut *self.conn().await?, id).await
                }

                async fn create_upstream_model(&self, new: NewUpstreamModel) -> Result<UpstreamModel, StoreError> {
                    let model = new.into_model(generate_id("um"), now())?;
                    let (mut tx, version) = self.begin_write().await?;
                    self.require_ref(&mut tx, "upstreams", "upstream_id", "upstream", &model.upstream_id)
                        .await?;
                    write::<UpstreamModelRow>(&mut tx, &UpstreamModelRow::insert(), &model)
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
                    write::<UpstreamModelRow>(&mut tx, &UpstreamModelRow::update(), &model)
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
                    self.list::<KeyReservationRow>("ORDER BY created_at, key_hash", &[]).await
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
                        delete_row(&mut tx, "DELETE FROM key_reservations WHERE key_hash = $1", &[key_hash])
                            .await
                            .map_err(err)?;
                        self.commit(tx, version).await?;
                        return Ok(None);
                    }
                    let now = now();
                    let reservation = KeyReservation {
                        key_hash: key_hash.to_owned(),
                        hint: hint.to_owned(),
                        min_role,
                        created_at: now,
                        updated_at: now,
                    };
                    // An existing reservation keeps its creation time; `updated_at` moves.
                    let upsert = format!(
                        "{} ON CONFLICT (key_hash) DO UPDATE SET hint = excluded.hint, \
                         min_role = excluded.min_role, updated_at = excluded.updated_at",
                        KeyReservationRow::insert()
                    );
                    write::<KeyReservationRow>(&mut tx, &upsert, &reservation)
                        .await
                        .map_err(err)?;
                    let stored = self
                        .find::<KeyReservationRow>(&mut tx, "WHERE key_hash = $1", &[key_hash])
                        .await?;
                    self.commit(tx, version).await?;
                    Ok(stored)
                }
            }
        }
    };
}

pub(crate) use impl_upstream_store;
