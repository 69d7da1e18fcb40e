//! `events`: Session event admission and live-stream fan-out, over HTTP.
//!
//! * Admission: N senders each POST single `user.message` events in a loop,
//!   first each to a Session of its own, then all to ONE Session (where they
//!   serialize on its row lock); admitted events per second in the window.
//! * Fan-out: R SSE readers stream ONE Session while a sender admits events at
//!   a steady rate, each carrying (in its text) the instant just before its
//!   send request; a sample is, per (event, reader), that instant → the frame
//!   arriving at the reader. Every reader must receive every event.

use crate::chart::Chart;
use crate::harness::Bench;
use crate::http::Api;
use crate::measure::{ms, percentile, CpuSample};
use anyhow::{bail, Context};
use mango_protocol::events::types;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Statements the server makes per admitted single event, each its own
/// transaction: the Workspace key lookup, the Session read and the fenced
/// append (events, projection, outbox row), whose AFTER triggers decide
/// about NOTIFY. The first input of a Session, which makes its Work, takes
/// the locking transaction instead (BEGIN, key, lock, append, Work, COMMIT).
pub const STATEMENTS_PER_ADMISSION: usize = 3;
pub const TARGET_ADMITTED_PER_S: f64 = 2_000.0;
pub const TARGET_FANOUT_P99_MS: f64 = 50.0;
/// How long readers may lag behind the last send before they are given up on.
const DRAIN: Duration = Duration::from_secs(10);
/// Long enough for idle backends to publish their statistics counters.
const STATS_SETTLE: Duration = Duration::from_millis(1_100);

pub struct Options {
    pub senders: usize,
    pub seconds: f64,
    pub warmup: f64,
    pub readers: usize,
    pub rate: f64,
    pub fanout_seconds: f64,
}

pub struct EventsResult {
    pub admitted_per_s: f64,
    pub admitted_one_session_per_s: f64,
    pub fanout_p50_ms: f64,
    pub fanout_p99_ms: f64,
    pub chart: Chart,
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets"
    } else {
        "MISSES"
    }
}

pub async fn run(bench: &Arc<Bench>, opts: &Options) -> anyhow::Result<EventsResult> {
    let api = bench.api.with_new_client()?;
    let agent = api.create_agent("bench").await?;

    println!(
        "events admission: {} senders, each to its own Session, single user.message per request, {:.1} s warm-up + {:.1} s measured ...",
        opts.senders, opts.warmup, opts.seconds
    );
    let mut own = Vec::with_capacity(opts.senders);
    for _ in 0..opts.senders {
        own.push(api.create_session(&agent, &bench.app.env_id).await?);
    }
    let mut chart = Chart::new(
        "events",
        format!(
            "events: admission by {} senders, and fan-out to {} SSE readers",
            opts.senders, opts.readers
        ),
    );
    let admitted_per_s =
        admission(bench, &api, opts, own, ("send, own Sessions", &mut chart)).await?;
    println!(
        "events admission: {admitted_per_s:.1} events/s, Sessions of their own (target ≥ {TARGET_ADMITTED_PER_S:.0}: {})",
        verdict(admitted_per_s >= TARGET_ADMITTED_PER_S)
    );

    println!(
        "events admission: {} senders, all to ONE Session (serialized on its row lock) ...",
        opts.senders
    );
    let one = api.create_session(&agent, &bench.app.env_id).await?;
    let admitted_one_session_per_s = admission(
        bench,
        &api,
        opts,
        vec![one; opts.senders],
        ("send, one Session", &mut chart),
    )
    .await?;
    println!(
        "events admission: {admitted_one_session_per_s:.1} events/s, one Session (target ≥ {TARGET_ADMITTED_PER_S:.0}: {})",
        verdict(admitted_one_session_per_s >= TARGET_ADMITTED_PER_S)
    );

    let (fanout_p50_ms, fanout_p99_ms) = fanout(bench, &api, &agent, opts, &mut chart).await?;
    Ok(EventsResult {
        admitted_per_s,
        admitted_one_session_per_s,
        fanout_p50_ms,
        fanout_p99_ms,
        chart,
    })
}

/// Index scans of `session_events` so far (the stream's `events_after`, and
/// list reads; inserts do not count). Published about once a second.
async fn event_reads(bench: &Bench) -> anyhow::Result<i64> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT coalesce(idx_scan, 0)::bigint FROM pg_stat_user_tables WHERE relname = 'session_events'",
    )
    .fetch_one(&bench.app.db)
    .await?;
    Ok(n)
}

struct Run {
    stop: AtomicBool,
    measuring: AtomicBool,
    admitted: AtomicU64,
}

/// Sender `i` sends to `sessions[i]` until stopped; returns the admitted
/// events per second inside the measured window, and charts their round
/// trips as the named case.
async fn admission(
    bench: &Arc<Bench>,
    api: &Api,
    opts: &Options,
    sessions: Vec<String>,
    (case, chart): (&str, &mut Chart),
) -> anyhow::Result<f64> {
    let run = Arc::new(Run {
        stop: AtomicBool::new(false),
        measuring: AtomicBool::new(false),
        admitted: AtomicU64::new(0),
    });
    let rtts = Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
    let sent = Arc::new(AtomicU64::new(0));
    // Transactions are counted over the whole phase, from quiet to quiet:
    // backends publish their counters about once a second.
    tokio::time::sleep(STATS_SETTLE).await;
    let x0 = bench.xacts().await?;
    let tasks: Vec<_> = sessions
        .into_iter()
        .enumerate()
        .map(|(i, session)| {
            let (api, run, rtts, sent) = (api.clone(), run.clone(), rtts.clone(), sent.clone());
            bench.client.spawn(async move {
                let mut mine = Vec::new();
                let mut n = 0u64;
                while !run.stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    api.send_message(&session, &format!("sender {i} message {n}"))
                        .await?;
                    n += 1;
                    sent.fetch_add(1, Ordering::Relaxed);
                    if run.measuring.load(Ordering::Relaxed) {
                        run.admitted.fetch_add(1, Ordering::Relaxed);
                        mine.push(ms(started.elapsed()));
                    }
                }
                rtts.lock().expect("rtts").extend(mine);
                anyhow::Ok(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(opts.warmup)).await;
    let cpu0 = CpuSample::take(&bench.db_name);
    let a0 = run.admitted.load(Ordering::SeqCst);
    let t0 = Instant::now();
    run.measuring.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs_f64(opts.seconds)).await;
    run.measuring.store(false, Ordering::SeqCst);
    let a1 = run.admitted.load(Ordering::SeqCst);
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu1 = CpuSample::take(&bench.db_name);
    run.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.context("sender panicked")??;
    }
    tokio::time::sleep(STATS_SETTLE).await;
    let x1 = bench.xacts().await?;
    let sent = sent.load(Ordering::SeqCst);
    let admitted = a1 - a0;
    if admitted == 0 {
        bail!("events admission: no event was admitted in the measured window");
    }
    let mut rtts = std::mem::take(&mut *rtts.lock().expect("rtts"));
    chart.case(case, &rtts);
    println!(
        "  {admitted} events in {elapsed:.2} s; send round trip p50 {:.2} ms, p99 {:.2} ms",
        percentile(&mut rtts, 50.0),
        percentile(&mut rtts, 99.0),
    );
    println!(
        "  ≈{:.2} database transactions per event over the phase ({sent} events; pg_stat_database, approximate: includes the LISTEN backend's queue reads, which it publishes late); by design {STATEMENTS_PER_ADMISSION} autocommit statements",
        (x1 - x0) as f64 / sent.max(1) as f64
    );
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        for line in a.describe_as(b, admitted, "event") {
            println!("  {line}");
        }
    }
    Ok(admitted as f64 / elapsed)
}

/// What one reader saw: per event index, the latency in ms (if it arrived).
struct Seen {
    latency: Vec<Option<f64>>,
    duplicates: usize,
    last_arrival: Duration,
}

async fn fanout(
    bench: &Arc<Bench>,
    api: &Api,
    agent: &str,
    opts: &Options,
    chart: &mut Chart,
) -> anyhow::Result<(f64, f64)> {
    let total = (opts.rate * opts.fanout_seconds).round().max(1.0) as usize;
    println!(
        "events fan-out: {} SSE readers of ONE Session; {total} user.message events sent at {:.0}/s over {:.1} s ...",
        opts.readers, opts.rate, opts.fanout_seconds
    );
    let session = api.create_session(agent, &bench.app.env_id).await?;
    // The readers and the sender share one clock: offsets from `epoch`.
    let epoch = Instant::now();
    let (giveup_tx, giveup) = watch::channel(false);
    // Each reader on its own connection (the client opens one per open stream).
    let readers_api = api.with_new_client()?;
    let mut opened = Vec::with_capacity(opts.readers);
    for _ in 0..opts.readers {
        let (api, session, giveup) = (readers_api.clone(), session.clone(), giveup.clone());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let task = bench.client.spawn(async move {
            let response = api.open_stream(&session).await?;
            let _ = ready_tx.send(());
            read_stream(response, total, epoch, giveup).await
        });
        opened.push((task, ready_rx));
    }
    let mut readers = Vec::with_capacity(opts.readers);
    for (i, (task, ready)) in opened.into_iter().enumerate() {
        if ready.await.is_err() {
            // The task ended before its stream opened: surface why.
            task.await.context("reader panicked")??;
            bail!("reader {i} ended before its stream opened");
        }
        readers.push(task);
    }

    tokio::time::sleep(STATS_SETTLE).await;
    let x0 = bench.xacts().await?;
    let r0 = event_reads(bench).await?;
    let cpu0 = CpuSample::take(&bench.db_name);
    let started = Instant::now();
    let sender = {
        let (api, session) = (api.clone(), session.clone());
        let interval = Duration::from_secs_f64(1.0 / opts.rate);
        bench.client.spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut sends = Vec::with_capacity(total);
            for k in 0..total {
                tick.tick().await;
                let (api, session) = (api.clone(), session.clone());
                // One request per tick, so a slow admission does not slow the rate.
                sends.push(tokio::spawn(async move {
                    let sent = epoch.elapsed();
                    api.send_message(&session, &format!("fanout {k} {}", sent.as_micros()))
                        .await?;
                    anyhow::Ok(ms(epoch.elapsed() - sent))
                }));
            }
            let mut rtts = Vec::with_capacity(total);
            for send in sends {
                rtts.push(send.await.context("send panicked")??);
            }
            anyhow::Ok(rtts)
        })
    };
    let mut rtts = sender.await.context("sender panicked")??;
    let sent_in = started.elapsed();
    // Give the readers a bounded time to catch up.
    let giveup_timer = tokio::spawn(async move {
        tokio::time::sleep(DRAIN).await;
        let _ = giveup_tx.send(true);
    });
    let mut seen = Vec::with_capacity(readers.len());
    for reader in readers {
        seen.push(reader.await.context("reader panicked")??);
    }
    giveup_timer.abort();
    let cpu1 = CpuSample::take(&bench.db_name);
    tokio::time::sleep(STATS_SETTLE).await;
    let x1 = bench.xacts().await?;
    let r1 = event_reads(bench).await?;

    let mut samples = Vec::with_capacity(total * seen.len());
    let mut incomplete = Vec::new();
    let mut duplicates = 0;
    let mut last_arrival = Duration::ZERO;
    for (i, s) in seen.iter().enumerate() {
        let missing = s.latency.iter().filter(|l| l.is_none()).count();
        if missing > 0 {
            incomplete.push(format!("reader {i} missed {missing} of {total}"));
        }
        samples.extend(s.latency.iter().flatten());
        duplicates += s.duplicates;
        last_arrival = last_arrival.max(s.last_arrival);
    }
    let delivered = samples.len();
    let window = last_arrival.saturating_sub(started.duration_since(epoch));
    println!(
        "  sent {total} events in {:.2} s ({:.0}/s); send round trip p50 {:.2} ms, p99 {:.2} ms",
        sent_in.as_secs_f64(),
        total as f64 / sent_in.as_secs_f64(),
        percentile(&mut rtts, 50.0),
        percentile(&mut rtts, 99.0)
    );
    println!(
        "  delivered {delivered} of {} (event, reader) pairs: {:.0} deliveries/s across readers (first send → last frame, {:.2} s)",
        total * seen.len(),
        delivered as f64 / window.as_secs_f64().max(1e-9),
        window.as_secs_f64()
    );
    let events_total = total as f64;
    println!(
        "  ≈{:.1} database transactions and ≈{:.1} session_events index scans (stream re-reads) per event sent (approximate)",
        (x1 - x0) as f64 / events_total,
        (r1 - r0) as f64 / events_total
    );
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        for line in a.describe_as(b, total as u64, "event") {
            println!("  {line}");
        }
    }
    if duplicates > 0 {
        println!("  error: {duplicates} frames delivered an event a reader already had");
    }
    chart.case(format!("fan-out send, {:.0}/s", opts.rate), &rtts);
    chart.case(
        format!("fan-out send → frame, {} readers", seen.len()),
        &samples,
    );
    if samples.is_empty() {
        bail!("events fan-out: no reader received any event");
    }
    let p50 = percentile(&mut samples, 50.0);
    let p99 = percentile(&mut samples, 99.0);
    println!(
        "events fan-out: send → frame at reader p50 {p50:.2} ms, p99 {p99:.2} ms, max {:.2} ms over {} readers (target p99 ≤ {TARGET_FANOUT_P99_MS:.0} ms: {})",
        percentile(&mut samples, 100.0),
        seen.len(),
        verdict(p99 <= TARGET_FANOUT_P99_MS)
    );
    if !incomplete.is_empty() {
        for line in &incomplete {
            println!("  error: {line}");
        }
        bail!(
            "events fan-out: {} of {} readers did not receive every event within {DRAIN:?} of the last send",
            incomplete.len(),
            seen.len()
        );
    }
    if duplicates > 0 {
        bail!("events fan-out: readers received duplicate frames");
    }
    Ok((p50, p99))
}

/// Reads SSE frames until all `total` bench events arrived or `giveup` fires.
/// Skips `event: ping`; a bench event's text is `fanout <k> <µs since epoch>`.
async fn read_stream(
    mut response: reqwest::Response,
    total: usize,
    epoch: Instant,
    mut giveup: watch::Receiver<bool>,
) -> anyhow::Result<Seen> {
    let mut seen = Seen {
        latency: vec![None; total],
        duplicates: 0,
        last_arrival: Duration::ZERO,
    };
    let mut received = 0usize;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    while received < total {
        let chunk = tokio::select! {
            chunk = response.chunk() => chunk?,
            _ = giveup.wait_for(|g| *g) => break,
        };
        let Some(chunk) = chunk else {
            bail!("the stream ended after {received} of {total} events");
        };
        let arrived = epoch.elapsed();
        buf.extend_from_slice(&chunk);
        while let Some(end) = frame_end(&buf) {
            let frame: Vec<u8> = buf.drain(..end).collect();
            let Some(k_sent) = parse_frame(&frame)? else {
                continue;
            };
            let (k, sent_us) = k_sent;
            if k >= total {
                bail!("frame for event {k}, but only {total} are sent");
            }
            if seen.latency[k].is_some() {
                seen.duplicates += 1;
                continue;
            }
            let sent = Duration::from_micros(sent_us);
            seen.latency[k] = Some(ms(arrived.saturating_sub(sent)));
            seen.last_arrival = arrived;
            received += 1;
        }
    }
    Ok(seen)
}

/// The end (exclusive, including the blank line) of the first complete frame.
pub fn frame_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `Some((k, sent_us))` for a bench `user.message` frame; `None` for pings,
/// comments and other events.
fn parse_frame(frame: &[u8]) -> anyhow::Result<Option<(usize, u64)>> {
    let text = std::str::from_utf8(frame).context("frame is not UTF-8")?;
    let mut event = "message";
    let mut data = String::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            event = v.trim_start();
        } else if let Some(v) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    if event != types::USER_MESSAGE {
        return Ok(None);
    }
    let body: Value = serde_json::from_str(&data).context("user.message frame data")?;
    let Some(text) = body["content"][0]["text"].as_str() else {
        bail!("user.message frame without text: {data}");
    };
    let mut words = text.split(' ');
    if words.next() != Some("fanout") {
        return Ok(None);
    }
    let k = words.next().and_then(|w| w.parse().ok());
    let sent = words.next().and_then(|w| w.parse().ok());
    match (k, sent) {
        (Some(k), Some(sent)) => Ok(Some((k, sent))),
        _ => bail!("unexpected bench text {text:?}"),
    }
}
