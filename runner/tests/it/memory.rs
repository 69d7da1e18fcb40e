//! The runner's Memory Stores (spec §9; issue 18, items 6 and 7) against a
//! real api on PostgreSQL, with a real sessions token: the download to each
//! store's mount path, the conflict matrix of a sync, a response lost after
//! the server saved an upload, read-only roots, the marker's guard, the
//! final sync and the push-only flush, and the real `mango-runner` doing it
//! all around a Session's tool calls, and flushing when a signal stops it.

use mango_api::Settings;
use mango_client::Client;
use mango_protocol::memory::MARKER_PATH;
use mango_protocol::sessions::Session;
use mango_protocol::{Work, WorkState};
use mango_runner::memory::Mounted;
use mango_runner::prepare::PrepareError;
use mango_runner::tools::{ToolContext, Toolset};
use mango_testkit::lossy::LossyProxy;
use mango_testkit::{append_agent_events, json_events, user_message, TestApp};
use reqwest::Method;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

/// The api, with Sessions mounting their stores under a temporary root.
async fn api_with_root(db: sqlx::PgPool) -> (TestApp, TempDir) {
    let root = tempfile::tempdir().unwrap();
    let api = TestApp::start_with(
        db,
        Settings {
            memory_mount_root: root.path().join("mnt").display().to_string(),
            // The tests append the agent's events themselves.
            caller_plays_model: true,
            ..Settings::default()
        },
    )
    .await;
    (api, root)
}

/// A Session attaching `stores` (`(id, access)`), its Work claimed: the
/// Session as the runner reads it, the Work, and a client with its token.
pub(crate) async fn session_for(api: &TestApp, stores: &[(&str, &str)]) -> (Session, Work, Client) {
    let (session, work, client, _) = session_with_token(api, stores).await;
    (session, work, client)
}

/// [`session_for`], with the sessions token itself.
pub(crate) async fn session_with_token(
    api: &TestApp,
    stores: &[(&str, &str)],
) -> (Session, Work, Client, String) {
    let agent = api.create_agent("memory").await;
    let resources: Vec<Value> = stores
        .iter()
        .map(
            |(id, access)| json!({"type": "memory_store", "memory_store_id": id, "access": access}),
        )
        .collect();
    let r = api
        .post_session(
            json!({"agent": agent, "environment_id": api.env_id, "resources": resources,
                             "initial_events": [user_message("go")]}),
        )
        .await;
    r.expect(200);
    let claim = api.claim_session_work().await;
    let client = Client::new(&api.base, &claim.token);
    let session = client
        .session(r.body["id"].as_str().unwrap())
        .await
        .unwrap();
    let work: Work = serde_json::from_value(claim.work).unwrap();
    (session, work, client, claim.token)
}

pub(crate) fn root_of(session: &Session, i: usize) -> PathBuf {
    match &session.resources[i] {
        mango_protocol::sessions::SessionResource::MemoryStore(m) => {
            PathBuf::from(m.mount_path.as_deref().unwrap())
        }
        other => panic!("not a store: {other:?}"),
    }
}

pub(crate) async fn mount(client: &Client, session: &Session, workspace: &Path) -> Mounted {
    match Mounted::download(client, session, workspace, Duration::from_secs(15)).await {
        Ok(m) => m,
        Err(e) => panic!("download failed: {e:?}"),
    }
}

pub(crate) fn read(root: &Path, rel: &str) -> Option<String> {
    std::fs::read_to_string(root.join(rel)).ok()
}

pub(crate) fn write(root: &Path, rel: &str, content: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// The server's content at `path` (`None`: no memory there).
pub(crate) async fn remote(api: &TestApp, store: &str, path: &str) -> Option<String> {
    api.memory_at(store, path)
        .await
        .map(|m| m["content"].as_str().unwrap().to_string())
}

async fn remote_update(api: &TestApp, store: &str, path: &str, content: &str) {
    let id = api.memory_at(store, path).await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    api.store_call(
        Method::POST,
        store,
        &format!("/memories/{id}"),
        &api.ws_key,
        Some(json!({"content": content})),
    )
    .await
    .expect(200);
}

async fn remote_delete(api: &TestApp, store: &str, path: &str) {
    let id = api.memory_at(store, path).await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    api.store_call(
        Method::DELETE,
        store,
        &format!("/memories/{id}"),
        &api.ws_key,
        None,
    )
    .await
    .expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn download_mirrors_every_store_at_its_mount_path_with_its_marker(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db).await;
    let notes = api.create_store("Project Notes").await;
    let team = api.create_store("Team").await;
    for i in 0..25 {
        api.create_memory(&notes, &format!("/daily/{i:02}.md"), &format!("day {i}"))
            .await;
    }
    api.create_memory(&notes, "/deep/er/than/that.md", "deep")
        .await;
    api.create_memory(&notes, "/empty.md", "").await;
    api.create_memory(&team, "/handbook.md", "be kind").await;
    let (session, _, client) =
        session_for(&api, &[(&notes, "read_write"), (&team, "read_only")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;

    let (rw, ro) = (root_of(&session, 0), root_of(&session, 1));
    assert!(rw.ends_with("mnt/project-notes"), "{}", rw.display());
    assert_eq!(mounted.roots(), [rw.clone(), ro.clone()]);
    assert_eq!(mounted.read_only_roots(), std::slice::from_ref(&ro));
    assert_eq!(read(&rw, "daily/00.md").as_deref(), Some("day 0"));
    assert_eq!(read(&rw, "daily/24.md").as_deref(), Some("day 24"));
    assert_eq!(read(&rw, "deep/er/than/that.md").as_deref(), Some("deep"));
    assert_eq!(read(&rw, "empty.md").as_deref(), Some(""));
    assert_eq!(read(&ro, "handbook.md").as_deref(), Some("be kind"));
    assert_eq!(
        read(&rw, MARKER_PATH).unwrap(),
        format!("version 1\n{notes}")
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&rw).unwrap().mode() & 0o777, 0o700);
    assert_eq!(
        std::fs::metadata(rw.join("empty.md")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(mounted.stores()[0].baseline().len(), 27);
    mounted.end(true).await;
    assert!(!rw.exists() && !ro.exists(), "the folders go at the end");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_download_that_cannot_land_leaves_nothing_and_says_why(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db).await;
    let first = api.create_store("first").await;
    let second = api.create_store("second").await;
    api.create_memory(&first, "/a.md", "a").await;
    let (session, _, client) =
        session_for(&api, &[(&first, "read_write"), (&second, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let (one, two) = (root_of(&session, 0), root_of(&session, 1));

    // Something already at a mount path: the item is not run (transient), nothing is made.
    std::fs::create_dir_all(&two).unwrap();
    std::fs::write(two.join("leftover"), "from a dead runner").unwrap();
    let err = Mounted::download(&client, &session, workspace.path(), Duration::from_secs(15))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, PrepareError::Transient(m) if m.contains("already exists")),
        "{err:?}"
    );
    assert!(!one.exists(), "the first store's folder was removed again");
    assert_eq!(
        read(&two, "leftover").as_deref(),
        Some("from a dead runner")
    );
    std::fs::remove_dir_all(&two).unwrap();

    // A store deleted after the Session was created: a permanent input error.
    api.store_call(Method::DELETE, &second, "", &api.ws_key, None)
        .await
        .expect(200);
    let err = Mounted::download(&client, &session, workspace.path(), Duration::from_secs(15))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, PrepareError::Permanent(m) if m.contains(&second) && m.contains("404")),
        "{err:?}"
    );
    assert!(!one.exists() && !two.exists());
}

async fn deleted_versions(api: &TestApp, store: &str) -> usize {
    api.store_call(
        Method::GET,
        store,
        "/memory_versions?operation=deleted",
        &api.ws_key,
        None,
    )
    .await
    .body["data"]
        .as_array()
        .unwrap()
        .len()
}

/// Every row of the merge table, in one sync and its follow-up.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_conflict_matrix(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db).await;
    let store = api.create_store("matrix").await;
    for name in [
        "local-edit",
        "remote-edit",
        "both-edit",
        "remote-delete",
        "remote-delete-local-edit",
        "local-delete",
        "local-delete-remote-edit",
        "same-edit",
        "untouched",
    ] {
        api.create_memory(&store, &format!("/{name}.md"), "v1")
            .await;
    }
    let (session, _, client) = session_for(&api, &[(&store, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let root = root_of(&session, 0);

    write(&root, "local-edit.md", "local");
    remote_update(&api, &store, "/remote-edit.md", "remote").await;
    write(&root, "both-edit.md", "local");
    remote_update(&api, &store, "/both-edit.md", "remote").await;
    remote_delete(&api, &store, "/remote-delete.md").await;
    remote_delete(&api, &store, "/remote-delete-local-edit.md").await;
    write(&root, "remote-delete-local-edit.md", "the only copy");
    std::fs::remove_file(root.join("local-delete.md")).unwrap();
    std::fs::remove_file(root.join("local-delete-remote-edit.md")).unwrap();
    remote_update(&api, &store, "/local-delete-remote-edit.md", "remote").await;
    write(&root, "same-edit.md", "same");
    remote_update(&api, &store, "/same-edit.md", "same").await;
    write(&root, "new/local.md", "new here");
    api.create_memory(&store, "/new/remote.md", "new there")
        .await;

    let outcome = mounted.sync_all(false).await;
    assert!(outcome[0].is_some(), "{outcome:?}");
    // Changed only here: pushed. Changed only there: pulled. Both: the remote wins.
    assert_eq!(
        remote(&api, &store, "/local-edit.md").await.as_deref(),
        Some("local")
    );
    assert_eq!(read(&root, "remote-edit.md").as_deref(), Some("remote"));
    assert_eq!(read(&root, "both-edit.md").as_deref(), Some("remote"));
    assert_eq!(
        remote(&api, &store, "/both-edit.md").await.as_deref(),
        Some("remote")
    );
    // Deleted there: removed here, unless edited here (then re-created from the file).
    assert!(read(&root, "remote-delete.md").is_none());
    assert!(remote(&api, &store, "/remote-delete.md").await.is_none());
    assert_eq!(
        remote(&api, &store, "/remote-delete-local-edit.md")
            .await
            .as_deref(),
        Some("the only copy")
    );
    // Deleted here, changed there: restored.
    assert_eq!(
        read(&root, "local-delete-remote-edit.md").as_deref(),
        Some("remote")
    );
    // Deleted here once: not yet deleted there.
    assert_eq!(
        remote(&api, &store, "/local-delete.md").await.as_deref(),
        Some("v1")
    );
    // The same bytes on both sides are adopted; new files travel both ways.
    assert_eq!(read(&root, "same-edit.md").as_deref(), Some("same"));
    assert_eq!(
        remote(&api, &store, "/new/local.md").await.as_deref(),
        Some("new here")
    );
    assert_eq!(read(&root, "new/remote.md").as_deref(), Some("new there"));
    assert_eq!(read(&root, "untouched.md").as_deref(), Some("v1"));

    // The second observation of the missing file deletes it there, with its digest as precondition.
    let deleted_before = deleted_versions(&api, &store).await;
    let outcome = mounted.sync_all(false).await;
    assert_eq!(
        outcome[0].as_ref().unwrap().deleted_remotely,
        1,
        "{outcome:?}"
    );
    assert!(remote(&api, &store, "/local-delete.md").await.is_none());
    assert_eq!(deleted_versions(&api, &store).await, deleted_before + 1);
    // The runner's writes are the Session's.
    let by_session = api
        .store_call(
            Method::GET,
            &store,
            &format!("/memory_versions?session_id={}", session.id),
            &api.ws_key,
            None,
        )
        .await;
    assert!(by_session.body["data"].as_array().unwrap().len() >= 4);
    // A quiet pass moves nothing.
    let idle = mounted.sync_all(false).await;
    assert_eq!(idle[0], Some(Default::default()));
    mounted.end(true).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_remote_edit_after_a_local_delete_was_seen_once_restores_the_file(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db).await;
    let store = api.create_store("seen once").await;
    api.create_memory(&store, "/gone.md", "v1").await;
    api.create_memory(&store, "/other.md", "o").await;
    let (session, _, client) = session_for(&api, &[(&store, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let root = root_of(&session, 0);
    std::fs::remove_file(root.join("gone.md")).unwrap();
    mounted.sync_all(false).await;
    assert_eq!(
        remote(&api, &store, "/gone.md").await.as_deref(),
        Some("v1")
    );
    // Between the two observations someone else edits it: the delete loses.
    remote_update(&api, &store, "/gone.md", "v2").await;
    mounted.sync_all(false).await;
    assert_eq!(
        remote(&api, &store, "/gone.md").await.as_deref(),
        Some("v2")
    );
    assert_eq!(read(&root, "gone.md").as_deref(), Some("v2"));
    // A file that comes back before the second observation is not deleted either.
    std::fs::remove_file(root.join("other.md")).unwrap();
    mounted.sync_all(false).await;
    write(&root, "other.md", "o");
    mounted.sync_all(false).await;
    assert_eq!(
        remote(&api, &store, "/other.md").await.as_deref(),
        Some("o")
    );
    mounted.end(false).await;
}

/// The server saved an upload, its answer was lost, the client's retry got a
/// 409: the next listing shows the bytes sent, which count as synced, so a
/// newer local edit goes up over them instead of losing to them.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_response_lost_after_the_server_saved_it(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db).await;
    let store = api.create_store("lossy").await;
    api.create_memory(&store, "/note.md", "v1").await;
    let (session, _, _, token) = session_with_token(&api, &[(&store, "read_write")]).await;
    let proxy = LossyProxy::start(&api.base).await;
    let client = Client::new(&proxy.base, &token);
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let root = root_of(&session, 0);
    let id = api.memory_at(&store, "/note.md").await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // An update whose answer is lost.
    write(&root, "note.md", "v2");
    proxy.drop_next("POST", &format!("/memories/{id}"));
    mounted.sync_all(false).await;
    assert_eq!(proxy.dropped().len(), 1, "{:?}", proxy.dropped());
    assert_eq!(
        remote(&api, &store, "/note.md").await.as_deref(),
        Some("v2")
    );
    // Edited again before the next sync: v3 goes up, v2 is not pulled over it.
    write(&root, "note.md", "v3");
    mounted.sync_all(false).await;
    assert_eq!(
        remote(&api, &store, "/note.md").await.as_deref(),
        Some("v3")
    );
    assert_eq!(read(&root, "note.md").as_deref(), Some("v3"));

    // A create whose answer is lost: one memory, the file kept, no conflict later.
    write(&root, "fresh.md", "created once");
    proxy.drop_next("POST", &format!("/v1/memory_stores/{store}/memories"));
    mounted.sync_all(false).await;
    assert_eq!(proxy.dropped().len(), 2, "{:?}", proxy.dropped());
    assert_eq!(
        remote(&api, &store, "/fresh.md").await.as_deref(),
        Some("created once")
    );
    let outcome = mounted.sync_all(false).await;
    assert_eq!(
        outcome[0],
        Some(Default::default()),
        "settled: nothing more to do"
    );
    assert_eq!(read(&root, "fresh.md").as_deref(), Some("created once"));
    let creates = api
        .store_call(
            Method::GET,
            &store,
            "/memory_versions?operation=created",
            &api.ws_key,
            None,
        )
        .await;
    assert_eq!(creates.body["data"].as_array().unwrap().len(), 2);
    mounted.end(true).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_read_only_store_pulls_and_its_root_refuses_write_and_edit(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db).await;
    let ro = api.create_store("reference").await;
    let rw = api.create_store("scratch").await;
    api.create_memory(&ro, "/facts.md", "the sky is blue").await;
    api.create_memory(&ro, "/kept.md", "k").await;
    let (session, _, client) = session_for(&api, &[(&ro, "read_only"), (&rw, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let (ro_root, rw_root) = (root_of(&session, 0), root_of(&session, 1));

    let mut tools = Toolset::new(ToolContext {
        allowed_roots: mounted.roots(),
        read_only_roots: mounted.read_only_roots(),
        ..ToolContext::new(workspace.path())
    });
    let cancel = CancellationToken::new;
    let facts = ro_root.join("facts.md").display().to_string();
    let out = tools
        .run("read", &json!({"file_path": facts}), cancel())
        .await;
    assert!(
        !out.is_error && out.text_content() == "the sky is blue",
        "{out:?}"
    );
    let out = tools
        .run(
            "write",
            &json!({"file_path": facts, "content": "green"}),
            cancel(),
        )
        .await;
    assert!(
        out.is_error && out.text_content().contains("read-only"),
        "{out:?}"
    );
    let out = tools
        .run(
            "edit",
            &json!({"file_path": facts, "old_string": "blue", "new_string": "green"}),
            cancel(),
        )
        .await;
    assert!(
        out.is_error && out.text_content().contains("read-only"),
        "{out:?}"
    );
    let new_ro = ro_root.join("new.md").display().to_string();
    let out = tools
        .run(
            "write",
            &json!({"file_path": new_ro, "content": "x"}),
            cancel(),
        )
        .await;
    assert!(out.is_error, "{out:?}");
    let scratch = rw_root.join("notes/today.md").display().to_string();
    let out = tools
        .run(
            "write",
            &json!({"file_path": scratch, "content": "did things"}),
            cancel(),
        )
        .await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(
        read(&ro_root, "facts.md").as_deref(),
        Some("the sky is blue")
    );
    tools.shutdown().await;

    // What bash can still do to a read-only folder never reaches the server,
    // and a remote change is pulled over an unchanged file.
    write(&ro_root, "facts.md", "bash wrote this");
    write(&ro_root, "bash-new.md", "x");
    std::fs::remove_file(ro_root.join("kept.md")).unwrap();
    api.create_memory(&ro, "/added.md", "added remotely").await;
    for _ in 0..2 {
        mounted.sync_all(false).await;
    }
    assert_eq!(
        remote(&api, &ro, "/facts.md").await.as_deref(),
        Some("the sky is blue")
    );
    assert!(remote(&api, &ro, "/bash-new.md").await.is_none());
    assert_eq!(remote(&api, &ro, "/kept.md").await.as_deref(), Some("k"));
    assert_eq!(
        read(&ro_root, "added.md").as_deref(),
        Some("added remotely")
    );
    assert_eq!(
        remote(&api, &rw, "/notes/today.md").await.as_deref(),
        Some("did things")
    );
    mounted.end(false).await;
    assert_eq!(
        remote(&api, &ro, "/facts.md").await.as_deref(),
        Some("the sky is blue")
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_marker_stops_an_altered_folder_from_being_uploaded_or_removed(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db).await;
    let store = api.create_store("guarded").await;
    api.create_memory(&store, "/a.md", "a").await;
    api.create_memory(&store, "/b.md", "b").await;
    let (session, _, client) = session_for(&api, &[(&store, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let root = root_of(&session, 0);

    // Every file wiped at once, the marker intact: downloaded again, nothing deleted.
    std::fs::remove_file(root.join("a.md")).unwrap();
    std::fs::remove_file(root.join("b.md")).unwrap();
    let outcome = mounted.sync_all(false).await;
    assert!(outcome[0].as_ref().unwrap().recovered, "{outcome:?}");
    mounted.sync_all(false).await;
    assert_eq!(read(&root, "a.md").as_deref(), Some("a"));
    assert_eq!(remote(&api, &store, "/a.md").await.as_deref(), Some("a"));

    // The whole folder gone: downloaded again.
    std::fs::remove_dir_all(&root).unwrap();
    let outcome = mounted.sync_all(false).await;
    assert!(outcome[0].as_ref().unwrap().recovered, "{outcome:?}");
    assert_eq!(read(&root, "b.md").as_deref(), Some("b"));

    // Another store's marker (or none) with files present: left as found.
    std::fs::write(root.join(MARKER_PATH), "version 1\nmemstore_someone_else").unwrap();
    write(&root, "a.md", "altered");
    write(&root, "planted.md", "not ours to upload");
    std::fs::remove_file(root.join("b.md")).unwrap();
    for _ in 0..3 {
        let outcome = mounted.sync_all(false).await;
        assert!(outcome[0].as_ref().unwrap().distrusted, "{outcome:?}");
    }
    mounted.flush().await;
    assert_eq!(remote(&api, &store, "/a.md").await.as_deref(), Some("a"));
    assert_eq!(remote(&api, &store, "/b.md").await.as_deref(), Some("b"));
    assert!(remote(&api, &store, "/planted.md").await.is_none());
    std::fs::remove_file(root.join(MARKER_PATH)).unwrap();
    mounted.sync_all(true).await;
    mounted.end(true).await;
    assert!(remote(&api, &store, "/planted.md").await.is_none());
    assert_eq!(remote(&api, &store, "/b.md").await.as_deref(), Some("b"));
    // The altered folder is kept for inspection.
    assert_eq!(
        read(&root, "planted.md").as_deref(),
        Some("not ours to upload")
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn links_and_files_that_cannot_be_memories_stay_local(db: sqlx::PgPool) {
    let (api, root_dir) = api_with_root(db).await;
    let store = api.create_store("hostile").await;
    let (session, _, client) = session_for(&api, &[(&store, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let root = root_of(&session, 0);
    let outside = root_dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "outside the store").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), root.join("link.md")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("linked-dir")).unwrap();
    std::fs::write(root.join("binary.bin"), [0xff, 0xfe, 0x00]).unwrap();
    std::fs::write(root.join("huge.md"), "x".repeat(102_401)).unwrap();
    write(&root, "fine.md", "fine");
    mounted.sync_all(false).await;
    mounted.sync_all(false).await;
    let listed: Vec<String> = api
        .all_memories(&store)
        .await
        .iter()
        .map(|m| m["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, ["/fine.md"]);
    // The exact limit is a memory.
    std::fs::write(root.join("huge.md"), "x".repeat(102_400)).unwrap();
    mounted.sync_all(false).await;
    assert_eq!(
        remote(&api, &store, "/huge.md").await.map(|c| c.len()),
        Some(102_400)
    );
    mounted.end(true).await;
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "outside the store"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_clean_end_syncs_fully_and_every_end_flushes_without_pulling_or_deleting(
    db: sqlx::PgPool,
) {
    let (api, _root) = api_with_root(db).await;
    let store = api.create_store("ends").await;
    for name in ["edited", "deleted", "conflict", "pulled"] {
        api.create_memory(&store, &format!("/{name}.md"), "v1")
            .await;
    }
    // An unclean end: push-only.
    let (session, _, client) = session_for(&api, &[(&store, "read_write")]).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let root = root_of(&session, 0);
    write(&root, "edited.md", "flushed");
    write(&root, "created.md", "flushed too");
    std::fs::remove_file(root.join("deleted.md")).unwrap();
    write(&root, "conflict.md", "local");
    remote_update(&api, &store, "/conflict.md", "remote").await;
    remote_update(&api, &store, "/pulled.md", "v2").await;
    mounted.end(false).await;
    assert!(!root.exists());
    assert_eq!(
        remote(&api, &store, "/edited.md").await.as_deref(),
        Some("flushed")
    );
    assert_eq!(
        remote(&api, &store, "/created.md").await.as_deref(),
        Some("flushed too")
    );
    assert_eq!(
        remote(&api, &store, "/deleted.md").await.as_deref(),
        Some("v1"),
        "a flush deletes nothing"
    );
    assert_eq!(
        remote(&api, &store, "/conflict.md").await.as_deref(),
        Some("remote"),
        "the remote version stays"
    );

    // A clean end: the final sync deletes what is gone (its re-check is the second observation).
    let (session, _, client) = session_for(&api, &[(&store, "read_write")]).await;
    let mut mounted = mount(&client, &session, workspace.path()).await;
    let root = root_of(&session, 0);
    assert_eq!(read(&root, "pulled.md").as_deref(), Some("v2"));
    std::fs::remove_file(root.join("deleted.md")).unwrap();
    write(&root, "edited.md", "final");
    mounted.end(true).await;
    assert!(remote(&api, &store, "/deleted.md").await.is_none());
    assert_eq!(
        remote(&api, &store, "/edited.md").await.as_deref(),
        Some("final")
    );
    assert!(!root.exists());
}

/// The real runner: a store downloaded before the first tool call, a file
/// the `write` tool put there uploaded by the final sync of a clean end,
/// and the folder gone afterwards.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_runner_mounts_syncs_and_removes_the_sessions_stores(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db.clone()).await;
    let store = api.create_store("runner notes").await;
    api.create_memory(&store, "/known.md", "known before").await;
    let (session, work, _) = session_for(&api, &[(&store, "read_write")]).await;
    let root = root_of(&session, 0);
    let workspace = tempfile::tempdir().unwrap();
    let mut runner = start_runner(&api, &work, &session.id, workspace.path());
    let known = root.join("known.md").display().to_string();
    let learned = root.join("learned.md").display().to_string();
    let calls = append_agent_events(
        &db,
        &session.id,
        vec![
            json!({"type": "agent.tool_use", "name": "read", "input": {"file_path": known}, "evaluated_permission": "allow"}),
            json!({"type": "agent.tool_use", "name": "write", "input": {"file_path": learned, "content": "learned now"}, "evaluated_permission": "allow"}),
            json!({"type": "session.status_idle", "stop_reason": {"type": "requires_action"}}),
        ],
    )
    .await
    .unwrap();
    let operator = Client::new(&api.base, &api.ws_key);
    let ids: Vec<&str> = calls
        .iter()
        .take(2)
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let results = loop {
        let events = json_events(operator.all_events(&session.id).await.unwrap());
        let results: Vec<Value> = events
            .into_iter()
            .filter(|e| e["type"] == "user.tool_result")
            .collect();
        if results.len() == 2 {
            break results;
        }
        assert!(Instant::now() < deadline, "{results:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = |id: &str| {
        let r = results.iter().find(|r| r["tool_use_id"] == id).unwrap();
        mango_testkit::runner::text_of(r)
    };
    assert_eq!(text(ids[0]), "known before");
    assert!(text(ids[1]).starts_with("wrote"), "{}", text(ids[1]));
    // The turn ends; the runner leaves after its idle limit with a final sync.
    append_agent_events(
        &db,
        &session.id,
        vec![json!({"type": "session.status_idle", "stop_reason": {"type": "end_turn"}})],
    )
    .await
    .unwrap();
    let status = tokio::task::spawn_blocking(move || runner.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        remote(&api, &store, "/learned.md").await.as_deref(),
        Some("learned now")
    );
    assert!(!root.exists(), "the store folder is removed at the end");
    let stored = operator.work(&api.env_id, &work.id).await.unwrap();
    assert_eq!(stored.state, WorkState::Stopped);
}

/// A store deleted after the Session attached it cannot be mounted: the
/// runner Fails the Work, which terminates the Session naming the store.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_deleted_store_fails_the_work_and_terminates_the_session(db: sqlx::PgPool) {
    let (api, _root) = api_with_root(db.clone()).await;
    let store = api.create_store("short lived").await;
    let (session, work, _) = session_for(&api, &[(&store, "read_write")]).await;
    api.store_call(Method::DELETE, &store, "", &api.ws_key, None)
        .await
        .expect(200);
    let workspace = tempfile::tempdir().unwrap();
    let runner = start_runner(&api, &work, &session.id, workspace.path());
    let out = tokio::task::spawn_blocking(move || runner.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let operator = Client::new(&api.base, &api.ws_key);
    let events = json_events(operator.all_events(&session.id).await.unwrap());
    let error = events
        .iter()
        .find(|e| e["type"] == "session.error")
        .unwrap();
    assert_eq!(error["error"]["type"], "session_input_failed_error");
    assert!(
        error["error"]["message"].as_str().unwrap().contains(&store),
        "{error}"
    );
    assert!(!root_of(&session, 0).exists());
}

/// A stop signal while a tool call runs, with a file the call wrote into a
/// read_write store that no sync has seen (the sync interval is long): the
/// runner cancels the call, flushes the file to the server, removes the
/// folder and exits 7 (`signalled`) within its bound. With a Stop asked for
/// first (the supervisor's case) the Work is stopped; with none (an
/// eviction, `docker stop`) its lease is left to expire for Poll.
async fn a_signal_flushes_unsynced_changes(db: sqlx::PgPool, stop_first: bool) {
    let (api, _root) = api_with_root(db.clone()).await;
    let store = api.create_store("signal notes").await;
    api.create_memory(&store, "/known.md", "known").await;
    let (session, work, _) = session_for(&api, &[(&store, "read_write")]).await;
    let root = root_of(&session, 0);
    let workspace = tempfile::tempdir().unwrap();
    let runner = start_runner_with(
        &api,
        &work,
        &session.id,
        workspace.path(),
        &[("MANGO_MEMORY_SYNC_INTERVAL_SECONDS", "600")],
    );
    let late = root.join("late.md");
    let command = format!(
        "echo written-before-the-signal > '{}' && sleep 120",
        late.display()
    );
    append_agent_events(
        &db,
        &session.id,
        vec![
            json!({"type": "agent.tool_use", "name": "bash", "input": {"command": command}, "evaluated_permission": "allow"}),
            json!({"type": "session.status_idle", "stop_reason": {"type": "requires_action"}}),
        ],
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while read(&root, "late.md").is_none() {
        assert!(Instant::now() < deadline, "the call never wrote its file");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        remote(&api, &store, "/late.md").await.is_none(),
        "not synced yet"
    );
    if stop_first {
        api.stop_work(&work.id, false).await;
    }
    let signalled = Instant::now();
    let pid = rustix::process::Pid::from_child(&runner);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = tokio::task::spawn_blocking(move || runner.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let took = signalled.elapsed();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{log}");
    assert!(
        took < mango_runner::signal::EXIT_BOUND,
        "exited {took:?} after the signal"
    );
    assert!(
        took < Duration::from_secs(5),
        "the sleep was cancelled: {took:?}"
    );
    assert_eq!(
        remote(&api, &store, "/late.md").await.as_deref(),
        Some("written-before-the-signal\n"),
        "{log}"
    );
    assert!(!root.exists(), "the store folder is removed");
    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, &work.id)
        .await
        .unwrap();
    let want = if stop_first {
        WorkState::Stopped
    } else {
        WorkState::Active
    };
    assert_eq!(stored.state, want, "{log}");
    // The cancelled call got no result: a reclaim runs it again.
    let events = json_events(
        Client::new(&api.base, &api.ws_key)
            .all_events(&session.id)
            .await
            .unwrap(),
    );
    assert!(
        !events.iter().any(|e| e["type"] == "user.tool_result"),
        "{events:?}"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sigterm_after_a_stop_flushes_the_stores_stops_the_work_and_exits_7(db: sqlx::PgPool) {
    a_signal_flushes_unsynced_changes(db, true).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sigterm_with_no_stop_flushes_and_leaves_the_lease_to_expire(db: sqlx::PgPool) {
    a_signal_flushes_unsynced_changes(db, false).await;
}

pub(crate) fn start_runner(
    api: &TestApp,
    work: &Work,
    session_id: &str,
    workspace: &Path,
) -> std::process::Child {
    start_runner_with(api, work, session_id, workspace, &[])
}

pub(crate) fn start_runner_with(
    api: &TestApp,
    work: &Work,
    session_id: &str,
    workspace: &Path,
    env: &[(&str, &str)],
) -> std::process::Child {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_mango-runner"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MANGO_BASE_URL", &api.base)
        .env("MANGO_WORK_ID", &work.id)
        .env("MANGO_ENVIRONMENT_ID", &api.env_id)
        .env("MANGO_WORK_TYPE", "session")
        .env("MANGO_SESSION_ID", session_id)
        .env("MANGO_WORKSPACE", workspace)
        .env("MANGO_IDLE_AFTER_END_TURN_SECONDS", "1")
        .envs(env.iter().copied())
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
