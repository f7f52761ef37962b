//! `/admin/provider-keys`: every upstream key the gateway can spend, with its reservation, and
//! the endpoints that declare reservations.
//!
//! - Database keys carry `min_role` on their row (`POST /admin/provider-keys/{key_id}/min-role`).
//! - Keys configured outside the database (YAML `api_key`/`api_keys`, environment variables through
//!   `${VAR}`) are reserved by the SHA-256 of the key (`POST /admin/provider-keys/min-role-env`),
//!   in their own table: the reservation survives the key leaving the configuration and applies
//!   again when it comes back. `free` is no reservation and deletes it.
//! - One credential configured in several places gets the strictest declaration.
//! - A reservation whose key is configured nowhere is listed with `configured: false`. A
//!   pass-through route sends the caller's own credential and has no pool: reservations do not
//!   apply to it.
//!
//! Changes reach every process through the configuration snapshot, like every other write.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::AdminCaller;
use super::error::{ApiError, Body};
use super::store;
use crate::entity::*;
use crate::gateway::Gateway;
use crate::store::StoreError;

/// One key of one pool, as the request path uses it.
#[derive(Debug, Serialize, ToSchema)]
pub struct PoolKeyView {
    /// `{model}:{location}` for a YAML route, `upstream:{id}` for a database upstream.
    pub pool: String,
    /// `config` or `database`.
    pub source: &'static str,
    /// The database key id, or `k{n}` for the n-th key of a YAML route.
    pub key: String,
    /// SHA-256 (hex) of the secret: what `min-role-env` takes.
    pub key_hash: String,
    /// Masked.
    pub hint: String,
    /// The reservation in force: the strictest declaration of this credential anywhere.
    pub min_role: Role,
    /// The models whose candidates use this key.
    pub models: Vec<String>,
    /// Out of rotation after a rejection: the status and the seconds left.
    pub quieted: Option<QuietView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QuietView {
    pub status: u16,
    pub seconds_left: f64,
}

/// A reservation by hash, and whether its key is configured anywhere right now.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReservationView {
    #[serde(flatten)]
    pub reservation: KeyReservation,
    /// `false`: recorded, not enforced until the key is configured again.
    pub configured: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProviderKeys {
    pub keys: Vec<PoolKeyView>,
    pub reservations: Vec<ReservationView>,
}

/// A database key for an upstream.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewProviderKey {
    pub upstream_id: String,
    /// Write-only.
    pub secret: String,
    #[serde(default)]
    pub lb_weight: Option<f64>,
    /// `free` (default: not reserved), `pro`, `internal` or `admin`.
    #[serde(default)]
    pub min_role: Role,
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MinRole {
    pub min_role: Role,
}

/// The key by value (hashed here, never stored) or by its SHA-256.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvKeyReservation {
    /// Write-only: the key itself.
    pub key: Option<String>,
    /// Or its SHA-256, 64 hex digits, as listed by `GET /admin/provider-keys`.
    pub key_hash: Option<String>,
    /// `free` removes the reservation.
    pub min_role: Role,
}

#[utoipa::path(get, path = "/admin/provider-keys", tag = "upstreams",
    responses((status = 200, body = ProviderKeys)))]
pub async fn list(_: AdminCaller, State(g): State<Arc<Gateway>>) -> Json<ProviderKeys> {
    let now = Instant::now();
    let table = g.table();
    let mut keys: BTreeMap<(String, String), PoolKeyView> = BTreeMap::new();
    for model in table.models() {
        for route in model.upstreams() {
            let (Some(key), Some(secret)) = (&route.key, &route.api_key) else {
                continue;
            };
            let view =
                keys.entry((key.pool.clone(), key.fingerprint.clone()))
                    .or_insert_with(|| PoolKeyView {
                        pool: key.pool.clone(),
                        source: if key.pool.starts_with("upstream:") {
                            "database"
                        } else {
                            "config"
                        },
                        key: key.label.clone(),
                        key_hash: key.fingerprint.clone(),
                        hint: mask(secret),
                        min_role: route.min_role,
                        models: Vec::new(),
                        quieted: g.routing.keys.quiet_until(&key.fingerprint, now).map(|q| {
                            QuietView {
                                status: q.status,
                                seconds_left: q.until.saturating_duration_since(now).as_secs_f64(),
                            }
                        }),
                    });
            if !view.models.contains(&model.config.id) {
                view.models.push(model.config.id.clone());
            }
        }
    }
    let configured: std::collections::HashSet<&str> =
        keys.values().map(|k| k.key_hash.as_str()).collect();
    let reservations = g
        .snapshot()
        .rows
        .key_reservations
        .iter()
        .map(|r| ReservationView {
            configured: configured.contains(r.key_hash.as_str()),
            reservation: r.clone(),
        })
        .collect();
    Json(ProviderKeys {
        keys: keys.into_values().collect(),
        reservations,
    })
}

#[utoipa::path(post, path = "/admin/provider-keys", tag = "upstreams",
    request_body = NewProviderKey,
    responses((status = 201, body = UpstreamKey), (status = 404, description = "No such upstream")))]
pub async fn create(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(new): Body<NewProviderKey>,
) -> Result<(StatusCode, Json<UpstreamKey>), ApiError> {
    let key = NewUpstreamKey {
        secret: new.secret,
        lb_weight: new.lb_weight,
        min_role: new.min_role,
        enabled: new.enabled,
    };
    let created = store(&g)?
        .config()
        .create_upstream_key(&new.upstream_id, key)
        .await?;
    Ok((StatusCode::CREATED, Json(created)))
}

#[utoipa::path(post, path = "/admin/provider-keys/{key_id}/min-role", tag = "upstreams",
    request_body = MinRole,
    params(("key_id" = String, Path, description = "Database key id")),
    responses((status = 200, body = UpstreamKey), (status = 404)))]
pub async fn set_min_role(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Path(key_id): Path<String>,
    Body(body): Body<MinRole>,
) -> Result<Json<UpstreamKey>, ApiError> {
    let store = store(&g)?;
    let config = store.config();
    let mut owner = None;
    for upstream in config.list_upstreams().await? {
        if config
            .list_upstream_keys(&upstream.id)
            .await?
            .iter()
            .any(|k| k.id == key_id)
        {
            owner = Some(upstream.id);
            break;
        }
    }
    let upstream = owner.ok_or_else(|| StoreError::NotFound {
        entity: "upstream key",
        id: key_id.clone(),
    })?;
    let patch = UpstreamKeyPatch {
        min_role: Some(body.min_role),
        ..UpstreamKeyPatch::default()
    };
    Ok(Json(
        config
            .update_upstream_key(&upstream, &key_id, patch)
            .await?,
    ))
}

#[utoipa::path(post, path = "/admin/provider-keys/min-role-env", tag = "upstreams",
    request_body = EnvKeyReservation,
    responses((status = 200, body = KeyReservation), (status = 204, description = "`free`: the reservation was removed")))]
pub async fn reserve_env_key(
    _: AdminCaller,
    State(g): State<Arc<Gateway>>,
    Body(body): Body<EnvKeyReservation>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let invalid = |field: &str, message: &str| StoreError::Invalid {
        field: field.into(),
        message: message.into(),
    };
    let (hash, hint) = match (body.key.as_deref(), body.key_hash.as_deref()) {
        (Some(key), None) if !key.trim().is_empty() => (hash_secret(key.trim()), mask(key.trim())),
        (None, Some(hash)) if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            let hash = hash.to_ascii_lowercase();
            let hint = format!("sha256:{}…", &hash[..12]);
            (hash, hint)
        }
        (None, Some(_)) => {
            return Err(invalid("key_hash", "must be 64 hexadecimal digits").into());
        }
        _ => return Err(invalid("key", "give exactly one of `key` and `key_hash`").into()),
    };
    match store(&g)?
        .config()
        .set_key_reservation(&hash, &hint, body.min_role)
        .await?
    {
        Some(reservation) => Ok(Json(reservation).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}
