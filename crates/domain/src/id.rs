//! Typed identifiers. Each is a UUIDv7 (time-ordered, so ids sort by creation
//! and make stable pagination cursors) shown with a prefix that names its kind.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// The error returned when a string is not a valid identifier of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a valid {kind} id (expected `{prefix}` followed by 32 hex digits)")]
pub struct ParseIdError {
    kind: &'static str,
    prefix: &'static str,
    value: String,
}

macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// The prefix that names this kind of id.
            pub const PREFIX: &'static str = $prefix;

            /// A new, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// Wraps an existing UUID (as read from a store).
            pub const fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            /// The UUID inside.
            pub const fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, self.0.simple())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let err = || ParseIdError { kind: $kind, prefix: $prefix, value: s.chars().take(64).collect() };
                let rest = s.strip_prefix($prefix).ok_or_else(err)?;
                if rest.len() != 32 {
                    return Err(err());
                }
                Uuid::try_parse(rest).map(Self).map_err(|_| err())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

id_type!(
    /// Identifies a subscription: a customer's URL registered for event types.
    SubscriptionId,
    "sub_",
    "subscription"
);
id_type!(
    /// Identifies an accepted event.
    EventId,
    "evt_",
    "event"
);
id_type!(
    /// Identifies a delivery: one event to one subscription.
    DeliveryId,
    "dlv_",
    "delivery"
);
id_type!(
    /// Identifies a bulk replay job.
    JobId,
    "job_",
    "job"
);

/// A customer's identifier, chosen by the platform: 1 to 128 characters of
/// `A-Z a-z 0-9 _ - . :`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct CustomerId(String);

/// Why a string is not a valid customer id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("customer_id must be 1 to 128 characters of A-Z, a-z, 0-9, '_', '-', '.', ':'")]
pub struct InvalidCustomerId;

impl CustomerId {
    /// The longest customer id accepted.
    pub const MAX_LEN: usize = 128;

    /// Parses and validates a customer id.
    pub fn parse(s: &str) -> Result<Self, InvalidCustomerId> {
        let ok = !s.is_empty()
            && s.len() <= Self::MAX_LEN
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidCustomerId)
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CustomerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for CustomerId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_their_text_form() {
        let id = DeliveryId::new();
        let text = id.to_string();
        assert!(text.starts_with("dlv_"));
        assert_eq!(text.len(), 4 + 32);
        assert_eq!(text.parse::<DeliveryId>().unwrap(), id);
    }

    #[test]
    fn an_id_of_another_kind_is_refused() {
        let sub = SubscriptionId::new().to_string();
        assert!(sub.parse::<EventId>().is_err());
        assert!("evt_xyz".parse::<EventId>().is_err());
        assert!("".parse::<EventId>().is_err());
    }

    #[test]
    fn ids_sort_by_creation() {
        let a = EventId::new();
        let b = EventId::new();
        assert!(a < b);
    }

    #[test]
    fn customer_ids_are_validated() {
        assert!(CustomerId::parse("acme-1:eu").is_ok());
        assert!(CustomerId::parse("").is_err());
        assert!(CustomerId::parse("has space").is_err());
        assert!(CustomerId::parse(&"x".repeat(129)).is_err());
    }
}
