//! The command line. Every flag of `serve` also reads a `HOOKD_*`
//! environment variable; flags win.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::serve::{App, AppConfig, open_store};

/// Webhook delivery that never loses an accepted event and never makes a
/// struggling endpoint worse.
#[derive(Debug, Parser)]
#[command(name = "hookd", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API and the dispatcher.
    Serve(ServeArgs),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// A local receiver for development: prints each webhook and checks its signature.
    Listen(crate::listen::ListenArgs),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Replay a subscription's deliveries as a job, showing its progress.
    Replay(crate::replay::ReplayArgs),
    /// Manage the key that seals subscription secrets at rest
    /// (HOOKD_ENCRYPTION_KEY).
    #[command(subcommand)]
    Keys(crate::keys::KeysCommand),
    /// Create, list, show, change and delete subscriptions (over the API).
    Subscriptions(crate::manage::SubscriptionsArgs),
    /// Post events (over the API).
    Events(crate::manage::EventsArgs),
    /// A subscription's deliveries: list, show one, replay one (over the API).
    Deliveries(crate::manage::DeliveriesArgs),
    /// A subscription's health: circuit, success rate, lag, backlog, signals.
    Health(crate::manage::HealthArgs),
    /// The shard map of a sharded PostgreSQL deployment: list it, or split
    /// a hot destination host over the shards.
    #[command(subcommand)]
    Shards(crate::shards::ShardsCommand),
}

/// `hookd token …`.
#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token scoped to one customer and print it (it is shown only
    /// this once; the database keeps its SHA-256).
    Create(TokenCreateArgs),
}

/// `hookd token create`.
#[derive(Debug, Args)]
struct TokenCreateArgs {
    /// The customer the token may act for.
    #[arg(long)]
    customer: String,
    /// A label for people (where the token is used, who holds it).
    #[arg(long)]
    label: Option<String>,
    #[command(flatten)]
    db: DatabaseArgs,
}

/// Where the data lives.
#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// `sqlite:PATH` (embedded, the default) or `postgres://…`.
    #[arg(long, env = "HOOKD_DATABASE_URL", default_value = "sqlite:hookd.db")]
    pub database: String,
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// For people.
    Human,
    /// One JSON object per line.
    Json,
}

/// What a `hookd serve` node runs (several nodes share one PostgreSQL
/// database).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// The HTTP API (and the subscription monitor): accepts events,
    /// delivers nothing.
    Api,
    /// The dispatcher and the background workers (replay jobs, retention,
    /// the monitor); serves only /healthz, /readyz and /metrics.
    Worker,
    /// Both: one node does everything (the only role on SQLite).
    All,
}

impl From<Role> for hookd_store::NodeRole {
    fn from(role: Role) -> Self {
        match role {
            Role::Api => Self::Api,
            Role::Worker => Self::Worker,
            Role::All => Self::All,
        }
    }
}

/// `hookd serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// A PostgreSQL database for deliveries (repeatable; the variable takes
    /// a comma-separated list): deliveries are placed on the shards by
    /// destination host, while --database becomes the control database
    /// (events, subscriptions, tokens, nodes, the shard map). The first
    /// node records the list there; later nodes may pass the same list, or
    /// none (they read it), or the list with shards added at the end. It may
    /// name --database itself. See docs/scaling.md.
    #[arg(long = "shard", env = "HOOKD_SHARDS", value_delimiter = ',')]
    shards: Vec<String>,
    /// Most connections this node opens to each PostgreSQL database (the
    /// control database and every shard). Size it so that nodes × databases
    /// × this stays under the server's max_connections.
    #[arg(long, env = "HOOKD_DATABASE_MAX_CONNECTIONS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..))]
    database_max_connections: u32,
    /// What this node runs. `api` and `worker` need PostgreSQL; run any
    /// number of each against one database.
    #[arg(long, env = "HOOKD_ROLE", value_enum, default_value = "all")]
    role: Role,
    /// How often this node records its heartbeat (worker nodes divide each
    /// destination's concurrency cap by the live worker nodes).
    #[arg(long, env = "HOOKD_HEARTBEAT_EVERY", default_value = "2s", value_parser = humantime::parse_duration)]
    heartbeat_every: Duration,
    /// A node whose last heartbeat is older than this no longer counts as
    /// live (at least twice --heartbeat-every).
    #[arg(long, env = "HOOKD_NODE_LIVE_WITHIN", default_value = "10s", value_parser = humantime::parse_duration)]
    node_live_within: Duration,
    /// Address the API listens on.
    #[arg(long, env = "HOOKD_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Allow subscriptions to loopback and private addresses (development
    /// and tests only: otherwise hookd is an open proxy into your network).
    #[arg(long, env = "HOOKD_ALLOW_PRIVATE_DESTINATIONS")]
    allow_private_destinations: bool,
    /// Allow destinations in this CIDR (or at this address) although it is
    /// private, loopback, link-local, …; repeatable (the variable takes a
    /// comma-separated list). Checked at creation and on every connection.
    #[arg(
        long = "allow-destination-cidr",
        env = "HOOKD_ALLOW_DESTINATION_CIDRS",
        value_delimiter = ',',
        value_parser = hookd_domain::destination::parse_cidr
    )]
    allow_destination_cidrs: Vec<hookd_domain::destination::IpNet>,
    /// Send every attempt through this HTTP(S) proxy (`http://host:port`).
    /// Without it, proxy variables such as `HTTPS_PROXY` are ignored.
    #[arg(long, env = "HOOKD_OUTBOUND_PROXY")]
    outbound_proxy: Option<String>,
    /// Log format.
    #[arg(long, env = "HOOKD_LOG_FORMAT", value_enum, default_value = "human")]
    log_format: LogFormat,
    /// Name recorded on claimed deliveries (default: host name and process id).
    #[arg(long, env = "HOOKD_WORKER_ID")]
    worker_id: Option<String>,
    /// How long a claimed delivery is owned before others may take it.
    #[arg(long, env = "HOOKD_LEASE", default_value = "90s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// Deadline for one attempt: connect, headers and body.
    #[arg(long, env = "HOOKD_ATTEMPT_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    attempt_timeout: Duration,
    /// How often a running attempt renews its lease.
    #[arg(long, env = "HOOKD_LEASE_RENEWAL", default_value = "30s", value_parser = humantime::parse_duration)]
    lease_renewal: Duration,
    /// Attempts in flight at once per destination host.
    #[arg(long, env = "HOOKD_HOST_CONCURRENCY", default_value_t = 20)]
    host_concurrency: u32,
    /// The rate a destination starts at, in attempts per second; it adapts
    /// to what the destination sustains (faster while it answers quickly and
    /// successfully, slower when latency or failures climb).
    #[arg(long, env = "HOOKD_DESTINATION_RATE_INITIAL", default_value_t = 50.0)]
    destination_rate_initial: f64,
    /// The most attempts per second hookd offers any one destination.
    #[arg(long, env = "HOOKD_DESTINATION_RATE_MAX", default_value_t = 10_000.0)]
    destination_rate_max: f64,
    /// The first open period of a destination's circuit breaker (doubling,
    /// up to 30 min, while probes keep failing).
    #[arg(long, env = "HOOKD_BREAKER_BACKOFF", default_value = "30s", value_parser = humantime::parse_duration)]
    breaker_backoff: Duration,
    /// How long a recovered destination takes to ramp from 10 % to 100 % of
    /// its rate and concurrency.
    #[arg(long, env = "HOOKD_RECOVERY_RAMP", default_value = "5m", value_parser = humantime::parse_duration)]
    recovery_ramp: Duration,
    /// A due delivery older than this is backlog: it keeps a guaranteed 20 %
    /// of its destination's concurrency, so backlogs always drain.
    #[arg(long, env = "HOOKD_BACKLOG_AGE", default_value = "30s", value_parser = humantime::parse_duration)]
    backlog_age: Duration,
    /// Attempts in flight at once in this process [default: 4096 on
    /// PostgreSQL, 1024 on SQLite].
    #[arg(long, env = "HOOKD_MAX_IN_FLIGHT")]
    max_in_flight: Option<usize>,
    /// On shutdown, how long in-flight attempts may take to finish.
    #[arg(long, env = "HOOKD_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
    /// Shed at ingest (429) for a subscription with at least this many
    /// unfinished deliveries that have not shrunk over --shed-window.
    #[arg(long, env = "HOOKD_SHED_BACKLOG", default_value_t = 10_000)]
    shed_backlog: u64,
    /// How long a backlog over --shed-backlog must not have shrunk.
    #[arg(long, env = "HOOKD_SHED_WINDOW", default_value = "10m", value_parser = humantime::parse_duration)]
    shed_window: Duration,
    /// Disable a subscription whose every attempt has failed for this long
    /// (its deliveries are kept and flow again when it is re-enabled).
    #[arg(long, env = "HOOKD_DISABLE_AFTER", default_value = "5days", value_parser = humantime::parse_duration)]
    disable_after: Duration,
    /// How often the subscription monitor looks (shedding, disabling,
    /// dead-lettering, configuration errors).
    #[arg(long, env = "HOOKD_MONITOR_EVERY", default_value = "5s", value_parser = humantime::parse_duration)]
    monitor_every: Duration,
    /// How long finished deliveries and their attempts are kept.
    #[arg(long, env = "HOOKD_RETAIN_DELIVERIES", default_value = "7days", value_parser = humantime::parse_duration)]
    retain_deliveries: Duration,
    /// How long events are kept (while no delivery refers to them).
    #[arg(long, env = "HOOKD_RETAIN_EVENTS", default_value = "30days", value_parser = humantime::parse_duration)]
    retain_events: Duration,
    /// An event matching more subscriptions than this is committed with a
    /// fan-out job, and its deliveries are written in batches of 1,000
    /// afterwards (lazy fan-out); up to this many are written with the
    /// event.
    #[arg(long, env = "HOOKD_LAZY_FANOUT_THRESHOLD", default_value_t = hookd_store::LazyFanout::DEFAULT.threshold)]
    lazy_fanout_threshold: usize,
    /// Write every new delivery pending for the claim loop, instead of
    /// creating those this node's dispatcher can send at once already
    /// claimed by it (with `--role all`; for comparison and diagnosis).
    #[arg(long, env = "HOOKD_NO_INGEST_CLAIMS")]
    no_ingest_claims: bool,
}

impl Cli {
    /// Runs the chosen command.
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Serve(args) => serve(args).await,
            Command::Migrate(args) => {
                init_logging(LogFormat::Human);
                let store = open_store(&args.database).await?;
                store.migrate().await.context("applying migrations")?;
                println!("migrations applied to {}", redact_url(&args.database));
                Ok(())
            }
            Command::Listen(args) => crate::listen::run(args).await,
            Command::Token(TokenCommand::Create(args)) => create_token(args).await,
            Command::Replay(args) => crate::replay::run(args).await,
            Command::Keys(command) => {
                init_logging(LogFormat::Human);
                crate::keys::run(command).await
            }
            Command::Subscriptions(args) => crate::manage::subscriptions(args).await,
            Command::Events(args) => crate::manage::events(args).await,
            Command::Deliveries(args) => crate::manage::deliveries(args).await,
            Command::Health(args) => crate::manage::health(args).await,
            Command::Shards(command) => {
                init_logging(LogFormat::Human);
                crate::shards::run(command).await
            }
        }
    }
}

/// `hookd token create`: opens (and migrates) the store directly, so it
/// works before the first `serve` and without an admin token.
async fn create_token(args: TokenCreateArgs) -> anyhow::Result<()> {
    init_logging(LogFormat::Human);
    let customer = hookd_domain::CustomerId::parse(&args.customer)
        .map_err(|e| anyhow::anyhow!("--customer: {e}"))?;
    let store = open_store(&args.db.database).await?;
    store.migrate().await.context("applying migrations")?;
    let token = hookd_api::create_customer_token(store.as_ref(), customer, args.label)
        .await
        .context("storing the token")?;
    println!("{token}");
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    arm_failpoints()?;
    // Before `args` is partly moved out of below.
    let max_in_flight = args.max_in_flight();
    let worker_id = args.worker_id.unwrap_or_else(default_worker_id);
    let mut dispatch = hookd_dispatch::DispatchConfig::standard(worker_id);
    dispatch.lease = args.lease;
    dispatch.attempt_timeout = args.attempt_timeout;
    dispatch.renew_every = args.lease_renewal;
    dispatch.admission.concurrency = args.host_concurrency;
    anyhow::ensure!(
        args.destination_rate_initial >= 1.0
            && args.destination_rate_initial <= args.destination_rate_max,
        "--destination-rate-initial must be at least 1 and at most --destination-rate-max"
    );
    dispatch.admission.rate.initial = args.destination_rate_initial;
    dispatch.admission.rate.max = args.destination_rate_max;
    dispatch.admission.breaker.base_backoff = args.breaker_backoff;
    dispatch.admission.breaker.max_backoff = dispatch
        .admission
        .breaker
        .max_backoff
        .max(args.breaker_backoff);
    dispatch.admission.ramp.period = args.recovery_ramp;
    dispatch.backlog_age = args.backlog_age;
    dispatch.max_in_flight = max_in_flight;
    dispatch.shutdown_grace = args.shutdown_grace;
    dispatch
        .validate()
        .map_err(anyhow::Error::msg)
        .context("checking the dispatcher settings")?;

    anyhow::ensure!(
        args.retain_events >= args.retain_deliveries,
        "--retain-events must be at least --retain-deliveries: a delivery needs its event"
    );
    anyhow::ensure!(
        !args.monitor_every.is_zero(),
        "--monitor-every must be more than 0"
    );
    let mut config = AppConfig::new(args.db.database, dispatch);
    config.shards = args.shards;
    config.database_max_connections = args.database_max_connections;
    config.allow_private_destinations = args.allow_private_destinations;
    config.allow_destination_cidrs = args.allow_destination_cidrs;
    if let Some(proxy) = args.outbound_proxy.filter(|p| !p.is_empty()) {
        let url = reqwest::Url::parse(&proxy).context("--outbound-proxy is not a URL")?;
        anyhow::ensure!(
            matches!(url.scheme(), "http" | "https"),
            "--outbound-proxy must be an http:// or https:// URL"
        );
        config.dispatch.egress.proxy = Some(proxy);
    }
    config.admin_token = std::env::var("HOOKD_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    config.monitor = hookd_api::MonitorConfig {
        every: args.monitor_every,
        shedding: hookd_domain::shedding::SheddingConfig {
            threshold: args.shed_backlog,
            window: to_chrono(args.shed_window, "--shed-window")?,
        },
        disable_after: to_chrono(args.disable_after, "--disable-after")?,
    };
    config.retention.deliveries = args.retain_deliveries;
    config.retention.events = args.retain_events;
    config.lazy_fanout.threshold = args.lazy_fanout_threshold;
    config.ingest_claims = !args.no_ingest_claims;
    config.role = args.role.into();
    config.nodes = crate::cluster::NodesConfig {
        heartbeat_every: args.heartbeat_every,
        live_within: args.node_live_within,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the API to {}", args.listen))?;
    let app = App::build(config, listener).await?;
    if let Some(token) = app.generated_admin_token() {
        // Printed once, on the first start; only its hash is stored.
        println!();
        println!("  No HOOKD_ADMIN_TOKEN was set, so hookd generated an admin token.");
        println!("  It is shown only this once; keep it somewhere safe:");
        println!();
        println!("    {token}");
        println!();
    }
    tracing::info!(listen = %app.local_addr(), database = %redact_url(app.database()), role = app.role().as_str(), "hookd is serving");
    let shutdown = app.shutdown_token();
    tokio::spawn(async move {
        wait_for_signal().await;
        shutdown.cancel();
        tracing::info!("signal received: shutting down");
    });
    app.run().await
}

/// The process's cap on attempts in flight when `--max-in-flight` is not
/// given. On PostgreSQL a larger cap means larger claims and record batches,
/// so fewer statements and commits for the same deliveries: in `fanout`,
/// 4,096 made 854 record transactions where 1,024 made 1,599, and cut the
/// server's CPU per delivery by 10-16 % (docs/benchmarks.md, sessions 32
/// and 33; 8,192 gained nothing more and cost RSS). SQLite's
/// one writer gains nothing from more records waiting for it: the same
/// change made its `fanout` a fifth slower and its RSS 85 MiB larger.
/// Either way each destination stays under its own cap
/// (`--host-concurrency`).
fn default_max_in_flight(database: &str) -> usize {
    if crate::serve::is_postgres(database) {
        4096
    } else {
        1024
    }
}

impl ServeArgs {
    /// `--max-in-flight` if given, else the backend's default.
    fn max_in_flight(&self) -> usize {
        self.max_in_flight
            .unwrap_or_else(|| default_max_in_flight(&self.db.database))
    }
}

fn to_chrono(d: Duration, flag: &str) -> anyhow::Result<chrono::Duration> {
    chrono::Duration::from_std(d).map_err(|_| anyhow::anyhow!("{flag} is too long"))
}

/// How `hookd serve` exits when a failpoint armed with `exit` is hit.
pub const FAILPOINT_EXIT_CODE: i32 = 86;

/// Arms the crash points named in `HOOKD_FAILPOINTS` (`name=action;…`), in
/// builds with the `failpoints` feature only (the end-to-end tests' build;
/// never a release). An action is one of `fail`'s (`panic`, `sleep(ms)`,
/// `off`, …) or `exit`: the process exits at once with
/// [`FAILPOINT_EXIT_CODE`], without unwinding or shutting down, like a crash;
/// `N*off->exit` lets the first N hits pass and exits at the next.
fn arm_failpoints() -> anyhow::Result<()> {
    let Ok(spec) = std::env::var("HOOKD_FAILPOINTS") else {
        return Ok(());
    };
    if !fail::has_failpoints() {
        tracing::warn!("HOOKD_FAILPOINTS is ignored: this build has no failpoints");
        return Ok(());
    }
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, action) = entry
            .split_once('=')
            .map(|(n, a)| (n.trim().to_owned(), a.trim()))
            .with_context(|| format!("HOOKD_FAILPOINTS: `{entry}` is not `name=action`"))?;
        let armed = if let Some(pass) = exit_after(action) {
            let hit = name.clone();
            let passed = std::sync::atomic::AtomicUsize::new(0);
            fail::cfg_callback(name.clone(), move || {
                if passed.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < pass {
                    return;
                }
                eprintln!("failpoint {hit} hit: exiting with {FAILPOINT_EXIT_CODE}");
                std::process::exit(FAILPOINT_EXIT_CODE)
            })
        } else {
            fail::cfg(name.clone(), action)
        };
        armed
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("HOOKD_FAILPOINTS: arming `{name}`"))?;
        tracing::warn!(failpoint = %name, action, "failpoint armed");
    }
    Ok(())
}

/// How many hits an `exit` action lets pass: `exit` none, `N*off->exit` N.
fn exit_after(action: &str) -> Option<usize> {
    if action == "exit" {
        return Some(0);
    }
    action
        .strip_suffix("*off->exit")
        .and_then(|n| n.trim().parse().ok())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.unwrap_or(());
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "hookd".into());
    format!("{host}-{}", std::process::id())
}

/// The URL without any password, for logs.
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://…@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// Logs go to stderr so stdout stays for what a command prints.
fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("HOOKD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // A log line that cannot be written (stderr closed: `hookd serve | head`)
    // is dropped. tracing's default is to report that with `eprintln!`,
    // which panics on the same closed stderr — inside whatever task was
    // logging, e.g. the one that turns SIGTERM into a shutdown.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact_url("postgres://u:secret@db:5432/x"),
            "postgres://…@db:5432/x"
        );
        assert_eq!(redact_url("sqlite:hookd.db"), "sqlite:hookd.db");
    }

    #[test]
    fn an_exit_failpoint_may_let_hits_pass_first() {
        assert_eq!(exit_after("exit"), Some(0));
        assert_eq!(exit_after("2*off->exit"), Some(2));
        assert_eq!(exit_after("panic"), None);
        assert_eq!(exit_after("x*off->exit"), None);
    }

    /// `hookd serve` parsed from `args` alone: the `HOOKD_*` variables the
    /// flags under test read are ignored (clap reads the process's
    /// environment, which the test cannot clear safely).
    fn serve_args(args: &[&str]) -> ServeArgs {
        for var in [
            "HOOKD_RETAIN_DELIVERIES",
            "HOOKD_RETAIN_EVENTS",
            "HOOKD_DISABLE_AFTER",
            "HOOKD_ALLOW_PRIVATE_DESTINATIONS",
            "HOOKD_ALLOW_DESTINATION_CIDRS",
            "HOOKD_MAX_IN_FLIGHT",
        ] {
            assert!(
                std::env::var_os(var).is_none(),
                "{var} is set: it would override the defaults under test"
            );
        }
        let cli = Cli::try_parse_from(["hookd", "serve"].iter().chain(args)).unwrap();
        match cli.command {
            Command::Serve(args) => args,
            other => panic!("not serve: {other:?}"),
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn retention_and_disabling_default_to_the_issues_periods() {
        let args = serve_args(&[]);
        assert_eq!(args.retain_deliveries, 7 * DAY, "deliveries and attempts");
        assert_eq!(args.retain_events, 30 * DAY, "events");
        assert_eq!(args.disable_after, 5 * DAY);
        // The library's defaults say the same, so an embedder gets them too.
        let retention = crate::maintenance::RetentionConfig::default();
        assert_eq!(retention.deliveries, args.retain_deliveries);
        assert_eq!(retention.events, args.retain_events);
        assert_eq!(
            hookd_api::MonitorConfig::default().disable_after,
            to_chrono(args.disable_after, "--disable-after").unwrap()
        );
    }

    #[test]
    fn the_in_flight_cap_defaults_by_backend_and_the_flag_wins() {
        const PG: &str = "postgres://postgres@127.0.0.1/test";
        assert_eq!(serve_args(&[]).max_in_flight, None);
        assert_eq!(default_max_in_flight(PG), 4096);
        assert_eq!(
            default_max_in_flight("postgresql://db.internal/hookd"),
            4096
        );
        assert_eq!(default_max_in_flight("sqlite:hookd.db"), 1024);
        assert_eq!(
            default_max_in_flight("sqlite:///var/lib/hookd/hookd.db"),
            1024
        );
        assert_eq!(serve_args(&["--max-in-flight", "7"]).max_in_flight, Some(7));
        // What `serve` uses: the backend's default unless the flag is given.
        let on = |flags: &[&str]| serve_args(flags).max_in_flight();
        assert_eq!(on(&["--database", PG]), 4096);
        assert_eq!(on(&["--database", "sqlite:hookd.db"]), 1024);
        assert_eq!(on(&["--database", PG, "--max-in-flight", "7"]), 7);
        assert_eq!(
            on(&["--database", "sqlite:hookd.db", "--max-in-flight", "7"]),
            7
        );
    }

    #[test]
    fn retention_periods_parse_from_their_flags() {
        let args = serve_args(&["--retain-deliveries", "2d", "--retain-events", "10d"]);
        assert_eq!(args.retain_deliveries, 2 * DAY);
        assert_eq!(args.retain_events, 10 * DAY);
        let args = serve_args(&[
            "--retain-deliveries=36h",
            "--retain-events=8days",
            "--disable-after=1day",
        ]);
        assert_eq!(args.retain_deliveries, Duration::from_secs(36 * 3600));
        assert_eq!(args.retain_events, 8 * DAY);
        assert_eq!(args.disable_after, DAY);
        assert!(
            Cli::try_parse_from(["hookd", "serve", "--retain-events", "soon"]).is_err(),
            "not a duration"
        );
    }

    #[test]
    fn the_destination_check_is_on_by_default_and_its_allowlist_parses() {
        let args = serve_args(&[]);
        assert!(
            !args.allow_private_destinations,
            "SSRF protection is the default"
        );
        assert!(args.allow_destination_cidrs.is_empty());
        let args = serve_args(&[
            "--allow-destination-cidr",
            "10.1.0.0/16",
            "--allow-destination-cidr=127.0.0.2,fd00::/8",
        ]);
        let cidrs: Vec<String> = args
            .allow_destination_cidrs
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(cidrs, ["10.1.0.0/16", "127.0.0.2/32", "fd00::/8"]);
        assert!(
            Cli::try_parse_from(["hookd", "serve", "--allow-destination-cidr", "10.0.0.0/33"])
                .is_err(),
            "not a CIDR"
        );
        assert!(serve_args(&["--allow-private-destinations"]).allow_private_destinations);
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
