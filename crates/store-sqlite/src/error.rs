//! Mapping sqlx failures onto [`StoreError`], the one error callers match on.

use hookd_store::StoreError;
use sqlx::error::DatabaseError;

/// SQLite primary result codes that mean "not now" rather than "never":
/// another writer holds the lock (`BUSY`, `LOCKED`), or the disk or file
/// system failed (`IOERR`, `FULL`, `CANTOPEN`). Extended codes carry the
/// primary code in their low byte.
const TRANSIENT_PRIMARY_CODES: [i64; 5] = [5, 6, 10, 13, 14];

/// Classifies a sqlx error. The original error is kept as the `#[source]`
/// wherever the variant has room for one, because the chain is the diagnosis.
pub(crate) fn from_sqlx(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::RowNotFound => StoreError::NotFound,
        sqlx::Error::Database(ref db) if db.is_unique_violation() => {
            StoreError::Conflict(db.message().to_owned())
        }
        sqlx::Error::Database(ref db) if is_transient(db.as_ref()) => {
            StoreError::Unavailable(Box::new(e))
        }
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(Box::new(e)),
        // Their Display already names the column and the cause.
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            StoreError::Corrupt(e.to_string())
        }
        _ => StoreError::Backend(Box::new(e)),
    }
}

/// Whether a database error is worth retrying later.
fn is_transient(db: &dyn DatabaseError) -> bool {
    let primary = db
        .code()
        .and_then(|c| c.parse::<i64>().ok())
        .map(|c| c & 0xff);
    primary.is_some_and(|c| TRANSIENT_PRIMARY_CODES.contains(&c))
        || db.message().contains("database is locked")
}

/// A stored value that does not parse back into its domain type.
pub(crate) fn corrupt(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {detail}"))
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn pool_exhaustion_is_unavailable_and_keeps_its_source() {
        let e = from_sqlx(sqlx::Error::PoolTimedOut);
        assert!(matches!(e, StoreError::Unavailable(_)));
        assert!(e.source().is_some(), "the chain is the diagnosis");
    }

    #[test]
    fn a_missing_row_is_not_found() {
        assert!(matches!(
            from_sqlx(sqlx::Error::RowNotFound),
            StoreError::NotFound
        ));
    }

    #[test]
    fn protocol_bugs_are_backend_failures() {
        assert!(matches!(
            from_sqlx(sqlx::Error::Protocol("x".into())),
            StoreError::Backend(_)
        ));
    }
}
