//! The load a scenario's fault lands in: Sessions whose turns call `bash`
//! (through the model endpoint, the api's agent loop and a runner in a
//! sandbox) and healthchecks, driven over HTTP as an operator would, with
//! a client that fails over between the api processes.

use super::system::System;
use mango_protocol::events::types;
use reqwest::Method;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Spec {
    /// Sessions, each with one turn of `calls` calls of `command`.
    pub sessions: usize,
    pub calls: usize,
    /// `{n}` is the call's number in its turn.
    pub command: String,
    /// Healthchecks, created one by one across the load.
    pub checks: usize,
    /// How long a turn or a check may take before it counts as lost.
    pub within: Duration,
}

/// What the load sent, for the invariants to find again.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// Each Session and the marker of the one message it was sent.
    pub turns: Vec<(String, String)>,
    pub checks: Vec<String>,
    /// What went wrong while driving it (a turn that never ended, …).
    pub failures: Vec<String>,
}

impl Record {
    pub fn merge(&mut self, other: Record) {
        self.turns.extend(other.turns);
        self.checks.extend(other.checks);
        self.failures.extend(other.failures);
    }
}

/// Starts the load; the handle's record is complete once every turn ended
/// and every check stopped (or their time ran out).
pub fn start(system: Arc<System>, spec: Spec) -> tokio::task::JoinHandle<Record> {
    tokio::spawn(async move {
        let mut tasks = Vec::new();
        for _ in 0..spec.sessions {
            let (system, spec) = (system.clone(), spec.clone());
            tasks.push(tokio::spawn(async move { one_turn(&system, &spec).await }));
        }
        let checks = {
            let (system, spec) = (system.clone(), spec.clone());
            tokio::spawn(async move { checks(&system, &spec).await })
        };
        let mut record = Record::default();
        for task in tasks {
            match task.await {
                Ok(r) => record.merge(r),
                Err(err) => record
                    .failures
                    .push(format!("a Session's driver panicked: {err}")),
            }
        }
        match checks.await {
            Ok(r) => record.merge(r),
            Err(err) => record
                .failures
                .push(format!("the healthcheck driver panicked: {err}")),
        }
        record
    })
}

async fn one_turn(system: &System, spec: &Spec) -> Record {
    let mut record = Record::default();
    if let Err(err) = drive_turn(system, spec, &mut record).await {
        record.failures.push(format!("{err:#}"));
    }
    record
}

/// A new Session of the suite's Agent in its Environment; its id.
pub async fn open_session(system: &System) -> anyhow::Result<String> {
    let body = json!({"agent": system.agent_id, "environment_id": system.env_id});
    let session = system
        .expect(Method::POST, "/v1/sessions", Some(&body), 200)
        .await?;
    Ok(session["id"].as_str().unwrap_or_default().to_string())
}

async fn drive_turn(system: &System, spec: &Spec, record: &mut Record) -> anyhow::Result<()> {
    let session = open_session(system).await?;
    let marker = format!("m{:016x}", rand::random::<u64>());
    record.turns.push((session.clone(), marker.clone()));
    let text = format!("fault {marker} calls={} cmd={}", spec.calls, spec.command);
    send_once(system, &session, &marker, &text).await?;
    let deadline = Instant::now() + spec.within;
    loop {
        let events = events(system, &session).await?;
        if turn_ended(&events, &marker) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the turn of Session {session} did not end within {:?}; its events: {:?}",
            spec.within,
            events
                .iter()
                .map(|e| e["type"].as_str().unwrap_or("?"))
                .collect::<Vec<_>>()
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Sends the message; a send whose answer was lost is looked for in the
/// log before it is sent again, so a retry never doubles it.
pub async fn send_once(
    system: &System,
    session: &str,
    marker: &str,
    text: &str,
) -> anyhow::Result<()> {
    let body = json!({"events": [{"type": types::USER_MESSAGE, "content": [{"type": "text", "text": text}]}]});
    let path = format!("/v1/sessions/{session}/events");
    for _ in 0..10 {
        match system
            .call_with(
                Method::POST,
                &path,
                &system.ws_key,
                Some(&body),
                Duration::ZERO,
            )
            .await
        {
            Ok(r) if r.status == 200 => return Ok(()),
            Ok(r) if r.status < 500 => {
                anyhow::bail!("sending to {session}: {} {}", r.status, r.body)
            }
            _ => {}
        }
        // Between attempts: the api process or the database is coming back.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(events) = events(system, session).await {
            if events.iter().any(|e| message_marker(e) == Some(marker)) {
                return Ok(());
            }
        }
    }
    anyhow::bail!("could not send to Session {session} in 10 attempts")
}

pub fn message_marker(event: &Value) -> Option<&str> {
    if event["type"] != types::USER_MESSAGE {
        return None;
    }
    let text = event["content"][0]["text"].as_str()?;
    text.split_whitespace().nth(1)
}

/// The Session went idle with `end_turn` after the message with `marker`,
/// or was terminated.
pub fn turn_ended(events: &[Value], marker: &str) -> bool {
    let Some(at) = events
        .iter()
        .position(|e| message_marker(e) == Some(marker))
    else {
        return false;
    };
    events[at..].iter().any(|e| {
        (e["type"] == types::SESSION_STATUS_IDLE && e["stop_reason"]["type"] == "end_turn")
            || e["type"] == types::SESSION_STATUS_TERMINATED
    })
}

/// Every event of the Session, oldest first, over the api.
pub async fn events(system: &System, session: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut page: Option<String> = None;
    loop {
        let query = match &page {
            Some(p) => format!("?limit=1000&page={}", mango_testkit::urlencode(p)),
            None => "?limit=1000".to_string(),
        };
        let body = system
            .expect(
                Method::GET,
                &format!("/v1/sessions/{session}/events{query}"),
                None,
                200,
            )
            .await?;
        out.extend(body["data"].as_array().cloned().unwrap_or_default());
        match body["next_page"].as_str() {
            Some(p) if !p.is_empty() => page = Some(p.to_string()),
            _ => return Ok(out),
        }
    }
}

async fn checks(system: &System, spec: &Spec) -> Record {
    let mut record = Record::default();
    let path = format!("/v1/environments/{}/work", system.env_id);
    let body = json!({"data": {"type": "healthcheck"}});
    for _ in 0..spec.checks {
        match system.expect(Method::POST, &path, Some(&body), 201).await {
            Ok(work) => record
                .checks
                .push(work["id"].as_str().unwrap_or_default().to_string()),
            Err(err) => record
                .failures
                .push(format!("creating a healthcheck: {err:#}")),
        }
        // Spread across the load, so that checks meet the fault too.
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let deadline = Instant::now() + spec.within;
    for id in record.checks.clone() {
        loop {
            let work = system
                .expect(Method::GET, &format!("{path}/{id}"), None, 200)
                .await;
            match work {
                Ok(w) if w["state"] == "stopped" => {
                    if w["result"]["status"] != "succeeded" {
                        record
                            .failures
                            .push(format!("healthcheck {id} ended {}", w["result"]));
                    }
                    break;
                }
                _ if Instant::now() >= deadline => {
                    record.failures.push(format!(
                        "healthcheck {id} did not stop within {:?}",
                        spec.within
                    ));
                    break;
                }
                _ => {}
            }
            // Poll interval of this deadline loop.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    record
}

/// Ends the activations of `sessions` (forced Stop), waits until their Work
/// stopped, and deletes them; what could not be done.
pub async fn end_sessions(system: &System, sessions: &[String]) -> Vec<String> {
    let mut failures = Vec::new();
    for session in sessions {
        let live: Vec<(String,)> =
            sqlx::query_as("SELECT id FROM work WHERE session_id = $1 AND state <> 'stopped'")
                .bind(session)
                .fetch_all(&system.db)
                .await
                .unwrap_or_default();
        for (id,) in live {
            let path = format!("/v1/environments/{}/work/{id}/stop", system.env_id);
            if let Err(err) = system
                .call(Method::POST, &path, Some(&json!({"force": true})))
                .await
            {
                failures.push(format!("stopping {id}: {err:#}"));
            }
        }
        let reply = system
            .call(Method::DELETE, &format!("/v1/sessions/{session}"), None)
            .await;
        match reply {
            Ok(r) if r.status == 200 => {}
            Ok(r) => failures.push(format!("deleting {session}: {} {}", r.status, r.body)),
            Err(err) => failures.push(format!("deleting {session}: {err:#}")),
        }
    }
    failures
}
