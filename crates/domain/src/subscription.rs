//! Subscriptions: a customer's URL registered for event types, with its
//! signing secrets and delivery options.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::destination::DestinationUrl;
use crate::event_type::EventTypePattern;
use crate::retry::RetrySchedule;
use crate::signing::SigningSecret;
use crate::{CustomerId, SubscriptionId, Timestamp};

/// Most event type patterns one subscription may list.
pub const MAX_EVENT_TYPES: usize = 64;

/// The smallest explicit [`Subscription::rate_limit`], in attempts per second.
pub const MIN_RATE_LIMIT: u32 = 1;
/// The largest explicit [`Subscription::rate_limit`], in attempts per second.
/// Far above what one destination should take from us; a typo like `1e6`
/// is refused rather than read as "unlimited".
pub const MAX_RATE_LIMIT: u32 = 10_000;

/// Why a `rate_limit` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rate_limit must be an integer from {MIN_RATE_LIMIT} to {MAX_RATE_LIMIT}")]
pub struct InvalidRateLimit;

/// Checks an explicit `rate_limit` (attempts per second) against its bounds,
/// [`MIN_RATE_LIMIT`] to [`MAX_RATE_LIMIT`]. Takes a `u64` so that a caller
/// holding a wider number (a JSON integer) need not truncate it first.
pub fn parse_rate_limit(n: u64) -> Result<u32, InvalidRateLimit> {
    within(n, MIN_RATE_LIMIT, MAX_RATE_LIMIT).ok_or(InvalidRateLimit)
}

/// `n` as a `u32`, if it lies in `lo..=hi`.
fn within(n: u64, lo: u32, hi: u32) -> Option<u32> {
    u32::try_from(n).ok().filter(|n| (lo..=hi).contains(n))
}

/// What a destination host gets from the explicit limits (`rate_limit`, or
/// `max_concurrency`) of the subscriptions there: the smallest of those set,
/// or `None` when none is (then the adaptive rate, or the server-wide
/// `--host-concurrency`). Politeness: the strictest statement a customer made
/// about that server wins, since every subscription there shares the one
/// server.
pub fn strictest_limit(limits: impl IntoIterator<Item = Option<u32>>) -> Option<u32> {
    limits.into_iter().flatten().min()
}

/// The smallest explicit [`Subscription::max_concurrency`], in attempts in
/// flight at once.
pub const MIN_MAX_CONCURRENCY: u32 = 1;
/// The largest explicit [`Subscription::max_concurrency`], in attempts in
/// flight at once. Far above what one destination should take from us; a
/// typo like `1e6` is refused rather than read as "unlimited".
pub const MAX_MAX_CONCURRENCY: u32 = 1_000;

/// Why a `max_concurrency` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("max_concurrency must be an integer from {MIN_MAX_CONCURRENCY} to {MAX_MAX_CONCURRENCY}")]
pub struct InvalidMaxConcurrency;

/// Checks an explicit `max_concurrency` (attempts in flight at once) against
/// its bounds, [`MIN_MAX_CONCURRENCY`] to [`MAX_MAX_CONCURRENCY`]. Takes a
/// `u64` so that a caller holding a wider number (a JSON integer) need not
/// truncate it first.
pub fn parse_max_concurrency(n: u64) -> Result<u32, InvalidMaxConcurrency> {
    within(n, MIN_MAX_CONCURRENCY, MAX_MAX_CONCURRENCY).ok_or(InvalidMaxConcurrency)
}

/// Whether a subscription receives deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscriptionState {
    /// Deliveries are made.
    Active,
    /// Deliveries are created and kept but not attempted until re-enabled.
    Disabled,
}

impl SubscriptionState {
    /// The name used in the store and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Disabled => "disabled",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(Self::Active),
            "disabled" => Some(Self::Disabled),
            _ => None,
        }
    }
}

/// A subscription's own retry settings. Every field is optional: an unset
/// field follows the server's default, so changing a default reaches every
/// subscription that did not choose otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// First backoff bound, in seconds (1 to 3,600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_delay_secs: Option<u64>,
    /// Largest backoff bound, in seconds (1 to 86,400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_secs: Option<u64>,
    /// Stop and dead-letter once a delivery is this old, in seconds (60 to 30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_secs: Option<u64>,
    /// Stop and dead-letter after this many attempts (1 to 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// 4xx statuses to retry besides 408, 425 and 429.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retryable_statuses: Vec<u16>,
}

/// Why a retry policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("retry_policy.{field} {reason}")]
pub struct InvalidRetryPolicy {
    /// The offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl RetryPolicy {
    /// Checks every set field against its bounds.
    pub fn validate(&self) -> Result<(), InvalidRetryPolicy> {
        let check = |field, v: Option<u64>, lo: u64, hi: u64, reason| match v {
            Some(v) if !(lo..=hi).contains(&v) => Err(InvalidRetryPolicy { field, reason }),
            _ => Ok(()),
        };
        check(
            "base_delay_secs",
            self.base_delay_secs,
            1,
            3_600,
            "must be between 1 and 3600",
        )?;
        check(
            "max_delay_secs",
            self.max_delay_secs,
            1,
            86_400,
            "must be between 1 and 86400",
        )?;
        check(
            "max_age_secs",
            self.max_age_secs,
            60,
            30 * 86_400,
            "must be between 60 and 2592000",
        )?;
        check(
            "max_attempts",
            self.max_attempts.map(u64::from),
            1,
            1_000,
            "must be between 1 and 1000",
        )?;
        if self
            .retryable_statuses
            .iter()
            .any(|s| !(400..=499).contains(s))
        {
            return Err(InvalidRetryPolicy {
                field: "retryable_statuses",
                reason: "may only list 4xx codes",
            });
        }
        if self.retryable_statuses.len() > 100 {
            return Err(InvalidRetryPolicy {
                field: "retryable_statuses",
                reason: "may list at most 100 codes",
            });
        }
        if let (Some(b), Some(m)) = (self.base_delay_secs, self.max_delay_secs)
            && b > m
        {
            return Err(InvalidRetryPolicy {
                field: "base_delay_secs",
                reason: "must not exceed max_delay_secs",
            });
        }
        Ok(())
    }

    /// The schedule this policy gives on top of `defaults`.
    pub fn resolve(&self, defaults: &RetrySchedule) -> RetrySchedule {
        let secs = Duration::from_secs;
        let base = self.base_delay_secs.map(secs).unwrap_or(defaults.base);
        RetrySchedule {
            base,
            cap: self
                .max_delay_secs
                .map(secs)
                .unwrap_or(defaults.cap)
                .max(base),
            max_age: self.max_age_secs.map(secs).unwrap_or(defaults.max_age),
            max_attempts: self.max_attempts.unwrap_or(defaults.max_attempts),
            retryable_statuses: if self.retryable_statuses.is_empty() {
                defaults.retryable_statuses.clone()
            } else {
                self.retryable_statuses.clone()
            },
        }
    }
}

/// A subscription's signing secrets: the current one, and during a rotation's
/// grace window the previous one. Both sign every delivery while both are live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningKeys {
    /// The secret every delivery is signed with.
    pub current: SigningSecret,
    /// The secret being retired, and when it stops being used.
    pub previous: Option<(SigningSecret, Timestamp)>,
}

impl SigningKeys {
    /// The secrets live at `now`, current first.
    pub fn live(&self, now: Timestamp) -> impl Iterator<Item = &SigningSecret> {
        std::iter::once(&self.current).chain(
            self.previous
                .as_ref()
                .filter(|(_, until)| *until > now)
                .map(|(s, _)| s),
        )
    }
}

/// A subscription as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// Its id.
    pub id: SubscriptionId,
    /// The customer it belongs to, if the platform scopes by customer.
    pub customer_id: Option<CustomerId>,
    /// Where deliveries go.
    pub url: DestinationUrl,
    /// Which event types it receives.
    pub event_types: Vec<EventTypePattern>,
    /// Its signing secrets.
    pub keys: SigningKeys,
    /// Deliver one at a time, in event order.
    pub ordered: bool,
    /// Its own retry settings.
    pub retry_policy: RetryPolicy,
    /// Whether deliveries are attempted.
    pub state: SubscriptionState,
    /// An explicit rate for its destination host, in attempts per second
    /// ([`MIN_RATE_LIMIT`] to [`MAX_RATE_LIMIT`], checked by
    /// [`parse_rate_limit`] where it enters). `None` (the usual case) leaves
    /// the host's rate adaptive: it follows the destination's observed
    /// throughput. When several subscriptions at one host set it, the host's
    /// rate is the smallest of them ([`strictest_limit`]): the strictest
    /// customer statement about that server wins.
    pub rate_limit: Option<u32>,
    /// An explicit cap on attempts in flight at once to its destination host
    /// ([`MIN_MAX_CONCURRENCY`] to [`MAX_MAX_CONCURRENCY`], checked by
    /// [`parse_max_concurrency`] where it enters). `None` (the usual case)
    /// leaves the host at the server-wide `--host-concurrency`. When several
    /// subscriptions at one host set it, the host's cap is the smallest of
    /// them ([`strictest_limit`]): the strictest customer statement
    /// about that server wins.
    pub max_concurrency: Option<u32>,
    /// A free-form description.
    pub description: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_policy_bounds_are_enforced() {
        let ok = RetryPolicy {
            base_delay_secs: Some(2),
            max_attempts: Some(5),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        let bad = [
            RetryPolicy {
                base_delay_secs: Some(0),
                ..Default::default()
            },
            RetryPolicy {
                max_delay_secs: Some(100_000),
                ..Default::default()
            },
            RetryPolicy {
                max_age_secs: Some(10),
                ..Default::default()
            },
            RetryPolicy {
                max_attempts: Some(0),
                ..Default::default()
            },
            RetryPolicy {
                retryable_statuses: vec![500],
                ..Default::default()
            },
            RetryPolicy {
                base_delay_secs: Some(60),
                max_delay_secs: Some(10),
                ..Default::default()
            },
        ];
        for p in bad {
            assert!(p.validate().is_err(), "{p:?}");
        }
    }

    #[test]
    fn unset_fields_follow_the_defaults() {
        let d = RetrySchedule::default();
        let p = RetryPolicy {
            max_attempts: Some(3),
            ..Default::default()
        };
        let s = p.resolve(&d);
        assert_eq!(s.max_attempts, 3);
        assert_eq!(s.base, d.base);
        assert_eq!(s.max_age, d.max_age);
    }

    #[test]
    fn rate_limit_bounds_are_enforced() {
        let cases = [
            (0, Err(InvalidRateLimit)),
            (1, Ok(1)),
            (250, Ok(250)),
            (10_000, Ok(10_000)),
            (10_001, Err(InvalidRateLimit)),
            (u64::from(u32::MAX) + 1, Err(InvalidRateLimit)),
            (u64::MAX, Err(InvalidRateLimit)),
        ];
        for (n, want) in cases {
            assert_eq!(parse_rate_limit(n), want, "{n}");
        }
        assert!(InvalidRateLimit.to_string().starts_with("rate_limit "));
    }

    #[test]
    fn a_retired_secret_stops_signing_after_its_grace_window() {
        let t0 = chrono::DateTime::from_timestamp(1_000_000, 0).unwrap();
        let keys = SigningKeys {
            current: SigningSecret::generate(),
            previous: Some((SigningSecret::generate(), t0 + chrono::Duration::hours(24))),
        };
        assert_eq!(keys.live(t0).count(), 2);
        assert_eq!(keys.live(t0 + chrono::Duration::hours(25)).count(), 1);
    }

    #[test]
    fn the_strictest_explicit_limit_at_a_host_wins() {
        let cases: [(&[Option<u32>], Option<u32>); 5] = [
            (&[], None),
            (&[None, None], None),
            (&[None, Some(50)], Some(50)),
            (&[Some(50), Some(5), None, Some(500)], Some(5)),
            (&[Some(7)], Some(7)),
        ];
        for (limits, want) in cases {
            assert_eq!(strictest_limit(limits.iter().copied()), want, "{limits:?}");
        }
    }

    #[test]
    fn max_concurrency_bounds_are_enforced() {
        let cases = [
            (0, Err(InvalidMaxConcurrency)),
            (1, Ok(1)),
            (20, Ok(20)),
            (1_000, Ok(1_000)),
            (1_001, Err(InvalidMaxConcurrency)),
            (u64::from(u32::MAX) + 1, Err(InvalidMaxConcurrency)),
            (u64::MAX, Err(InvalidMaxConcurrency)),
        ];
        for (n, want) in cases {
            assert_eq!(parse_max_concurrency(n), want, "{n}");
        }
        assert!(
            InvalidMaxConcurrency
                .to_string()
                .starts_with("max_concurrency ")
        );
    }
}
