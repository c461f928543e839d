//! The poster: creates subscriptions and posts events, at full speed with
//! bounded concurrency or at a fixed rate. Each event carries
//! `{"sent_ns", "seq"}` and an idempotency key, and is retried with the same
//! key until it is accepted (or its tries run out).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::receiver::now_ns;

/// Tries per event before it counts as failed.
const TRIES: u32 = 10;

/// Where events go.
#[derive(Debug, Clone)]
pub enum Sink {
    /// hookd's `POST /events`.
    Hookd {
        /// `{base}/events`.
        events_url: String,
        /// Bearer token.
        token: String,
    },
    /// Straight to a receiver, in hookd's envelope (the `bare` scenario).
    Bare {
        /// The receiver's URL.
        url: String,
    },
}

/// How fast to post.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// `events` events, `concurrency` in flight, as fast as they are accepted.
    FullSpeed {
        /// How many.
        events: u64,
        /// Most in flight.
        concurrency: usize,
    },
    /// `per_s` events a second for `duration` (at most `concurrency` in flight).
    Rate {
        /// Events per second.
        per_s: f64,
        /// How long.
        duration: Duration,
        /// Most in flight.
        concurrency: usize,
    },
}

/// What posting achieved.
#[derive(Debug, Clone, Copy, Default)]
pub struct Posted {
    /// Events accepted (2xx).
    pub accepted: u64,
    /// Events that ran out of tries.
    pub failed: u64,
    /// Extra tries (non-2xx answers and transport errors).
    pub retries: u64,
    /// The first POST ([`now_ns`]).
    pub first_ns: u64,
    /// The last acceptance ([`now_ns`]).
    pub last_ns: u64,
}

impl Posted {
    /// Accepted events per second, first POST → last acceptance.
    pub fn accepted_per_s(&self) -> f64 {
        rate(self.accepted, self.first_ns, self.last_ns)
    }

    fn merge(&mut self, o: Posted) {
        self.accepted += o.accepted;
        self.failed += o.failed;
        self.retries += o.retries;
        self.last_ns = self.last_ns.max(o.last_ns);
    }
}

/// `n` per second over `from_ns..to_ns`.
pub fn rate(n: u64, from_ns: u64, to_ns: u64) -> f64 {
    let secs = to_ns.saturating_sub(from_ns) as f64 / 1e9;
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// An HTTP client for the API and for posting, with a connection pool.
#[derive(Debug, Clone)]
pub struct Poster {
    client: reqwest::Client,
    run_id: u64,
    /// `,"pad":"xx…"` for `--payload-bytes`, or empty.
    pad: String,
    /// Events accepted so far, for progress lines.
    pub accepted: Arc<AtomicU64>,
}

impl Poster {
    /// A poster; `run_id` makes idempotency keys unique to this run, and
    /// each payload carries `payload_bytes` bytes of padding.
    pub fn new(payload_bytes: usize) -> anyhow::Result<Poster> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .timeout(Duration::from_secs(30))
            .build()?;
        let run_id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64;
        let pad = match payload_bytes {
            0 => String::new(),
            n => format!(r#","pad":"{}""#, "x".repeat(n)),
        };
        Ok(Poster {
            client,
            run_id,
            pad,
            accepted: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Creates a subscription of `url` to every event, with `extra` fields
    /// merged into the body; returns its `sub_id`.
    pub async fn subscribe(
        &self,
        base_url: &str,
        token: &str,
        url: &str,
        extra: &serde_json::Value,
    ) -> anyhow::Result<String> {
        let mut body = serde_json::json!({"url": url, "event_types": ["*"]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let res = self
            .client
            .post(format!("{base_url}/subscriptions"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .context("POST /subscriptions")?;
        let status = res.status();
        let text = res.text().await?;
        if status != reqwest::StatusCode::CREATED {
            bail!("POST /subscriptions answered {status}: {text}");
        }
        let v: serde_json::Value = serde_json::from_str(&text)?;
        v["sub_id"]
            .as_str()
            .map(str::to_owned)
            .context("no sub_id in the answer")
    }

    /// Posts events to `sink` at `pace`; stops by `deadline` whatever happens.
    pub async fn run(&self, sink: &Sink, pace: Pace, deadline: Instant) -> Posted {
        let first_ns = now_ns();
        let mut total = match pace {
            Pace::FullSpeed {
                events,
                concurrency,
            } => self.full_speed(sink, events, concurrency, deadline).await,
            Pace::Rate {
                per_s,
                duration,
                concurrency,
            } => {
                self.fixed_rate(sink, per_s, duration, concurrency, deadline)
                    .await
            }
        };
        total.first_ns = first_ns;
        total
    }

    async fn full_speed(
        &self,
        sink: &Sink,
        events: u64,
        concurrency: usize,
        deadline: Instant,
    ) -> Posted {
        let next = Arc::new(AtomicU64::new(0));
        let mut workers = JoinSet::new();
        for _ in 0..concurrency.max(1) {
            let (me, sink, next) = (self.clone(), sink.clone(), next.clone());
            workers.spawn(async move {
                let mut p = Posted::default();
                loop {
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    if seq >= events || Instant::now() >= deadline {
                        return p;
                    }
                    p.merge(me.post_one(&sink, seq, deadline).await);
                }
            });
        }
        let mut total = Posted::default();
        while let Some(p) = workers.join_next().await {
            total.merge(p.unwrap_or_default());
        }
        total
    }

    async fn fixed_rate(
        &self,
        sink: &Sink,
        per_s: f64,
        duration: Duration,
        concurrency: usize,
        deadline: Instant,
    ) -> Posted {
        let permits = Arc::new(Semaphore::new(concurrency.max(1)));
        let mut tasks = JoinSet::new();
        let mut total = Posted::default();
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        let mut seq = 0u64;
        while start.elapsed() < duration && Instant::now() < deadline {
            tick.tick().await;
            let due = (start.elapsed().min(duration).as_secs_f64() * per_s) as u64;
            while seq < due {
                // Waits when `concurrency` posts are in flight: the rate then
                // falls behind, and the report shows it.
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    break;
                };
                let (me, sink) = (self.clone(), sink.clone());
                tasks.spawn(async move {
                    let p = me.post_one(&sink, seq, deadline).await;
                    drop(permit);
                    p
                });
                seq += 1;
            }
            while let Some(p) = tasks.try_join_next() {
                total.merge(p.unwrap_or_default());
            }
        }
        while let Some(p) = tasks.join_next().await {
            total.merge(p.unwrap_or_default());
        }
        total
    }

    /// Posts event `seq`, retrying with the same idempotency key.
    async fn post_one(&self, sink: &Sink, seq: u64, deadline: Instant) -> Posted {
        let sent_ns = now_ns();
        let pad = &self.pad;
        let payload = format!(r#"{{"sent_ns":{sent_ns},"seq":{seq}{pad}}}"#);
        let key = format!("bench-{}-{seq}", self.run_id);
        let request = || match sink {
            Sink::Hookd { events_url, token } => self
                .client
                .post(events_url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(format!(
                    r#"{{"type":"bench.event","payload":{payload},"idempotency_key":"{key}"}}"#
                )),
            Sink::Bare { url } => self
                .client
                .post(url)
                .header("content-type", "application/json")
                .header("webhook-id", &key)
                .body(format!(
                    r#"{{"id":"{key}","type":"bench.event","data":{payload}}}"#
                )),
        };
        let mut p = Posted::default();
        for attempt in 0..TRIES {
            if attempt > 0 {
                p.retries += 1;
                let backoff = Duration::from_millis(50 << attempt.min(5));
                if Instant::now() + backoff >= deadline {
                    break;
                }
                tokio::time::sleep(backoff).await;
            }
            if let Ok(res) = request().send().await {
                let ok = res.status().is_success();
                // Read the body so the connection goes back to the pool.
                let _ = res.bytes().await;
                if ok {
                    self.accepted.fetch_add(1, Ordering::Relaxed);
                    p.accepted = 1;
                    p.last_ns = now_ns();
                    return p;
                }
            }
        }
        p.failed = 1;
        p
    }
}
