//! `mango-bench soak` (`make soak`; opt-in, never in CI): the fault suite's
//! system held under steady load for `--soak-minutes`, a fault of the
//! suite's scenarios every `--soak-fault-minutes` in turn, the invariants
//! after every round. Every 10 s it samples the resident sets of both api
//! processes, both supervisors and PostgreSQL, and the hot tables' sizes;
//! between faults it times lease cycles in the probe Environment. Each
//! minute is a window; at the end it judges (`soak_judge.rs`) and prints a
//! table of the windows and its last line: `soak_minutes=… soak_rss_growth=…
//! soak_bloat_growth=… soak_p99_growth=… soak_faults=… soak_lost=0 …`.

use super::invariants::Promises;
use super::scenarios::{self, Name, Outcome};
use super::soak_judge::{self, Judgment, Sample, Window};
use super::soak_sample;
use super::system::{Launcher, System};
use super::{Options, Summary};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One window of the table and of the judgments.
pub const WINDOW_SECS: f64 = 60.0;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

pub struct Soak {
    pub minutes: u64,
    pub fault_minutes: u64,
}

/// What the soak saw, as it went.
#[derive(Default)]
struct Series {
    samples: Vec<Sample>,
    /// Each lease cycle: seconds into the soak, milliseconds.
    cycles: Vec<(f64, f64)>,
    faults: Vec<(f64, String)>,
    cycle_failures: Vec<String>,
}

pub struct Report {
    pub summary: Summary,
    pub line: String,
}

pub async fn run(opts: Options, soak: Soak) -> anyhow::Result<Report> {
    let (system, scratch) = super::start_system(&opts).await?;
    let followers = super::follow_containers(&system);
    let series: Arc<Mutex<Series>> = Arc::default();
    // Held by a fault round: the timed lease cycles wait, so that they never
    // take an item a scenario's own probe meant to claim.
    let gate = Arc::new(tokio::sync::Mutex::new(()));
    let started = Instant::now();
    println!(
        "soak: {} minutes, a fault every {} minutes ({}), a sample every {} s",
        soak.minutes,
        soak.fault_minutes,
        opts.scenarios
            .iter()
            .map(|n| n.label())
            .collect::<Vec<_>>()
            .join(", "),
        SAMPLE_EVERY.as_secs()
    );
    print_header();
    let sampler = tokio::spawn(sample_loop(system.clone(), series.clone(), started));
    let prober = tokio::spawn(probe_loop(
        system.clone(),
        series.clone(),
        gate.clone(),
        started,
    ));
    let outcome = rounds(&system, &opts.scenarios, &soak, started, &series, &gate).await;
    sampler.abort();
    prober.abort();
    let mut summary = outcome.unwrap_or_else(|err| Summary {
        failures: vec![format!("the soak could not go on: {err:#}")],
        ..Summary::default()
    });
    let series = std::mem::take(&mut *series.lock().unwrap());
    let windows = soak_judge::windows(&series.samples, &series.cycles, &series.faults, WINDOW_SECS);
    println!("soak: the windows");
    print_header();
    for w in &windows {
        println!("{}", row(w));
    }
    let judgments = soak_judge::judge(&windows);
    for j in &judgments {
        println!("{}", judgment_line(j));
    }
    summary
        .failures
        .extend(judgments.iter().filter_map(Judgment::failure));
    summary.failures.extend(
        series
            .cycle_failures
            .iter()
            .map(|f| format!("lease cycle: {f}")),
    );
    super::finish(&system, &scratch, followers, &mut summary).await;
    let [rss, bloat, p99] = &judgments;
    let line = format!(
        "soak_minutes={} soak_windows={} soak_rounds={} soak_faults={} soak_cycles={} soak_rss_growth={:.2} soak_bloat_growth={:.2} soak_p99_growth={:.2} soak_lost={} soak_doubled={} soak_leaked={} soak_secret_lines={} max_reclaim_s={:.1}",
        soak.minutes,
        windows.len(),
        summary.scenarios,
        series.faults.len(),
        series.cycles.len(),
        rss.growth(),
        bloat.growth(),
        p99.growth(),
        summary.lost,
        summary.doubled,
        summary.leaked,
        summary.secret_lines,
        summary.max_reclaim_s,
    );
    Ok(Report { summary, line })
}

/// Steady rounds, and a fault round (the next scenario in turn) whenever
/// one is due, until the soak's time is up (the round then running ends).
async fn rounds(
    system: &Arc<System>,
    names: &[Name],
    soak: &Soak,
    started: Instant,
    series: &Mutex<Series>,
    gate: &tokio::sync::Mutex<()>,
) -> anyhow::Result<Summary> {
    system.start_worker(Launcher::Docker).await?;
    system.start_worker(Launcher::Local).await?;
    let total = Duration::from_secs(soak.minutes * 60);
    let every = Duration::from_secs(soak.fault_minutes * 60);
    // The first window is warm-up: no fault in it.
    let mut next_fault = every;
    let mut rotation = names.iter().copied().cycle();
    let mut summary = Summary::default();
    while started.elapsed() < total {
        let at = started.elapsed();
        let fault = if at >= next_fault {
            next_fault = at + every;
            rotation.next()
        } else {
            None
        };
        let label = fault.map_or_else(|| "steady".to_string(), Name::label);
        let round_started = Instant::now();
        let outcome = match fault {
            Some(name) => {
                series
                    .lock()
                    .unwrap()
                    .faults
                    .push((at.as_secs_f64(), label.clone()));
                let _paused = gate.lock().await;
                scenarios::run(system, name).await
            }
            None => steady(system).await,
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => {
                summary
                    .failures
                    .push(format!("{label}: the round could not go on: {err:#}"));
                break;
            }
        };
        let v = &outcome.verdict;
        let worst = outcome.reclaims.iter().map(|r| r.1).fold(0.0, f64::max);
        println!(
            "soak: {} {label} round in {:.1} s: lost={} doubled={} leaked={} reclaims={}",
            clock(at),
            round_started.elapsed().as_secs_f64(),
            v.lost,
            v.doubled,
            v.leaked,
            outcome.reclaims.len(),
        );
        for failure in &v.failures {
            println!("soak: {label}: {failure}");
        }
        add(&mut summary, &label, &outcome, worst);
    }
    Ok(summary)
}

fn add(summary: &mut Summary, label: &str, outcome: &Outcome, worst_reclaim: f64) {
    let v = &outcome.verdict;
    summary.scenarios += 1;
    summary.lost += v.lost;
    summary.doubled += v.doubled;
    summary.leaked += v.leaked;
    summary.max_reclaim_s = summary.max_reclaim_s.max(worst_reclaim);
    summary
        .failures
        .extend(v.failures.iter().map(|f| format!("{label}: {f}")));
}

/// A round of the steady load: Sessions calling tools, healthchecks and
/// the probe's leases, no fault; nothing may be interrupted.
async fn steady(system: &Arc<System>) -> anyhow::Result<Outcome> {
    let promises = Promises {
        clean_results: true,
        ..Promises::default()
    };
    scenarios::frame(
        system,
        scenarios::spec(4, 2, "sleep 1; echo call {n}"),
        promises,
        Box::pin(async { Ok(()) }),
    )
    .await
}

/// A sample every 10 s; each window's row printed as the next begins.
async fn sample_loop(system: Arc<System>, series: Arc<Mutex<Series>>, started: Instant) {
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    loop {
        ticks.tick().await;
        let at = started.elapsed().as_secs_f64();
        let sample = soak_sample::sample(&system, at).await;
        let mut s = series.lock().unwrap();
        let window = |at: f64| (at / WINDOW_SECS) as usize;
        let closed = s
            .samples
            .last()
            .map(|last| window(last.at))
            .filter(|&w| w < window(at));
        s.samples.push(sample);
        if let Some(closed) = closed {
            let windows = soak_judge::windows(&s.samples, &s.cycles, &s.faults, WINDOW_SECS);
            if let Some(w) = windows.get(closed) {
                println!("{}", row(w));
            }
        }
    }
}

/// Lease cycles one after another, about two a second, outside fault rounds.
async fn probe_loop(
    system: Arc<System>,
    series: Arc<Mutex<Series>>,
    gate: Arc<tokio::sync::Mutex<()>>,
    started: Instant,
) {
    loop {
        {
            let _open = gate.lock().await;
            let at = started.elapsed().as_secs_f64();
            match soak_sample::lease_cycle(&system).await {
                Ok(ms) => series.lock().unwrap().cycles.push((at, ms)),
                Err(err) => series.lock().unwrap().cycle_failures.push(format!(
                    "at {}: {err:#}",
                    clock(Duration::from_secs_f64(at))
                )),
            }
        }
        // Pacing of the steady lease load (and a fault round's turn at the gate).
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn clock(at: Duration) -> String {
    format!("{:02}:{:02}", at.as_secs() / 60, at.as_secs() % 60)
}

const PROCESSES: [&str; 5] = [
    "api-a",
    "api-b",
    "worker-docker",
    "worker-local",
    "postgres",
];

fn print_header() {
    println!(
        "soak: {:>6} {:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:>8} {:>8} {:>7} {:>6} {:>7} {:>7}  faults",
        "window", "api-a", "api-b", "w-dock", "w-local", "postgres", "tables", "indexes", "live", "dead", "cycles", "p50", "p99"
    );
    println!(
        "soak: {:>6} {:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:>8} {:>8} {:>7} {:>6} {:>7} {:>7}",
        "min", "MiB", "MiB", "MiB", "MiB", "MiB", "MiB", "MiB", "rows", "rows", "", "ms", "ms"
    );
}

fn row(w: &Window) -> String {
    let mib = |kib: Option<f64>| kib.map_or("-".into(), |k| format!("{:.1}", k / 1024.0));
    let rss: Vec<String> = PROCESSES
        .iter()
        .map(|p| mib(w.rss_kib.get(*p).copied()))
        .collect();
    let sum = |f: fn(&soak_judge::TableSize) -> i64| w.tables.values().map(f).sum::<i64>();
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    format!(
        "soak: {:>6} {:>7} {:>7} {:>7} {:>7} {:>8} {:>9.2} {:>8.2} {:>8} {:>7} {:>6} {:>7} {:>7}  {}",
        w.index + 1,
        rss[0],
        rss[1],
        rss[2],
        rss[3],
        rss[4],
        sum(|t| t.total_bytes) as f64 / (1 << 20) as f64,
        sum(|t| t.index_bytes) as f64 / (1 << 20) as f64,
        sum(|t| t.live_rows),
        sum(|t| t.dead_rows),
        w.cycles,
        ms(w.p50_ms),
        ms(w.p99_ms),
        w.faults.join(","),
    )
}

fn judgment_line(j: &Judgment) -> String {
    let verdict = if j.failure().is_none() {
        "holds"
    } else {
        "FAILS"
    };
    match &j.worst {
        Some((g, name)) => format!(
            "soak: {} {verdict}: worst {name} {g:.2}x late over early (at most {}x)",
            j.what, j.factor
        ),
        None => format!("soak: {} FAILS: not measured in two steady windows", j.what),
    }
}
