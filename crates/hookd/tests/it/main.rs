//! End-to-end tests: the real application, a real database (SQLite in a
//! temp dir; PostgreSQL in a fresh schema when `HOOKD_TEST_DATABASE_URL` is
//! set), and real HTTP receivers on loopback addresses.

mod helpers;

mod attempts;
mod delivery;
mod process;
