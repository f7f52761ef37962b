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
mod budgets;
mod compile_child;
mod config_errors;
mod dashboard;
mod database_health;
mod deploy;
mod edge;
mod fleet;
mod health;
mod hedging;
mod hot_swap;
mod isolation;
mod key_pools;
mod observe;
mod pipeline;
mod plugins;
mod prometheus;
mod proxy;
mod quota;
mod rate_limit;
mod request_bounds;
mod request_log;
mod routes;
mod routewise;
mod routewise_bootstrap;
mod routewise_probe;
mod routewise_settings;
mod sdk_clients;
mod shadow;
mod store;
mod strategies;
mod strategies_run;
mod strategy_sdks;
mod stream_deadlines;
mod traces;
mod upstream_transport;
mod wit_versions;
