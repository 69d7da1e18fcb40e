//! The `model-faults` scenario: the model endpoint stalls past the api's
//! model timeout, answers 500, or drops the connection half-way through its
//! body (`model.rs`'s `model=` instructions). The api promises (spec §6,
//! `agent_loop.rs`): such a failure is retried up to three times, each retry
//! announced by a `session.error` whose `retry_status` is `retrying`; past
//! that, one `exhausted` error and an idle with `retries_exhausted`. Either
//! way the Session takes its next message as if nothing had happened.

use super::invariants::Promises;
use super::load::{self, Record};
use super::scenarios::{self, Outcome};
use super::system::System;
use mango_protocol::events::types;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Retries the api makes of a failed model call (`MODEL_RETRIES`).
const API_RETRIES: usize = 3;

/// One Session's fault: how many of its first message's requests meet it.
struct Case {
    fault: &'static str,
    times: usize,
}

const CASES: [Case; 4] = [
    Case {
        fault: "500",
        times: 2,
    },
    Case {
        fault: "drop",
        times: 1,
    },
    Case {
        fault: "stall",
        times: 1,
    },
    // More than the retries: the turn ends with its retries exhausted.
    Case {
        fault: "500",
        times: 9,
    },
];

pub async fn run(system: &Arc<System>) -> anyhow::Result<Outcome> {
    let s = system.clone();
    let promises = Promises {
        // The exhausted Session's first message made no call.
        no_calls: true,
        ..Promises::default()
    };
    scenarios::frame_with(
        system,
        move || {
            tokio::spawn(async move {
                // Tool-calling Sessions and healthchecks beside the faulted ones.
                let beside = load::start(s.clone(), scenarios::spec(2, 1, "echo call {n}"));
                let mut tasks = Vec::new();
                for case in &CASES {
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
        promises,
        Box::pin(async { Ok(()) }),
    )
    .await
}

/// The faulted message, its turn judged; then a plain one, which must end
/// its turn as any other does.
async fn drive(system: &System, case: &Case) -> Record {
    let mut record = Record::default();
    let outcome = async {
        let session = load::open_session(system).await?;
        let first = format!("m{:016x}", rand::random::<u64>());
        record.turns.push((session.clone(), first.clone()));
        let text = format!(
            "fault {first} model={}x{} calls=1 cmd=echo first",
            case.fault, case.times
        );
        load::send_once(system, &session, &first, &text).await?;
        let events = until_turn_over(system, &session, &first).await?;
        let exhausted = case.times > API_RETRIES;
        let retries = case.times.min(API_RETRIES);
        for broken in judge_faulted_turn(&events, &first, retries, exhausted) {
            record.failures.push(format!(
                "{session} (model={}x{}): {broken}",
                case.fault, case.times
            ));
        }
        let second = format!("m{:016x}", rand::random::<u64>());
        record.turns.push((session.clone(), second.clone()));
        let text = format!("fault {second} calls=1 cmd=echo again");
        load::send_once(system, &session, &second, &text).await?;
        let events = until_turn_over(system, &session, &second).await?;
        anyhow::ensure!(
            load::turn_ended(&events, &second),
            "{session} did not recover: its next turn ended {:?}",
            last_idle(&events)
        );
        anyhow::Ok(())
    }
    .await;
    if let Err(err) = outcome {
        record.failures.push(format!("{err:#}"));
    }
    record
}

fn after<'a>(events: &'a [Value], marker: &str) -> &'a [Value] {
    let at = events
        .iter()
        .position(|e| load::message_marker(e) == Some(marker));
    at.map_or(&[], |at| &events[at..])
}

fn last_idle(events: &[Value]) -> Option<&Value> {
    events
        .iter()
        .rev()
        .find(|e| e["type"] == types::SESSION_STATUS_IDLE)
        .map(|e| &e["stop_reason"])
}

/// The Session's events once the turn of `marker` is over: idle for any
/// reason but a pending action, or terminated.
async fn until_turn_over(
    system: &System,
    session: &str,
    marker: &str,
) -> anyhow::Result<Vec<Value>> {
    // Four stalls would take 4 × 20 s; one does here, with the others' retries.
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

/// What the api promised of a turn whose first `retries` model calls
/// failed: as many `retrying` errors, then either the turn as usual (its
/// call made, `end_turn`) or, `exhausted`, one `exhausted` error, no call
/// and an idle with `retries_exhausted`. Each broken promise, said.
pub fn judge_faulted_turn(
    events: &[Value],
    marker: &str,
    retries: usize,
    exhausted: bool,
) -> Vec<String> {
    let turn = after(events, marker);
    let mut broken = Vec::new();
    let errors: Vec<&str> = turn
        .iter()
        .filter(|e| e["type"] == types::SESSION_ERROR)
        .map(|e| e["error"]["retry_status"]["type"].as_str().unwrap_or("?"))
        .collect();
    let retrying = errors.iter().filter(|s| **s == "retrying").count();
    if retrying != retries {
        broken.push(format!(
            "{retrying} retrying session.error events, not {retries}"
        ));
    }
    let ended: Vec<&&str> = errors.iter().filter(|s| **s != "retrying").collect();
    let calls = turn
        .iter()
        .filter(|e| e["type"] == types::AGENT_TOOL_USE)
        .count();
    let idle = last_idle(turn).map(|r| r["type"].as_str().unwrap_or("?"));
    if exhausted {
        if ended != [&"exhausted"] {
            broken.push(format!(
                "its errors after the retries were {ended:?}, not one exhausted"
            ));
        }
        if calls != 0 {
            broken.push(format!(
                "{calls} calls made by a turn whose model never answered"
            ));
        }
        if idle != Some("retries_exhausted") {
            broken.push(format!("it went idle with {idle:?}, not retries_exhausted"));
        }
    } else {
        if !ended.is_empty() {
            broken.push(format!("it gave up ({ended:?}) within its retries"));
        }
        if calls != 1 {
            broken.push(format!("{calls} calls made, not 1"));
        }
        if idle != Some("end_turn") {
            broken.push(format!("it went idle with {idle:?}, not end_turn"));
        }
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message() -> Value {
        json!({"type": types::USER_MESSAGE, "content": [{"type": "text", "text": "fault m1 model=500x2"}]})
    }
    fn error(status: &str) -> Value {
        json!({"type": types::SESSION_ERROR, "error": {"type": "model_request_failed_error",
               "message": "the model endpoint failed", "retry_status": {"type": status}}})
    }
    fn idle(reason: &str) -> Value {
        json!({"type": types::SESSION_STATUS_IDLE, "stop_reason": {"type": reason}})
    }
    fn call() -> Value {
        json!({"type": types::AGENT_TOOL_USE, "id": "t1", "name": "bash"})
    }

    #[test]
    fn retries_then_the_turn_as_usual_keeps_the_promise() {
        let events = [
            message(),
            error("retrying"),
            error("retrying"),
            call(),
            idle("end_turn"),
        ];
        assert_eq!(
            judge_faulted_turn(&events, "m1", 2, false),
            Vec::<String>::new()
        );
    }

    #[test]
    fn too_few_retries_or_giving_up_early_breaks_it() {
        let events = [message(), error("retrying"), call(), idle("end_turn")];
        assert_eq!(judge_faulted_turn(&events, "m1", 2, false).len(), 1);
        let events = [
            message(),
            error("retrying"),
            error("terminal"),
            idle("retries_exhausted"),
        ];
        assert_eq!(judge_faulted_turn(&events, "m1", 1, false).len(), 3);
    }

    #[test]
    fn exhausted_retries_end_with_one_exhausted_error_and_no_call() {
        let events = [
            message(),
            error("retrying"),
            error("retrying"),
            error("retrying"),
            error("exhausted"),
            idle("retries_exhausted"),
        ];
        assert_eq!(
            judge_faulted_turn(&events, "m1", 3, true),
            Vec::<String>::new()
        );
        let silent = [
            message(),
            error("retrying"),
            error("retrying"),
            error("retrying"),
            idle("end_turn"),
        ];
        assert_eq!(judge_faulted_turn(&silent, "m1", 3, true).len(), 2);
    }
}
