//! End-to-end tests: the real `switchyard` binary, real mock upstreams on loopback, real SQLite.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod databases;
mod harness;

mod affinity;
mod config_errors;
mod health;
mod hedging;
mod key_pools;
mod pipeline;
mod proxy;
mod quota;
mod request_bounds;
mod routes;
mod routewise;
mod routewise_bootstrap;
mod routewise_probe;
mod routewise_settings;
mod sdk_clients;
mod store;
mod strategies;
mod strategies_run;
mod wit_versions;
