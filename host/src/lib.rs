//! Switchyard: an LLM inference gateway whose routing strategies are WebAssembly components.
//!
//! The modules follow a request's path: [`server`] (HTTP edge; finds the request's inbound route in
//! [`inbound_routes`]) → [`protocol`] (parsing) → [`routing`] (route table, selection, dispatch with
//! fallback) → [`strategy`] (the wasm host that orders routes) → [`upstream`] (one attempt against
//! one provider); [`store`] keeps logs and state; [`entity`] holds the configuration entities that
//! the store keeps and the other modules use; [`config`] loads the YAML; [`admin`] is the
//! operator's API; [`routewise`] is the host's side of the RouteWise strategy, plugged into the
//! gateway through one hook ([`gateway::extension`]); [`mock`] is the simulated upstream used by
//! demos, tests and benchmarks; [`fleet`] shares routing's state with the other replicas over
//! Redis; [`telemetry`] (metrics, request ids, log format) sits below the
//! pipeline and any stage may report to it.
#![forbid(unsafe_code)]

pub mod admin;
pub mod clock;
pub mod config;
pub mod entity;
pub mod fleet;
pub mod gateway;
pub mod id_map;
pub mod inbound_routes;
pub mod mock;
pub mod protocol;
pub mod routewise;
pub mod routing;
pub mod server;
pub mod store;
pub mod strategy;
pub mod telemetry;
pub mod upstream;
