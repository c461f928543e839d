//! From an attempt's result to the delivery's next state. Pure: the
//! classification and the schedule come from `hookd-domain`, the randomness
//! and the time are passed in.

use hookd_domain::Timestamp;
use hookd_domain::classify::{AttemptResult, Verdict, classify};
use hookd_domain::retry::{NextStep, RetrySchedule};
use hookd_store::{AttemptRecord, ClaimedDelivery, Lease, NextState};

use crate::send::Sent;

/// What recording an attempt means.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The store write.
    pub record: AttemptRecord,
    /// The destination answered 410 Gone: disable the subscription.
    pub disable_subscription: bool,
}

/// Decides the next state of `claimed` after `sent`.
///
/// `unit` is a random number in `[0, 1)` for the backoff jitter; `now` is
/// when the attempt ended.
pub fn decide(
    claimed: &ClaimedDelivery,
    lease: Lease,
    sent: Sent,
    defaults: &RetrySchedule,
    now: Timestamp,
    unit: f64,
) -> Decision {
    let schedule = claimed.subscription.retry_policy.resolve(defaults);
    let verdict = classify(sent.result, &schedule.retryable_statuses);
    let error = describe(sent.result);
    let (next, disable_subscription) = match verdict {
        Verdict::Delivered => (NextState::Delivered, false),
        Verdict::Fail => (NextState::Failed, false),
        Verdict::Gone => (NextState::Failed, true),
        Verdict::Retry { retry_after } => {
            let attempts_made = sent.attempt.number;
            match schedule.after_failure(
                attempts_made,
                claimed.delivery.window_start,
                now,
                retry_after,
                unit,
            ) {
                NextStep::RetryAt(at) => (
                    NextState::Retry {
                        delay: (at - now).to_std().unwrap_or_default(),
                    },
                    false,
                ),
                NextStep::Dead => (NextState::Dead, false),
            }
        }
    };
    Decision {
        record: AttemptRecord {
            lease,
            attempt: sent.attempt,
            next,
            last_error: error,
        },
        disable_subscription,
    }
}

/// `last_error` in words; `None` for a success.
fn describe(result: AttemptResult) -> Option<String> {
    match result {
        AttemptResult::Status {
            code: 200..=299, ..
        } => None,
        AttemptResult::Status { code: 410, .. } => {
            Some("HTTP 410 Gone: subscription disabled".to_owned())
        }
        AttemptResult::Status {
            code: code @ 300..=399,
            ..
        } => Some(format!("HTTP {code}: redirects are not followed")),
        AttemptResult::Status { code, .. } => Some(format!("HTTP {code}")),
        AttemptResult::Error(class) => Some(class.as_str().to_owned()),
    }
}
