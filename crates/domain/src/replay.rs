//! How much of a bulk replay job may wait in a destination's queue at once.
//!
//! A replay job (R3: "rate-limited, as a job, with progress") does not send
//! anything itself: it makes finished deliveries `pending` again and the
//! dispatcher sends them under the destination's usual admission — cap,
//! circuit, rate and ramp. What the job decides is how many it keeps
//! re-queued and unfinished at a time: its *window*. A window of about one
//! second of the destination's admitted work keeps a day of replay from
//! sitting in front of new events, and stops re-queuing entirely while the
//! circuit is open, so a job never piles work on a destination that is
//! failing.

use crate::isolation::{CircuitState, DestinationSnapshot};

/// The most deliveries one job keeps re-queued at a time, however fast the
/// destination is: one step's transaction stays small.
pub const MAX_WINDOW: u32 = 1000;

/// The window for a job whose destination is in `snapshot` (`None`: this
/// process has not sent there yet, so it runs at `default_concurrency`).
///
/// - open circuit: 0 — re-queue nothing until the probe succeeds;
/// - half-open: 1 — only the probe would be admitted anyway;
/// - closed: one second of admitted work, `ceil(rate)`, but at least the
///   destination's concurrency limit (so a slow destination's slots are
///   kept busy) and at most [`MAX_WINDOW`].
pub fn replay_window(snapshot: Option<&DestinationSnapshot>, default_concurrency: u32) -> u32 {
    let Some(s) = snapshot else {
        return default_concurrency.clamp(1, MAX_WINDOW);
    };
    match s.circuit_state {
        CircuitState::Open => 0,
        CircuitState::HalfOpen => 1,
        CircuitState::Closed => {
            let per_second = if s.rate_per_sec.is_finite() && s.rate_per_sec > 0.0 {
                s.rate_per_sec.ceil().min(f64::from(MAX_WINDOW)) as u32
            } else {
                0
            };
            per_second.max(s.concurrency_limit).clamp(1, MAX_WINDOW)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(circuit_state: CircuitState, rate: f64, limit: u32) -> DestinationSnapshot {
        DestinationSnapshot {
            circuit_state,
            reopens_at: None,
            in_flight: 0,
            concurrency_limit: limit,
            rate_per_sec: rate,
            base_rate_per_sec: rate,
            ramp_level: 1.0,
            window_failures: 0,
            window_attempts: 0,
        }
    }

    #[test]
    fn an_open_circuit_holds_the_job_and_half_open_allows_one() {
        assert_eq!(
            replay_window(Some(&snap(CircuitState::Open, 500.0, 20)), 20),
            0
        );
        assert_eq!(
            replay_window(Some(&snap(CircuitState::HalfOpen, 500.0, 20)), 20),
            1
        );
    }

    #[test]
    fn a_closed_circuit_allows_a_second_of_work_but_at_least_the_cap() {
        assert_eq!(
            replay_window(Some(&snap(CircuitState::Closed, 49.2, 20)), 20),
            50
        );
        assert_eq!(
            replay_window(Some(&snap(CircuitState::Closed, 3.0, 20)), 20),
            20
        );
        // A ramping destination (limit 2, rate 6/s) gets its ramped figures.
        assert_eq!(
            replay_window(Some(&snap(CircuitState::Closed, 6.0, 2)), 20),
            6
        );
    }

    #[test]
    fn the_window_is_bounded_and_never_zero_when_closed() {
        assert_eq!(
            replay_window(Some(&snap(CircuitState::Closed, 1e9, 20)), 20),
            MAX_WINDOW
        );
        assert_eq!(
            replay_window(Some(&snap(CircuitState::Closed, f64::INFINITY, 20)), 20),
            20
        );
        assert_eq!(
            replay_window(Some(&snap(CircuitState::Closed, 0.0, 0)), 20),
            1
        );
        assert_eq!(replay_window(None, 20), 20);
        assert_eq!(replay_window(None, 0), 1);
    }
}
