//! The scenarios of exhausted resources (issue 27): a tool fills its
//! Session's workspace (the Docker pool's 32 MiB volume) or `/tmp` (the
//! sandbox's tmpfs), or fills the sandbox's pids limit. The call that ran
//! out gets a result, an error saying what ran out; the next call of that
//! activation is still answered; the Session takes its next message and
//! ends that turn (`end_turn`, its call a success, which first removes the
//! file that filled the disk: a next message soon after the turn is taken
//! by the same activation, its `/tmp` still full, and the workspace is kept
//! across activations).
//!
//! These run on the Docker pool alone ([`docker_only`]): a local runner's
//! workspace, `/tmp` and processes are the host's, which no tool of the
//! suite may fill.

use super::invariants::Promises;
use super::load::{self, Record};
use super::scenarios::{self, Outcome};
use super::system::{Launcher, System};
use mango_protocol::events::types;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One faulted Session: its first turn's two calls (`{n}` is 1, then 2),
/// what the first one's error must say, what the second may answer, and
/// its next message's command, whose result must hold `recovered`.
pub struct Case {
    pub what: &'static str,
    pub command: &'static str,
    /// The first call's result is an error holding one of these.
    pub reason: &'static [&'static str],
    pub after: After,
    pub recover: &'static str,
}

/// What the second call of the faulted turn answers.
pub enum After {
    /// A success holding this text.
    Succeeds(&'static str),
    /// A success holding the text, or an error holding one of the reasons
    /// (a shell that cannot start while the tool's processes hold the limit).
    SucceedsOrSays(&'static str, &'static [&'static str]),
}

const NO_SPACE: &[&str] = &["No space left on device"];
/// What bash says when `fork` is refused, and what the runner says when
/// it cannot start a shell for the same reason.
const NO_PROCESS: &[&str] = &[
    "Resource temporarily unavailable",
    "process limit",
    "could not start a shell",
];

/// The workspace filled (48 MiB into 32), and `/tmp` (16 MiB into the
/// sandbox's tmpfs, 8 MiB in the suite).
pub const DISK_CASES: [Case; 2] = [
    Case {
        what: "workspace",
        command: "if [ {n} = 1 ]; then head -c 48m /dev/zero > fill.bin; else echo still answering; fi",
        reason: NO_SPACE,
        after: After::Succeeds("still answering"),
        // The workspace is kept: whichever activation runs the next turn
        // begins with it still full.
        recover: "rm fill.bin && echo recovered > after.txt && cat after.txt",
    },
    Case {
        what: "/tmp",
        command: "if [ {n} = 1 ]; then head -c 16m /dev/zero > /tmp/fill.bin; else echo still answering; fi",
        reason: NO_SPACE,
        after: After::Succeeds("still answering"),
        // Its next turn may run in the same activation, /tmp still full.
        recover: "rm /tmp/fill.bin && echo recovered > /tmp/after.txt && cat /tmp/after.txt",
    },
];

/// Background sleepers past the pids limit (256): bash's `fork` is
/// refused (after its own retries, 15 s), and the processes it made hold
/// the limit until the sandbox ends.
pub const PIDS_CASES: [Case; 1] = [Case {
    what: "pids",
    command: "if [ {n} = 1 ]; then for i in $(seq 400); do sleep 300 & done; echo spawned; else echo still answering; fi",
    reason: NO_PROCESS,
    after: After::SucceedsOrSays("still answering", NO_PROCESS),
    recover: "ls / > /dev/null && echo recovered",
}];

pub async fn run(system: &Arc<System>, cases: &'static [Case]) -> anyhow::Result<Outcome> {
    docker_only(system, async {
        let s = system.clone();
        scenarios::frame_with(
            system,
            move || {
                tokio::spawn(async move {
                    let beside = load::start(s.clone(), scenarios::spec(2, 1, "echo call {n}"));
                    let mut tasks = Vec::new();
                    for case in cases {
                        let s = s.clone();
                        tasks.push(tokio::spawn(async move { drive(&s, case).await }));
                    }
                    let mut record = Record::default();
                    for task in tasks {
                        match task.await {
                            Ok(r) => record.merge(r),
                            Err(err) => record
                                .failures
                                .push(format!("a faulted Session's driver panicked: {err}")),
                        }
                    }
                    match beside.await {
                        Ok(r) => record.merge(r),
                        Err(err) => record.failures.push(format!("the load panicked: {err}")),
                    }
                    record
                })
            },
            Promises::default(),
            Box::pin(async { Ok(()) }),
        )
        .await
    })
    .await
}

/// Runs `scenario` with the local supervisor stopped (SIGTERM: it detaches,
/// and it has nothing running between scenarios), so that every item goes to
/// the Docker pool; it is started again after, whatever the outcome.
pub async fn docker_only<F: Future<Output = anyhow::Result<Outcome>>>(
    system: &System,
    scenario: F,
) -> anyhow::Result<Outcome> {
    system
        .end_worker(Launcher::Local, libc::SIGTERM, Duration::from_secs(10))
        .await?;
    let outcome = scenario.await;
    system.start_worker(Launcher::Local).await?;
    outcome
}

/// The faulted turn, judged; then the next message's, which must end as
/// any other turn does.
async fn drive(system: &System, case: &Case) -> Record {
    let mut record = Record::default();
    let outcome = async {
        let session = load::open_session(system).await?;
        let first = format!("m{:016x}", rand::random::<u64>());
        record.turns.push((session.clone(), first.clone()));
        let text = format!("fault {first} calls=2 cmd={}", case.command);
        load::send_once(system, &session, &first, &text).await?;
        let events = until_turn_over(system, &session, &first).await?;
        if let Some(said) = exhausted_call(&events, &first) {
            println!(
                "faults: {} exhausted: the call that ran out said {said:?}",
                case.what
            );
        }
        for broken in judge_exhausted_turn(&events, &first, case) {
            record
                .failures
                .push(format!("{session} ({} exhausted): {broken}", case.what));
        }
        let second = format!("m{:016x}", rand::random::<u64>());
        record.turns.push((session.clone(), second.clone()));
        let text = format!("fault {second} calls=1 cmd={}", case.recover);
        load::send_once(system, &session, &second, &text).await?;
        let events = until_turn_over(system, &session, &second).await?;
        for broken in judge_recovered_turn(&events, &second) {
            record.failures.push(format!(
                "{session} did not recover from its {} exhausted: {broken}",
                case.what
            ));
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(err) = outcome {
        record.failures.push(format!("{err:#}"));
    }
    record
}

/// The events from the message with `marker` on.
pub fn after<'a>(events: &'a [Value], marker: &str) -> &'a [Value] {
    let at = events
        .iter()
        .position(|e| load::message_marker(e) == Some(marker));
    at.map_or(&[], |at| &events[at..])
}

/// The Session's events once the turn of `marker` is over: idle for any
/// reason but a pending action, or terminated.
pub async fn until_turn_over(
    system: &System,
    session: &str,
    marker: &str,
) -> anyhow::Result<Vec<Value>> {
    // A refused fork costs bash 15 s; the Docker pool alone runs the load.
    let within = Duration::from_secs(150);
    let deadline = Instant::now() + within;
    loop {
        let events = load::events(system, session).await?;
        let over = after(&events, marker).iter().any(|e| {
            (e["type"] == types::SESSION_STATUS_IDLE
                && e["stop_reason"]["type"] != "requires_action")
                || e["type"] == types::SESSION_STATUS_TERMINATED
        });
        if over {
            return Ok(events);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the turn of {session} was not over within {within:?}"
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A tool result's text blocks, joined.
pub fn result_text(result: &Value) -> String {
    match &result["content"] {
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::String(s) => s.clone(),
        _ => String::new(),
    }
}

/// The first result of the turn of `marker`, its last line (what ran out, said).
fn exhausted_call(events: &[Value], marker: &str) -> Option<String> {
    let turn = after(events, marker);
    let first = results(turn).into_iter().next()?;
    let text = result_text(first);
    let said = text
        .lines()
        .rev()
        .find(|l| !l.starts_with("[exit code") && !l.starts_with("[the shell"))
        .unwrap_or_default();
    Some(said.chars().take(160).collect())
}

/// The turn's tool results, in order.
fn results(turn: &[Value]) -> Vec<&Value> {
    turn.iter()
        .filter(|e| e["type"] == types::USER_TOOL_RESULT)
        .collect()
}

fn ended_its_turn(turn: &[Value]) -> Option<String> {
    let idle = turn
        .iter()
        .rev()
        .find(|e| e["type"] == types::SESSION_STATUS_IDLE)
        .map(|e| e["stop_reason"]["type"].as_str().unwrap_or("?"));
    (idle != Some("end_turn")).then(|| format!("it went idle with {idle:?}, not end_turn"))
}

/// What a turn whose first call exhausts a resource promises: that call's
/// result an error naming what ran out, the second call answered as
/// `case.after` says, and the turn ended (`end_turn`). Each broken promise, said.
pub fn judge_exhausted_turn(events: &[Value], marker: &str, case: &Case) -> Vec<String> {
    let turn = after(events, marker);
    let results = results(turn);
    let mut broken = Vec::new();
    if results.len() != 2 {
        broken.push(format!("{} of its 2 calls were answered", results.len()));
    }
    if let Some(first) = results.first() {
        let text = result_text(first);
        if first["is_error"] != true || !case.reason.iter().any(|r| text.contains(r)) {
            broken.push(format!(
                "the call that ran out was answered is_error={} without saying {:?}: {text:?}",
                first["is_error"], case.reason
            ));
        }
    }
    if let Some(second) = results.get(1) {
        let text = result_text(second);
        let ok = second["is_error"] != true;
        let kept = match case.after {
            After::Succeeds(want) => ok && text.contains(want),
            After::SucceedsOrSays(want, reasons) => {
                (ok && text.contains(want)) || (!ok && reasons.iter().any(|r| text.contains(r)))
            }
        };
        if !kept {
            broken.push(format!(
                "the call after it was answered is_error={}: {text:?}",
                second["is_error"]
            ));
        }
    }
    broken.extend(ended_its_turn(turn));
    broken
}

/// The turn after the fault: its one call a success holding `recovered`,
/// and `end_turn`.
pub fn judge_recovered_turn(events: &[Value], marker: &str) -> Vec<String> {
    let turn = after(events, marker);
    let results = results(turn);
    let mut broken = Vec::new();
    match results.as_slice() {
        [only] if only["is_error"] != true && result_text(only).contains("recovered") => {}
        other => broken.push(format!(
            "its call was answered {:?}",
            other
                .iter()
                .map(|r| (r["is_error"].clone(), result_text(r)))
                .collect::<Vec<_>>()
        )),
    }
    broken.extend(ended_its_turn(turn));
    broken
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(marker: &str) -> Value {
        json!({"type": types::USER_MESSAGE,
               "content": [{"type": "text", "text": format!("fault {marker} calls=2 cmd=x")}]})
    }
    fn answer(is_error: bool, text: &str) -> Value {
        json!({"type": types::USER_TOOL_RESULT, "tool_use_id": "t", "is_error": is_error,
               "content": [{"type": "text", "text": text}]})
    }
    fn idle(reason: &str) -> Value {
        json!({"type": types::SESSION_STATUS_IDLE, "stop_reason": {"type": reason}})
    }

    #[test]
    fn a_full_disk_said_then_answered_then_ended_keeps_the_promise() {
        let events = [
            message("m1"),
            answer(
                true,
                "head: error writing 'standard output': No space left on device\n[exit code: 1]",
            ),
            answer(false, "still answering"),
            idle("end_turn"),
        ];
        assert_eq!(
            judge_exhausted_turn(&events, "m1", &DISK_CASES[0]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_silent_success_a_vague_error_or_a_missing_answer_breaks_it() {
        let silent = [
            message("m1"),
            answer(false, ""),
            answer(false, "still answering"),
            idle("end_turn"),
        ];
        assert_eq!(judge_exhausted_turn(&silent, "m1", &DISK_CASES[0]).len(), 1);
        let unflagged = [
            message("m1"),
            answer(false, "No space left on device"),
            answer(false, "still answering"),
            idle("end_turn"),
        ];
        assert_eq!(
            judge_exhausted_turn(&unflagged, "m1", &DISK_CASES[0]).len(),
            1
        );
        let vague = [
            message("m1"),
            answer(true, "[exit code: 1]"),
            answer(false, "still answering"),
            idle("end_turn"),
        ];
        assert_eq!(judge_exhausted_turn(&vague, "m1", &DISK_CASES[0]).len(), 1);
        let wedged = [
            message("m1"),
            answer(true, "No space left on device"),
            idle("requires_action"),
        ];
        assert_eq!(judge_exhausted_turn(&wedged, "m1", &DISK_CASES[0]).len(), 2);
    }

    #[test]
    fn with_the_pids_limit_full_the_next_call_may_fail_only_saying_why() {
        let first = answer(true, "bash: fork: Resource temporarily unavailable");
        let said = [
            message("m1"),
            first.clone(),
            answer(true, "could not start a shell: the sandbox's process limit"),
            idle("end_turn"),
        ];
        assert!(judge_exhausted_turn(&said, "m1", &PIDS_CASES[0]).is_empty());
        let unsaid = [
            message("m1"),
            first,
            answer(true, "something broke"),
            idle("end_turn"),
        ];
        assert_eq!(judge_exhausted_turn(&unsaid, "m1", &PIDS_CASES[0]).len(), 1);
        // On the workspace, the call after a full disk must succeed.
        let failed_after = [
            message("m1"),
            answer(true, "No space left on device"),
            answer(true, "No space left on device"),
            idle("end_turn"),
        ];
        assert_eq!(
            judge_exhausted_turn(&failed_after, "m1", &DISK_CASES[0]).len(),
            1
        );
    }

    #[test]
    fn a_recovered_turn_is_one_success_and_end_turn() {
        let good = [message("m2"), answer(false, "recovered"), idle("end_turn")];
        assert!(judge_recovered_turn(&good, "m2").is_empty());
        let failed = [
            message("m2"),
            answer(true, "No space left on device"),
            idle("end_turn"),
        ];
        assert_eq!(judge_recovered_turn(&failed, "m2").len(), 1);
        let never = [
            message("m2"),
            json!({"type": types::SESSION_STATUS_TERMINATED}),
        ];
        assert_eq!(judge_recovered_turn(&never, "m2").len(), 2);
    }
}
