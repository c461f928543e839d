//! Mapping sqlx errors onto [`StoreError`], keeping the sqlx error as the
//! source because the chain is the diagnosis.

use hookd_store::StoreError;

/// SQLSTATEs that mean "the database cannot serve us right now; nothing was
/// committed, try again later" rather than "this request is wrong".
const UNAVAILABLE_CODES: &[&str] = &[
    "57P01", // admin_shutdown: the server is going down
    "57P02", // crash_shutdown
    "57P03", // cannot_connect_now: starting up or in recovery
    "57014", // query_canceled: our statement_timeout fired
    "25006", // read_only_sql_transaction: a standby, or a failover in progress
    "53300", // too_many_connections
    // serialization_failure: also what an UPDATE or FOR UPDATE gets when the
    // row it waited for was moved to another partition meanwhile (retention
    // carrying an unfinished delivery forward). The transaction was rolled
    // back; the same call again sees the row where it is now.
    "40001",
    "40P01", // deadlock_detected: the transaction chosen as the victim was rolled back
    "55P03", // lock_not_available: our lock_timeout fired (retention's partition drop)
];

/// The SQLSTATE of a unique violation.
const UNIQUE_VIOLATION: &str = "23505";

/// Classifies a sqlx error for callers.
pub(crate) fn map(err: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &err
        && db.code().as_deref() == Some(UNIQUE_VIOLATION)
    {
        // The message names the constraint ("…violates unique constraint
        // \"tokens_pkey\""), which is what a caller needs to know.
        return StoreError::Conflict(db.message().to_owned());
    }
    if is_unavailable(&err) {
        StoreError::Unavailable(Box::new(err))
    } else {
        StoreError::Backend(Box::new(err))
    }
}

/// Whether retrying later, against the same database, may succeed.
fn is_unavailable(err: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match err {
        E::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            // Class 08 is "connection exception".
            UNAVAILABLE_CODES.contains(&code) || code.starts_with("08")
        }
        E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
        _ => false,
    }
}

/// Classifies a migration failure: a database error inside it is mapped like
/// any other; a problem with the migrations themselves is a backend failure.
pub(crate) fn map_migrate(err: sqlx::migrate::MigrateError) -> StoreError {
    use sqlx::migrate::MigrateError as M;
    match err {
        M::Execute(e) => map(e),
        // Keep the failing migration's number in the chain unless the cause
        // is the database going away, which callers must see as such.
        M::ExecuteMigration(e, _) if is_unavailable(&e) => map(e),
        other => StoreError::Backend(Box::new(other)),
    }
}

/// The error for a client-side deadline: the database did not answer at all
/// (a frozen server never fires its own statement_timeout).
#[derive(Debug, thiserror::Error)]
#[error("the database did not answer within {0:?}")]
pub(crate) struct DeadlineExceeded(pub std::time::Duration);
