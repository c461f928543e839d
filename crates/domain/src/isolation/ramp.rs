//! Slow start after recovery (design §7, "the recovery flood", mitigation 1).
//!
//! A destination that was down for hours comes back to hours of backlog. If
//! the circuit closes straight to full rate, the backlog kills it again. So
//! when the circuit closes, admission starts at 10 % of the destination's
//! rate *and* concurrency and climbs linearly to 100 % over the ramp period
//! (5 min by default, "several minutes" in §7), as long as the success rate
//! holds:
//!
//! | retryable failures in a period | the ramp        |
//! |--------------------------------|-----------------|
//! | ≤ 5 %                          | advances        |
//! | > 5 % and ≤ 25 %               | holds (slows)   |
//! | > 25 %                         | halves (reverses), never below 10 % |
//!
//! 25 % is well below the breaker's 50 %, so the ramp backs off before the
//! breaker would have to reopen. Idle periods advance the ramp: the ramp
//! exists to protect against a backlog, and a destination with no traffic
//! has none. Permanent failures (4xx) are not counted, as in the breaker.

use std::time::Duration;

/// The ramp's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct RampConfig {
    /// The level the ramp starts at (0.1: design §7).
    pub start: f64,
    /// How long a healthy ramp takes from `start` to 100 % (5 min).
    pub period: Duration,
    /// The failure ratio up to which the ramp advances (0.05).
    pub advance_below: f64,
    /// The failure ratio above which the ramp halves (0.25).
    pub reverse_above: f64,
}

impl Default for RampConfig {
    fn default() -> Self {
        Self {
            start: 0.1,
            period: Duration::from_secs(5 * 60),
            advance_below: 0.05,
            reverse_above: 0.25,
        }
    }
}

/// What a period did to the ramp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RampStep {
    /// Not ramping: full admission.
    Idle,
    /// Moved up.
    Advanced,
    /// Reached 100 %: the ramp is over.
    Finished,
    /// Failures slowed it: no progress.
    Held,
    /// Failures reversed it: halved (not below the start).
    Reversed,
}

/// The recovery ramp: a level in `[start, 1]` applied to the destination's
/// rate and concurrency.
#[derive(Debug, Clone, PartialEq)]
pub struct Ramp {
    config: RampConfig,
    /// `None` when not ramping (full admission).
    level: Option<f64>,
}

impl Ramp {
    /// A ramp that is not running.
    pub fn new(config: RampConfig) -> Self {
        Self {
            config,
            level: None,
        }
    }

    /// Starts (or restarts) the ramp at its start level.
    pub fn begin(&mut self) {
        self.level = Some(self.config.start.clamp(0.0, 1.0));
    }

    /// The admission level, 1.0 when not ramping.
    pub fn level(&self) -> f64 {
        self.level.unwrap_or(1.0)
    }

    /// Whether the ramp is running.
    pub fn is_ramping(&self) -> bool {
        self.level.is_some()
    }

    /// Moves the ramp over `elapsed`, during which `successes` and retryable
    /// `failures` were seen.
    pub fn advance(&mut self, elapsed: Duration, successes: u32, failures: u32) -> RampStep {
        let Some(level) = self.level else {
            return RampStep::Idle;
        };
        let c = &self.config;
        let total = f64::from(successes) + f64::from(failures);
        let ratio = if total == 0.0 {
            0.0
        } else {
            f64::from(failures) / total
        };
        if ratio > c.reverse_above {
            self.level = Some((level * 0.5).max(c.start));
            return RampStep::Reversed;
        }
        if ratio > c.advance_below {
            return RampStep::Held;
        }
        let span = c.period.as_secs_f64();
        let step = if span > 0.0 {
            (1.0 - c.start) * elapsed.as_secs_f64() / span
        } else {
            1.0
        };
        let next = level + step;
        if next >= 1.0 - 1e-9 {
            self.level = None;
            RampStep::Finished
        } else {
            self.level = Some(next);
            RampStep::Advanced
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> Ramp {
        let mut r = Ramp::new(RampConfig::default());
        r.begin();
        r
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn it_starts_at_ten_percent_and_reaches_full_after_the_period() {
        let mut r = ramp();
        assert_eq!(r.level(), 0.1);
        for _ in 0..150 {
            assert_eq!(r.advance(SEC, 10, 0), RampStep::Advanced);
        }
        assert!((r.level() - 0.55).abs() < 1e-9, "half-way at 2.5 min");
        for _ in 0..149 {
            r.advance(SEC, 10, 0);
        }
        assert!(r.is_ramping(), "not before 5 min");
        assert_eq!(r.advance(SEC, 10, 0), RampStep::Finished);
        assert!(!r.is_ramping());
        assert_eq!(r.level(), 1.0);
        assert_eq!(r.advance(SEC, 0, 10), RampStep::Idle, "over is over");
    }

    #[test]
    fn failures_slow_or_reverse_it() {
        // (successes, failures, step)
        let table = [
            (100, 0, RampStep::Advanced),
            (95, 5, RampStep::Advanced),  // 5 %
            (94, 6, RampStep::Held),      // 6 %
            (75, 25, RampStep::Held),     // 25 %
            (74, 26, RampStep::Reversed), // 26 %
            (0, 1, RampStep::Reversed),
            (0, 0, RampStep::Advanced), // idle
        ];
        for (ok, failed, want) in table {
            let mut r = ramp();
            r.advance(Duration::from_secs(150), 1, 0); // to 0.55
            let before = r.level();
            assert_eq!(r.advance(SEC, ok, failed), want, "{ok}/{failed}");
            match want {
                RampStep::Held => assert_eq!(r.level(), before),
                RampStep::Reversed => assert!((r.level() - before / 2.0).abs() < 1e-9),
                _ => assert!(r.level() > before),
            }
        }
    }

    #[test]
    fn reversing_never_goes_below_the_start() {
        let mut r = ramp();
        for _ in 0..10 {
            assert_eq!(r.advance(SEC, 0, 10), RampStep::Reversed);
        }
        assert_eq!(r.level(), 0.1);
    }

    #[test]
    fn a_long_idle_gap_finishes_it() {
        let mut r = ramp();
        assert_eq!(
            r.advance(Duration::from_secs(3600), 0, 0),
            RampStep::Finished
        );
    }
}
