//! The `hookd` binary's glue: configuration, choosing a store backend,
//! wiring the API and the dispatcher together, and running them until a
//! signal. No domain logic lives here.
//!
//! It is a library as well as a binary so the integration tests can build
//! the real application in-process, on port 0, against a fresh database.
#![warn(missing_docs)]

pub mod cli;
mod client;
pub mod cluster;
pub mod keys;
pub mod listen;
pub mod maintenance;
mod manage;
mod replay;
mod serve;
mod shards;
pub mod timed_store;

pub use maintenance::RetentionConfig;
pub use serve::{
    App, AppConfig, open_store, open_store_sharded, open_store_tuned, open_store_with,
};
pub use timed_store::TimedStore;
