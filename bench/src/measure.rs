//! The measuring helpers: latencies in milliseconds, percentiles, and CPU
//! time by where it went.

use crate::harness::CLIENT_THREAD;
use std::time::{Duration, Instant};

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of `samples` (sorted in place), in their unit.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// `p50 / p99` of a list of millisecond samples, formatted.
pub fn summary(samples: &mut [f64]) -> String {
    format!(
        "p50 {:.2} ms, p99 {:.2} ms (n={})",
        percentile(samples, 50.0),
        percentile(samples, 99.0),
        samples.len()
    )
}

/// CPU time, from /proc: the bench's client threads, the rest of this process
/// (the in-process api and sqlx), the PostgreSQL backends serving the bench
/// database, and the whole machine. `None` where /proc is not available.
#[derive(Clone, Copy)]
pub struct CpuSample {
    at: Instant,
    client_ticks: u64,
    api_ticks: u64,
    backend_ticks: u64,
    machine_busy: u64,
}

const TICKS_PER_S: f64 = 100.0;

/// (comm, utime + stime) of one process or thread, from its `stat` file.
fn stat_ticks(path: &std::path::Path) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    let (head, after) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ")".
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((comm, ticks))
}

fn numbered(dir: &str) -> impl Iterator<Item = std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .map(|e| e.path())
}

/// Summed CPU of the `postgres: <user> <db_name> …` backends visible here.
fn backend_ticks(db_name: &str) -> u64 {
    let needle = format!(" {db_name} ");
    numbered("/proc")
        .filter_map(|path| {
            let cmdline = std::fs::read(path.join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            if !(cmdline.starts_with("postgres: ") && cmdline.contains(&needle)) {
                return None;
            }
            stat_ticks(&path.join("stat")).map(|(_, t)| t)
        })
        .sum()
}

impl CpuSample {
    pub fn take(db_name: &str) -> Option<CpuSample> {
        let (_, process) = stat_ticks(std::path::Path::new("/proc/self/stat"))?;
        let client_ticks = numbered("/proc/self/task")
            .filter_map(|t| stat_ticks(&t.join("stat")))
            .filter(|(comm, _)| comm.starts_with(CLIENT_THREAD))
            .map(|(_, t)| t)
            .sum::<u64>();
        let all = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = all
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        let total: u64 = cpu.iter().take(8).sum();
        let idle = cpu.get(3)? + cpu.get(4).copied().unwrap_or(0);
        Some(CpuSample {
            at: Instant::now(),
            client_ticks,
            api_ticks: process.saturating_sub(client_ticks),
            backend_ticks: backend_ticks(db_name),
            machine_busy: total - idle,
        })
    }

    /// Where the CPU went between `self` and `later` (in cores), per cycle
    /// (in ms), and what that would sustain on this machine were it idle.
    pub fn describe(self, later: CpuSample, cycles: u64) -> Vec<String> {
        self.describe_as(later, cycles, "cycle")
    }

    /// [`CpuSample::describe`] for `count` units named `unit` (e.g. "event").
    pub fn describe_as(self, later: CpuSample, cycles: u64, unit: &str) -> Vec<String> {
        let secs = later.at.duration_since(self.at).as_secs_f64();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let used = |a: u64, b: u64| b.saturating_sub(a) as f64 / TICKS_PER_S;
        let client = used(self.client_ticks, later.client_ticks);
        let api = used(self.api_ticks, later.api_ticks);
        let pg = used(self.backend_ticks, later.backend_ticks);
        let busy = used(self.machine_busy, later.machine_busy);
        let other = (busy - client - api - pg).max(0.0);
        let per = |s: f64| s * 1000.0 / cycles.max(1) as f64;
        let mut lines = vec![format!(
            "cpu, cores: machine {:.2} of {cores} busy = client {:.2} + api {:.2} + its PostgreSQL backends {:.2} + other load {:.2}",
            busy / secs,
            client / secs,
            api / secs,
            pg / secs,
            other / secs
        )];
        let ours = per(client + api + pg);
        if ours > 0.0 {
            let server = per(api + pg);
            lines.push(format!(
                "cpu per {unit}: client {:.2} ms + api {:.2} ms + PostgreSQL {:.2} ms = {ours:.2} ms → ≈{:.0} {unit}s/s if these {cores} cores were ours alone (server side only: ≈{:.0})",
                per(client),
                per(api),
                per(pg),
                cores * 1000.0 / ours,
                cores * 1000.0 / server
            ));
        }
        lines
    }
}
