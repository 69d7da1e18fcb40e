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
    /// A turn may end without a call (its model call failed for good).
    pub no_calls: bool,
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
    // A Session sent several messages is judged once, with all its markers.
    let mut markers: Vec<(&str, Vec<&str>)> = Vec::new();
    for (session, marker) in &record.turns {
        match markers.iter_mut().find(|(s, _)| *s == session.as_str()) {
            Some((_, m)) => m.push(marker),
            None => markers.push((session, vec![marker])),
        }
    }
    for (session, markers) in markers {
        let (last_seq, status): (i64, String) =
            sqlx::query_as("SELECT last_seq, status FROM sessions WHERE id = $1")
                .bind(session)
                .fetch_one(&system.db)
                .await?;
        let rows: Vec<(i64, Value)> = sqlx::query_as(
            "SELECT seq, body FROM session_events WHERE session_id = $1 ORDER BY seq",
        )
        .bind(session)
        .fetch_all(&system.db)
        .await?;
        let log = SessionLog {
            session,
            last_seq,
            ended: status == "terminated",
            rows: &rows,
        };
        judge_session(&log, &markers, promises, v);
    }
    for failure in &record.failures {
        v.lost(format!("the load: {failure}"));
    }
    Ok(())
}

/// One Session's event log as stored: each event's seq and body.
pub struct SessionLog<'a> {
    pub session: &'a str,
    pub last_seq: i64,
    /// Terminated: a call it made may stay unanswered.
    pub ended: bool,
    pub rows: &'a [(i64, Value)],
}

/// The invariants of one Session's log, given the markers of the messages
/// the load sent it.
pub fn judge_session(log: &SessionLog, markers: &[&str], promises: Promises, v: &mut Verdict) {
    let session = log.session;
    let seqs: Vec<i64> = log.rows.iter().map(|r| r.0).collect();
    let expected: Vec<i64> = (1..=log.last_seq).collect();
    if seqs != expected {
        v.lost(format!(
            "{session}'s event log has seqs {seqs:?}, its last_seq is {}",
            log.last_seq
        ));
    }
    let events: Vec<&Value> = log.rows.iter().map(|r| &r.1).collect();
    for marker in markers {
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
    }
    let mut answers: HashMap<&str, Vec<&Value>> = HashMap::new();
    for e in &events {
        if e["type"] == types::USER_TOOL_RESULT {
            if let Some(call) = e["tool_use_id"].as_str() {
                answers.entry(call).or_default().push(e);
            }
        }
    }
    let calls: Vec<&&Value> = events
        .iter()
        .filter(|e| e["type"] == types::AGENT_TOOL_USE)
        .collect();
    for call in &calls {
        let id = call["id"].as_str().unwrap_or_default();
        let results = answers.get(id).map(Vec::as_slice).unwrap_or_default();
        match results.len() {
            0 if !log.ended => v.lost(format!("{session}'s call {id} was never answered")),
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
    let ids: HashSet<&str> = calls.iter().filter_map(|c| c["id"].as_str()).collect();
    for id in answers.keys().filter(|id| !ids.contains(*id)) {
        v.doubled(format!(
            "{session} has a result for {id}, a call it never made"
        ));
    }
    if calls.is_empty() && !log.ended && !promises.no_calls {
        v.lost(format!("{session}'s turn made no call"));
    }
}

/// Every token the suite held, whose Work has stopped or been claimed
/// again, is refused with 401.
pub async fn check_tokens(system: &System, held: &[Held], v: &mut Verdict) -> anyhow::Result<()> {
    for h in held {
        let beat = probe::heartbeat(system, h).await?;
        judge_old_token(&h.work_id, beat.status, &beat.body, v);
    }
    Ok(())
}

/// An old token's answer: anything but 401 breaks the invariant.
pub fn judge_old_token(work_id: &str, status: u16, body: &Value, v: &mut Verdict) {
    if status != 401 {
        v.failures.push(format!(
            "old token: a token of {work_id} got {status} (not 401) after its claim ended: {body}"
        ));
    }
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
        let left = sandboxes::leftovers(
            &system.docker,
            &system.settings.names,
            &system.local_root(),
            sessions,
        )
        .await;
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
    judge_logs(&system.all_logs(), &secrets, v);
}

/// [`check_logs`] over the logs' paths and texts.
pub fn judge_logs(logs: &[(std::path::PathBuf, String)], secrets: &[String], v: &mut Verdict) {
    // `{"sessions_token":` as URL-safe base64: the start of every Work secret.
    const WORK_SECRET_START: &str = "eyJzZXNzaW9uc190b2tlbiI";
    for (path, text) in logs {
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
    use super::*;
    use serde_json::json;

    fn message(marker: &str) -> Value {
        json!({"type": types::USER_MESSAGE,
               "content": [{"type": "text", "text": format!("fault {marker} calls=1 cmd=true")}]})
    }
    fn call(id: &str) -> Value {
        json!({"type": types::AGENT_TOOL_USE, "id": id, "name": "bash"})
    }
    fn answer(id: &str, is_error: bool) -> Value {
        json!({"type": types::USER_TOOL_RESULT, "tool_use_id": id, "is_error": is_error,
               "content": [{"type": "text", "text": "ok"}]})
    }

    /// The verdict on a log of `events` (seqs 1.., last_seq their count).
    fn judged(events: Vec<Value>, ended: bool, promises: Promises) -> Verdict {
        let rows: Vec<(i64, Value)> = events
            .into_iter()
            .enumerate()
            .map(|(i, e)| (i as i64 + 1, e))
            .collect();
        let log = SessionLog {
            session: "sesn_x",
            last_seq: rows.len() as i64,
            ended,
            rows: &rows,
        };
        let mut v = Verdict::default();
        judge_session(&log, &["m1"], promises, &mut v);
        v
    }

    #[test]
    fn a_whole_turn_breaks_nothing() {
        let v = judged(
            vec![message("m1"), call("t1"), answer("t1", false)],
            false,
            Promises::default(),
        );
        assert!(v.failures.is_empty(), "{:?}", v.failures);
    }

    #[test]
    fn a_gap_in_the_seqs_is_a_lost_event() {
        let rows = vec![
            (1, message("m1")),
            (3, call("t1")),
            (4, answer("t1", false)),
        ];
        let log = SessionLog {
            session: "sesn_x",
            last_seq: 4,
            ended: false,
            rows: &rows,
        };
        let mut v = Verdict::default();
        judge_session(&log, &["m1"], Promises::default(), &mut v);
        assert_eq!(v.lost, 1, "{:?}", v.failures);
    }

    #[test]
    fn a_message_missing_or_twice_is_lost_or_doubled() {
        let v = judged(
            vec![call("t1"), answer("t1", false)],
            false,
            Promises::default(),
        );
        assert_eq!((v.lost, v.doubled), (1, 0), "{:?}", v.failures);
        let v = judged(
            vec![
                message("m1"),
                message("m1"),
                call("t1"),
                answer("t1", false),
            ],
            false,
            Promises::default(),
        );
        assert_eq!((v.lost, v.doubled), (0, 1), "{:?}", v.failures);
    }

    #[test]
    fn a_call_answered_twice_is_doubled() {
        let v = judged(
            vec![
                message("m1"),
                call("t1"),
                answer("t1", false),
                answer("t1", false),
            ],
            false,
            Promises::default(),
        );
        assert_eq!(v.doubled, 1, "{:?}", v.failures);
    }

    #[test]
    fn a_result_for_a_call_never_made_is_doubled() {
        let v = judged(
            vec![
                message("m1"),
                call("t1"),
                answer("t1", false),
                answer("t9", false),
            ],
            false,
            Promises::default(),
        );
        assert_eq!(v.doubled, 1, "{:?}", v.failures);
    }

    #[test]
    fn an_unanswered_call_is_lost_unless_its_session_ended() {
        let v = judged(vec![message("m1"), call("t1")], false, Promises::default());
        assert_eq!(v.lost, 1, "{:?}", v.failures);
        let v = judged(vec![message("m1"), call("t1")], true, Promises::default());
        assert!(v.failures.is_empty(), "{:?}", v.failures);
    }

    #[test]
    fn a_turn_without_a_call_is_lost_unless_promised() {
        let v = judged(vec![message("m1")], false, Promises::default());
        assert_eq!(v.lost, 1, "{:?}", v.failures);
        let promises = Promises {
            no_calls: true,
            ..Promises::default()
        };
        assert!(judged(vec![message("m1")], false, promises)
            .failures
            .is_empty());
    }

    #[test]
    fn an_error_result_breaks_a_clean_promise() {
        let events = || vec![message("m1"), call("t1"), answer("t1", true)];
        assert!(judged(events(), false, Promises::default())
            .failures
            .is_empty());
        let clean = Promises {
            clean_results: true,
            ..Promises::default()
        };
        let v = judged(events(), false, clean);
        assert_eq!(v.failures.len(), 1, "{:?}", v.failures);
        assert!(v.failures[0].starts_with("interrupted"));
    }

    #[test]
    fn an_old_token_must_get_401() {
        let mut v = Verdict::default();
        judge_old_token("work_a", 401, &Value::Null, &mut v);
        assert!(v.failures.is_empty());
        for status in [200, 409, 500] {
            let mut v = Verdict::default();
            judge_old_token("work_a", status, &Value::Null, &mut v);
            assert_eq!(v.failures.len(), 1, "{status}");
        }
    }

    #[test]
    fn a_secret_in_any_log_line_is_counted() {
        let token = mango_api::ids::new_secret(mango_api::ids::SESSIONS_TOKEN_PREFIX);
        let logs = vec![
            (
                std::path::PathBuf::from("api-a.log"),
                "ready\nmodel key sk-faults-1234 sent\nidle\n".to_string(),
            ),
            (
                std::path::PathBuf::from("runner.log"),
                format!("secret eyJzZXNzaW9uc190b2tlbiI6Im1hbmdv\ntoken {token}\nclean\n"),
            ),
        ];
        let mut v = Verdict::default();
        judge_logs(&logs, &["sk-faults-1234".to_string()], &mut v);
        assert_eq!(v.secret_lines, 3, "{:?}", v.failures);
        let mut v = Verdict::default();
        judge_logs(&logs[..1], &["sk-other".to_string()], &mut v);
        assert_eq!(v.secret_lines, 0);
    }

    #[test]
    fn a_sessions_token_is_recognised_and_its_prefix_alone_is_not() {
        let token = mango_api::ids::new_secret(mango_api::ids::SESSIONS_TOKEN_PREFIX);
        assert!(super::has_sessions_token(&format!("token={token} end")));
        assert!(!super::has_sessions_token(
            "tokens start with mango_st_ and more"
        ));
    }
}
