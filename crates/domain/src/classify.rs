//! What one attempt's result means for its delivery. A value, not an error:
//! a 503 from a destination is an ordinary outcome.

use std::time::Duration;

use crate::delivery::ErrorClass;

/// What an attempt got back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptResult {
    /// An HTTP response with this status (and `Retry-After`, if it sent one).
    Status {
        /// The status code.
        code: u16,
        /// The parsed `Retry-After` header.
        retry_after: Option<Duration>,
    },
    /// No usable response.
    Error(ErrorClass),
}

/// The verdict on an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A 2xx: done.
    Delivered,
    /// Try again later, not before `retry_after` if the destination asked.
    Retry {
        /// The destination's `Retry-After`, honoured on 429 and 503 only.
        retry_after: Option<Duration>,
    },
    /// A permanent failure: not retried.
    Fail,
    /// 410 Gone: not retried, and the subscription is disabled.
    Gone,
}

/// 4xx codes that are always retried: timeout, too early, too many requests.
pub const ALWAYS_RETRYABLE_4XX: [u16; 3] = [408, 425, 429];

/// Classifies an attempt. `retryable_statuses` are the subscription's extra
/// retryable 4xx codes.
pub fn classify(result: AttemptResult, retryable_statuses: &[u16]) -> Verdict {
    match result {
        AttemptResult::Status { code, retry_after } => match code {
            200..=299 => Verdict::Delivered,
            410 => Verdict::Gone,
            429 | 503 => Verdict::Retry { retry_after },
            400..=499
                if ALWAYS_RETRYABLE_4XX.contains(&code) || retryable_statuses.contains(&code) =>
            {
                Verdict::Retry { retry_after: None }
            }
            500..=599 => Verdict::Retry { retry_after: None },
            // 1xx (never final here), 3xx (redirects are not followed), other 4xx,
            // and anything outside the defined range.
            _ => Verdict::Fail,
        },
        AttemptResult::Error(ErrorClass::Redirect | ErrorClass::ForbiddenDestination) => {
            Verdict::Fail
        }
        AttemptResult::Error(_) => Verdict::Retry { retry_after: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> AttemptResult {
        AttemptResult::Status {
            code,
            retry_after: None,
        }
    }

    #[test]
    fn classification_table() {
        use Verdict::*;
        let retry = Retry { retry_after: None };
        let table: &[(AttemptResult, &[u16], Verdict)] = &[
            (status(200), &[], Delivered),
            (status(204), &[], Delivered),
            (status(299), &[], Delivered),
            (status(301), &[], Fail),
            (status(302), &[], Fail),
            (status(400), &[], Fail),
            (status(401), &[], Fail),
            (status(403), &[], Fail),
            (status(403), &[403], retry),
            (status(404), &[], Fail),
            (status(408), &[], retry),
            (status(410), &[], Gone),
            (status(410), &[410], Gone),
            (status(425), &[], retry),
            (status(429), &[], retry),
            (status(500), &[], retry),
            (status(502), &[], retry),
            (status(503), &[], retry),
            (status(599), &[], retry),
            (status(600), &[], Fail),
            (AttemptResult::Error(ErrorClass::Timeout), &[], retry),
            (AttemptResult::Error(ErrorClass::Connection), &[], retry),
            (AttemptResult::Error(ErrorClass::Dns), &[], retry),
            (AttemptResult::Error(ErrorClass::Tls), &[], retry),
            (AttemptResult::Error(ErrorClass::Other), &[], retry),
            (AttemptResult::Error(ErrorClass::Redirect), &[], Fail),
            (
                AttemptResult::Error(ErrorClass::ForbiddenDestination),
                &[],
                Fail,
            ),
        ];
        for (result, extra, want) in table {
            assert_eq!(classify(*result, extra), *want, "{result:?} with {extra:?}");
        }
    }

    #[test]
    fn retry_after_is_kept_only_for_429_and_503() {
        let ra = Some(Duration::from_secs(5));
        for code in [429, 503] {
            assert_eq!(
                classify(
                    AttemptResult::Status {
                        code,
                        retry_after: ra
                    },
                    &[]
                ),
                Verdict::Retry { retry_after: ra }
            );
        }
        assert_eq!(
            classify(
                AttemptResult::Status {
                    code: 500,
                    retry_after: ra
                },
                &[]
            ),
            Verdict::Retry { retry_after: None }
        );
    }
}
