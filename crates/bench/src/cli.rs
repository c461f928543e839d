//! The command line: one subcommand per scenario, sharing [`Common`] (where
//! hookd runs, where output goes) and [`Load`] (how much traffic; each
//! scenario fills in its own defaults).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Benchmarks hookd against loopback receivers. Every scenario stops by
/// itself; traffic goes only to 127.0.0.0/8.
#[derive(Debug, Parser)]
#[command(name = "hookd-bench", version, about)]
pub struct Cli {
    /// The scenario to run.
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// The scenarios.
#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// 2,000 events × 100 destinations at full speed.
    Fanout(Plain),
    /// 20,000 events to one destination at full speed (hookd gets
    /// `--host-concurrency 256` and a fixed 50,000/s destination rate).
    Single(Plain),
    /// A fixed rate (500 events/s to 10 destinations for 20 s): the latency
    /// distribution.
    Steady(Plain),
    /// 100 destinations, one hanging, at 200 events/s for 30 s: the healthy
    /// destinations' p99.
    Isolation(Isolation),
    /// One destination fails (500) for 60 s then recovers, under 50 events/s
    /// for 150 s (plus 9 healthy ones): per-second deliveries and attempts.
    Recovery(Recovery),
    /// A backlog of pending deliveries (1,000,000 by default) built while the
    /// destination holds every request, then released: RSS and drain rate.
    Backlog(Plain),
    /// No hookd: the poster posts straight to a receiver, to show the
    /// harness is not the bottleneck.
    Bare(Plain),
}

/// A scenario with only the common flags.
#[derive(Debug, Args)]
pub struct Plain {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub load: Load,
}

/// `isolation`.
#[derive(Debug, Args)]
pub struct Isolation {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub load: Load,
    /// The baseline: every destination healthy.
    #[arg(long, conflicts_with = "compare")]
    pub no_hang: bool,
    /// Run with and without the hanging destination and print the ratio of
    /// the healthy destinations' p99.
    #[arg(long)]
    pub compare: bool,
}

/// `recovery`.
#[derive(Debug, Args)]
pub struct Recovery {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub load: Load,
    /// How long the recovering destination answers 500.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub fail_for: Duration,
    /// Healthy destinations besides the recovering one.
    #[arg(long, default_value_t = 9)]
    pub healthy: usize,
}

/// Which database hookd runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// A fresh temporary SQLite file.
    Sqlite,
    /// A fresh schema in `--pg-url`, dropped at the end.
    Postgres,
}

impl Backend {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Where hookd runs and where output goes.
#[derive(Debug, Args)]
pub struct Common {
    /// Database backend for the hookd child process.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub backend: Backend,
    /// PostgreSQL server for `--backend postgres` (a fresh schema is created
    /// in it and dropped at the end).
    #[arg(
        long,
        env = "HOOKD_BENCH_PG_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub pg_url: String,
    /// The hookd binary (default: `hookd` next to this binary, built with
    /// `cargo build --release -p hookd` if missing).
    #[arg(long)]
    pub hookd: Option<PathBuf>,
    /// Extra argument for `hookd serve` (repeatable); replaces the
    /// scenario's default for the same flag.
    #[arg(long = "hookd-arg", allow_hyphen_values = true)]
    pub hookd_args: Vec<String>,
    /// Use a running hookd at this base URL instead of starting one (no CPU
    /// or RSS figures then). It must allow private destinations.
    #[arg(long, requires = "token")]
    pub target: Option<String>,
    /// Admin token for `--target`.
    #[arg(long, env = "HOOKD_BENCH_TOKEN")]
    pub token: Option<String>,
    /// Write SVG plots into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Directory for CSV series and `results.jsonl`.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// After the load, how long to wait for the remaining deliveries.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub drain_timeout: Option<Duration>,
}

/// How much traffic. Unset fields take the scenario's default.
#[derive(Debug, Args)]
pub struct Load {
    /// Events to post (full-speed scenarios).
    #[arg(long)]
    pub events: Option<u64>,
    /// Destinations (each one subscription to every event).
    #[arg(long)]
    pub destinations: Option<usize>,
    /// Fixed rate, events per second (`500` or `500/s`).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// How long a fixed-rate load lasts.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Most `POST /events` in flight at once.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// How the (otherwise healthy) receivers answer: `ok`, `latency:50ms`,
    /// `fail`, `hang`, `hold`, `fail-then-ok:60s`.
    #[arg(long)]
    pub behaviour: Option<crate::receiver::Behaviour>,
    /// Pad each event's payload with a string field of this many bytes
    /// (default 0: a payload of ~40 bytes). Real payloads are often
    /// kilobytes; this is what a claim reads back and every attempt sends.
    #[arg(long)]
    pub payload_bytes: Option<usize>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let n = s.strip_suffix("/s").unwrap_or(s);
    match n.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r.is_finite() => Ok(r),
        _ => Err(format!("`{s}` is not a rate like 500 or 500/s")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_with_or_without_a_unit() {
        assert_eq!(parse_rate("500/s"), Ok(500.0));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
