//! Deliveries (one event to one subscription) and attempts (one HTTP request
//! of a delivery).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a delivery is in its life. See `docs/delivery-states.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting for its `next_attempt_at`.
    Pending,
    /// Claimed by a worker under a lease; an attempt may be under way.
    Inflight,
    /// A 2xx was received.
    Delivered,
    /// A permanent failure (a non-retryable 4xx, a redirect): not retried.
    Failed,
    /// Retries exhausted (too old or too many attempts). Kept and replayable.
    Dead,
}

impl DeliveryState {
    /// Every state, in lifecycle order.
    pub const ALL: [Self; 5] = [
        Self::Pending,
        Self::Inflight,
        Self::Delivered,
        Self::Failed,
        Self::Dead,
    ];

    /// The name used in the store and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Inflight => "inflight",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Dead => "dead",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether no further attempt will be made without a replay.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Delivered | Self::Failed | Self::Dead)
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an attempt got no usable HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// No complete response within the attempt's deadline.
    Timeout,
    /// Connection refused, reset or closed.
    Connection,
    /// The host name did not resolve.
    Dns,
    /// TLS handshake or certificate failure.
    Tls,
    /// A 3xx: redirects are never followed.
    Redirect,
    /// The destination resolved to an address hookd refuses to call.
    ForbiddenDestination,
    /// Anything else on the way (malformed response, …).
    Other,
}

impl ErrorClass {
    /// Every class.
    pub const ALL: [Self; 7] = [
        Self::Timeout,
        Self::Connection,
        Self::Dns,
        Self::Tls,
        Self::Redirect,
        Self::ForbiddenDestination,
        Self::Other,
    ];

    /// The name used in the store, the API and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::Dns => "dns",
            Self::Tls => "tls",
            Self::Redirect => "redirect",
            Self::ForbiddenDestination => "forbidden_destination",
            Self::Other => "other",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in DeliveryState::ALL {
            assert_eq!(DeliveryState::parse(s.as_str()), Some(s));
        }
        for c in ErrorClass::ALL {
            assert_eq!(ErrorClass::parse(c.as_str()), Some(c));
        }
    }
}
