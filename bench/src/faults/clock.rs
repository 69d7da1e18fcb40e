//! The `heartbeat-edge` scenario: the clock at the edge of a lease, in
//! both directions, through the real api processes while the load runs. In
//! an Environment of its own the suite holds a healthcheck's lease, and a
//! poller of its own polls that Environment all along, as a supervisor
//! does. A heartbeat sent just before the lease expires keeps it: the
//! poller never gets the item, and the holder ends it. One sent just after
//! is refused; the poller reclaims the item within TTL + the reclaim delay
//! of its last renewal, and the late holder's token gets 401 from then on
//! while the new claim's is accepted. The late case is played twice: with
//! the poller held back until the late beat was answered (so that the beat
//! surely meets a lapsed lease nobody reclaimed yet) and with it polling
//! all along (the beat and the reclaim race, as in production).

use super::invariants::{self, Promises, Verdict};
use super::probe::{self, Held};
use super::scenarios::{self, Outcome};
use super::system::System;
use super::watch::RECLAIM_DELAY;
use chrono::{DateTime, Utc};
use reqwest::Method;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long before its lease expires (by the database's clock, which the
/// api reads) the in-time heartbeat is sent: a request takes far less on
/// this machine, yet it lands within a second of the edge.
const BEFORE_EXPIRY: Duration = Duration::from_millis(1000);
/// How long after its lease expired the late heartbeat is sent.
const AFTER_EXPIRY: Duration = Duration::from_millis(300);

/// An Environment only the suite polls.
#[derive(Clone)]
struct ClockEnv {
    id: String,
    key: String,
}

pub async fn run(system: &Arc<System>) -> anyhow::Result<Outcome> {
    let id = system.create_environment("faults-clock").await?;
    let key = system.create_key(Some(&id)).await?.0;
    let env = ClockEnv { id, key };
    let s = system.clone();
    let found: Arc<Mutex<Found>> = Arc::default();
    let out = found.clone();
    let mut outcome = scenarios::frame(
        system,
        scenarios::spec(2, 1, "sleep 2; echo call {n}"),
        Promises::default(),
        Box::pin(async move {
            let mut v = Verdict::default();
            let mut reclaims = Vec::new();
            in_time(&s, &env, &mut v).await?;
            for racing in [false, true] {
                if let Some(r) = late(&s, &env, racing, &mut v).await? {
                    reclaims.push(r);
                }
            }
            *out.lock().unwrap() = (v, reclaims);
            Ok(())
        }),
    )
    .await?;
    let (v, reclaims) = std::mem::take(&mut *found.lock().unwrap());
    outcome.verdict.failures.extend(v.failures);
    outcome.reclaims.extend(reclaims);
    Ok(outcome)
}

/// The lease of `work_id` as the database holds it: its expiry, its last
/// renewal (or its ack), its claim, and the database's clock.
struct LeaseRow {
    expires: DateTime<Utc>,
    renewed: Option<DateTime<Utc>>,
    epoch: i64,
    now: DateTime<Utc>,
}

async fn lease(system: &System, work_id: &str) -> anyhow::Result<LeaseRow> {
    type Row = (
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
        i64,
        DateTime<Utc>,
    );
    let (expires, renewed, epoch, now): Row =
        sqlx::query_as(
            "SELECT lease_expires_at, COALESCE(latest_heartbeat_at, acknowledged_at), claim_epoch, now()
             FROM work WHERE id = $1",
        )
        .bind(work_id)
        .fetch_one(&system.db)
        .await?;
    Ok(LeaseRow {
        expires: expires.ok_or_else(|| anyhow::anyhow!("{work_id} holds no lease"))?,
        renewed,
        epoch,
        now,
    })
}

/// Waits until the database's clock is `offset` before (negative: after)
/// the lease's expiry as it stood when called; that lease's row.
async fn until_edge(system: &System, work_id: &str, before: f64) -> anyhow::Result<LeaseRow> {
    let start = lease(system, work_id).await?;
    let deadline = Instant::now() + Duration::from_secs(system.settings.ttl_seconds * 2 + 10);
    loop {
        let now: (DateTime<Utc>,) = sqlx::query_as("SELECT now()").fetch_one(&system.db).await?;
        let left = (start.expires - now.0).num_milliseconds() as f64 / 1000.0 - before;
        if left <= 0.0 {
            return Ok(start);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the lease of {work_id} never neared its edge"
        );
        // Poll interval of this deadline loop: fine near the edge, so the
        // request leaves within a few ms of it.
        tokio::time::sleep(Duration::from_secs_f64(left.clamp(0.005, 0.2))).await;
    }
}

/// The scenario's verdict and the reclaims it measured, filled in by its fault.
type Found = (Verdict, Vec<(String, f64)>);

/// What the poller claimed, and when (by the database's clock).
type Claims = Arc<Mutex<Vec<(Held, DateTime<Utc>)>>>;

/// A supervisor of the clock Environment: polls all along, acks what it
/// claims and keeps it (with its token) for the scenario to judge.
struct Poller {
    stop: Arc<AtomicBool>,
    claims: Claims,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Poller {
    fn start(system: &Arc<System>, env: &ClockEnv) -> Poller {
        let stop: Arc<AtomicBool> = Arc::default();
        let claims: Claims = Arc::default();
        let (s, env, halt, got) = (system.clone(), env.clone(), stop.clone(), claims.clone());
        let task = tokio::spawn(async move {
            let mut failures = Vec::new();
            // Checked between polls, never mid-request: a poll cut off
            // after its claim was made would leave a claim nobody holds.
            while !halt.load(Ordering::Relaxed) {
                match poll_once(&s, &env).await {
                    Ok(Some(claimed)) => got.lock().unwrap().push(claimed),
                    Ok(None) => {}
                    Err(err) => failures.push(format!("the clock poller: {err:#}")),
                }
            }
            failures
        });
        Poller { stop, claims, task }
    }

    fn claimed(&self, work_id: &str) -> Option<(Held, DateTime<Utc>)> {
        self.claims
            .lock()
            .unwrap()
            .iter()
            .find(|(h, _)| h.work_id == work_id)
            .cloned()
    }

    async fn finish(self) -> (Vec<(Held, DateTime<Utc>)>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.task.await.unwrap_or_default();
        let claims = std::mem::take(&mut *self.claims.lock().unwrap());
        (claims, failures)
    }
}

/// One long poll; a claim it made, acked, and when it was acked (the
/// database's clock).
async fn poll_once(
    system: &System,
    env: &ClockEnv,
) -> anyhow::Result<Option<(Held, DateTime<Utc>)>> {
    let polled = system
        .call_with(
            Method::GET,
            &format!("/v1/environments/{}/work/poll?block_ms=900", env.id),
            &env.key,
            None,
            Duration::from_secs(30),
        )
        .await?;
    if polled.status != 200 || polled.body.is_null() {
        return Ok(None);
    }
    let id = polled.body["id"].as_str().unwrap_or_default().to_string();
    let secret = polled.body["secret"].as_str().unwrap_or_default();
    let token = mango_testkit::work::try_sessions_token(secret)?;
    system.secrets.lock().unwrap().push(secret.to_string());
    system.secrets.lock().unwrap().push(token.clone());
    let acked = system
        .call_with(
            Method::POST,
            &format!("/v1/environments/{}/work/{id}/ack", env.id),
            &env.key,
            None,
            Duration::from_secs(30),
        )
        .await?;
    anyhow::ensure!(
        acked.status == 200,
        "ack {id}: {} {}",
        acked.status,
        acked.body
    );
    let (at,): (Option<DateTime<Utc>>,) =
        sqlx::query_as("SELECT acknowledged_at FROM work WHERE id = $1")
            .bind(&id)
            .fetch_one(&system.db)
            .await?;
    let held = Held {
        work_id: id,
        token,
        last_heartbeat: "NO_HEARTBEAT".into(),
    };
    Ok(Some((held, at.unwrap_or_else(Utc::now))))
}

/// What an in-time heartbeat must leave: accepted, the item never claimed
/// again, and ended by its holder.
pub fn judge_in_time(
    work_id: &str,
    beat_status: u16,
    reclaimed: bool,
    end_status: u16,
    stored: &str,
) -> Vec<String> {
    let mut broken = Vec::new();
    if beat_status != 200 {
        broken.push(format!(
            "clock: {work_id}'s heartbeat sent {:.1} s before its lease expired got {beat_status}",
            BEFORE_EXPIRY.as_secs_f64()
        ));
    }
    if reclaimed {
        broken.push(format!(
            "clock: {work_id} was claimed again though its holder's heartbeat came in time"
        ));
    }
    if end_status != 200 || stored != "succeeded" {
        broken.push(format!(
            "clock: {work_id}'s holder ended it with {end_status}, its stored result {stored}"
        ));
    }
    broken
}

/// What a late heartbeat must leave: refused (never a server error), the
/// item claimed again within `bound` s of its last renewal, the new claim's
/// token accepted.
pub fn judge_late(
    work_id: &str,
    beat_status: u16,
    reclaim_secs: Option<f64>,
    bound: f64,
    new_beat_status: u16,
) -> Vec<String> {
    let mut broken = Vec::new();
    if !(400..500).contains(&beat_status) {
        broken.push(format!(
            "clock: {work_id}'s heartbeat sent {:.1} s after its lease expired got {beat_status}",
            AFTER_EXPIRY.as_secs_f64()
        ));
    }
    match reclaim_secs {
        None => broken.push(format!(
            "clock: {work_id} was not claimed again after its lease expired"
        )),
        Some(secs) if secs > bound => broken.push(format!(
            "clock: {work_id} was claimed again {secs:.1} s after its last renewal (bound {bound} s)"
        )),
        Some(_) if new_beat_status != 200 => broken.push(format!(
            "clock: the new claim of {work_id} heartbeat with {new_beat_status}"
        )),
        Some(_) => {}
    }
    broken
}

/// A heartbeat just before the edge keeps the lease.
async fn in_time(system: &Arc<System>, env: &ClockEnv, v: &mut Verdict) -> anyhow::Result<()> {
    probe::create_in(system, &env.id).await?;
    let mut held = probe::claim_in(system, &env.id, &env.key).await?;
    let poller = Poller::start(system, env);
    let edge = until_edge(system, &held.work_id, BEFORE_EXPIRY.as_secs_f64()).await?;
    let beat = probe::heartbeat_in(system, &env.id, &held).await?;
    held.last_heartbeat = beat.body["last_heartbeat"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let after = lease(system, &held.work_id).await?;
    if let Some(renewed) = after.renewed {
        println!(
            "faults: heartbeat-edge: a beat {:.3} s before expiry answered {}",
            (edge.expires - renewed).num_milliseconds() as f64 / 1000.0,
            beat.status
        );
    }
    // Past the old expiry, with the poller polling all along: had the beat
    // not counted, the item would be claimed again by now.
    let past = Duration::from_secs(2);
    loop {
        let row = lease(system, &held.work_id).await?;
        if row.now > edge.expires + chrono::Duration::from_std(past)? {
            break;
        }
        // Poll interval: a deadline bounded by the lease's TTL.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let again = probe::heartbeat_in(system, &env.id, &held).await?;
    let end = probe::result_in(system, &env.id, &held).await?;
    let (state, stored): (String, Option<String>) =
        sqlx::query_as("SELECT state, result_status FROM work WHERE id = $1")
            .bind(&held.work_id)
            .fetch_one(&system.db)
            .await?;
    let (claims, failures) = poller.finish().await;
    v.failures.extend(failures);
    let reclaimed = claims.iter().any(|(h, _)| h.work_id == held.work_id)
        || lease(system, &held.work_id)
            .await
            .map(|r| r.epoch != edge.epoch)
            .unwrap_or(false);
    let end_status = if again.status == 200 {
        end.status
    } else {
        again.status
    };
    let stored = if state == "stopped" {
        stored.unwrap_or_default()
    } else {
        state
    };
    v.failures.extend(judge_in_time(
        &held.work_id,
        beat.status,
        reclaimed,
        end_status,
        &stored,
    ));
    Ok(())
}

/// A heartbeat just past the edge is refused and the item reclaimed; with
/// `racing` the poller polls while the beat is sent, else it starts once
/// the beat was answered. The reclaim: its Work and seconds from the last
/// renewal.
async fn late(
    system: &Arc<System>,
    env: &ClockEnv,
    racing: bool,
    v: &mut Verdict,
) -> anyhow::Result<Option<(String, f64)>> {
    probe::create_in(system, &env.id).await?;
    let held = probe::claim_in(system, &env.id, &env.key).await?;
    let poller = racing.then(|| Poller::start(system, env));
    let edge = until_edge(system, &held.work_id, -AFTER_EXPIRY.as_secs_f64()).await?;
    let beat = probe::heartbeat_in(system, &env.id, &held).await?;
    println!(
        "faults: heartbeat-edge: a beat {:.1} s after expiry ({}) answered {}",
        AFTER_EXPIRY.as_secs_f64(),
        if racing {
            "the poller polling"
        } else {
            "nobody polling"
        },
        beat.status
    );
    let poller = poller.unwrap_or_else(|| Poller::start(system, env));
    let bound = system.settings.ttl_seconds as f64 + RECLAIM_DELAY.as_secs_f64();
    let renewed = edge.renewed.unwrap_or(edge.now);
    let deadline = Instant::now() + RECLAIM_DELAY + Duration::from_secs(5);
    let claimed = loop {
        if let Some(c) = poller.claimed(&held.work_id) {
            break Some(c);
        }
        if Instant::now() >= deadline {
            break None;
        }
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let reclaim = claimed
        .as_ref()
        .map(|(_, at)| (*at - renewed).num_milliseconds() as f64 / 1000.0);
    let new_beat = match &claimed {
        Some((new, _)) => probe::heartbeat_in(system, &env.id, new).await?.status,
        None => 0,
    };
    v.failures.extend(judge_late(
        &held.work_id,
        beat.status,
        reclaim,
        bound,
        new_beat,
    ));
    // The late holder's token, from then on: its beat and its Result.
    let old_beat = probe::heartbeat_in(system, &env.id, &held).await?;
    invariants::judge_old_token(&held.work_id, old_beat.status, &old_beat.body, v);
    let old_result = probe::result_in(system, &env.id, &held).await?;
    invariants::judge_old_token(&held.work_id, old_result.status, &old_result.body, v);
    if let Some((new, _)) = &claimed {
        let mut new = new.clone();
        let beat = probe::heartbeat_in(system, &env.id, &new).await?;
        new.last_heartbeat = beat.body["last_heartbeat"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let end = probe::result_in(system, &env.id, &new).await?;
        if end.status != 200 {
            v.failures.push(format!(
                "clock: the new claim of {} could not end it: {} {}",
                held.work_id, end.status, end.body
            ));
        }
    }
    let old_after = probe::heartbeat_in(system, &env.id, &held).await?;
    invariants::judge_old_token(&held.work_id, old_after.status, &old_after.body, v);
    let (_, failures) = poller.finish().await;
    v.failures.extend(failures);
    Ok(claimed.map(|_| (held.work_id.clone(), reclaim.unwrap_or_default())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_in_time_beat_refused_or_its_item_reclaimed_breaks_the_lease() {
        assert!(judge_in_time("w", 200, false, 200, "succeeded").is_empty());
        assert_eq!(judge_in_time("w", 409, false, 200, "succeeded").len(), 1);
        assert_eq!(judge_in_time("w", 200, true, 200, "succeeded").len(), 1);
        assert_eq!(judge_in_time("w", 200, false, 401, "succeeded").len(), 1);
        assert_eq!(judge_in_time("w", 200, false, 200, "active").len(), 1);
    }

    #[test]
    fn a_late_beat_accepted_or_a_slow_or_missing_reclaim_breaks_the_lease() {
        assert!(judge_late("w", 409, Some(15.4), 25.0, 200).is_empty());
        assert!(judge_late("w", 401, Some(15.1), 25.0, 200).is_empty());
        // Accepted past its expiry; a server error.
        assert_eq!(judge_late("w", 200, Some(15.4), 25.0, 200).len(), 1);
        assert_eq!(judge_late("w", 503, Some(15.4), 25.0, 200).len(), 1);
        // Never reclaimed, reclaimed late, a new claim that cannot beat.
        assert_eq!(judge_late("w", 409, None, 25.0, 0).len(), 1);
        assert_eq!(judge_late("w", 409, Some(25.5), 25.0, 200).len(), 1);
        assert_eq!(judge_late("w", 409, Some(15.4), 25.0, 409).len(), 1);
    }
}
