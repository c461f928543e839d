//! `hookd replay`: starts a bulk replay job over the API and shows its
//! progress until it ends (design §3: "bulk replay is a job"; R3: "with
//! progress").
//!
//! It is an API client, not a store client: the job runs in the server,
//! under the destination's admission, and interrupting this command leaves
//! it running (cancel it with `DELETE /jobs/{id}`).

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use serde::Deserialize;

use crate::client::{Client, ServerArgs, segment};

/// `hookd replay`'s arguments.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The subscription whose deliveries to replay (`sub_…`).
    #[arg(long)]
    subscription: String,
    /// Deliveries created at or after this time (RFC 3339, e.g.
    /// `2026-11-29T00:00:00Z`).
    #[arg(long)]
    since: String,
    /// Deliveries created before this time (RFC 3339); now if left out.
    #[arg(long)]
    until: Option<String>,
    /// Only this event type (repeat for several); all if left out.
    #[arg(long = "type")]
    types: Vec<String>,
    /// Only deliveries in this state: failed, dead or delivered (repeat for
    /// several); failed and dead if left out.
    #[arg(long = "status")]
    statuses: Vec<String>,
    /// The hookd API (`--url` is the older name).
    #[arg(long, visible_alias = "url", env = "HOOKD_URL", default_value = crate::client::DEFAULT_SERVER)]
    server: String,
    /// An admin token, or the subscription's customer's.
    #[arg(long, env = "HOOKD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// How often to look at the job's progress.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    every: Duration,
    /// No progress bar: print the job, as `GET /jobs/{id}` answers it, once
    /// it has ended (for scripts).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Deserialize)]
struct Job {
    job_id: String,
    state: String,
    total: u64,
    done: u64,
    failed: u64,
    skipped: u64,
    in_progress: u64,
}

/// Runs `hookd replay`.
pub async fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let client = Client::new(&ServerArgs {
        server: args.server.clone(),
        token: args.token.clone(),
    })?;
    let mut body = serde_json::json!({ "since": args.since });
    if let Some(until) = &args.until {
        body["until"] = until.clone().into();
    }
    if !args.types.is_empty() {
        body["types"] = args.types.clone().into();
    }
    if !args.statuses.is_empty() {
        body["statuses"] = args.statuses.clone().into();
    }
    let path = format!("/subscriptions/{}/replay", segment(&args.subscription));
    let mut raw: serde_json::Value = client
        .post(&path, &body)
        .await
        .and_then(|a| a.json())
        .context("starting the replay job")?;
    let mut job: Job = serde_json::from_value(raw.clone()).context("the job's JSON")?;
    if !args.json {
        eprintln!(
            "replay job {} started: {} deliveries (interrupting this command leaves it running)",
            job.job_id, job.total
        );
    }
    let bar = if args.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(job.total)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} ({percent}%) {msg} [{elapsed_precise}, eta {eta}]",
        )
        .context("the progress bar template")?,
    );
    loop {
        bar.set_position(job.done + job.failed + job.skipped);
        bar.set_message(format!(
            "delivered {} · failed {} · skipped {} · sending {}",
            job.done, job.failed, job.skipped, job.in_progress
        ));
        if job.state != "running" {
            break;
        }
        tokio::time::sleep(args.every).await;
        raw = client
            .get(&format!("/jobs/{}", segment(&job.job_id)), &[])
            .await
            .and_then(|a| a.json())
            .context("reading the job's progress")?;
        job = serde_json::from_value(raw.clone()).context("the job's JSON")?;
    }
    bar.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&raw)?);
    } else {
        println!(
            "job {} {}: {} delivered, {} failed, {} skipped of {}",
            job.job_id, job.state, job.done, job.failed, job.skipped, job.total
        );
    }
    anyhow::ensure!(
        job.state == "completed",
        "the job was {} before it completed",
        job.state
    );
    Ok(())
}
