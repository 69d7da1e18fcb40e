//! `mango-runner` on Session Work: agent events appended in-process (as
//! the agent loop does), the real runner executes them against a real api.

use mango_testkit::runner::{session_with_work, session_with_work_for, text_of};

use mango_client::Client;
use mango_protocol::{Work, WorkState};
use mango_testkit::TestApp;
use mango_testkit::{append_agent_events, json_events};
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn start_runner(api: &TestApp, work: &Work, session_id: &str, workspace: &Path) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mango-runner"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MANGO_BASE_URL", &api.base)
        .env("MANGO_WORK_ID", &work.id)
        .env("MANGO_ENVIRONMENT_ID", &api.env_id)
        .env("MANGO_WORK_TYPE", "session")
        .env("MANGO_SESSION_ID", session_id)
        .env("MANGO_WORKSPACE", workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mango-runner starts");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", work.secret.as_deref().unwrap()).unwrap();
    drop(stdin);
    child
}

/// Waits until the Session holds a result for every call id.
async fn results_for(operator: &Client, session_id: &str, call_ids: &[&str]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = json_events(operator.all_events(session_id).await.unwrap());
        let results: Vec<Value> = events
            .into_iter()
            .filter(|e| {
                e["type"] == "user.tool_result"
                    && call_ids.contains(&e["tool_use_id"].as_str().unwrap_or(""))
            })
            .collect();
        if results.len() >= call_ids.len() {
            return results;
        }
        assert!(
            Instant::now() < deadline,
            "results did not arrive: {results:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_runner_executes_tool_calls_and_ends_with_the_session(db: sqlx::PgPool) {
    let api = TestApp::start(db.clone()).await;
    let (session_id, work) = session_with_work(&api).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut runner = start_runner(&api, &work, &session_id, workspace.path());

    let calls = append_agent_events(
        &db,
        &session_id,
        vec![
            json!({"type": "agent.tool_use", "name": "write", "input": {"file_path": "notes/a.txt", "content": "hello"}, "evaluated_permission": "allow"}),
            json!({"type": "agent.tool_use", "name": "bash", "input": {"command": "cat notes/a.txt; exit 3"}, "evaluated_permission": "allow"}),
            json!({"type": "agent.tool_use", "name": "bash", "input": {"command": "echo never"}, "evaluated_permission": "deny"}),
            json!({"type": "agent.tool_use", "name": "web_search", "input": {"query": "x"}}),
            json!({"type": "session.status_idle", "stop_reason": {"type": "requires_action"}}),
        ],
    )
    .await
    .unwrap();
    let ids: Vec<&str> = calls.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let operator = Client::new(&api.base, &api.ws_key);
    let results = results_for(&operator, &session_id, &ids[..2]).await;
    let by_call = |id: &str| results.iter().find(|r| r["tool_use_id"] == id).unwrap();
    assert_eq!(text_of(by_call(ids[0])), "wrote 5 bytes to notes/a.txt");
    assert_eq!(by_call(ids[0])["is_error"], false);
    assert!(
        text_of(by_call(ids[1])).contains("hello")
            && text_of(by_call(ids[1])).contains("exit code: 3")
    );
    assert_eq!(by_call(ids[1])["is_error"], true);
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("notes/a.txt")).unwrap(),
        "hello"
    );

    // The denied call and the tool it does not own get nothing.
    append_agent_events(
        &db,
        &session_id,
        vec![json!({"type": "session.status_terminated"})],
    )
    .await
    .unwrap();
    let status = tokio::task::spawn_blocking(move || runner.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let events = json_events(operator.all_events(&session_id).await.unwrap());
    assert!(!events
        .iter()
        .any(|e| e["tool_use_id"] == ids[2] || e["tool_use_id"] == ids[3]));
    let stored = operator.work(&api.env_id, &work.id).await.unwrap();
    assert_eq!(
        stored.state,
        WorkState::Stopped,
        "an ordinary exit force-stops the Work"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_tool_call_cannot_find_the_token_anywhere_it_can_read(db: sqlx::PgPool) {
    let api = TestApp::start(db.clone()).await;
    let (session_id, work) = session_with_work(&api).await;
    let token = mango_runner::secret::sessions_token(work.secret.as_deref().unwrap()).unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let mut runner = start_runner(&api, &work, &session_id, workspace.path());

    let probe = "echo PARENT; tr '\\0' '\\n' < /proc/$PPID/environ; \
                 for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f 2>/dev/null; done; \
                 env; grep -rs . . ; echo DONE";
    let calls = append_agent_events(
        &db,
        &session_id,
        vec![json!({"type": "agent.tool_use", "name": "bash", "input": {"command": probe}, "evaluated_permission": "allow"})],
    )
    .await
    .unwrap();
    let operator = Client::new(&api.base, &api.ws_key);
    let results = results_for(&operator, &session_id, &[calls[0]["id"].as_str().unwrap()]).await;
    let seen = text_of(&results[0]);
    assert!(
        seen.contains("PARENT") && seen.contains("DONE"),
        "the probe ran: {seen}"
    );
    assert!(
        !seen.contains(&token),
        "the sessions token leaked to a tool call"
    );
    assert!(
        !seen.contains(work.secret.as_deref().unwrap()),
        "the Work secret leaked to a tool call"
    );
    assert!(!seen
        .lines()
        .any(|l| l.starts_with("MANGO_") && l.contains("mango_st_")));

    append_agent_events(
        &db,
        &session_id,
        vec![json!({"type": "session.status_terminated"})],
    )
    .await
    .unwrap();
    let status = tokio::task::spawn_blocking(move || runner.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

/// Waits for the item to end (on a blocking thread, so the in-process api
/// keeps serving it); its exit code and stderr.
async fn finish(child: Child) -> (Option<i32>, String) {
    let waited = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .expect("the runner finishes")
    .unwrap()
    .unwrap();
    (
        waited.status.code(),
        String::from_utf8_lossy(&waited.stderr).into_owned(),
    )
}

/// A pinned input that cannot exist is a permanent input error: the runner
/// Fails the Work before any tool runs, and the Session terminates with
/// `session_input_failed_error` naming it (spec §3, §9).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pinned_input_that_cannot_exist_fails_the_work_and_terminates_the_session(
    db: sqlx::PgPool,
) {
    let api = TestApp::start(db).await;
    let operator = Client::new(&api.base, &api.ws_key);
    // A Skill version the Session froze, gone behind the api's back. (A
    // Memory Store deleted after the Session attached it: memory.rs.)
    let (skill, version) = api.create_skill("vanishing", "Gone.").await;
    let version = version["id"].as_str().unwrap().to_string();
    let cases = [(
        json!({"name": "a", "model": "m", "skills": [{"type": "custom", "skill_id": skill, "version": version}]}),
        json!([]),
        format!("custom Skill {skill} version {version}"),
    )];
    for (agent, resources, named) in cases {
        let (session_id, work) = session_with_work_for(&api, agent, resources).await;
        sqlx::query("DELETE FROM skills WHERE id = $1")
            .bind(&skill)
            .execute(&api.db)
            .await
            .unwrap();
        let workspace = tempfile::tempdir().unwrap();
        // A call is already waiting: it must not run.
        append_agent_events(
            &api.db,
            &session_id,
            vec![
                json!({"type": "agent.tool_use", "name": "write", "evaluated_permission": "allow",
                         "input": {"file_path": "ran.txt", "content": "x"}}),
            ],
        )
        .await
        .unwrap();
        let runner = start_runner(&api, &work, &session_id, workspace.path());
        let (code, stderr) = finish(runner).await;
        assert_eq!(code, Some(6), "{stderr}");

        let stored = operator.work(&api.env_id, &work.id).await.unwrap();
        assert_eq!(stored.state, WorkState::Stopped);
        let events = json_events(operator.all_events(&session_id).await.unwrap());
        let error = events
            .iter()
            .find(|e| e["type"] == "session.error")
            .expect("a session.error");
        assert_eq!(error["error"]["type"], "session_input_failed_error");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(&named), "{message}");
        assert_eq!(events.last().unwrap()["type"], "session.status_terminated");
        assert!(
            !events.iter().any(|e| e["type"] == "user.tool_result"),
            "no tool ran"
        );
        assert!(!workspace.path().join("ran.txt").exists());
    }
}
