//! Every input limit of the API, in one place.
//!
//! Each limit is answered with a 4xx and the one JSON error shape
//! (`{"error":{"code","message"}}`); the message names the field (or the
//! parameter, or the body) and the limit. README.md's "Limits" table lists
//! the same values; `tests::the_readme_lists_every_limit` keeps the two in
//! step.
//!
//! | limit | value | answer |
//! |---|---|---|
//! | request body | [`MAX_BODY_BYTES`] (configurable) | 413 `payload_too_large` |
//! | event payload | [`MAX_PAYLOAD_BYTES`] (configurable) | 413 `payload_too_large` |
//! | event payload nesting | [`MAX_PAYLOAD_DEPTH`] | 422 `validation_failed` |
//! | request body nesting | [`MAX_BODY_DEPTH`] | 400 `bad_request` |
//! | event type name | [`MAX_EVENT_TYPE_LEN`], grammar | 422 `validation_failed` |
//! | URL | [`MAX_URL_LEN`] | 422 `validation_failed` |
//! | event types per subscription | [`MAX_EVENT_TYPES`] | 422 `validation_failed` |
//! | description | [`MAX_DESCRIPTION_CHARS`] | 422 `validation_failed` |
//! | token label | [`MAX_LABEL_CHARS`] | 422 `validation_failed` |
//! | customer id | [`MAX_CUSTOMER_ID_LEN`] | 422 / 400 |
//! | idempotency key | [`MAX_IDEMPOTENCY_KEY_CHARS`] | 422 `validation_failed` |
//! | page size | [`MAX_PAGE_SIZE`] | 400 `bad_request` |
//! | replay job `types` | [`MAX_REPLAY_TYPES`] | 422 `validation_failed` |
//! | failed authentications | [`AUTH_FAILURE_BURST`], then one per [`AUTH_FAILURE_REFILL`] | 429 `too_many_auth_failures` |
//!
//! **Outbound headers.** Customers supply no outbound header names or
//! values: every request hookd sends carries only its own fixed headers
//! (content type, user agent and the Standard Webhooks `webhook-id`,
//! `webhook-timestamp`, `webhook-signature`, whose values hookd makes), so
//! no CR/LF can be injected into an outbound request.

use std::time::Duration;

pub use hookd_domain::destination::MAX_URL_LEN;
pub use hookd_domain::event_type::MAX_EVENT_TYPE_LEN;
pub use hookd_domain::subscription::MAX_EVENT_TYPES;

/// The largest request body, in bytes, by default (1 MiB);
/// `ApiConfig::max_body_bytes` changes it. Over it: 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The largest event payload, in bytes of its JSON text as sent, by default
/// (256 KiB); `ApiConfig::max_payload_bytes` changes it. Over it: 413.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// How deeply an event payload may nest arrays and objects: `{}` and `[]`
/// are depth 1, `{"a":[1]}` depth 2. Deeper: 422 naming `payload`. Receivers
/// parse what we deliver; a bound here keeps a hostile producer from
/// handing every consumer a stack-exhausting document.
pub const MAX_PAYLOAD_DEPTH: usize = 64;

/// How deeply any JSON request body may nest. An event's payload sits one
/// level inside its body, so this leaves room for [`MAX_PAYLOAD_DEPTH`] and
/// the payload's own, more precise, message. Deeper: 400 before parsing.
pub const MAX_BODY_DEPTH: usize = MAX_PAYLOAD_DEPTH + 8;

/// The longest subscription description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;

/// The longest token label, in characters.
pub const MAX_LABEL_CHARS: usize = 200;

/// The longest customer id, in bytes (grammar in `hookd_domain::CustomerId`).
pub const MAX_CUSTOMER_ID_LEN: usize = hookd_domain::CustomerId::MAX_LEN;

/// The longest idempotency key, in characters (and at least 1).
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

/// Page size of the list routes when `limit` is not given.
pub const DEFAULT_PAGE_SIZE: u32 = 50;

/// The largest page a list route serves (`limit` 1 to this).
pub const MAX_PAGE_SIZE: u32 = 250;

/// How many deliveries `GET /events/{id}` lists at most (cut past it).
pub const MAX_EVENT_DELIVERIES: u32 = 1000;

/// Most event types one replay job may name.
pub const MAX_REPLAY_TYPES: usize = 100;

/// `GET /subscriptions/{id}/stats`: days when `days` is not given.
pub const DEFAULT_STATS_DAYS: u32 = 7;

/// `GET /subscriptions/{id}/stats`: most days one request may cover.
pub const MAX_STATS_DAYS: u32 = 3660;

/// Failed authentications (no token, or an unknown one) one client address
/// may make in a burst before it is refused with 429, by default;
/// `ApiConfig::auth_failures` changes it.
pub const AUTH_FAILURE_BURST: u32 = 10;

/// After the burst, one more failed authentication is allowed per this
/// long, by default.
pub const AUTH_FAILURE_REFILL: Duration = Duration::from_secs(1);

/// The nesting depth of a JSON text: the most arrays and objects open at
/// once. Scans the bytes once, allocating nothing; brackets inside strings
/// (escaped quotes included) do not count. Meant for text that is, or is
/// about to be checked to be, JSON: for other bytes the answer is only an
/// upper bound of what a parser would reach.
pub fn json_depth(text: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_open_containers_not_brackets_in_strings() {
        assert_eq!(json_depth(b"1"), 0);
        assert_eq!(json_depth(b"\"[[[\""), 0);
        assert_eq!(json_depth(b"{}"), 1);
        assert_eq!(json_depth(br#"{"a":[1,{"b":[]}],"c":{}}"#), 4);
        assert_eq!(json_depth(br#"["\"[[", "\\", [ ]]"#), 2);
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(json_depth(deep.as_bytes()), 100);
    }

    /// README.md's "Limits" table names every limit with its value.
    #[test]
    fn the_readme_lists_every_limit() {
        let readme = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
        let text = std::fs::read_to_string(readme).unwrap();
        let section = text
            .split("## Limits")
            .nth(1)
            .expect("README.md has a `## Limits` section");
        let section = section.split("\n## ").next().unwrap();
        let values = [
            ("request body", "1 MiB".to_owned()),
            ("event payload size", "256 KiB".to_owned()),
            ("payload nesting", MAX_PAYLOAD_DEPTH.to_string()),
            ("body nesting", MAX_BODY_DEPTH.to_string()),
            ("event type", MAX_EVENT_TYPE_LEN.to_string()),
            ("URL", MAX_URL_LEN.to_string()),
            ("event types per subscription", MAX_EVENT_TYPES.to_string()),
            ("description", MAX_DESCRIPTION_CHARS.to_string()),
            ("token label", MAX_LABEL_CHARS.to_string()),
            ("customer id", MAX_CUSTOMER_ID_LEN.to_string()),
            ("idempotency key", MAX_IDEMPOTENCY_KEY_CHARS.to_string()),
            ("page size", MAX_PAGE_SIZE.to_string()),
            ("deliveries of one event", MAX_EVENT_DELIVERIES.to_string()),
            ("replay job types", MAX_REPLAY_TYPES.to_string()),
            ("stats days", MAX_STATS_DAYS.to_string()),
            ("failed authentications", AUTH_FAILURE_BURST.to_string()),
        ];
        assert_eq!(MAX_BODY_BYTES, 1024 * 1024);
        assert_eq!(MAX_PAYLOAD_BYTES, 256 * 1024);
        for (name, value) in values {
            let row = section
                .lines()
                .find(|l| l.starts_with('|') && l.contains(name))
                .unwrap_or_else(|| panic!("README's Limits table has no row for {name}"));
            assert!(
                row.contains(&value),
                "README's row for {name} does not say {value}: {row}"
            );
        }
    }
}
