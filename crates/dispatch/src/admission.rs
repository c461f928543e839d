//! Per-destination admission: how many new attempts a destination may take
//! now. The dispatcher asks before it claims, so a saturated destination's
//! rows are neither claimed nor rewritten (design §6).
//!
//! Today this is the concurrency cap (layer 1). The circuit breaker, token
//! bucket and recovery ramp plug in here, behind the same two questions:
//! "how many may start?" and "this one finished, like so".

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Tracks attempts in flight per destination host.
#[derive(Debug)]
pub struct Admission {
    cap: u32,
    in_flight: Mutex<HashMap<Arc<str>, u32>>,
}

/// One admitted attempt. Dropping it frees the destination's slot, so a slot
/// is never leaked, whatever path the attempt ends on.
#[derive(Debug)]
pub struct HostPermit {
    admission: Arc<Admission>,
    host: Arc<str>,
}

impl Admission {
    /// Admission with a per-host cap of `cap` concurrent attempts.
    pub fn new(cap: u32) -> Arc<Self> {
        Arc::new(Self {
            cap,
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// How many more attempts `host` may start now.
    pub fn available(&self, host: &str) -> u32 {
        let map = self.in_flight.lock().unwrap();
        self.cap.saturating_sub(map.get(host).copied().unwrap_or(0))
    }

    /// Takes a slot for an attempt to `host`, or `None` if it is at its cap.
    pub fn admit(self: &Arc<Self>, host: &str) -> Option<HostPermit> {
        let mut map = self.in_flight.lock().unwrap();
        let key: Arc<str> = match map.get_key_value(host) {
            Some((k, _)) => k.clone(),
            None => Arc::from(host),
        };
        let n = map.entry(key.clone()).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(HostPermit {
            admission: self.clone(),
            host: key,
        })
    }

    /// Attempts in flight to `host` now.
    pub fn in_flight(&self, host: &str) -> u32 {
        self.in_flight
            .lock()
            .unwrap()
            .get(host)
            .copied()
            .unwrap_or(0)
    }
}

impl HostPermit {
    /// The destination host this permit is for.
    pub fn host(&self) -> &str {
        &self.host
    }
}

impl Drop for HostPermit {
    fn drop(&mut self) {
        let mut map = self.admission.in_flight.lock().unwrap();
        if let Some(n) = map.get_mut(&*self.host) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&*self.host);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_takes_at_most_its_cap_and_slots_return_on_drop() {
        let a = Admission::new(2);
        let p1 = a.admit("x").unwrap();
        let _p2 = a.admit("x").unwrap();
        assert!(a.admit("x").is_none());
        assert_eq!(a.available("x"), 0);
        assert_eq!(a.available("y"), 2, "hosts are independent");
        drop(p1);
        assert_eq!(a.available("x"), 1);
        assert!(a.admit("x").is_some());
    }
}
