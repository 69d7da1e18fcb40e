//! The soak's judgments, pure functions of what it sampled: the samples cut
//! into windows, and a figure per window compared late against early.
//!
//! Growth is the median of the late third of the steady windows over the
//! median of their early third: the first window is warm-up (caches, pools
//! and shared buffers filling) and is left out, and a median of a third
//! keeps one window a fault landed in from deciding the verdict either way.

use crate::measure::percentile;
use std::collections::BTreeMap;

/// How far each figure may grow before the soak fails.
pub const RSS_FACTOR: f64 = 1.5;
pub const BLOAT_FACTOR: f64 = 2.0;
pub const P99_FACTOR: f64 = 2.0;

/// The sizes of one table at a sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableSize {
    /// Heap, TOAST and indexes (`pg_total_relation_size`).
    pub total_bytes: i64,
    /// Its indexes (`pg_relation_size` of each, summed).
    pub index_bytes: i64,
    /// Exact: `count(*)` (the statistics' estimate resets when PostgreSQL
    /// crash-restarts, which a fault does).
    pub live_rows: i64,
    /// `n_dead_tup` from `pg_stat_user_tables`.
    pub dead_rows: i64,
}

/// One sample: seconds into the soak, each process's resident set (KiB)
/// and each hot table's sizes.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub at: f64,
    pub rss_kib: BTreeMap<String, u64>,
    pub tables: BTreeMap<String, TableSize>,
}

/// One window's figures.
#[derive(Clone, Debug, Default)]
pub struct Window {
    pub index: usize,
    /// Per process, the median of the window's samples.
    pub rss_kib: BTreeMap<String, f64>,
    /// Per table, its last sample in the window.
    pub tables: BTreeMap<String, TableSize>,
    pub cycles: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The faults that began in it.
    pub faults: Vec<String>,
}

/// Cuts the soak into windows of `secs`: `samples`, lease-cycle latencies
/// (`(at, ms)`) and faults (`(at, name)`) each go to the window they fell in.
pub fn windows(
    samples: &[Sample],
    cycles: &[(f64, f64)],
    faults: &[(f64, String)],
    secs: f64,
) -> Vec<Window> {
    let slot = |at: f64| (at.max(0.0) / secs) as usize;
    let last = samples
        .iter()
        .map(|s| slot(s.at))
        .chain(cycles.iter().map(|c| slot(c.0)))
        .chain(faults.iter().map(|f| slot(f.0)))
        .max();
    let Some(last) = last else { return Vec::new() };
    (0..=last)
        .map(|index| {
            let here: Vec<&Sample> = samples.iter().filter(|s| slot(s.at) == index).collect();
            let mut rss: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for s in &here {
                for (name, kib) in &s.rss_kib {
                    rss.entry(name.clone()).or_default().push(*kib as f64);
                }
            }
            let latencies: Vec<f64> = cycles
                .iter()
                .filter(|c| slot(c.0) == index)
                .map(|c| c.1)
                .collect();
            let tail = |p| (!latencies.is_empty()).then(|| percentile(&mut latencies.clone(), p));
            Window {
                index,
                rss_kib: rss
                    .into_iter()
                    .map(|(name, mut v)| (name, percentile(&mut v, 50.0)))
                    .collect(),
                tables: here.last().map(|s| s.tables.clone()).unwrap_or_default(),
                cycles: latencies.len(),
                p50_ms: tail(50.0),
                p99_ms: tail(99.0),
                faults: faults
                    .iter()
                    .filter(|f| slot(f.0) == index)
                    .map(|f| f.1.clone())
                    .collect(),
            }
        })
        .collect()
}

/// Late over early (module doc) of one figure per window, `None` where a
/// window has none; `None` when fewer than two steady windows have one.
pub fn growth(per_window: &[Option<f64>]) -> Option<f64> {
    let steady: Vec<f64> = per_window.iter().skip(1).flatten().copied().collect();
    if steady.len() < 2 {
        return None;
    }
    let third = (steady.len() / 3).max(1);
    let early = percentile(&mut steady[..third].to_vec(), 50.0);
    let late = percentile(&mut steady[steady.len() - third..].to_vec(), 50.0);
    (early > 0.0).then(|| late / early)
}

/// A table's growth in size beyond its growth in rows: a table twice the
/// rows at twice the bytes has not bloated; one the same rows at twice the
/// bytes has (fewer rows never excuse more bytes).
pub fn bloat_growth(bytes: &[Option<f64>], rows: &[Option<f64>]) -> Option<f64> {
    let size = growth(bytes)?;
    let rows = growth(rows).unwrap_or(1.0).max(1.0);
    Some(size / rows)
}

/// One judgment: its figure (the worst of what it covers) and whether it
/// held.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgment {
    pub what: &'static str,
    /// The worst growth and what showed it; `None`: it could not be judged.
    pub worst: Option<(f64, String)>,
    pub factor: f64,
}

impl Judgment {
    /// The worst of `figures` (name, growth) against `factor`.
    pub fn of(what: &'static str, figures: Vec<(String, Option<f64>)>, factor: f64) -> Judgment {
        let worst = figures
            .into_iter()
            .filter_map(|(name, g)| Some((g?, name)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        Judgment {
            what,
            worst,
            factor,
        }
    }

    pub fn growth(&self) -> f64 {
        self.worst.as_ref().map_or(f64::NAN, |w| w.0)
    }

    /// Why it failed (`None`: it held).
    pub fn failure(&self) -> Option<String> {
        match &self.worst {
            None => Some(format!(
                "{}: could not be judged (fewer than two steady windows measured it)",
                self.what
            )),
            Some((g, name)) if *g > self.factor => Some(format!(
                "{}: {name} grew {g:.2}x from the early to the late windows (at most {}x)",
                self.what, self.factor
            )),
            Some(_) => None,
        }
    }
}

/// The three judgments over the windows: resident sets flat, hot tables'
/// bloat bounded, lease-cycle p99 not growing.
pub fn judge(windows: &[Window]) -> [Judgment; 3] {
    let mut processes: Vec<&String> = windows.iter().flat_map(|w| w.rss_kib.keys()).collect();
    processes.sort();
    processes.dedup();
    let rss = processes
        .into_iter()
        .map(|p| {
            let series: Vec<Option<f64>> =
                windows.iter().map(|w| w.rss_kib.get(p).copied()).collect();
            (p.clone(), growth(&series))
        })
        .collect();
    let mut tables: Vec<&String> = windows.iter().flat_map(|w| w.tables.keys()).collect();
    tables.sort();
    tables.dedup();
    let bloat = tables
        .into_iter()
        .map(|t| {
            let of = |f: fn(&TableSize) -> i64| -> Vec<Option<f64>> {
                windows
                    .iter()
                    .map(|w| w.tables.get(t).map(|s| f(s) as f64))
                    .collect()
            };
            (
                t.clone(),
                bloat_growth(&of(|s| s.total_bytes), &of(|s| s.live_rows)),
            )
        })
        .collect();
    let p99: Vec<Option<f64>> = windows.iter().map(|w| w.p99_ms).collect();
    [
        Judgment::of("rss", rss, RSS_FACTOR),
        Judgment::of("bloat", bloat, BLOAT_FACTOR),
        Judgment::of(
            "lease-cycle p99",
            vec![("the lease cycle".into(), growth(&p99))],
            P99_FACTOR,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(v: &[f64]) -> Vec<Option<f64>> {
        v.iter().copied().map(Some).collect()
    }

    #[test]
    fn a_flat_series_does_not_grow_and_its_warm_up_is_left_out() {
        // The warm-up window (a tenth of the rest) decides nothing.
        let g = growth(&some(&[10.0, 100.0, 101.0, 99.0, 100.0, 102.0, 100.0])).unwrap();
        assert!((0.95..1.05).contains(&g), "{g}");
    }

    #[test]
    fn a_steadily_growing_series_fails_its_factor() {
        let leaking: Vec<f64> = (0..30).map(|i| 100.0 + 10.0 * i as f64).collect();
        let g = growth(&some(&leaking)).unwrap();
        assert!(g > RSS_FACTOR, "{g}");
        let j = Judgment::of("rss", vec![("api-a".into(), Some(g))], RSS_FACTOR);
        assert!(j.failure().is_some_and(|f| f.contains("api-a")), "{j:?}");
    }

    #[test]
    fn one_late_spike_does_not_decide_but_a_late_third_does() {
        let mut p99 = vec![50.0; 12];
        p99[11] = 900.0;
        assert!(growth(&some(&p99)).unwrap() < P99_FACTOR);
        for v in &mut p99[8..] {
            *v = 200.0;
        }
        assert!(growth(&some(&p99)).unwrap() > P99_FACTOR);
    }

    #[test]
    fn windows_without_a_figure_are_skipped_and_too_few_cannot_be_judged() {
        assert_eq!(
            growth(&[Some(1.0), None, Some(4.0), None, Some(8.0)]),
            Some(2.0)
        );
        assert_eq!(growth(&[Some(1.0), Some(4.0), None]), None);
        let j = Judgment::of("bloat", vec![("work".into(), None)], BLOAT_FACTOR);
        assert!(j
            .failure()
            .is_some_and(|f| f.contains("could not be judged")));
    }

    #[test]
    fn bytes_growing_with_rows_are_not_bloat_and_bytes_alone_are() {
        let rows = some(&[1.0, 100.0, 200.0, 300.0]);
        let bytes = some(&[1.0, 1000.0, 2000.0, 3000.0]);
        assert_eq!(bloat_growth(&bytes, &rows), Some(1.0));
        let same_rows = some(&[1.0, 100.0, 100.0, 100.0]);
        assert_eq!(bloat_growth(&bytes, &same_rows), Some(3.0));
        // Rows deleted never excuse the bytes left behind.
        let fewer = some(&[1.0, 100.0, 50.0, 10.0]);
        assert_eq!(bloat_growth(&bytes, &fewer), Some(3.0));
    }

    fn sample(at: f64, rss: u64, bytes: i64, rows: i64) -> Sample {
        Sample {
            at,
            rss_kib: BTreeMap::from([("api-a".to_string(), rss)]),
            tables: BTreeMap::from([(
                "work".to_string(),
                TableSize {
                    total_bytes: bytes,
                    live_rows: rows,
                    ..TableSize::default()
                },
            )]),
        }
    }

    #[test]
    fn samples_cycles_and_faults_fall_into_their_windows_and_are_judged() {
        let mut samples = Vec::new();
        let mut cycles = Vec::new();
        for i in 0..24 {
            let at = i as f64 * 10.0;
            // RSS flat, the table's rows and bytes growing together.
            samples.push(sample(at, 50_000, 8192 * (i + 1), 10 * (i + 1)));
            cycles.push((at, 20.0 + i as f64 % 3.0));
        }
        let faults = vec![(75.0, "api-kill".to_string())];
        let w = windows(&samples, &cycles, &faults, 60.0);
        assert_eq!(w.len(), 4);
        assert_eq!(w[1].faults, ["api-kill"]);
        assert_eq!((w[0].cycles, w[0].p99_ms), (6, Some(22.0)));
        assert_eq!(w[3].tables["work"].live_rows, 240);
        for j in judge(&w) {
            assert_eq!(j.failure(), None, "{j:?}");
        }

        // The same soak with api-a leaking and the lease cycle slowing.
        for (i, s) in samples.iter_mut().enumerate() {
            s.rss_kib.insert("api-a".into(), 50_000 + 20_000 * i as u64);
        }
        for (i, c) in cycles.iter_mut().enumerate() {
            c.1 = 20.0 * (1.0 + (i * i) as f64 / 16.0);
        }
        let [rss, bloat, p99] = judge(&windows(&samples, &cycles, &faults, 60.0));
        assert!(
            rss.failure().is_some_and(|f| f.contains("api-a")),
            "{rss:?}"
        );
        assert_eq!(bloat.failure(), None);
        assert!(p99.failure().is_some(), "{p99:?}");
    }

    #[test]
    fn a_table_growing_without_rows_fails_bloat() {
        let samples: Vec<Sample> = (0..24)
            .map(|i| sample(i as f64 * 10.0, 1, 8192 * (1 + i * i), 10))
            .collect();
        let [_, bloat, _] = judge(&windows(&samples, &[], &[], 60.0));
        assert!(
            bloat.failure().is_some_and(|f| f.contains("work")),
            "{bloat:?}"
        );
    }
}
