//! The supervisor's Prometheus metrics, in the text exposition format:
//! stage histograms from each item's stamps, and counters of what happened.

use crate::core::stages::{Stage, Stamps};
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Upper bounds (seconds) of the stage histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// What happened to an item, for `mango_supervisor_items_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The runner ran and exited; its sandbox is gone.
    Finished,
    /// Removed because its Work was stopped or reclaimed, or on shutdown.
    Cancelled,
    /// A healthcheck's sandbox outlived its attempt and was removed.
    TimedOut,
    /// Ack, create or hand-off failed; the lease is left to expire.
    LaunchFailed,
    /// Left by an earlier run and adopted.
    Adopted,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Finished,
        Outcome::Cancelled,
        Outcome::TimedOut,
        Outcome::LaunchFailed,
        Outcome::Adopted,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Finished => "finished",
            Outcome::Cancelled => "cancelled",
            Outcome::TimedOut => "timed_out",
            Outcome::LaunchFailed => "launch_failed",
            Outcome::Adopted => "adopted",
        }
    }
}

#[derive(Default)]
pub struct Metrics {
    stages: Mutex<[Histogram; Stage::ALL.len()]>,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    pub polls: AtomicU64,
    pub empty_polls: AtomicU64,
    pub poll_errors: AtomicU64,
    pub removal_errors: AtomicU64,
    pub live: AtomicI64,
}

impl Metrics {
    /// Records one item's stage durations.
    pub fn observe(&self, stamps: &Stamps) {
        let mut stages = self.stages.lock().expect("metrics lock");
        for (stage, seconds) in stamps.steps() {
            stages[stage as usize].observe(seconds);
        }
    }

    pub fn outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP mango_supervisor_stage_seconds Time from an item's previous stage to this one (acked, created, started, delivered, exited, gone).\n# TYPE mango_supervisor_stage_seconds histogram"
        );
        let stages = self.stages.lock().expect("metrics lock");
        for stage in Stage::ALL.into_iter().skip(1) {
            let h = &stages[stage as usize];
            let name = stage.as_str();
            for (bound, count) in BUCKETS.iter().zip(h.counts) {
                let _ = writeln!(
                    out,
                    "mango_supervisor_stage_seconds_bucket{{stage=\"{name}\",le=\"{bound}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "mango_supervisor_stage_seconds_bucket{{stage=\"{name}\",le=\"+Inf\"}} {}\nmango_supervisor_stage_seconds_sum{{stage=\"{name}\"}} {}\nmango_supervisor_stage_seconds_count{{stage=\"{name}\"}} {}",
                h.count, h.sum, h.count
            );
        }
        drop(stages);
        let _ = writeln!(
            out,
            "# HELP mango_supervisor_items_total Items by how they ended.\n# TYPE mango_supervisor_items_total counter"
        );
        for outcome in Outcome::ALL {
            let _ = writeln!(
                out,
                "mango_supervisor_items_total{{outcome=\"{}\"}} {}",
                outcome.as_str(),
                self.outcomes[outcome as usize].load(Relaxed)
            );
        }
        for (name, help, value) in [
            (
                "mango_supervisor_polls_total",
                "Polls answered.",
                self.polls.load(Relaxed),
            ),
            (
                "mango_supervisor_empty_polls_total",
                "Polls that found no item.",
                self.empty_polls.load(Relaxed),
            ),
            (
                "mango_supervisor_poll_errors_total",
                "Polls that failed (then backed off).",
                self.poll_errors.load(Relaxed),
            ),
            (
                "mango_supervisor_removal_errors_total",
                "Sandbox removals the engine did not confirm.",
                self.removal_errors.load(Relaxed),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP mango_supervisor_live_sandboxes Sandboxes the supervisor runs now.\n# TYPE mango_supervisor_live_sandboxes gauge\nmango_supervisor_live_sandboxes {}",
            self.live.load(Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn stage_histograms_and_counters_render() {
        let m = Metrics::default();
        let t0 = Instant::now();
        let mut s = Stamps::default();
        s.mark_at(Stage::Polled, t0);
        s.mark_at(Stage::Acked, t0 + Duration::from_millis(20));
        m.observe(&s);
        m.outcome(Outcome::Finished);
        let text = m.render();
        assert!(
            text.contains("mango_supervisor_stage_seconds_bucket{stage=\"acked\",le=\"0.025\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("mango_supervisor_stage_seconds_bucket{stage=\"acked\",le=\"0.01\"} 0")
        );
        assert!(text.contains("mango_supervisor_stage_seconds_count{stage=\"acked\"} 1"));
        assert!(text.contains("mango_supervisor_stage_seconds_count{stage=\"gone\"} 0"));
        assert!(text.contains("mango_supervisor_items_total{outcome=\"finished\"} 1"));
    }
}
