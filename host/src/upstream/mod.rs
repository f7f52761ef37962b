//! One attempt against one upstream, and the pooled client it sends through.
//!
//! [`Attempt`] is the unit of work: given the upstream routing chose, the client's parsed request
//! and the credential to use, it builds the upstream request (URL, auth, body passed through or
//! translated by `protocol`), sends it, and returns a whole answer or a relayed stream in the
//! client's dialect. What it learns on the way (first token, usage, how it ended) it reports to an
//! [`AttemptSink`]; routing implements the sink, so nothing here knows about health, affinity or
//! strategies.

mod attempt;
mod client;
mod error;
mod http1;
mod pool;
pub mod redact;
mod relay;
mod request;

pub use attempt::{Attempt, AttemptEnd, AttemptSink, ChatAnswer};
pub use client::{ClientBuildError, UpstreamAuth, UpstreamClient, parse_retry_after};
pub use error::AttemptError;
pub use relay::{EventStream, StreamSummary};
pub use request::upstream_dialect;
