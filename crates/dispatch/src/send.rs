//! Signing and sending one attempt.
//!
//! The request is a Standard Webhooks message: the body envelope
//! `{"id","event_id","type","created_at","data"}`, and the headers
//! `webhook-id` (the delivery's stable idempotency key), `webhook-timestamp`
//! and `webhook-signature`, plus `Idempotency-Key`. Redirects are never
//! followed, and the whole exchange (connect, headers, body) runs under one
//! deadline, reading at most a bounded number of body bytes, so a trickling
//! or endless body cannot hold a worker past its timeout.
//!
//! Before anything is sent, the destination's address is checked against the
//! [`DestinationPolicy`](hookd_domain::destination::DestinationPolicy) (see
//! [`egress`](crate::egress)); a refusal is recorded as
//! `forbidden_destination` and no request leaves the process.
//!
//! A receiver gets exactly these headers: `host`, `content-type`,
//! `content-length`, `accept` (`*/*`), `user-agent` ([`USER_AGENT`]),
//! `webhook-id`, `webhook-timestamp`, `webhook-signature` and
//! `idempotency-key`. Nothing internal to hookd (worker, lease, attempt
//! number, …) is sent.
//!
//! Attempts go to hyper-util's pooled client directly: reqwest's layers
//! (its redirect and retry services, which clone each request's headers,
//! and a URL parse per request and per response) were about a tenth of
//! hookd's CPU in `fanout`. Only attempts through an outbound proxy take
//! reqwest, which speaks to HTTP and HTTPS proxies (absolute-form requests,
//! `CONNECT` tunnels).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use http_body_util::{BodyExt as _, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use hookd_domain::classify::AttemptResult;
use hookd_domain::delivery::ErrorClass;
use hookd_domain::signing;
use hookd_domain::{Clock, Timestamp};
use hookd_store::{Attempt, ClaimedDelivery, MAX_SNIPPET_BYTES};

use crate::egress::{CheckedResolver, Egress, ForbiddenAddress, LookupError, resolve_checked};

/// The `User-Agent` of every attempt: `hookd/<version> (+webhooks)`. Stable,
/// so receivers may allowlist or route on it; it names no deployment.
pub const USER_AGENT: &str = concat!("hookd/", env!("CARGO_PKG_VERSION"), " (+webhooks)");

/// The direct path's client: hyper-util's pool over the checked resolver,
/// TLS by rustls (the platform's roots), HTTP/1.1 or HTTP/2 by ALPN.
type DirectClient =
    hyper_util::client::legacy::Client<HttpsConnector<HttpConnector<CheckedResolver>>, Full<Bytes>>;

/// The HTTP client attempts go through.
#[derive(Debug, Clone)]
enum Client {
    /// No proxy: hyper-util's pooled client, every host name resolved and
    /// checked by [`CheckedResolver`].
    Direct(Box<DirectClient>),
    /// Through the operator's proxy: reqwest, which handles HTTP and HTTPS
    /// proxies (absolute-form, `CONNECT`, credentials in the proxy URL).
    Proxied(reqwest::Client),
}

/// Why a [`Sender`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SenderError {
    /// The outbound proxy's client could not be built (a bad proxy URL).
    #[error("could not build the client for the outbound proxy")]
    Proxy(#[source] reqwest::Error),
    /// TLS could not be set up (no usable root certificates).
    #[error("could not set up TLS")]
    Tls(#[source] rustls::Error),
}

/// Sends attempts over a pooled HTTP client.
#[derive(Debug, Clone)]
pub struct Sender {
    client: Client,
    timeout: Duration,
    max_response_bytes: usize,
    egress: Egress,
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
    /// A sender with one shared connection pool, sending as `egress`
    /// says: host names resolved through its resolver and checked against
    /// its policy on every new connection, through its proxy if it has one.
    ///
    /// The pool keeps up to `max_idle_per_host` idle connections to each
    /// host (for 60 s). It should be at least the most attempts a host may
    /// have in flight: below that, every dip in a busy host's in-flight
    /// count closes connections that the next claim opens again (a new TCP
    /// connection, and a TLS handshake, per attempt for the host). The pool
    /// never holds more idle connections than were open at once, and
    /// admission bounds those.
    pub fn new(
        timeout: Duration,
        max_response_bytes: usize,
        max_idle_per_host: usize,
        egress: Egress,
    ) -> Result<Self, SenderError> {
        let client = match &egress.proxy {
            // The proxy resolves the target; this client resolves only the
            // proxy's own name, which the policy must not judge (a proxy
            // is typically private). The target is checked in `send`.
            Some(proxy) => Client::Proxied(proxied_client(proxy, timeout, max_idle_per_host)?),
            // No proxy variables (HTTP(S)_PROXY, ALL_PROXY) are read here:
            // egress goes where the operator configured it.
            None => Client::Direct(Box::new(direct_client(
                &egress,
                timeout,
                max_idle_per_host,
            )?)),
        };
        Ok(Self {
            client,
            timeout,
            max_response_bytes,
            egress,
        })
    }

    /// The sender a dispatcher with `config` uses. Any one host may have
    /// up to every attempt in flight (its concurrency is the server's
    /// default or its subscriptions' `max_concurrency`, up to 1,000), so
    /// idle connections up to `max_in_flight` stay pooled per host: no
    /// host's connections churn.
    pub fn for_dispatch(config: &crate::DispatchConfig) -> Result<Self, SenderError> {
        Self::new(
            config.attempt_timeout,
            config.max_response_bytes,
            config.max_in_flight,
            config.egress.clone(),
        )
    }

    /// Checks what the connector's resolver will not see: an IP-literal host
    /// (never resolved), and with a proxy, the host itself (the proxy
    /// resolves it). `Err` is the error class to record, without sending.
    async fn precheck(&self, url: &url::Url) -> Result<(), ErrorClass> {
        let policy = &self.egress.policy;
        if !policy.checks_addresses() {
            return Ok(());
        }
        let refuse = |e: ForbiddenAddress| {
            tracing::warn!(error = %e, "attempt refused: forbidden destination");
            ErrorClass::ForbiddenDestination
        };
        match url.host() {
            Some(url::Host::Ipv4(ip)) => {
                crate::egress::check_addrs(policy, &ip.to_string(), &[IpAddr::V4(ip)])
                    .map_err(refuse)
            }
            Some(url::Host::Ipv6(ip)) => {
                crate::egress::check_addrs(policy, &ip.to_string(), &[IpAddr::V6(ip)])
                    .map_err(refuse)
            }
            Some(url::Host::Domain(host)) if self.egress.proxy.is_some() => {
                // Residual window: the proxy resolves the name again later.
                match resolve_checked(self.egress.resolver.as_ref(), policy, host).await {
                    Ok(_) => Ok(()),
                    Err(LookupError::Forbidden(e)) => Err(refuse(e)),
                    Err(LookupError::Dns { .. }) => Err(ErrorClass::Dns),
                }
            }
            _ => Ok(()),
        }
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
        let request = Request::new(claimed.subscription.url.url(), &msg_id, ts, signature, body);

        // One deadline for the whole exchange. Headers must arrive before it;
        // the body is read until it, the size limit, or its end, whichever
        // comes first. A status already received stands even if the body
        // is cut off: the destination has answered.
        let deadline = tokio::time::Instant::now() + self.timeout;
        let checked =
            tokio::time::timeout_at(deadline, self.precheck(claimed.subscription.url.url())).await;
        let (result, snippet) = match checked {
            Err(_) => (AttemptResult::Error(ErrorClass::Timeout), None),
            Ok(Err(class)) => (AttemptResult::Error(class), None),
            Ok(Ok(())) => match request {
                Some(request) => self.exchange(request, started_at, deadline).await,
                None => not_http(),
            },
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

/// How long a pooled connection may stay idle before it is closed.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The client of attempts without a proxy: every host name resolved and
/// checked by [`CheckedResolver`], TLS by rustls with the platform's roots.
fn direct_client(
    egress: &Egress,
    timeout: Duration,
    max_idle_per_host: usize,
) -> Result<DirectClient, SenderError> {
    let mut http = HttpConnector::new_with_resolver(CheckedResolver::new(
        egress.resolver.clone(),
        egress.policy,
    ));
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(timeout));
    // reqwest's defaults, which attempts had before: a pooled connection to
    // a peer that vanished is found out by TCP keepalive, and
    // unacknowledged data gives up after 30 s.
    http.set_keepalive(Some(Duration::from_secs(15)));
    http.set_keepalive_interval(Some(Duration::from_secs(15)));
    http.set_keepalive_retries(Some(3));
    #[cfg(target_os = "linux")]
    http.set_tcp_user_timeout(Some(Duration::from_secs(30)));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(SenderError::Tls)?;
    let tls = rustls_platform_verifier::BuilderVerifierExt::with_platform_verifier(tls)
        .map_err(SenderError::Tls)?
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    Ok(
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(max_idle_per_host)
            .pool_timer(TokioTimer::new())
            .build(https),
    )
}

/// The client of attempts through the operator's proxy. Its headers are the
/// request's own ([`Request`]), user agent included.
fn proxied_client(
    proxy: &str,
    timeout: Duration,
    max_idle_per_host: usize,
) -> Result<reqwest::Client, SenderError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(timeout)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(max_idle_per_host)
        .tcp_nodelay(true)
        .proxy(reqwest::Proxy::all(proxy).map_err(SenderError::Proxy)?)
        .build()
        .map_err(SenderError::Proxy)
}

/// One attempt's request, before it is put in the client's form: both
/// clients send these headers (reqwest adds none of its own where one is
/// set).
struct Request<'a> {
    url: &'a url::Url,
    headers: HeaderMap,
    body: String,
}

impl<'a> Request<'a> {
    /// `None` if a value cannot be a header (never for the ASCII id,
    /// timestamp and signature hookd makes).
    fn new(
        url: &'a url::Url,
        msg_id: &str,
        timestamp: i64,
        signature: String,
        body: String,
    ) -> Option<Self> {
        let id = HeaderValue::from_str(msg_id).ok()?;
        let mut headers = HeaderMap::with_capacity(7);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        headers.insert("webhook-id", id.clone());
        headers.insert("webhook-timestamp", HeaderValue::from(timestamp));
        headers.insert("webhook-signature", HeaderValue::try_from(signature).ok()?);
        headers.insert("idempotency-key", id);
        Some(Self { url, headers, body })
    }

    /// As an `http` request for the direct client. `None` if the URL cannot
    /// be a request target (never for a URL hookd accepted).
    fn into_http(self) -> Option<http::Request<Full<Bytes>>> {
        // Everything but the fragment, which is never sent.
        let uri = http::Uri::try_from(&self.url[..url::Position::AfterQuery]).ok()?;
        let mut request = http::Request::new(Full::new(Bytes::from(self.body)));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = uri;
        *request.headers_mut() = self.headers;
        Some(request)
    }

    /// As a reqwest request, for the proxy's client.
    fn into_reqwest(self, client: &reqwest::Client) -> reqwest::RequestBuilder {
        client
            .post(self.url.clone())
            .headers(self.headers)
            .body(self.body)
    }
}

/// The result of an attempt that could not be put into HTTP: nothing was
/// sent.
fn not_http() -> (AttemptResult, Option<String>) {
    tracing::warn!("attempt not sent: its URL or a header is not valid HTTP");
    (AttemptResult::Error(ErrorClass::Other), None)
}

impl Sender {
    /// Sends `request` and reads the answer, all before `deadline`.
    async fn exchange(
        &self,
        request: Request<'_>,
        started_at: Timestamp,
        deadline: tokio::time::Instant,
    ) -> (AttemptResult, Option<String>) {
        let response = match &self.client {
            Client::Direct(client) => {
                let Some(request) = request.into_http() else {
                    return not_http();
                };
                match tokio::time::timeout_at(deadline, client.request(request)).await {
                    Err(_) => return (AttemptResult::Error(ErrorClass::Timeout), None),
                    Ok(Err(e)) => return failed(&e, e.is_connect()),
                    Ok(Ok(response)) => response.map(http_body_util::Either::Left),
                }
            }
            Client::Proxied(client) => {
                let request = request.into_reqwest(client);
                match tokio::time::timeout_at(deadline, request.send()).await {
                    Err(_) => return (AttemptResult::Error(ErrorClass::Timeout), None),
                    Ok(Err(e)) => return failed(&e, e.is_connect()),
                    Ok(Ok(response)) => {
                        http::Response::from(response).map(http_body_util::Either::Right)
                    }
                }
            }
        };
        let code = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, started_at));
        let snippet = read_bounded(response.into_body(), self.max_response_bytes, deadline).await;
        (AttemptResult::Status { code, retry_after }, Some(snippet))
    }
}

/// The result of an attempt that got no answer: the error's class (see
/// [`classify_error`]); a refusal by the egress policy is logged.
fn failed(e: &(dyn std::error::Error + 'static), connect: bool) -> (AttemptResult, Option<String>) {
    let class = classify_error(e, connect);
    if class == ErrorClass::ForbiddenDestination {
        tracing::warn!(error = %error_chain(e), "attempt refused: forbidden destination");
    }
    (AttemptResult::Error(class), None)
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
async fn read_bounded<B>(mut body: B, max: usize, deadline: tokio::time::Instant) -> String
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let mut kept = Vec::new();
    let mut read = 0usize;
    while read < max {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                // Trailers carry no body bytes.
                let Ok(chunk) = frame.into_data() else {
                    continue;
                };
                read += chunk.len();
                if kept.len() < MAX_SNIPPET_BYTES {
                    let room = MAX_SNIPPET_BYTES - kept.len();
                    kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
            }
            Ok(None) | Ok(Some(Err(_))) | Err(_) => break,
        }
    }
    snippet_text(&kept)
}

/// Lossy UTF-8 of at most [`MAX_SNIPPET_BYTES`] bytes, never splitting a
/// character.
fn snippet_text(bytes: &[u8]) -> String {
    // Untrusted bytes: invalid UTF-8 and NUL (which PostgreSQL's `text`
    // refuses, so the attempt could never be recorded) become U+FFFD.
    let mut s = String::from_utf8_lossy(bytes).replace('\0', "\u{FFFD}");
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

/// The class of an error that ended an attempt before any answer: `connect`
/// says whether it happened while connecting (the client's own flag).
fn classify_error(e: &(dyn std::error::Error + 'static), connect: bool) -> ErrorClass {
    // The connect timeout: an `io::Error` from hyper-util's connector,
    // reqwest's own error from the proxy's client.
    if in_chain(e, |s| {
        s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            || s.downcast_ref::<reqwest::Error>()
                .is_some_and(reqwest::Error::is_timeout)
    }) {
        return ErrorClass::Timeout;
    }
    if in_chain(e, |s| s.downcast_ref::<ForbiddenAddress>().is_some()) {
        return ErrorClass::ForbiddenDestination;
    }
    let chain = error_chain(e).to_ascii_lowercase();
    if chain.contains("forbidden destination:") {
        return ErrorClass::ForbiddenDestination;
    }
    // The handshake failed (a bad certificate, a peer that speaks no TLS):
    // rustls's own error, somewhere down the chain.
    if in_chain(e, |s| s.is::<rustls::Error>()) {
        return ErrorClass::Tls;
    }
    if chain.contains("dns error")
        || chain.contains("failed to lookup")
        || chain.contains("name or service not known")
    {
        ErrorClass::Dns
    } else if chain.contains("certificate") || chain.contains("tls") || chain.contains("handshake")
    {
        ErrorClass::Tls
    } else if connect || chain.contains("connection") || chain.contains("broken pipe") {
        ErrorClass::Connection
    } else {
        ErrorClass::Other
    }
}

/// Whether `e` or any error under it is one `test` picks out (our
/// resolver's refusal, say, down the connector's error chain). An
/// `io::Error` wrapping another error is looked into: its `source` skips
/// the error it wraps (tokio-rustls wraps rustls's errors so, twice).
fn in_chain(
    e: &(dyn std::error::Error + 'static),
    test: impl Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    let mut next = Some(e);
    while let Some(s) = next {
        if test(s) {
            return true;
        }
        next = match s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => s.source(),
        };
    }
    false
}

/// An error and its sources, `: `-separated.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    text
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

    #[test]
    fn snippets_hold_no_nul_and_no_invalid_utf8() {
        let s = snippet_text(b"ok\0nul\xff");
        assert_eq!(s, "ok\u{FFFD}nul\u{FFFD}");
    }
}

/// The connect-time check, end to end through the HTTP client, against receivers on
/// loopback addresses and a resolver with fixed answers.
#[cfg(test)]
mod egress_tests {
    use std::io::{Read as _, Write as _};
    use std::net::{Ipv4Addr, TcpListener};
    use std::sync::Arc;

    use hookd_domain::destination::{DestinationPolicy, DestinationUrl, parse_cidr};
    use hookd_domain::subscription::RetryPolicy;

    use super::*;
    use crate::egress::{Egress, StaticResolver};
    use crate::record::tests::{claimed, clock};

    /// A one-request HTTP receiver on `ip`: answers 204 and hands back the
    /// request head.
    fn receiver(ip: Ipv4Addr) -> (TcpListener, u16) {
        let l = TcpListener::bind((ip, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    fn serve_one(l: TcpListener) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Head, then the body's content-length bytes.
            loop {
                let n = s.read(&mut chunk).unwrap();
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len || n == 0 {
                        s.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                            .unwrap();
                        return text[..end].to_owned();
                    }
                }
                if n == 0 {
                    return text;
                }
            }
        })
    }

    /// Whether a connection is waiting on `l` (the handshake completes
    /// before the client's connect returns, so no wait is needed).
    fn was_connected(l: &TcpListener) -> bool {
        l.set_nonblocking(true).unwrap();
        !matches!(l.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    fn sender(policy: DestinationPolicy, resolver: Arc<StaticResolver>) -> Sender {
        Sender::new(
            Duration::from_secs(10),
            64 * 1024,
            64,
            Egress {
                policy,
                resolver,
                proxy: None,
            },
        )
        .unwrap()
    }

    async fn attempt(sender: &Sender, url: &str) -> Sent {
        let clock = clock();
        let mut c = claimed(&clock, 0, RetryPolicy::default());
        c.subscription.url = DestinationUrl::parse(url, DestinationPolicy::AllowPrivate).unwrap();
        sender.send(&c, 1, &clock).await
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn a_name_that_rebinds_to_a_forbidden_address_is_refused_before_connecting() {
        let (listener, port) = receiver(Ipv4Addr::LOCALHOST);
        // Every address of the creation check's examples (each forbidden
        // range and form, its spellings normalised), as a DNS answer: each
        // must refuse the attempt. Names (`localhost`) are not answers.
        let mut forbidden: Vec<IpAddr> = hookd_domain::destination::FORBIDDEN_EXAMPLES
            .iter()
            .filter_map(|u| {
                let d = DestinationUrl::parse(u, DestinationPolicy::AllowPrivate).unwrap();
                d.host()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                    .ok()
            })
            .collect();
        forbidden.sort();
        forbidden.dedup();
        assert!(forbidden.len() >= 45, "{forbidden:?}");
        let mut answers: Vec<Vec<IpAddr>> = forbidden.iter().map(|a| vec![*a]).collect();
        // Any forbidden address refuses the lookup, even beside a public one.
        answers.push(vec![ip("93.184.216.34"), ip("127.0.0.1")]);
        for answer in answers {
            let resolver = Arc::new(StaticResolver::new([("rebind.test", answer.clone())]));
            let s = sender(DestinationPolicy::PublicOnly, resolver.clone());
            let sent = attempt(&s, &format!("http://rebind.test:{port}/hook")).await;
            assert_eq!(
                sent.result,
                AttemptResult::Error(ErrorClass::ForbiddenDestination),
                "{answer:?}"
            );
            assert_eq!(
                sent.attempt.error_class,
                Some(ErrorClass::ForbiddenDestination)
            );
            assert_eq!(sent.attempt.status, None);
            assert_eq!(
                resolver.lookups(),
                1,
                "resolved through the injected resolver"
            );
            // The refusal itself travels through the connector's error
            // chain, as the resolver's own error.
            let Client::Direct(client) = &s.client else {
                panic!("no proxy: the direct client")
            };
            let err = client
                .get(format!("http://rebind.test:{port}/").parse().unwrap())
                .await
                .unwrap_err();
            assert!(err.is_connect(), "{}", error_chain(&err));
            assert!(
                in_chain(&err, |e| e.downcast_ref::<ForbiddenAddress>().is_some()),
                "{}",
                error_chain(&err)
            );
        }
        assert!(!was_connected(&listener), "no request reached the receiver");
    }

    #[tokio::test]
    async fn forbidden_ip_literals_are_refused_without_a_lookup() {
        let (listener, port) = receiver(Ipv4Addr::LOCALHOST);
        let resolver = Arc::new(StaticResolver::default());
        let s = sender(DestinationPolicy::PublicOnly, resolver.clone());
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://2130706433:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
        ] {
            let sent = attempt(&s, &url).await;
            assert_eq!(
                sent.result,
                AttemptResult::Error(ErrorClass::ForbiddenDestination),
                "{url}"
            );
        }
        assert_eq!(resolver.lookups(), 0);
        assert!(!was_connected(&listener));
    }

    #[tokio::test]
    async fn the_connection_goes_to_the_checked_allowlisted_address() {
        // Only 127.0.0.2 is allowed; the name exists nowhere but in this
        // resolver, so reaching the receiver proves the connector used its answer.
        let (listener, port) = receiver(Ipv4Addr::new(127, 0, 0, 2));
        let server = serve_one(listener);
        let resolver = Arc::new(StaticResolver::new([(
            "allowed.test",
            vec![ip("127.0.0.2")],
        )]));
        let policy = DestinationPolicy::public_only(vec![parse_cidr("127.0.0.2/32").unwrap()]);
        let s = sender(policy, resolver.clone());
        let sent = attempt(&s, &format!("http://allowed.test:{port}/hook")).await;
        assert_eq!(sent.attempt.status, Some(204), "{:?}", sent.result);
        assert_eq!(resolver.lookups(), 1);
        let head = server.join().unwrap();
        assert!(head.starts_with("POST /hook HTTP/1.1"), "{head}");

        // The same name answering a loopback address outside the allowlist
        // is refused.
        let (other, port) = receiver(Ipv4Addr::LOCALHOST);
        let resolver = Arc::new(StaticResolver::new([(
            "allowed.test",
            vec![ip("127.0.0.1")],
        )]));
        let s = sender(policy, resolver);
        let sent = attempt(&s, &format!("http://allowed.test:{port}/hook")).await;
        assert_eq!(
            sent.result,
            AttemptResult::Error(ErrorClass::ForbiddenDestination)
        );
        assert!(!was_connected(&other));
    }

    #[tokio::test]
    async fn a_closed_port_is_a_connection_error() {
        // Bound, then closed: nothing listens there.
        let port = receiver(Ipv4Addr::LOCALHOST).1;
        let s = sender(
            DestinationPolicy::AllowPrivate,
            Arc::new(StaticResolver::default()),
        );
        let sent = attempt(&s, &format!("http://127.0.0.1:{port}/")).await;
        assert_eq!(sent.result, AttemptResult::Error(ErrorClass::Connection));
        assert_eq!(sent.attempt.status, None);
    }

    #[tokio::test]
    async fn https_to_a_server_that_speaks_no_tls_is_a_tls_error() {
        // A receiver that answers the TLS ClientHello with plain HTTP.
        let (listener, port) = receiver(Ipv4Addr::LOCALHOST);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut hello = [0u8; 512];
            let _ = s.read(&mut hello).unwrap();
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        });
        let s = sender(
            DestinationPolicy::AllowPrivate,
            Arc::new(StaticResolver::default()),
        );
        let sent = attempt(&s, &format!("https://127.0.0.1:{port}/")).await;
        assert_eq!(sent.result, AttemptResult::Error(ErrorClass::Tls));
        server.join().unwrap();
    }

    #[tokio::test]
    async fn allow_private_turns_the_check_off() {
        let (listener, port) = receiver(Ipv4Addr::LOCALHOST);
        let server = serve_one(listener);
        let resolver = Arc::new(StaticResolver::new([("dev.test", vec![ip("127.0.0.1")])]));
        let s = sender(DestinationPolicy::AllowPrivate, resolver);
        let sent = attempt(&s, &format!("http://dev.test:{port}/")).await;
        assert_eq!(sent.attempt.status, Some(204), "{:?}", sent.result);
        server.join().unwrap();
    }

    #[tokio::test]
    async fn receivers_get_only_the_documented_headers() {
        let (listener, port) = receiver(Ipv4Addr::LOCALHOST);
        let server = serve_one(listener);
        let s = sender(
            DestinationPolicy::AllowPrivate,
            Arc::new(StaticResolver::default()),
        );
        let sent = attempt(&s, &format!("http://127.0.0.1:{port}/")).await;
        assert_eq!(sent.attempt.status, Some(204));
        let head = server.join().unwrap();
        let mut names: Vec<String> = head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_ascii_lowercase()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "accept",
                "content-length",
                "content-type",
                "host",
                "idempotency-key",
                "user-agent",
                "webhook-id",
                "webhook-signature",
                "webhook-timestamp",
            ]
        );
        assert!(
            head.contains(&format!("user-agent: {USER_AGENT}")),
            "{head}"
        );
    }

    /// A public-only sender whose requests go through a proxy on loopback.
    fn proxied_sender(resolver: Arc<StaticResolver>, proxy_port: u16) -> Sender {
        Sender::new(
            Duration::from_secs(10),
            1024,
            1024,
            Egress {
                policy: DestinationPolicy::PublicOnly,
                resolver,
                proxy: Some(format!("http://127.0.0.1:{proxy_port}")),
            },
        )
        .unwrap()
    }

    #[tokio::test]
    async fn with_a_proxy_the_target_is_checked_before_sending() {
        // The "proxy" is a listener that must never be reached.
        let (proxy, port) = receiver(Ipv4Addr::LOCALHOST);
        let resolver = Arc::new(StaticResolver::new([("rebind.test", vec![ip("10.0.0.7")])]));
        let s = proxied_sender(resolver.clone(), port);
        for url in ["http://rebind.test/hook", "http://169.254.169.254/"] {
            let sent = attempt(&s, url).await;
            assert_eq!(
                sent.result,
                AttemptResult::Error(ErrorClass::ForbiddenDestination),
                "{url}"
            );
        }
        assert_eq!(resolver.lookups(), 1);
        assert!(!was_connected(&proxy), "nothing went to the proxy");
    }

    #[tokio::test]
    async fn with_a_proxy_an_allowed_attempt_goes_through_it() {
        // The proxy (the platform's egress, trusted configuration) gets the
        // request in absolute form; the target was checked first.
        let (proxy, port) = receiver(Ipv4Addr::LOCALHOST);
        let head = serve_one(proxy);
        let resolver = Arc::new(StaticResolver::new([(
            "public.test",
            vec![ip("93.184.216.34")],
        )]));
        let s = proxied_sender(resolver.clone(), port);
        let sent = attempt(&s, "http://public.test/hook").await;
        assert!(
            matches!(sent.result, AttemptResult::Status { code: 204, .. }),
            "{sent:?}"
        );
        let head = head.join().unwrap();
        assert!(
            head.starts_with("POST http://public.test/hook HTTP/1.1"),
            "{head}"
        );
        // The request's own headers, user agent included, not reqwest's.
        assert!(
            head.contains(&format!("user-agent: {USER_AGENT}")),
            "{head}"
        );
        assert!(head.contains("webhook-signature: v1,"), "{head}");
        assert_eq!(resolver.lookups(), 1, "the target was checked");
    }
}

/// The connection pool against a busy host, over real loopback HTTP.
#[cfg(test)]
mod pool_tests {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    use hookd_domain::destination::{DestinationPolicy, DestinationUrl};
    use hookd_domain::subscription::RetryPolicy;

    use super::*;
    use crate::egress::{Egress, SystemResolver};
    use crate::record::tests::{claimed, clock};

    /// A keep-alive HTTP/1.1 receiver that answers each request only once
    /// `held` requests are waiting at once (so that many connections are
    /// open together), and counts the connections it accepted.
    fn holding_receiver(held: usize) -> (u16, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Barrier::new(held));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let gate = gate.clone();
                std::thread::spawn(move || serve(conn, &gate));
            }
        });
        (port, accepted)
    }

    /// Answers requests on one connection, 204 each, until the peer closes.
    fn serve(conn: std::net::TcpStream, gate: &Barrier) {
        let mut out = conn.try_clone().unwrap();
        let mut reader = BufReader::new(conn);
        loop {
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0u8; length];
            reader.read_exact(&mut body).unwrap();
            gate.wait();
            out.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                .unwrap();
        }
    }

    /// `n` attempts at once to `port`.
    async fn round(sender: &Sender, port: u16, n: usize) {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            let sender = sender.clone();
            tasks.spawn(async move {
                let clock = clock();
                let mut c = claimed(&clock, 0, RetryPolicy::default());
                c.subscription.url = DestinationUrl::parse(
                    &format!("http://127.0.0.1:{port}/hook"),
                    DestinationPolicy::AllowPrivate,
                )
                .unwrap();
                sender.send(&c, 1, &clock).await.attempt.status
            });
        }
        while let Some(status) = tasks.join_next().await {
            assert_eq!(status.unwrap(), Some(204));
        }
    }

    #[tokio::test]
    async fn a_host_busier_than_the_old_idle_cap_keeps_its_connections() {
        // 200 attempts in flight at one host (a raised --host-concurrency
        // or max_concurrency), twice. The second round finds the first
        // round's connections idle in the pool. With the old fixed cap of
        // 64 idle connections per host, 136 were closed after the first
        // round and opened again for the second.
        const AT_ONCE: usize = 200;
        let (port, accepted) = holding_receiver(AT_ONCE);
        // The dispatcher's sender, with the standard configuration.
        let sender = Sender::for_dispatch(&crate::DispatchConfig {
            egress: Egress {
                policy: DestinationPolicy::AllowPrivate,
                resolver: Arc::new(SystemResolver),
                proxy: None,
            },
            ..crate::DispatchConfig::standard("pool-test".into())
        })
        .unwrap();
        round(&sender, port, AT_ONCE).await;
        assert_eq!(accepted.load(Ordering::SeqCst), AT_ONCE);
        round(&sender, port, AT_ONCE).await;
        // A connection handed back to the pool a moment after its response
        // may be passed over for a new one; the old cap forced 136.
        let opened_again = accepted.load(Ordering::SeqCst) - AT_ONCE;
        assert!(
            opened_again < AT_ONCE - 64,
            "{opened_again} connections opened again for the second round"
        );
    }
}
