//! Skills in the real `mango-runner` against a real api (spec §9, issue 18):
//! the pinned versions are materialized under `skills/` before any tool
//! runs and removed when the Work ends; the model is told about them; a
//! digest mismatch or a hostile archive Fails the Work, which terminates the
//! Session with `session_input_failed_error`; a retrieval that keeps failing
//! leaves the lease to expire.

use mango_api::context::Secret;
use mango_api::Settings;
use mango_client::Client;
use mango_protocol::WorkState;
use mango_testkit::skills::{skill_md, RawEntry, RawZip};
use mango_testkit::{json_events, model_reply, ScriptedModel, TestApp};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Starts `mango-runner` for `work` of `session` and waits for it to exit.
async fn run_runner(
    api: &TestApp,
    work: &mango_protocol::Work,
    session: &str,
    workspace: &Path,
) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mango-runner"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MANGO_BASE_URL", &api.base)
        .env("MANGO_WORK_ID", &work.id)
        .env("MANGO_ENVIRONMENT_ID", &api.env_id)
        .env("MANGO_WORK_TYPE", "session")
        .env("MANGO_SESSION_ID", session)
        .env("MANGO_WORKSPACE", workspace)
        .env("MANGO_IDLE_AFTER_END_TURN_SECONDS", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mango-runner starts");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", work.secret.as_deref().unwrap()).unwrap();
    drop(stdin);
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}

/// A Skill uploaded as a zip (so `scripts/run.sh` keeps its execute bit).
async fn upload_zip_skill(api: &TestApp, name: &str, description: &str) -> (String, String) {
    let md = skill_md(name, description);
    let zip = RawZip::new()
        .with(RawEntry::file(&format!("{name}/SKILL.md"), md.as_bytes()))
        .with(
            RawEntry::file(
                &format!("{name}/scripts/run.sh"),
                b"#!/bin/sh\necho SCRIPT-RAN\n",
            )
            .mode(0o100755),
        )
        .bytes();
    let r = api.upload_skill(&[(&format!("{name}.zip"), &zip)]).await;
    r.expect(200);
    (
        r.body["id"].as_str().unwrap().to_string(),
        r.body["latest_version_id"].as_str().unwrap().to_string(),
    )
}

/// An Agent with the toolset pinning `skills`, a Session with a message, its Work claimed.
async fn session_pinning(api: &TestApp, skills: Value) -> (String, mango_protocol::Work) {
    mango_testkit::runner::session_with_work_for(
        api,
        json!({"name": "skilled", "model": "claude-scripted", "system": "be useful",
               "tools": [{"type": "agent_toolset_20260401"}], "skills": skills}),
        json!([]),
    )
    .await
}

async fn archive_key(api: &TestApp, version: &str) -> String {
    sqlx::query_scalar("SELECT archive_key FROM skill_versions WHERE id = $1")
        .bind(version)
        .fetch_one(&api.db)
        .await
        .unwrap()
}

/// Replaces a version's archive (and, with `refreeze`, the length and digest
/// its row records, as if it had been uploaded so).
async fn replace_archive(api: &TestApp, version: &str, bytes: Vec<u8>, refreeze: bool) {
    let key = archive_key(api, version).await;
    if refreeze {
        sqlx::query("UPDATE skill_versions SET size_bytes = $2, sha256 = $3 WHERE id = $1")
            .bind(version)
            .bind(bytes.len() as i64)
            .bind(hex::encode(Sha256::digest(&bytes)))
            .execute(&api.db)
            .await
            .unwrap();
    }
    api.ctx
        .settings
        .skill_archives
        .put(&key, bytes)
        .await
        .unwrap();
}

/// The Session ended with `session_input_failed_error`, and its Work stopped.
async fn assert_input_failed(api: &TestApp, session: &str, work: &str, says: &str) {
    let operator = Client::new(&api.base, &api.ws_key);
    let events = json_events(operator.all_events(session).await.unwrap());
    let error = events
        .iter()
        .find(|e| e["type"] == "session.error")
        .unwrap_or_else(|| panic!("no session.error in {events:#?}"));
    assert_eq!(
        error["error"]["type"], "session_input_failed_error",
        "{error}"
    );
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{says:?} not in {message:?}");
    assert_eq!(events.last().unwrap()["type"], "session.status_terminated");
    let stored = operator.work(&api.env_id, work).await.unwrap();
    assert_eq!(stored.state, WorkState::Stopped);
}

/// Names under `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn pinned_skills_are_there_before_tools_run_and_gone_after(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": "toolu_1", "name": "bash",
                        "input": {"command": "head -3 skills/pdf-tools/SKILL.md; skills/pdf-tools/scripts/run.sh; stat -c '%a %n' skills/pdf-tools/scripts/run.sh skills/pdf-tools/SKILL.md; ls -A1 skills"}}]),
                "tool_use",
            ),
        ),
        (200, model_reply(json!([{"type": "text", "text": "done"}]), "end_turn")),
    ])
    .await;
    let api = TestApp::start_with(
        db,
        Settings {
            model_base_url: Some(model.base.clone()),
            model_api_key: Some(Secret("sk-skills-test".into())),
            ..Default::default()
        },
    )
    .await;
    let (pdf, _) = upload_zip_skill(&api, "pdf-tools", "Fill PDF forms.").await;
    let (notes, _) = upload_zip_skill(&api, "notes", "Keep notes.").await;
    let (session, work) = session_pinning(
        &api,
        json!([{"type": "custom", "skill_id": pdf}, {"type": "custom", "skill_id": notes}]),
    )
    .await;

    // What an earlier activation's tools left: `skills` as a link to a
    // folder outside, and a half-made staging tree.
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious.txt"), "keep me").unwrap();
    std::os::unix::fs::symlink(outside.path(), workspace.path().join("skills")).unwrap();
    std::fs::create_dir(workspace.path().join(".skills-staging-0000000000000001")).unwrap();

    let out = run_runner(&api, &work, &session, workspace.path()).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);

    let operator = Client::new(&api.base, &api.ws_key);
    let events = json_events(operator.all_events(&session).await.unwrap());
    let result = events
        .iter()
        .find(|e| e["type"] == "user.tool_result")
        .unwrap_or_else(|| panic!("no tool result: {events:#?}"));
    let text = mango_testkit::runner::text_of(result);
    assert!(text.contains("name: pdf-tools"), "{text}");
    assert!(text.contains("SCRIPT-RAN"), "{text}");
    assert!(
        text.contains("755 skills/pdf-tools/scripts/run.sh"),
        "{text}"
    );
    assert!(text.contains("644 skills/pdf-tools/SKILL.md"), "{text}");
    assert!(
        text.lines().any(|l| l == "notes") && text.lines().any(|l| l == "pdf-tools"),
        "{text}"
    );

    // The model was told, in the system prompt of the first call.
    let (_, first) = &model.requests()[0];
    let system = first["system"][0]["text"].as_str().unwrap();
    assert!(system.starts_with("be useful\n\n<skills>"), "{system}");
    assert!(
        system.contains("- pdf-tools: Fill PDF forms. (skills/pdf-tools/SKILL.md)"),
        "{system}"
    );
    assert!(
        system.contains("- notes: Keep notes. (skills/notes/SKILL.md)"),
        "{system}"
    );

    // Gone when the Work ended; what the link pointed at never touched.
    assert_eq!(names(workspace.path()), Vec::<String>::new(), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("precious.txt")).unwrap(),
        "keep me"
    );
    let stored = operator.work(&api.env_id, &work.id).await.unwrap();
    assert_eq!(stored.state, WorkState::Stopped);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_digest_mismatch_fails_the_work(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let (skill, version) = upload_zip_skill(&api, "tampered", "Tampered with.").await;
    let (session, work) =
        session_pinning(&api, json!([{"type": "custom", "skill_id": skill}])).await;
    // Same length, other bytes: only the digest can tell.
    let key = archive_key(&api, &version).await;
    let mut bytes = api
        .ctx
        .settings
        .skill_archives
        .get(&key)
        .await
        .unwrap()
        .to_vec();
    let last = bytes.len() - 30;
    bytes[last] ^= 0xff;
    replace_archive(&api, &version, bytes, false).await;

    let workspace = tempfile::tempdir().unwrap();
    let out = run_runner(&api, &work, &session, workspace.path()).await;
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_input_failed(&api, &session, &work.id, "digest mismatch").await;
    assert_eq!(
        names(workspace.path()),
        Vec::<String>::new(),
        "nothing is left staged"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn hostile_archives_fail_the_work(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let md = skill_md("hostile", "Hostile.");
    let good = || RawEntry::file("hostile/SKILL.md", md.as_bytes());
    let mut many = RawZip::new().with(good());
    for i in 0..mango_protocol::skills::session_limits::MAX_FILES {
        many = many.with(RawEntry::file(&format!("hostile/f{i}"), b""));
    }
    let past_expanded = mango_protocol::skills::session_limits::MAX_EXPANDED_BYTES as u32 + 1;
    let cases = [
        (
            "traversal",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("hostile/../../../escape", b"x")),
            "..",
        ),
        (
            "absolute path",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("/tmp/escape", b"x")),
            "absolute",
        ),
        (
            "symlink",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("hostile/l", b"/etc").mode(0o120777)),
            "symbolic link",
        ),
        (
            "device",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("hostile/d", b"").mode(0o020666)),
            "character device",
        ),
        (
            "duplicate member",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("hostile/SKILL.md", b"x")),
            "more than once",
        ),
        (
            "expanded past the Session's limit",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("hostile/z", b"0").declared(past_expanded)),
            "expand to",
        ),
        ("files past the Session's limit", many, "10001 files"),
    ];
    for (what, zip, says) in cases {
        let (skill, version) = upload_zip_skill(&api, "hostile", "Hostile.").await;
        replace_archive(&api, &version, zip.bytes(), true).await;
        let (session, work) =
            session_pinning(&api, json!([{"type": "custom", "skill_id": skill}])).await;
        let workspace = tempfile::tempdir().unwrap();
        let out = run_runner(&api, &work, &session, workspace.path()).await;
        assert_eq!(
            out.status.code(),
            Some(6),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_input_failed(&api, &session, &work.id, says).await;
        assert_eq!(
            names(workspace.path()),
            Vec::<String>::new(),
            "{what}: nothing is left staged"
        );
        assert!(!Path::new("/tmp/escape").exists());
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_archive_that_cannot_be_retrieved_leaves_the_lease_to_expire(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let (skill, version) = upload_zip_skill(&api, "missing", "Missing.").await;
    let (session, work) =
        session_pinning(&api, json!([{"type": "custom", "skill_id": skill}])).await;
    // The row is there, its archive is not: the api answers 500 each time.
    let key = archive_key(&api, &version).await;
    api.ctx.settings.skill_archives.delete(&key).await.unwrap();
    let started = Instant::now();
    let workspace = tempfile::tempdir().unwrap();
    let out = run_runner(&api, &work, &session, workspace.path()).await;
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "it retried first"
    );
    let operator = Client::new(&api.base, &api.ws_key);
    let stored = operator.work(&api.env_id, &work.id).await.unwrap();
    assert_eq!(
        stored.state,
        WorkState::Active,
        "not stopped: the lease is left to expire"
    );
    let events = json_events(operator.all_events(&session).await.unwrap());
    assert!(
        events.iter().all(|e| e["type"] != "session.error"),
        "{events:#?}"
    );
    assert_eq!(names(workspace.path()), Vec::<String>::new());
}
