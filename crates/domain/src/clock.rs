//! The clock seam. Domain decisions take `now` as an argument; components that
//! need to read time hold an `Arc<dyn Clock>` so tests can move time by hand.

use std::sync::Mutex;

use crate::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        chrono::Utc::now()
    }
}

/// A clock that only moves when told to. For tests.
#[derive(Debug)]
pub struct FakeClock(Mutex<Timestamp>);

impl FakeClock {
    /// A fake clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(Mutex::new(start))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: std::time::Duration) {
        let mut now = self.0.lock().unwrap();
        *now += chrono::Duration::from_std(by).expect("duration in range");
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: Timestamp) {
        *self.0.lock().unwrap() = to;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap()
    }
}
