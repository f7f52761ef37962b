//! RouteWise settings set at run time (`/admin/routewise/*`): a global fallback layer and per-model
//! overrides of `router_params` keys, stored as JSON values in `routewise_settings` and
//! `routewise_model_settings` (migration 0004).
//!
//! The store only keeps rows; what a value may be is the strategy's business (the admin API
//! validates against its params schema before writing, and the gateway again before applying, see
//! `routewise`). Writes go through the same versioned write transaction as every other
//! configuration write, so every process sharing the database reloads them, and the rows are part
//! of the [`Snapshot`].

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::store::Snapshot;
use crate::store::StoreError;

/// One stored value: of the global layer when `model_id` is `None`, else an override of that
/// (canonical) model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteWiseSetting {
    pub model_id: Option<String>,
    pub key: String,
    pub value: Value,
    /// Unix seconds.
    pub updated_at: i64,
}

/// A change to one layer: `Some(value)` sets the key, `None` removes it.
pub type SettingChanges = Vec<(String, Option<Value>)>;

/// Storage of the RouteWise settings; part of every [`super::ConfigStore`].
#[async_trait]
pub trait RouteWiseSettingsStore: Send + Sync {
    /// Every row of both layers: the global layer first, then by model and key.
    async fn list_routewise_settings(&self) -> Result<Vec<RouteWiseSetting>, StoreError>;

    /// Applies `changes` to the global layer (`model_id` `None`) or to one model's overrides, in
    /// one transaction. Returns whether a row changed; when none did (removing keys that are not
    /// set) nothing is written and the configuration version does not move.
    async fn write_routewise_settings(
        &self,
        model_id: Option<&str>,
        changes: SettingChanges,
    ) -> Result<bool, StoreError>;
}

impl Snapshot {
    /// The global layer.
    pub fn routewise_global(&self) -> BTreeMap<&str, &Value> {
        self.rows
            .routewise_settings
            .iter()
            .filter(|s| s.model_id.is_none())
            .map(|s| (s.key.as_str(), &s.value))
            .collect()
    }

    /// The overrides of the canonical model `model_id`.
    pub fn routewise_model(&self, model_id: &str) -> BTreeMap<&str, &Value> {
        self.rows
            .routewise_settings
            .iter()
            .filter(|s| s.model_id.as_deref() == Some(model_id))
            .map(|s| (s.key.as_str(), &s.value))
            .collect()
    }
}

pub(crate) fn decode(
    model_id: Option<String>,
    key: String,
    value: &str,
    updated_at: i64,
) -> Result<RouteWiseSetting, StoreError> {
    let value = serde_json::from_str(value).map_err(|e| StoreError::Corrupt {
        table: if model_id.is_some() {
            "routewise_model_settings"
        } else {
            "routewise_settings"
        },
        id: match &model_id {
            Some(m) => format!("{m}/{key}"),
            None => key.clone(),
        },
        message: format!("value: {e}"),
    })?;
    Ok(RouteWiseSetting {
        model_id,
        key,
        value,
        updated_at,
    })
}

/// Implements [`RouteWiseSettingsStore`] for `$store` over `$db`, inside `impl_config_store!`
/// (whose `Conn` alias and backend helpers it uses).
macro_rules! impl_routewise_settings_store {
    ($store:ty, $db:ty) => {
        impl $store {
            /// Both layers, read on `conn` (the snapshot's transaction).
            async fn routewise_rows(
                &self,
                conn: &mut Conn,
            ) -> Result<
                Vec<$crate::routewise::store::RouteWiseSetting>,
                $crate::store::StoreError,
            > {
                let err = |e: sqlx::Error| self.db_error(e);
                let global: Vec<(String, String, i64)> = sqlx::query_as::<$db, (String, String, i64)>(
                    "SELECT param, value, updated_at FROM routewise_settings ORDER BY param",
                )
                .fetch_all(&mut *conn)
                .await
                .map_err(err)?;
                let models: Vec<(String, String, String, i64)> =
                    sqlx::query_as::<$db, (String, String, String, i64)>(
                        "SELECT model_id, param, value, updated_at FROM routewise_model_settings ORDER BY model_id, param",
                    )
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(err)?;
                let mut rows = Vec::with_capacity(global.len() + models.len());
                for (key, value, at) in global {
                    rows.push($crate::routewise::store::decode(None, key, &value, at)?);
                }
                for (model, key, value, at) in models {
                    rows.push($crate::routewise::store::decode(
                        Some(model),
                        key,
                        &value,
                        at,
                    )?);
                }
                Ok(rows)
            }
        }

        #[async_trait::async_trait]
        impl $crate::routewise::store::RouteWiseSettingsStore for $store {
            async fn list_routewise_settings(
                &self,
            ) -> Result<
                Vec<$crate::routewise::store::RouteWiseSetting>,
                $crate::store::StoreError,
            > {
                let mut conn = self.pool.acquire().await.map_err(|e| self.db_error(e))?;
                self.routewise_rows(&mut conn).await
            }

            async fn write_routewise_settings(
                &self,
                model_id: Option<&str>,
                changes: $crate::routewise::store::SettingChanges,
            ) -> Result<bool, $crate::store::StoreError> {
                let (mut tx, version) = self.begin_write().await?;
                let err = |e: sqlx::Error| self.db_error(e);
                let at = $crate::entity::now();
                let mut changed = false;
                for (key, value) in changes {
                    let done = match (model_id, value) {
                        (None, Some(value)) => sqlx::query::<$db>(
                            "INSERT INTO routewise_settings (param, value, updated_at) VALUES ($1, $2, $3) \
                             ON CONFLICT (param) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                        )
                        .bind(&key)
                        .bind(value.to_string())
                        .bind(at)
                        .execute(&mut *tx)
                        .await,
                        (None, None) => sqlx::query::<$db>("DELETE FROM routewise_settings WHERE param = $1")
                            .bind(&key)
                            .execute(&mut *tx)
                            .await,
                        (Some(model), Some(value)) => sqlx::query::<$db>(
                            "INSERT INTO routewise_model_settings (model_id, param, value, updated_at) VALUES ($1, $2, $3, $4) \
                             ON CONFLICT (model_id, param) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                        )
                        .bind(model)
                        .bind(&key)
                        .bind(value.to_string())
                        .bind(at)
                        .execute(&mut *tx)
                        .await,
                        (Some(model), None) => sqlx::query::<$db>(
                            "DELETE FROM routewise_model_settings WHERE model_id = $1 AND param = $2",
                        )
                        .bind(model)
                        .bind(&key)
                        .execute(&mut *tx)
                        .await,
                    };
                    changed |= done.map_err(err)?.rows_affected() > 0;
                }
                if !changed {
                    // Dropping the transaction rolls the version bump back.
                    return Ok(false);
                }
                tx.commit().await.map_err(err)?;
                self.committed(version);
                Ok(true)
            }
        }
    };
}

pub(crate) use impl_routewise_settings_store;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::store::tests::TestDb;

    async fn layers_round_trip_and_version(db: &TestDb) {
        let store = db.store.config();
        let v0 = store.version().await.unwrap();
        let changed = store
            .write_routewise_settings(
                None,
                vec![
                    ("budget_alpha".into(), Some(json!(0.25))),
                    ("fallback_mode".into(), Some(json!("strict"))),
                ],
            )
            .await
            .unwrap();
        assert!(changed);
        let v1 = store.version().await.unwrap();
        assert!(v1 > v0);
        // Model ids may contain `/`; values keep their JSON type.
        store
            .write_routewise_settings(
                Some("org/model"),
                vec![("budget_alpha".into(), Some(json!(0.9)))],
            )
            .await
            .unwrap();
        store
            .write_routewise_settings(
                Some("org/model"),
                vec![("budget_alpha".into(), Some(json!(1)))],
            )
            .await
            .unwrap();
        let rows = store.list_routewise_settings().await.unwrap();
        let summary: Vec<(Option<&str>, &str, &serde_json::Value)> = rows
            .iter()
            .map(|r| (r.model_id.as_deref(), r.key.as_str(), &r.value))
            .collect();
        assert_eq!(
            summary,
            vec![
                (None, "budget_alpha", &json!(0.25)),
                (None, "fallback_mode", &json!("strict")),
                (Some("org/model"), "budget_alpha", &json!(1)),
            ]
        );

        // Removing what is not there changes nothing, not even the version.
        let before = store.version().await.unwrap();
        let changed = store
            .write_routewise_settings(Some("org/model"), vec![("random_seed".into(), None)])
            .await
            .unwrap();
        assert!(!changed);
        assert_eq!(store.version().await.unwrap(), before);

        let changed = store
            .write_routewise_settings(
                None,
                vec![("fallback_mode".into(), None), ("nope".into(), None)],
            )
            .await
            .unwrap();
        assert!(changed);
        let snapshot = store.load_snapshot().await.unwrap();
        assert_eq!(snapshot.version, store.version().await.unwrap());
        assert_eq!(
            snapshot.routewise_global().into_iter().collect::<Vec<_>>(),
            vec![("budget_alpha", &json!(0.25))]
        );
        assert_eq!(
            snapshot
                .routewise_model("org/model")
                .into_iter()
                .collect::<Vec<_>>(),
            vec![("budget_alpha", &json!(1))]
        );
        assert!(snapshot.routewise_model("org").is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_layers_round_trip_and_version() {
        layers_round_trip_and_version(&TestDb::sqlite().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_layers_round_trip_and_version() {
        layers_round_trip_and_version(&TestDb::postgres().await).await;
    }
}
