//! `depth`: single-worker Poll → Ack latency with 1,000 vs 100,000 items
//! queued in the Environment (plus whatever stopped history earlier phases
//! left, which the claim's partial index never sees).

use crate::chart::Chart;
use crate::harness::Bench;
use crate::measure::{ms, percentile};
use mango_api::store::work;
use std::sync::Arc;
use std::time::Instant;

pub struct Options {
    pub small: i64,
    pub large: i64,
    pub polls: usize,
    pub profile: bool,
}

pub struct DepthResult {
    pub small_p50_ms: f64,
    pub large_p50_ms: f64,
    pub chart: Chart,
}

impl DepthResult {
    pub fn ratio(&self) -> f64 {
        self.large_p50_ms / self.small_p50_ms
    }
}

const WARMUP_CYCLES: usize = 20;

pub async fn run(bench: &Arc<Bench>, opts: &Options) -> anyhow::Result<DepthResult> {
    bench.clear_live().await?;
    println!(
        "depth: single worker, {} poll → ack cycles at {} and at {} queued items ...",
        opts.polls, opts.small, opts.large
    );
    bench.seed(opts.small).await?;
    bench.vacuum().await?;
    let mut chart = Chart::new(
        "depth",
        "depth: one worker's poll → ack at a shallow and a deep queue",
    );
    let (small_cycle, small_poll) = at_depth(bench, opts, &mut chart).await?;

    let queued = bench.count_rows("state = 'queued'").await?;
    let t = Instant::now();
    bench.seed(opts.large - queued).await?;
    bench.vacuum().await?;
    println!(
        "  (topped the queue up to {} items in {:.1} s)",
        opts.large,
        t.elapsed().as_secs_f64()
    );
    let (large_cycle, large_poll) = at_depth(bench, opts, &mut chart).await?;
    bench.clear_live().await?;

    let result = DepthResult {
        small_p50_ms: small_cycle,
        large_p50_ms: large_cycle,
        chart,
    };
    println!(
        "depth: poll → ack p50 {:.2} ms at {} vs {:.2} ms at {}: depth_ratio {:.3} (poll alone: {:.3})",
        small_cycle,
        opts.small,
        large_cycle,
        opts.large,
        result.ratio(),
        large_poll / small_poll
    );
    Ok(result)
}

/// Measures at the current depth, charting its cycles and polls; returns
/// p50 of (poll → ack, poll alone) in ms.
async fn at_depth(
    bench: &Arc<Bench>,
    opts: &Options,
    chart: &mut Chart,
) -> anyhow::Result<(f64, f64)> {
    let depth = bench.count_rows("state = 'queued'").await?;
    let stopped = bench.count_rows("state = 'stopped'").await?;
    if opts.profile {
        explain_claim(bench).await?;
    }
    let mut cycles = Vec::with_capacity(opts.polls);
    let mut polls = Vec::with_capacity(opts.polls);
    let mut acks = Vec::with_capacity(opts.polls);
    for i in 0..WARMUP_CYCLES + opts.polls {
        let t = Instant::now();
        let claim = bench
            .api
            .poll("", "bench-depth")
            .await?
            .ok_or_else(|| anyhow::anyhow!("the queue ran dry at depth {depth}"))?;
        let polled = t.elapsed();
        let t2 = Instant::now();
        bench.api.ack(&claim.id).await?;
        let acked = t2.elapsed();
        let cycle = t.elapsed();
        // Not measured: keeps acknowledged leases out of the live index so
        // both depths see the same head of the queue.
        bench.api.stop(&claim).await?;
        if i >= WARMUP_CYCLES {
            cycles.push(ms(cycle));
            polls.push(ms(polled));
            acks.push(ms(acked));
        }
    }
    chart.case(format!("poll → ack, {depth} queued"), &cycles);
    chart.case(format!("poll, {depth} queued"), &polls);
    let cycle_p50 = percentile(&mut cycles, 50.0);
    let poll_p50 = percentile(&mut polls, 50.0);
    println!(
        "  depth {depth} ({stopped} stopped rows in the Environment): poll → ack p50 {cycle_p50:.2} ms, p99 {:.2} ms; poll p50 {poll_p50:.2} ms; ack p50 {:.2} ms",
        percentile(&mut cycles, 99.0),
        percentile(&mut acks, 50.0)
    );
    Ok((cycle_p50, poll_p50))
}

/// EXPLAIN ANALYZE of the server's own claim statement at the current depth, rolled back.
async fn explain_claim(bench: &Arc<Bench>) -> anyhow::Result<()> {
    let mut tx = bench.app.db.begin().await?;
    let now = mango_protocol::time::now();
    let explain = format!(
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {}",
        work::claim_statement()
    );
    let plan: Vec<(String,)> = sqlx::query_as(&explain)
        .bind(&bench.app.env_id)
        .bind(&bench.app.env_key_id)
        .bind(now)
        .bind(now - chrono::Duration::seconds(5))
        .bind(vec![0u8; 32])
        .fetch_all(&mut *tx)
        .await?;
    tx.rollback().await?;
    println!("  EXPLAIN ANALYZE of the claim:");
    for (line,) in plan {
        println!("    {line}");
    }
    Ok(())
}
