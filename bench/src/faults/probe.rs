//! The suite as a worker of its own Environment (which no supervisor
//! polls): it claims healthchecks, heartbeats them and ends them by Result
//! or by an operator's Stop, keeping every token it held, so that the
//! invariants can show each old token refused. The lease races (a Stop
//! racing a Result, a Stop racing a reclaim, a heartbeat at the edge of its
//! TTL) are played here too.

use super::system::System;
use reqwest::Method;
use serde_json::json;
use std::time::Duration;

/// A claim the suite held.
#[derive(Clone, Debug)]
pub struct Held {
    pub work_id: String,
    pub token: String,
    pub last_heartbeat: String,
}

fn work_path(env_id: &str, rest: &str) -> String {
    format!("/v1/environments/{env_id}/work{rest}")
}

/// Creates a healthcheck in the probe Environment; its id.
pub async fn create(system: &System) -> anyhow::Result<String> {
    create_in(system, &system.probe_env_id).await
}

/// Creates a healthcheck in Environment `env_id`; its id.
pub async fn create_in(system: &System, env_id: &str) -> anyhow::Result<String> {
    let body = json!({"data": {"type": "healthcheck"}});
    let work = system
        .expect(Method::POST, &work_path(env_id, ""), Some(&body), 201)
        .await?;
    Ok(work["id"].as_str().unwrap_or_default().to_string())
}

/// Polls, acks and claims the lease of the oldest available item.
pub async fn claim(system: &System) -> anyhow::Result<Held> {
    claim_in(system, &system.probe_env_id, &system.probe_env_key).await
}

/// [`claim`] in Environment `env_id`, with its key.
pub async fn claim_in(system: &System, env_id: &str, key: &str) -> anyhow::Result<Held> {
    let key = key.to_string();
    // A poll whose answer was lost leaves a pending claim, polled again
    // once it is older than `reclaim_older_than_ms` (5 s).
    let mut attempts = 0;
    let polled = loop {
        let polled = system
            .call_with(
                Method::GET,
                &work_path(env_id, "/poll?block_ms=900"),
                &key,
                None,
                Duration::from_secs(30),
            )
            .await?;
        attempts += 1;
        if (polled.status == 200 && !polled.body.is_null()) || attempts >= 15 {
            break polled;
        }
    };
    anyhow::ensure!(
        polled.status == 200 && !polled.body.is_null(),
        "poll: {} {}",
        polled.status,
        polled.body
    );
    let id = polled.body["id"].as_str().unwrap_or_default().to_string();
    let secret = polled.body["secret"].as_str().unwrap_or_default();
    let token = mango_testkit::work::try_sessions_token(secret)?;
    system.secrets.lock().unwrap().push(token.clone());
    system.secrets.lock().unwrap().push(secret.to_string());
    let acked = system
        .call_with(
            Method::POST,
            &work_path(env_id, &format!("/{id}/ack")),
            &key,
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
    let mut held = Held {
        work_id: id,
        token,
        last_heartbeat: "NO_HEARTBEAT".into(),
    };
    let beat = heartbeat_in(system, env_id, &held).await?;
    anyhow::ensure!(
        beat.status == 200,
        "first heartbeat: {} {}",
        beat.status,
        beat.body
    );
    held.last_heartbeat = beat.body["last_heartbeat"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok(held)
}

pub async fn heartbeat(system: &System, held: &Held) -> anyhow::Result<super::system::Reply> {
    heartbeat_in(system, &system.probe_env_id, held).await
}

/// [`heartbeat`] of an item of Environment `env_id`.
pub async fn heartbeat_in(
    system: &System,
    env_id: &str,
    held: &Held,
) -> anyhow::Result<super::system::Reply> {
    let path = work_path(
        env_id,
        &format!(
            "/{}/heartbeat?expected_last_heartbeat={}",
            held.work_id,
            mango_testkit::urlencode(&held.last_heartbeat)
        ),
    );
    system
        .call_with(
            Method::POST,
            &path,
            &held.token,
            None,
            Duration::from_secs(30),
        )
        .await
}

pub async fn result(system: &System, held: &Held) -> anyhow::Result<super::system::Reply> {
    result_in(system, &system.probe_env_id, held).await
}

/// [`result`] of an item of Environment `env_id`.
pub async fn result_in(
    system: &System,
    env_id: &str,
    held: &Held,
) -> anyhow::Result<super::system::Reply> {
    let body =
        json!({"status": "succeeded", "message": "Sandbox process and workspace check passed"});
    system
        .call_with(
            Method::POST,
            &work_path(env_id, &format!("/{}/result", held.work_id)),
            &held.token,
            Some(&body),
            Duration::from_secs(30),
        )
        .await
}

/// An operator's forced Stop (Workspace key).
pub async fn stop(system: &System, work_id: &str) -> anyhow::Result<super::system::Reply> {
    system
        .call_with(
            Method::POST,
            &work_path(&system.probe_env_id, &format!("/{work_id}/stop")),
            &system.ws_key,
            Some(&json!({"force": true})),
            Duration::from_secs(30),
        )
        .await
}

/// Claims `rounds` checks one after another while a scenario runs, ending
/// each by Result or (every other one) an operator's Stop; every token held.
pub async fn cycle(system: &System, rounds: usize) -> (Vec<Held>, Vec<String>) {
    let mut held = Vec::new();
    let mut failures = Vec::new();
    for round in 0..rounds {
        let outcome = async {
            create(system).await?;
            let h = claim(system).await?;
            held.push(h.clone());
            let beat = heartbeat(system, &h).await?;
            anyhow::ensure!(
                beat.status == 200,
                "heartbeat: {} {}",
                beat.status,
                beat.body
            );
            let end = if round % 2 == 0 {
                result(system, &h).await?
            } else {
                stop(system, &h.work_id).await?
            };
            anyhow::ensure!(
                end.status < 300,
                "ending {}: {} {}",
                h.work_id,
                end.status,
                end.body
            );
            anyhow::Ok(())
        }
        .await;
        if let Err(err) = outcome {
            failures.push(format!("probe round {round}: {err:#}"));
        }
    }
    (held, failures)
}
