//! Operator endpoints: admin authentication, runtime weight changes, and the routing and deep
//! health views.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::gateway::Gateway;
use crate::routing::health::CircuitState;
use crate::strategy::CatalogEntry;

/// Whether the request carries the admin bearer token. Compared as SHA-256 digests, so the time
/// taken does not depend on how much of the token matched.
pub fn is_admin(gateway: &Gateway, headers: &HeaderMap) -> bool {
    let Some(expected) = gateway.config.server.admin_token.as_deref() else {
        return false;
    };
    let Some(given) = bearer(headers) else {
        return false;
    };
    super::auth::digest_eq(
        &Sha256::digest(expected.as_bytes()),
        &Sha256::digest(given.as_bytes()),
    )
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Why a caller may not use an admin endpoint.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub enum AdminDenied {
    /// No admin token is configured, so admin endpoints are off.
    #[error(
        "admin endpoints are disabled: set server.admin_token in the config or the SWITCHYARD_ADMIN_TOKEN environment variable"
    )]
    NotConfigured,
    /// The caller did not present the admin token.
    #[error("admin endpoints need `Authorization: Bearer <admin token>`")]
    Unauthorized,
}

impl IntoResponse for AdminDenied {
    fn into_response(self) -> Response {
        let status = match self {
            AdminDenied::NotConfigured => StatusCode::FORBIDDEN,
            AdminDenied::Unauthorized => StatusCode::UNAUTHORIZED,
        };
        (
            status,
            Json(serde_json::json!({
                "error": { "message": self.to_string(), "type": "authentication_error", "param": null, "code": status.as_u16() }
            })),
        )
            .into_response()
    }
}

/// Ok when the caller is an admin.
pub fn require_admin(gateway: &Gateway, headers: &HeaderMap) -> Result<(), AdminDenied> {
    if gateway.config.server.admin_token.is_none() {
        return Err(AdminDenied::NotConfigured);
    }
    if is_admin(gateway, headers) {
        Ok(())
    } else {
        Err(AdminDenied::Unauthorized)
    }
}

pub async fn get_weights(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(denied) = require_admin(&gateway, &headers) {
        return denied.into_response();
    }
    Json(gateway.overrides()).into_response()
}

/// `PUT /admin/routing/weights`: replaces one model's overrides. `{"model": id-or-alias,
/// "weights": {endpoint_id: weight}}`; an empty map clears them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsUpdate {
    pub model: String,
    pub weights: BTreeMap<String, f64>,
}

pub async fn put_weights(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(denied) = require_admin(&gateway, &headers) {
        return denied.into_response();
    }
    let update: WeightsUpdate = match serde_json::from_slice(&body) {
        Ok(u) => u,
        Err(e) => return unprocessable(format!("invalid body: {e}")),
    };
    let table = gateway.table();
    let Some(model) = table.resolve(&update.model) else {
        return unprocessable(format!("model: unknown model `{}`", update.model));
    };
    for (endpoint, weight) in &update.weights {
        if !model.routes().iter().any(|r| &r.endpoint_id == endpoint) {
            let known: Vec<&str> = model
                .routes()
                .iter()
                .map(|r| r.endpoint_id.as_str())
                .collect();
            return unprocessable(format!(
                "weights.{endpoint}: not an endpoint of model `{}`; its endpoints: {}",
                model.id(),
                known.join(", ")
            ));
        }
        if !weight.is_finite() || *weight < 0.0 {
            return unprocessable(format!(
                "weights.{endpoint}: must be a number >= 0, got {weight}"
            ));
        }
    }
    // Aliases share the canonical model's overrides.
    let canonical = model.id().to_owned();
    drop(table);
    gateway
        .update_overrides(|o| {
            if update.weights.is_empty() {
                o.weights.remove(&canonical);
            } else {
                o.weights.insert(canonical, update.weights);
            }
        })
        .await;
    Json(gateway.overrides()).into_response()
}

fn unprocessable(message: String) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Json(serde_json::json!({
            "error": { "message": message, "type": "invalid_request_error", "param": null, "code": "validation_failed" }
        })),
    )
        .into_response()
}

/// `POST /admin/routing/providers/{endpoint_or_provider}/disable|enable`.
pub async fn set_provider(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path((target, action)): Path<(String, String)>,
) -> Response {
    if let Err(denied) = require_admin(&gateway, &headers) {
        return denied.into_response();
    }
    let known = gateway.table().models().any(|m| {
        m.routes()
            .iter()
            .any(|r| r.endpoint_id == target || r.kind.as_str() == target)
    });
    if !known {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({
                "error": { "message": format!("no endpoint id or provider kind `{target}` is routed to"), "type": "invalid_request_error", "param": null, "code": "not_found" }
            })),
        )
            .into_response();
    }
    match action.as_str() {
        "disable" => {
            gateway
                .update_overrides(|o| {
                    o.disabled.insert(target);
                })
                .await
        }
        "enable" => {
            gateway
                .update_overrides(|o| {
                    o.disabled.remove(&target);
                })
                .await
        }
        _ => return StatusCode::NOT_FOUND.into_response(),
    }
    Json(gateway.overrides()).into_response()
}

/// `GET /routing`: every published model's effective weights and where each route stands.
pub async fn routing(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if !gateway.config.routing.public_routing_endpoint
        && let Err(denied) = require_admin(&gateway, &headers)
    {
        return denied.into_response();
    }
    let table = gateway.table();
    let now = std::time::Instant::now();
    let mut models = Vec::new();
    for m in table.models().filter(|m| m.config.published) {
        let total: f64 = m
            .routes()
            .iter()
            .filter(|r| gateway.routing.health.admits(&r.endpoint_id, now).is_some())
            .map(|r| r.weight)
            .sum();
        let routes: Vec<_> = m
            .routes()
            .iter()
            .map(|r| {
                let circuit = gateway.routing.health.circuit(&r.endpoint_id, now);
                let share = if total > 0.0 && circuit != CircuitState::Open {
                    r.weight / total
                } else {
                    0.0
                };
                serde_json::json!({
                    "endpoint_id": r.endpoint_id,
                    "provider": r.kind.as_str(),
                    "base_url": r.base_url,
                    "provider_model_id": r.provider_model_id,
                    "declared_weight": r.declared_weight,
                    "weight": r.weight,
                    "share": share,
                    "weight_note": r.weight_note,
                    "priority": r.priority,
                    "local_deployment": r.local_deployment,
                    "input_modalities": r.input_modalities,
                    "circuit": circuit,
                    "availability": gateway.routing.health.availability(&r.endpoint_id),
                })
            })
            .collect();
        models.push(serde_json::json!({
            "id": m.id(),
            "aliases": m.config.aliases,
            "router": m.router.strategy.name,
            "router_version": m.router.strategy.version,
            "routes": routes,
            "strategy_status": m.router.status().await,
        }));
    }
    Json(serde_json::json!({
        "local_fraction": gateway.config.routing.local_fraction,
        "inbound_routes": gateway
            .inbound_routes()
            .routes()
            .iter()
            .map(|r| serde_json::json!({
                "id": r.id,
                "name": r.name,
                "tenant_id": r.tenant_id,
                "path_prefix": r.path_prefix,
                "enabled": r.enabled,
                "auth": r.auth.as_str(),
                "groups": r.groups,
                "max_attempts": r.max_attempts,
                "protocol_transformation_type": r.protocol_transformation,
                "plugins": r.plugins,
                "source": r.source,
            }))
            .collect::<Vec<_>>(),
        "models": models,
    }))
    .into_response()
}

/// `GET /health/deep`: endpoints, strategies and storage, for operators and probes.
pub async fn health_deep(State(gateway): State<Arc<Gateway>>) -> Response {
    let strategies: Vec<_> = gateway
        .catalog
        .entries()
        .map(|(name, entry)| match entry {
            CatalogEntry::Loaded(s) => serde_json::json!({
                "name": name, "state": "loaded", "version": s.version, "path": s.path,
                "api_version": s.api_version,
            }),
            CatalogEntry::Missing(m) => serde_json::json!({
                "name": name, "state": "missing", "path": m.path, "reason": m.reason,
            }),
        })
        .collect();
    let routers: Vec<_> = gateway
        .table()
        .models()
        .map(|m| {
            let s = &m.router.stats;
            serde_json::json!({
                "model": m.id(),
                "strategy": m.router.strategy.label(),
                "selects": s.selects.load(Ordering::Relaxed),
                "failures": s.failures.load(Ordering::Relaxed),
                "resets": s.resets.load(Ordering::Relaxed),
                "last_failure": *s.last_failure.lock(),
            })
        })
        .collect();
    let endpoints = gateway.routing.health.report();
    let degraded = endpoints.iter().any(|e| !e.healthy);
    let api_log = gateway.api_log.as_ref().map(|l| {
        serde_json::json!({
            "dropped_rows": l.dropped.load(Ordering::Relaxed),
            "failed_rows": l.write_errors.load(Ordering::Relaxed),
        })
    });
    let prefill: serde_json::Map<String, serde_json::Value> = gateway
        .routing
        .prefill
        .report()
        .into_iter()
        .map(|(id, load)| {
            (
                id,
                serde_json::json!({ "backlog_tokens": load.backlog_tokens, "elephants": load.elephants }),
            )
        })
        .collect();
    Json(serde_json::json!({
        "status": if degraded { "degraded" } else { "ok" },
        "prefill": prefill,
        "affinity_records": gateway.routing.affinity.len(),
        "note": "health state is per process",
        "endpoints": endpoints,
        "strategies": strategies,
        "routers": routers,
        "database": gateway.store.as_ref().map(|s| s.backend()),
        "database_sync": gateway.store.as_ref().map(|s| s.snapshots().status()),
        "api_logs": api_log,
        "quota": gateway.routing.quota.report(),
        "routewise": gateway.routing.routewise.report(),
    }))
    .into_response()
}
