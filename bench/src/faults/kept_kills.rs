//! The `supervisor-kill-kept` and `supervisor-term-kept` scenarios: the
//! Docker supervisor keeps Sessions' sandboxes (`--keep-idle`), each
//! Session ends a turn and idles out (the runners' idle end shortened to
//! [`IDLE_AFTER_END_TURN_SECONDS`]), and while their sandboxes wait the
//! supervisor is killed (SIGKILL) or ended (SIGTERM, which detaches), then
//! started again; each Session is sent its next message. The restarted
//! supervisor adopts the waiting sandboxes or removes them, binds none
//! twice and leaks none (`kept_watch.rs`); the Sessions' next turns run,
//! each call answered once. Then the restarted supervisor keeps them again:
//! half the Sessions are deleted while kept (their sandboxes must go within
//! the sweep bound), the others' keep runs out (theirs must go within the
//! keep and the sweep bound).

use super::invariants::{self, Promises, Verdict};
use super::kept_watch::{self, KeptWatch};
use super::load::{self, Record};
use super::scenarios::{self, Outcome};
use super::system::{Launcher, System};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the Docker supervisor keeps a Session's sandbox.
pub const KEEP: Duration = Duration::from_secs(15);
/// The runners' idle end after an end-of-turn idle (60 s otherwise).
pub const IDLE_AFTER_END_TURN_SECONDS: u32 = 2;
/// How long past its keep, or past its Session's deletion, a waiting
/// sandbox may live: the sweep runs every 2 s here; a restart takes a few.
pub const SWEEP_BOUND: Duration = Duration::from_secs(10);
const SESSIONS: usize = 4;

pub async fn run(system: &Arc<System>, signal: i32) -> anyhow::Result<Outcome> {
    keeping(system, true).await?;
    let outcome = scenario(system, signal).await;
    keeping(system, false).await?;
    outcome
}

/// Restarts the Docker supervisor keeping sandboxes (and the local one
/// stopped, so that every Session's sandbox is one that can be kept), or
/// as before.
async fn keeping(system: &System, keep: bool) -> anyhow::Result<()> {
    *system.keep_idle.lock().unwrap() = keep.then_some((KEEP, IDLE_AFTER_END_TURN_SECONDS));
    system
        .end_worker(Launcher::Docker, libc::SIGTERM, Duration::from_secs(10))
        .await?;
    if keep {
        system
            .end_worker(Launcher::Local, libc::SIGTERM, Duration::from_secs(10))
            .await?;
    } else {
        system.start_worker(Launcher::Local).await?;
    }
    system.start_worker(Launcher::Docker).await
}

async fn scenario(system: &Arc<System>, signal: i32) -> anyhow::Result<Outcome> {
    let kept = KeptWatch::start(system.clone(), KEEP, SWEEP_BOUND);
    let broken: Arc<Mutex<Verdict>> = Arc::default();
    let (s, out) = (system.clone(), broken.clone());
    let mut outcome = scenarios::frame_with(
        system,
        move || {
            tokio::spawn(async move {
                let mut record = Record::default();
                let mut v = Verdict::default();
                if let Err(err) = drive(&s, signal, &mut record, &mut v).await {
                    record.failures.push(format!("{err:#}"));
                }
                *out.lock().unwrap() = v;
                record
            })
        },
        Promises::default(),
        Box::pin(async { Ok(()) }),
    )
    .await?;
    let (failures, most_waiting) = kept.finish();
    println!("faults: kept: at most {most_waiting} sandboxes waited at once");
    outcome.verdict.failures.extend(failures);
    let v = std::mem::take(&mut *broken.lock().unwrap());
    outcome.verdict.lost += v.lost;
    outcome.verdict.doubled += v.doubled;
    outcome.verdict.leaked += v.leaked;
    outcome.verdict.failures.extend(v.failures);
    if most_waiting == 0 {
        outcome
            .verdict
            .failures
            .push("kept: no sandbox was ever kept, so nothing was tested".into());
    }
    Ok(outcome)
}

/// A turn of `session` calling `cmd` once; ended with `end_turn` within 150 s.
async fn turn(system: &System, session: &str, record: &Mutex<Record>) -> anyhow::Result<()> {
    let marker = format!("m{:016x}", rand::random::<u64>());
    record
        .lock()
        .unwrap()
        .turns
        .push((session.to_string(), marker.clone()));
    let text = format!("fault {marker} calls=1 cmd=sleep 1; echo kept {{n}}");
    load::send_once(system, session, &marker, &text).await?;
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        if load::turn_ended(&load::events(system, session).await?, &marker) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the turn of {session} did not end within 150 s"
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A turn of each Session at once.
async fn turns(system: &System, sessions: &[String], record: &Mutex<Record>) -> anyhow::Result<()> {
    let all = sessions.iter().map(|s| turn(system, s, record));
    for outcome in futures::future::join_all(all).await {
        outcome?;
    }
    Ok(())
}

/// Waits until each of `sessions` has a sandbox waiting (its item ended,
/// its container running).
async fn until_kept(system: &System, sessions: &[String]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting = waiting_sessions(system).await?;
        if sessions.iter().all(|s| waiting.contains(s)) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "within 60 s only {waiting:?} of {sessions:?} had a kept sandbox"
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Sessions whose sandbox waits now.
async fn waiting_sessions(system: &System) -> anyhow::Result<HashSet<String>> {
    let mut out = HashSet::new();
    for b in kept_watch::bindings(&system.docker).await {
        let (stopped,): (bool,) = sqlx::query_as(
            "SELECT COALESCE((SELECT state = 'stopped' FROM work WHERE id = $1), false)",
        )
        .bind(&b.work_id)
        .fetch_one(&system.db)
        .await?;
        if let (true, Some(session)) = (stopped, b.session) {
            out.insert(session);
        }
    }
    Ok(out)
}

async fn drive(
    system: &Arc<System>,
    signal: i32,
    record: &mut Record,
    v: &mut Verdict,
) -> anyhow::Result<()> {
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(load::open_session(system).await?);
    }
    let shared = Mutex::new(Record::default());
    let outcome = async {
        turns(system, &sessions, &shared).await?;
        until_kept(system, &sessions).await?;
        // The fault, while every Session's sandbox waits.
        let started = Instant::now();
        let status = system
            .end_worker(Launcher::Docker, signal, Duration::from_secs(10))
            .await?;
        if signal == libc::SIGTERM {
            anyhow::ensure!(
                status.success() && started.elapsed() < Duration::from_secs(5),
                "the Docker supervisor ended {status} {:?} after SIGTERM with sandboxes kept",
                started.elapsed()
            );
        }
        // Down for a moment, as a restart is.
        tokio::time::sleep(Duration::from_secs(1)).await;
        system.start_worker(Launcher::Docker).await?;
        turns(system, &sessions, &shared).await?;
        until_kept(system, &sessions).await?;
        // Half deleted while kept: their sandboxes go with the sweep. Their
        // logs are judged first (a deleted Session's rows go), and left out
        // of what the frame judges and deletes.
        let (deleted, expiring) = sessions.split_at(SESSIONS / 2);
        let theirs = {
            let mut all = shared.lock().unwrap();
            let (theirs, others) = std::mem::take(&mut all.turns)
                .into_iter()
                .partition(|(s, _)| deleted.contains(s));
            all.turns = others;
            Record {
                turns: theirs,
                ..Record::default()
            }
        };
        invariants::check_sessions(system, &theirs, Promises::default(), v).await?;
        let failures = load::end_sessions(system, deleted).await;
        anyhow::ensure!(failures.is_empty(), "deleting kept Sessions: {failures:?}");
        let gone: HashSet<String> = deleted.iter().cloned().collect();
        invariants::check_leftovers(system, &gone, SWEEP_BOUND, v).await;
        // The others' keep runs out.
        let deadline = Instant::now() + KEEP + SWEEP_BOUND;
        loop {
            let waiting = waiting_sessions(system).await?;
            if !expiring.iter().any(|s| waiting.contains(s)) {
                break;
            }
            if Instant::now() >= deadline {
                v.leaked += 1;
                v.failures.push(format!(
                    "leaked: kept sandboxes of {waiting:?} outlived their keep ({} s) by over {} s",
                    KEEP.as_secs(),
                    SWEEP_BOUND.as_secs()
                ));
                break;
            }
            // Poll interval of this deadline loop.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::Ok(())
    }
    .await;
    record.merge(std::mem::take(&mut *shared.lock().unwrap()));
    outcome
}
