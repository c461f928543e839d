//! `hookd-bench`: the benchmark harness for hookd, one command per scenario.
//!
//! ```sh
//! cargo build --release -p hookd -p hookd-bench
//! cargo run --release -p hookd-bench -- fanout --backend sqlite
//! cargo run --release -p hookd-bench -- isolation --compare --plot target/bench
//! ```
//!
//! Each run starts, in one process:
//! - **receivers** ([`receiver`]): one axum server per destination, each on
//!   its own loopback host (127.0.0.2, 127.0.0.3, …, port 0), so hookd sees
//!   one destination host per receiver. A receiver answers `ok`, after a
//!   `latency`, `fail` (500), `hang` (never answers), `fail-then-ok` (500 for
//!   a while, then 200) or `hold` (held until released, then 200). It records
//!   every attempt's arrival, and for each 2xx the `webhook-id` (duplicates)
//!   and the `sent_ns` the poster put in the payload (latency).
//! - **hookd under test** ([`hookd`]): the release binary as a child process
//!   on a fresh temporary SQLite file or a fresh PostgreSQL schema, or a
//!   running server (`--target URL --token T`). Its CPU seconds and peak RSS
//!   are read from `/proc` at the end.
//! - **the poster** ([`poster`]): `POST /events` at full speed with bounded
//!   concurrency, or at a fixed rate, each event with an idempotency key and
//!   retried with the same key until it is accepted.
//!
//! [`scenario`] wires them per scenario and [`report`] prints one table and
//! one JSON line per run (latency percentiles from an HDR histogram).
//! [`plot`] writes SVG plots. Traffic goes only to 127.0.0.0/8 and every
//! loop has a deadline, so every scenario stops by itself.
#![warn(missing_docs)]

mod cli;
mod hookd;
mod plot;
mod poster;
mod receiver;
mod report;
mod scenario;

use clap::Parser as _;

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(scenario::run(cli));
    // Held or hanging receiver connections must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    if let Err(e) = &result {
        eprintln!("error: {e}");
        for cause in e.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        std::process::exit(1);
    }
    Ok(())
}
