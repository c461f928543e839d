//! The CLI for people: `hookd subscriptions …`, `hookd events send`,
//! `hookd deliveries …` and `hookd health`, each one or two calls to a
//! running server's API (README "The API").
//!
//! Output is for people by default — aligned tables and short summaries —
//! and with `--json` it is the API's JSON exactly as the server sent it, for
//! scripts. An API error prints the API's message and exits non-zero.
//! Every string that came from the server is printed with its control
//! characters escaped, so a receiver's response snippet cannot drive the
//! terminal.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::client::{Answer, Client, ServerArgs, segment};

/// Options every command here takes.
#[derive(Debug, Args)]
pub struct Common {
    #[command(flatten)]
    server: ServerArgs,
    /// Print the API's JSON instead of a summary for people.
    #[arg(long, global = true)]
    json: bool,
}

// ───────────────────────────── subscriptions ─────────────────────────────

/// `hookd subscriptions …`.
#[derive(Debug, Args)]
pub struct SubscriptionsArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: SubscriptionsCommand,
}

#[derive(Debug, Subcommand)]
enum SubscriptionsCommand {
    /// Create a subscription and print its signing secret (shown only once).
    Create(CreateArgs),
    /// List subscriptions, a page at a time.
    List(ListArgs),
    /// Show one subscription.
    Show(SubArg),
    /// Change a subscription: only what is given changes.
    Update(UpdateArgs),
    /// Delete a subscription.
    Delete(SubArg),
}

#[derive(Debug, Args)]
struct SubArg {
    /// The subscription (`sub_…`).
    #[arg(value_name = "SUB")]
    sub: String,
}

/// The retry policy's fields, as flags.
#[derive(Debug, Args)]
struct RetryArgs {
    /// Dead-letter a delivery after this many attempts (1 to 1000).
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Dead-letter a delivery once it is this old (e.g. `6h`, `3days`).
    #[arg(long, value_parser = humantime::parse_duration)]
    max_age: Option<Duration>,
    /// The first backoff bound (e.g. `1s`).
    #[arg(long, value_parser = humantime::parse_duration)]
    base_delay: Option<Duration>,
    /// The largest backoff bound (e.g. `1h`).
    #[arg(long, value_parser = humantime::parse_duration)]
    max_delay: Option<Duration>,
    /// Also retry this 4xx status (repeat for several).
    #[arg(long = "retryable-status", value_name = "STATUS")]
    retryable_statuses: Vec<u16>,
}

impl RetryArgs {
    fn is_empty(&self) -> bool {
        self.max_attempts.is_none()
            && self.max_age.is_none()
            && self.base_delay.is_none()
            && self.max_delay.is_none()
            && self.retryable_statuses.is_empty()
    }

    /// Writes the given fields over `policy` (a JSON object).
    fn apply(&self, policy: &mut serde_json::Map<String, Value>) {
        if let Some(n) = self.max_attempts {
            policy.insert("max_attempts".into(), n.into());
        }
        for (key, d) in [
            ("max_age_secs", self.max_age),
            ("base_delay_secs", self.base_delay),
            ("max_delay_secs", self.max_delay),
        ] {
            if let Some(d) = d {
                policy.insert(key.into(), d.as_secs().into());
            }
        }
        if !self.retryable_statuses.is_empty() {
            policy.insert(
                "retryable_statuses".into(),
                self.retryable_statuses.clone().into(),
            );
        }
    }
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// Where to POST the webhooks.
    #[arg(long)]
    url: String,
    /// An event type or pattern to receive (`invoice.paid`, `invoice.*`,
    /// `*`); repeat for several.
    #[arg(long = "event-type", value_name = "TYPE", required = true)]
    event_types: Vec<String>,
    /// The customer it belongs to (admin tokens only; a customer token's own
    /// customer otherwise).
    #[arg(long)]
    customer: Option<String>,
    /// Deliver in order: one at a time, oldest first.
    #[arg(long)]
    ordered: bool,
    /// Attempts per second at the destination host (adaptive if left out).
    #[arg(long)]
    rate_limit: Option<u32>,
    /// Attempts in flight at once to the destination host.
    #[arg(long)]
    max_concurrency: Option<u32>,
    /// A note for people.
    #[arg(long)]
    description: Option<String>,
    /// The signing secret (`whsec_…`); generated if left out.
    #[arg(long)]
    secret: Option<String>,
    #[command(flatten)]
    retry: RetryArgs,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only this customer's subscriptions.
    #[arg(long)]
    customer: Option<String>,
    /// Page size (1 to 250).
    #[arg(long)]
    limit: Option<u32>,
    /// The page after this cursor (printed under the previous page).
    #[arg(long)]
    cursor: Option<String>,
}

/// A subscription's state, for `update --state`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum SubState {
    /// Deliver.
    Active,
    /// Keep deliveries, attempt none.
    Disabled,
}

#[derive(Debug, Args)]
struct UpdateArgs {
    /// The subscription (`sub_…`).
    #[arg(value_name = "SUB")]
    sub: String,
    /// A new destination URL.
    #[arg(long)]
    url: Option<String>,
    /// Replace the event types with these (repeat for several).
    #[arg(long = "event-type", value_name = "TYPE")]
    event_types: Vec<String>,
    /// `active`, or `disabled` (deliveries are kept, none attempted).
    #[arg(long, value_enum)]
    state: Option<SubState>,
    /// Deliver in order from now on.
    #[arg(long, conflicts_with = "unordered")]
    ordered: bool,
    /// Deliver without ordering from now on.
    #[arg(long)]
    unordered: bool,
    /// Attempts per second at the destination host.
    #[arg(long, conflicts_with = "no_rate_limit")]
    rate_limit: Option<u32>,
    /// Clear the rate limit (adaptive again).
    #[arg(long)]
    no_rate_limit: bool,
    /// Attempts in flight at once to the destination host.
    #[arg(long, conflicts_with = "no_max_concurrency")]
    max_concurrency: Option<u32>,
    /// Clear the concurrency cap (the server-wide cap again).
    #[arg(long)]
    no_max_concurrency: bool,
    /// A note for people.
    #[arg(long, conflicts_with = "no_description")]
    description: Option<String>,
    /// Clear the description.
    #[arg(long)]
    no_description: bool,
    /// Retry settings: each given one replaces the current value, the rest
    /// of the policy is kept.
    #[command(flatten)]
    retry: RetryArgs,
}

/// Runs `hookd subscriptions …`.
pub async fn subscriptions(args: SubscriptionsArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.common.server)?;
    let json = args.common.json;
    match args.command {
        SubscriptionsCommand::Create(a) => {
            let mut body = serde_json::json!({ "url": a.url, "event_types": a.event_types });
            let fields = [
                ("customer_id", a.customer.map(Value::from)),
                ("ordered", a.ordered.then_some(Value::Bool(true))),
                ("rate_limit", a.rate_limit.map(Value::from)),
                ("max_concurrency", a.max_concurrency.map(Value::from)),
                ("description", a.description.map(Value::from)),
                ("secret", a.secret.map(Value::from)),
            ];
            for (key, value) in fields {
                if let Some(v) = value {
                    body[key] = v;
                }
            }
            if !a.retry.is_empty() {
                let mut policy = serde_json::Map::new();
                a.retry.apply(&mut policy);
                body["retry_policy"] = policy.into();
            }
            let answer = client.post("/subscriptions", &body).await?;
            if json {
                return print_raw(&answer);
            }
            let sub: Value = answer.json()?;
            println!("created subscription {}", text(&sub["sub_id"]));
            print!("{}", subscription_summary(&sub));
            println!();
            println!("signing secret: {}", text(&sub["secret"]));
            println!("  (shown only this once: keep it where your receiver can verify signatures)");
        }
        SubscriptionsCommand::List(a) => {
            let answer = client
                .get(
                    "/subscriptions",
                    &[
                        ("customer_id", a.customer),
                        ("limit", a.limit.map(|n| n.to_string())),
                        ("cursor", a.cursor),
                    ],
                )
                .await?;
            if json {
                return print_raw(&answer);
            }
            let page: Value = answer.json()?;
            let subs = items(&page);
            if subs.is_empty() {
                println!("no subscriptions");
            } else {
                let rows = subs
                    .iter()
                    .map(|s| {
                        vec![
                            text(&s["sub_id"]),
                            text(&s["state"]),
                            text(&s["customer_id"]),
                            list(&s["event_types"]),
                            text(&s["url"]),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["ID", "STATE", "CUSTOMER", "EVENT TYPES", "URL"], rows)
                );
            }
            print_next_cursor(&page);
        }
        SubscriptionsCommand::Show(a) => {
            let answer = client
                .get(&format!("/subscriptions/{}", segment(&a.sub)), &[])
                .await?;
            if json {
                return print_raw(&answer);
            }
            let sub: Value = answer.json()?;
            println!("subscription {}", text(&sub["sub_id"]));
            print!("{}", subscription_summary(&sub));
        }
        SubscriptionsCommand::Update(a) => update(&client, json, a).await?,
        SubscriptionsCommand::Delete(a) => {
            let answer = client
                .delete(&format!("/subscriptions/{}", segment(&a.sub)))
                .await?;
            if json {
                // `204`: the API says nothing; neither do we.
                return print_raw(&answer);
            }
            println!("deleted subscription {}", clean(&a.sub));
        }
    }
    Ok(())
}

async fn update(client: &Client, json: bool, a: UpdateArgs) -> anyhow::Result<()> {
    let path = format!("/subscriptions/{}", segment(&a.sub));
    let mut body = serde_json::Map::new();
    if let Some(url) = a.url {
        body.insert("url".into(), url.into());
    }
    if !a.event_types.is_empty() {
        body.insert("event_types".into(), a.event_types.into());
    }
    if let Some(state) = a.state {
        let state = match state {
            SubState::Active => "active",
            SubState::Disabled => "disabled",
        };
        body.insert("state".into(), state.into());
    }
    if a.ordered || a.unordered {
        body.insert("ordered".into(), a.ordered.into());
    }
    for (key, set, clear) in [
        ("rate_limit", a.rate_limit.map(Value::from), a.no_rate_limit),
        (
            "max_concurrency",
            a.max_concurrency.map(Value::from),
            a.no_max_concurrency,
        ),
        (
            "description",
            a.description.map(Value::from),
            a.no_description,
        ),
    ] {
        if let Some(v) = set {
            body.insert(key.into(), v);
        } else if clear {
            body.insert(key.into(), Value::Null);
        }
    }
    if !a.retry.is_empty() {
        // The API replaces the whole policy: start from the current one so
        // the fields not given are kept.
        let current: Value = client.get(&path, &[]).await?.json()?;
        let mut policy = current["retry_policy"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        a.retry.apply(&mut policy);
        body.insert("retry_policy".into(), policy.into());
    }
    anyhow::ensure!(
        !body.is_empty(),
        "nothing to change: give at least one of --url, --event-type, --state, … (see --help)"
    );
    let answer = client.patch(&path, &body).await?;
    if json {
        return print_raw(&answer);
    }
    let sub: Value = answer.json()?;
    println!("updated subscription {}", text(&sub["sub_id"]));
    print!("{}", subscription_summary(&sub));
    Ok(())
}

fn subscription_summary(s: &Value) -> String {
    let policy = &s["retry_policy"];
    let retry = match policy.as_object() {
        Some(p) if !p.is_empty() => p
            .iter()
            .map(|(k, v)| format!("{k}={}", compact(v)))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "default".into(),
    };
    let or_default = |v: &Value, default: &str| {
        if v.is_null() {
            default.to_owned()
        } else {
            text(v)
        }
    };
    fields(&[
        ("state", text(&s["state"])),
        ("url", text(&s["url"])),
        ("event types", list(&s["event_types"])),
        ("customer", or_default(&s["customer_id"], "- (platform)")),
        (
            "ordered",
            if s["ordered"] == Value::Bool(true) {
                "yes"
            } else {
                "no"
            }
            .into(),
        ),
        ("rate limit", or_default(&s["rate_limit"], "adaptive")),
        (
            "max concurrency",
            or_default(&s["max_concurrency"], "server default"),
        ),
        ("retry policy", retry),
        ("description", text(&s["description"])),
        ("created", time(&s["created_at"])),
        ("updated", time(&s["updated_at"])),
    ])
}

// ───────────────────────────────── events ─────────────────────────────────

/// `hookd events …`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: EventsCommand,
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// Post an event; it is fanned out to every matching subscription.
    Send(SendArgs),
}

#[derive(Debug, Args)]
struct SendArgs {
    /// The event's type (`invoice.paid`).
    #[arg(long = "type", value_name = "TYPE")]
    event_type: String,
    /// The payload: JSON text, `@FILE` to read it from a file, or `@-` from
    /// standard input. Sent byte for byte.
    #[arg(long, value_name = "JSON|@FILE")]
    data: String,
    /// Posting the same key again returns the same event and delivers
    /// nothing new.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Deliver only to this customer's subscriptions.
    #[arg(long)]
    customer: Option<String>,
}

#[derive(Serialize)]
struct NewEvent<'a> {
    #[serde(rename = "type")]
    event_type: &'a str,
    payload: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    customer_id: Option<&'a str>,
}

/// Runs `hookd events …`.
pub async fn events(args: EventsArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.common.server)?;
    let EventsCommand::Send(a) = args.command;
    let data = match a.data.strip_prefix('@') {
        Some("-") => std::io::read_to_string(std::io::stdin()).context("reading --data @-")?,
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("reading --data from {path}"))?
        }
        None => a.data.clone(),
    };
    let payload =
        RawValue::from_string(data.trim().to_owned()).context("--data is not valid JSON")?;
    let answer = client
        .post(
            "/events",
            &NewEvent {
                event_type: &a.event_type,
                payload: &payload,
                idempotency_key: a.idempotency_key.as_deref(),
                customer_id: a.customer.as_deref(),
            },
        )
        .await?;
    if args.common.json {
        return print_raw(&answer);
    }
    let accepted: Value = answer.json()?;
    println!("accepted event {}", text(&accepted["event_id"]));
    Ok(())
}

// ─────────────────────────────── deliveries ───────────────────────────────

/// `hookd deliveries …`.
#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: DeliveriesCommand,
}

#[derive(Debug, Subcommand)]
enum DeliveriesCommand {
    /// A subscription's deliveries, newest first, a page at a time.
    List(DeliveriesListArgs),
    /// One delivery with its attempts.
    Show(DlvArg),
    /// Send a delivery again: back to pending with a fresh retry window and
    /// the same `webhook-id`.
    Replay(DlvArg),
}

#[derive(Debug, Args)]
struct DlvArg {
    /// The delivery (`dlv_…`).
    #[arg(value_name = "DLV")]
    delivery: String,
}

#[derive(Debug, Args)]
struct DeliveriesListArgs {
    /// The subscription (`sub_…`).
    #[arg(long, value_name = "SUB")]
    subscription: String,
    /// Only deliveries in this state: pending, inflight, delivered, failed
    /// or dead.
    #[arg(long)]
    status: Option<String>,
    /// Only deliveries of this event type.
    #[arg(long)]
    event_type: Option<String>,
    /// Only deliveries created at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Only deliveries created before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// Page size (1 to 250).
    #[arg(long)]
    limit: Option<u32>,
    /// The page after this cursor (printed under the previous page).
    #[arg(long)]
    cursor: Option<String>,
}

/// Runs `hookd deliveries …`.
pub async fn deliveries(args: DeliveriesArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.common.server)?;
    let json = args.common.json;
    match args.command {
        DeliveriesCommand::List(a) => {
            let answer = client
                .get(
                    &format!("/subscriptions/{}/deliveries", segment(&a.subscription)),
                    &[
                        ("status", a.status),
                        ("event_type", a.event_type),
                        ("since", a.since),
                        ("until", a.until),
                        ("limit", a.limit.map(|n| n.to_string())),
                        ("cursor", a.cursor),
                    ],
                )
                .await?;
            if json {
                return print_raw(&answer);
            }
            let page: Value = answer.json()?;
            let rows: Vec<_> = items(&page)
                .iter()
                .map(|d| {
                    vec![
                        text(&d["delivery_id"]),
                        text(&d["event_type"]),
                        text(&d["state"]),
                        text(&d["attempt"]),
                        last_outcome(d),
                        time(&d["created_at"]),
                    ]
                })
                .collect();
            if rows.is_empty() {
                println!("no deliveries");
            } else {
                print!(
                    "{}",
                    table(
                        &["ID", "EVENT TYPE", "STATE", "ATTEMPTS", "LAST", "CREATED"],
                        rows
                    )
                );
            }
            print_next_cursor(&page);
        }
        DeliveriesCommand::Show(a) => {
            let answer = client
                .get(&format!("/deliveries/{}", segment(&a.delivery)), &[])
                .await?;
            if json {
                return print_raw(&answer);
            }
            let d: Value = answer.json()?;
            println!("delivery {}", text(&d["delivery_id"]));
            print!("{}", delivery_summary(&d));
        }
        DeliveriesCommand::Replay(a) => {
            let answer = client
                .post_empty(&format!("/deliveries/{}/replay", segment(&a.delivery)))
                .await?;
            if json {
                return print_raw(&answer);
            }
            let d: Value = answer.json()?;
            println!(
                "delivery {} is {} again: it will be sent with the same webhook-id",
                text(&d["delivery_id"]),
                text(&d["state"])
            );
        }
    }
    Ok(())
}

/// The last attempt's outcome: its status, else its error.
fn last_outcome(d: &Value) -> String {
    match (&d["last_status"], &d["last_error"]) {
        (Value::Null, Value::Null) => "-".into(),
        (Value::Null, e) => truncate(&text(e), 40),
        (s, _) => text(s),
    }
}

fn delivery_summary(d: &Value) -> String {
    let mut out = fields(&[
        ("state", text(&d["state"])),
        ("subscription", text(&d["sub_id"])),
        ("event", text(&d["event_id"])),
        ("event type", text(&d["event_type"])),
        ("destination", text(&d["destination_host"])),
        ("attempts", text(&d["attempt"])),
        ("next attempt", time(&d["next_attempt_at"])),
        ("last status", text(&d["last_status"])),
        ("last error", text(&d["last_error"])),
        ("created", time(&d["created_at"])),
        ("updated", time(&d["updated_at"])),
    ]);
    let attempts = items_at(&d["attempts"]);
    if !attempts.is_empty() {
        out.push('\n');
        let rows = attempts
            .iter()
            .map(|a| {
                vec![
                    text(&a["number"]),
                    time(&a["started_at"]),
                    text(&a["status"]),
                    format!("{} ms", text(&a["duration_ms"])),
                    text(&a["error_class"]),
                    truncate(&text(&a["response_snippet"]), 60),
                ]
            })
            .collect();
        out.push_str(&table(
            &["#", "STARTED", "STATUS", "DURATION", "ERROR", "RESPONSE"],
            rows,
        ));
    }
    out
}

// ───────────────────────────────── health ─────────────────────────────────

/// `hookd health SUB`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The subscription (`sub_…`).
    #[arg(value_name = "SUB")]
    sub: String,
    #[command(flatten)]
    common: Common,
}

/// Runs `hookd health`.
pub async fn health(args: HealthArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.common.server)?;
    let answer = client
        .get(
            &format!("/subscriptions/{}/health", segment(&args.sub)),
            &[],
        )
        .await?;
    if args.common.json {
        return print_raw(&answer);
    }
    let h: Value = answer.json()?;
    println!(
        "subscription {} ({}) → {}",
        text(&h["sub_id"]),
        text(&h["state"]),
        text(&h["destination_host"])
    );
    print!("{}", health_summary(&h));
    Ok(())
}

fn health_summary(h: &Value) -> String {
    let mut circuit = format!(
        "{}, {} in flight",
        text(&h["circuit_state"]),
        text(&h["in_flight"])
    );
    if let Some(rate) = h["rate_per_sec"].as_f64() {
        let _ = write!(circuit, ", {rate:.1}/s admitted");
    }
    if let Some(ramp) = h["ramp_level"].as_f64().filter(|r| *r < 1.0) {
        let _ = write!(circuit, ", recovering at {:.0}%", ramp * 100.0);
    }
    let counts = h["last_status_counts"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{}: {}", clean(k), text(v)))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let success = match h["success_rate"].as_f64() {
        Some(rate) => format!("{} over the last hour ({counts})", percent(rate)),
        None => "- (no attempts in the last hour)".into(),
    };
    let mut dead = text(&h["dead_count"]);
    if !h["oldest_dead_at"].is_null() {
        let _ = write!(dead, ", oldest {}", time(&h["oldest_dead_at"]));
    }
    let config = match &h["likely_configuration_error"] {
        Value::Null => "none".into(),
        e => format!(
            "likely: {} answers {} of failed attempts",
            text(&e["status"]),
            e["share"].as_f64().map(percent).unwrap_or_default()
        ),
    };
    let signals = items_at(&h["signals"]);
    let signals = if signals.is_empty() {
        "none".into()
    } else {
        signals
            .iter()
            .map(|s| {
                format!(
                    "{} since {}: {}",
                    text(&s["kind"]),
                    time(&s["raised_at"]),
                    text(&s["detail"])
                )
            })
            .collect::<Vec<_>>()
            .join(&format!("\n{:16}", ""))
    };
    fields(&[
        ("circuit", circuit),
        ("success rate", success),
        (
            "lag",
            format!(
                "{}s, {} pending",
                text(&h["lag_secs"]),
                text(&h["pending_count"])
            ),
        ),
        ("dead", dead),
        (
            "shedding",
            if h["shedding"] == Value::Bool(true) {
                "yes: ingest refuses its events (429)"
            } else {
                "no"
            }
            .into(),
        ),
        ("config error", config),
        ("signals", signals),
    ])
}

// ─────────────────────────────── formatting ───────────────────────────────

/// Prints the API's body as it came (nothing for an empty `204`).
fn print_raw(answer: &Answer) -> anyhow::Result<()> {
    let body = answer.text.trim_end();
    if !body.is_empty() {
        println!("{body}");
    }
    Ok(())
}

fn print_next_cursor(page: &Value) {
    if let Some(cursor) = page["next_cursor"].as_str() {
        println!("more: --cursor {}", clean(cursor));
    }
}

/// A page's `data`.
fn items(page: &Value) -> &[Value] {
    items_at(&page["data"])
}

fn items_at(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A value for people: strings without quotes, `-` for null or absent.
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => clean(s),
        v => clean(&v.to_string()),
    }
}

/// A JSON value in one line, cleaned.
fn compact(v: &Value) -> String {
    clean(&v.to_string())
}

/// An array of strings, comma-separated.
fn list(v: &Value) -> String {
    let parts: Vec<String> = items_at(v).iter().map(text).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// An RFC 3339 time as `2026-11-30 09:20:01Z`; anything else as it is.
fn time(v: &Value) -> String {
    match v.as_str().map(chrono::DateTime::parse_from_rfc3339) {
        Some(Ok(t)) => t.to_utc().format("%Y-%m-%d %H:%M:%SZ").to_string(),
        _ => text(v),
    }
}

fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p.fract() == 0.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// `s` with control characters (newlines, escape sequences) escaped, so
/// what a server or receiver wrote cannot move the cursor or recolour the
/// terminal.
fn clean(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// At most `max` characters, with `…` when cut.
fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// Labelled lines, the labels padded to one width.
fn fields(rows: &[(&str, String)]) -> String {
    let w = rows.iter().map(|(k, _)| width(k)).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "  {k:<w$}  {v}");
    }
    out
}

/// An aligned table: a header row, then the rows; columns two spaces apart,
/// the last one unpadded.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| width(h)).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(width(cell));
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let last = row.len().saturating_sub(1);
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i == last {
                line.push_str(cell);
            } else {
                let pad = w - width(cell);
                let _ = write!(line, "{cell}{:pad$}  ", "");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_by_characters() {
        let t = table(
            &["ID", "STATE"],
            vec![
                vec!["sub_1".into(), "active".into()],
                vec!["é".into(), "disabled".into()],
            ],
        );
        assert_eq!(t, "ID     STATE\nsub_1  active\né      disabled\n");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(clean("ok\n\u{1b}[31mred"), "ok\\n\\u{1b}[31mred");
        assert_eq!(text(&Value::Null), "-");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(percent(1.0), "100%");
        assert_eq!(percent(0.975), "97.5%");
    }
}
