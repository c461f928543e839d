//! Per-destination isolation: the decisions that keep one struggling
//! destination from taking the fleet down, or being made worse by us
//! (design §6, §7 "the recovery flood", R1, R2, R4).
//!
//! Each layer answers a different failure mode (§6), and each is a plain
//! state machine of `(state, now, input)` here; the dispatcher owns one
//! [`DestinationAdmission`] per destination host and does the I/O.
//!
//! | layer                    | module        | bounds                                  |
//! |--------------------------|---------------|-----------------------------------------|
//! | 1. concurrency cap (20)  | here          | slots a slow host can occupy            |
//! | 2. circuit breaker       | [`breaker`]   | attempts wasted on (and load added to) a failing host |
//! | 3. adaptive token bucket | [`rate`]      | the rate we offer even a healthy host   |
//! | recovery ramp (§7)       | [`ramp`]      | the flood when a host comes back        |
//! | fair share (R2)          | [`share`]     | one subscription hogging a shared host  |
//! | backlog floor (R4)       | [`share`]     | a backlog starved by new work           |
//! | node share (issue 8)     | [`nodes`]     | N nodes each taking the whole cap       |
//!
//! (Layer 4, shard containment, is the store's; whether a hot-shard split
//! may run now — never during a failure, R5 — is [`split`]'s rule.)
//!
//! # How the dispatcher uses it
//! 1. [`DestinationAdmission::available`] before claiming: how many attempts
//!    may start now (cap − in flight, breaker, bucket and ramp together),
//!    whether the one slot is the half-open probe, and when to ask again.
//! 2. [`fair_share`] and [`backlog_split`] divide those slots between the
//!    host's subscriptions and between oldest-first and newest-first claims.
//! 3. [`DestinationAdmission::on_start`] for each claimed row, just before
//!    sending. It re-checks (another task may have opened the circuit since
//!    `available`) and returns a [`Ticket`], or `None`: release the row.
//! 4. [`DestinationAdmission::on_finish`] with the ticket and the outcome,
//!    for every started attempt; [`DestinationAdmission::on_cancel`] if it
//!    ended with no result (shutdown, lost lease). A returned
//!    [`CircuitTransition::Opened`] is published to the other nodes, whose
//!    dispatchers call [`DestinationAdmission::force_open`] (R1).
//!
//! `on_start` returns a ticket (the brief sketched `on_start(now)` with no
//! return) so that a result is tied to the attempt it belongs to: the probe
//! is recognised as the probe, and a result from before the circuit opened
//! or closed cannot be mistaken for a current one.
//!
//! Randomness (the breaker's jitter) is drawn only when a circuit opens, so
//! `unit` is an argument of the calls that can open it (`on_finish`,
//! `force_open`), not of `available`.

pub mod breaker;
pub mod nodes;
pub mod ramp;
pub mod rate;
pub mod share;
pub mod split;

use std::time::Duration;

use serde::Serialize;

pub use breaker::{
    Allowance, BreakerConfig, CircuitBreaker, CircuitState, CircuitTransition, Ticket,
};
pub use nodes::node_share;
pub use ramp::{Ramp, RampConfig, RampStep};
pub use rate::{AdaptiveRate, PeriodStats, RateChange, RateConfig, TokenBucket};
pub use share::{BACKLOG_FLOOR, BacklogInput, SubscriptionLoad, backlog_split, fair_share};
pub use split::{RecentAttempts, SPLIT_MAX_FAILURE_PERCENT, SPLIT_MIN_ATTEMPTS, split_refusal};

use crate::Timestamp;

/// Deliveries that may wait claimed ahead, per slot of a destination's cap
/// ([`DestinationAdmission::lookahead`]): enough to cover a claim pass at a
/// fast destination (256 slots at 1 ms answers drain 256 in a few ms; a
/// pass on PostgreSQL takes 30–40 ms).
pub const LOOKAHEAD_PER_SLOT: u32 = 4;

/// How an attempt ended, as far as isolation cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// A 2xx.
    Success,
    /// A timeout, connection error, 5xx, 408, 425 or 429: counts against the
    /// destination.
    RetryableFailure,
    /// Any other 4xx, a redirect, 410: the destination answered; this
    /// delivery is wrong, not the destination overloaded. Counts for neither
    /// side (see [`breaker`]).
    PermanentFailure,
}

impl OutcomeKind {
    /// Maps a [`Verdict`](crate::classify::Verdict) to an outcome.
    pub fn from_verdict(verdict: crate::classify::Verdict) -> Self {
        use crate::classify::Verdict;
        match verdict {
            Verdict::Delivered => Self::Success,
            Verdict::Retry { .. } => Self::RetryableFailure,
            Verdict::Fail | Verdict::Gone => Self::PermanentFailure,
        }
    }
}

/// One finished attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// How it ended.
    pub kind: OutcomeKind,
    /// From sending the request to the end of the response (or the error).
    pub latency: Duration,
}

/// The settings of one destination's admission.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// The most attempts in flight to the host (20, design §6 layer 1).
    pub concurrency: u32,
    /// The circuit breaker.
    pub breaker: BreakerConfig,
    /// The adaptive rate and its bounds.
    pub rate: RateConfig,
    /// The recovery ramp.
    pub ramp: RampConfig,
    /// An explicit rate (per second) that replaces the adaptive one.
    pub rate_override: Option<f64>,
}

impl Default for AdmissionConfig {
    /// The design's numbers (§6, §7); see each part's doc for why.
    fn default() -> Self {
        Self {
            concurrency: 20,
            breaker: BreakerConfig::default(),
            rate: RateConfig::default(),
            ramp: RampConfig::default(),
            rate_override: None,
        }
    }
}

/// The answer to "how many attempts may start now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admit {
    /// How many attempts may start now.
    pub slots: u32,
    /// Whether the (single) slot is the half-open probe.
    pub probe: bool,
    /// When asking again could give more: the next token, or the end of the
    /// open period. `None` when only a finishing attempt can free a slot (or
    /// when `slots > 0`).
    pub next_check: Option<Timestamp>,
}

/// A destination's isolation state, for `/health` and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DestinationSnapshot {
    /// The breaker's state.
    pub circuit_state: CircuitState,
    /// When an open circuit turns half-open.
    pub reopens_at: Option<Timestamp>,
    /// Attempts in flight.
    pub in_flight: u32,
    /// The concurrency limit now (the cap, ramped).
    pub concurrency_limit: u32,
    /// The rate admitted now, per second (the base rate, ramped).
    pub rate_per_sec: f64,
    /// The rate before the ramp: the explicit one, or the adaptive one.
    pub base_rate_per_sec: f64,
    /// The recovery ramp's level in `[0.1, 1]`; 1 when not ramping.
    pub ramp_level: f64,
    /// Retryable failures in the breaker's window.
    pub window_failures: u32,
    /// Attempts in the breaker's window.
    pub window_attempts: u32,
}

/// All the isolation layers of one destination host, composed.
#[derive(Debug, Clone)]
pub struct DestinationAdmission {
    config: AdmissionConfig,
    in_flight: u32,
    breaker: CircuitBreaker,
    rate: AdaptiveRate,
    bucket: TokenBucket,
    ramp: Ramp,
    period_start: Timestamp,
    period: PeriodStats,
}

impl DestinationAdmission {
    /// A destination first seen at `now`: closed, not ramping, at the initial
    /// (or explicit) rate with a full bucket.
    pub fn new(config: AdmissionConfig, now: Timestamp) -> Self {
        let rate = AdaptiveRate::new(config.rate.clone());
        let base = config.rate_override.unwrap_or(rate.rate());
        let bucket = TokenBucket::new(base, config.rate.capacity_for(base), now);
        Self {
            breaker: CircuitBreaker::new(config.breaker.clone()),
            ramp: Ramp::new(config.ramp.clone()),
            config,
            in_flight: 0,
            rate,
            bucket,
            period_start: now,
            period: PeriodStats::default(),
        }
    }

    /// How many attempts may start now. Call it when the host has due work;
    /// asking does not take anything.
    pub fn available(&mut self, now: Timestamp) -> Admit {
        self.roll(now);
        let free = self.concurrency_limit().saturating_sub(self.in_flight);
        let none = |next_check| Admit {
            slots: 0,
            probe: false,
            next_check,
        };
        match self.breaker.allowance(now) {
            Allowance::Blocked { until } => none(Some(until)),
            Allowance::ProbeInFlight => none(None),
            // The probe ignores the bucket (it refilled while the circuit was
            // open, and one request is one request) but not the cap: stale
            // attempts from before the open still hold their slots.
            Allowance::Probe if free > 0 => Admit {
                slots: 1,
                probe: true,
                next_check: None,
            },
            Allowance::Probe => none(None),
            Allowance::Unlimited => {
                let tokens = self.bucket.available(now);
                // The rate, not the cap, is what limits this host now: the
                // period counts as rate-bound. Checked here, where the
                // dispatcher plans, and not only when a start empties the
                // bucket: starts come a claim's round trip after the plan,
                // by when the bucket has refilled a little, so a host the
                // rate held back pass after pass never looked dry there and
                // its rate never grew (the `fanout` benchmark's 100 hosts
                // all stayed at the initial 50/s).
                if tokens < free {
                    self.period.rate_bound = true;
                }
                let slots = free.min(tokens);
                let next_check = if slots == 0 && free > 0 {
                    self.bucket.next_token_at(now)
                } else {
                    None
                };
                Admit {
                    slots,
                    probe: false,
                    next_check,
                }
            }
        }
    }

    /// How many deliveries may be claimed *ahead* of a free slot (§9.1), to
    /// wait in memory and start the moment an attempt here finishes, so a
    /// busy destination's slots do not sit idle through the claim's round
    /// trip. Only while it is [`healthy`](Self::healthy), never more than
    /// [`LOOKAHEAD_PER_SLOT`] times the cap, and only as many as the bucket
    /// holds tokens for beyond the free slots: a destination the rate or
    /// the breaker holds back gets nothing ahead,
    /// and nothing waiting makes more requests than admission allows, since
    /// each still needs [`on_start`](Self::on_start). Asking takes nothing.
    pub fn lookahead(&mut self, now: Timestamp) -> u32 {
        if !self.healthy(now) {
            return 0;
        }
        let limit = self.concurrency_limit();
        let free = limit.saturating_sub(self.in_flight);
        self.bucket
            .available(now)
            .saturating_sub(free)
            .min(limit.saturating_mul(LOOKAHEAD_PER_SLOT))
    }

    /// How many new deliveries may be claimed for this destination at
    /// ingest, to start the moment their commit is in: as many as it has
    /// free slots and the bucket has tokens, and only while it is
    /// [`healthy`](Self::healthy). Nothing beyond the free slots: what could
    /// only wait goes to the store, where every worker node can claim it
    /// (claiming ahead is the claim loop's, which shares the host's cap
    /// among the nodes). Each still needs [`on_start`](Self::on_start).
    /// Asking takes nothing.
    pub fn ingest_room(&mut self, now: Timestamp) -> u32 {
        if !self.healthy(now) {
            return 0;
        }
        let free = self.concurrency_limit().saturating_sub(self.in_flight);
        self.bucket.available(now).min(free)
    }

    /// Whether deliveries may be claimed ahead for this destination, and
    /// keep waiting for it: its circuit is closed and no attempt failed in
    /// the breaker's window. A struggling destination gets its next attempt
    /// at the claim loop's pace, never the instant a slot frees (a timed-out
    /// request's connection may not even be closed at its end yet).
    pub fn healthy(&mut self, now: Timestamp) -> bool {
        self.roll(now);
        self.breaker.allowance(now) == Allowance::Unlimited
            && self.breaker.window_counts(now).0 == 0
    }

    /// Starts one attempt: takes a slot (and a token, or the probe). `None`
    /// means it may not start: do not send, release the row.
    pub fn on_start(&mut self, now: Timestamp) -> Option<Ticket> {
        self.roll(now);
        if self.in_flight >= self.concurrency_limit() {
            return None;
        }
        let ticket = match self.breaker.allowance(now) {
            Allowance::Probe => {
                let _ = self.bucket.take(now, 1);
                self.breaker.on_start(now)?
            }
            Allowance::Unlimited => {
                if !self.bucket.take(now, 1) {
                    return None;
                }
                if self.bucket.available(now) == 0 {
                    self.period.rate_bound = true;
                }
                self.breaker.on_start(now)?
            }
            Allowance::ProbeInFlight | Allowance::Blocked { .. } => return None,
        };
        self.in_flight += 1;
        Some(ticket)
    }

    /// Records a started attempt's result. `unit` in `[0, 1)` draws the
    /// breaker's jitter if this opens the circuit. Returns the breaker's
    /// transition, if any: publish `Opened` to the other nodes (R1).
    pub fn on_finish(
        &mut self,
        now: Timestamp,
        ticket: Ticket,
        outcome: AttemptOutcome,
        unit: f64,
    ) -> Option<CircuitTransition> {
        self.roll(now);
        self.in_flight = self.in_flight.saturating_sub(1);
        let current = self.breaker.is_current(&ticket) && !ticket.is_probe();
        let transition = self.breaker.on_finish(now, ticket, outcome.kind, unit);
        match transition {
            Some(CircuitTransition::Closed) => self.recover(now),
            Some(CircuitTransition::Opened) => {}
            None if current => match outcome.kind {
                OutcomeKind::Success => {
                    self.period.successes += 1;
                    self.period.success_latency += outcome.latency;
                }
                OutcomeKind::RetryableFailure => self.period.failures += 1,
                OutcomeKind::PermanentFailure => {}
            },
            None => {}
        }
        transition
    }

    /// Forgets a started attempt that ended without a result (shutdown, lost
    /// lease): frees its slot, and the probe slot if it was the probe.
    pub fn on_cancel(&mut self, now: Timestamp, ticket: Ticket) {
        self.roll(now);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.breaker.on_cancel(ticket);
    }

    /// Adopts another node's "this host opened" (R1). Returns whether it
    /// changed anything (do not re-publish it either way).
    pub fn force_open(&mut self, now: Timestamp, unit: f64) -> bool {
        self.roll(now);
        self.breaker.force_open(now, unit)
    }

    /// Sets or clears an explicit rate (per second), which replaces the
    /// adaptive one (the ramp still applies after recovery).
    pub fn set_rate_override(&mut self, now: Timestamp, rate: Option<f64>) {
        self.roll(now);
        self.config.rate_override = rate;
        self.apply_rate(now);
    }

    /// Sets the concurrency cap: a subscription's `max_concurrency` at this
    /// host, or the configured default when none sets one. Attempts already
    /// in flight above a lowered cap finish; no new one starts until the
    /// host is under it again.
    pub fn set_concurrency(&mut self, concurrency: u32) {
        self.config.concurrency = concurrency.max(1);
    }

    /// The state at `now`, for `/health` and metrics.
    pub fn snapshot(&self, now: Timestamp) -> DestinationSnapshot {
        let (window_failures, window_attempts) = self.breaker.window_counts(now);
        DestinationSnapshot {
            circuit_state: self.breaker.state(now),
            reopens_at: self.breaker.reopens_at(now),
            in_flight: self.in_flight,
            concurrency_limit: self.concurrency_limit(),
            rate_per_sec: self.bucket.rate(),
            base_rate_per_sec: self.base_rate(),
            ramp_level: self.ramp.level(),
            window_failures,
            window_attempts,
        }
    }

    /// The concurrency limit now: the cap times the ramp level, rounded up,
    /// at least one.
    pub fn concurrency_limit(&self) -> u32 {
        let cap = f64::from(self.config.concurrency);
        ((cap * self.ramp.level()).ceil() as u32)
            .clamp(1.min(self.config.concurrency), self.config.concurrency)
    }

    fn base_rate(&self) -> f64 {
        self.config.rate_override.unwrap_or(self.rate.rate())
    }

    /// The circuit closed after a successful probe: go back to the last
    /// healthy rate and start the ramp from 10 % of it (§7).
    fn recover(&mut self, now: Timestamp) {
        self.rate.restore_healthy();
        self.ramp.begin();
        self.period = PeriodStats::default();
        self.period_start = now;
        self.apply_rate(now);
    }

    fn apply_rate(&mut self, now: Timestamp) {
        let rate = self.base_rate() * self.ramp.level();
        self.bucket
            .set_rate(now, rate, self.config.rate.capacity_for(rate));
    }

    /// Closes the periods that ended by `now`: the first holds the counts,
    /// the rest were idle. While ramping, the ramp reacts (and the rate is
    /// left alone, as the ramp, not the rate, limited the period); after,
    /// the adaptive rate does. Nothing adapts while the circuit is not
    /// closed.
    fn roll(&mut self, now: Timestamp) {
        let len = self.config.rate.period.max(Duration::from_millis(1));
        let elapsed = secs_between(self.period_start, now);
        let periods = (elapsed / len.as_secs_f64()).floor();
        if periods < 1.0 {
            return;
        }
        let stats = std::mem::take(&mut self.period);
        let closed = self.breaker.state(now) == CircuitState::Closed;
        if closed {
            if self.ramp.is_ramping() {
                self.ramp.advance(len, stats.successes, stats.failures);
                if periods > 1.0 {
                    self.ramp.advance(len.mul_f64(periods - 1.0), 0, 0);
                }
            } else if self.config.rate_override.is_none() {
                self.rate.end_period(&stats);
            }
        }
        self.period_start = after(self.period_start, len.mul_f64(periods));
        self.apply_rate(now);
    }
}

/// Seconds from `from` to `to`, never negative (a clock that went back reads
/// as no time).
pub(crate) fn secs_between(from: Timestamp, to: Timestamp) -> f64 {
    let us = (to - from).num_microseconds().unwrap_or(i64::MAX);
    (us.max(0) as f64) / 1e6
}

/// `at + d`, saturating at the end of time.
pub(crate) fn after(at: Timestamp, d: Duration) -> Timestamp {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn t0() -> Timestamp {
        chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    pub(crate) fn secs(s: i64) -> chrono::Duration {
        chrono::Duration::seconds(s)
    }

    pub(crate) fn ms(m: i64) -> chrono::Duration {
        chrono::Duration::milliseconds(m)
    }

    use proptest::prelude::*;

    const OK: AttemptOutcome = AttemptOutcome {
        kind: OutcomeKind::Success,
        latency: Duration::from_millis(20),
    };
    const FAIL: AttemptOutcome = AttemptOutcome {
        kind: OutcomeKind::RetryableFailure,
        latency: Duration::from_secs(30),
    };
    const PERMANENT: AttemptOutcome = AttemptOutcome {
        kind: OutcomeKind::PermanentFailure,
        latency: Duration::from_millis(5),
    };

    fn admission() -> DestinationAdmission {
        DestinationAdmission::new(AdmissionConfig::default(), t0())
    }

    /// Starts and finishes `n` attempts at `at` with `outcome`; returns the
    /// transitions.
    fn run(
        a: &mut DestinationAdmission,
        at: Timestamp,
        n: u32,
        outcome: AttemptOutcome,
    ) -> Vec<CircuitTransition> {
        let tickets: Vec<Ticket> = (0..n).map(|_| a.on_start(at).expect("admitted")).collect();
        tickets
            .into_iter()
            .filter_map(|t| a.on_finish(at, t, outcome, 0.0))
            .collect()
    }

    /// Opens `a`'s circuit at `at` and lets its probe succeed; returns when.
    fn open_then_recover(a: &mut DestinationAdmission, at: Timestamp) -> Timestamp {
        assert!(a.force_open(at, 0.0));
        let probe_at = a.available(at).next_check.expect("reopen time");
        let admit = a.available(probe_at);
        assert_eq!((admit.slots, admit.probe), (1, true));
        let probe = a.on_start(probe_at).unwrap();
        assert_eq!(
            a.on_finish(probe_at, probe, OK, 0.0),
            Some(CircuitTransition::Closed)
        );
        probe_at
    }

    #[test]
    fn a_fresh_destination_admits_up_to_its_cap() {
        let mut a = admission();
        assert_eq!(
            a.available(t0()),
            Admit {
                slots: 20,
                probe: false,
                next_check: None
            }
        );
        let tickets: Vec<Ticket> = (0..20).map(|_| a.on_start(t0()).unwrap()).collect();
        assert_eq!(a.on_start(t0()), None, "the 21st is refused");
        assert_eq!(
            a.available(t0()),
            Admit {
                slots: 0,
                probe: false,
                next_check: None
            },
            "only a finish frees a slot"
        );
        let mut tickets = tickets.into_iter();
        a.on_finish(t0(), tickets.next().unwrap(), OK, 0.0);
        a.on_cancel(t0(), tickets.next().unwrap());
        assert_eq!(a.available(t0()).slots, 2);
        assert_eq!(a.snapshot(t0()).in_flight, 18);
    }

    /// A destination at a fixed `rate`, first seen at `t0`.
    fn with_rate(rate: f64) -> DestinationAdmission {
        DestinationAdmission::new(
            AdmissionConfig {
                rate_override: Some(rate),
                ..Default::default()
            },
            t0(),
        )
    }

    #[test]
    fn only_a_healthy_destination_with_tokens_to_spare_claims_ahead() {
        // 1,000 tokens, 20 free slots: four times the cap may wait ahead.
        let mut a = with_rate(1_000.0);
        assert_eq!(a.lookahead(t0()), 20 * LOOKAHEAD_PER_SLOT);
        let tickets: Vec<Ticket> = (0..20).map(|_| a.on_start(t0()).unwrap()).collect();
        assert_eq!(
            a.lookahead(t0()),
            20 * LOOKAHEAD_PER_SLOT,
            "the cap is full; tokens are left"
        );
        for t in tickets {
            a.on_finish(t0(), t, OK, 0.0);
        }
        // 50 tokens: 20 go to the free slots, 30 may wait.
        assert_eq!(with_rate(50.0).lookahead(t0()), 30);
        // 5 tokens, all needed by the free slots.
        assert_eq!(with_rate(5.0).lookahead(t0()), 0, "the rate binds");
        // One failure in the window: nothing ahead while it counts.
        run(&mut a, t0(), 1, FAIL);
        assert_eq!(a.lookahead(t0()), 0, "a failing destination");
        assert!(!a.healthy(t0()));
        let mut a = with_rate(1_000.0);
        assert!(a.healthy(t0()));
        // An open circuit, and its probe: nothing ahead.
        assert!(a.force_open(t0(), 0.0));
        assert_eq!(a.lookahead(t0()), 0);
        let probe_at = a.available(t0()).next_check.unwrap();
        assert_eq!(a.lookahead(probe_at), 0, "half-open: only the probe goes");
    }

    #[test]
    fn ingest_claims_only_what_can_start_now_while_healthy() {
        // 1,000 tokens, 20 free slots: the free slots.
        let mut a = with_rate(1_000.0);
        assert_eq!(a.ingest_room(t0()), 20);
        let tickets: Vec<Ticket> = (0..15).map(|_| a.on_start(t0()).unwrap()).collect();
        assert_eq!(a.ingest_room(t0()), 5, "what is left of the cap");
        let more: Vec<Ticket> = (0..5).map(|_| a.on_start(t0()).unwrap()).collect();
        assert_eq!(
            a.ingest_room(t0()),
            0,
            "a full cap: nothing waits from ingest"
        );
        for t in tickets.into_iter().chain(more) {
            a.on_finish(t0(), t, OK, 0.0);
        }
        // 5 tokens: the rate binds, free slots or not.
        assert_eq!(with_rate(5.0).ingest_room(t0()), 5);
        let mut dry = with_rate(5.0);
        run(&mut dry, t0(), 5, OK);
        assert_eq!(dry.ingest_room(t0()), 0, "no token, no claim");
        assert_eq!(dry.ingest_room(t0() + ms(200)), 1, "one token later");
        // A failure in the breaker's window, or an open circuit: nothing.
        run(&mut a, t0(), 1, FAIL);
        assert_eq!(a.ingest_room(t0()), 0, "a failing destination");
        let mut a = with_rate(1_000.0);
        assert!(a.force_open(t0(), 0.0));
        assert_eq!(a.ingest_room(t0()), 0, "an open circuit");
        let probe_at = a.available(t0()).next_check.unwrap();
        assert_eq!(a.ingest_room(probe_at), 0, "half-open: only the probe goes");
    }

    #[test]
    fn the_bucket_limits_starts_and_says_when_the_next_token_comes() {
        let mut a = DestinationAdmission::new(
            AdmissionConfig {
                rate_override: Some(5.0),
                ..Default::default()
            },
            t0(),
        );
        assert_eq!(a.available(t0()).slots, 5, "one second of burst");
        run(&mut a, t0(), 5, OK);
        assert_eq!(
            a.available(t0()),
            Admit {
                slots: 0,
                probe: false,
                next_check: Some(t0() + ms(200))
            }
        );
        assert_eq!(a.on_start(t0()), None, "over the rate is not an attempt");
        assert_eq!(a.available(t0() + ms(200)).slots, 1);
    }

    #[test]
    fn an_explicit_rate_wins_over_the_adaptive_one() {
        let mut a = DestinationAdmission::new(
            AdmissionConfig {
                rate_override: Some(5.0),
                ..Default::default()
            },
            t0(),
        );
        let mut now = t0();
        for _ in 0..60 {
            let n = a.available(now).slots;
            run(&mut a, now, n, OK);
            now += secs(1);
        }
        assert_eq!(
            a.snapshot(now).rate_per_sec,
            5.0,
            "healthy and rate-bound, yet fixed"
        );
        a.set_rate_override(now, None);
        assert_eq!(
            a.snapshot(now).rate_per_sec,
            50.0,
            "back to the adaptive rate"
        );
    }

    #[test]
    fn a_fast_healthy_destination_is_not_throttled_for_long() {
        // Every 10 ms, start everything admitted; each answers in 2 ms.
        let mut a = admission();
        let mut now = t0();
        let mut delivered = 0u64;
        for _ in 0..2_000 {
            let n = a.available(now).slots;
            let tickets: Vec<_> = (0..n).map(|_| a.on_start(now).unwrap()).collect();
            let done = now + ms(2);
            for t in tickets {
                a.on_finish(
                    done,
                    t,
                    AttemptOutcome {
                        latency: Duration::from_millis(2),
                        ..OK
                    },
                    0.0,
                );
            }
            delivered += u64::from(n);
            now += ms(10);
        }
        // 20 slots every 10 ms is 2 000/s: the concurrency cap, not the rate,
        // binds after a few seconds.
        let rate = a.snapshot(now).rate_per_sec;
        assert!(rate >= 2_000.0, "rate {rate}");
        // From 50/s, ×1.5 a second reaches the cap's 2 000/s in about 9 s.
        assert!(delivered > 25_000, "delivered {delivered} in 20 s");
    }

    #[test]
    fn the_rate_grows_when_starts_come_a_round_trip_after_the_plan() {
        // As the dispatcher works: plan, claim (30 ms in the store), then
        // start what was claimed, each succeeding at once. Between the
        // plan and the starts the bucket refills, so no start ever finds it
        // empty, yet the rate is what holds the host back.
        let mut a = admission();
        let mut now = t0();
        for _ in 0..1_000 {
            let n = a.available(now).slots;
            let started = now + ms(30);
            run(&mut a, started, n, OK);
            now = started + ms(5);
        }
        // 20 slots every 35 ms is 571/s: the rate grows from 50/s until the
        // cap, not the rate, binds.
        let rate = a.snapshot(now).rate_per_sec;
        assert!(rate >= 571.0, "rate {rate}");
    }

    #[test]
    fn failures_and_latency_shrink_the_rate() {
        let mut a = DestinationAdmission::new(
            AdmissionConfig {
                rate: RateConfig {
                    initial: 1_000.0,
                    ..Default::default()
                },
                ..Default::default()
            },
            t0(),
        );
        // 3 of 10 failing each second: below the breaker's 50 %, above 10 %.
        let mut now = t0();
        for _ in 0..6 {
            run(&mut a, now, 7, OK);
            run(&mut a, now, 3, FAIL);
            now += secs(1);
        }
        a.available(now);
        assert_eq!(
            a.snapshot(now).rate_per_sec,
            1_000.0 / 64.0,
            "halved six times"
        );
        // The successes took 20 ms; a second at 1 s each is climbing latency.
        run(
            &mut a,
            now,
            10,
            AttemptOutcome {
                latency: Duration::from_secs(1),
                ..OK
            },
        );
        now += secs(1);
        a.available(now);
        assert_eq!(a.snapshot(now).rate_per_sec, 1_000.0 / 64.0 * 0.8);
        assert_eq!(a.snapshot(now).circuit_state, CircuitState::Closed);
    }

    #[test]
    fn twenty_failures_open_the_circuit_and_only_the_probe_goes() {
        let mut a = admission();
        assert!(run(&mut a, t0(), 19, FAIL).is_empty());
        assert_eq!(run(&mut a, t0(), 1, FAIL), [CircuitTransition::Opened]);
        let admit = a.available(t0());
        assert_eq!(admit.slots, 0);
        assert_eq!(admit.next_check, Some(t0() + secs(30)));
        assert_eq!(a.on_start(t0() + secs(29)), None);
        let at = t0() + secs(30);
        for _ in 0..10 {
            let admit = a.available(at);
            assert_eq!((admit.slots, admit.probe), (1, true));
        }
        let probe = a.on_start(at).unwrap();
        assert!(probe.is_probe());
        assert_eq!(a.available(at).slots, 0);
        assert_eq!(a.on_start(at), None);
        // The probe fails: reopened with the doubled backoff.
        assert_eq!(
            a.on_finish(at, probe, FAIL, 0.0),
            Some(CircuitTransition::Opened)
        );
        assert_eq!(a.snapshot(at).reopens_at, Some(at + secs(60)));
    }

    #[test]
    fn permanent_failures_neither_trip_the_breaker_nor_shrink_the_rate() {
        let mut a = admission();
        let mut now = t0();
        for _ in 0..10 {
            let n = a.available(now).slots;
            run(&mut a, now, n, PERMANENT);
            now += secs(1);
        }
        let snap = a.snapshot(now);
        assert_eq!(snap.circuit_state, CircuitState::Closed);
        assert_eq!(snap.window_attempts, 0);
        assert_eq!(snap.rate_per_sec, 50.0);
    }

    #[test]
    fn recovery_starts_at_ten_percent_and_ramps_to_full_over_five_minutes() {
        let mut a = admission();
        let closed_at = open_then_recover(&mut a, t0());
        let snap = a.snapshot(closed_at);
        assert_eq!(snap.circuit_state, CircuitState::Closed);
        assert_eq!(snap.ramp_level, 0.1);
        assert_eq!(snap.concurrency_limit, 2);
        assert_eq!(snap.rate_per_sec, 5.0, "10 % of the last healthy 50/s");
        assert!(a.available(closed_at).slots <= 2);
        // Healthy traffic for five minutes.
        let mut now = closed_at;
        let mut levels = Vec::new();
        for s in 1..=301 {
            now = closed_at + secs(s);
            let n = a.available(now).slots;
            run(&mut a, now, n, OK);
            if s % 60 == 0 {
                levels.push((a.snapshot(now).ramp_level * 100.0).round() as u32);
            }
        }
        assert_eq!(levels, [28, 46, 64, 82, 100]);
        let snap = a.snapshot(now);
        assert_eq!(snap.concurrency_limit, 20);
        assert!(snap.rate_per_sec >= 50.0);
    }

    #[test]
    fn failures_during_the_ramp_slow_or_reverse_it() {
        let mut a = admission();
        let closed_at = open_then_recover(&mut a, t0());
        let mut now = closed_at;
        for s in 1..=120 {
            now = closed_at + secs(s);
            let n = a.available(now).slots;
            run(&mut a, now, n, OK);
        }
        let level = |a: &mut DestinationAdmission, at| {
            a.available(at);
            a.snapshot(at).ramp_level
        };
        now += secs(1);
        let before = level(&mut a, now);
        assert!((before - 0.463).abs() < 1e-9, "2 min in: {before}");
        // A second with 1 failure in 12 (8 %): the ramp holds.
        let n = a.available(now).slots;
        run(&mut a, now, n - 1, OK);
        run(&mut a, now, 1, FAIL);
        now += secs(1);
        assert_eq!(level(&mut a, now), before, "held");
        // A second where everything fails: the ramp halves.
        let n = a.available(now).slots;
        run(&mut a, now, n, FAIL);
        now += secs(1);
        let after = level(&mut a, now);
        assert!((after - before / 2.0).abs() < 1e-9, "{before} → {after}");
        assert_eq!(a.snapshot(now).concurrency_limit, 5, "ceil(20 × 0.2315)");
        assert_eq!(a.snapshot(now).circuit_state, CircuitState::Closed);
    }

    #[test]
    fn late_results_from_before_the_outage_do_not_count_after_recovery() {
        let mut a = admission();
        let stale: Vec<Ticket> = (0..5).map(|_| a.on_start(t0()).unwrap()).collect();
        let closed_at = open_then_recover(&mut a, t0());
        for t in stale {
            assert_eq!(a.on_finish(closed_at, t, FAIL, 0.0), None);
        }
        let snap = a.snapshot(closed_at);
        assert_eq!((snap.window_failures, snap.in_flight), (0, 0));
        a.available(closed_at + secs(1));
        assert!(
            a.snapshot(closed_at + secs(1)).ramp_level > 0.1,
            "the ramp advanced"
        );
    }

    #[test]
    fn gossip_opens_the_circuit() {
        let mut a = admission();
        assert!(a.force_open(t0(), 0.0));
        assert!(!a.force_open(t0(), 0.0));
        let snap = a.snapshot(t0());
        assert_eq!(snap.circuit_state, CircuitState::Open);
        assert_eq!(snap.reopens_at, Some(t0() + secs(30)));
        assert_eq!(a.available(t0()).slots, 0);
    }

    #[test]
    fn outcome_kinds_follow_the_classification() {
        use crate::classify::Verdict;
        let table = [
            (Verdict::Delivered, OutcomeKind::Success),
            (
                Verdict::Retry { retry_after: None },
                OutcomeKind::RetryableFailure,
            ),
            (Verdict::Fail, OutcomeKind::PermanentFailure),
            (Verdict::Gone, OutcomeKind::PermanentFailure),
        ];
        for (verdict, want) in table {
            assert_eq!(OutcomeKind::from_verdict(verdict), want);
        }
    }

    proptest! {
        #[test]
        fn admission_never_exceeds_its_limits(
            ops in proptest::collection::vec((0u8..6, 0i64..5_000, 0.0f64..1.0), 1..300),
        ) {
            let mut a = admission();
            let mut now = t0();
            let mut tickets: Vec<Ticket> = Vec::new();
            for (op, dt, unit) in ops {
                now += ms(dt);
                match op {
                    0 | 1 => {
                        let admit = a.available(now);
                        for _ in 0..admit.slots {
                            if let Some(t) = a.on_start(now) { tickets.push(t); }
                        }
                    }
                    2 => if let Some(t) = tickets.pop() { a.on_finish(now, t, OK, unit); },
                    3 => if let Some(t) = tickets.pop() { a.on_finish(now, t, FAIL, unit); },
                    4 => if let Some(t) = tickets.pop() { a.on_cancel(now, t); },
                    _ => { a.force_open(now, unit); }
                }
                let snap = a.snapshot(now);
                prop_assert!(snap.in_flight as usize == tickets.len());
                prop_assert!(snap.in_flight <= 20);
                prop_assert!(snap.ramp_level >= 0.1 && snap.ramp_level <= 1.0);
                prop_assert!(snap.rate_per_sec <= 10_000.0);
                let live_probes = tickets.iter().filter(|t| t.is_probe() && a.breaker.is_current(t)).count();
                prop_assert!(live_probes <= 1);
            }
        }
    }
}
