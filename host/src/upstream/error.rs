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
    /// The stream ended or broke before its first content (or its proper end).
    #[error("stream ended before its first content: {0}")]
    EmptyStream(String),
    /// A stream sent no content or tool-call delta within its first-token deadline.
    #[error("first_token_timeout: no content within {0:?} of dispatch")]
    FirstTokenTimeout(Duration),
    /// A stream that was sending content went silent for longer than its idle deadline.
    #[error("idle_timeout: no upstream event for {0:?}")]
    IdleTimeout(Duration),
    /// A stream outlasted its total deadline.
    #[error("total_timeout: the stream took longer than {0:?}")]
    TotalTimeout(Duration),
    /// The upstream's answer, or one event of its stream, outgrew its limit (`what` says which,
    /// naming the config key).
    #[error("response_too_large: {what} exceeded the limit of {limit} bytes")]
    ResponseTooLarge { what: &'static str, limit: usize },
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
            AttemptError::FirstTokenTimeout(_) => "first_token_timeout",
            AttemptError::IdleTimeout(_) => "idle_timeout",
            AttemptError::TotalTimeout(_) => "total_timeout",
            AttemptError::ResponseTooLarge { .. } => "response_too_large",
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

    /// A deadline of the stream ran out: the client hears a gateway timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            AttemptError::Timeout(_)
                | AttemptError::FirstTokenTimeout(_)
                | AttemptError::IdleTimeout(_)
                | AttemptError::TotalTimeout(_)
        )
    }
}
