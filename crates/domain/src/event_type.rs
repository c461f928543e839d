//! Event type names (`invoice.paid`) and the patterns subscriptions use to
//! select them: an exact name, a trailing wildcard (`invoice.*`), or `*`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// The longest event type name accepted, in bytes.
pub const MAX_EVENT_TYPE_LEN: usize = 128;

/// Why an event type or pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidEventType {
    /// Empty, too long, or with characters outside the grammar.
    #[error(
        "`{0}` is not a valid event type: use 1 to 128 characters of segments of A-Z, a-z, 0-9, '_' or '-', separated by '.'"
    )]
    Grammar(String),
    /// A `*` anywhere but as the whole last segment.
    #[error(
        "`{0}` is not a valid pattern: '*' may only stand alone as the last segment (`invoice.*` or `*`)"
    )]
    Wildcard(String),
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_EVENT_TYPE_LEN && s.split('.').all(valid_segment)
}

fn shorten(s: &str) -> String {
    s.chars().take(MAX_EVENT_TYPE_LEN + 8).collect()
}

/// An event's type: dot-separated segments, e.g. `invoice.paid`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct EventType(String);

impl EventType {
    /// Parses an event type name.
    pub fn parse(s: &str) -> Result<Self, InvalidEventType> {
        if valid_name(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidEventType::Grammar(shorten(s)))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// What a subscription listens to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventTypePattern {
    /// `*`: every event type.
    All,
    /// `invoice.*`: every type whose name starts with `invoice.` (the prefix
    /// is stored with its trailing dot).
    Prefix(String),
    /// `invoice.paid`: exactly this type.
    Exact(EventType),
}

impl EventTypePattern {
    /// Parses a pattern.
    pub fn parse(s: &str) -> Result<Self, InvalidEventType> {
        if s == "*" {
            return Ok(Self::All);
        }
        if let Some(prefix) = s.strip_suffix(".*")
            && valid_name(prefix)
            && s.len() <= MAX_EVENT_TYPE_LEN
        {
            return Ok(Self::Prefix(format!("{prefix}.")));
        }
        if s.contains('*') {
            return Err(InvalidEventType::Wildcard(shorten(s)));
        }
        EventType::parse(s).map(Self::Exact)
    }

    /// Whether an event of type `t` matches this pattern.
    pub fn matches(&self, t: &EventType) -> bool {
        match self {
            Self::All => true,
            Self::Prefix(p) => t.as_str().starts_with(p.as_str()),
            Self::Exact(e) => e == t,
        }
    }
}

impl fmt::Display for EventTypePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("*"),
            Self::Prefix(p) => write!(f, "{p}*"),
            Self::Exact(e) => f.write_str(e.as_str()),
        }
    }
}

impl Serialize for EventTypePattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EventTypePattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> EventType {
        EventType::parse(s).unwrap()
    }

    #[test]
    fn patterns_match_as_documented() {
        let cases = [
            ("*", "invoice.paid", true),
            ("invoice.*", "invoice.paid", true),
            ("invoice.*", "invoice.paid.late", true),
            ("invoice.*", "invoice", false),
            ("invoice.*", "invoices.paid", false),
            ("invoice.paid", "invoice.paid", true),
            ("invoice.paid", "invoice.paid.late", false),
        ];
        for (pattern, ty, want) in cases {
            let p = EventTypePattern::parse(pattern).unwrap();
            assert_eq!(p.matches(&t(ty)), want, "{pattern} vs {ty}");
        }
    }

    #[test]
    fn bad_names_and_patterns_are_refused() {
        for bad in ["", ".", "a..b", "a.", "has space", "é", &"a".repeat(129)] {
            assert!(EventType::parse(bad).is_err(), "{bad:?}");
        }
        for bad in ["**", "a*", "*.a", "a.*.b", "a.**", ""] {
            assert!(EventTypePattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn patterns_round_trip_through_text() {
        for s in ["*", "invoice.*", "invoice.paid"] {
            assert_eq!(EventTypePattern::parse(s).unwrap().to_string(), s);
        }
    }
}
