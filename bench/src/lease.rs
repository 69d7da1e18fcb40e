//! `lease`: N simulated workers over HTTP doing poll → ack → heartbeat ×3 →
//! forced stop, then the ceiling: the very statements the server issues for
//! one such cycle, run directly (store functions + the pure lease rules) by N
//! tasks against the same database, with no HTTP in between.

use crate::chart::Chart;
use crate::harness::Bench;
use crate::http::Api;
use crate::measure::{ms, summary, CpuSample};
use anyhow::{bail, Context};
use mango_api::lease::{Lease, Stopper, TokenUse};
use mango_api::store::keys;
use mango_api::store::work::{self, WorkRow};
use mango_api::{ids, Settings};
use mango_protocol::time::{self, Timestamp};
use mango_protocol::NO_HEARTBEAT;
use sqlx::{PgConnection, PgPool};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Statements the server issues per cycle on the happy path (see `ceiling_cycle`).
pub const STATEMENTS_PER_CYCLE: usize = 11;
/// Upper bound of the rate we seed for, in cycles per second.
const SEED_RATE: f64 = 5000.0;

pub struct Options {
    pub workers: usize,
    pub seconds: f64,
    pub warmup: f64,
    pub profile: bool,
}

pub struct LeaseResult {
    pub cycles_per_s: f64,
    pub ceiling_cycles_per_s: f64,
    /// Each step's latency, over HTTP and SQL only.
    pub chart: Chart,
}

impl LeaseResult {
    pub fn ceiling_ratio(&self) -> f64 {
        self.cycles_per_s / self.ceiling_cycles_per_s
    }
}

/// Per-step latencies of the cycles completed inside the measured window.
#[derive(Default)]
struct Steps {
    names: [&'static str; 4],
    samples: [Vec<f64>; 4],
}

impl Steps {
    fn new(names: [&'static str; 4]) -> Steps {
        Steps {
            names,
            ..Steps::default()
        }
    }
    fn merge(&mut self, other: Steps) {
        for (mine, theirs) in self.samples.iter_mut().zip(other.samples) {
            mine.extend(theirs);
        }
    }
    fn print(&mut self, indent: &str) {
        for (name, samples) in self.names.iter().zip(self.samples.iter_mut()) {
            println!("{indent}{name:<22} {}", summary(samples));
        }
    }
    fn chart_into(&self, chart: &mut Chart, side: &str) {
        for (name, samples) in self.names.iter().zip(&self.samples) {
            chart.case(format!("{side} {name}"), samples);
        }
    }
}

/// Shared between the driver and its workers.
struct Run {
    stop: AtomicBool,
    measuring: AtomicBool,
    cycles: AtomicU64,
    exhausted: AtomicBool,
}

pub async fn run(bench: &Arc<Bench>, opts: &Options) -> anyhow::Result<LeaseResult> {
    let seed = ((opts.warmup + opts.seconds) * SEED_RATE).ceil() as i64;

    println!(
        "lease: {} workers over HTTP, {:.1} s warm-up + {:.1} s measured ({seed} healthchecks seeded) ...",
        opts.workers, opts.warmup, opts.seconds
    );
    bench.seed(seed).await?;
    bench.vacuum().await?;
    // Workers over HTTP run on the client threads with a client of their own.
    let api = bench.api.with_new_client()?;
    let mut http = measure(bench, &bench.client, opts, "http", move |i, run| {
        http_worker(api.clone(), i, run)
    })
    .await?;
    println!("lease: {:.1} cycles/s over HTTP", http.0);
    http.1.print("  ");
    let left = bench.clear_live().await?;
    println!("  ({left} seeded items left unclaimed, removed)");

    println!(
        "lease ceiling: {} tasks issuing the same {STATEMENTS_PER_CYCLE} statements per cycle directly ...",
        opts.workers
    );
    bench.seed(seed).await?;
    bench.vacuum().await?;
    // The ceiling runs where the api runs, as the server's handlers would.
    // Poll and Ack reuse their Environment key lookup (auth::environment_key_for_lease),
    // so in steady state the key is looked up once, not per request.
    let key_id = keys::find_by_secret(&bench.app.db, &ids::sha256(bench.api.env_key()))
        .await?
        .context("the Environment key vanished")?
        .id;
    let shared = Arc::new(Shared {
        pool: bench.app.db.clone(),
        env_id: bench.app.env_id.clone(),
        key_id,
        ttl: Settings::default().default_ttl_seconds,
        reclaim: Settings::default().default_reclaim,
    });
    let here = tokio::runtime::Handle::current();
    let mut ceiling = measure(bench, &here, opts, "sql", move |_, run| {
        sql_worker(shared.clone(), run)
    })
    .await?;
    println!("lease ceiling: {:.1} cycles/s over SQL only", ceiling.0);
    ceiling.1.print("  ");
    let left = bench.clear_live().await?;
    println!("  ({left} seeded items left unclaimed, removed)");
    if opts.profile {
        for line in bench.plan_cache_report().await? {
            println!("  {line}");
        }
    }

    let mut chart = Chart::new(
        "lease",
        format!(
            "lease: step latency, {} workers over HTTP vs the same SQL only",
            opts.workers
        ),
    );
    http.1.chart_into(&mut chart, "http");
    ceiling.1.chart_into(&mut chart, "sql");
    let result = LeaseResult {
        cycles_per_s: http.0,
        ceiling_cycles_per_s: ceiling.0,
        chart,
    };
    println!(
        "lease: {:.1} cycles/s, ceiling {:.1} cycles/s, ceiling_ratio {:.3}",
        result.cycles_per_s,
        result.ceiling_cycles_per_s,
        result.ceiling_ratio()
    );
    Ok(result)
}

/// Runs `workers` copies of `worker` for warm-up + the measured window and
/// returns cycles per second inside the window and the per-step latencies.
async fn measure<F, Fut>(
    bench: &Arc<Bench>,
    runtime: &tokio::runtime::Handle,
    opts: &Options,
    label: &str,
    worker: F,
) -> anyhow::Result<(f64, Steps)>
where
    F: Fn(usize, Arc<Run>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Steps>> + Send + 'static,
{
    let run = Arc::new(Run {
        stop: AtomicBool::new(false),
        measuring: AtomicBool::new(false),
        cycles: AtomicU64::new(0),
        exhausted: AtomicBool::new(false),
    });
    let tasks: Vec<_> = (0..opts.workers)
        .map(|i| runtime.spawn(worker(i, run.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(opts.warmup)).await;
    let x0 = bench.xacts().await?;
    let cpu0 = CpuSample::take(&bench.db_name);
    let c0 = run.cycles.load(Ordering::SeqCst);
    let t0 = Instant::now();
    run.measuring.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs_f64(opts.seconds)).await;
    let c1 = run.cycles.load(Ordering::SeqCst);
    let elapsed = t0.elapsed().as_secs_f64();
    run.measuring.store(false, Ordering::SeqCst);
    let cpu1 = CpuSample::take(&bench.db_name);
    let x1 = bench.xacts().await?;
    run.stop.store(true, Ordering::SeqCst);
    let mut steps = Steps::default();
    for task in tasks {
        let worker_steps = task.await.context("worker panicked")??;
        if steps.names[0].is_empty() {
            steps.names = worker_steps.names;
        }
        steps.merge(worker_steps);
    }
    if run.exhausted.load(Ordering::SeqCst) {
        println!("  warning ({label}): the seeded queue ran dry; the rate is understated");
    }
    let cycles = c1 - c0;
    if cycles == 0 {
        bail!("{label}: no cycle completed in the measured window");
    }
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        for line in a.describe(b, cycles) {
            println!("  {line}");
        }
    }
    println!(
        "  {cycles} cycles in {elapsed:.2} s; ≈{:.1} database transactions per cycle (pg_stat_database, approximate)",
        (x1 - x0) as f64 / cycles as f64
    );
    Ok((cycles as f64 / elapsed, steps))
}

// ------------------------------------------------------------------ over HTTP

async fn http_worker(b: Api, index: usize, run: Arc<Run>) -> anyhow::Result<Steps> {
    let worker_id = format!("bench-worker-{index}");
    let mut steps = Steps::new(["poll", "ack", "heartbeat (each)", "stop"]);
    while !run.stop.load(Ordering::Relaxed) {
        let measuring = run.measuring.load(Ordering::Relaxed);
        let t = Instant::now();
        let Some(claim) = b.poll("", &worker_id).await? else {
            run.exhausted.store(true, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let polled = t.elapsed();
        let t = Instant::now();
        b.ack(&claim.id).await?;
        let acked = t.elapsed();
        let mut beats = [Duration::ZERO; 3];
        let mut last = NO_HEARTBEAT.to_string();
        for beat in &mut beats {
            let t = Instant::now();
            last = b.heartbeat(&claim, &last).await?;
            *beat = t.elapsed();
        }
        let t = Instant::now();
        b.stop(&claim).await?;
        let stopped = t.elapsed();
        run.cycles.fetch_add(1, Ordering::Relaxed);
        if measuring {
            steps.samples[0].push(ms(polled));
            steps.samples[1].push(ms(acked));
            steps.samples[2].extend(beats.iter().map(|d| ms(*d)));
            steps.samples[3].push(ms(stopped));
        }
    }
    Ok(steps)
}

// ------------------------------------------------------------------ the ceiling: SQL only

/// What a ceiling task needs: what the server knows when a request arrives.
struct Shared {
    pool: PgPool,
    env_id: String,
    key_id: String,
    ttl: i64,
    reclaim: chrono::Duration,
}

/// One compare-and-set as `routes::work::transition` does it on the happy
/// path: reconcile, apply the rule, write if anything changed.
async fn apply(
    db: &mut PgConnection,
    row: WorkRow,
    key_fence: Option<&str>,
    rule: impl Fn(&Lease, Timestamp) -> Option<Lease>,
) -> anyhow::Result<Lease> {
    let now = time::now();
    let stored = row.lease();
    let current = stored.reconcile(now);
    let next = rule(&current, now).context("the lease rule refused a happy-path step")?;
    if next == stored {
        return Ok(next);
    }
    work::compare_and_set(db, &row, &next, key_fence)
        .await?
        .context("lost a compare-and-set nobody else should contend for")?;
    Ok(next)
}

/// The statements of one HTTP cycle, in order:
/// poll: claim (1); ack: find + CAS (2);
/// 3 × heartbeat: token lookup + CAS (6); stop: token lookup + CAS (2).
/// Like the server, each request's statements share one pooled connection.
/// Returns `false` when the queue is empty.
async fn ceiling_cycle(s: &Shared, times: &mut [Duration; 6]) -> anyhow::Result<bool> {
    let env = s.env_id.as_str();

    // Poll
    let t = Instant::now();
    let mut db = s.pool.acquire().await?;
    let token = ids::new_secret(ids::SESSIONS_TOKEN_PREFIX);
    let digest = ids::sha256(&token);
    let now = time::now();
    let Some(claimed) =
        work::claim(&mut *db, env, &s.key_id, now, s.reclaim, &digest, None).await?
    else {
        return Ok(false);
    };
    drop(db);
    times[0] = t.elapsed();

    // Ack (Environment key, fenced on it)
    let t = Instant::now();
    let mut db = s.pool.acquire().await?;
    let row = work::find(&mut *db, env, &claimed.id)
        .await?
        .context("claimed row vanished")?;
    let ttl = s.ttl;
    apply(&mut db, row, Some(&s.key_id), |l, now| l.ack(now, ttl).ok()).await?;
    drop(db);
    times[1] = t.elapsed();

    // Heartbeat ×3 (sessions token)
    let mut expected = None;
    for slot in &mut times[2..5] {
        let t = Instant::now();
        let mut db = s.pool.acquire().await?;
        let row = work::find_by_token(&mut *db, &digest)
            .await?
            .context("token lookup failed")?;
        let lease = apply(&mut db, row, None, |l, now| {
            l.admits_token(TokenUse::Heartbeat, now).ok()?;
            l.heartbeat(expected, None, now, ttl)
                .ok()
                .map(|(next, _)| next)
        })
        .await?;
        expected = lease.last_heartbeat();
        *slot = t.elapsed();
    }

    // Forced stop (sessions token)
    let t = Instant::now();
    let mut db = s.pool.acquire().await?;
    let row = work::find_by_token(&mut *db, &digest)
        .await?
        .context("token lookup failed")?;
    apply(&mut db, row, None, |l, now| {
        l.admits_token(TokenUse::Stop, now).ok()?;
        l.stop(true, Stopper::Holder, now).ok()
    })
    .await?;
    times[5] = t.elapsed();
    Ok(true)
}

async fn sql_worker(shared: Arc<Shared>, run: Arc<Run>) -> anyhow::Result<Steps> {
    let mut steps = Steps::new([
        "poll (1 stmt)",
        "ack (2 stmts)",
        "heartbeat (2 each)",
        "stop (2 stmts)",
    ]);
    let mut times = [Duration::ZERO; 6];
    while !run.stop.load(Ordering::Relaxed) {
        let measuring = run.measuring.load(Ordering::Relaxed);
        if !ceiling_cycle(&shared, &mut times).await? {
            run.exhausted.store(true, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        run.cycles.fetch_add(1, Ordering::Relaxed);
        if measuring {
            steps.samples[0].push(ms(times[0]));
            steps.samples[1].push(ms(times[1]));
            steps.samples[2].extend(times[2..5].iter().map(|d| ms(*d)));
            steps.samples[3].push(ms(times[5]));
        }
    }
    Ok(steps)
}
