//! Signing and sending one attempt.
//!
//! The request is a Standard Webhooks message: the body envelope
//! `{"id","event_id","type","created_at","data"}`, and the headers
//! `webhook-id` (the delivery's stable idempotency key), `webhook-timestamp`
//! and `webhook-signature`, plus `Idempotency-Key`. Redirects are never
//! followed, and the whole exchange (connect, headers, body) runs under one
//! deadline, reading at most a bounded number of body bytes, so a trickling
//! or endless body cannot hold a worker past its timeout.

use std::error::Error as _;
use std::time::Duration;

use hookd_domain::classify::AttemptResult;
use hookd_domain::delivery::ErrorClass;
use hookd_domain::signing;
use hookd_domain::{Clock, Timestamp};
use hookd_store::{Attempt, ClaimedDelivery, MAX_SNIPPET_BYTES};

/// The `User-Agent` of every attempt.
pub const USER_AGENT: &str = concat!("hookd/", env!("CARGO_PKG_VERSION"), " (+webhooks)");

/// Sends attempts over a pooled HTTP client.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    timeout: Duration,
    max_response_bytes: usize,
}

/// What one attempt produced.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The attempt as it will be recorded.
    pub attempt: Attempt,
    /// The result, for classification.
    pub result: AttemptResult,
}

impl Sender {
    /// A sender with one shared connection pool.
    pub fn new(timeout: Duration, max_response_bytes: usize) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(USER_AGENT)
            .connect_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            client,
            timeout,
            max_response_bytes,
        })
    }

    /// Makes one attempt of `claimed` as its `number`-th attempt.
    pub async fn send(&self, claimed: &ClaimedDelivery, number: u32, clock: &dyn Clock) -> Sent {
        let started_at = clock.now();
        let started = tokio::time::Instant::now();
        let msg_id = signing::idempotency_key(&claimed.event.id, &claimed.subscription.id);
        let body = envelope(&msg_id, claimed);
        let ts = started_at.timestamp();
        let signature = signing::signature_header(
            claimed.subscription.keys.live(started_at),
            &msg_id,
            ts,
            body.as_bytes(),
        );
        let request = self
            .client
            .post(claimed.subscription.url.url().clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &msg_id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .header("idempotency-key", &msg_id)
            .body(body);

        // One deadline for the whole exchange. Headers must arrive before it;
        // the body is read until it, the size limit, or its end, whichever
        // comes first. A status already received stands even if the body
        // is cut off: the destination has answered.
        let deadline = tokio::time::Instant::now() + self.timeout;
        let (result, snippet) = match tokio::time::timeout_at(deadline, request.send()).await {
            Err(_) => (AttemptResult::Error(ErrorClass::Timeout), None),
            Ok(Err(e)) => (AttemptResult::Error(classify_error(&e)), None),
            Ok(Ok(response)) => {
                let code = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, started_at));
                let snippet = read_bounded(response, self.max_response_bytes, deadline).await;
                (AttemptResult::Status { code, retry_after }, Some(snippet))
            }
        };
        let (status, error_class) = match result {
            AttemptResult::Status { code, .. } => (Some(code), None),
            AttemptResult::Error(class) => (None, Some(class)),
        };
        Sent {
            attempt: Attempt {
                number,
                started_at,
                duration: started.elapsed(),
                status,
                error_class,
                response_snippet: snippet.filter(|s| !s.is_empty()),
            },
            result,
        }
    }
}

/// The body hookd sends. The producer's payload is spliced in as it was
/// received; the other fields are ids, a type name and a timestamp, whose
/// grammars need no JSON escaping.
pub fn envelope(msg_id: &str, claimed: &ClaimedDelivery) -> String {
    let e = &claimed.event;
    let created = e
        .created_at
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut s = String::with_capacity(e.payload.len() + 160);
    s.push_str(r#"{"id":""#);
    s.push_str(msg_id);
    s.push_str(r#"","event_id":""#);
    s.push_str(&e.id.to_string());
    s.push_str(r#"","type":""#);
    s.push_str(e.event_type.as_str());
    s.push_str(r#"","created_at":""#);
    s.push_str(&created);
    s.push_str(r#"","data":"#);
    s.push_str(&e.payload);
    s.push('}');
    s
}

/// Reads at most `max` bytes of the body, until `deadline`, and keeps at
/// most [`MAX_SNIPPET_BYTES`] of it as text. A body cut off early (by the
/// limit, the deadline or the peer) does not change the attempt's status.
async fn read_bounded(
    mut response: reqwest::Response,
    max: usize,
    deadline: tokio::time::Instant,
) -> String {
    let mut kept = Vec::new();
    let mut read = 0usize;
    while read < max {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                read += chunk.len();
                if kept.len() < MAX_SNIPPET_BYTES {
                    let room = MAX_SNIPPET_BYTES - kept.len();
                    kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
            }
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => break,
        }
    }
    snippet_text(&kept)
}

/// Lossy UTF-8 of at most [`MAX_SNIPPET_BYTES`] bytes, never splitting a
/// character.
fn snippet_text(bytes: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(bytes).into_owned();
    while s.len() > MAX_SNIPPET_BYTES {
        s.pop();
    }
    s
}

/// `Retry-After` as delta-seconds or an HTTP date.
fn parse_retry_after(v: &str, now: Timestamp) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at: chrono::DateTime<chrono::Utc> = httpdate::parse_http_date(v).ok()?.into();
    (at - now).to_std().ok()
}

fn classify_error(e: &reqwest::Error) -> ErrorClass {
    if e.is_timeout() {
        return ErrorClass::Timeout;
    }
    if e.is_redirect() {
        return ErrorClass::Redirect;
    }
    let chain = {
        let mut text = e.to_string();
        let mut src = e.source();
        while let Some(s) = src {
            text.push_str(": ");
            text.push_str(&s.to_string());
            src = s.source();
        }
        text.to_ascii_lowercase()
    };
    if chain.contains("dns error")
        || chain.contains("failed to lookup")
        || chain.contains("name or service not known")
    {
        ErrorClass::Dns
    } else if chain.contains("certificate") || chain.contains("tls") || chain.contains("handshake")
    {
        ErrorClass::Tls
    } else if e.is_connect() || chain.contains("connection") || chain.contains("broken pipe") {
        ErrorClass::Connection
    } else {
        ErrorClass::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_accepts_seconds_and_dates() {
        let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        assert_eq!(parse_retry_after("5", now), Some(Duration::from_secs(5)));
        let later = httpdate::fmt_http_date((now + chrono::Duration::seconds(30)).into());
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn snippets_are_bounded_and_never_split_a_character() {
        let long = "é".repeat(2000);
        let s = snippet_text(&long.as_bytes()[..MAX_SNIPPET_BYTES - 1]);
        assert!(s.len() <= MAX_SNIPPET_BYTES);
        assert!(s.chars().all(|c| c == 'é'));
    }
}
