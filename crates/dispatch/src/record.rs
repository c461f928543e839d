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
    /// How the attempt was judged (admission learns from it).
    pub verdict: Verdict,
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
        verdict,
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

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use hookd_domain::classify::AttemptResult;
    use hookd_domain::delivery::{DeliveryState, ErrorClass};
    use hookd_domain::destination::{DestinationPolicy, DestinationUrl};
    use hookd_domain::event_type::{EventType, EventTypePattern};
    use hookd_domain::signing::SigningSecret;
    use hookd_domain::subscription::{RetryPolicy, SigningKeys, SubscriptionState};
    use hookd_domain::{Clock, DeliveryId, EventId, FakeClock, SubscriptionId};
    use hookd_store::{Attempt, ClaimedDelivery, Delivery, Event, Lease, NextState, Subscription};

    use super::*;

    pub(crate) fn claimed(
        clock: &FakeClock,
        attempts_so_far: u32,
        policy: RetryPolicy,
    ) -> ClaimedDelivery {
        let now = clock.now();
        let (event_id, sub_id, id) = (EventId::new(), SubscriptionId::new(), DeliveryId::new());
        let event_type = EventType::parse("invoice.paid").unwrap();
        ClaimedDelivery {
            lease: Lease {
                delivery_id: id,
                token: 1,
                partition: None,
                subscription: sub_id,
            },
            delivery: Delivery {
                id,
                event_id,
                sub_id,
                event_type: event_type.clone(),
                destination_host: "example.com".into(),
                state: DeliveryState::Inflight,
                attempt: attempts_so_far,
                next_attempt_at: now,
                last_status: None,
                last_error: None,
                created_at: now,
                window_start: now,
                updated_at: now,
            },
            event: Event {
                id: event_id,
                event_type,
                payload: "{}".into(),
                idempotency_key: None,
                customer_id: None,
                created_at: now,
            },
            subscription: Subscription {
                id: sub_id,
                customer_id: None,
                url: DestinationUrl::parse(
                    "https://example.com/hook",
                    DestinationPolicy::PublicOnly,
                )
                .unwrap(),
                event_types: vec![EventTypePattern::All],
                keys: SigningKeys {
                    current: SigningSecret::generate(),
                    previous: None,
                },
                ordered: false,
                retry_policy: policy,
                rate_limit: None,
                max_concurrency: None,
                state: SubscriptionState::Active,
                description: None,
                created_at: now,
                updated_at: now,
            },
        }
    }

    fn sent(clock: &FakeClock, number: u32, result: AttemptResult) -> Sent {
        let (status, error_class) = match result {
            AttemptResult::Status { code, .. } => (Some(code), None),
            AttemptResult::Error(c) => (None, Some(c)),
        };
        Sent {
            attempt: Attempt {
                number,
                started_at: clock.now(),
                duration: Duration::from_millis(5),
                status,
                error_class,
                response_snippet: None,
            },
            result,
        }
    }

    fn status(code: u16, retry_after: Option<u64>) -> AttemptResult {
        AttemptResult::Status {
            code,
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    pub(crate) fn clock() -> FakeClock {
        FakeClock::new(chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap())
    }

    fn run(c: &ClaimedDelivery, s: Sent, now: hookd_domain::Timestamp, unit: f64) -> Decision {
        decide(c, c.lease, s, &RetrySchedule::default(), now, unit)
    }

    #[test]
    fn a_400_is_tried_once() {
        let clock = clock();
        let c = claimed(&clock, 0, RetryPolicy::default());
        let d = run(&c, sent(&clock, 1, status(400, None)), clock.now(), 0.5);
        assert_eq!(d.record.next, NextState::Failed);
        assert_eq!(d.record.last_error.as_deref(), Some("HTTP 400"));
        assert!(!d.disable_subscription);
    }

    #[test]
    fn a_429_with_retry_after_waits_at_least_that_long() {
        let clock = clock();
        let c = claimed(&clock, 0, RetryPolicy::default());
        for unit in [0.0, 0.3, 0.999] {
            let d = run(&c, sent(&clock, 1, status(429, Some(5))), clock.now(), unit);
            let NextState::Retry { delay } = d.record.next else {
                panic!("429 must be retried")
            };
            assert!(delay >= Duration::from_secs(5), "{delay:?}");
        }
    }

    #[test]
    fn a_503_and_a_timeout_are_retried_within_the_backoff_bound() {
        let clock = clock();
        let c = claimed(&clock, 2, RetryPolicy::default());
        for result in [
            status(503, None),
            AttemptResult::Error(ErrorClass::Timeout),
            AttemptResult::Error(ErrorClass::Connection),
        ] {
            let d = run(&c, sent(&clock, 3, result), clock.now(), 0.999);
            let NextState::Retry { delay } = d.record.next else {
                panic!("{result:?} must be retried")
            };
            assert!(
                delay <= Duration::from_secs(4),
                "third attempt's bound is 4 s: {delay:?}"
            );
        }
    }

    #[test]
    fn a_410_fails_the_delivery_and_disables_the_subscription() {
        let clock = clock();
        let c = claimed(&clock, 0, RetryPolicy::default());
        let d = run(&c, sent(&clock, 1, status(410, None)), clock.now(), 0.5);
        assert_eq!(d.record.next, NextState::Failed);
        assert!(d.disable_subscription);
    }

    #[test]
    fn retries_stop_at_max_attempts_and_at_the_end_of_the_window() {
        let clock = clock();
        let c = claimed(
            &clock,
            2,
            RetryPolicy {
                max_attempts: Some(3),
                ..Default::default()
            },
        );
        let d = run(&c, sent(&clock, 3, status(500, None)), clock.now(), 0.5);
        assert_eq!(d.record.next, NextState::Dead);

        let c = claimed(&clock, 5, RetryPolicy::default());
        clock.advance(Duration::from_secs(24 * 3600));
        let d = run(&c, sent(&clock, 6, status(500, None)), clock.now(), 0.5);
        assert_eq!(d.record.next, NextState::Dead, "the 24 h window is over");
    }

    #[test]
    fn a_subscription_may_retry_a_4xx() {
        let clock = clock();
        let c = claimed(
            &clock,
            0,
            RetryPolicy {
                retryable_statuses: vec![403],
                ..Default::default()
            },
        );
        let d = run(&c, sent(&clock, 1, status(403, None)), clock.now(), 0.5);
        assert!(matches!(d.record.next, NextState::Retry { .. }));
    }

    #[test]
    fn redirects_are_permanent_failures_with_a_reason() {
        let clock = clock();
        let c = claimed(&clock, 0, RetryPolicy::default());
        let d = run(&c, sent(&clock, 1, status(302, None)), clock.now(), 0.5);
        assert_eq!(d.record.next, NextState::Failed);
        assert_eq!(
            d.record.last_error.as_deref(),
            Some("HTTP 302: redirects are not followed")
        );
    }

    #[test]
    fn a_forbidden_destination_fails_at_once_and_does_not_count_against_the_host() {
        let clock = clock();
        let c = claimed(&clock, 0, RetryPolicy::default());
        let result = AttemptResult::Error(ErrorClass::ForbiddenDestination);
        let d = run(&c, sent(&clock, 1, result), clock.now(), 0.5);
        assert_eq!(d.record.next, NextState::Failed, "never retried");
        assert_eq!(
            d.record.last_error.as_deref(),
            Some("forbidden_destination")
        );
        assert!(!d.disable_subscription);
        // Our refusal, not the destination's failure: neutral for the
        // circuit breaker and the adaptive rate.
        assert_eq!(
            hookd_domain::isolation::OutcomeKind::from_verdict(d.verdict),
            hookd_domain::isolation::OutcomeKind::PermanentFailure
        );
    }
}
