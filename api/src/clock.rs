//! Where the Work lease paths read the time. Production uses the system
//! clock; a test that must put a lease exactly at its edge (the lease model
//! in `tests/lease_model.rs`) gives the context a [`ManualClock`] and moves
//! it itself. The lease SQL takes `now` as a parameter, so the database
//! never consults its own clock for a lease decision.

use chrono::Duration;
use mango_protocol::time::{self, Timestamp};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Default)]
pub enum Clock {
    #[default]
    System,
    Manual(ManualClock),
}

impl Clock {
    pub fn now(&self) -> Timestamp {
        match self {
            Clock::System => time::now(),
            Clock::Manual(manual) => manual.now(),
        }
    }
}

/// A clock that stands still until it is told to move; clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    /// Starts at `at`, cut to whole microseconds as [`time::now`] is (what
    /// PostgreSQL stores), so a value read back equals the one written.
    pub fn starting_at(at: Timestamp) -> Self {
        ManualClock(Arc::new(Mutex::new(time::truncate_micros(at))))
    }

    pub fn now(&self) -> Timestamp {
        *self.0.lock().expect("clock lock")
    }

    pub fn set(&self, at: Timestamp) {
        *self.0.lock().expect("clock lock") = time::truncate_micros(at);
    }

    /// Moves the clock by `by` (negative moves it back), in whole microseconds.
    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().expect("clock lock");
        *now = time::truncate_micros(*now + by);
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Self {
        Clock::Manual(manual)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let start = time::parse("2026-01-01T00:00:00.000001Z").unwrap();
        let manual = ManualClock::starting_at(start);
        let clock = Clock::from(manual.clone());
        assert_eq!(clock.now(), start);
        manual.advance(Duration::milliseconds(1500));
        assert_eq!(clock.now(), start + Duration::milliseconds(1500));
        manual.advance(Duration::nanoseconds(999));
        assert_eq!(
            clock.now(),
            start + Duration::milliseconds(1500),
            "kept to microseconds"
        );
        manual.set(start);
        assert_eq!(clock.now(), start);
    }

    #[test]
    fn the_default_clock_is_the_system_clock() {
        let before = time::now();
        let read = Clock::default().now();
        assert!(before <= read && read <= time::now());
    }
}
