//! Why one attempt at one upstream failed.

use std::time::Duration;

/// Why one attempt at one upstream failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AttemptError {
    /// Connecting or talking to the upstream failed before an answer arrived.
    #[error("transport error: {0}")]
    Transport(String),
    /// The upstream did not answer in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The upstream answered with a non-2xx status.
    #[error("upstream answered HTTP {status}: {body}")]
    Status {
        status: u16,
        body: String,
        /// The answer's `Retry-After`, in seconds form or as an HTTP date.
        retry_after: Option<Duration>,
    },
    /// The upstream answered 2xx with something that is not a valid response.
    #[error("invalid upstream response: {0}")]
    InvalidResponse(String),
    /// The stream ended or broke before its first event.
    #[error("stream ended before its first event: {0}")]
    EmptyStream(String),
    /// A stream already relayed to the client failed: the upstream's error event, a broken
    /// connection or a cut-off answer, in the words the client was told.
    #[error("{0}")]
    StreamFailed(String),
}

impl AttemptError {
    /// Short machine-readable kind, used in attempt records and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            AttemptError::Transport(_) => "transport",
            AttemptError::Timeout(_) => "timeout",
            AttemptError::Status { .. } => "http_status",
            AttemptError::InvalidResponse(_) => "invalid_response",
            AttemptError::EmptyStream(_) => "empty_stream",
            AttemptError::StreamFailed(_) => "stream_failed",
        }
    }

    /// HTTP status of the upstream answer; 0 when there was none.
    pub fn status(&self) -> u16 {
        match self {
            AttemptError::Status { status, .. } => *status,
            _ => 0,
        }
    }
}
