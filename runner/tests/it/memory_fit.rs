//! Memory Stores that cannot fit their mount (issues 25 and 27), on real
//! small filesystems: a tmpfs this test mounts (it needs root, as this
//! machine and CI run; elsewhere the tests are skipped, and under `CI` they
//! fail instead). A Session whose stores cannot fit fails its start with
//! `session_input_failed_error` naming the store; a mount that fills up
//! during the download leaves an incomplete download that never counts as
//! done; memories a full mount kept out are never deleted by later syncs;
//! and a sync the token's write rate throttles leaves the rest for later.

use super::memory::{
    mount, read, remote, root_of, session_for, session_with_token, start_runner, write,
};
use mango_api::memory_quota::MemoryLimits;
use mango_api::Settings;
use mango_client::Client;
use mango_runner::memory::Mounted;
use mango_runner::prepare::PrepareError;
use mango_testkit::{json_events, TestApp};
use reqwest::Method;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// A tmpfs mounted at a new directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `mount -t tmpfs -o <options>`; `None` (the test skipped) where this
    /// process may not mount, which under `CI` is a failure.
    fn mount(options: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Tmpfs { dir }),
            other => {
                let why = format!("cannot mount a tmpfs (this test needs root): {other:?}");
                assert!(std::env::var_os("CI").is_none(), "{why}");
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Whatever is on it, for asserting nothing was left.
    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(self.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// The api, with Sessions mounting their stores on `root` and `limits`.
async fn api_mounting_on(db: sqlx::PgPool, root: &Path, limits: MemoryLimits) -> TestApp {
    TestApp::start_with(
        db,
        Settings {
            memory_mount_root: root.display().to_string(),
            memory_limits: limits,
            // The test appends the agent's events itself.
            caller_plays_model: true,
            ..Settings::default()
        },
    )
    .await
}

/// The runner's output once it exits; killed and failed after a minute.
async fn finished(mut runner: Child) -> Output {
    let deadline = Instant::now() + Duration::from_secs(60);
    while runner.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            runner.kill().unwrap();
            let out = runner.wait_with_output().unwrap();
            panic!(
                "the runner went on instead of ending: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::spawn_blocking(move || runner.wait_with_output())
        .await
        .unwrap()
        .unwrap()
}

/// Every memory of the store as (path, content digest), and how many
/// `deleted` versions it has: what "nothing deleted on the server" compares.
async fn server_state(api: &TestApp, store: &str) -> (Vec<(String, String)>, usize) {
    let memories = api
        .all_memories(store)
        .await
        .iter()
        .map(|m| {
            (
                m["path"].as_str().unwrap().to_string(),
                m["content_sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let deleted = api
        .store_call(
            Method::GET,
            store,
            "/memory_versions?operation=deleted",
            &api.ws_key,
            None,
        )
        .await;
    deleted.expect(200);
    (memories, deleted.body["data"].as_array().unwrap().len())
}

/// A store bigger than the whole mount: the real runner Fails the Work
/// before writing anything, the Session is terminated with
/// `session_input_failed_error` naming the store, and nothing is deleted.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_store_larger_than_its_mount_fails_the_session_naming_it(db: sqlx::PgPool) {
    let Some(tmpfs) = Tmpfs::mount("size=1m,mode=0700") else {
        return;
    };
    let api = api_mounting_on(db.clone(), tmpfs.path(), MemoryLimits::default()).await;
    let store = api.create_store("too big").await;
    // 12 × 25 blocks of 4 KiB and the marker's: 301 of the mount's 256.
    for i in 0..12 {
        api.create_memory(&store, &format!("/big/{i:02}.md"), &"m".repeat(100_000))
            .await;
    }
    let before = server_state(&api, &store).await;
    let (session, work, _) = session_for(&api, &[(&store, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let out = finished(start_runner(&api, &work, &session.id, workspace.path())).await;
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "input_failed: {log}");

    let operator = Client::new(&api.base, &api.ws_key);
    let events = json_events(operator.all_events(&session.id).await.unwrap());
    let error = events
        .iter()
        .find(|e| e["type"] == "session.error")
        .unwrap_or_else(|| panic!("no session.error: {events:?}"));
    assert_eq!(error["error"]["type"], "session_input_failed_error");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains(&store), "{message}");
    assert!(message.contains("cannot fit"), "{message}");
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "session.status_terminated"),
        "{events:?}"
    );
    assert!(
        tmpfs.entries().is_empty(),
        "nothing written: {:?}",
        tmpfs.entries()
    );
    assert_eq!(server_state(&api, &store).await, before, "nothing deleted");
    assert!(!log.contains("memory store downloaded"), "{log}");
}

/// Stores on one mount must fit it together, to its last block: two that
/// each fit but not together are refused naming both; one that takes every
/// block mounts, and one block more is refused.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stores_sharing_a_mount_fit_it_together_to_the_last_block(db: sqlx::PgPool) {
    let Some(tmpfs) = Tmpfs::mount("size=1m,mode=0700") else {
        return;
    };
    let api = api_mounting_on(db, tmpfs.path(), MemoryLimits::default()).await;
    let (first, second) = (
        api.create_store("first").await,
        api.create_store("second").await,
    );
    // The first takes the mount's 256 blocks of 4 KiB: its marker's, 10 × 25
    // and 5 × 1; the second 2 (its marker and one memory).
    for i in 0..10 {
        api.create_memory(&first, &format!("/big/{i}.md"), &"m".repeat(100_000))
            .await;
    }
    for i in 0..5 {
        api.create_memory(&first, &format!("/small/{i}.md"), "s")
            .await;
    }
    api.create_memory(&second, "/one.md", "1").await;
    let workspace = tempfile::tempdir().unwrap();
    let refusal = |session, client| {
        let workspace = workspace.path();
        async move {
            Mounted::download(&client, &session, workspace, Duration::from_secs(15))
                .await
                .err()
                .expect("the stores do not fit")
        }
    };

    let (session, _, client) =
        session_for(&api, &[(&first, "read_write"), (&second, "read_only")]).await;
    match refusal(session, client).await {
        PrepareError::Permanent(m) => {
            assert!(m.contains(&first) && m.contains(&second), "{m}");
            assert!(
                m.contains("(15 memories,") && m.contains("(1 memory,"),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(tmpfs.entries().is_empty(), "{:?}", tmpfs.entries());

    let (session, _, client) = session_for(&api, &[(&first, "read_write")]).await;
    let mut mounted = mount(&client, &session, workspace.path()).await;
    assert_eq!(mounted.stores()[0].baseline().len(), 15);
    let free = rustix::fs::statvfs(tmpfs.path()).unwrap().f_bavail;
    assert_eq!(free, 0, "every block taken");
    mounted.end(true).await;

    api.create_memory(&first, "/small/5.md", "s").await;
    let (session, _, client) = session_for(&api, &[(&first, "read_write")]).await;
    match refusal(session, client).await {
        PrepareError::Permanent(m) => assert!(m.contains(&first), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(tmpfs.entries().is_empty(), "{:?}", tmpfs.entries());
}

/// Space checked, then used up while downloading (here the mount runs out
/// of inodes, which the check does not count): the download fails as
/// incomplete, transient, its folder removed; the real runner leaves the
/// Work to be tried again, says why, and nothing is deleted.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_mount_that_fills_during_the_download_never_counts_as_downloaded(db: sqlx::PgPool) {
    // The mount's root, the store's folder and its marker take 3 of 16 inodes.
    let Some(tmpfs) = Tmpfs::mount("size=4m,nr_inodes=16,mode=0700") else {
        return;
    };
    let api = api_mounting_on(db.clone(), tmpfs.path(), MemoryLimits::default()).await;
    let store = api.create_store("many files").await;
    for i in 0..20 {
        api.create_memory(&store, &format!("/{i:02}.md"), "small")
            .await;
    }
    let before = server_state(&api, &store).await;
    let (session, work, client) = session_for(&api, &[(&store, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let err = Mounted::download(&client, &session, workspace.path(), Duration::from_secs(15))
        .await
        .err()
        .expect("an incomplete download is no download");
    match &err {
        PrepareError::Transient(m) => {
            assert!(m.contains(&store), "{m}");
            assert!(m.contains("No space left on device"), "{m}");
            assert!(m.contains("incomplete"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert!(tmpfs.entries().is_empty(), "{:?}", tmpfs.entries());

    let out = finished(start_runner(&api, &work, &session.id, workspace.path())).await;
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "left to expire: {log}");
    assert!(log.contains("did not fit"), "{log}");
    assert!(!log.contains("memory store downloaded"), "{log}");
    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, &work.id)
        .await
        .unwrap();
    assert_eq!(stored.state, mango_protocol::WorkState::Active, "{log}");
    let events = json_events(
        Client::new(&api.base, &api.ws_key)
            .all_events(&session.id)
            .await
            .unwrap(),
    );
    assert!(
        !events.iter().any(|e| e["type"] == "session.error"),
        "{events:?}"
    );
    assert!(tmpfs.entries().is_empty(), "{:?}", tmpfs.entries());
    assert_eq!(server_state(&api, &store).await, before, "nothing deleted");
}

/// After a download that fit, the mount fills up: pulls and a re-download
/// fail for want of space. Memories that never arrived are not local
/// deletions: however many syncs pass, the server keeps them; once there is
/// room they arrive.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn memories_a_full_mount_kept_out_are_never_deleted_by_later_syncs(db: sqlx::PgPool) {
    let Some(tmpfs) = Tmpfs::mount("size=1m,mode=0700") else {
        return;
    };
    let api = api_mounting_on(db, tmpfs.path(), MemoryLimits::default()).await;
    let store = api.create_store("filling").await;
    api.create_memory(&store, "/kept.md", "kept").await;
    api.create_memory(&store, "/changed.md", "v1").await;
    let (session, _, client) = session_for(&api, &[(&store, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let root = root_of(&session, 0);

    // Something else fills the mount; then the store changes remotely.
    let filler = tmpfs.path().join("filler");
    let filled = Command::new("sh")
        .arg("-c")
        .arg(format!("cat /dev/zero > '{}'", filler.display()))
        .output()
        .unwrap();
    assert!(!filled.status.success(), "the mount is full");
    for i in 0..3 {
        api.create_memory(&store, &format!("/new/{i}.md"), &"n".repeat(5_000))
            .await;
    }
    let id = api.memory_at(&store, "/changed.md").await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    api.store_call(
        Method::POST,
        &store,
        &format!("/memories/{id}"),
        &api.ws_key,
        Some(serde_json::json!({"content": "v2 ".repeat(2_000)})),
    )
    .await
    .expect(200);
    let before = server_state(&api, &store).await;
    for _ in 0..3 {
        mounted.sync_all(false).await;
    }
    assert!(read(&root, "new/0.md").is_none(), "no room for it");
    assert_eq!(read(&root, "changed.md").as_deref(), Some("v1"));
    // Every file wiped at once: the re-download cannot land either.
    std::fs::remove_file(root.join("kept.md")).unwrap();
    std::fs::remove_file(root.join("changed.md")).unwrap();
    for _ in 0..3 {
        mounted.sync_all(false).await;
    }
    assert_eq!(server_state(&api, &store).await, before, "nothing deleted");

    // Room again: everything arrives, and still nothing was deleted.
    std::fs::remove_file(&filler).unwrap();
    mounted.sync_all(false).await;
    mounted.sync_all(false).await;
    assert_eq!(read(&root, "kept.md").as_deref(), Some("kept"));
    assert_eq!(read(&root, "changed.md"), Some("v2 ".repeat(2_000)));
    assert_eq!(read(&root, "new/2.md"), Some("n".repeat(5_000)));
    mounted.end(true).await;
    assert_eq!(server_state(&api, &store).await, before, "nothing deleted");
}

/// The token's write rate spent mid-sync: the pass stops sending (its
/// refused upload is not retried in a loop), a later pass sends the rest,
/// and the end's flush waits its turn rather than dropping files.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sync_the_write_rate_throttles_leaves_the_rest_for_later(db: sqlx::PgPool) {
    let root = tempfile::tempdir().unwrap();
    let limits = MemoryLimits {
        writes_per_minute: 60,
        write_burst: 3,
        ..MemoryLimits::default()
    };
    let api = api_mounting_on(db, root.path(), limits).await;
    let store = api.create_store("throttled").await;
    let (session, _, _, token) = session_with_token(&api, &[(&store, "read_write")]).await;
    let client = Client::new(&api.base, &token);
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let dir = root_of(&session, 0);
    for i in 0..6 {
        write(&dir, &format!("{i}.md"), &format!("file {i}"));
    }
    let outcome = mounted.sync_all(false).await;
    assert_eq!(outcome[0].as_ref().unwrap().pushed, 3, "{outcome:?}");
    assert_eq!(api.all_memories(&store).await.len(), 3);
    // Files written since wait for the later passes too; the flush sends them all.
    write(&dir, "late.md", "late");
    mounted.flush().await;
    for i in 0..6 {
        assert_eq!(
            remote(&api, &store, &format!("/{i}.md")).await,
            Some(format!("file {i}"))
        );
    }
    assert_eq!(
        remote(&api, &store, "/late.md").await.as_deref(),
        Some("late")
    );
    mounted.end(false).await;
}
