//! R4's escape valve: when to refuse a subscription's new events at ingest.
//!
//! "If the backlog exceeds a threshold and is not shrinking, the system
//! sheds at ingest for that subscription with a 429 and tells the customer
//! via /health." A [`BacklogTrend`] watches one subscription's unfinished
//! deliveries over time and says whether it is shedding:
//!
//! - it **starts** when the backlog is at or over the threshold and is no
//!   smaller than it was one window ago (so a full window of history is
//!   needed: a sudden burst that is draining is not shed);
//! - it **stops** as soon as either no longer holds: the backlog fell under
//!   the threshold, or it is smaller than a window ago. While shedding, new
//!   events no longer reach the backlog, so it shrinks as soon as the
//!   destination drains at all — and ingest resumes; a destination that
//!   drains nothing keeps shedding.
//!
//! Nothing already accepted is dropped: shedding only refuses new events.

use std::collections::VecDeque;

use crate::Timestamp;

/// When to shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SheddingConfig {
    /// Unfinished deliveries at or over which a subscription may shed.
    pub threshold: u64,
    /// How long the backlog must not have shrunk.
    pub window: chrono::Duration,
}

impl Default for SheddingConfig {
    /// 10 000 unfinished deliveries that have not shrunk in 10 minutes: well
    /// past any burst a healthy endpoint absorbs (at the default cap of 20
    /// and 100 ms per request that is 50 s of work), long enough that a
    /// deploy or a short outage never sheds.
    fn default() -> Self {
        Self {
            threshold: 10_000,
            window: chrono::Duration::minutes(10),
        }
    }
}

/// One subscription's backlog samples over the last window.
#[derive(Debug, Clone, Default)]
pub struct BacklogTrend {
    /// `(when, unfinished)`, oldest first; the oldest is at or before
    /// `now - window` once a full window has been seen.
    samples: VecDeque<(Timestamp, u64)>,
}

impl BacklogTrend {
    /// Records a sample and says whether the subscription sheds now.
    pub fn observe(&mut self, config: &SheddingConfig, now: Timestamp, unfinished: u64) -> bool {
        self.samples.push_back((now, unfinished));
        let horizon = now - config.window;
        // Keep exactly one sample at or before the horizon: the backlog as
        // it was one window ago.
        while self.samples.len() >= 2 && self.samples[1].0 <= horizon {
            self.samples.pop_front();
        }
        if unfinished < config.threshold {
            return false;
        }
        match self.samples.front() {
            Some(&(at, then)) if at <= horizon => unfinished >= then,
            // Less than a window of history: not proven stuck.
            _ => false,
        }
    }

    /// Whether these samples span a full window before `now`: only then is
    /// "not shedding" a judgement rather than a lack of history (a node that
    /// just started must not withdraw another node's verdict).
    pub fn has_window(&self, config: &SheddingConfig, now: Timestamp) -> bool {
        self.samples
            .front()
            .is_some_and(|&(at, _)| at <= now - config.window)
    }

    /// Whether a sample was recorded at all (the monitor forgets trends of
    /// subscriptions whose backlog is gone).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(secs: i64) -> Timestamp {
        chrono::Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    fn cfg() -> SheddingConfig {
        SheddingConfig {
            threshold: 100,
            window: chrono::Duration::seconds(60),
        }
    }

    #[test]
    fn a_stuck_backlog_over_the_threshold_sheds_after_a_full_window() {
        let mut b = BacklogTrend::default();
        assert!(!b.observe(&cfg(), t(0), 150), "no history yet");
        assert!(!b.observe(&cfg(), t(30), 160), "half a window");
        assert!(b.observe(&cfg(), t(60), 170), "a window without shrinking");
        assert!(b.observe(&cfg(), t(90), 170), "still stuck");
    }

    #[test]
    fn shedding_stops_once_the_backlog_shrinks_and_restarts_if_it_grows_back() {
        let mut b = BacklogTrend::default();
        for (s, n) in [(0, 200), (30, 200), (60, 200)] {
            b.observe(&cfg(), t(s), n);
        }
        assert!(b.observe(&cfg(), t(70), 200));
        // The destination drains a little: smaller than a window ago.
        assert!(!b.observe(&cfg(), t(100), 190));
        // It grows back past what it was a window earlier.
        assert!(b.observe(&cfg(), t(160), 195), "195 >= 190 a window ago");
    }

    #[test]
    fn a_full_window_is_known_only_after_a_window() {
        let mut b = BacklogTrend::default();
        b.observe(&cfg(), t(0), 10);
        assert!(!b.has_window(&cfg(), t(59)));
        assert!(b.has_window(&cfg(), t(60)));
    }

    #[test]
    fn under_the_threshold_never_sheds() {
        let mut b = BacklogTrend::default();
        for s in 0..10 {
            assert!(!b.observe(&cfg(), t(s * 30), 99));
        }
    }

    #[test]
    fn a_draining_burst_is_not_shed() {
        let mut b = BacklogTrend::default();
        assert!(!b.observe(&cfg(), t(0), 5000));
        assert!(!b.observe(&cfg(), t(60), 4000));
        assert!(!b.observe(&cfg(), t(120), 3000));
    }

    #[test]
    fn only_one_sample_before_the_horizon_is_kept() {
        let mut b = BacklogTrend::default();
        for s in 0..100 {
            b.observe(&cfg(), t(s * 10), 500);
        }
        // 60 s window at 10 s spacing: the horizon sample plus six after it.
        assert_eq!(b.samples.len(), 7);
    }
}
