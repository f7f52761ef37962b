//! Operator views outside `/admin/`: where every model's traffic goes (`GET /routing`, behind the
//! admin rule of [`super::auth`] unless `routing.public_routing_endpoint` is set) and the gateway's
//! deep health (`GET /health/deep`, behind the same rule unless `routing.public_health_deep` is
//! set: it names upstreams, quotes their errors and shows strategy paths). Probes use the public
//! `/health` and `/health/ready` (`server/`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;

use super::auth::authorize;
use super::error::ApiError;
use crate::config::ModelUpstream;
use crate::gateway::Gateway;
use crate::routing::health::CircuitState;
use crate::store::health::DatabaseHealth;
use crate::strategy::CatalogEntry;
use crate::upstream::redact;

/// `GET /routing`: every published model's effective weights and where each route stands.
pub async fn routing(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    if !gateway.config.routing.public_routing_endpoint {
        authorize(&gateway, &headers).await?;
    }
    let table = gateway.table();
    let now = std::time::Instant::now();
    let mut models = Vec::new();
    for m in table.models().filter(|m| m.config.published) {
        let admitted: Vec<bool> = m
            .upstreams()
            .iter()
            .map(|r| gateway.routing.health.circuit(&r.endpoint_id, now) != CircuitState::Open)
            .collect();
        let (shares, share_basis) =
            primary_shares(&m.router.strategy.name, m.upstreams(), &admitted);
        let routes: Vec<_> = m
            .upstreams()
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let circuit = gateway.routing.health.circuit(&r.endpoint_id, now);
                let share = shares.as_ref().map(|s| s[i]);
                serde_json::json!({
                    "endpoint_id": r.endpoint_id,
                    "provider": r.kind.as_str(),
                    "base_url": redact::url(&r.base_url),
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
            "share_basis": share_basis,
            "routes": routes,
            "strategy_status": m.router.status().await,
            "shadow": m.shadow.as_ref().map(|s| s.report()),
        }));
    }
    Ok(Json(serde_json::json!({
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
        "decision_recording": gateway.routing.recorder.as_ref().map(|r| r.report()),
    })))
}

/// The share of primaries each upstream gets from the model's strategy right now (breakers as
/// they stand, no session affinity or prefill pressure), and how it was worked out. The host can
/// tell for the built-in `fixed` (a weighted draw in the highest priority tier that has an admitted
/// upstream with weight, so lower tiers get 0) and `round_robin` (a rotation over the admitted
/// upstreams with weight); any other strategy decides per request (`None`: see its
/// `strategy_status`).
fn primary_shares(
    strategy: &str,
    upstreams: &[ModelUpstream],
    admitted: &[bool],
) -> (Option<Vec<f64>>, &'static str) {
    let eligible = |i: usize| admitted[i] && upstreams[i].weight > 0.0;
    let mut shares = vec![0.0; upstreams.len()];
    match strategy {
        "fixed" => {
            let top = (0..upstreams.len())
                .filter(|&i| eligible(i))
                .map(|i| upstreams[i].priority)
                .max();
            let in_top = |i: usize| eligible(i) && Some(upstreams[i].priority) == top;
            let total: f64 = (0..upstreams.len())
                .filter(|&i| in_top(i))
                .map(|i| upstreams[i].weight)
                .sum();
            for (i, share) in shares.iter_mut().enumerate() {
                if in_top(i) && total > 0.0 {
                    *share = upstreams[i].weight / total;
                }
            }
            (
                Some(shares),
                "weight within the highest priority tier with an admitted upstream",
            )
        }
        "round_robin" => {
            let n = (0..upstreams.len()).filter(|&i| eligible(i)).count();
            for (i, share) in shares.iter_mut().enumerate() {
                if eligible(i) {
                    *share = 1.0 / n as f64;
                }
            }
            (Some(shares), "rotation over the admitted upstreams")
        }
        _ => (
            None,
            "decided per request by the strategy; see strategy_status",
        ),
    }
}

/// `GET /health/deep`: endpoints, strategies and storage, for operators.
pub async fn health_deep(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    if !gateway.config.routing.public_health_deep {
        authorize(&gateway, &headers).await?;
    }
    // Opened before the catalog and the table are read: a reload between the two reads shows
    // the new catalog beside the old routers, and must then read as loading.
    let loading = gateway.loading_window();
    let catalog = gateway.catalog();
    let strategies: Vec<_> = catalog
        .entries()
        .map(|(name, entry)| match entry {
            CatalogEntry::Loaded(s) => serde_json::json!({
                "name": name, "state": "loaded", "version": s.version, "path": s.path,
                "api_version": s.api_version, "sha256": s.sha256, "imports": s.imports,
            }),
            CatalogEntry::Missing(m) => serde_json::json!({
                "name": name, "state": "missing", "path": m.path, "reason": m.reason,
                "sha256": m.sha256, "imports": m.imports,
            }),
        })
        .collect();
    // Files of `strategies.dir` whose current content failed to load or the contract: an older
    // content of the file may still serve (`still_serving`).
    let failed_files: Vec<_> = catalog
        .failed_files()
        .map(|(failed, serving)| {
            serde_json::json!({
                "path": failed.path, "strategy": failed.name, "sha256": failed.sha256,
                "reason": failed.reason, "still_serving": serving.map(|s| s.label()),
            })
        })
        .collect();
    let table = gateway.table();
    let pending: Vec<_> = table.pending_models().collect();
    let routers: Vec<_> = gateway
        .table()
        .models()
        .map(|m| {
            let s = &m.router.stats;
            serde_json::json!({
                "model": m.id(),
                "strategy": m.router.strategy.label(),
                "deadline_ms": m.router.deadline().as_secs_f64() * 1000.0,
                "selects": s.selects.load(Ordering::Relaxed),
                "selects_skipped": s.selects_skipped.load(Ordering::Relaxed),
                "skips": m.router.strategy.skips.words(),
                "failures": s.failures.load(Ordering::Relaxed),
                "resets": s.resets.load(Ordering::Relaxed),
                "last_failure": *s.last_failure.lock(),
            })
        })
        .collect();
    let endpoints = gateway.routing.health.report();
    let database = gateway
        .store
        .as_ref()
        .map(|s| DatabaseHealth::gather(s, gateway.api_log.as_ref()));
    // A replica serving on its own state because Redis is gone is degraded too.
    let degraded = endpoints.iter().any(|e| !e.healthy)
        || !failed_files.is_empty()
        || database.as_ref().is_some_and(|d| d.failing())
        || gateway.fleet.as_ref().is_some_and(|f| !f.is_connected());
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
    let mut deep = serde_json::json!({
        "status": if degraded { "degraded" } else { "ok" },
        "prefill": prefill,
        "affinity_records": gateway.routing.affinity.len(),
        "note": if gateway.fleet.is_some() {
            "breakers, affinity, key pools, prefill backlog, quota and concurrency are shared by the fleet; availability and in-flight counts are per process"
        } else {
            "health state is per process"
        },
        "endpoints": endpoints,
        "strategies": strategies,
        "strategies_loading": loading.loaded_while_open(),
        "strategy_files_failed": failed_files,
        "pending_models": pending,
        // What the last pass over `strategies.dir` did (start-up, the watcher or the endpoint).
        "strategies_last_reload": gateway.last_reload(),
        "routers": routers,
        "database": database,
    });
    deep["fleet"] = match &gateway.fleet {
        Some(fleet) => fleet.report(),
        None => serde_json::json!({ "state": "not_configured" }),
    };
    // The extension's sections (RouteWise: `quota`, `routewise`).
    for (key, section) in gateway.extension.health() {
        deep[key] = section;
    }
    Ok(Json(deep))
}
