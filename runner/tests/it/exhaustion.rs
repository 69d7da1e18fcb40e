//! A tool that fills the sandbox's process limit leaves the runner able to
//! finish its item. Here the limit is `RLIMIT_NPROC` (as `prlimit --nproc`
//! sets it) for a user of the test's own; a Docker sandbox's
//! `--pids-limit` refuses the same `clone` calls with the same EAGAIN. The
//! tool's processes outlive its call (a detached fork bomb), the runner's
//! idle threads of before would be gone by then, and yet the item answers
//! every call (a file tool, the shell, a shell that cannot start any more,
//! with an error) and ends with its final Stop.

use crate::support::{finish, results_for, runner_command, start};
use mango_client::Client;
use mango_protocol::WorkState;
use mango_testkit::runner::{session_with_work, text_of};
use mango_testkit::{append_agent_events, TestApp};
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::Path;

/// The runner may have this many processes and threads of its user...
const RUNNER_LIMIT: u64 = 32;
/// ...and the tool raises its own soft limit to this hard one and fills
/// it: the user's count stays above the runner's limit even when a process
/// ends, so nothing the runner would make can be made.
const TOOL_LIMIT: u64 = 64;

/// Forks a detached holder (its own session, so closing the shell leaves
/// it) that forks sleepers until the OS refuses; waits until it has, and
/// then past the 10 s tokio keeps an idle thread, so a runner that makes
/// threads on demand would need a new one.
const EXHAUST: &str = r#"
use POSIX ();
my $holder = fork // die "fork: $!";
if ($holder == 0) {
    POSIX::setsid();
    open(my $pid, '>', 'holder.pid') or die; print $pid $$; close($pid);
    my $n = 0;
    while (1) {
        my $child = fork;
        last unless defined $child;
        if ($child == 0) { sleep 300; POSIX::_exit(0); }
        $n++;
    }
    open(my $full, '>', 'full.tmp') or die; print $full "$n\n"; close($full);
    rename('full.tmp', 'full');
    sleep 300;
    POSIX::_exit(0);
}
select(undef, undef, undef, 0.05) until -e 'full';
sleep 11;
open(my $full, '<', 'full'); my $n = <$full>; chomp $n;
print "held $n sleepers\n";
"#;

/// A uid no one else uses, for the limit to count only the runner's.
fn fresh_uid() -> u32 {
    2_000_000_000 + rand::random::<u32>() % 1_000_000_000
}

/// Root can run a process as another user; elsewhere the test says why it skips.
fn can_switch_users() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("SKIPPED: running the runner as a user of its own under RLIMIT_NPROC needs root");
    }
    root && Path::new("/usr/bin/perl").exists()
}

/// On drop, kills the holder's process group (it and its sleepers) by the
/// id it wrote in the workspace, whatever the test's outcome.
struct Holder<'a>(&'a Path);

impl Drop for Holder<'_> {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.0.join("holder.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: a signal to the group the test's tool made.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        }
    }
}

async fn call(api: &TestApp, session_id: &str, tool: &str, input: Value) -> Value {
    let appended = append_agent_events(
        &api.db,
        session_id,
        vec![
            json!({"type": "agent.tool_use", "name": tool, "input": input, "evaluated_permission": "allow"}),
            json!({"type": "session.status_idle", "stop_reason": {"type": "requires_action"}}),
        ],
    )
    .await
    .unwrap();
    let id = appended[0]["id"].as_str().unwrap();
    let operator = Client::new(&api.base, &api.ws_key);
    results_for(&operator, session_id, &[id]).await.remove(0)
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_tool_that_fills_the_process_limit_leaves_the_item_answering_and_ending(
    db: sqlx::PgPool,
) {
    if !can_switch_users() {
        return;
    }
    let api = TestApp::start(db).await;
    let (session_id, work) = session_with_work(&api).await;
    let workspace = tempfile::tempdir().unwrap();
    let uid = fresh_uid();
    std::os::unix::fs::chown(workspace.path(), Some(uid), Some(uid)).unwrap();
    std::fs::write(workspace.path().join("exhaust.pl"), EXHAUST).unwrap();
    std::fs::write(workspace.path().join("notes.txt"), "kept\n").unwrap();
    // By name, so every new connection asks the resolver, as in a sandbox.
    let base = api.base.replace("127.0.0.1", "localhost");
    let mut command = runner_command(&base, &api.env_id, &work, &session_id, workspace.path());
    command.uid(uid).gid(uid);
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: RUNNER_LIMIT,
                rlim_max: TOOL_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NPROC, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let runner = start(command, &work);
    let _holder = Holder(workspace.path());

    let exhausted = call(
        &api,
        &session_id,
        "bash",
        json!({"command": format!("ulimit -Su {TOOL_LIMIT} && perl exhaust.pl && echo exhausted")}),
    )
    .await;
    let said = text_of(&exhausted);
    assert!(
        said.contains("held") && said.ends_with("exhausted"),
        "{said}"
    );
    assert_eq!(exhausted["is_error"], false);

    // A file tool needs no new thread.
    let read = call(&api, &session_id, "read", json!({"file_path": "notes.txt"})).await;
    assert_eq!(text_of(&read), "kept\n");
    assert_eq!(read["is_error"], false);
    // The shell still answers what needs no process...
    let echo = call(
        &api,
        &session_id,
        "bash",
        json!({"command": "echo still answering"}),
    )
    .await;
    assert_eq!(text_of(&echo), "still answering");
    // ...and a shell that cannot start is an error, not a wedge.
    let restart = call(
        &api,
        &session_id,
        "bash",
        json!({"restart": true, "command": "echo fresh"}),
    )
    .await;
    assert_eq!(restart["is_error"], true, "{restart}");
    let why = text_of(&restart);
    assert!(
        why.contains("could not start a shell") && why.contains("process limit"),
        "{why}"
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
    assert!(!stderr.contains("panicked"), "{stderr}");
    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, &work.id)
        .await
        .unwrap();
    assert_eq!(stored.state, WorkState::Stopped, "the final Stop went out");
}
