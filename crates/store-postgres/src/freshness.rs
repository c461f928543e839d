//! Keeping the planner's statistics of today's partitions fresh.
//!
//! Deliveries and attempts live in day partitions, and a new day's
//! partition starts with no statistics. Autovacuum analyzes it once enough
//! rows changed and its next round comes (a minute, or more); until then the
//! planner guesses, and its guesses for the claim and record statements
//! (a partial index scanned whole per row) cost several times the work.
//! Measured with `hookd-bench fanout --backend postgres`: 2,928-3,378
//! deliveries/s without, 4,046/s with one `ANALYZE` 14 s into the run.
//!
//! So each store counts the deliveries it writes and analyzes today's pair
//! of partitions (in the background, one at a time) when the count since
//! the day began reaches [`FIRST`] and then each time it doubles: a
//! handful of `ANALYZE`s per day, most of them while the partition is
//! small and its shape changes fastest.

use std::sync::Mutex;

use chrono::NaiveDate;

/// Rows written today before the first `ANALYZE`.
pub(crate) const FIRST: u64 = 10_000;

/// The count behind the decision, per store (clones share it).
#[derive(Debug, Default)]
pub(crate) struct Freshness {
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct State {
    day: Option<NaiveDate>,
    written: u64,
    analyzed_at: u64,
    running: bool,
}

impl State {
    /// Counts `n` rows written on `day`; whether to start an `ANALYZE` now
    /// (and if so, it is marked running).
    fn note(&mut self, day: NaiveDate, n: u64) -> bool {
        if self.day != Some(day) {
            *self = State {
                day: Some(day),
                running: self.running,
                ..State::default()
            };
        }
        self.written += n;
        let due = self.written >= FIRST && self.written >= self.analyzed_at.saturating_mul(2);
        if due && !self.running {
            self.running = true;
            self.analyzed_at = self.written;
            return true;
        }
        false
    }
}

impl Freshness {
    /// Counts `n` deliveries written on `day` (UTC); `true` when the caller
    /// should analyze today's partitions now, and call [`done`](Self::done)
    /// after.
    pub(crate) fn note(&self, day: NaiveDate, n: u64) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(day, n)
    }

    /// The `ANALYZE` started by [`note`](Self::note) ended.
    pub(crate) fn done(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).running = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, d).unwrap()
    }

    #[test]
    fn analyzes_at_the_first_threshold_then_each_doubling() {
        let mut s = State::default();
        let mut started = Vec::new();
        for i in 1..=100 {
            if s.note(day(30), 1_000) {
                started.push(i * 1_000);
                s.running = false;
            }
        }
        assert_eq!(started, vec![10_000, 20_000, 40_000, 80_000]);
    }

    #[test]
    fn one_at_a_time() {
        let mut s = State::default();
        assert!(s.note(day(30), FIRST));
        // Still running: a doubling passes without a second one.
        assert!(!s.note(day(30), 3 * FIRST));
        s.running = false;
        // The next doubling from where the first one was.
        assert!(s.note(day(30), 1));
    }

    #[test]
    fn a_new_day_starts_over() {
        let mut s = State::default();
        assert!(s.note(day(29), 50_000));
        s.running = false;
        assert!(!s.note(day(30), FIRST - 1), "a new partition, a new count");
        assert!(s.note(day(30), 1));
    }
}
