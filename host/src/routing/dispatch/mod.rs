//! Executing a plan: try the plan's upstreams in order until one answers, keep attribution.
//!
//! - [`attempts`]: the one attempt loop for chat and embeddings — admission (the breaker is
//!   consulted again at every step) and `max_attempts`.
//! - [`hedge`]: racing a backup when the strategy asked for a hedge.
//! - [`ledger`]: booking each attempt's outcome (health, keys, affinity, prefill, observations,
//!   and its entry in the request's [`attempt_log`]).
//!
//! One attempt itself — building, sending, relaying — is `upstream::Attempt`.

pub mod attempt_log;
mod attempts;
mod hedge;
mod ledger;

pub use attempt_log::{AttemptLog, AttemptRecord};
pub use attempts::{chat, embeddings};

use bytes::Bytes;

use crate::config::ModelUpstream;
use crate::upstream::{AttemptError, EventStream, StreamSummary};

use super::select::Exclusion;

/// One failed attempt, as kept in the attribution and reported when every attempt fails.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FailedAttempt {
    pub provider: String,
    pub endpoint_id: String,
    pub error_type: &'static str,
    pub error: String,
    #[serde(skip)]
    pub status: u16,
}

impl FailedAttempt {
    fn new(upstream: &ModelUpstream, e: &AttemptError) -> Self {
        Self {
            provider: upstream.kind.as_str().to_owned(),
            endpoint_id: upstream.endpoint_id.clone(),
            error_type: e.error_type(),
            error: e.to_string(),
            status: e.status(),
        }
    }
}

/// Where a request went: kept server-side for logs and observations, never sent to the client.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Attribution {
    pub provider: &'static str,
    pub base_url: String,
    pub endpoint_id: String,
    pub fell_back: bool,
    pub failed_attempts: Vec<FailedAttempt>,
    /// Time the dispatch spent waiting on attempts, until the answer (a stream: its first event)
    /// was in hand; the rest of the request's time is the gateway's own.
    #[serde(skip)]
    pub upstream_time: std::time::Duration,
}

impl Attribution {
    /// Served by `upstream` after the `failed` attempts.
    fn new(
        upstream: &ModelUpstream,
        failed: Vec<FailedAttempt>,
        upstream_time: std::time::Duration,
    ) -> Self {
        Self {
            provider: upstream.kind.as_str(),
            base_url: crate::upstream::redact::url(&upstream.base_url).into_owned(),
            endpoint_id: upstream.endpoint_id.clone(),
            fell_back: !failed.is_empty(),
            failed_attempts: failed,
            upstream_time,
        }
    }
}

/// Every upstream in the plan failed or was skipped.
#[derive(Debug, thiserror::Error)]
#[error("all {} attempts failed; first: {}", attempts.len(), attempts.first().map(|a| a.error.as_str()).unwrap_or("none"))]
pub struct DispatchError {
    pub attempts: Vec<FailedAttempt>,
    /// Upstreams left out before or during dispatch (open circuits, weight 0, modality).
    pub excluded: Vec<Exclusion>,
}

impl DispatchError {
    /// The primary (first) attempt's error decides the client's status.
    pub fn primary(&self) -> Option<&FailedAttempt> {
        self.attempts.first()
    }
}

/// A successful chat dispatch.
pub enum Answer {
    /// A whole JSON body.
    Complete {
        body: Bytes,
        attribution: Attribution,
        prompt_tokens: u32,
        completion_tokens: u32,
    },
    /// An SSE stream, already past its first content; `summary` resolves when it ends.
    Stream {
        events: EventStream,
        attribution: Attribution,
        summary: tokio::sync::oneshot::Receiver<StreamSummary>,
    },
}
