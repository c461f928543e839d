//! Bearer-token authentication and what a caller may see.
//!
//! A token is never stored or compared in clear: its SHA-256 is compared with
//! the configured admin hash (in constant time), then looked up in the store.
//! Known tokens are cached for [`TOKEN_CACHE_TTL`] so the ingest hot path does
//! not read the store for every request; the price is that a revoked token
//! keeps working for up to that long on a node that has cached it. A token
//! with an expiry (a portal link's) is never cached past it.
//!
//! # Failed authentication is rate-limited per client address
//! A request with no token or an unknown one is a *failure*, and failures
//! are counted per peer IP address (the TCP peer: behind a reverse proxy
//! that is the proxy) with a `governor` GCRA limiter: a burst of
//! [`AUTH_FAILURE_BURST`](crate::limits::AUTH_FAILURE_BURST), then one per
//! [`AUTH_FAILURE_REFILL`](crate::limits::AUTH_FAILURE_REFILL) (both in
//! `ApiConfig::auth_failures`). Successful requests cost nothing, so a busy
//! legitimate client is never limited.
//!
//! The failure that finds the budget empty is answered `429
//! too_many_auth_failures` with `Retry-After`, and the address is then
//! *locked* until the budget has room again: while locked, every request
//! from it that needs a token is answered 429 **before the token is looked
//! at**, valid or not. So a brute force learns nothing from a locked
//! address (no 401-versus-200 oracle) and probes at most one token per
//! refill interval; the price is that a valid client sharing the address
//! waits out the same short lock. Requests served without a peer address
//! (the router driven in-process, as unit tests do) are not limited.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::header;
use axum::http::request::Parts;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::HashMapStateStore;
use governor::{Quota, RateLimiter};
use hookd_domain::CustomerId;
use hookd_store::TokenScope;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::error::ApiError;

/// How long a token found in the store is trusted without asking again.
pub(crate) const TOKEN_CACHE_TTL: Duration = Duration::from_secs(30);

/// More cached tokens than this and the cache starts over, so a flood of
/// distinct valid tokens cannot grow it without bound.
const TOKEN_CACHE_MAX: usize = 10_000;

/// Who is calling: the scope of their token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller(pub TokenScope);

impl Caller {
    /// The customer this caller is confined to, if any.
    pub(crate) fn customer(&self) -> Option<&CustomerId> {
        match &self.0 {
            TokenScope::Admin => None,
            TokenScope::Customer(c) => Some(c),
        }
    }

    /// Whether a record owned by `owner` is visible to this caller. A
    /// customer sees only its own; records of no customer are admin-only.
    pub(crate) fn can_see(&self, owner: Option<&CustomerId>) -> bool {
        match self.customer() {
            None => true,
            Some(c) => owner == Some(c),
        }
    }
}

/// Known token hashes and their scopes, each trusted until its expiry.
#[derive(Debug, Default)]
pub(crate) struct TokenCache {
    entries: Mutex<HashMap<[u8; 32], (TokenScope, Instant)>>,
}

impl TokenCache {
    fn get(&self, hash: &[u8; 32], now: Instant) -> Option<TokenScope> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(hash)
            .filter(|(_, expires)| *expires > now)
            .map(|(scope, _)| scope.clone())
    }

    /// Trusts `scope` for [`TOKEN_CACHE_TTL`] from `now`, or until `valid_for`
    /// from `now` (what is left of the token's own life) if that is sooner.
    fn put(&self, hash: [u8; 32], scope: TokenScope, now: Instant, valid_for: Option<Duration>) {
        let ttl = valid_for.map_or(TOKEN_CACHE_TTL, |left| left.min(TOKEN_CACHE_TTL));
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= TOKEN_CACHE_MAX {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= TOKEN_CACHE_MAX {
                entries.clear();
            }
        }
        entries.insert(hash, (scope, now + ttl));
    }
}

/// SHA-256 of a token's text, as stored.
pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| addr.ip());
        let limiter = state.inner.auth_failures.as_ref();
        // A locked address is refused before its token is looked at.
        if let (Some(limiter), Some(ip)) = (limiter, peer)
            && let Some(wait) = limiter.locked(ip)
        {
            return Err(ApiError::TooManyAuthFailures(wait));
        }
        match authenticate(parts, state).await? {
            Some(caller) => Ok(caller),
            None => match (limiter, peer) {
                (Some(limiter), Some(ip)) => match limiter.failed(ip) {
                    Some(wait) => {
                        tracing::warn!(peer = %ip, "too many failed authentications; address locked");
                        Err(ApiError::TooManyAuthFailures(wait))
                    }
                    None => Err(ApiError::Unauthorized),
                },
                _ => Err(ApiError::Unauthorized),
            },
        }
    }
}

/// The caller of a request with a known token; `None` when the token is
/// missing or unknown.
async fn authenticate(parts: &Parts, state: &AppState) -> Result<Option<Caller>, ApiError> {
    let Some(token) = bearer(parts) else {
        return Ok(None);
    };
    let hash = hash_token(token);
    if let Some(admin) = &state.config().admin_token_hash
        && bool::from(admin.ct_eq(&hash))
    {
        return Ok(Some(Caller(TokenScope::Admin)));
    }
    let now = Instant::now();
    if let Some(scope) = state.inner.tokens.get(&hash, now) {
        return Ok(Some(Caller(scope)));
    }
    match state.store().find_token(&hash).await? {
        Some(found) => {
            // What is left of its life, by the wall clock the store wrote
            // `expires_at` with; an expiry already past is not cached.
            let valid_for = found
                .expires_at
                .map(|at| (at - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO));
            state
                .inner
                .tokens
                .put(hash, found.scope.clone(), now, valid_for);
            Ok(Some(Caller(found.scope)))
        }
        None => Ok(None),
    }
}

/// How many failed authentications one client address may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthFailureLimit {
    /// Failures allowed in a burst.
    pub burst: NonZeroU32,
    /// After the burst, one more failure is allowed per this long.
    pub refill_every: Duration,
}

impl Default for AuthFailureLimit {
    /// [`AUTH_FAILURE_BURST`](crate::limits::AUTH_FAILURE_BURST) failures,
    /// then one per
    /// [`AUTH_FAILURE_REFILL`](crate::limits::AUTH_FAILURE_REFILL).
    fn default() -> Self {
        Self {
            burst: NonZeroU32::new(crate::limits::AUTH_FAILURE_BURST).unwrap_or(NonZeroU32::MIN),
            refill_every: crate::limits::AUTH_FAILURE_REFILL,
        }
    }
}

/// Past this many tracked addresses, the limiter forgets those whose budget
/// is full again, so a flood of distinct addresses cannot grow it forever.
const TRACKED_ADDRESSES_MAX: usize = 100_000;

/// The limiter's clock: monotonic time since it was made, plus a skew that
/// only tests move.
#[derive(Debug, Clone)]
pub(crate) struct LimiterClock {
    origin: Instant,
    skew_nanos: Arc<AtomicU64>,
}

impl LimiterClock {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            skew_nanos: Arc::default(),
        }
    }

    #[cfg(test)]
    pub(crate) fn advance(&self, by: Duration) {
        self.skew_nanos
            .fetch_add(u64::try_from(by.as_nanos()).unwrap(), Ordering::SeqCst);
    }
}

impl Clock for LimiterClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(self.origin.elapsed()) + Nanos::new(self.skew_nanos.load(Ordering::SeqCst))
    }
}

/// Failed authentications per client address, and the addresses locked out.
pub(crate) struct FailureLimiter {
    limiter: RateLimiter<IpAddr, HashMapStateStore<IpAddr>, LimiterClock, NoOpMiddleware<Nanos>>,
    /// Addresses whose last failure found the budget empty, and when it has
    /// room again. Consulted before any token is looked at.
    locked: Mutex<HashMap<IpAddr, Nanos>>,
    clock: LimiterClock,
}

impl std::fmt::Debug for FailureLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailureLimiter")
            .field("tracked", &self.limiter.len())
            .finish_non_exhaustive()
    }
}

impl FailureLimiter {
    pub(crate) fn new(limit: AuthFailureLimit) -> Self {
        let quota = Quota::with_period(limit.refill_every.max(Duration::from_nanos(1)))
            .unwrap_or(Quota::per_second(NonZeroU32::MAX))
            .allow_burst(limit.burst);
        let clock = LimiterClock::new();
        Self {
            limiter: RateLimiter::new(quota, HashMapStateStore::default(), clock.clone()),
            locked: Mutex::default(),
            clock,
        }
    }

    #[cfg(test)]
    pub(crate) fn clock(&self) -> &LimiterClock {
        &self.clock
    }

    /// How long `ip` stays locked, if it is.
    fn locked(&self, ip: IpAddr) -> Option<Duration> {
        let now = self.clock.now();
        let locked = self.locked.lock().unwrap_or_else(|p| p.into_inner());
        let until = *locked.get(&ip)?;
        (until > now).then(|| Duration::from(until.saturating_sub(now)))
    }

    /// Counts a failure from `ip`. `None` while within the budget; otherwise
    /// how long until the next failure would be allowed, and `ip` is locked
    /// until then.
    fn failed(&self, ip: IpAddr) -> Option<Duration> {
        if self.limiter.len() > TRACKED_ADDRESSES_MAX {
            self.limiter.retain_recent();
        }
        let refused = self.limiter.check_key(&ip).err()?;
        let now = self.clock.now();
        let wait = refused.wait_time_from(now);
        let mut locked = self.locked.lock().unwrap_or_else(|p| p.into_inner());
        if locked.len() >= TRACKED_ADDRESSES_MAX {
            locked.retain(|_, until| *until > now);
        }
        locked.insert(ip, now + Nanos::from(wait));
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_expire_after_the_ttl() {
        let cache = TokenCache::default();
        let t0 = Instant::now();
        let h = hash_token("t");
        cache.put(h, TokenScope::Admin, t0, None);
        assert_eq!(cache.get(&h, t0), Some(TokenScope::Admin));
        assert_eq!(cache.get(&h, t0 + TOKEN_CACHE_TTL), None);
        assert_eq!(cache.get(&hash_token("other"), t0), None);
        // A token expiring sooner than the TTL is trusted only until then.
        let link = hash_token("portal link");
        let acme = TokenScope::Customer(CustomerId::parse("acme").unwrap());
        cache.put(link, acme.clone(), t0, Some(Duration::from_secs(5)));
        assert_eq!(cache.get(&link, t0 + Duration::from_secs(4)), Some(acme));
        assert_eq!(cache.get(&link, t0 + Duration::from_secs(5)), None);
        // One already expired is not trusted at all.
        let gone = hash_token("expired");
        cache.put(gone, TokenScope::Admin, t0, Some(Duration::ZERO));
        assert_eq!(cache.get(&gone, t0), None);
    }

    mod lockout {
        use std::net::{Ipv4Addr, SocketAddr};
        use std::sync::Arc;

        use axum::body::Body;
        use axum::http::{Request, StatusCode, header};
        use hookd_domain::destination::DestinationPolicy;
        use tokio::sync::Notify;
        use tower::ServiceExt as _;

        use super::*;
        use crate::{ApiConfig, router};

        const ADMIN: &str = "admin-token";
        const BURST: u32 = 3;
        /// Long, so no real time passing during the test refills anything:
        /// only the test's own clock moves do.
        const REFILL: Duration = Duration::from_secs(3600);

        async fn app() -> (axum::Router, AppState, tempfile::TempDir) {
            let dir = tempfile::tempdir().unwrap();
            let store = hookd_store_sqlite::SqliteStore::connect(&dir.path().join("hookd.db"))
                .await
                .unwrap();
            hookd_store::Store::migrate(&store).await.unwrap();
            let config = ApiConfig {
                admin_token_hash: Some(hash_token(ADMIN)),
                auth_failures: Some(AuthFailureLimit {
                    burst: NonZeroU32::new(BURST).unwrap(),
                    refill_every: REFILL,
                }),
                ..ApiConfig::new(DestinationPolicy::PublicOnly)
            };
            let state = AppState::new(Arc::new(store), config, Arc::new(Notify::new()));
            (router(state.clone()), state, dir)
        }

        /// `GET /subscriptions` from `peer` (none: as if in-process) with
        /// `token`: the status, the error code, and `Retry-After`.
        async fn call(
            app: &axum::Router,
            peer: Option<[u8; 4]>,
            token: Option<&str>,
        ) -> (StatusCode, String, Option<String>) {
            let mut req = Request::get("/subscriptions");
            if let Some(t) = token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let mut req = req.body(Body::empty()).unwrap();
            if let Some(ip) = peer {
                req.extensions_mut()
                    .insert(ConnectInfo(SocketAddr::from((Ipv4Addr::from(ip), 40_000))));
            }
            let resp = app.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let retry = resp
                .headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.to_str().unwrap().to_owned());
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
            (status, code, retry)
        }

        fn clock(state: &AppState) -> &LimiterClock {
            state.inner.auth_failures.as_ref().unwrap().clock()
        }

        #[tokio::test]
        async fn an_address_is_locked_out_after_the_burst_of_failures_and_recovers() {
            let (app, state, _dir) = app().await;
            let attacker = Some([203, 0, 113, 7]);
            // Valid tokens cost nothing: any number of them leaves the
            // whole budget.
            for _ in 0..10 {
                assert_eq!(call(&app, attacker, Some(ADMIN)).await.0, StatusCode::OK);
            }
            // The burst: missing and unknown tokens are 401.
            for i in 0..BURST {
                let token = (i % 2 == 0).then_some("guess");
                let (status, code, _) = call(&app, attacker, token).await;
                assert_eq!(
                    (status, code.as_str()),
                    (StatusCode::UNAUTHORIZED, "unauthorized"),
                    "failure {i}"
                );
            }
            // The next failure finds the budget empty: 429 with Retry-After.
            let (status, code, retry) = call(&app, attacker, Some("guess")).await;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(code, "too_many_auth_failures");
            let retry: u64 = retry.expect("Retry-After").parse().unwrap();
            assert!((1..=REFILL.as_secs()).contains(&retry), "{retry}");
            // Locked: refused before the token is looked at, so even the
            // valid token gets 429 (no oracle), and so does no token.
            assert_eq!(
                call(&app, attacker, Some(ADMIN)).await.1,
                "too_many_auth_failures"
            );
            assert_eq!(call(&app, attacker, None).await.1, "too_many_auth_failures");
            // Other addresses, and requests without a peer address, are
            // not affected.
            assert_eq!(
                call(&app, Some([198, 51, 100, 1]), Some("guess")).await.0,
                StatusCode::UNAUTHORIZED
            );
            assert_eq!(
                call(&app, Some([198, 51, 100, 1]), Some(ADMIN)).await.0,
                StatusCode::OK
            );
            assert_eq!(
                call(&app, None, Some("guess")).await.0,
                StatusCode::UNAUTHORIZED
            );

            // One refill interval later the lock is over: the valid token
            // passes, and exactly one more failure is allowed.
            clock(&state).advance(REFILL);
            assert_eq!(call(&app, attacker, Some(ADMIN)).await.0, StatusCode::OK);
            assert_eq!(
                call(&app, attacker, Some("guess")).await.0,
                StatusCode::UNAUTHORIZED
            );
            assert_eq!(
                call(&app, attacker, Some("guess")).await.1,
                "too_many_auth_failures"
            );

            // After a whole burst's worth of refill, the whole burst again.
            clock(&state).advance(REFILL * BURST);
            for i in 0..BURST {
                assert_eq!(
                    call(&app, attacker, Some("guess")).await.0,
                    StatusCode::UNAUTHORIZED,
                    "failure {i}"
                );
            }
            assert_eq!(
                call(&app, attacker, Some("guess")).await.0,
                StatusCode::TOO_MANY_REQUESTS
            );
        }

        #[tokio::test]
        async fn the_limit_can_be_turned_off() {
            let dir = tempfile::tempdir().unwrap();
            let store = hookd_store_sqlite::SqliteStore::connect(&dir.path().join("hookd.db"))
                .await
                .unwrap();
            hookd_store::Store::migrate(&store).await.unwrap();
            let config = ApiConfig {
                auth_failures: None,
                ..ApiConfig::new(DestinationPolicy::PublicOnly)
            };
            let app = router(AppState::new(
                Arc::new(store),
                config,
                Arc::new(Notify::new()),
            ));
            for _ in 0..50 {
                assert_eq!(
                    call(&app, Some([203, 0, 113, 7]), Some("guess")).await.0,
                    StatusCode::UNAUTHORIZED
                );
            }
        }
    }

    #[test]
    fn customers_see_only_their_own_records() {
        let acme = CustomerId::parse("acme").unwrap();
        let globex = CustomerId::parse("globex").unwrap();
        let c = Caller(TokenScope::Customer(acme.clone()));
        assert!(c.can_see(Some(&acme)));
        assert!(!c.can_see(Some(&globex)));
        assert!(!c.can_see(None));
        assert!(Caller(TokenScope::Admin).can_see(None));
    }
}
