//! The stages of one item, each timed: polled, acked, a warm or kept
//! sandbox bound (or a cold one created and started), secret delivered,
//! sandbox gone. Durations between them go to
//! the stage histograms; the whole record to one debug line per item.

use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Polled,
    Acked,
    /// A warm or kept sandbox was taken and bound to the item (no create,
    /// no start).
    Bound,
    Created,
    Started,
    Delivered,
    Exited,
    Gone,
}

impl Stage {
    pub const ALL: [Stage; 8] = [
        Stage::Polled,
        Stage::Acked,
        Stage::Bound,
        Stage::Created,
        Stage::Started,
        Stage::Delivered,
        Stage::Exited,
        Stage::Gone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Polled => "polled",
            Stage::Acked => "acked",
            Stage::Bound => "bound",
            Stage::Created => "created",
            Stage::Started => "started",
            Stage::Delivered => "delivered",
            Stage::Exited => "exited",
            Stage::Gone => "gone",
        }
    }
}

/// When each stage of one item happened (a stage it never reached: `None`).
#[derive(Debug, Clone, Default)]
pub struct Stamps {
    at: [Option<Instant>; Stage::ALL.len()],
}

impl Stamps {
    pub fn mark(&mut self, stage: Stage) {
        self.mark_at(stage, Instant::now());
    }

    pub fn mark_at(&mut self, stage: Stage, at: Instant) {
        self.at[stage as usize] = Some(at);
    }

    pub fn get(&self, stage: Stage) -> Option<Instant> {
        self.at[stage as usize]
    }

    /// Each reached stage and the seconds since the one before it reached.
    pub fn steps(&self) -> Vec<(Stage, f64)> {
        let mut out = Vec::new();
        let mut previous: Option<Instant> = None;
        for stage in Stage::ALL {
            if let Some(at) = self.get(stage) {
                if let Some(before) = previous {
                    out.push((stage, at.saturating_duration_since(before).as_secs_f64()));
                }
                previous = Some(at);
            }
        }
        out
    }

    /// Milliseconds of each reached stage after `polled`, for the log line.
    pub fn offsets_ms(&self) -> Vec<(Stage, u64)> {
        let Some(t0) = self.get(Stage::Polled) else {
            return Vec::new();
        };
        Stage::ALL
            .into_iter()
            .filter_map(|s| {
                self.get(s)
                    .map(|at| (s, at.saturating_duration_since(t0).as_millis() as u64))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn steps_skip_stages_never_reached() {
        let t0 = Instant::now();
        let mut s = Stamps::default();
        s.mark_at(Stage::Polled, t0);
        s.mark_at(Stage::Acked, t0 + Duration::from_millis(10));
        s.mark_at(Stage::Gone, t0 + Duration::from_millis(50));
        let steps = s.steps();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].0, Stage::Acked);
        assert!((steps[0].1 - 0.010).abs() < 1e-6);
        assert_eq!(steps[1].0, Stage::Gone, "from acked, the last reached");
        assert_eq!(
            s.offsets_ms(),
            vec![(Stage::Polled, 0), (Stage::Acked, 10), (Stage::Gone, 50)]
        );
    }
}
