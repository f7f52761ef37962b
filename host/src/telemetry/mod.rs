//! What the gateway tells its operators: Prometheus metrics ([`metrics`]), request ids
//! ([`request_id`]), the log format ([`logging`]) and OpenTelemetry traces ([`trace`]).
//!
//! Every metric name and every recording function lives here, so the stages of the request path
//! call one function each and the README's metric list can be checked against one file. The
//! module sits below the pipeline: any stage may call it, it imports none of them.

pub mod logging;
pub mod metrics;
pub mod request_id;
pub mod trace;

pub use request_id::RequestId;
