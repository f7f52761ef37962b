//! `GET /metrics`: on the main listener behind the admin rule (`admin::auth`), and on
//! `server.metrics_listen` without any token, for a scraper on a private network.
//!
//! Before rendering, the gauges that mirror live state are set from the structures themselves
//! (breakers, in-flight attempts, prefill, affinity, quiet keys, the extension's quota headroom,
//! the request log's totals and the configuration sync): the request path does not pay for them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::admin::auth::AdminCaller;
use crate::gateway::Gateway;
use crate::routing::health::CircuitState;
use crate::telemetry::metrics::{self, state};

/// The Prometheus text format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `/metrics` on the main listener: admin callers only.
pub async fn scrape_as_admin(_admin: AdminCaller, State(gateway): State<Arc<Gateway>>) -> Response {
    scrape(&gateway)
}

/// The router of the metrics-only listener: `/metrics` without a token, nothing else.
pub fn listener_router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(gateway): State<Arc<Gateway>>| async move { scrape(&gateway) }),
        )
        .with_state(gateway)
}

fn scrape(gateway: &Gateway) -> Response {
    refresh(gateway);
    match metrics::render() {
        Some(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics are not recorded in this process",
        )
            .into_response(),
    }
}

/// Sets every state-mirroring gauge from the gateway's live structures.
fn refresh(gateway: &Gateway) {
    let routing = &gateway.routing;
    let now = Instant::now();
    let table = gateway.table();
    let mut endpoints: Vec<&str> = table
        .models()
        .flat_map(|m| m.upstreams().iter().map(|u| u.endpoint_id.as_str()))
        .collect();
    endpoints.sort_unstable();
    endpoints.dedup();
    for endpoint in endpoints {
        let load = routing.prefill.load(endpoint);
        state::endpoint(&state::EndpointState {
            endpoint,
            circuit: match routing.health.circuit(endpoint, now) {
                CircuitState::Closed => 0,
                CircuitState::HalfOpen => 1,
                CircuitState::Open => 2,
            },
            availability: routing.health.availability(endpoint),
            in_flight: routing.inflight.count(endpoint),
            backlog_tokens: load.backlog_tokens,
            elephants: load.elephants,
        });
    }
    state::affinity_entries(routing.affinity.len());
    for (pool, quiet) in routing.keys.quiet_by_pool(now) {
        state::quiet_keys(&pool, quiet);
    }
    gateway.extension.refresh_metrics();
    if let Some(fleet) = &gateway.fleet {
        fleet.refresh_metrics();
    }
    gateway.budgets.refresh_metrics(&gateway.snapshot());
    if let Some(log) = &gateway.api_log {
        let (written, dropped, failed) = log.totals();
        state::request_log(written, dropped, failed, log.pruned_rows());
    }
    if let Some(store) = &gateway.store {
        let sync = store.snapshots().status();
        let behind = match (sync.store_version, sync.snapshot_version) {
            (Some(store), Some(served)) => store - served,
            _ => 0,
        };
        let age = sync.last_loaded_at_ms.map(|at| {
            let now_ms = i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX);
            Duration::from_millis(u64::try_from(now_ms - at).unwrap_or(0))
        });
        state::config_sync(behind, age, sync.consecutive_failures);
    }
}
