//! GCRA, the generic cell rate algorithm (ITU-T I.371; the form rate limiters such as `governor`
//! and redis-cell use), over a one-minute window: a key's whole state is one time, its
//! *theoretical arrival time* (TAT). A limit of `L` per minute spaces cells `60 s / L` apart and
//! lets a whole minute's worth be spent at once: taking `n` cells moves the TAT `n × 60 s / L`
//! forward from `max(TAT, now)`, and is allowed while the new TAT stays within a minute of now.
//!
//! Written here rather than taken from `governor` because token limits need what its keyed
//! limiter does not offer: charging after the fact past the limit (an answer that used more
//! tokens than the prompt estimate) and refunding (one that used fewer). Both are one line on a
//! TAT. Times are nanoseconds on any monotonic clock; the caller picks the origin.

/// The window every limit is per.
pub const WINDOW_NS: u64 = 60_000_000_000;

/// How far `n` cells move the TAT of a limit of `per_minute`.
fn cost(per_minute: u64, n: u64) -> u64 {
    let ns = u128::from(n) * u128::from(WINDOW_NS) / u128::from(per_minute.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// What a key has left at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub limit: u64,
    /// Cells that could be taken now.
    pub remaining: u64,
    /// Until every cell is back (the TAT, seen from now).
    pub reset_ns: u64,
}

/// Where a key with `tat` stands at `now`.
pub fn standing(tat: u64, now: u64, per_minute: u64) -> Standing {
    let tat = tat.max(now);
    let room = (now + WINDOW_NS).saturating_sub(tat);
    let remaining = u128::from(room) * u128::from(per_minute) / u128::from(WINDOW_NS);
    Standing {
        limit: per_minute,
        remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
        reset_ns: tat - now,
    }
}

/// The answer to "may `n` cells be taken now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Yes; the key's TAT becomes `tat`.
    Admit { tat: u64 },
    /// No; `retry_after_ns` from now they would fit. `never`: `n` is more than the whole limit,
    /// so waiting does not help.
    Refuse { retry_after_ns: u64, never: bool },
}

/// Whether `n` cells fit a key with `tat` at `now`, without changing it.
pub fn check(tat: u64, now: u64, per_minute: u64, n: u64) -> Decision {
    let step = cost(per_minute, n);
    let new_tat = tat.max(now).saturating_add(step);
    let horizon = now.saturating_add(WINDOW_NS);
    if new_tat <= horizon {
        Decision::Admit { tat: new_tat }
    } else {
        Decision::Refuse {
            retry_after_ns: new_tat - horizon,
            never: step > WINDOW_NS,
        }
    }
}

/// Takes `n` more cells whether or not they fit (usage reported after admission): the key may
/// go past its limit and then refuses until it is back under.
pub fn charge(tat: u64, now: u64, per_minute: u64, n: u64) -> u64 {
    tat.max(now).saturating_add(cost(per_minute, n))
}

/// Gives `n` cells back (usage below the estimate charged); a key never holds more than its
/// whole limit.
pub fn refund(tat: u64, now: u64, per_minute: u64, n: u64) -> u64 {
    tat.saturating_sub(cost(per_minute, n)).max(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// Takes `n` at `now` if it fits, returning whether it did.
    fn take(tat: &mut u64, now: u64, per_minute: u64, n: u64) -> bool {
        match check(*tat, now, per_minute, n) {
            Decision::Admit { tat: t } => {
                *tat = t;
                true
            }
            Decision::Refuse { .. } => false,
        }
    }

    #[test]
    fn a_whole_minute_may_be_spent_at_once_then_one_cell_per_interval() {
        let mut tat = 0;
        let now = 1000 * S;
        for i in 0..6 {
            assert!(take(&mut tat, now, 6, 1), "request {i} of 6");
        }
        assert_eq!(
            check(tat, now, 6, 1),
            Decision::Refuse {
                retry_after_ns: 10 * S,
                never: false
            },
            "the 7th waits one interval (60 s / 6)"
        );
        assert!(!take(&mut tat, now + 10 * S - 1, 6, 1));
        assert!(take(&mut tat, now + 10 * S, 6, 1));
        assert!(!take(&mut tat, now + 10 * S, 6, 1));
        // A minute later the whole limit is back, and no more than it.
        let later = now + 10 * S + WINDOW_NS;
        assert_eq!(standing(tat, later, 6).remaining, 6);
        assert_eq!(standing(tat, later + 600 * S, 6).remaining, 6);
    }

    #[test]
    fn standing_counts_what_is_left_and_when_all_of_it_is_back() {
        let now = 50 * S;
        assert_eq!(
            standing(0, now, 60),
            Standing {
                limit: 60,
                remaining: 60,
                reset_ns: 0
            }
        );
        let mut tat = 0;
        assert!(take(&mut tat, now, 60, 15));
        assert_eq!(
            standing(tat, now, 60),
            Standing {
                limit: 60,
                remaining: 45,
                reset_ns: 15 * S
            }
        );
        assert_eq!(standing(tat, now + 5 * S, 60).remaining, 50);
    }

    #[test]
    fn weighted_charges_take_many_cells_and_more_than_the_limit_never_fits() {
        let now = 7 * S;
        let mut tat = 0;
        assert!(take(&mut tat, now, 1000, 600));
        assert!(!take(&mut tat, now, 1000, 401), "600 + 401 > 1000");
        assert!(take(&mut tat, now, 1000, 400));
        assert_eq!(
            check(0, now, 1000, 1001),
            Decision::Refuse {
                retry_after_ns: 60 * S / 1000,
                never: true
            }
        );
    }

    #[test]
    fn reconciling_charges_past_the_limit_and_refunds_down_to_full() {
        let now = 3 * S;
        // 100 tokens per minute; 10 estimated at admission, 40 used.
        let mut tat = 0;
        assert!(take(&mut tat, now, 100, 10));
        tat = charge(tat, now, 100, 30);
        assert_eq!(standing(tat, now, 100).remaining, 60);
        // Overdrawn: 60 admitted, then 70 more reported.
        assert!(take(&mut tat, now, 100, 60));
        tat = charge(tat, now, 100, 70);
        assert_eq!(standing(tat, now, 100).remaining, 0);
        assert_eq!(
            check(tat, now, 100, 1),
            Decision::Refuse {
                retry_after_ns: 42_600_000_000,
                never: false
            },
            "70 tokens past the limit, plus one: 71 × 0.6 s from now the next token fits"
        );
        // A refund never makes the key more than full.
        let refunded = refund(tat, now, 100, 1_000_000);
        assert_eq!(refunded, now);
        assert_eq!(standing(refunded, now, 100).remaining, 100);
        let mut tat = 0;
        assert!(take(&mut tat, now, 100, 50));
        tat = refund(tat, now, 100, 20);
        assert_eq!(standing(tat, now, 100).remaining, 70);
    }
}
