//! `mango-runner` on Session Work as a supervisor starts it (identity in
//! the environment, the secret on stdin), with room for what a test
//! changes (the api's address, the directory, the user, limits), and
//! waiting on what it posts.

use mango_client::Client;
use mango_protocol::Work;
use mango_testkit::json_events;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The runner's command for `work` of `session_id` against `base`, in
/// `workspace`, idle for 2 s after an end-of-turn; not started yet.
pub fn runner_command(
    base: &str,
    environment_id: &str,
    work: &Work,
    session_id: &str,
    workspace: &Path,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mango-runner"));
    command
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MANGO_BASE_URL", base)
        .env("MANGO_WORK_ID", &work.id)
        .env("MANGO_ENVIRONMENT_ID", environment_id)
        .env("MANGO_WORK_TYPE", "session")
        .env("MANGO_SESSION_ID", session_id)
        .env("MANGO_WORKSPACE", workspace)
        .env("MANGO_IDLE_AFTER_END_TURN_SECONDS", "2")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Starts `command` and hands it `work`'s secret.
pub fn start(mut command: Command, work: &Work) -> Child {
    let mut child = command.spawn().expect("mango-runner starts");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", work.secret.as_deref().unwrap()).unwrap();
    drop(stdin);
    child
}

/// Waits until the Session holds a result for every call id; the results.
pub async fn results_for(operator: &Client, session_id: &str, call_ids: &[&str]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
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
            "results did not arrive for {call_ids:?}: {results:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the runner to end (on a blocking thread, so the in-process
/// api keeps serving it); its exit code and stderr.
pub async fn finish(child: Child) -> (Option<i32>, String) {
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
