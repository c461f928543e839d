//! The per-destination rate (design §6, layer 3): a token bucket whose rate
//! follows what the destination demonstrably sustains.
//!
//! # The bucket
//! [`TokenBucket`] answers two questions only: "how many may start now?" and
//! "when is the next token?". A delivery over the rate is not an attempt: the
//! dispatcher simply does not claim it (backpressure, not shedding, §6).
//!
//! It is written here rather than taken from `governor` because `governor`'s
//! design fights this one: its `Quota` is fixed when a limiter is built, so an
//! adaptive rate would mean rebuilding the limiter (and losing its state)
//! every second; it has no "how many are available" query that does not
//! consume (`check_n` takes them); and it keeps time on its own `Clock` of
//! relative nanoseconds, where every other decision here takes a chrono
//! [`Timestamp`]. The bucket itself is thirty lines of arithmetic, tested
//! below (including a property that it never exceeds its capacity).
//!
//! # The adaptive rate
//! [`AdaptiveRate`] sets the bucket's rate from per-period statistics (one
//! period is 1 s by default), MIMD-style:
//! - a period with more than 10 % retryable failures halves the rate (the
//!   same unambiguous overload signal TCP halves on);
//! - a period whose mean success latency climbs above twice its baseline (and
//!   above 100 ms, so a 3 ms → 7 ms wobble is not a signal) multiplies it by
//!   0.8: latency is an earlier, softer signal than failures;
//! - a healthy period in which the rate, not the concurrency cap or a lack
//!   of work, was what limited us (the dispatcher planned for a host with
//!   fewer tokens than free slots, or a start emptied the bucket)
//!   multiplies it by 1.5. Multiplicative rather than additive, so a fast
//!   healthy destination is not throttled far below what it sustains: from
//!   the initial 50/s it reaches 1 000/s in 8 s and the 10 000/s ceiling in
//!   14 s. Additive increase would need a step of hundreds per second to do
//!   the same, which is reckless for a slow destination at 5/s;
//! - a healthy period in which the rate did not limit us leaves it alone:
//!   a ceiling the destination earned is not evidence against it, and
//!   growing an unused ceiling would let a later burst through unthrottled.
//!
//! Bounds default to `[1/s, 10 000/s]`: 10 000/s is the per-host concurrency
//! cap (20) over a 2 ms response, so above it the cap, not the rate, binds.
//!
//! The rate also remembers the last rate at which a period was healthy;
//! after an outage (the circuit closes) the rate restarts from there, so the
//! recovery ramp (§7) starts at 10 % of what the destination used to take,
//! not 10 % of the floor the failures drove it down to.
//!
//! Each worker adapts on its own (R1: local state), so the fleet's total is
//! the sum of per-worker rates; failures shrink all of them together.

use std::time::Duration;

use super::{after, secs_between};
use crate::Timestamp;

/// Tolerance for floating-point token arithmetic.
const EPS: f64 = 1e-9;

/// A token bucket with a changeable rate. Starts full.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Timestamp,
}

impl TokenBucket {
    /// A full bucket refilling at `rate` tokens per second up to `capacity`
    /// (at least one token, so any positive rate can admit something).
    pub fn new(rate: f64, capacity: f64, now: Timestamp) -> Self {
        let capacity = capacity.max(1.0);
        Self {
            rate: rate.max(0.0),
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    /// Tokens per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The (fractional) tokens at `now`.
    pub fn tokens(&self, now: Timestamp) -> f64 {
        (self.tokens + self.rate * secs_between(self.last, now)).min(self.capacity)
    }

    /// How many attempts may start at `now`.
    pub fn available(&self, now: Timestamp) -> u32 {
        // Saturating float → int cast; capacity bounds it anyway.
        (self.tokens(now) + EPS).floor() as u32
    }

    /// Takes `n` tokens if there are that many; returns whether it did.
    pub fn take(&mut self, now: Timestamp, n: u32) -> bool {
        self.refill(now);
        let n = f64::from(n);
        if self.tokens + EPS >= n {
            self.tokens = (self.tokens - n).max(0.0);
            true
        } else {
            false
        }
    }

    /// When the next whole token will be there: `now` if one already is,
    /// `None` if the rate is zero and the bucket is empty.
    pub fn next_token_at(&self, now: Timestamp) -> Option<Timestamp> {
        let tokens = self.tokens(now);
        if tokens + EPS >= 1.0 {
            return Some(now);
        }
        if self.rate <= 0.0 {
            return None;
        }
        let secs = (1.0 - tokens) / self.rate;
        // Round up to the microsecond so the token is surely there.
        let micros = (secs * 1e6).ceil();
        Some(after(now, Duration::from_micros(micros as u64)))
    }

    /// Changes the rate and capacity from `now` on (tokens earned until `now`
    /// at the old rate are kept, down to the new capacity).
    pub fn set_rate(&mut self, now: Timestamp, rate: f64, capacity: f64) {
        self.refill(now);
        self.rate = rate.max(0.0);
        self.capacity = capacity.max(1.0);
        self.tokens = self.tokens.min(self.capacity);
    }

    fn refill(&mut self, now: Timestamp) {
        self.tokens = self.tokens(now);
        if now > self.last {
            self.last = now;
        }
    }
}

/// How the rate adapts, and its bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct RateConfig {
    /// The rate of a destination never seen before (50/s: a 20-slot cap at a
    /// typical 200 ms response sustains 100/s, so this is the right order of
    /// magnitude and one growth step away from it).
    pub initial: f64,
    /// The floor (1/s): even a struggling destination gets a trickle, which
    /// is how it shows it has recovered.
    pub min: f64,
    /// The ceiling (10 000/s; see the module doc).
    pub max: f64,
    /// Growth per healthy period in which the rate was what limited us (1.5).
    pub increase: f64,
    /// Shrink per period with too many failures (0.5).
    pub failure_decrease: f64,
    /// Shrink per period with climbing latency (0.8).
    pub latency_decrease: f64,
    /// Failure ratio in a period above which the rate shrinks (0.1).
    pub failure_threshold: f64,
    /// Mean latency above `baseline × latency_factor` is "climbing" (2.0).
    pub latency_factor: f64,
    /// … but only above this absolute latency (100 ms).
    pub latency_floor: Duration,
    /// Weight of a new period in the latency baseline (0.1: the baseline
    /// follows a lasting change within about ten periods, while a brief
    /// spike still stands out against it).
    pub baseline_weight: f64,
    /// The length of one adaptation period (1 s).
    pub period: Duration,
    /// How much of a second's rate the bucket may hold, i.e. the burst (1 s).
    pub burst: Duration,
}

impl Default for RateConfig {
    fn default() -> Self {
        Self {
            initial: 50.0,
            min: 1.0,
            max: 10_000.0,
            increase: 1.5,
            failure_decrease: 0.5,
            latency_decrease: 0.8,
            failure_threshold: 0.1,
            latency_factor: 2.0,
            latency_floor: Duration::from_millis(100),
            baseline_weight: 0.1,
            period: Duration::from_secs(1),
            burst: Duration::from_secs(1),
        }
    }
}

impl RateConfig {
    /// The bucket capacity for `rate`: `burst` seconds of it, at least one.
    pub fn capacity_for(&self, rate: f64) -> f64 {
        (rate * self.burst.as_secs_f64()).max(1.0)
    }
}

/// What happened in one period, for adapting the rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeriodStats {
    /// Attempts that succeeded.
    pub successes: u32,
    /// Attempts that failed retryably (permanent failures are not counted).
    pub failures: u32,
    /// The summed latency of the successes.
    pub success_latency: Duration,
    /// Whether the rate was what limited starts: a plan found fewer tokens
    /// than free slots, or a start emptied the bucket.
    pub rate_bound: bool,
}

/// What a period did to the rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateChange {
    /// Healthy and rate-bound: multiplied by `increase` (up to `max`).
    Grew,
    /// No change.
    Held,
    /// Too many failures: multiplied by `failure_decrease` (down to `min`).
    ShrankOnFailures,
    /// Latency climbing: multiplied by `latency_decrease` (down to `min`).
    ShrankOnLatency,
}

/// The destination's default rate, following its observed throughput.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveRate {
    config: RateConfig,
    rate: f64,
    healthy_rate: f64,
    /// Baseline mean success latency, in seconds.
    baseline: Option<f64>,
}

impl AdaptiveRate {
    /// Starts at `config.initial`, clamped into the bounds.
    pub fn new(config: RateConfig) -> Self {
        let rate = config.initial.clamp(config.min, config.max);
        Self {
            config,
            rate,
            healthy_rate: rate,
            baseline: None,
        }
    }

    /// The current rate, per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The config.
    pub fn config(&self) -> &RateConfig {
        &self.config
    }

    /// The last rate at which a period was healthy.
    pub fn healthy_rate(&self) -> f64 {
        self.healthy_rate
    }

    /// Goes back to the last healthy rate (on recovery, before the ramp).
    pub fn restore_healthy(&mut self) {
        self.rate = self.healthy_rate;
    }

    /// Adapts to one finished period.
    pub fn end_period(&mut self, stats: &PeriodStats) -> RateChange {
        let c = &self.config;
        let total = stats.successes + stats.failures;
        if total == 0 {
            return RateChange::Held;
        }
        let mean = (stats.successes > 0)
            .then(|| stats.success_latency.as_secs_f64() / f64::from(stats.successes));
        let slow = match (mean, self.baseline) {
            (Some(mean), Some(base)) => {
                mean > (base * c.latency_factor).max(c.latency_floor.as_secs_f64())
            }
            _ => false,
        };
        if let Some(mean) = mean {
            self.baseline = Some(match self.baseline {
                Some(base) => base + c.baseline_weight * (mean - base),
                None => mean,
            });
        }
        let (rate, change) = if f64::from(stats.failures) > c.failure_threshold * f64::from(total) {
            (self.rate * c.failure_decrease, RateChange::ShrankOnFailures)
        } else if slow {
            (self.rate * c.latency_decrease, RateChange::ShrankOnLatency)
        } else {
            self.healthy_rate = self.rate;
            if stats.rate_bound {
                (self.rate * c.increase, RateChange::Grew)
            } else {
                (self.rate, RateChange::Held)
            }
        };
        self.rate = rate.clamp(c.min, c.max);
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::tests::{ms, secs, t0};
    use proptest::prelude::*;

    #[test]
    fn a_bucket_starts_full_and_never_exceeds_capacity() {
        let b = TokenBucket::new(10.0, 5.0, t0());
        assert_eq!(b.available(t0()), 5);
        assert_eq!(b.available(t0() + secs(3600)), 5);
    }

    #[test]
    fn a_bucket_refills_at_its_rate() {
        let mut b = TokenBucket::new(10.0, 10.0, t0());
        assert!(b.take(t0(), 10));
        assert!(!b.take(t0(), 1));
        // (elapsed ms, available)
        for (at, want) in [(0, 0), (99, 0), (100, 1), (250, 2), (1000, 10), (5000, 10)] {
            assert_eq!(b.available(t0() + ms(at)), want, "after {at} ms");
        }
        assert_eq!(b.next_token_at(t0()), Some(t0() + ms(100)));
        assert!(b.take(t0() + ms(100), 1));
        assert_eq!(b.next_token_at(t0() + ms(100)), Some(t0() + ms(200)));
    }

    #[test]
    fn a_zero_rate_never_refills() {
        let mut b = TokenBucket::new(0.0, 1.0, t0());
        assert!(b.take(t0(), 1));
        assert_eq!(b.next_token_at(t0()), None);
        assert_eq!(b.available(t0() + secs(1000)), 0);
    }

    #[test]
    fn changing_the_rate_keeps_earned_tokens_down_to_the_new_capacity() {
        let mut b = TokenBucket::new(100.0, 100.0, t0());
        assert!(b.take(t0(), 100));
        b.set_rate(t0() + ms(500), 10.0, 10.0);
        assert_eq!(b.available(t0() + ms(500)), 10, "50 earned, capped at 10");
        assert!(b.take(t0() + ms(500), 10));
        assert_eq!(b.available(t0() + ms(1000)), 5, "refills at the new rate");
    }

    fn healthy(rate_bound: bool) -> PeriodStats {
        PeriodStats {
            successes: 100,
            failures: 0,
            success_latency: Duration::from_millis(100 * 20),
            rate_bound,
        }
    }

    #[test]
    fn the_rate_grows_only_when_healthy_and_rate_bound() {
        let mut r = AdaptiveRate::new(RateConfig::default());
        assert_eq!(r.end_period(&healthy(false)), RateChange::Held);
        assert_eq!(r.rate(), 50.0);
        assert_eq!(r.end_period(&PeriodStats::default()), RateChange::Held);
        assert_eq!(r.end_period(&healthy(true)), RateChange::Grew);
        assert_eq!(r.rate(), 75.0);
    }

    #[test]
    fn a_fast_healthy_destination_reaches_thousands_per_second_within_seconds() {
        let mut r = AdaptiveRate::new(RateConfig::default());
        let mut periods = 0;
        while r.rate() < 1000.0 {
            r.end_period(&healthy(true));
            periods += 1;
        }
        assert_eq!(periods, 8, "1 s periods: 1 000/s within 8 s");
        while r.rate() < 10_000.0 {
            r.end_period(&healthy(true));
            periods += 1;
        }
        assert_eq!(periods, 14);
        r.end_period(&healthy(true));
        assert_eq!(r.rate(), 10_000.0, "capped at max");
    }

    #[test]
    fn the_rate_shrinks_on_failures_and_on_climbing_latency_down_to_the_floor() {
        let cfg = RateConfig::default();
        let mut r = AdaptiveRate::new(RateConfig {
            initial: 1000.0,
            ..cfg.clone()
        });
        r.end_period(&healthy(false)); // baseline 20 ms
        let failing = PeriodStats {
            successes: 80,
            failures: 20,
            success_latency: ms_total(80, 20),
            rate_bound: true,
        };
        assert_eq!(r.end_period(&failing), RateChange::ShrankOnFailures);
        assert_eq!(r.rate(), 500.0);
        // 10 % exactly is tolerated.
        let tolerable = PeriodStats {
            successes: 90,
            failures: 10,
            ..failing
        };
        assert_eq!(r.end_period(&tolerable), RateChange::Grew);
        assert_eq!(r.rate(), 750.0);
        // Latency 20 ms → 400 ms: climbing.
        let slow = PeriodStats {
            successes: 100,
            failures: 0,
            success_latency: ms_total(100, 400),
            rate_bound: true,
        };
        assert_eq!(r.end_period(&slow), RateChange::ShrankOnLatency);
        assert_eq!(r.rate(), 600.0);
        for _ in 0..100 {
            r.end_period(&PeriodStats {
                successes: 0,
                failures: 5,
                ..PeriodStats::default()
            });
        }
        assert_eq!(r.rate(), cfg.min);
        // After failures, the healthy rate is remembered for recovery.
        // (500/s: the 750/s it grew to was never shown to be healthy.)
        assert_eq!(r.healthy_rate(), 500.0);
        r.restore_healthy();
        assert_eq!(r.rate(), 500.0);
    }

    #[test]
    fn small_latency_wobbles_below_the_floor_are_not_a_signal() {
        let mut r = AdaptiveRate::new(RateConfig::default());
        r.end_period(&PeriodStats {
            successes: 10,
            success_latency: ms_total(10, 3),
            ..PeriodStats::default()
        });
        // 3 ms → 30 ms is 10× but under 100 ms.
        let wobble = PeriodStats {
            successes: 10,
            success_latency: ms_total(10, 30),
            rate_bound: true,
            ..PeriodStats::default()
        };
        assert_eq!(r.end_period(&wobble), RateChange::Grew);
    }

    #[test]
    fn a_lasting_latency_shift_is_absorbed_into_the_baseline() {
        let mut r = AdaptiveRate::new(RateConfig {
            initial: 1000.0,
            ..RateConfig::default()
        });
        r.end_period(&PeriodStats {
            successes: 10,
            success_latency: ms_total(10, 50),
            ..PeriodStats::default()
        });
        let slow = PeriodStats {
            successes: 10,
            success_latency: ms_total(10, 500),
            rate_bound: true,
            ..PeriodStats::default()
        };
        let changes: Vec<RateChange> = (0..10).map(|_| r.end_period(&slow)).collect();
        assert_eq!(changes[0], RateChange::ShrankOnLatency);
        assert_eq!(changes[9], RateChange::Grew, "{changes:?}");
    }

    fn ms_total(n: u32, each_ms: u64) -> Duration {
        Duration::from_millis(each_ms) * n
    }

    #[test]
    fn ms_helper_is_consistent() {
        assert_eq!(t0() + ms(1000), t0() + secs(1));
    }

    proptest! {
        #[test]
        fn a_bucket_never_exceeds_capacity(
            rate in 0.0f64..5000.0,
            cap in 1.0f64..500.0,
            ops in proptest::collection::vec((0u64..3_000, 0u32..50, any::<bool>()), 1..100),
        ) {
            let mut b = TokenBucket::new(rate, cap, t0());
            let mut now = t0();
            for (dt, n, change) in ops {
                now += ms(dt as i64);
                if change {
                    b.set_rate(now, f64::from(n) * 10.0, f64::from(n));
                }
                let _ = b.take(now, n);
                prop_assert!(b.tokens(now) <= b.capacity() + EPS);
                prop_assert!(b.tokens(now) >= 0.0);
                prop_assert!(f64::from(b.available(now)) <= b.capacity() + EPS);
            }
        }

        #[test]
        fn the_rate_stays_within_its_bounds(
            periods in proptest::collection::vec((0u32..200, 0u32..200, 0u64..2_000, any::<bool>()), 1..100),
        ) {
            let cfg = RateConfig::default();
            let mut r = AdaptiveRate::new(cfg.clone());
            for (ok, failed, lat, bound) in periods {
                r.end_period(&PeriodStats { successes: ok, failures: failed, success_latency: Duration::from_millis(lat) * ok, rate_bound: bound });
                prop_assert!(r.rate() >= cfg.min && r.rate() <= cfg.max);
            }
        }
    }
}
