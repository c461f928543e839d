//! The retry schedule: exponential backoff with full jitter,
//! `delay = uniform(0, min(cap, base · 2^(n-1)))` after the n-th failed
//! attempt, until the delivery's retry window (`max_age`) or `max_attempts`
//! runs out, then dead-letter.
//!
//! Jitter only de-synchronises retries; the circuit breaker is what bounds the
//! load on a failing destination (design §7). Randomness comes in as `unit`,
//! a number in `[0, 1)`, so the schedule is a pure function.

use std::time::Duration;

use crate::Timestamp;

/// The resolved retry settings for one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule {
    /// The first backoff bound.
    pub base: Duration,
    /// The largest backoff bound.
    pub cap: Duration,
    /// How long after its retry window opened a delivery keeps being attempted.
    pub max_age: Duration,
    /// How many attempts at most.
    pub max_attempts: u32,
    /// 4xx statuses to retry besides 408, 425 and 429.
    pub retryable_statuses: Vec<u16>,
}

impl Default for RetrySchedule {
    /// Base 1 s, cap 1 h, 24 h window (design §7). `max_attempts` is 60 so that
    /// the 24 h window, not the count, is what normally ends retrying: with
    /// full jitter the mean delay at the cap is 30 min, so 24 h holds about
    /// 12 + 44 attempts.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(3600),
            max_age: Duration::from_secs(24 * 3600),
            max_attempts: 60,
            retryable_statuses: Vec::new(),
        }
    }
}

/// What to do after a retryable failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// Try again at this time.
    RetryAt(Timestamp),
    /// Stop: the delivery is dead-lettered (and kept).
    Dead,
}

impl RetrySchedule {
    /// The upper bound of the delay after `attempts_made` failed attempts
    /// (`attempts_made ≥ 1`): `min(cap, base · 2^(attempts_made-1))`.
    pub fn backoff_bound(&self, attempts_made: u32) -> Duration {
        // 2^31 × base already exceeds any sane cap; saturate beyond it.
        let factor = 1u32
            .checked_shl(attempts_made.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The jittered delay: `unit` (in `[0, 1)`) of the backoff bound.
    pub fn jittered_delay(&self, attempts_made: u32, unit: f64) -> Duration {
        self.backoff_bound(attempts_made)
            .mul_f64(unit.clamp(0.0, 1.0))
    }

    /// Decides the next step after a retryable failure.
    ///
    /// - `attempts_made`: attempts so far, including the one that just failed.
    /// - `window_start`: when the delivery's retry window opened (its creation,
    ///   or its last replay).
    /// - `retry_after`: the destination's `Retry-After`, if any. It is honoured
    ///   within bounds: never sooner than the backoff, never beyond the cap.
    pub fn after_failure(
        &self,
        attempts_made: u32,
        window_start: Timestamp,
        now: Timestamp,
        retry_after: Option<Duration>,
        unit: f64,
    ) -> NextStep {
        if attempts_made >= self.max_attempts {
            return NextStep::Dead;
        }
        let deadline = window_start + to_chrono(self.max_age);
        if now >= deadline {
            return NextStep::Dead;
        }
        let mut delay = self.jittered_delay(attempts_made, unit);
        if let Some(ra) = retry_after {
            delay = delay.max(ra.min(self.cap));
        }
        // The last attempt happens at the end of the window, not after it.
        NextStep::RetryAt((now + to_chrono(delay)).min(deadline))
    }
}

fn to_chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t0() -> Timestamp {
        chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    #[test]
    fn bounds_double_from_base_and_stop_at_the_cap() {
        let s = RetrySchedule::default();
        let bounds: Vec<u64> = (1..=14).map(|n| s.backoff_bound(n).as_secs()).collect();
        assert_eq!(
            bounds,
            [
                1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600, 3600
            ]
        );
        assert_eq!(s.backoff_bound(1000), Duration::from_secs(3600));
    }

    #[test]
    fn delays_fall_within_their_jitter_bounds_for_every_attempt_number() {
        let s = RetrySchedule::default();
        for n in 1..s.max_attempts {
            for unit in [0.0, 0.25, 0.5, 0.999_999] {
                let d = s.jittered_delay(n, unit);
                assert!(d <= s.backoff_bound(n), "attempt {n}");
                match s.after_failure(n, t0(), t0(), None, unit) {
                    NextStep::RetryAt(at) => assert_eq!(at, t0() + to_chrono(d)),
                    NextStep::Dead => panic!("attempt {n} should retry"),
                }
            }
        }
    }

    #[test]
    fn stops_at_max_attempts_and_at_max_age() {
        let s = RetrySchedule {
            max_attempts: 3,
            ..Default::default()
        };
        assert!(matches!(
            s.after_failure(2, t0(), t0(), None, 0.5),
            NextStep::RetryAt(_)
        ));
        assert_eq!(s.after_failure(3, t0(), t0(), None, 0.5), NextStep::Dead);

        let s = RetrySchedule::default();
        let day = chrono::Duration::hours(24);
        assert_eq!(
            s.after_failure(5, t0(), t0() + day, None, 0.5),
            NextStep::Dead
        );
        // Just before the deadline, the retry is clamped to the deadline.
        let almost = t0() + day - chrono::Duration::seconds(10);
        assert_eq!(
            s.after_failure(20, t0(), almost, None, 0.9),
            NextStep::RetryAt(t0() + day)
        );
    }

    #[test]
    fn retry_after_is_honoured_within_bounds() {
        let s = RetrySchedule::default();
        // Longer than the backoff: waited for.
        let at = s.after_failure(1, t0(), t0(), Some(Duration::from_secs(5)), 0.5);
        assert_eq!(at, NextStep::RetryAt(t0() + chrono::Duration::seconds(5)));
        // Shorter than the backoff: the backoff wins.
        let s2 = RetrySchedule {
            base: Duration::from_secs(60),
            ..Default::default()
        };
        let at = s2.after_failure(1, t0(), t0(), Some(Duration::from_secs(1)), 0.5);
        assert_eq!(at, NextStep::RetryAt(t0() + chrono::Duration::seconds(30)));
        // Beyond the cap: capped.
        let at = s.after_failure(1, t0(), t0(), Some(Duration::from_secs(100_000)), 0.0);
        assert_eq!(
            at,
            NextStep::RetryAt(t0() + chrono::Duration::seconds(3600))
        );
    }

    proptest! {
        #[test]
        fn bounds_never_decrease_and_stay_capped(base in 1u64..100, cap in 1u64..100_000, n in 1u32..200) {
            let s = RetrySchedule { base: Duration::from_secs(base), cap: Duration::from_secs(cap.max(base)), ..Default::default() };
            prop_assert!(s.backoff_bound(n + 1) >= s.backoff_bound(n));
            prop_assert!(s.backoff_bound(n) <= s.cap);
        }

        #[test]
        fn the_next_attempt_never_lands_after_the_window(n in 1u32..59, secs in 0i64..200_000, unit in 0.0f64..1.0, ra in proptest::option::of(0u64..10_000)) {
            let s = RetrySchedule::default();
            let now = t0() + chrono::Duration::seconds(secs);
            if let NextStep::RetryAt(at) = s.after_failure(n, t0(), now, ra.map(Duration::from_secs), unit) {
                prop_assert!(at >= now);
                prop_assert!(at <= t0() + chrono::Duration::hours(24));
            }
        }
    }
}
