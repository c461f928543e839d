//! Bearer-token authentication and what a caller may see.
//!
//! A token is never stored or compared in clear: its SHA-256 is compared with
//! the configured admin hash (in constant time), then looked up in the store.
//! Known tokens are cached for [`TOKEN_CACHE_TTL`] so the ingest hot path does
//! not read the store for every request; the price is that a revoked token
//! keeps working for up to that long on a node that has cached it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
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

    fn put(&self, hash: [u8; 32], scope: TokenScope, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= TOKEN_CACHE_MAX {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= TOKEN_CACHE_MAX {
                entries.clear();
            }
        }
        entries.insert(hash, (scope, now + TOKEN_CACHE_TTL));
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
        let token = bearer(parts).ok_or(ApiError::Unauthorized)?;
        let hash = hash_token(token);
        if let Some(admin) = &state.config().admin_token_hash
            && bool::from(admin.ct_eq(&hash))
        {
            return Ok(Caller(TokenScope::Admin));
        }
        let now = Instant::now();
        if let Some(scope) = state.inner.tokens.get(&hash, now) {
            return Ok(Caller(scope));
        }
        match state.store().find_token(&hash).await? {
            Some(scope) => {
                state.inner.tokens.put(hash, scope.clone(), now);
                Ok(Caller(scope))
            }
            None => Err(ApiError::Unauthorized),
        }
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
        cache.put(h, TokenScope::Admin, t0);
        assert_eq!(cache.get(&h, t0), Some(TokenScope::Admin));
        assert_eq!(cache.get(&h, t0 + TOKEN_CACHE_TTL), None);
        assert_eq!(cache.get(&hash_token("other"), t0), None);
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
