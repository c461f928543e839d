//! What `GET /subscriptions/{id}/health` concludes from a subscription's
//! recent attempts.
//!
//! R6: a customer whose endpoint rejects every signature sees "failed:
//! everything" and no reason, and no internal alarm fires, because hookd is
//! working correctly. When nearly all recent failures share one 4xx status,
//! that is most likely a configuration error on their side (a wrong secret,
//! a clock outside the timestamp tolerance, a missing route), and `/health`
//! says so. Advisory only: delivery behaviour does not change.

use serde::Serialize;

/// At least this many failed attempts before a pattern means anything: a
/// handful of 401s during a deploy is not a misconfiguration.
pub const MIN_FAILURES: u64 = 10;

/// The share (in percent) of failed attempts one 4xx status must reach.
pub const MIN_SHARE_PERCENT: u64 = 95;

/// A likely configuration error: the 4xx status most recent failures share.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LikelyConfigurationError {
    /// The shared status.
    pub status: u16,
    /// Its share of the failed attempts, in `[0.95, 1]`.
    pub share: f64,
}

/// Judges failed attempts, given as `(status, count)`: `status` is `None`
/// for an attempt that got no response (timeout, connection, …). Returns
/// the 4xx status that at least [`MIN_SHARE_PERCENT`] % of them share, when
/// there are at least [`MIN_FAILURES`]. A 5xx never qualifies: a broken
/// endpoint answering uniform 500s is not a configuration error (R6).
/// Entries with the same status are added together.
pub fn likely_configuration_error(
    failures: impl IntoIterator<Item = (Option<u16>, u64)>,
) -> Option<LikelyConfigurationError> {
    let mut total: u64 = 0;
    let mut by_status: Vec<(u16, u64)> = Vec::new();
    for (status, count) in failures {
        total = total.saturating_add(count);
        if let Some(status) = status.filter(|s| (400..500).contains(s)) {
            match by_status.iter_mut().find(|(s, _)| *s == status) {
                Some((_, n)) => *n = n.saturating_add(count),
                None => by_status.push((status, count)),
            }
        }
    }
    if total < MIN_FAILURES {
        return None;
    }
    let (status, count) = by_status.into_iter().max_by_key(|&(_, n)| n)?;
    // Integer comparison, so 95 % exactly qualifies without float rounding.
    (u128::from(count) * 100 >= u128::from(total) * u128::from(MIN_SHARE_PERCENT)).then(|| {
        LikelyConfigurationError {
            status,
            share: count as f64 / total as f64,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        type Failures = &'static [(Option<u16>, u64)];
        let cases: &[(&str, Failures, Option<u16>)] = &[
            (
                "96 % 401 of 50",
                &[(Some(401), 48), (Some(500), 2)],
                Some(401),
            ),
            ("94 % 401 of 50", &[(Some(401), 47), (Some(500), 3)], None),
            ("95 % exactly", &[(Some(403), 19), (None, 1)], Some(403)),
            ("100 % 503: 5xx never", &[(Some(503), 50)], None),
            ("9 failures", &[(Some(401), 9)], None),
            ("10 failures", &[(Some(401), 10)], Some(401)),
            ("timeouts only", &[(None, 40)], None),
            ("no failures", &[], None),
            ("two 4xx split", &[(Some(401), 25), (Some(403), 25)], None),
            (
                "entries add up",
                &[(Some(401), 30), (Some(401), 30), (None, 1)],
                Some(401),
            ),
            ("timeouts dilute", &[(Some(401), 18), (None, 2)], None),
        ];
        for (name, failures, want) in cases {
            let got = likely_configuration_error(failures.iter().copied());
            assert_eq!(got.map(|e| e.status), *want, "{name}");
        }
    }

    #[test]
    fn share_is_the_fraction_of_all_failures() {
        let got = likely_configuration_error([(Some(401), 48), (Some(500), 2)]).unwrap();
        assert_eq!(got.status, 401);
        assert!((got.share - 0.96).abs() < 1e-9);
    }
}
