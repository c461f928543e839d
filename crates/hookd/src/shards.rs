//! `hookd shards …`: the shard map of a sharded PostgreSQL deployment
//! (issue 8; design §4 and R5), read and changed through the control
//! database, as `hookd migrate` does: no running server is needed.

use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use hookd_domain::isolation::split::{RecentAttempts, split_refusal};
use hookd_store::Store as _;
use hookd_store_postgres::sharded::{ShardMap, ShardedStore};
use hookd_store_postgres::{PgOptions, PgStore};

use crate::cli::DatabaseArgs;

/// `hookd shards …`.
#[derive(Debug, Subcommand)]
pub enum ShardsCommand {
    /// Print the shard map stored in the control database (--database).
    List(ListArgs),
    /// Spread a hot destination host's subscriptions over the shards: from
    /// now on each of its subscriptions is placed by (host, subscription)
    /// instead of by host (design R5). Its circuit, rate and concurrency cap
    /// stay per host. Refused while the host's circuit is open on any live
    /// node, or while its recent failure rate is high: never split during a
    /// failure.
    Split(SplitArgs),
}

/// `hookd shards list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `hookd shards split`.
#[derive(Debug, Args)]
pub struct SplitArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The destination host to split.
    #[arg(long)]
    host: String,
    /// The window the host's failure rate is judged over.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    window: Duration,
    /// A node whose last heartbeat is older than this is not asked about
    /// (its circuits no longer count).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    node_live_within: Duration,
}

/// Runs a `hookd shards` command.
pub async fn run(command: ShardsCommand) -> anyhow::Result<()> {
    match command {
        ShardsCommand::List(args) => list(args).await,
        ShardsCommand::Split(args) => split(args).await,
    }
}

async fn control(url: &str) -> anyhow::Result<PgStore> {
    anyhow::ensure!(
        url.starts_with("postgres://") || url.starts_with("postgresql://"),
        "shards live on PostgreSQL: --database must be the control database's postgres://… URL"
    );
    let options = PgOptions {
        keyring: crate::keys::keyring_for(url)?,
        ..PgOptions::default()
    };
    PgStore::connect(url, options)
        .await
        .context("connecting to the control database")
}

fn print_map(map: &ShardMap, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "version": map.version,
                "shards": map.shards.iter().map(|s| crate::cli::redact_url(s)).collect::<Vec<_>>(),
                "split_hosts": map.split_hosts,
            })
        );
        return;
    }
    println!("shard map version {}", map.version);
    for (i, url) in map.shards.iter().enumerate() {
        println!("  shard {i}  {}", crate::cli::redact_url(url));
    }
    match map.split_hosts.is_empty() {
        true => println!("  no host is split"),
        false => println!(
            "  split by (host, subscription): {}",
            map.split_hosts.join(", ")
        ),
    }
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let store = control(&args.db.database).await?;
    match store.stored_shard_map().await? {
        Some(map) => print_map(&map, args.json),
        None => anyhow::bail!(
            "{} holds no shard map: it is not a sharded deployment's control database \
             (start `hookd serve --shard URL …` to make one)",
            crate::cli::redact_url(&args.db.database)
        ),
    }
    Ok(())
}

async fn split(args: SplitArgs) -> anyhow::Result<()> {
    let base = control(&args.db.database).await?;
    anyhow::ensure!(
        base.stored_shard_map().await?.is_some(),
        "{} holds no shard map: there is nothing to split",
        crate::cli::redact_url(&args.db.database)
    );
    let options = PgOptions {
        keyring: crate::keys::keyring_for(&args.db.database)?,
        ..PgOptions::default()
    };
    let store = ShardedStore::open_with(base, &args.db.database, &[], options)
        .await
        .context("opening the shards")?;
    // Who is live, and what their circuits say, on the database's clock as
    // the heartbeats are (the newest heartbeat stands for "now").
    let nodes = store.nodes().await?;
    let newest = nodes.iter().map(|n| n.last_seen).max();
    let live_within = chrono::Duration::from_std(args.node_live_within)?;
    let circuits: Vec<(String, Vec<String>)> = nodes
        .iter()
        .filter(|n| newest.is_some_and(|t| t - n.last_seen <= live_within))
        .map(|n| (n.node_id.clone(), n.open_circuits.clone()))
        .collect();
    let since = chrono::Utc::now() - chrono::Duration::from_std(args.window)?;
    let (total, failed) = store.host_attempts(&args.host, since).await?;
    if let Some(reason) = split_refusal(&args.host, &circuits, RecentAttempts { total, failed }) {
        anyhow::bail!("refusing to split: {reason}");
    }
    let (map, changed) = store.split_host(&args.host).await?;
    match changed {
        true => println!(
            "{} is split: its subscriptions are placed one by one from shard map version {} on \
             (every node applies it within seconds; {total} attempts in the last {}, {failed} failed)",
            args.host,
            map.version,
            humantime::format_duration(args.window)
        ),
        false => println!(
            "{} was split already (shard map version {})",
            args.host, map.version
        ),
    }
    Ok(())
}
