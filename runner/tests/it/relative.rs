//! Relative path settings are taken from the directory the runner starts
//! in, once, at start: a runner given `MANGO_WORKSPACE=ws` (as
//! `mango-worker local` with its default relative root gives one) and a
//! relative `HOME` runs its shell and its file tools in that one workspace.

use crate::support::{finish, results_for, runner_command, start};
use mango_client::Client;
use mango_testkit::runner::{session_with_work, text_of};
use mango_testkit::{append_agent_events, TestApp};
use serde_json::json;
use std::path::Path;

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_relative_workspace_is_the_one_the_runner_starts_beside(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let (session_id, work) = session_with_work(&api).await;
    let parent = tempfile::tempdir().unwrap();
    let workspace = parent.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("given.txt"), "given\n").unwrap();
    let mut command = runner_command(&api.base, &api.env_id, &work, &session_id, Path::new("ws"));
    command.current_dir(parent.path()).env("HOME", "ws");
    let runner = start(command, &work);

    let calls = append_agent_events(
        &api.db,
        &session_id,
        vec![
            json!({"type": "agent.tool_use", "name": "bash", "evaluated_permission": "allow",
                   "input": {"command": "pwd; cd ~ && pwd; cat given.txt; echo made > by-bash.txt"}}),
            json!({"type": "agent.tool_use", "name": "write", "evaluated_permission": "allow",
                   "input": {"file_path": "sub/by-write.txt", "content": "written"}}),
            json!({"type": "agent.tool_use", "name": "read", "evaluated_permission": "allow",
                   "input": {"file_path": workspace.join("given.txt")}}),
            json!({"type": "agent.tool_use", "name": "glob", "evaluated_permission": "allow",
                   "input": {"pattern": "**/*.txt"}}),
            json!({"type": "session.status_idle", "stop_reason": {"type": "requires_action"}}),
        ],
    )
    .await
    .unwrap();
    let ids: Vec<&str> = calls[..4]
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    let operator = Client::new(&api.base, &api.ws_key);
    let results = results_for(&operator, &session_id, &ids).await;
    let by_call = |id: &str| results.iter().find(|r| r["tool_use_id"] == id).unwrap();
    for id in &ids {
        assert_eq!(by_call(id)["is_error"], false, "{}", by_call(id));
    }
    let at = workspace.display().to_string();
    assert_eq!(
        text_of(by_call(ids[0])),
        format!("{at}\n{at}\ngiven"),
        "the shell starts in the workspace, and HOME is it too"
    );
    assert_eq!(text_of(by_call(ids[2])), "given\n");
    let listed = text_of(by_call(ids[3]));
    for name in ["given.txt", "by-bash.txt", "by-write.txt"] {
        assert!(listed.contains(name), "{name} in {listed}");
    }
    assert_eq!(
        std::fs::read_to_string(workspace.join("sub/by-write.txt")).unwrap(),
        "written"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("by-bash.txt")).unwrap(),
        "made\n"
    );

    append_agent_events(
        &api.db,
        &session_id,
        vec![json!({"type": "session.status_terminated"})],
    )
    .await
    .unwrap();
    let (code, stderr) = finish(runner).await;
    assert_eq!(code, Some(0), "{stderr}");
}
