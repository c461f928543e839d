//! The circuit breaker of one destination host (design §6, layer 2; R1).
//!
//! ```text
//! closed    → open       ≥ 50 % of ≥ 20 attempts in the last 60 s failed
//! open      → half-open  after a jittered backoff: 30 s, doubling to 30 min
//! half-open → closed     the ONE probe succeeds
//! half-open → open       the probe fails: the next (doubled) backoff
//! ```
//!
//! - **A rate over a minimum volume, never a count**: 19 straight failures do
//!   not open it, because 19 attempts are below the volume at which a ratio
//!   means anything (design §6: "three failures out of five is noise").
//! - **One probe, not a flood**: half-open admits exactly one attempt until
//!   that attempt's result arrives (or it is cancelled).
//! - **Only retryable failures count** (timeouts, connection errors, 5xx,
//!   408/425/429). A permanent failure (another 4xx) counts as *neither*
//!   success nor failure: it proves the host is answering, so it is not a
//!   failure, but it says nothing about whether the host can take load, and
//!   counting it as a success would let a subscription with a bad secret
//!   (fast 401s) dilute a real outage's failure ratio below 50 %. A probe
//!   that gets a 4xx therefore frees the probe slot for another probe.
//! - **Local state, gossip only opens** (R1): [`CircuitBreaker::force_open`]
//!   adopts another node's "opened"; nothing closes a breaker except its own
//!   successful probe, so one lucky probe cannot reopen the gates fleet-wide.
//!
//! The window is 60 one-slot-per-second buckets rather than a log of
//! attempts: memory stays constant at thousands of attempts per second, at
//! the price of 1/60 of the window in precision (an attempt counts for
//! between 59 and 60 s).
//!
//! Attempts are tracked with a [`Ticket`] that carries the breaker's *epoch*
//! (bumped on every open and close). A result that arrives for an attempt
//! started in an earlier epoch — a 30 s timeout that lands after the circuit
//! opened, or after it closed again — is stale and changes nothing, so a late
//! result can never be mistaken for the probe's.

use std::time::Duration;

use serde::Serialize;

use super::{OutcomeKind, after};
use crate::Timestamp;

/// Number of buckets in the sliding window.
const WINDOW_SLOTS: usize = 60;

/// The breaker's thresholds and backoff.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// The sliding window over which failures are counted (60 s, design §6).
    pub window: Duration,
    /// The fewest attempts in the window for the ratio to count (20, design §6).
    pub min_volume: u32,
    /// The failure ratio at or above which the circuit opens (0.5, design §6).
    pub failure_ratio: f64,
    /// The first open period (30 s, design §6).
    pub base_backoff: Duration,
    /// The longest open period (30 min, design §6).
    pub max_backoff: Duration,
    /// How much of the backoff is jitter: the open period is drawn from
    /// `(bound·(1 − jitter), bound]`. 0.2 spreads the probes of many workers
    /// (each probes on its own, R1) over a fifth of the period while keeping
    /// "30 s" meaning roughly 30 s and never exceeding the 30 min cap.
    pub jitter: f64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            min_volume: 20,
            failure_ratio: 0.5,
            base_backoff: Duration::from_secs(30),
            max_backoff: Duration::from_secs(30 * 60),
            jitter: 0.2,
        }
    }
}

/// The breaker's state, as shown on `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    /// Attempts flow; failures are counted.
    Closed,
    /// No attempts until the backoff ends.
    Open,
    /// One probe may go (or has gone and its result is awaited).
    HalfOpen,
}

/// A transition caused by a result or by gossip. The dispatcher publishes
/// [`CircuitTransition::Opened`] to the other nodes (R1); `Closed` is local.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitTransition {
    /// The circuit opened (from closed, or again after a failed probe).
    Opened,
    /// The probe succeeded: the circuit closed and the ramp starts.
    Closed,
}

/// What the breaker lets through now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowance {
    /// Closed: as many as the other layers allow.
    Unlimited,
    /// Half-open and no probe out: exactly one attempt, the probe.
    Probe,
    /// Half-open with the probe out: nothing until its result.
    ProbeInFlight,
    /// Open: nothing until `until`, when it turns half-open.
    Blocked {
        /// When the circuit turns half-open.
        until: Timestamp,
    },
}

/// One started attempt. Hand it back to `on_finish` or `on_cancel`; it is
/// neither `Clone` nor `Copy` so it cannot be finished twice.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an attempt must be finished or cancelled with its ticket"]
pub struct Ticket {
    epoch: u64,
    probe: bool,
}

impl Ticket {
    /// Whether this attempt is the half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Closed,
    Open { until: Timestamp },
    HalfOpen { probe_in_flight: bool },
}

/// The per-host circuit breaker. A plain state machine: every method takes
/// `now`, randomness comes in as `unit` in `[0, 1)`.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    phase: Phase,
    window: Window,
    /// How many times in a row the circuit has opened without closing: the
    /// next open period is `base · 2^level`, capped.
    level: u32,
    epoch: u64,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        let window = Window::new(config.window);
        Self {
            config,
            phase: Phase::Closed,
            window,
            level: 0,
            epoch: 0,
        }
    }

    /// The state at `now` (an open circuit whose backoff has ended reads as
    /// half-open).
    pub fn state(&self, now: Timestamp) -> CircuitState {
        match self.phase_at(now) {
            Phase::Closed => CircuitState::Closed,
            Phase::Open { .. } => CircuitState::Open,
            Phase::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// What the breaker lets through at `now`.
    pub fn allowance(&self, now: Timestamp) -> Allowance {
        match self.phase_at(now) {
            Phase::Closed => Allowance::Unlimited,
            Phase::Open { until } => Allowance::Blocked { until },
            Phase::HalfOpen {
                probe_in_flight: false,
            } => Allowance::Probe,
            Phase::HalfOpen {
                probe_in_flight: true,
            } => Allowance::ProbeInFlight,
        }
    }

    /// When an open circuit turns half-open, if it is open at `now`.
    pub fn reopens_at(&self, now: Timestamp) -> Option<Timestamp> {
        match self.phase_at(now) {
            Phase::Open { until } => Some(until),
            _ => None,
        }
    }

    /// `(failures, attempts)` in the window at `now`.
    pub fn window_counts(&self, now: Timestamp) -> (u32, u32) {
        self.window.counts(now)
    }

    /// The un-jittered length of the open period after `level` consecutive
    /// opens: `min(max_backoff, base_backoff · 2^level)`.
    pub fn backoff_bound(&self, level: u32) -> Duration {
        let factor = 1u32.checked_shl(level).unwrap_or(u32::MAX);
        self.config
            .base_backoff
            .saturating_mul(factor)
            .min(self.config.max_backoff)
    }

    /// Starts an attempt if the breaker allows one: always when closed, the
    /// probe when half-open and none is out, never when open.
    pub fn on_start(&mut self, now: Timestamp) -> Option<Ticket> {
        self.settle(now);
        match self.phase {
            Phase::Closed => Some(Ticket {
                epoch: self.epoch,
                probe: false,
            }),
            Phase::HalfOpen {
                probe_in_flight: false,
            } => {
                self.phase = Phase::HalfOpen {
                    probe_in_flight: true,
                };
                Some(Ticket {
                    epoch: self.epoch,
                    probe: true,
                })
            }
            Phase::HalfOpen {
                probe_in_flight: true,
            }
            | Phase::Open { .. } => None,
        }
    }

    /// Whether `ticket` was started in the current epoch (its result counts).
    pub fn is_current(&self, ticket: &Ticket) -> bool {
        ticket.epoch == self.epoch
    }

    /// Records an attempt's result. `unit` in `[0, 1)` draws the jitter if
    /// this result opens the circuit.
    pub fn on_finish(
        &mut self,
        now: Timestamp,
        ticket: Ticket,
        kind: OutcomeKind,
        unit: f64,
    ) -> Option<CircuitTransition> {
        self.settle(now);
        if !self.is_current(&ticket) {
            return None;
        }
        match self.phase {
            Phase::Closed => {
                let failed = match kind {
                    OutcomeKind::Success => false,
                    OutcomeKind::RetryableFailure => true,
                    OutcomeKind::PermanentFailure => return None,
                };
                self.window.record(now, failed);
                let (failures, total) = self.window.counts(now);
                let tripped = total >= self.config.min_volume
                    && f64::from(failures) >= self.config.failure_ratio * f64::from(total);
                if tripped {
                    self.open(now, unit);
                    return Some(CircuitTransition::Opened);
                }
                None
            }
            Phase::HalfOpen { .. } if ticket.probe => match kind {
                OutcomeKind::Success => {
                    self.phase = Phase::Closed;
                    self.level = 0;
                    self.epoch += 1;
                    self.window.clear();
                    Some(CircuitTransition::Closed)
                }
                OutcomeKind::RetryableFailure => {
                    self.level = self.level.saturating_add(1);
                    self.open(now, unit);
                    Some(CircuitTransition::Opened)
                }
                OutcomeKind::PermanentFailure => {
                    // Neutral: the host answered, but this delivery proves
                    // nothing about load. Let another probe go.
                    self.phase = Phase::HalfOpen {
                        probe_in_flight: false,
                    };
                    None
                }
            },
            // Only the probe is started in a half-open epoch, and nothing in
            // an open one.
            Phase::HalfOpen { .. } | Phase::Open { .. } => None,
        }
    }

    /// Forgets an attempt that ended without a result (shutdown, lost lease).
    /// A cancelled probe frees the probe slot.
    pub fn on_cancel(&mut self, ticket: Ticket) {
        if ticket.probe && self.is_current(&ticket) && matches!(self.phase, Phase::HalfOpen { .. })
        {
            self.phase = Phase::HalfOpen {
                probe_in_flight: false,
            };
        }
    }

    /// Adopts "this host opened" from another node (R1). Opens at the
    /// current backoff level unless already open; returns whether it changed
    /// anything. Attempts in flight become stale.
    pub fn force_open(&mut self, now: Timestamp, unit: f64) -> bool {
        self.settle(now);
        if matches!(self.phase, Phase::Open { .. }) {
            return false;
        }
        self.open(now, unit);
        true
    }

    fn open(&mut self, now: Timestamp, unit: f64) {
        let bound = self.backoff_bound(self.level);
        let jitter = self.config.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        let delay = bound.mul_f64(1.0 - jitter);
        self.phase = Phase::Open {
            until: after(now, delay),
        };
        self.epoch += 1;
        self.window.clear();
    }

    fn phase_at(&self, now: Timestamp) -> Phase {
        match self.phase {
            Phase::Open { until } if now >= until => Phase::HalfOpen {
                probe_in_flight: false,
            },
            p => p,
        }
    }

    fn settle(&mut self, now: Timestamp) {
        self.phase = self.phase_at(now);
    }
}

/// Attempts per second-slot, in a ring indexed by slot number.
#[derive(Debug, Clone)]
struct Window {
    slot_ms: i64,
    slots: [Slot; WINDOW_SLOTS],
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    index: i64,
    ok: u32,
    failed: u32,
}

impl Window {
    fn new(window: Duration) -> Self {
        let ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        Self {
            slot_ms: (ms / WINDOW_SLOTS as i64).max(1),
            slots: [Slot {
                index: i64::MIN,
                ..Slot::default()
            }; WINDOW_SLOTS],
        }
    }

    fn index(&self, now: Timestamp) -> i64 {
        now.timestamp_millis().div_euclid(self.slot_ms)
    }

    fn record(&mut self, now: Timestamp, failed: bool) {
        let index = self.index(now);
        let slot = &mut self.slots[index.rem_euclid(WINDOW_SLOTS as i64) as usize];
        if slot.index != index {
            *slot = Slot {
                index,
                ok: 0,
                failed: 0,
            };
        }
        if failed {
            slot.failed = slot.failed.saturating_add(1);
        } else {
            slot.ok = slot.ok.saturating_add(1);
        }
    }

    fn counts(&self, now: Timestamp) -> (u32, u32) {
        let current = self.index(now);
        let oldest = current - (WINDOW_SLOTS as i64 - 1);
        self.slots
            .iter()
            .filter(|s| s.index >= oldest && s.index <= current)
            .fold((0u32, 0u32), |(f, t), s| {
                (
                    f.saturating_add(s.failed),
                    t.saturating_add(s.ok).saturating_add(s.failed),
                )
            })
    }

    fn clear(&mut self) {
        for s in &mut self.slots {
            s.index = i64::MIN;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::tests::{secs, t0};
    use OutcomeKind::*;
    use proptest::prelude::*;

    fn breaker() -> CircuitBreaker {
        CircuitBreaker::new(BreakerConfig::default())
    }

    /// Runs `n` attempts with result `kind` at `at`.
    fn run(
        b: &mut CircuitBreaker,
        at: Timestamp,
        n: u32,
        kind: OutcomeKind,
    ) -> Vec<CircuitTransition> {
        (0..n)
            .filter_map(|_| {
                let t = b.on_start(at).expect("admitted");
                b.on_finish(at, t, kind, 0.0)
            })
            .collect()
    }

    /// Opens a fresh breaker at t0 with `unit` jitter.
    fn opened(unit: f64) -> CircuitBreaker {
        let mut b = breaker();
        assert!(b.force_open(t0(), unit));
        b
    }

    #[test]
    fn nineteen_failures_do_not_open_it_twenty_do() {
        let mut b = breaker();
        assert!(run(&mut b, t0(), 19, RetryableFailure).is_empty());
        assert_eq!(b.state(t0()), CircuitState::Closed);
        assert_eq!(
            run(&mut b, t0(), 1, RetryableFailure),
            [CircuitTransition::Opened]
        );
        assert_eq!(b.state(t0()), CircuitState::Open);
    }

    #[test]
    fn the_threshold_is_a_ratio_over_a_minimum_volume() {
        // (successes, then failures, opens?)
        let table: &[(u32, u32, bool)] = &[
            (10, 10, true),   // 10/20 = 50 %
            (11, 9, false),   // 9/20 = 45 %
            (11, 10, false),  // 10/21 < 50 %
            (11, 11, true),   // 11/22 = 50 %
            (0, 19, false),   // below the volume
            (100, 99, false), // 99/199 < 50 %
            (100, 100, true),
            (3, 2, false), // "noise on a low-traffic destination"
        ];
        for &(ok, failed, opens) in table {
            let mut b = breaker();
            run(&mut b, t0(), ok, Success);
            run(&mut b, t0(), failed, RetryableFailure);
            assert_eq!(
                b.state(t0()) == CircuitState::Open,
                opens,
                "{ok} successes, {failed} failures"
            );
        }
    }

    #[test]
    fn permanent_failures_count_for_nothing() {
        let mut b = breaker();
        run(&mut b, t0(), 100, PermanentFailure);
        assert_eq!(b.window_counts(t0()), (0, 0));
        // 4xx do not dilute an outage either: 10 failures of 10 counted.
        run(&mut b, t0(), 19, RetryableFailure);
        assert_eq!(
            b.state(t0()),
            CircuitState::Closed,
            "19 is below the volume"
        );
        run(&mut b, t0(), 1, RetryableFailure);
        assert_eq!(b.state(t0()), CircuitState::Open);
    }

    #[test]
    fn old_failures_slide_out_of_the_window() {
        let mut b = breaker();
        run(&mut b, t0(), 15, RetryableFailure);
        // 60 s later those 15 no longer count: 5 more are below the volume.
        let later = t0() + secs(60);
        assert_eq!(b.window_counts(later), (0, 0));
        run(&mut b, later, 5, RetryableFailure);
        assert_eq!(b.state(later), CircuitState::Closed);
        // But 59 s after the first ones they still counted.
        let mut b = breaker();
        run(&mut b, t0(), 15, RetryableFailure);
        let inside = t0() + secs(59);
        assert_eq!(b.window_counts(inside), (15, 15));
        run(&mut b, inside, 5, RetryableFailure);
        assert_eq!(b.state(inside), CircuitState::Open);
    }

    #[test]
    fn open_turns_half_open_after_the_jittered_backoff() {
        for unit in [0.0, 0.5, 0.999] {
            let b = opened(unit);
            let until = b.reopens_at(t0()).unwrap();
            let wait = (until - t0()).to_std().unwrap();
            assert!(
                wait > Duration::from_secs(24) && wait <= Duration::from_secs(30),
                "{wait:?}"
            );
            assert_eq!(b.allowance(until - secs(1)), Allowance::Blocked { until });
            assert_eq!(b.state(until), CircuitState::HalfOpen);
            assert_eq!(b.allowance(until), Allowance::Probe);
        }
    }

    #[test]
    fn half_open_admits_exactly_one_probe() {
        let mut b = opened(0.0);
        let at = t0() + secs(30);
        for _ in 0..5 {
            assert_eq!(b.allowance(at), Allowance::Probe, "asking does not take it");
        }
        let probe = b.on_start(at).expect("the probe");
        assert!(probe.is_probe());
        for i in 0..100 {
            assert_eq!(b.on_start(at + secs(i)), None);
            assert_eq!(b.allowance(at + secs(i)), Allowance::ProbeInFlight);
        }
        // A cancelled probe frees the slot for exactly one more.
        b.on_cancel(probe);
        let again = b.on_start(at).expect("a new probe");
        assert!(again.is_probe());
        assert_eq!(b.on_start(at), None);
    }

    #[test]
    fn probe_failure_doubles_the_backoff_up_to_thirty_minutes() {
        let mut b = opened(0.0);
        let mut now = t0();
        let mut bounds = Vec::new();
        for _ in 0..10 {
            now = b.reopens_at(now).unwrap();
            let probe = b.on_start(now).unwrap();
            assert_eq!(
                b.on_finish(now, probe, RetryableFailure, 0.0),
                Some(CircuitTransition::Opened)
            );
            bounds.push((b.reopens_at(now).unwrap() - now).num_seconds());
        }
        assert_eq!(
            bounds,
            [60, 120, 240, 480, 960, 1800, 1800, 1800, 1800, 1800]
        );
    }

    #[test]
    fn jitter_stays_within_its_bounds_at_every_level() {
        let b = breaker();
        for level in 0..12 {
            let bound = b.backoff_bound(level);
            for unit in [0.0, 0.3, 0.999_999] {
                let mut b = breaker();
                b.level = level;
                b.force_open(t0(), unit);
                let wait = (b.reopens_at(t0()).unwrap() - t0()).to_std().unwrap();
                assert!(
                    wait <= bound && wait >= bound.mul_f64(0.8),
                    "level {level}: {wait:?}"
                );
                assert!(wait <= Duration::from_secs(1800));
            }
        }
    }

    #[test]
    fn probe_success_closes_and_resets_the_backoff() {
        let mut b = opened(0.0);
        let at = t0() + secs(30);
        let probe = b.on_start(at).unwrap();
        let probe2 = {
            // Fail once first to raise the level.
            assert_eq!(
                b.on_finish(at, probe, RetryableFailure, 0.0),
                Some(CircuitTransition::Opened)
            );
            let at = b.reopens_at(at).unwrap();
            (at, b.on_start(at).unwrap())
        };
        let (at, probe) = probe2;
        assert_eq!(
            b.on_finish(at, probe, Success, 0.0),
            Some(CircuitTransition::Closed)
        );
        assert_eq!(b.state(at), CircuitState::Closed);
        assert_eq!(b.window_counts(at), (0, 0), "a fresh window after closing");
        // The next open starts at 30 s again.
        run(&mut b, at, 20, RetryableFailure);
        assert_eq!((b.reopens_at(at).unwrap() - at).num_seconds(), 30);
    }

    #[test]
    fn a_probe_that_gets_a_4xx_lets_another_probe_go() {
        let mut b = opened(0.0);
        let at = t0() + secs(30);
        let probe = b.on_start(at).unwrap();
        assert_eq!(b.on_finish(at, probe, PermanentFailure, 0.0), None);
        assert_eq!(b.allowance(at), Allowance::Probe);
    }

    #[test]
    fn late_results_from_an_earlier_epoch_change_nothing() {
        let mut b = breaker();
        let late: Vec<Ticket> = (0..5).map(|_| b.on_start(t0()).unwrap()).collect();
        run(&mut b, t0(), 20, RetryableFailure);
        assert_eq!(b.state(t0()), CircuitState::Open);
        let at = t0() + secs(30);
        let probe = b.on_start(at).unwrap();
        // The old attempts' successes arrive while the probe is out: not the probe.
        for t in late {
            assert_eq!(b.on_finish(at, t, Success, 0.0), None);
        }
        assert_eq!(b.allowance(at), Allowance::ProbeInFlight);
        assert_eq!(
            b.on_finish(at, probe, Success, 0.0),
            Some(CircuitTransition::Closed)
        );
    }

    #[test]
    fn gossip_opens_but_never_closes() {
        let mut b = breaker();
        assert!(b.force_open(t0(), 0.0));
        assert_eq!(b.state(t0()), CircuitState::Open);
        assert!(
            !b.force_open(t0() + secs(1), 0.0),
            "already open: unchanged"
        );
        assert_eq!(b.reopens_at(t0()), Some(t0() + secs(30)));
        // From half-open it reopens; only our own probe closes it.
        let at = t0() + secs(30);
        let probe = b.on_start(at).unwrap();
        assert!(b.force_open(at, 0.0));
        assert_eq!(b.on_finish(at, probe, Success, 0.0), None, "stale probe");
        assert_eq!(b.state(at), CircuitState::Open);
    }

    proptest! {
        #[test]
        fn never_two_probes_at_once(ops in proptest::collection::vec((0u8..6, 0u64..40), 1..200)) {
            let mut b = opened(0.0);
            let mut now = t0();
            let mut tickets: Vec<Ticket> = Vec::new();
            for (op, dt) in ops {
                now += secs(dt as i64);
                match op {
                    0 | 1 => { if let Some(t) = b.on_start(now) { tickets.push(t); } }
                    2 => { if let Some(t) = tickets.pop() { b.on_finish(now, t, RetryableFailure, 0.5); } }
                    3 => { if let Some(t) = tickets.pop() { b.on_cancel(t); } }
                    4 => { if let Some(t) = tickets.pop() { b.on_finish(now, t, PermanentFailure, 0.5); } }
                    _ => { if let Some(t) = tickets.pop() { b.on_finish(now, t, Success, 0.5); } }
                }
                let live_probes = tickets.iter().filter(|t| t.is_probe() && b.is_current(t)).count();
                prop_assert!(live_probes <= 1);
            }
        }
    }
}
