//! The wall clock, read in one place: request logs, strategies, ids and the store all stamp time
//! as whole units since the Unix epoch, and a clock set before the epoch reads as 0 rather than
//! failing a request.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_milliseconds_agree() {
        let (ms, secs) = (unix_ms(), unix_secs());
        assert!(secs > 1_700_000_000, "{secs}");
        assert!(ms / 1000 >= secs && ms / 1000 - secs <= 1, "{ms} {secs}");
    }
}
