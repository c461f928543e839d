//! The scenarios: each one is a [`Plan`] (receivers, load, hookd flags)
//! run by [`execute`], then turned into a [`Report`] with its own figures.
//!
//! A run: start the receivers, start hookd (or use `--target`), subscribe
//! every receiver to every event, post the load, wait until every expected
//! delivery has arrived (or the drain window closes), read hookd's usage,
//! stop hookd, stop the receivers. "Lost" is an expected delivery that had
//! not arrived when the drain window closed.
//!
//! `backlog` builds its backlog with a receiver that *holds* every request
//! (answers nothing until released): hookd keeps `--host-concurrency`
//! attempts open and every other delivery stays pending and due. Once every
//! event is accepted the receiver answers them all, and the rest drain at
//! hookd's pace. (Held attempts that reach hookd's 30 s attempt timeout are
//! retried after a backoff; they are a handful against the backlog.)

use std::path::PathBuf;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::cli::{Cli, Common, Load, Scenario};
use crate::hookd::{Hookd, Usage, own_cpu_seconds};
use crate::plot;
use crate::poster::{Pace, Posted, Poster, Sink, rate};
use crate::receiver::{Behaviour, Delivery, Fleet, Seen, now_ns};
use crate::report::{
    Latencies, Report, latency_by_second_csv, per_second, rate_after, round, series_csv,
};

/// What one run does.
#[derive(Debug)]
struct Plan {
    name: String,
    behaviours: Vec<Behaviour>,
    pace: Pace,
    /// Extra fields of every subscription.
    subscription: serde_json::Value,
    /// `hookd serve` flags unless `--hookd-arg` sets them.
    hookd_defaults: Vec<(&'static str, &'static str)>,
    drain_timeout: Duration,
    /// `backlog`: release held requests once every event is accepted.
    release_after_posting: bool,
    /// `bare`: no hookd, post straight to receiver 0.
    bare: bool,
    /// `--payload-bytes`: padding in every payload.
    payload_bytes: usize,
}

/// What one run saw.
#[derive(Debug)]
struct Outcome {
    name: String,
    backend: String,
    posted: Posted,
    seen: Vec<Seen>,
    usage: Option<Usage>,
    harness_cpu_s: f64,
    released_ns: Option<u64>,
    rss_at_release_mib: Option<f64>,
    /// Whether every expected delivery arrived before the drain window closed.
    drained: bool,
    /// `--payload-bytes`.
    payload_bytes: usize,
}

/// Runs the scenario the command line names.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.scenario {
        Scenario::Fanout(a) => {
            let plan = Plan::new(
                "fanout",
                &a.load,
                full(2_000, 64),
                a.load.destinations.unwrap_or(100),
            );
            simple(&a.common, plan).await
        }
        Scenario::Single(a) => {
            let mut plan = Plan::new(
                "single",
                &a.load,
                full(20_000, 64),
                a.load.destinations.unwrap_or(1),
            );
            // The "its rate limit and cap raised": a cap of 256 and a
            // fixed 50,000/s instead of the adaptive rate's cautious start.
            plan.hookd_defaults = vec![
                ("--host-concurrency", "256"),
                ("--destination-rate-initial", "50000"),
                ("--destination-rate-max", "50000"),
            ];
            simple(&a.common, plan).await
        }
        Scenario::Steady(a) => {
            let plan = Plan::new(
                "steady",
                &a.load,
                fixed(500.0, 20, 256),
                a.load.destinations.unwrap_or(10),
            );
            simple(&a.common, plan).await
        }
        Scenario::Backlog(a) => backlog(&a.common, &a.load).await,
        Scenario::Bare(a) => {
            let mut plan = Plan::new("bare", &a.load, full(50_000, 64), 1);
            plan.bare = true;
            simple(&a.common, plan).await
        }
        Scenario::Isolation(a) => {
            if a.compare {
                isolation_compare(&a.common, &a.load).await
            } else {
                isolation(&a.common, &a.load, !a.no_hang).await.map(|_| ())
            }
        }
        Scenario::Recovery(a) => recovery(&a).await,
    }
}

fn full(events: u64, concurrency: usize) -> Pace {
    Pace::FullSpeed {
        events,
        concurrency,
    }
}

fn fixed(per_s: f64, secs: u64, concurrency: usize) -> Pace {
    Pace::Rate {
        per_s,
        duration: Duration::from_secs(secs),
        concurrency,
    }
}

impl Plan {
    /// A plan of `destinations` `ok` receivers; `--rate`/`--duration` turn
    /// any scenario into a fixed-rate one, `--events` a full-speed one.
    fn new(name: &str, load: &Load, default: Pace, destinations: usize) -> Plan {
        let pace = match default {
            Pace::FullSpeed {
                events,
                concurrency,
            } if load.rate.is_none() && load.duration.is_none() => Pace::FullSpeed {
                events: load.events.unwrap_or(events),
                concurrency: load.concurrency.unwrap_or(concurrency),
            },
            Pace::FullSpeed { concurrency, .. } => Pace::Rate {
                per_s: load.rate.unwrap_or(100.0),
                duration: load.duration.unwrap_or(Duration::from_secs(10)),
                concurrency: load.concurrency.unwrap_or(concurrency),
            },
            Pace::Rate {
                per_s,
                duration,
                concurrency,
            } => Pace::Rate {
                per_s: load.rate.unwrap_or(per_s),
                duration: load.duration.unwrap_or(duration),
                concurrency: load.concurrency.unwrap_or(concurrency),
            },
        };
        Plan {
            name: name.into(),
            behaviours: vec![load.behaviour.unwrap_or(Behaviour::Ok); destinations.max(1)],
            pace,
            subscription: serde_json::json!({}),
            hookd_defaults: Vec::new(),
            drain_timeout: Duration::from_secs(120),
            release_after_posting: false,
            bare: false,
            payload_bytes: load.payload_bytes.unwrap_or(0),
        }
    }

    /// The longest the posting may take before it is cut off.
    fn posting_deadline(&self) -> Instant {
        let most = match self.pace {
            Pace::FullSpeed { .. } => Duration::from_secs(3_600),
            Pace::Rate { duration, .. } => duration + Duration::from_secs(60),
        };
        Instant::now() + most
    }
}

fn backend_name(common: &Common, bare: bool) -> String {
    if bare {
        "none".into()
    } else if common.target.is_some() {
        "target".into()
    } else {
        common.backend.name().into()
    }
}

/// Runs a plan from start to stop; hookd is stopped whatever happens.
async fn execute(common: &Common, mut plan: Plan) -> anyhow::Result<Outcome> {
    if let Some(d) = common.drain_timeout {
        plan.drain_timeout = d;
    }
    eprintln!(
        "== {}: {} destinations, {:?}",
        plan.name,
        plan.behaviours.len(),
        plan.pace
    );
    let fleet = Fleet::start(&plan.behaviours).await?;
    let mut hookd = if plan.bare {
        None
    } else {
        Some(Hookd::start(common, &plan.hookd_defaults).await?)
    };
    let result = drive(&plan, &fleet, hookd.as_ref()).await;
    let usage = hookd.as_ref().and_then(Hookd::usage);
    // Receivers first: hanging and held requests end at once, so hookd's
    // shutdown need not wait out its grace period for them.
    let seen = fleet.stop().await;
    if let Some(h) = hookd.as_mut() {
        h.stop().await;
    }
    let (posted, harness_cpu_s, released_ns, rss_at_release_mib, drained) = result?;
    Ok(Outcome {
        name: plan.name.clone(),
        backend: backend_name(common, plan.bare),
        posted,
        seen,
        usage,
        harness_cpu_s,
        released_ns,
        rss_at_release_mib,
        drained,
        payload_bytes: plan.payload_bytes,
    })
}

type Driven = (Posted, f64, Option<u64>, Option<f64>, bool);

/// Subscribes, posts, releases (backlog) and waits for the deliveries.
async fn drive(plan: &Plan, fleet: &Fleet, hookd: Option<&Hookd>) -> anyhow::Result<Driven> {
    let poster = Poster::new(plan.payload_bytes)?;
    let sink = match hookd {
        Some(h) => {
            for i in 0..fleet.len() {
                poster
                    .subscribe(&h.base_url, &h.token, &fleet.url(i), &plan.subscription)
                    .await
                    .with_context(|| format!("subscribing receiver {i}"))?;
            }
            Sink::Hookd {
                events_url: format!("{}/events", h.base_url),
                token: h.token.clone(),
            }
        }
        None => Sink::Bare { url: fleet.url(0) },
    };
    let cpu0 = own_cpu_seconds();
    fleet.start_load(now_ns());
    let mut posting = pin!(poster.run(&sink, plan.pace, plan.posting_deadline()));
    let posted = loop {
        tokio::select! {
            p = &mut posting => break p,
            _ = tokio::time::sleep(Duration::from_secs(10)) => progress(&poster, fleet, hookd),
        }
    };
    eprintln!(
        "posted: {} accepted, {} failed, {} retries, {:.0}/s",
        posted.accepted,
        posted.failed,
        posted.retries,
        posted.accepted_per_s()
    );
    let (mut released_ns, mut rss_at_release) = (None, None);
    if plan.release_after_posting {
        rss_at_release = hookd.and_then(Hookd::usage).map(|u| u.rss_mib);
        released_ns = Some(now_ns());
        fleet.release();
    }
    // Receivers that answer 2xx sooner or later must get every event.
    let want: Vec<bool> = plan
        .behaviours
        .iter()
        .map(|b| !matches!(b, Behaviour::Hang | Behaviour::Fail))
        .collect();
    let deadline = Instant::now() + plan.drain_timeout;
    let mut waiting = pin!(fleet.wait_for(&want, posted.accepted, deadline));
    let all = loop {
        tokio::select! {
            all = &mut waiting => break all,
            _ = tokio::time::sleep(Duration::from_secs(10)) => progress(&poster, fleet, hookd),
        }
    };
    if !all {
        eprintln!(
            "drain window ({:?}) closed before every delivery arrived",
            plan.drain_timeout
        );
    }
    Ok((
        posted,
        own_cpu_seconds() - cpu0,
        released_ns,
        rss_at_release,
        all,
    ))
}

fn progress(poster: &Poster, fleet: &Fleet, hookd: Option<&Hookd>) {
    let delivered: u64 = (0..fleet.len()).map(|i| fleet.distinct(i)).sum();
    let rss = hookd.and_then(Hookd::usage).map_or(String::new(), |u| {
        format!(", hookd RSS {:.0} MiB", u.rss_mib)
    });
    eprintln!(
        "  … {} accepted, {delivered} delivered{rss}",
        poster.accepted.load(Ordering::Relaxed)
    );
}

impl Outcome {
    /// The common figures, over every receiver.
    fn report(&self) -> Report {
        let accepted = self.posted.accepted;
        let mut latencies = Latencies::new();
        let mut last_arrival = self.posted.first_ns;
        for s in &self.seen {
            latencies.add(&s.deliveries);
            if let Some(m) = s.deliveries.iter().map(|d| d.arrival_ns).max() {
                last_arrival = last_arrival.max(m);
            }
        }
        let deliveries: u64 = self.seen.iter().map(|s| s.distinct).sum();
        let lost = self
            .seen
            .iter()
            .filter(|s| !matches!(s.behaviour, Behaviour::Hang | Behaviour::Fail))
            .map(|s| accepted.saturating_sub(s.distinct))
            .sum();
        let malformed: u64 = self.seen.iter().map(|s| s.malformed).sum();
        let mut r = Report {
            scenario: self.name.clone(),
            backend: self.backend.clone(),
            events: accepted,
            destinations: self.seen.len(),
            accepted_per_s: round(self.posted.accepted_per_s()),
            deliveries,
            deliveries_per_s: round(rate(deliveries, self.posted.first_ns, last_arrival)),
            latency_ms: latencies.summary(),
            lost,
            duplicates: self.seen.iter().map(|s| s.duplicates).sum(),
            hookd_cpu_s: self.usage.map(|u| round(u.cpu_s)),
            hookd_peak_rss_mib: self.usage.map(|u| round(u.peak_rss_mib)),
            harness_cpu_s: round(self.harness_cpu_s),
            extra: Default::default(),
        };
        if !self.drained {
            // `lost` then counts deliveries still pending in hookd, not data loss.
            r = r.with("drain_complete", false);
        }
        if self.posted.failed > 0 {
            r = r.with("events_not_accepted", self.posted.failed);
        }
        if malformed > 0 {
            r = r.with("malformed", malformed);
        }
        if self.payload_bytes > 0 {
            r = r.with("payload_bytes", self.payload_bytes as u64);
        }
        // A full-speed run has two phases: ingest, which shares the machine
        // with delivering, and the drain after the last acceptance.
        let arrivals = self
            .seen
            .iter()
            .flat_map(|s| s.deliveries.iter().map(|d| d.arrival_ns));
        if let Some((n, per_s)) = rate_after(arrivals, self.posted.last_ns) {
            let ingest_s = self.posted.last_ns.saturating_sub(self.posted.first_ns) as f64 / 1e9;
            r = r
                .with("ingest_s", round(ingest_s))
                .with("deliveries_after_ingest", n)
                .with("after_ingest_deliveries_per_s", round(per_s));
        }
        r
    }

    /// Latencies of the receivers `pick` chooses.
    fn latencies(&self, pick: impl Fn(&Seen) -> bool) -> Latencies {
        let mut l = Latencies::new();
        for s in self.seen.iter().filter(|s| pick(s)) {
            l.add(&s.deliveries);
        }
        l
    }

    /// Seconds from the first POST to the last thing seen, rounded up.
    fn seconds(&self) -> usize {
        let last = self
            .seen
            .iter()
            .flat_map(|s| s.attempts.iter().copied())
            .max()
            .unwrap_or(self.posted.first_ns);
        (last.saturating_sub(self.posted.first_ns) / 1_000_000_000 + 1) as usize
    }
}

fn plot_path(common: &Common, file: &str) -> Option<PathBuf> {
    common.plot.as_ref().map(|d| d.join(file))
}

/// Runs `plan`, prints its report, plots its latency curve.
async fn simple(common: &Common, plan: Plan) -> anyhow::Result<()> {
    let out = execute(common, plan).await?;
    out.report().emit(&common.out)?;
    let all: Vec<&Delivery> = out.seen.iter().flat_map(|s| &s.deliveries).collect();
    let csv = common.out.join(format!(
        "{}-{}-latency-by-second.csv",
        out.name, out.backend
    ));
    std::fs::write(&csv, latency_by_second_csv(&all, out.posted.first_ns))
        .with_context(|| format!("writing {}", csv.display()))?;
    if let Some(p) = plot_path(common, &format!("{}-{}-latency.svg", out.name, out.backend)) {
        let curve = out.latencies(|_| true).curve();
        let title = format!("{} ({}): event → delivery latency", out.name, out.backend);
        plot::write(&p, |p| {
            plot::latency_curves(p, &title, &[(&out.name, curve)])
        })?;
    }
    Ok(())
}

/// `isolation`; returns the healthy destinations' p99 in ms and their
/// percentile curve.
async fn isolation(
    common: &Common,
    load: &Load,
    hang: bool,
) -> anyhow::Result<(f64, Vec<(f64, f64)>)> {
    let name = if hang {
        "isolation"
    } else {
        "isolation-no-hang"
    };
    let mut plan = Plan::new(
        name,
        load,
        fixed(200.0, 30, 256),
        load.destinations.unwrap_or(100),
    );
    if hang {
        plan.behaviours[0] = Behaviour::Hang;
    }
    plan.drain_timeout = Duration::from_secs(60);
    let out = execute(common, plan).await?;
    let healthy = out.latencies(|s| s.behaviour != Behaviour::Hang);
    let p99 = healthy.summary().p99;
    let hang_attempts: usize = out
        .seen
        .iter()
        .filter(|s| s.behaviour == Behaviour::Hang)
        .map(|s| s.attempts.len())
        .sum();
    let mut report = out.report().with("healthy_p99_ms", p99);
    if hang {
        report = report.with("hanging_destination_attempts", hang_attempts);
    }
    report.emit(&common.out)?;
    if let Some(p) = plot_path(common, &format!("{name}-{}-latency.svg", out.backend)) {
        let title = format!("{name} ({}): healthy destinations' latency", out.backend);
        plot::write(&p, |p| {
            plot::latency_curves(p, &title, &[("healthy destinations", healthy.curve())])
        })?;
    }
    Ok((p99, healthy.curve()))
}

/// `isolation --compare`: with and without the hanging destination, and
/// the ratio of the healthy destinations' p99.
async fn isolation_compare(common: &Common, load: &Load) -> anyhow::Result<()> {
    let (hang, hang_curve) = isolation(common, load, true).await?;
    let (base, base_curve) = isolation(common, load, false).await?;
    let ratio = round(hang / base.max(0.001));
    let backend = backend_name(common, false);
    println!(
        "isolation: healthy p99 {hang} ms with a hanging destination, {base} ms without: ratio {ratio}"
    );
    let line = serde_json::json!({
        "scenario": "isolation-compare",
        "backend": backend,
        "healthy_p99_ms_hang": hang,
        "healthy_p99_ms_no_hang": base,
        "healthy_p99_ratio": ratio,
    });
    println!("{line}");
    crate::report::append_line(&common.out, &line.to_string())?;
    if let Some(p) = plot_path(common, &format!("isolation-compare-{backend}-latency.svg")) {
        let title = format!("isolation ({backend}): healthy destinations' latency");
        let runs = [
            ("one destination hangs", hang_curve),
            ("all healthy", base_curve),
        ];
        plot::write(&p, |p| plot::latency_curves(p, &title, &runs))?;
    }
    Ok(())
}

/// `recovery`: destination 0 fails then recovers; the others are healthy.
async fn recovery(a: &crate::cli::Recovery) -> anyhow::Result<()> {
    let mut plan = Plan::new("recovery", &a.load, fixed(50.0, 150, 256), a.healthy + 1);
    plan.behaviours[0] = Behaviour::FailThenOk(a.fail_for);
    plan.drain_timeout = Duration::from_secs(300);
    let out = execute(&a.common, plan).await?;
    let t0 = out.posted.first_ns;
    let seconds = out.seconds();
    let rec = &out.seen[0];
    let arrivals: Vec<u64> = rec.deliveries.iter().map(|d| d.arrival_ns).collect();
    let deliveries = per_second(&arrivals, t0, seconds);
    let attempts = per_second(&rec.attempts, t0, seconds);

    let recovered_ns = t0 + a.fail_for.as_nanos() as u64;
    let first_ok = arrivals.iter().copied().min();
    let caught_up = (rec.distinct >= out.posted.accepted)
        .then(|| arrivals.iter().copied().max())
        .flatten();
    let secs_after = |t: Option<u64>| t.map(|t| round(t.saturating_sub(recovered_ns) as f64 / 1e9));
    let recovers = |s: &Seen| matches!(s.behaviour, Behaviour::FailThenOk(_));
    let healthy = out.latencies(|s| !recovers(s));
    let recovering = out.latencies(recovers);
    let report = out
        .report()
        .with("healthy_p99_ms", healthy.summary().p99)
        .with("recovering_p99_ms", recovering.summary().p99)
        .with("recovering_attempts", rec.attempts.len())
        .with("first_delivery_after_recovery_s", secs_after(first_ok))
        .with("caught_up_after_recovery_s", secs_after(caught_up));

    println!(
        "recovering destination, per second since the first POST (fails until {} s):",
        a.fail_for.as_secs()
    );
    println!("  {:>4}  {:>10}  {:>8}", "s", "deliveries", "attempts");
    for s in 0..seconds {
        println!("  {s:>4}  {:>10}  {:>8}", deliveries[s], attempts[s]);
    }
    std::fs::create_dir_all(&a.common.out)?;
    let csv = a.common.out.join(format!("recovery-{}.csv", out.backend));
    std::fs::write(
        &csv,
        series_csv(
            &["deliveries", "attempts"],
            &[deliveries.clone(), attempts.clone()],
        ),
    )
    .with_context(|| format!("writing {}", csv.display()))?;
    eprintln!("wrote {}", csv.display());
    report.emit(&a.common.out)?;
    if let Some(p) = plot_path(&a.common, &format!("recovery-{}-rate.svg", out.backend)) {
        let title = format!(
            "recovery ({}): the destination fails for {} s, then recovers",
            out.backend,
            a.fail_for.as_secs()
        );
        plot::write(&p, |p| {
            plot::per_second(
                p,
                &title,
                "per second",
                &[("deliveries", &deliveries), ("attempts", &attempts)],
            )
        })?;
    }
    if let Some(p) = plot_path(&a.common, &format!("recovery-{}-latency.svg", out.backend)) {
        let title = format!("recovery ({}): event → delivery latency", out.backend);
        plot::write(&p, |p| {
            plot::latency_curves(
                p,
                &title,
                &[
                    ("healthy", healthy.curve()),
                    ("recovering", recovering.curve()),
                ],
            )
        })?;
    }
    Ok(())
}

/// `backlog`: build a backlog against a holding receiver, then release it.
async fn backlog(common: &Common, load: &Load) -> anyhow::Result<()> {
    let mut plan = Plan::new(
        "backlog",
        load,
        full(1_000_000, 64),
        load.destinations.unwrap_or(1),
    );
    plan.behaviours = vec![Behaviour::Hold; plan.behaviours.len()];
    plan.release_after_posting = true;
    // The destination's limits raised as in `single`, so the drain measures
    // hookd, not its protection of the destination. So is the attempt
    // timeout, past the build (1,000,000 events take 70–160 s): with the
    // design's 30 s, the held requests time out during the build, the
    // circuit opens, and the drain after the release runs at R4's recovery
    // ramp (10 % of the cap, rising over 5 min) — the ramp's figure, not the
    // backlog's. The lease must outlast the timeout.
    plan.hookd_defaults = vec![
        ("--host-concurrency", "256"),
        ("--destination-rate-initial", "50000"),
        ("--destination-rate-max", "50000"),
        ("--attempt-timeout", "600s"),
        ("--lease", "1800s"),
    ];
    plan.drain_timeout = Duration::from_secs(1_800);
    let out = execute(common, plan).await?;
    let released = out.released_ns.unwrap_or(out.posted.first_ns);
    let last = out
        .seen
        .iter()
        .flat_map(|s| s.deliveries.iter().map(|d| d.arrival_ns))
        .max()
        .unwrap_or(released);
    let drained: u64 = out.seen.iter().map(|s| s.distinct).sum();
    let drain_s = last.saturating_sub(released) as f64 / 1e9;
    let report = out
        .report()
        .with(
            "backlog_build_s",
            round(released.saturating_sub(out.posted.first_ns) as f64 / 1e9),
        )
        .with(
            "hookd_rss_at_release_mib",
            out.rss_at_release_mib.map(round),
        )
        .with("drain_s", round(drain_s))
        .with("drain_per_s", round(rate(drained, released, last)));
    report.emit(&common.out)
}
