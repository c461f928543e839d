//! Receivers: one axum server per destination, each on its own loopback
//! host, with a behaviour, recording what arrives.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use serde::Deserialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Nanoseconds since this process's first call: the one clock the poster
/// (`sent_ns`) and the receivers (arrival) share.
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// How a receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 at once.
    Ok,
    /// 200 after this long.
    Latency(Duration),
    /// 500 at once.
    Fail,
    /// Accepts the request and never answers (until the run ends).
    Hang,
    /// 500 for this long after the load starts, then 200.
    FailThenOk(Duration),
    /// Holds every request until [`Fleet::release`], then answers 200.
    Hold,
}

impl std::str::FromStr for Behaviour {
    type Err = String;

    /// `ok`, `fail`, `hang`, `hold`, `latency:50ms`, `fail-then-ok:60s`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = s.split_once(':').unwrap_or((s, ""));
        let dur = || humantime::parse_duration(arg).map_err(|e| format!("{s}: {e}"));
        match name {
            "ok" => Ok(Behaviour::Ok),
            "fail" => Ok(Behaviour::Fail),
            "hang" => Ok(Behaviour::Hang),
            "hold" => Ok(Behaviour::Hold),
            "latency" => Ok(Behaviour::Latency(dur()?)),
            "fail-then-ok" => Ok(Behaviour::FailThenOk(dur()?)),
            _ => Err(format!(
                "`{s}`: use ok, fail, hang, hold, latency:DURATION or fail-then-ok:DURATION"
            )),
        }
    }
}

/// One 2xx answer.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    /// When the answer was given ([`now_ns`]).
    pub arrival_ns: u64,
    /// When the poster sent the event ([`now_ns`]).
    pub sent_ns: u64,
}

/// What one receiver saw.
#[derive(Debug, Default)]
struct Records {
    /// Arrival of every request, whatever the answer.
    attempts: Vec<u64>,
    /// Every 2xx answer.
    deliveries: Vec<Delivery>,
    /// Hashes of the `webhook-id`s answered 2xx.
    seen: HashSet<u64>,
    duplicates: u64,
    malformed: u64,
}

#[derive(Debug)]
struct Shared {
    behaviour: Behaviour,
    /// When the load started ([`now_ns`]); `FailThenOk` counts from here.
    load_start_ns: Arc<AtomicU64>,
    released: CancellationToken,
    stopped: CancellationToken,
    distinct: AtomicU64,
    records: Mutex<Records>,
}

/// A snapshot of one receiver's records.
#[derive(Debug)]
pub struct Seen {
    /// The behaviour it had.
    pub behaviour: Behaviour,
    /// Arrival of every request.
    pub attempts: Vec<u64>,
    /// Every 2xx answer.
    pub deliveries: Vec<Delivery>,
    /// Distinct `webhook-id`s answered 2xx.
    pub distinct: u64,
    /// 2xx answers for a `webhook-id` already answered 2xx.
    pub duplicates: u64,
    /// Requests whose body was not a bench envelope.
    pub malformed: u64,
}

/// The receivers of one run.
#[derive(Debug)]
pub struct Fleet {
    receivers: Vec<(SocketAddr, Arc<Shared>)>,
    load_start_ns: Arc<AtomicU64>,
    released: CancellationToken,
    stopped: CancellationToken,
    servers: JoinSet<()>,
}

/// The loopback address of receiver `i`: 127.0.0.2, 127.0.0.3, … (then
/// 127.0.1.0 and on), never 127.0.0.1, which hookd listens on.
pub fn loopback_host(i: usize) -> Ipv4Addr {
    let n = (i + 2) as u32;
    Ipv4Addr::new(127, (n >> 16) as u8, (n >> 8) as u8, n as u8)
}

impl Fleet {
    /// Starts one receiver per behaviour, receiver `i` on
    /// [`loopback_host`]`(i)`, port 0.
    pub async fn start(behaviours: &[Behaviour]) -> anyhow::Result<Fleet> {
        let load_start_ns = Arc::new(AtomicU64::new(now_ns()));
        let released = CancellationToken::new();
        let stopped = CancellationToken::new();
        let mut servers = JoinSet::new();
        let mut receivers = Vec::with_capacity(behaviours.len());
        for (i, &behaviour) in behaviours.iter().enumerate() {
            let host = loopback_host(i);
            let listener = tokio::net::TcpListener::bind((host, 0))
                .await
                .with_context(|| format!("binding a receiver on {host}"))?;
            let addr = listener.local_addr()?;
            let shared = Arc::new(Shared {
                behaviour,
                load_start_ns: load_start_ns.clone(),
                released: released.clone(),
                stopped: stopped.clone(),
                distinct: AtomicU64::new(0),
                records: Mutex::new(Records::default()),
            });
            let app = axum::Router::new()
                .fallback(handle)
                .with_state(shared.clone());
            servers.spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    eprintln!("receiver {addr} stopped: {e}");
                }
            });
            receivers.push((addr, shared));
        }
        Ok(Fleet {
            receivers,
            load_start_ns,
            released,
            stopped,
            servers,
        })
    }

    /// The webhook URL of receiver `i`.
    pub fn url(&self, i: usize) -> String {
        format!("http://{}/hook", self.receivers[i].0)
    }

    /// How many receivers there are.
    pub fn len(&self) -> usize {
        self.receivers.len()
    }

    /// Marks the start of the load (the clock of `FailThenOk`).
    pub fn start_load(&self, at_ns: u64) {
        self.load_start_ns.store(at_ns, Ordering::Relaxed);
    }

    /// Answers every held request, and every later one, with 200.
    pub fn release(&self) {
        self.released.cancel();
    }

    /// Distinct `webhook-id`s answered 2xx by receiver `i` so far.
    pub fn distinct(&self, i: usize) -> u64 {
        self.receivers[i].1.distinct.load(Ordering::Relaxed)
    }

    /// Waits until each receiver `i` with `want[i]` set has `expected`
    /// distinct deliveries, or until `deadline`. Returns whether all did.
    pub async fn wait_for(&self, want: &[bool], expected: u64, deadline: Instant) -> bool {
        loop {
            let done = (0..self.len()).all(|i| !want[i] || self.distinct(i) >= expected);
            if done {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every receiver (hanging and held requests are dropped) and
    /// returns what each saw.
    pub async fn stop(mut self) -> Vec<Seen> {
        self.stopped.cancel();
        self.servers.abort_all();
        while self.servers.join_next().await.is_some() {}
        self.receivers
            .into_iter()
            .map(|(_, shared)| {
                let r = std::mem::take(&mut *shared.records.lock().unwrap());
                Seen {
                    behaviour: shared.behaviour,
                    attempts: r.attempts,
                    deliveries: r.deliveries,
                    distinct: shared.distinct.load(Ordering::Relaxed),
                    duplicates: r.duplicates,
                    malformed: r.malformed,
                }
            })
            .collect()
    }
}

/// The part of hookd's envelope the bench reads: `data` is the poster's payload.
#[derive(Debug, Deserialize)]
struct Envelope {
    data: Payload,
}

/// What the poster puts in each event.
#[derive(Debug, Deserialize)]
struct Payload {
    sent_ns: u64,
}

async fn handle(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let arrived = now_ns();
    s.records.lock().unwrap().attempts.push(arrived);
    let succeed = match s.behaviour {
        Behaviour::Ok => true,
        Behaviour::Latency(d) => {
            tokio::time::sleep(d).await;
            true
        }
        Behaviour::Fail => false,
        Behaviour::FailThenOk(d) => {
            let start = s.load_start_ns.load(Ordering::Relaxed);
            arrived.saturating_sub(start) >= d.as_nanos() as u64
        }
        Behaviour::Hang => {
            s.stopped.cancelled().await;
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        Behaviour::Hold => {
            tokio::select! {
                _ = s.released.cancelled() => true,
                _ = s.stopped.cancelled() => return StatusCode::SERVICE_UNAVAILABLE,
            }
        }
    };
    if !succeed {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    record(&s, &headers, &body);
    StatusCode::OK
}

fn record(s: &Shared, headers: &HeaderMap, body: &[u8]) {
    let arrival_ns = now_ns();
    let payload = serde_json::from_slice::<Envelope>(body).ok();
    let id = headers.get("webhook-id").map(|v| {
        let mut h = DefaultHasher::new();
        v.as_bytes().hash(&mut h);
        h.finish()
    });
    let mut r = s.records.lock().unwrap();
    let (Some(payload), Some(id)) = (payload, id) else {
        r.malformed += 1;
        return;
    };
    if r.seen.insert(id) {
        s.distinct.fetch_add(1, Ordering::Relaxed);
    } else {
        r.duplicates += 1;
    }
    r.deliveries.push(Delivery {
        arrival_ns,
        sent_ns: payload.data.sent_ns,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaviours_parse() {
        assert_eq!("ok".parse(), Ok(Behaviour::Ok));
        assert_eq!(
            "latency:50ms".parse(),
            Ok(Behaviour::Latency(Duration::from_millis(50)))
        );
        assert_eq!(
            "fail-then-ok:1m".parse(),
            Ok(Behaviour::FailThenOk(Duration::from_secs(60)))
        );
        assert!("latency".parse::<Behaviour>().is_err());
        assert!("teapot".parse::<Behaviour>().is_err());
    }

    #[test]
    fn receivers_get_distinct_loopback_hosts_past_255() {
        assert_eq!(loopback_host(0), Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(loopback_host(253), Ipv4Addr::new(127, 0, 0, 255));
        assert_eq!(loopback_host(254), Ipv4Addr::new(127, 0, 1, 0));
        assert!(
            (0..1000)
                .map(loopback_host)
                .all(|h| h.is_loopback() && h != Ipv4Addr::LOCALHOST)
        );
    }
}
