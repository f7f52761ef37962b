//! Startup guards for RouteWise's stateful providers.
//!
//! - **Cold start.** RouteWise prices a quota route from the model's cost envelope, which is
//!   learned from traffic, and masks quota routes until it is calibrated. A model with other routes
//!   starts degraded (logged once); a model whose routes are *all* quota routes could not route a
//!   single request, so startup fails with [`EnvelopeNotCalibratedError`] — unless the component's
//!   `status()` already reports `envelope.calibrated: true`.
//! - **One process.** Quota and concurrency accounting lives in the router instance, i.e. in one
//!   process. With `stateful_providers_single_worker_only` (router_params, default true), a model
//!   with quota or concurrency routes refuses to start as one of several processes
//!   ([`SingleWorkerGuardError`]). The process count comes from [`PROCESS_COUNT_VARS`]:
//!   `SWITCHYARD_REPLICAS`, and the worker counts a deployment written for a Python gateway sets
//!   (`WEB_CONCURRENCY`, `UVICORN_WORKERS`, `GUNICORN_WORKERS`) — the largest positive integer
//!   among them; the gateway cannot see replicas that nobody declares. A fleet (`fleet:`) shares the accounting, so `serve` does not
//!   run the guard then ([`crate::fleet`]).
//!
//! Both apply to models routed by `routewise`, the strategy that reads these route kinds.

use super::{is_quota_route, provider_type};
use crate::config::ModelConfig;
use crate::routing::table::ModelTable;

/// The strategy the guards apply to.
pub const ROUTEWISE: &str = "routewise";

/// The environment variables that declare how many gateway processes serve the same models.
pub const PROCESS_COUNT_VARS: [&str; 4] = [
    "SWITCHYARD_REPLICAS",
    "WEB_CONCURRENCY",
    "UVICORN_WORKERS",
    "GUNICORN_WORKERS",
];

/// A RouteWise model whose routes are all quota routes, with an uncalibrated envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncalibratedModel {
    pub model: String,
    /// Envelope samples the component holds, and how many calibration needs.
    pub samples: u64,
    pub min_samples: u64,
}

/// Models that could not route any request: every route is a quota route, and quota routes are
/// priced from a cost envelope that has no (or too few) samples.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("EnvelopeNotCalibratedError: {}", describe_uncalibrated(.models))]
pub struct EnvelopeNotCalibratedError {
    pub models: Vec<UncalibratedModel>,
}

fn describe_uncalibrated(models: &[UncalibratedModel]) -> String {
    let each: Vec<String> = models
        .iter()
        .map(|m| {
            format!(
                "model `{}` (routewise) has only quota routes, and quota routes are priced from \
                 the model's cost envelope, which is not calibrated ({} of {} samples), so the \
                 model could not route a single request",
                m.model, m.samples, m.min_samples
            )
        })
        .collect();
    format!(
        "{}. Add an on-demand route (a priced route without `provider_type: quota`) so that its \
         traffic calibrates the envelope, or enable the DB bootstrap \
         (`router_params.db_bootstrap_enabled: true`), which `serve` runs before this check, to \
         calibrate it from the request log (that needs `envelope_min_samples` answered requests of \
         the model within `latency_history_prior_window_sec`; `check` cannot read the log)",
        each.join("; ")
    )
}

/// Fails for every published RouteWise model whose routes are all quota routes while its
/// component reports the envelope uncalibrated; logs once, per model, that a model with quota
/// routes among others starts degraded.
pub async fn cold_start(table: &ModelTable) -> Result<(), EnvelopeNotCalibratedError> {
    let mut uncalibrated = Vec::new();
    for model in table.models() {
        if model.router.strategy.name != ROUTEWISE || !model.config.published {
            continue;
        }
        let quota: Vec<&str> = model
            .upstreams()
            .iter()
            .filter(|r| is_quota_route(r))
            .map(|r| r.endpoint_id.as_str())
            .collect();
        if quota.is_empty() {
            continue;
        }
        let status = model.router.status().await;
        let envelope = &status["envelope"];
        if envelope["calibrated"].as_bool() == Some(true) {
            continue;
        }
        let samples = envelope["samples"].as_u64().unwrap_or(0);
        let min_samples = envelope["min_samples"].as_u64().unwrap_or(0);
        if quota.len() == model.upstreams().len() {
            uncalibrated.push(UncalibratedModel {
                model: model.id().to_owned(),
                samples,
                min_samples,
            });
        } else {
            tracing::warn!(
                model = %model.id(),
                quota_routes = %quota.join(", "),
                "model starts degraded: its quota routes are masked until the cost envelope is \
                 calibrated ({samples} of {min_samples} samples, learned from its other routes' \
                 traffic)"
            );
        }
    }
    if uncalibrated.is_empty() {
        Ok(())
    } else {
        Err(EnvelopeNotCalibratedError {
            models: uncalibrated,
        })
    }
}

/// A RouteWise model with stateful routes, refused because several processes serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatefulModel {
    pub model: String,
    /// `endpoint_id (provider_type)` of each quota or concurrency route.
    pub routes: Vec<String>,
}

/// Several gateway processes would each keep their own quota counts and concurrency slots.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "SingleWorkerGuardError: {var}={processes} says this is one of {processes} gateway processes, \
     but quota and concurrency accounting is per process, so together they would overspend quotas \
     and overfill concurrency slots: {}. Serve these models from a single process, or set \
     `router_params.stateful_providers_single_worker_only: false` on each of them to accept that",
    describe_stateful(.models)
)]
pub struct SingleWorkerGuardError {
    /// The variable that declared the process count.
    pub var: &'static str,
    pub processes: u32,
    pub models: Vec<StatefulModel>,
}

fn describe_stateful(models: &[StatefulModel]) -> String {
    models
        .iter()
        .map(|m| format!("model `{}` ({})", m.model, m.routes.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The declared number of processes: the largest positive integer among
/// [`PROCESS_COUNT_VARS`], with the variable that said it; anything else counts as unset.
pub fn declared_processes(env: &dyn Fn(&str) -> Option<String>) -> Option<(&'static str, u32)> {
    PROCESS_COUNT_VARS
        .iter()
        .filter_map(|&var| {
            let n = env(var)?.trim().parse::<u32>().ok()?;
            Some((var, n))
        })
        .max_by_key(|&(_, n)| n)
}

/// Refuses to serve RouteWise models with quota or concurrency routes (and
/// `stateful_providers_single_worker_only` not set to false) when the environment declares more
/// than one process.
pub fn replica_guard(
    models: &[ModelConfig],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), SingleWorkerGuardError> {
    let Some((var, processes)) = declared_processes(env).filter(|&(_, n)| n > 1) else {
        return Ok(());
    };
    let stateful: Vec<StatefulModel> = models
        .iter()
        .filter(|m| m.router == ROUTEWISE)
        .filter(|m| {
            m.router_params
                .get("stateful_providers_single_worker_only")
                .and_then(serde_json::Value::as_bool)
                != Some(false)
        })
        .filter_map(|m| {
            let routes: Vec<String> = m
                .upstreams
                .iter()
                .filter_map(|r| match provider_type(r) {
                    Some(t @ ("quota" | "concurrency")) => Some(format!("{} {t}", r.endpoint_id)),
                    _ => None,
                })
                .collect();
            (!routes.is_empty()).then(|| StatefulModel {
                model: m.id.clone(),
                routes,
            })
        })
        .collect();
    if stateful.is_empty() {
        Ok(())
    } else {
        Err(SingleWorkerGuardError {
            var,
            processes,
            models: stateful,
        })
    }
}
