//! Consumers (`consumers`) and their API keys (`consumer_api_keys`): the tables, and the
//! [`ConsumerStore`] part of [`super::ConfigStore`].

use async_trait::async_trait;

use super::StoreError;
use super::table::{Json, Word, not_found, table};
use crate::entity::{
    Consumer, ConsumerKey, ConsumerKeyPatch, ConsumerPatch, CreatedConsumerKey, NewConsumer,
    NewConsumerKey,
};

table! {
    /// A `consumers` row.
    ConsumerRow: Consumer = "consumers" {
        id: String,
        name: String,
        groups: String = Json,
        role: String = Word,
        disabled: bool,
        created_at: i64,
        updated_at: i64,
    }
}

table! {
    /// A `consumer_api_keys` row.
    ConsumerKeyRow: ConsumerKey = "consumer_api_keys" {
        id: String,
        consumer_id: String,
        key_hash: String,
        prefix: String,
        groups: String = Json,
        expires_at: Option<i64>,
        revoked_at: Option<i64>,
        created_at: i64,
        updated_at: i64,
    }
}

/// Consumers and their keys; part of every [`super::ConfigStore`].
#[async_trait]
pub trait ConsumerStore: Send + Sync {
    async fn list_consumers(&self) -> Result<Vec<Consumer>, StoreError>;
    async fn get_consumer(&self, id: &str) -> Result<Consumer, StoreError>;
    async fn create_consumer(&self, new: NewConsumer) -> Result<Consumer, StoreError>;
    async fn update_consumer(&self, id: &str, patch: ConsumerPatch)
    -> Result<Consumer, StoreError>;
    /// Also deletes the consumer's keys and budgets.
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
}

pub(crate) fn consumer_not_found(id: &str) -> StoreError {
    not_found("consumer", id)
}

pub(crate) fn consumer_key_not_found(id: &str) -> StoreError {
    not_found("consumer key", id)
}

/// Implements [`ConsumerStore`] for `$store` over `$db`, inside `impl_config_store!` (whose
/// helpers it uses).
macro_rules! impl_consumer_store {
    ($store:ty, $db:ty) => {
        mod consumers {
            use super::*;
            use $crate::entity::{
                Consumer, ConsumerKey, ConsumerKeyPatch, ConsumerPatch, CreatedConsumerKey,
                NewConsumer, NewConsumerKey, generate_id, hash_secret, now,
            };
            use $crate::store::consumers::*;
            use $crate::store::table::{name_conflict, unique_or};

            impl $store {
                async fn consumer_in(
                    &self,
                    conn: &mut Conn,
                    id: &str,
                ) -> Result<Consumer, StoreError> {
                    self.find::<ConsumerRow>(conn, "WHERE id = $1", &[id])
                        .await?
                        .ok_or_else(|| consumer_not_found(id))
                }

                async fn consumer_key_in(
                    &self,
                    conn: &mut Conn,
                    consumer_id: &str,
                    id: &str,
                ) -> Result<ConsumerKey, StoreError> {
                    self.find::<ConsumerKeyRow>(
                        conn,
                        "WHERE id = $1 AND consumer_id = $2",
                        &[id, consumer_id],
                    )
                    .await?
                    .ok_or_else(|| consumer_key_not_found(id))
                }
            }

            #[async_trait::async_trait]
            impl ConsumerStore for $store {
                async fn list_consumers(&self) -> Result<Vec<Consumer>, StoreError> {
                    self.list::<ConsumerRow>("ORDER BY created_at, id", &[])
                        .await
                }

                async fn get_consumer(&self, id: &str) -> Result<Consumer, StoreError> {
                    self.consumer_in(&mut *self.conn().await?, id).await
                }

                async fn create_consumer(&self, new: NewConsumer) -> Result<Consumer, StoreError> {
                    let consumer = new.into_consumer(generate_id("cs"), now())?;
                    let (mut tx, version) = self.begin_write().await?;
                    write::<ConsumerRow>(&mut tx, &ConsumerRow::insert(), &consumer)
                        .await
                        .map_err(|e| {
                            unique_or(BACKEND, e, || name_conflict("consumer", &consumer.name))
                        })?;
                    self.commit(tx, version).await?;
                    Ok(consumer)
                }

                async fn update_consumer(
                    &self,
                    id: &str,
                    patch: ConsumerPatch,
                ) -> Result<Consumer, StoreError> {
                    let (mut tx, version) = self.begin_write().await?;
                    let mut consumer = self.consumer_in(&mut tx, id).await?;
                    patch.apply(&mut consumer, now())?;
                    write::<ConsumerRow>(&mut tx, &ConsumerRow::update(), &consumer)
                        .await
                        .map_err(|e| {
                            unique_or(BACKEND, e, || name_conflict("consumer", &consumer.name))
                        })?;
                    self.commit(tx, version).await?;
                    Ok(consumer)
                }

                async fn delete_consumer(&self, id: &str) -> Result<(), StoreError> {
                    let (mut tx, version) = self.begin_write().await?;
                    delete_row(
                        &mut tx,
                        "DELETE FROM consumer_api_keys WHERE consumer_id = $1",
                        &[id],
                    )
                    .await
                    .map_err(|e| self.db_error(e))?;
                    delete_row(
                        &mut tx,
                        "DELETE FROM budgets WHERE scope = 'consumer' AND subject = $1",
                        &[id],
                    )
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

                async fn list_consumer_keys(
                    &self,
                    consumer_id: &str,
                ) -> Result<Vec<ConsumerKey>, StoreError> {
                    self.require_parent(
                        &mut *self.conn().await?,
                        "consumers",
                        consumer_id,
                        consumer_not_found,
                    )
                    .await?;
                    self.list::<ConsumerKeyRow>(
                        "WHERE consumer_id = $1 ORDER BY created_at, id",
                        &[consumer_id],
                    )
                    .await
                }

                async fn get_consumer_key(
                    &self,
                    consumer_id: &str,
                    id: &str,
                ) -> Result<ConsumerKey, StoreError> {
                    let mut conn = self.conn().await?;
                    self.require_parent(&mut conn, "consumers", consumer_id, consumer_not_found)
                        .await?;
                    self.consumer_key_in(&mut conn, consumer_id, id).await
                }

                async fn create_consumer_key(
                    &self,
                    consumer_id: &str,
                    new: NewConsumerKey,
                ) -> Result<CreatedConsumerKey, StoreError> {
                    let (key, secret) =
                        new.into_key(generate_id("ck"), consumer_id.to_owned(), now())?;
                    let (mut tx, version) = self.begin_write().await?;
                    self.require_parent(&mut tx, "consumers", consumer_id, consumer_not_found)
                        .await?;
                    write::<ConsumerKeyRow>(&mut tx, &ConsumerKeyRow::insert(), &key)
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
                    self.require_parent(&mut tx, "consumers", consumer_id, consumer_not_found)
                        .await?;
                    let mut key = self.consumer_key_in(&mut tx, consumer_id, id).await?;
                    patch.apply(&mut key, now())?;
                    write::<ConsumerKeyRow>(&mut tx, &ConsumerKeyRow::update(), &key)
                        .await
                        .map_err(|e| self.db_error(e))?;
                    self.commit(tx, version).await?;
                    Ok(key)
                }

                async fn delete_consumer_key(
                    &self,
                    consumer_id: &str,
                    id: &str,
                ) -> Result<(), StoreError> {
                    let (mut tx, version) = self.begin_write().await?;
                    self.require_parent(&mut tx, "consumers", consumer_id, consumer_not_found)
                        .await?;
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
                    let Some(key) = self
                        .find::<ConsumerKeyRow>(
                            &mut conn,
                            "WHERE key_hash = $1",
                            &[&hash_secret(secret)],
                        )
                        .await?
                    else {
                        return Ok(None);
                    };
                    let consumer = self.consumer_in(&mut conn, &key.consumer_id).await?;
                    Ok(Some((consumer, key)))
                }
            }
        }
    };
}

pub(crate) use impl_consumer_store;
