//! The `memory-full` scenario: Memory Stores larger than the sandbox's
//! mount for them (`/mnt/memory`, the Docker pool's tmpfs, 8 MiB in the
//! suite; a store may hold 40 MiB). Two Sessions beside the usual load, on
//! the Docker pool alone ([`exhausted::docker_only`]):
//! * one attaches a store that is larger than the mount from the start: the
//!   runner measures it before downloading anything and fails the Work;
//!   the Session ends with a `session_input_failed_error` naming the store
//!   and saying it cannot fit, and nothing of the store is deleted;
//! * one attaches a small store, which downloads; while its turn's call
//!   runs the operator grows the store past the mount, so the runner's
//!   pulls (after the call, and at the activation's end) run out of space.
//!   Memories that never arrived are not local deletions: the server keeps
//!   every one. The operator then shrinks the store again, and the Session
//!   takes its next message, its store mounted afresh, and ends that turn.

use super::exhausted::{self, result_text};
use super::invariants::Promises;
use super::load::{self, Record};
use super::scenarios::{self, Outcome};
use super::system::System;
use mango_protocol::events::types;
use reqwest::Method;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Memories that overfill an 8 MiB mount: 90 of 100,000 bytes take
/// 90 × 25 blocks of 4 KiB (8.8 MiB).
const BIG_MEMORIES: usize = 90;
const BIG_BYTES: usize = 100_000;

pub async fn run(system: &Arc<System>) -> anyhow::Result<Outcome> {
    exhausted::docker_only(system, async {
        let s = system.clone();
        let promises = Promises {
            // The oversized Session never starts: its turn may make no call.
            no_calls: true,
            ..Promises::default()
        };
        scenarios::frame_with(
            system,
            move || {
                tokio::spawn(async move {
                    let beside = load::start(s.clone(), scenarios::spec(2, 1, "echo call {n}"));
                    let mut record = Record::default();
                    let (oversized, grown) = tokio::join!(oversized(&s), grown(&s));
                    record.merge(oversized);
                    record.merge(grown);
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
    })
    .await
}

/// A store larger than its mount from the start.
async fn oversized(system: &System) -> Record {
    let mut record = Record::default();
    let outcome = async {
        let store = create_store(system, "oversized").await?;
        fill(system, &store, "big").await?;
        let (session, _) = open_session_with(system, &store).await?;
        let marker = format!("m{:016x}", rand::random::<u64>());
        record.turns.push((session.clone(), marker.clone()));
        let text = format!("fault {marker} calls=1 cmd=echo never");
        load::send_once(system, &session, &marker, &text).await?;
        let events = exhausted::until_turn_over(system, &session, &marker).await?;
        for broken in judge_refused_start(&events, &store) {
            record.failures.push(format!("{session}: {broken}"));
        }
        let (memories, deleted) = server_state(system, &store).await?;
        if memories != BIG_MEMORIES || deleted != 0 {
            record.failures.push(format!(
                "lost: {store} holds {memories} memories (of {BIG_MEMORIES}) and {deleted} deleted versions after its Session could not start"
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

/// A store that fits, grown past its mount mid-turn, then shrunk again.
async fn grown(system: &System) -> Record {
    let mut record = Record::default();
    let outcome = async {
        let store = create_store(system, "grown").await?;
        create_memory(system, &store, "/a.md", "alpha").await?;
        let (session, mount) = open_session_with(system, &store).await?;
        let first = format!("m{:016x}", rand::random::<u64>());
        record.turns.push((session.clone(), first.clone()));
        // The first call outlasts the runner's sync interval (15 s), so that
        // a pull follows it; the second counts what arrived.
        let text = format!(
            "fault {first} calls=2 cmd=if [ {{n}} = 1 ]; then cat {mount}/a.md; sleep 20; else echo arrived $(ls {mount}/grown | wc -l); fi"
        );
        load::send_once(system, &session, &first, &text).await?;
        until_call_runs(system, &session).await?;
        fill(system, &store, "grown").await?;
        let events = exhausted::until_turn_over(system, &session, &first).await?;
        if let Some(said) = events
            .iter()
            .rev()
            .find(|e| e["type"] == types::USER_TOOL_RESULT)
        {
            println!(
                "faults: memory-full: of {BIG_MEMORIES} memories the grown store's mount took {:?}",
                result_text(said)
            );
        }
        for broken in judge_grown_turn(&events, &first) {
            record.failures.push(format!("{session}: {broken}"));
        }
        // The activation's last sync and flush are over once its Work stopped.
        until_work_stopped(system, &session).await?;
        let (memories, deleted) = server_state(system, &store).await?;
        if memories != BIG_MEMORIES + 1 || deleted != 0 {
            record.failures.push(format!(
                "lost: {store} holds {memories} memories (of {}) and {deleted} deleted versions after syncs that had no room for them",
                BIG_MEMORIES + 1
            ));
        }
        // The operator makes room again; the next activation mounts it afresh.
        shrink(system, &store, "grown").await?;
        let second = format!("m{:016x}", rand::random::<u64>());
        record.turns.push((session.clone(), second.clone()));
        let text = format!("fault {second} calls=1 cmd=cat {mount}/a.md && echo recovered");
        load::send_once(system, &session, &second, &text).await?;
        let events = exhausted::until_turn_over(system, &session, &second).await?;
        for broken in exhausted::judge_recovered_turn(&events, &second) {
            record
                .failures
                .push(format!("{session} did not recover from a full memory mount: {broken}"));
        }
        let (memories, deleted) = server_state(system, &store).await?;
        if memories != 1 || deleted != BIG_MEMORIES {
            record.failures.push(format!(
                "{store} holds {memories} memories (of 1) and {deleted} deleted versions (of the operator's {BIG_MEMORIES})"
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

/// What a Session whose store cannot fit its mount promises: one
/// `session_input_failed_error` naming the store and saying it cannot
/// fit, and the Session terminated; no call answered (none ran).
pub fn judge_refused_start(events: &[Value], store: &str) -> Vec<String> {
    let mut broken = Vec::new();
    let errors: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == types::SESSION_ERROR)
        .collect();
    match errors.as_slice() {
        [one]
            if one["error"]["type"] == "session_input_failed_error"
                && one["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(store) && m.contains("cannot fit")) => {}
        other => broken.push(format!(
            "its errors were {:?}, not one session_input_failed_error naming {store} that cannot fit",
            other.iter().map(|e| &e["error"]).collect::<Vec<_>>()
        )),
    }
    if !events
        .iter()
        .any(|e| e["type"] == types::SESSION_STATUS_TERMINATED)
    {
        broken.push("it was not terminated".into());
    }
    if events.iter().any(|e| e["type"] == types::USER_TOOL_RESULT) {
        broken.push("a call was answered by a Session that never started".into());
    }
    broken
}

/// The turn of a store grown past its mount mid-turn: the first call read
/// the store as downloaded, the second found some of the grown memories
/// arrived and not all (the pull between them ran out of space), and the
/// turn ended.
pub fn judge_grown_turn(events: &[Value], marker: &str) -> Vec<String> {
    let turn = exhausted::after(events, marker);
    let results: Vec<(bool, String)> = turn
        .iter()
        .filter(|e| e["type"] == types::USER_TOOL_RESULT)
        .map(|r| (r["is_error"] == true, result_text(r)))
        .collect();
    let mut broken = Vec::new();
    match results.first() {
        Some((false, text)) if text.contains("alpha") => {}
        other => broken.push(format!(
            "its call before the store grew was answered {other:?}"
        )),
    }
    let arrived = results.get(1).and_then(|(error, text)| {
        let n = text
            .trim()
            .strip_prefix("arrived ")?
            .trim()
            .parse::<usize>()
            .ok();
        n.filter(|_| !error)
    });
    match arrived {
        Some(n) if n > 0 && n < BIG_MEMORIES => {}
        _ => broken.push(format!(
            "after the pull that ran out of space it found {:?}, not some and not all of the {BIG_MEMORIES} memories",
            results.get(1)
        )),
    }
    if !load::turn_ended(events, marker) {
        broken.push("its turn did not end with end_turn".into());
    }
    broken
}

/// Waits until no Work of the Session is live: its runner waits 60 s after
/// the turn for a next message, then syncs (30 s at most) and flushes (30 s).
async fn until_work_stopped(system: &System, session: &str) -> anyhow::Result<()> {
    let within = Duration::from_secs(150);
    let deadline = Instant::now() + within;
    loop {
        let (live,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM work WHERE session_id = $1 AND state <> 'stopped'",
        )
        .bind(session)
        .fetch_one(&system.db)
        .await?;
        if live == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{session}'s Work did not stop within {within:?} of its idle end"
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn create_store(system: &System, name: &str) -> anyhow::Result<String> {
    let name = format!("{name}-{:08x}", rand::random::<u32>());
    let store = system
        .expect(
            Method::POST,
            "/v1/memory_stores",
            Some(&json!({"name": name})),
            200,
        )
        .await?;
    Ok(store["id"].as_str().unwrap_or_default().to_string())
}

async fn create_memory(
    system: &System,
    store: &str,
    path: &str,
    content: &str,
) -> anyhow::Result<()> {
    system
        .expect(
            Method::POST,
            &format!("/v1/memory_stores/{store}/memories"),
            Some(&json!({"path": path, "content": content})),
            200,
        )
        .await
        .map(drop)
}

/// [`BIG_MEMORIES`] memories under `/<dir>/`, more than the mount holds.
async fn fill(system: &System, store: &str, dir: &str) -> anyhow::Result<()> {
    let content = "m".repeat(BIG_BYTES);
    for i in 0..BIG_MEMORIES {
        create_memory(system, store, &format!("/{dir}/{i:03}.md"), &content).await?;
    }
    Ok(())
}

/// Deletes what [`fill`] made under `/<dir>/`.
async fn shrink(system: &System, store: &str, dir: &str) -> anyhow::Result<()> {
    let prefix = format!("/{dir}/");
    for memory in paged(system, &format!("/v1/memory_stores/{store}/memories")).await? {
        if memory["path"]
            .as_str()
            .is_some_and(|p| p.starts_with(&prefix))
        {
            let id = memory["id"].as_str().unwrap_or_default();
            system
                .expect(
                    Method::DELETE,
                    &format!("/v1/memory_stores/{store}/memories/{id}"),
                    None,
                    200,
                )
                .await?;
        }
    }
    Ok(())
}

/// Every item of a list, following `next_page`.
async fn paged(system: &System, path: &str) -> anyhow::Result<Vec<Value>> {
    let joiner = if path.contains('?') { '&' } else { '?' };
    let mut out = Vec::new();
    let mut page = String::new();
    loop {
        let body = system
            .expect(
                Method::GET,
                &format!("{path}{joiner}limit=100{page}"),
                None,
                200,
            )
            .await?;
        out.extend(body["data"].as_array().cloned().unwrap_or_default());
        match body["next_page"].as_str() {
            Some(p) if !p.is_empty() => page = format!("&page={}", mango_testkit::urlencode(p)),
            _ => return Ok(out),
        }
    }
}

/// The store's memories, and its `deleted` versions: what "nothing
/// deleted" compares.
async fn server_state(system: &System, store: &str) -> anyhow::Result<(usize, usize)> {
    let memories = paged(system, &format!("/v1/memory_stores/{store}/memories")).await?;
    let deleted = paged(
        system,
        &format!("/v1/memory_stores/{store}/memory_versions?operation=deleted"),
    )
    .await?;
    Ok((memories.len(), deleted.len()))
}

/// A Session attaching `store` read-write; its id and the store's mount path.
async fn open_session_with(system: &System, store: &str) -> anyhow::Result<(String, String)> {
    let body = json!({"agent": system.agent_id, "environment_id": system.env_id,
        "resources": [{"type": "memory_store", "memory_store_id": store, "access": "read_write"}]});
    let session = system
        .expect(Method::POST, "/v1/sessions", Some(&body), 200)
        .await?;
    let id = session["id"].as_str().unwrap_or_default().to_string();
    let mount = session["resources"][0]["mount_path"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(
        mount.starts_with(mango_protocol::memory::DEFAULT_MOUNT_ROOT),
        "{id} mounts its store at {mount:?}, not under the sandbox's memory mount"
    );
    Ok((id, mount))
}

/// Waits until the Session's runner says its call runs (its container's
/// log): its store was downloaded before, as it was then.
async fn until_call_runs(system: &System, session: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let running = system.all_logs().iter().any(|(path, text)| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("container-"))
                && text
                    .lines()
                    .any(|l| l.contains("tool call running") && l.contains(session))
        });
        if running {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{session}'s runner ran no call within 90 s"
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: &str, message: &str) -> Value {
        json!({"type": types::SESSION_ERROR, "error": {"type": kind, "message": message}})
    }

    fn message(marker: &str) -> Value {
        json!({"type": types::USER_MESSAGE,
               "content": [{"type": "text", "text": format!("fault {marker} calls=2 cmd=x")}]})
    }
    fn answer(is_error: bool, text: &str) -> Value {
        json!({"type": types::USER_TOOL_RESULT, "is_error": is_error,
               "content": [{"type": "text", "text": text}]})
    }
    fn end_turn() -> Value {
        json!({"type": types::SESSION_STATUS_IDLE, "stop_reason": {"type": "end_turn"}})
    }

    #[test]
    fn a_pull_that_ran_out_of_space_leaves_some_memories_not_all() {
        let turn = |arrived: &str| {
            [
                message("m1"),
                answer(false, "alpha"),
                answer(false, arrived),
                end_turn(),
            ]
        };
        assert!(judge_grown_turn(&turn("arrived 78"), "m1").is_empty());
        // None: no pull ran; all: the mount did not fill.
        assert_eq!(judge_grown_turn(&turn("arrived 0"), "m1").len(), 1);
        assert_eq!(judge_grown_turn(&turn("arrived 90"), "m1").len(), 1);
        let unread = [message("m1"), answer(true, "cat: a.md"), end_turn()];
        assert_eq!(judge_grown_turn(&unread, "m1").len(), 2);
    }

    #[test]
    fn a_start_refused_naming_the_store_keeps_the_promise() {
        let events = [
            error(
                "session_input_failed_error",
                "the Session's Memory Stores cannot fit their mount: Memory Store memstore_1 (90 memories, 8.8 MiB on disk) needs 8.8 MiB at /mnt/memory, which holds 8.0 MiB in all",
            ),
            json!({"type": types::SESSION_STATUS_TERMINATED}),
        ];
        assert!(judge_refused_start(&events, "memstore_1").is_empty());
    }

    #[test]
    fn a_vague_error_a_live_session_or_an_answered_call_breaks_it() {
        let vague = [
            error("session_input_failed_error", "something went wrong"),
            json!({"type": types::SESSION_STATUS_TERMINATED}),
        ];
        assert_eq!(judge_refused_start(&vague, "memstore_1").len(), 1);
        let alive = [error(
            "session_input_failed_error",
            "memstore_1 cannot fit their mount",
        )];
        assert_eq!(judge_refused_start(&alive, "memstore_1").len(), 1);
        let answered = [
            error("session_input_failed_error", "memstore_1 cannot fit"),
            json!({"type": types::USER_TOOL_RESULT, "is_error": false, "content": []}),
            json!({"type": types::SESSION_STATUS_TERMINATED}),
        ];
        assert_eq!(judge_refused_start(&answered, "memstore_1").len(), 1);
    }
}
