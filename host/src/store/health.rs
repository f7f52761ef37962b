//! How the store's background work stands, for `/health/deep`: the request-log writer, the change
//! feed and configuration reloads, and (SQLite) whether the database file is still the one that was
//! opened. Each is a [`TaskHealth`]; any of them failing turns the database section, and the
//! gateway's status, to degraded.

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use utoipa::ToSchema;

use super::Store;
use super::api_log::ApiLog;

/// One recurring background job's record: when it last worked and how it has failed since.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct TaskHealth {
    /// When it last succeeded, Unix milliseconds; `null` if it never has.
    pub last_success_at_ms: Option<i64>,
    /// Failures since the last success; non-zero means it is failing now.
    pub consecutive_failures: u32,
    /// The last failure, kept after a success so an operator can see what happened.
    pub last_error: Option<String>,
    pub last_error_at_ms: Option<i64>,
}

impl TaskHealth {
    pub fn succeeded(&mut self) {
        self.last_success_at_ms = Some(now_ms());
        self.consecutive_failures = 0;
    }

    pub fn failed(&mut self, error: impl Display) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        self.last_error = Some(error.to_string());
        self.last_error_at_ms = Some(now_ms());
    }

    pub fn failing(&self) -> bool {
        self.consecutive_failures > 0
    }
}

/// A [`TaskHealth`] shared between the task that reports and the views that read.
#[derive(Debug, Clone, Default)]
pub struct SharedTaskHealth(Arc<Mutex<TaskHealth>>);

impl SharedTaskHealth {
    pub fn succeeded(&self) {
        self.0.lock().succeeded();
    }

    pub fn failed(&self, error: impl Display) {
        self.0.lock().failed(error);
    }

    pub fn get(&self) -> TaskHealth {
        self.0.lock().clone()
    }
}

pub(crate) fn now_ms() -> i64 {
    i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX)
}

/// The request-log writer's state.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RequestLogHealth {
    /// Rows dropped because the queue was full.
    pub dropped_rows: u64,
    /// Rows whose write failed.
    pub failed_rows: u64,
    /// The batch writes (a batch is written only when requests were logged).
    #[serde(flatten)]
    pub writes: TaskHealth,
    /// Rows past `database.request_log_retention_days`, pruned in the background.
    pub retention: super::retention::RetentionHealth,
}

/// The SQLite file the process opened, checked against the path now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DatabaseFileHealth {
    #[schema(value_type = String)]
    pub path: PathBuf,
    /// `ok`, `missing` (deleted while running) or `replaced` (another file now has its path).
    pub state: &'static str,
    #[serde(flatten)]
    pub checks: TaskHealth,
}

/// The `database` section of `/health/deep`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DatabaseHealth {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// `ok`, or `failing` when any part below is failing.
    pub status: &'static str,
    /// One sentence per failing part, empty when all is well.
    pub problems: Vec<String>,
    /// SQLite only: the database file.
    pub file: Option<DatabaseFileHealth>,
    /// The configuration snapshot: reloads and the change feed that triggers them.
    pub sync: super::SyncStatus,
    /// The request log (`api_logs`) writer.
    pub request_log: Option<RequestLogHealth>,
}

impl DatabaseHealth {
    pub fn gather(store: &Store, api_log: Option<&ApiLog>) -> DatabaseHealth {
        let sync = store.sync_status();
        let file = store.file_health();
        let request_log = api_log.map(ApiLog::health);
        let mut problems = Vec::new();
        if let Some(f) = &file
            && f.state != "ok"
        {
            problems.push(match f.state {
                "missing" => format!(
                    "the database file {} was deleted while the gateway runs: configuration \
                     changes and request logs now go to the deleted file and are lost at exit; \
                     restore the file from a backup or restart",
                    f.path.display()
                ),
                _ => format!(
                    "the database file {} was replaced while the gateway runs: this process still \
                     uses the old file; restart to use the new one",
                    f.path.display()
                ),
            });
        }
        if sync.consecutive_failures > 0 {
            problems.push(format!(
                "reloading the configuration failed {} time(s) in a row (serving version {}): {}",
                sync.consecutive_failures,
                sync.snapshot_version.unwrap_or(-1),
                sync.last_error.as_deref().unwrap_or("unknown error")
            ));
        }
        if sync.change_feed.failing() {
            problems.push(format!(
                "watching for configuration changes failed {} time(s) in a row: {}",
                sync.change_feed.consecutive_failures,
                sync.change_feed
                    .last_error
                    .as_deref()
                    .unwrap_or("unknown error")
            ));
        }
        if let Some(log) = &request_log
            && log.writes.failing()
        {
            problems.push(format!(
                "writing the request log failed {} time(s) in a row: {}",
                log.writes.consecutive_failures,
                log.writes.last_error.as_deref().unwrap_or("unknown error")
            ));
        }
        if let Some(log) = &request_log
            && log.retention.passes.failing()
        {
            problems.push(format!(
                "pruning the request log failed {} time(s) in a row, so it grows past its \
                 retention: {}",
                log.retention.passes.consecutive_failures,
                log.retention
                    .passes
                    .last_error
                    .as_deref()
                    .unwrap_or("unknown error")
            ));
        }
        DatabaseHealth {
            backend: store.backend(),
            status: if problems.is_empty() { "ok" } else { "failing" },
            problems,
            file,
            sync,
            request_log,
        }
    }

    pub fn failing(&self) -> bool {
        !self.problems.is_empty()
    }
}
