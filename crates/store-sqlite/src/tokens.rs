//! API tokens: only their SHA-256 hashes are stored, with their scope.

use hookd_domain::CustomerId;
use hookd_store::{FoundToken, NewToken, Result, TokenScope};

use crate::SqliteStore;
use crate::codec::{from_ms, now_ms, to_ms};
use crate::error::{corrupt, from_sqlx};

pub(crate) async fn create(store: &SqliteStore, token: NewToken) -> Result<()> {
    let mut tx = store.write().await?;
    sqlx::query(
        "INSERT INTO tokens (token_hash, customer_id, label, created_at, expires_at) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(token.token_hash)
    .bind(token.customer_id.as_ref().map(|c| c.as_str()))
    .bind(token.label)
    .bind(now_ms())
    .bind(token.expires_at.map(to_ms))
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)
}

pub(crate) async fn find(store: &SqliteStore, token_hash: &[u8]) -> Result<Option<FoundToken>> {
    let found: Option<(Option<String>, Option<i64>)> = sqlx::query_as(
        "SELECT customer_id, expires_at FROM tokens \
             WHERE token_hash = ? AND (expires_at IS NULL OR expires_at > ?)",
    )
    .bind(token_hash)
    .bind(now_ms())
    .fetch_optional(&store.reader)
    .await
    .map_err(from_sqlx)?;
    let Some((customer, expires_at)) = found else {
        return Ok(None);
    };
    let scope = match customer {
        None => TokenScope::Admin,
        Some(c) => CustomerId::parse(&c)
            .map(TokenScope::Customer)
            .map_err(|e| corrupt("tokens.customer_id", e))?,
    };
    let expires_at = expires_at
        .map(|ms| from_ms(ms, "tokens.expires_at"))
        .transpose()?;
    Ok(Some(FoundToken { scope, expires_at }))
}

pub(crate) async fn has_admin(store: &SqliteStore) -> Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tokens WHERE customer_id IS NULL)")
        .fetch_one(&store.reader)
        .await
        .map_err(from_sqlx)
}
