//! `wake`: K pollers long-poll (`block_ms=999`) an empty queue; a creator
//! makes one healthcheck over HTTP every ~interval, each after the previous
//! one was claimed. A sample is the time from the moment the create response
//! arrived (the commit-time proxy: the insert committed before the api
//! answered) to the moment a poller's Poll response carrying that item arrived.

use crate::chart::Chart;
use crate::harness::Bench;
use crate::measure::{ms, percentile};
use anyhow::Context;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub struct Options {
    pub pollers: usize,
    pub samples: usize,
    pub interval: Duration,
}

pub struct WakeResult {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub chart: Chart,
}

const WARMUP_SAMPLES: usize = 10;
const CLAIM_TIMEOUT: Duration = Duration::from_secs(3);

pub async fn run(bench: &Arc<Bench>, opts: &Options) -> anyhow::Result<WakeResult> {
    bench.clear_live().await?;
    println!(
        "wake: {} pollers blocked (block_ms=999) on an empty queue; one create every {} ms after the previous claim, {} samples ...",
        opts.pollers,
        opts.interval.as_millis(),
        opts.samples
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Instant)>();
    let pollers: Vec<_> = (0..opts.pollers)
        .map(|i| tokio::spawn(poller(bench.clone(), i, stop.clone(), tx.clone())))
        .collect();
    drop(tx);
    // Let every poller reach its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut from_create_returned = Vec::with_capacity(opts.samples);
    let mut from_create_sent = Vec::with_capacity(opts.samples);
    let mut create_rtt = Vec::with_capacity(opts.samples);
    let mut early = 0usize;
    let mut missed = 0usize;
    let mut attempts = 0usize;
    let mut pollers_gone = false;
    while from_create_returned.len() < opts.samples && attempts < 2 * opts.samples + WARMUP_SAMPLES
    {
        let warming = attempts < WARMUP_SAMPLES;
        attempts += 1;
        let started = Instant::now();
        let id = bench.api.create_check().await?;
        let created = Instant::now();
        let arrived = loop {
            match tokio::time::timeout(CLAIM_TIMEOUT, rx.recv()).await {
                Ok(Some((got, at))) if got == id => break Some(at),
                Ok(Some(_)) => continue, // a straggler from an earlier timeout
                Ok(None) => {
                    // Every poller ended: joining them below reports why.
                    pollers_gone = true;
                    break None;
                }
                Err(_) => break None,
            }
        };
        let Some(arrived) = arrived else {
            if pollers_gone {
                break;
            }
            missed += 1;
            continue;
        };
        if !warming {
            if arrived < created {
                early += 1;
            }
            from_create_returned.push(ms(arrived.saturating_duration_since(created)));
            from_create_sent.push(ms(arrived.duration_since(started)));
            create_rtt.push(ms(created.duration_since(started)));
        }
        tokio::time::sleep_until((started + opts.interval).into()).await;
    }
    stop.store(true, Ordering::SeqCst);
    for p in pollers {
        // A poller is at most one long poll (≤ 1 s) away from noticing.
        match tokio::time::timeout(Duration::from_secs(3), p).await {
            Ok(joined) => joined.context("poller panicked")??,
            Err(_) => println!("  warning: a poller did not stop in time"),
        }
    }
    bench.clear_live().await?;

    if from_create_returned.is_empty() {
        anyhow::bail!("wake: no item was claimed within {CLAIM_TIMEOUT:?}");
    }
    let mut chart = Chart::new(
        "wake",
        format!(
            "wake: a new item reaching one of {} blocked pollers",
            opts.pollers
        ),
    );
    chart.case("create returned → claimed", &from_create_returned);
    chart.case("create sent → claimed", &from_create_sent);
    chart.case("create round trip", &create_rtt);
    let result = WakeResult {
        p50_ms: percentile(&mut from_create_returned, 50.0),
        p99_ms: percentile(&mut from_create_returned, 99.0),
        chart,
    };
    println!(
        "  create → claimed, from the create request being sent: p50 {:.2} ms, p99 {:.2} ms",
        percentile(&mut from_create_sent, 50.0),
        percentile(&mut from_create_sent, 99.0)
    );
    println!(
        "  create request round trip: p50 {:.2} ms, p99 {:.2} ms",
        percentile(&mut create_rtt, 50.0),
        percentile(&mut create_rtt, 99.0)
    );
    if early > 0 {
        println!("  {early} items reached a poller before their create response arrived (counted as 0 ms)");
    }
    if missed > 0 {
        println!(
            "  warning: {missed} items were not claimed within {CLAIM_TIMEOUT:?} (not sampled)"
        );
    }
    println!(
        "wake: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (create returned → blocked poller returned it; n={})",
        result.p50_ms,
        result.p99_ms,
        percentile(&mut from_create_returned, 100.0),
        from_create_returned.len()
    );
    Ok(result)
}

/// Long-polls until told to stop; reports each claimed item with the instant
/// its Poll response arrived, then acks and stops it (off the measured path)
/// so it never comes back as a stale pending claim.
async fn poller(
    bench: Arc<Bench>,
    index: usize,
    stop: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<(String, Instant)>,
) -> anyhow::Result<()> {
    let worker_id = format!("bench-poller-{index}");
    while !stop.load(Ordering::Relaxed) {
        let Some(claim) = bench.api.poll("?block_ms=999", &worker_id).await? else {
            continue;
        };
        let arrived = Instant::now();
        let _ = tx.send((claim.id.clone(), arrived));
        bench.api.ack(&claim.id).await?;
        bench.api.stop(&claim).await?;
    }
    Ok(())
}
