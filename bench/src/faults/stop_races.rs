//! The `stop-races` scenario, played by the suite as a worker of its probe
//! Environment while the load runs: an operator's forced Stop sent at the
//! same moment as the holder's Result, and at the same moment as a Poll
//! that reclaims the item's expired lease. Whichever wins, the item ends
//! stopped, a Result the api accepted is the one stored (and one it
//! refused is not), and every token of a claim that ended gets 401.

use super::invariants::{self, Promises, Verdict};
use super::probe::{self, Held};
use super::scenarios::{self, Outcome};
use super::system::System;
use reqwest::Method;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long each Stop-versus-Result race holds its Result back, so that
/// either side wins some (each race costs a claim).
const RESULT_DELAYS_MS: [u64; 4] = [0, 10, 25, 50];
/// How long each Stop-versus-reclaim race holds its Stop back (each waits
/// out a TTL).
const RECLAIM_DELAYS_MS: [u64; 2] = [0, 50];

pub async fn run(system: &Arc<System>) -> anyhow::Result<Outcome> {
    let s = system.clone();
    let broken: Arc<Mutex<Verdict>> = Arc::default();
    let out = broken.clone();
    let mut outcome = scenarios::frame(
        system,
        scenarios::spec(2, 1, "sleep 2; echo call {n}"),
        Promises::default(),
        Box::pin(async move {
            let mut v = Verdict::default();
            for delay in RESULT_DELAYS_MS {
                stop_against_result(&s, Duration::from_millis(delay), &mut v).await?;
            }
            for delay in RECLAIM_DELAYS_MS {
                stop_against_reclaim(&s, Duration::from_millis(delay), &mut v).await?;
            }
            *out.lock().unwrap() = v;
            Ok(())
        }),
    )
    .await?;
    let v = std::mem::take(&mut *broken.lock().unwrap());
    outcome.verdict.failures.extend(v.failures);
    Ok(outcome)
}

/// The Work as the api shows it to an operator.
async fn work(system: &System, id: &str) -> anyhow::Result<Value> {
    let path = format!("/v1/environments/{}/work/{id}", system.probe_env_id);
    system.expect(Method::GET, &path, None, 200).await
}

/// A forced Stop, and a Result `delay` after it.
async fn stop_against_result(
    system: &System,
    delay: Duration,
    v: &mut Verdict,
) -> anyhow::Result<()> {
    probe::create(system).await?;
    let held = probe::claim(system).await?;
    let (result, stop) = tokio::join!(
        async {
            // The race's handicap: how far behind the Stop the Result starts.
            tokio::time::sleep(delay).await;
            probe::result(system, &held).await
        },
        probe::stop(system, &held.work_id)
    );
    let (result, stop) = (result?, stop?);
    let w = work(system, &held.work_id).await?;
    println!(
        "faults: stop-races: Result {} / Stop {}: stored {}",
        result.status, stop.status, w["result"]["status"]
    );
    v.failures.extend(judge_stop_against_result(
        &held.work_id,
        result.status,
        stop.status,
        &w,
    ));
    let beat = probe::heartbeat(system, &held).await?;
    invariants::judge_old_token(&held.work_id, beat.status, &beat.body, v);
    Ok(())
}

/// What a Stop racing a Result must leave: the item stopped, both answered
/// without a server error, and the stored result the Result's exactly when
/// the api accepted it.
pub fn judge_stop_against_result(
    id: &str,
    result_status: u16,
    stop_status: u16,
    work: &Value,
) -> Vec<String> {
    let mut broken = Vec::new();
    if result_status >= 500 || stop_status >= 500 {
        broken.push(format!(
            "race: {id}'s Result answered {result_status} and its Stop {stop_status}"
        ));
    }
    if work["state"] != "stopped" {
        broken.push(format!(
            "race: {id} is {} after a Result and a forced Stop",
            work["state"]
        ));
    }
    let stored = work["result"]["status"].as_str().unwrap_or("none");
    let accepted = result_status < 300;
    if accepted != (stored == "succeeded") {
        broken.push(format!(
            "race: {id}'s Result answered {result_status}, yet its stored result is {stored}"
        ));
    }
    broken
}

/// A lease left to expire, then a Poll (which may reclaim it) and a forced
/// Stop `delay` after it.
async fn stop_against_reclaim(
    system: &System,
    delay: Duration,
    v: &mut Verdict,
) -> anyhow::Result<()> {
    probe::create(system).await?;
    let held = probe::claim(system).await?;
    let ttl = Duration::from_secs(system.settings.ttl_seconds);
    let deadline = Instant::now() + ttl * 2;
    loop {
        let (expired,): (bool,) =
            sqlx::query_as("SELECT lease_expires_at < now() FROM work WHERE id = $1")
                .bind(&held.work_id)
                .fetch_one(&system.db)
                .await?;
        if expired {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the probe lease of {} did not expire",
            held.work_id
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let poll_path = format!("/v1/environments/{}/work/poll", system.probe_env_id);
    let (polled, stop) = tokio::join!(
        system.call_with(
            Method::GET,
            &poll_path,
            &system.probe_env_key,
            None,
            Duration::from_secs(30),
        ),
        async {
            // The race's handicap: how far behind the Poll the Stop starts.
            tokio::time::sleep(delay).await;
            probe::stop(system, &held.work_id).await
        }
    );
    let (polled, stop) = (polled?, stop?);
    if stop.status >= 300 {
        v.failures.push(format!(
            "race: the Stop of {} racing a reclaim answered {} {}",
            held.work_id, stop.status, stop.body
        ));
    }
    let reclaimed = polled.status == 200 && polled.body["id"] == held.work_id.as_str();
    println!(
        "faults: stop-races: Poll {} ({}) / Stop {}",
        polled.status,
        if reclaimed {
            "reclaimed the item"
        } else {
            "not the item"
        },
        stop.status
    );
    if reclaimed {
        let secret = polled.body["secret"].as_str().unwrap_or_default();
        let token = mango_testkit::work::try_sessions_token(secret)?;
        system.secrets.lock().unwrap().push(secret.to_string());
        system.secrets.lock().unwrap().push(token.clone());
        // The new claim, stopped by the Stop that followed it or refused
        // by the Stop that came first: it must not hold the item.
        let new = Held {
            work_id: held.work_id.clone(),
            token,
            last_heartbeat: "NO_HEARTBEAT".into(),
        };
        let acked = system
            .call_with(
                Method::POST,
                &format!(
                    "/v1/environments/{}/work/{}/ack",
                    system.probe_env_id, held.work_id
                ),
                &system.probe_env_key,
                None,
                Duration::from_secs(30),
            )
            .await?;
        let beat = probe::heartbeat(system, &new).await?;
        if acked.status == 200 && beat.status == 200 {
            v.failures.push(format!(
                "race: {}'s claim made as it was stopped was acked and heartbeat ({})",
                held.work_id, beat.body
            ));
        }
    }
    // A forced Stop has zero grace: stopped at once, or once the lease it
    // found lapses.
    let deadline = Instant::now() + ttl + super::watch::RECLAIM_DELAY;
    loop {
        let w = work(system, &held.work_id).await?;
        if w["state"] == "stopped" {
            break;
        }
        if Instant::now() >= deadline {
            v.failures.push(format!(
                "race: {} is {} long after a Stop raced its reclaim",
                held.work_id, w["state"]
            ));
            break;
        }
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let beat = probe::heartbeat(system, &held).await?;
    invariants::judge_old_token(&held.work_id, beat.status, &beat.body, v);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_accepted_result_must_be_the_stored_one() {
        let succeeded = json!({"state": "stopped", "result": {"status": "succeeded"}});
        let cancelled = json!({"state": "stopped", "result": {"status": "cancelled"}});
        assert!(judge_stop_against_result("w", 200, 200, &succeeded).is_empty());
        assert!(judge_stop_against_result("w", 409, 200, &cancelled).is_empty());
        // Accepted, then lost to the Stop; refused, yet stored.
        assert_eq!(
            judge_stop_against_result("w", 200, 200, &cancelled).len(),
            1
        );
        assert_eq!(
            judge_stop_against_result("w", 409, 200, &succeeded).len(),
            1
        );
    }

    #[test]
    fn a_live_item_or_a_server_error_breaks_the_race() {
        let active = json!({"state": "active", "result": null});
        assert_eq!(judge_stop_against_result("w", 409, 200, &active).len(), 1);
        let succeeded = json!({"state": "stopped", "result": {"status": "succeeded"}});
        assert_eq!(
            judge_stop_against_result("w", 200, 500, &succeeded).len(),
            1
        );
    }
}
