//! Figures: latency histograms, per-second series, and the report (one
//! human table and one JSON line per run).

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::receiver::Delivery;

/// Event → delivery latencies, in microseconds.
#[derive(Debug, Clone)]
pub struct Latencies(Histogram<u64>);

impl Latencies {
    /// An empty histogram (1 µs to 1 h, 3 significant figures).
    pub fn new() -> Latencies {
        Latencies(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"))
    }

    /// Adds each delivery's `arrival - sent`.
    pub fn add(&mut self, deliveries: &[Delivery]) {
        for d in deliveries {
            let us = d.arrival_ns.saturating_sub(d.sent_ns) / 1_000;
            self.0.saturating_record(us.max(1));
        }
    }

    /// The latency at `quantile` (0..=1), in milliseconds.
    pub fn ms_at(&self, quantile: f64) -> f64 {
        self.0.value_at_quantile(quantile) as f64 / 1_000.0
    }

    /// p50, p90, p99 and max.
    pub fn summary(&self) -> LatencyMs {
        LatencyMs {
            p50: round(self.ms_at(0.50)),
            p90: round(self.ms_at(0.90)),
            p99: round(self.ms_at(0.99)),
            max: round(self.0.max() as f64 / 1_000.0),
        }
    }

    /// The percentile curve: (percentile, ms) from 0 to 99.99.
    pub fn curve(&self) -> Vec<(f64, f64)> {
        (0..=40)
            .map(|i| {
                // Evenly spaced in "nines": 0, …, 90, …, 99, …, 99.99.
                let nines = i as f64 / 10.0;
                let q = 1.0 - 10f64.powf(-nines);
                (q * 100.0, self.ms_at(q))
            })
            .collect()
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencyMs {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// One run's figures. Serialised as the JSON line; `extra` holds the
/// scenario's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// `sqlite`, `postgres`, `target` or `none`.
    pub backend: String,
    /// Events accepted.
    pub events: u64,
    /// Destinations.
    pub destinations: usize,
    /// Accepted events per second, first POST → last acceptance.
    pub accepted_per_s: f64,
    /// Distinct deliveries received.
    pub deliveries: u64,
    /// Deliveries per second, first POST → last arrival.
    pub deliveries_per_s: f64,
    /// Event → delivery latency.
    pub latency_ms: LatencyMs,
    /// Expected deliveries that had not arrived by the end of the drain window.
    pub lost: u64,
    /// Deliveries received more than once (same `webhook-id`).
    pub duplicates: u64,
    /// hookd's user + system CPU seconds (none for `--target`).
    pub hookd_cpu_s: Option<f64>,
    /// hookd's peak RSS (none for `--target`).
    pub hookd_peak_rss_mib: Option<f64>,
    /// The harness's own CPU seconds over the run.
    pub harness_cpu_s: f64,
    /// Scenario-specific figures.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    /// Adds a scenario-specific figure.
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Report {
        self.extra.insert(key.into(), value.into());
        self
    }

    /// The JSON line.
    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("a report serialises")
    }

    /// The human table.
    pub fn table(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let l = &self.latency_ms;
        let mut rows = vec![
            ("scenario", format!("{} ({})", self.scenario, self.backend)),
            ("events accepted", self.events.to_string()),
            ("destinations", self.destinations.to_string()),
            ("accepted/s", format!("{:.0}", self.accepted_per_s)),
            ("deliveries", self.deliveries.to_string()),
            ("deliveries/s", format!("{:.0}", self.deliveries_per_s)),
            (
                "latency ms p50/p90/p99/max",
                format!("{} / {} / {} / {}", l.p50, l.p90, l.p99, l.max),
            ),
            ("lost", self.lost.to_string()),
            ("duplicates", self.duplicates.to_string()),
            ("hookd CPU s", opt(self.hookd_cpu_s)),
            ("hookd peak RSS MiB", opt(self.hookd_peak_rss_mib)),
            ("harness CPU s", format!("{:.1}", self.harness_cpu_s)),
        ];
        let extra: Vec<(&str, String)> = self
            .extra
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_string()))
            .collect();
        rows.extend(extra);
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("  {k:<width$}  {v}\n"));
        }
        out
    }

    /// Prints the table and the JSON line, and appends the line to
    /// `out/results.jsonl`.
    pub fn emit(&self, out: &Path) -> anyhow::Result<()> {
        println!("{}", self.table());
        println!("{}", self.json());
        append_line(out, &self.json())
    }
}

/// Appends one line to `out/results.jsonl`.
pub fn append_line(out: &Path, line: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join("results.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{line}")?;
    Ok(())
}

/// Counts `times_ns` per whole second after `t0_ns`, over `seconds` seconds
/// (later times go in the last bucket; earlier ones are ignored).
pub fn per_second(times_ns: &[u64], t0_ns: u64, seconds: usize) -> Vec<u64> {
    let mut buckets = vec![0u64; seconds.max(1)];
    let last = buckets.len() - 1;
    for &t in times_ns {
        if t < t0_ns {
            continue;
        }
        let s = ((t - t0_ns) / 1_000_000_000) as usize;
        buckets[s.min(last)] += 1;
    }
    buckets
}

/// The deliveries that arrived after `from_ns` and their rate from
/// `from_ns` to the last of them: with `from_ns` the last acceptance, how
/// fast hookd drains once ingest no longer shares the machine. `None`
/// when fewer than a tenth of `arrivals` came after `from_ns` (a
/// fixed-rate load's short tail), where a rate would mean nothing.
pub fn rate_after(arrivals: impl IntoIterator<Item = u64>, from_ns: u64) -> Option<(u64, f64)> {
    let (mut all, mut after, mut last) = (0u64, 0u64, from_ns);
    for t in arrivals {
        all += 1;
        if t > from_ns {
            after += 1;
            last = last.max(t);
        }
    }
    if after == 0 || after * 10 < all {
        return None;
    }
    Some((after, crate::poster::rate(after, from_ns, last)))
}

/// A per-second series as CSV: `second,<name>,<name>…`.
pub fn series_csv(names: &[&str], columns: &[Vec<u64>]) -> String {
    let mut out = format!("second,{}\n", names.join(","));
    let rows = columns.iter().map(Vec::len).max().unwrap_or(0);
    for s in 0..rows {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| c.get(s).copied().unwrap_or(0).to_string())
            .collect();
        out.push_str(&format!("{s},{}\n", cells.join(",")));
    }
    out
}

/// Event → delivery latency by the whole second after `t0_ns` its event
/// was sent, as CSV: `second,deliveries,p50_ms,p99_ms,max_ms` (a tail shows
/// up as the seconds it came from, to be set beside the server's logs).
pub fn latency_by_second_csv(deliveries: &[&Delivery], t0_ns: u64) -> String {
    let mut seconds: Vec<Latencies> = Vec::new();
    for d in deliveries {
        let s = (d.sent_ns.saturating_sub(t0_ns) / 1_000_000_000) as usize;
        if seconds.len() <= s {
            seconds.resize_with(s + 1, Latencies::new);
        }
        seconds[s].add(std::slice::from_ref(*d));
    }
    let mut out = String::from("second,deliveries,p50_ms,p99_ms,max_ms\n");
    for (s, l) in seconds.iter().enumerate() {
        let m = l.summary();
        out.push_str(&format!(
            "{s},{},{},{},{}\n",
            l.0.len(),
            m.p50,
            m.p99,
            m.max
        ));
    }
    out
}

/// Rounds to 0.01 for display.
pub fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn times_are_bucketed_per_second_after_t0() {
        let t0 = 5 * S;
        let times = [t0 - 1, t0, t0 + S - 1, t0 + S, t0 + 3 * S + 7, t0 + 99 * S];
        // The one before t0 is dropped; the one past the end joins the last second.
        assert_eq!(per_second(&times, t0, 4), vec![2, 1, 0, 2]);
        assert_eq!(per_second(&[], t0, 0), vec![0]);
    }

    #[test]
    fn the_rate_after_ingest_counts_only_later_arrivals() {
        let t0 = 7 * S;
        // Two arrivals during ingest, four in the second after it.
        let arrivals = [t0 - S, t0, t0 + S / 4, t0 + S / 2, t0 + 3 * S / 4, t0 + S];
        let (n, per_s) = rate_after(arrivals, t0).unwrap();
        assert_eq!(n, 4);
        assert!((per_s - 4.0).abs() < 1e-9, "{per_s}");
        // A tail under a tenth of the deliveries gives no figure.
        let mut steady: Vec<u64> = (0..100).map(|i| t0 - S + i).collect();
        steady.push(t0 + 5);
        assert_eq!(rate_after(steady, t0), None);
        assert_eq!(rate_after([], t0), None);
    }

    #[test]
    fn a_series_becomes_csv_with_a_header() {
        let csv = series_csv(&["deliveries", "attempts"], &[vec![1, 2], vec![3, 4, 5]]);
        assert_eq!(csv, "second,deliveries,attempts\n0,1,3\n1,2,4\n2,0,5\n");
    }

    #[test]
    fn latency_by_second_puts_each_delivery_in_its_events_second() {
        let t0 = 10 * S;
        let d = |sent: u64, ms: u64| Delivery {
            sent_ns: t0 + sent,
            arrival_ns: t0 + sent + ms * 1_000_000,
        };
        let all = [d(0, 2), d(S / 2, 4), d(2 * S + 1, 8)];
        let csv = latency_by_second_csv(&all.iter().collect::<Vec<_>>(), t0);
        let rows: Vec<&str> = csv.lines().collect();
        assert_eq!(rows[0], "second,deliveries,p50_ms,p99_ms,max_ms");
        assert_eq!(rows[1], "0,2,2,4,4");
        assert_eq!(rows[2], "1,0,0,0,0");
        assert_eq!(rows[3], "2,1,8,8,8");
        assert_eq!(rows.len(), 4);
    }

    #[test]
    fn latencies_come_from_sent_and_arrival() {
        let mut l = Latencies::new();
        let ds: Vec<Delivery> = (1..=100)
            .map(|ms| Delivery {
                sent_ns: 1_000,
                arrival_ns: 1_000 + ms * 1_000_000,
            })
            .collect();
        l.add(&ds);
        let s = l.summary();
        assert!((s.p50 - 50.0).abs() < 0.1, "{s:?}");
        assert!((s.p99 - 99.0).abs() < 0.1, "{s:?}");
        assert!((s.max - 100.0).abs() < 0.1, "{s:?}");
    }

    #[test]
    fn the_report_is_one_json_line_with_the_agreed_fields() {
        let r = Report {
            scenario: "fanout".into(),
            backend: "sqlite".into(),
            events: 10,
            destinations: 2,
            accepted_per_s: 5.0,
            deliveries: 20,
            deliveries_per_s: 4.0,
            latency_ms: LatencyMs {
                p50: 1.0,
                p90: 2.0,
                p99: 3.0,
                max: 4.0,
            },
            lost: 0,
            duplicates: 1,
            hookd_cpu_s: None,
            hookd_peak_rss_mib: Some(12.5),
            harness_cpu_s: 0.5,
            extra: Default::default(),
        }
        .with("healthy_p99_ms", 3.0);
        let line = r.json();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["scenario"], "fanout");
        assert_eq!(v["latency_ms"]["p99"], 3.0);
        assert_eq!(v["hookd_cpu_s"], serde_json::Value::Null);
        assert_eq!(v["hookd_peak_rss_mib"], 12.5);
        assert_eq!(v["healthy_p99_ms"], 3.0);
        assert!(r.table().contains("healthy_p99_ms"));
    }
}
