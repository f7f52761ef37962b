//! The process-local end of the change feed: the newest configuration version this process knows
//! of, shared by every [`tokio::sync::watch::Receiver`] that [`super::ConfigStore::watch`] handed
//! out. Backends publish into it from their own write path (at once) and from whatever tells them
//! about other processes' writes (polling or LISTEN/NOTIFY).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use super::health::SharedTaskHealth;

#[derive(Debug)]
pub(crate) struct Feed {
    tx: watch::Sender<i64>,
    started: AtomicBool,
    /// Whether the backend's watcher reaches the database.
    pub health: SharedTaskHealth,
}

impl Default for Feed {
    fn default() -> Self {
        Feed {
            tx: watch::Sender::new(0),
            started: AtomicBool::new(false),
            health: SharedTaskHealth::default(),
        }
    }
}

impl Feed {
    /// Records `version` if it is newer; the feed never goes backwards, so a late notification of
    /// an old write cannot hide a newer one.
    pub fn publish(&self, version: i64) {
        self.tx.send_if_modified(|current| {
            if version > *current {
                *current = version;
                true
            } else {
                false
            }
        });
    }

    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.tx.subscribe()
    }

    /// True the first time only: whoever gets it starts the backend's watcher task.
    pub fn claim_start(&self) -> bool {
        !self.started.swap(true, Ordering::AcqRel)
    }
}
