use std::error::Error as StdError;

/// What a store operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The record does not exist (or is deleted).
    #[error("not found")]
    NotFound,
    /// A uniqueness rule was broken; the message says which.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The store could not be reached or did not answer in time. Retrying
    /// later may succeed; nothing was committed.
    #[error("store unavailable")]
    Unavailable(#[source] Box<dyn StdError + Send + Sync>),
    /// A stored value could not be read back into a domain type.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// Any other failure of the backend (a bug, a constraint we did not
    /// expect). The source says what.
    #[error("store failure")]
    Backend(#[source] Box<dyn StdError + Send + Sync>),
}
