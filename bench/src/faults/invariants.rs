//! The invariants every scenario ends with, read back from the whole event
//! log and every Work row of its Sessions (SQL on the suite's database),
//! the tokens the suite held, the sandboxes left and every log line of
//! every process.

use super::load::{message_marker, Record};
use super::probe::{self, Held};
use super::sandboxes;
use super::system::System;
use mango_protocol::events::types;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

#[derive(Default, Debug)]
pub struct Verdict {
    pub lost: usize,
    pub doubled: usize,
    pub leaked: usize,
    pub secret_lines: usize,
    /// Each broken invariant, named.
    pub failures: Vec<String>,
}

impl Verdict {
    fn lost(&mut self, why: String) {
        self.lost += 1;
        self.failures.push(format!("lost: {why}"));
    }
    fn doubled(&mut self, why: String) {
        self.doubled += 1;
        self.failures.push(format!("doubled: {why}"));
    }
}

/// What a scenario promises beyond the common invariants.
#[derive(Clone, Copy, Default)]
pub struct Promises {
    /// Every tool result is a success (nothing was interrupted).
    pub clean_results: bool,
}

/// Events, tool calls and Work of the load's Sessions: nothing lost,
/// nothing doubled, each call answered at most once and, unless its
/// Session ended, exactly once.
pub async fn check_sessions(
    system: &System,
    record: &Record,
    promises: Promises,
    v: &mut Verdict,
) -> anyhow::Result<()> {
    for (session, marker) in &record.turns {
        let (last_seq, status): (i64, String) =
            sqlx::query_as("SELECT last_seq, status FROM sessions WHERE id = $1")
                .bind(session)
                .fetch_one(&system.db)
                .await?;
        let rows: Vec<(i64, String, Value)> = sqlx::query_as(
            "SELECT seq, type, body FROM session_events WHERE session_id = $1 ORDER BY seq",
        )
        .bind(session)
        .fetch_all(&system.db)
        .await?;
        let seqs: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let expected: Vec<i64> = (1..=last_seq).collect();
        if seqs != expected {
            v.lost(format!(
                "{session}'s event log has seqs {seqs:?}, its last_seq is {last_seq}"
            ));
        }
        let events: Vec<&Value> = rows.iter().map(|r| &r.2).collect();
        match events
            .iter()
            .filter(|e| message_marker(e) == Some(marker))
            .count()
        {
            0 => v.lost(format!("{session}'s message {marker} is not in its log")),
            1 => {}
            n => v.doubled(format!(
                "{session}'s message {marker} is in its log {n} times"
            )),
        }
        let mut answers: HashMap<&str, Vec<&Value>> = HashMap::new();
        for e in &events {
            if e["type"] == types::USER_TOOL_RESULT {
                if let Some(call) = e["tool_use_id"].as_str() {
                    answers.entry(call).or_default().push(e);
                }
            }
        }
        let ended = status == "terminated";
        for call in events.iter().filter(|e| e["type"] == types::AGENT_TOOL_USE) {
            let id = call["id"].as_str().unwrap_or_default();
            let results = answers.get(id).map(Vec::as_slice).unwrap_or_default();
            match results.len() {
                0 if !ended => v.lost(format!("{session}'s call {id} was never answered")),
                0 | 1 => {}
                n => v.doubled(format!("{session}'s call {id} was answered {n} times")),
            }
            if promises.clean_results {
                for r in results {
                    if r["is_error"] == true {
                        v.failures.push(format!(
                            "interrupted: {session}'s call {id} was answered with an error: {}",
                            r["content"]
                        ));
                    }
                }
            }
        }
        let calls_made = events
            .iter()
            .filter(|e| e["type"] == types::AGENT_TOOL_USE)
            .count();
        if calls_made == 0 && !ended {
            v.lost(format!("{session}'s turn made no call"));
        }
    }
    for failure in &record.failures {
        v.lost(format!("the load: {failure}"));
    }
    Ok(())
}

/// Every token the suite held, whose Work has stopped or been claimed
/// again, is refused with 401.
pub async fn check_tokens(system: &System, held: &[Held], v: &mut Verdict) -> anyhow::Result<()> {
    for h in held {
        let beat = probe::heartbeat(system, h).await?;
        if beat.status != 401 {
            v.failures.push(format!(
                "old token: a token of {} got {} (not 401) after its claim ended: {}",
                h.work_id, beat.status, beat.body
            ));
        }
    }
    Ok(())
}

/// Once the scenario's Sessions are deleted, no container, volume or
/// workspace of theirs is left (within `within`: the supervisors' sweep).
pub async fn check_leftovers(
    system: &System,
    sessions: &HashSet<String>,
    within: Duration,
    v: &mut Verdict,
) {
    let deadline = Instant::now() + within;
    loop {
        let left = sandboxes::leftovers(&system.docker, &system.local_root(), sessions).await;
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            v.leaked += left.len();
            v.failures.push(format!(
                "leaked: {} {within:?} after their Sessions were deleted: {left:?}",
                left.len()
            ));
            return;
        }
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Lines of any process's log that hold a secret the suite made or saw, or
/// anything shaped like a sessions token or a Work secret.
pub fn check_logs(system: &System, v: &mut Verdict) {
    let secrets: Vec<String> = system.secrets.lock().unwrap().clone();
    // `{"sessions_token":` as URL-safe base64: the start of every Work secret.
    const WORK_SECRET_START: &str = "eyJzZXNzaW9uc190b2tlbiI";
    for (path, text) in system.all_logs() {
        for (n, line) in text.lines().enumerate() {
            let shaped = line.contains(WORK_SECRET_START) || has_sessions_token(line);
            if shaped
                || secrets
                    .iter()
                    .any(|s| !s.is_empty() && line.contains(s.as_str()))
            {
                v.secret_lines += 1;
                if v.secret_lines <= 5 {
                    v.failures
                        .push(format!("secret in a log: {}:{}", path.display(), n + 1));
                }
            }
        }
    }
}

/// `mango_st_` followed by a token's 43 URL-safe base64 characters.
fn has_sessions_token(line: &str) -> bool {
    line.match_indices(mango_api::ids::SESSIONS_TOKEN_PREFIX)
        .any(|(at, p)| {
            line[at + p.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .count()
                >= 43
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sessions_token_is_recognised_and_its_prefix_alone_is_not() {
        let token = mango_api::ids::new_secret(mango_api::ids::SESSIONS_TOKEN_PREFIX);
        assert!(super::has_sessions_token(&format!("token={token} end")));
        assert!(!super::has_sessions_token(
            "tokens start with mango_st_ and more"
        ));
    }
}
