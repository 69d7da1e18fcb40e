//! The supervisor's Prometheus metrics, in the text exposition format:
//! stage histograms from each item's stamps, and counters of what happened.

use crate::core::stages::{Stage, Stamps};
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::SystemTime;

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
    /// Its runner's idle end left the sandbox waiting for its Session's
    /// next activation (spec §7.1): kept, not removed.
    Kept,
}

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Finished,
        Outcome::Cancelled,
        Outcome::TimedOut,
        Outcome::LaunchFailed,
        Outcome::Adopted,
        Outcome::Kept,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Finished => "finished",
            Outcome::Cancelled => "cancelled",
            Outcome::TimedOut => "timed_out",
            Outcome::LaunchFailed => "launch_failed",
            Outcome::Adopted => "adopted",
            Outcome::Kept => "kept",
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
    /// Warm sandboxes ready now.
    pub warm_ready: AtomicI64,
    /// Items served by a warm sandbox.
    pub warm_bound: AtomicU64,
    /// Items that found no warm sandbox ready (or one that failed to bind)
    /// and started cold, with a warm pool configured.
    pub warm_missed: AtomicU64,
    /// Sandboxes kept for their Session's next activation now.
    pub kept: AtomicI64,
    /// Items served by their Session's kept sandbox.
    pub kept_reused: AtomicU64,
    last_poll_ok: Mutex<Option<SystemTime>>,
    last_error: Mutex<Option<(SystemTime, String)>>,
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

    /// The text exposition of this supervisor's metrics.
    pub fn render(&self) -> String {
        render_pools(&[(None, self)])
    }

    pub fn note_poll_ok(&self) {
        *self.last_poll_ok.lock().expect("metrics lock") = Some(SystemTime::now());
    }

    pub fn note_error(&self, error: String) {
        *self.last_error.lock().expect("metrics lock") = Some((SystemTime::now(), error));
    }

    /// Where the supervisor stands, for a status report.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            live: self.live.load(Relaxed).max(0) as u64,
            last_poll_ok: *self.last_poll_ok.lock().expect("metrics lock"),
            last_error: self.last_error.lock().expect("metrics lock").clone(),
            poll_errors: self.poll_errors.load(Relaxed),
            removal_errors: self.removal_errors.load(Relaxed),
        }
    }
}

/// A supervisor's state at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub live: u64,
    /// When a Poll last succeeded (an answer, with an item or none).
    pub last_poll_ok: Option<SystemTime>,
    /// The latest failure (a poll, a launch, a removal), and when.
    pub last_error: Option<(SystemTime, String)>,
    pub poll_errors: u64,
    pub removal_errors: u64,
}

/// The metrics of several supervisors in one exposition, each series
/// labelled with its `pool` (no label for `None`): one HELP and TYPE per
/// family, as the format requires.
pub fn render_pools(pools: &[(Option<&str>, &Metrics)]) -> String {
    let label = |pool: Option<&str>, more: &str| -> String {
        let mut parts: Vec<String> = Vec::new();
        if let Some(pool) = pool {
            parts.push(format!("pool=\"{}\"", escape(pool)));
        }
        if !more.is_empty() {
            parts.push(more.to_string());
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", parts.join(","))
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP mango_supervisor_stage_seconds Time from an item's previous stage to this one (acked, bound, created, started, delivered, exited, gone).\n# TYPE mango_supervisor_stage_seconds histogram"
    );
    for (pool, metrics) in pools {
        let stages = metrics.stages.lock().expect("metrics lock");
        for stage in Stage::ALL.into_iter().skip(1) {
            let h = &stages[stage as usize];
            let name = stage.as_str();
            for (bound, count) in BUCKETS.iter().zip(h.counts) {
                let _ = writeln!(
                    out,
                    "mango_supervisor_stage_seconds_bucket{} {count}",
                    label(*pool, &format!("stage=\"{name}\",le=\"{bound}\""))
                );
            }
            let stage_label = label(*pool, &format!("stage=\"{name}\""));
            let _ = writeln!(
                out,
                "mango_supervisor_stage_seconds_bucket{} {}\nmango_supervisor_stage_seconds_sum{stage_label} {}\nmango_supervisor_stage_seconds_count{stage_label} {}",
                label(*pool, &format!("stage=\"{name}\",le=\"+Inf\"")),
                h.count,
                h.sum,
                h.count
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP mango_supervisor_items_total Items by how they ended.\n# TYPE mango_supervisor_items_total counter"
    );
    for (pool, metrics) in pools {
        for outcome in Outcome::ALL {
            let _ = writeln!(
                out,
                "mango_supervisor_items_total{} {}",
                label(*pool, &format!("outcome=\"{}\"", outcome.as_str())),
                metrics.outcomes[outcome as usize].load(Relaxed)
            );
        }
    }
    type Counter = (&'static str, &'static str, fn(&Metrics) -> u64);
    let counters: [Counter; 7] = [
        ("mango_supervisor_polls_total", "Polls answered.", |m| {
            m.polls.load(Relaxed)
        }),
        (
            "mango_supervisor_empty_polls_total",
            "Polls that found no item.",
            |m| m.empty_polls.load(Relaxed),
        ),
        (
            "mango_supervisor_poll_errors_total",
            "Polls that failed (then backed off).",
            |m| m.poll_errors.load(Relaxed),
        ),
        (
            "mango_supervisor_removal_errors_total",
            "Sandbox removals the engine did not confirm.",
            |m| m.removal_errors.load(Relaxed),
        ),
        (
            "mango_supervisor_warm_bound_total",
            "Items served by a warm sandbox.",
            |m| m.warm_bound.load(Relaxed),
        ),
        (
            "mango_supervisor_warm_missed_total",
            "Items that started cold because no warm sandbox was ready.",
            |m| m.warm_missed.load(Relaxed),
        ),
        (
            "mango_supervisor_kept_reused_total",
            "Items served by their Session's kept sandbox.",
            |m| m.kept_reused.load(Relaxed),
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (pool, metrics) in pools {
            let _ = writeln!(out, "{name}{} {}", label(*pool, ""), value(metrics));
        }
    }
    let _ = writeln!(
        out,
        "# HELP mango_supervisor_live_sandboxes Sandboxes the supervisor runs now.\n# TYPE mango_supervisor_live_sandboxes gauge"
    );
    for (pool, metrics) in pools {
        let _ = writeln!(
            out,
            "mango_supervisor_live_sandboxes{} {}",
            label(*pool, ""),
            metrics.live.load(Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP mango_supervisor_warm_ready Warm sandboxes ready to be bound.\n# TYPE mango_supervisor_warm_ready gauge"
    );
    for (pool, metrics) in pools {
        let _ = writeln!(
            out,
            "mango_supervisor_warm_ready{} {}",
            label(*pool, ""),
            metrics.warm_ready.load(Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP mango_supervisor_kept Sandboxes kept for their Session's next activation.\n# TYPE mango_supervisor_kept gauge"
    );
    for (pool, metrics) in pools {
        let _ = writeln!(
            out,
            "mango_supervisor_kept{} {}",
            label(*pool, ""),
            metrics.kept.load(Relaxed)
        );
    }
    out
}

/// A label value in the exposition format.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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

    #[test]
    fn several_pools_share_one_help_per_family_and_label_their_series() {
        let (a, b) = (Metrics::default(), Metrics::default());
        a.outcome(Outcome::Finished);
        b.live.store(3, Relaxed);
        let text = render_pools(&[(Some("a"), &a), (Some("b\"q"), &b)]);
        assert_eq!(
            text.matches("# HELP mango_supervisor_items_total").count(),
            1
        );
        assert!(text.contains("mango_supervisor_items_total{pool=\"a\",outcome=\"finished\"} 1"));
        assert!(
            text.contains("mango_supervisor_live_sandboxes{pool=\"b\\\"q\"} 3"),
            "{text}"
        );
        assert!(text.contains("mango_supervisor_stage_seconds_count{pool=\"a\",stage=\"acked\"} 0"));
    }
}
