//! End-to-end tests: the real application, a real database (SQLite in a
//! temp dir; PostgreSQL in a fresh schema when `HOOKD_TEST_DATABASE_URL` is
//! set), and real HTTP receivers on loopback addresses.

mod helpers;
mod private_pg;

mod announcements;
mod attempts;
mod chaos;
mod cli;
mod cluster;
mod crash;
mod crash_points;
mod delivery;
mod egress;
mod fanout;
mod guarantee;
mod health;
mod history;
mod ingest_claims;
mod isolation;
mod jobs;
mod keys;
mod observability;
mod pg_faults;
mod process;
mod rotation;
mod shards;
mod shutdown;
mod tenancy;
