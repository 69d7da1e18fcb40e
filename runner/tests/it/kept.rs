//! `mango-runner --wait --keep-idle-seconds` as a kept sandbox runs it
//! (spec §7.1): after an idle end the same process takes the same
//! Session's next envelope on the same stdin, with nothing of the last
//! activation left but the workspace's files.

use mango_api::Settings;
use mango_client::Client;
use mango_protocol::envelope::Envelope;
use mango_protocol::{Work, WorkState, WorkType};
use mango_testkit::runner::{session_with_work, text_of};
use mango_testkit::{append_agent_events, json_events, sent, TestApp};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// A kept runner whose stdin stays open for the next envelope.
struct Kept {
    child: Child,
    stdin: Option<ChildStdin>,
    log: Arc<Mutex<Vec<u8>>>,
}

impl Kept {
    fn start(api: &TestApp, workspace: &Path, tmp: &Path, keep_seconds: u64) -> Kept {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mango-runner"))
            .args(["--wait", "--keep-idle-seconds", &keep_seconds.to_string()])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("MANGO_BASE_URL", &api.base)
            .env("MANGO_WORKSPACE", workspace)
            .env("MANGO_KEPT_TMP_DIR", tmp)
            .env("MANGO_IDLE_AFTER_END_TURN_SECONDS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mango-runner starts");
        let stdin = child.stdin.take();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (mut stderr, sink) = (child.stderr.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Kept { child, stdin, log }
    }

    fn send(&mut self, envelope: &Envelope) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(envelope.to_line().as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    async fn exits_within(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the runner did not exit within {within:?}; its log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn logs_within(&self, line: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.log().contains(line) {
            assert!(
                Instant::now() < deadline,
                "no {line:?} within {within:?}; its log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn envelope(api: &TestApp, work: &Work, session_id: &str) -> Envelope {
    Envelope {
        work_id: work.id.clone(),
        environment_id: api.env_id.clone(),
        work_type: WorkType::Session,
        session_id: Some(session_id.to_string()),
        claim: work.claim.unwrap_or(1),
        secret: work.secret.clone().unwrap(),
    }
}

fn operator(api: &TestApp) -> Client {
    Client::new(&api.base, &api.ws_key)
}

fn supervisor(api: &TestApp) -> Client {
    Client::new(&api.base, &api.env_key)
}

fn bash(command: &str) -> Value {
    json!({"type": "agent.tool_use", "name": "bash", "input": {"command": command},
           "evaluated_permission": "allow"})
}

/// Appends agent-loop events; returns their ids.
async fn append(db: &sqlx::PgPool, session_id: &str, events: Vec<Value>) -> Vec<String> {
    append_agent_events(db, session_id, events)
        .await
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

async fn result_of(operator: &Client, session_id: &str, call_id: &str, runner: &Kept) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let events = json_events(operator.all_events(session_id).await.unwrap());
        if let Some(found) = events
            .into_iter()
            .find(|e| e["type"] == "user.tool_result" && e["tool_use_id"] == call_id)
        {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no result for {call_id}; the runner's log:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn end_turn(db: &sqlx::PgPool, session_id: &str) {
    append(
        db,
        session_id,
        vec![json!({"type": "session.status_idle", "stop_reason": {"type": "end_turn"}})],
    )
    .await;
}

/// New input after the idle Stop: the Session's next Work, polled and acked.
async fn next_work(api: &TestApp, session_id: &str) -> Work {
    operator(api)
        .send_events(
            session_id,
            &[sent(
                json!({"type": "user.message", "content": [{"type": "text", "text": "again"}]}),
            )],
        )
        .await
        .unwrap();
    let next = supervisor(api)
        .poll(&api.env_id, None, None)
        .await
        .unwrap()
        .expect("the Session's next Work");
    supervisor(api).ack(&api.env_id, &next.id).await.unwrap();
    next
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            !matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X') | None)
        }
        Err(_) => false,
    }
}

const KEPT: &str = "activation ended idle; kept for Session";

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_runner_runs_the_next_activation_fresh_but_with_the_workspace(db: sqlx::PgPool) {
    let api = TestApp::start(db.clone()).await;
    let (session_id, work) = session_with_work(&api).await;
    let (workspace, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut runner = Kept::start(&api, workspace.path(), tmp.path(), 30);
    runner.send(&envelope(&api, &work, &session_id));

    let tmp_dir = tmp.path().display();
    let turn1 = format!(
        "echo kept > kept.txt; mkdir -p {tmp_dir}/d; echo x > {tmp_dir}/d/f; echo y > {tmp_dir}/.h; \
         sleep 1000 >/dev/null 2>&1 & echo $! > pids; \
         setsid sleep 1001 >/dev/null 2>&1 & echo $! >> pids; \
         ( sleep 1002 >/dev/null 2>&1 & echo $! >> pids ); \
         ( setsid sh -c 'sleep 1003 & echo $! >> pids' >/dev/null 2>&1 & ); sleep 0.5; \
         export TURN1=set; mkdir -p sub; cd sub; \
         readlink /proc/self/fd/0; readlink /proc/$$/fd/0"
    );
    let call = append(&db, &session_id, vec![bash(&turn1)]).await;
    let first = result_of(&operator(&api), &session_id, &call[0], &runner).await;
    let out = text_of(&first);
    assert!(
        !out.contains("pipe:"),
        "a tool's fd 0 is not the runner's pipe: {out}"
    );
    let pids: Vec<i32> = std::fs::read_to_string(workspace.path().join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 4, "{pids:?}");
    assert!(pids.iter().all(|p| alive(*p)), "turn 1's processes run");

    end_turn(&db, &session_id).await;
    runner.logs_within(KEPT, WAIT).await;
    assert!(runner.exited().is_none(), "kept: {}", runner.log());
    let stored = operator(&api).work(&api.env_id, &work.id).await.unwrap();
    assert_eq!(stored.state, WorkState::Stopped, "the idle Stop was sent");

    let next = next_work(&api, &session_id).await;
    runner.send(&envelope(&api, &next, &session_id));
    runner
        .logs_within(&format!("kept: next envelope for Work {}", next.id), WAIT)
        .await;
    let survivors: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        survivors.is_empty(),
        "turn 1's processes are gone: {survivors:?}"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "the kept sandbox's /tmp is emptied"
    );
    let call = append(
        &db,
        &session_id,
        vec![bash("echo \"[${TURN1:-unset}] $(pwd)\"; cat kept.txt")],
    )
    .await;
    let second = text_of(&result_of(&operator(&api), &session_id, &call[0], &runner).await);
    let cwd = std::fs::canonicalize(workspace.path()).unwrap();
    assert!(
        second.contains(&format!("[unset] {}", cwd.display()))
            || second.contains(&format!("[unset] {}", workspace.path().display())),
        "a fresh shell: {second}"
    );
    assert!(
        second.contains("kept"),
        "the workspace's files persist: {second}"
    );

    append(
        &db,
        &session_id,
        vec![json!({"type": "session.status_terminated"})],
    )
    .await;
    let status = runner.exits_within(WAIT).await;
    assert_eq!(status.code(), Some(0), "{}", runner.log());
    assert!(!runner.log().contains(work.secret.as_deref().unwrap()));
    assert!(!runner.log().contains(next.secret.as_deref().unwrap()));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_runner_refuses_another_sessions_envelope_and_runs_nothing(db: sqlx::PgPool) {
    let api = TestApp::start(db.clone()).await;
    let (session_id, work) = session_with_work(&api).await;
    let (workspace, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut runner = Kept::start(&api, workspace.path(), tmp.path(), 30);
    runner.send(&envelope(&api, &work, &session_id));
    end_turn(&db, &session_id).await;
    runner.logs_within(KEPT, WAIT).await;

    let (other_session, other) = session_with_work(&api).await;
    let before = operator(&api).work(&api.env_id, &other.id).await.unwrap();
    runner.send(&envelope(&api, &other, &other_session));
    let status = runner.exits_within(WAIT).await;
    assert_eq!(status.code(), Some(11), "ForeignEnvelope: {}", runner.log());
    let after = operator(&api).work(&api.env_id, &other.id).await.unwrap();
    assert_eq!(
        after.state, before.state,
        "the foreign Work was not touched"
    );
    assert_eq!(
        after.latest_heartbeat_at, None,
        "no heartbeat claimed its lease"
    );
    assert_eq!(before.latest_heartbeat_at, None);
    assert!(!runner.log().contains(other.secret.as_deref().unwrap()));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_runner_with_no_next_envelope_exits_kept_expired_or_recycled(db: sqlx::PgPool) {
    let api = TestApp::start(db.clone()).await;
    let (session_id, work) = session_with_work(&api).await;
    let (workspace, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut runner = Kept::start(&api, workspace.path(), tmp.path(), 2);
    runner.send(&envelope(&api, &work, &session_id));
    end_turn(&db, &session_id).await;
    runner.logs_within(KEPT, WAIT).await;
    let status = runner.exits_within(WAIT).await;
    assert_eq!(status.code(), Some(12), "KeptExpired: {}", runner.log());

    // Its stdin closed instead: recycled, as a warm sandbox's.
    let (session_id, work) = session_with_work(&api).await;
    let mut runner = Kept::start(&api, workspace.path(), tmp.path(), 30);
    runner.send(&envelope(&api, &work, &session_id));
    end_turn(&db, &session_id).await;
    runner.logs_within(KEPT, WAIT).await;
    drop(runner.stdin.take());
    let status = runner.exits_within(WAIT).await;
    assert_eq!(status.code(), Some(9), "Recycled: {}", runner.log());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_stop_during_the_activation_is_not_kept(db: sqlx::PgPool) {
    // A short lease: the Stop reaches the runner with its next renewal.
    let api = TestApp::start_with(
        db.clone(),
        Settings {
            default_ttl_seconds: 3,
            caller_plays_model: true,
            ..Default::default()
        },
    )
    .await;
    let (session_id, work) = session_with_work(&api).await;
    let (workspace, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut runner = Kept::start(&api, workspace.path(), tmp.path(), 30);
    runner.send(&envelope(&api, &work, &session_id));
    let call = append(&db, &session_id, vec![bash("echo up")]).await;
    result_of(&operator(&api), &session_id, &call[0], &runner).await;
    operator(&api)
        .stop(&api.env_id, &work.id, false)
        .await
        .unwrap();
    // stdin stays open: only the end of the activation can end the process.
    let status = runner.exits_within(WAIT).await;
    assert_eq!(status.code(), Some(0), "{}", runner.log());
    assert!(!runner.log().contains(KEPT), "{}", runner.log());
}
