//! The gateway-side request counter behind `local_quota_fallback: true`.
//!
//! What it is, exactly: a count **per process** (each replica counts its own; a restart starts from
//! zero; with a fleet the board reads the fleet's count instead, see
//! [`super::SharedQuotaCounts`]) of the **requests** this process dispatched to a quota pool — one per attempt sent to any
//! route of the pool, fallbacks included; never tokens or spend — since the last **server-local
//! midnight**. So it can only model a daily request cap that resets at local midnight; a provider
//! whose window is rolling, monthly or reset at another hour needs a real `quota_source`.

use std::collections::HashMap;

use chrono::NaiveDate;

/// Where the board reads the time, so tests can move it across midnight.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// The server-local calendar date at `ms`.
    fn local_date(&self, ms: u64) -> NaiveDate;
}

/// The system clock and the process's time zone (`TZ`, else `/etc/localtime`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        crate::clock::unix_ms()
    }

    fn local_date(&self, ms: u64) -> NaiveDate {
        use chrono::TimeZone;
        chrono::Local
            .timestamp_millis_opt(i64::try_from(ms).unwrap_or(i64::MAX))
            .earliest()
            .map(|t| t.date_naive())
            .unwrap_or(NaiveDate::MIN)
    }
}

/// Requests per pool since the last local midnight.
#[derive(Debug, Default)]
pub struct LocalCounter {
    /// The local date the counts belong to; a different date empties them.
    day: Option<NaiveDate>,
    counts: HashMap<String, u64>,
}

impl LocalCounter {
    fn roll(&mut self, today: NaiveDate) {
        if self.day != Some(today) {
            self.day = Some(today);
            self.counts.clear();
        }
    }

    /// Counts one request dispatched to `pool` on local date `today`.
    pub fn count(&mut self, pool: &str, today: NaiveDate) {
        self.roll(today);
        match self.counts.get_mut(pool) {
            Some(n) => *n += 1,
            None => {
                self.counts.insert(pool.to_owned(), 1);
            }
        }
    }

    /// Requests counted for `pool` on local date `today` (0 once the date moved on).
    pub fn used(&mut self, pool: &str, today: NaiveDate) -> u64 {
        self.roll(today);
        self.counts.get(pool).copied().unwrap_or(0)
    }
}
