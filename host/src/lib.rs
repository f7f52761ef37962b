//! Switchyard: an LLM inference gateway whose routing strategies are WebAssembly components.
//!
//! The modules follow a request's path: [`server`] (HTTP edge) → [`protocol`] (parsing) →
//! [`routing`] (route table, selection, dispatch with fallback) → [`strategy`] (the wasm host that
//! orders routes) → [`upstream`] (talking to providers); [`store`] keeps logs and state;
//! [`entity`] holds the configuration entities that the store keeps and the other modules use;
//! [`config`] loads the YAML; [`mock`] is the simulated upstream used by demos, tests and benchmarks.
#![forbid(unsafe_code)]

pub mod admin;
pub mod config;
pub mod entity;
pub mod gateway;
pub mod mock;
pub mod protocol;
pub mod routing;
pub mod server;
pub mod store;
pub mod strategy;
pub mod upstream;
