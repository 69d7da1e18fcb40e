//! `/v1/skills` (issue 18, wire contract §8.1): Skills and their immutable
//! versions in the SDK's shapes, the archive Mango builds and stores in its
//! object store, every upload limit at its edge, hostile archives refused
//! with nothing left behind, pins frozen at Session creation, and who may
//! download what.

use mango_api::skills::objects::Archives;
use mango_api::Settings;
use mango_protocol::skills::upload_limits;
use mango_testkit::skills::{file_parts, skill_md, Part, RawEntry, RawZip};
use mango_testkit::*;
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io::Read;

#[track_caller]
fn refused(r: &Reply, status: u16, code: &str, says: &str) {
    r.expect(status);
    assert_eq!(r.code(), Some(code), "{}", r.body);
    let message = r.body["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{says:?} not in {message:?}");
}

/// An api whose archives go to a folder of the test's own.
async fn app_with_store(db: sqlx::PgPool) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        skill_archives: Archives::local(dir.path()).unwrap(),
        ..Settings::default()
    };
    (TestApp::start_with(db, settings).await, dir)
}

/// Every file under `dir`.
fn stored_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

async fn skill_rows(app: &TestApp) -> (i64, i64) {
    let skills: i64 = sqlx::query_scalar("SELECT count(*) FROM skills")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let versions: i64 = sqlx::query_scalar("SELECT count(*) FROM skill_versions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    (skills, versions)
}

async fn get(app: &TestApp, path: &str, credential: &str) -> Reply {
    app.call(Method::GET, path, Some(credential), None).await
}

fn zip_names(archive: &[u8]) -> Vec<String> {
    let zip = zip::ZipArchive::new(std::io::Cursor::new(archive)).unwrap();
    zip.file_names().map(|n| n.unwrap().to_string()).collect()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn skills_and_versions_in_the_sdk_shapes(db: sqlx::PgPool) {
    let (app, dir) = app_with_store(db).await;
    let md = skill_md("pdf-tools", "Fill PDF forms.");
    let r = app
        .post_multipart(
            "/v1/skills",
            &app.ws_key,
            &[
                Part {
                    field: "files[]",
                    filename: Some("upload/SKILL.md"),
                    bytes: md.as_bytes(),
                },
                Part {
                    field: "files[]",
                    filename: Some("upload/scripts/fill.py"),
                    bytes: b"print('ok')\n",
                },
                Part {
                    field: "display_name",
                    filename: None,
                    bytes: b"PDF tools",
                },
            ],
        )
        .await;
    r.expect(200);
    let skill = r.body.clone();
    let mut keys: Vec<&str> = skill
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "created_at",
            "display_name",
            "id",
            "latest_version_id",
            "source",
            "type",
            "updated_at"
        ]
    );
    assert_eq!(skill["type"], "skill");
    assert_eq!(skill["source"], "custom");
    assert_eq!(skill["display_name"], "PDF tools");
    let id = skill["id"].as_str().unwrap();
    assert!(id.starts_with("skill_"));
    let v1 = skill["latest_version_id"].as_str().unwrap().to_string();

    let got = get(&app, &format!("/v1/skills/{id}"), &app.ws_key).await;
    got.expect(200);
    assert_eq!(got.body, skill);
    let version = get(
        &app,
        &format!("/v1/skills/{id}/versions/latest"),
        &app.ws_key,
    )
    .await;
    version.expect(200);
    assert_eq!(version.body["id"], v1.as_str());
    assert_eq!(version.body["type"], "skill_version");
    assert_eq!(version.body["skill_id"], id);
    assert_eq!(version.body["name"], "pdf-tools");
    assert_eq!(version.body["description"], "Fill PDF forms.");
    let by_id = get(&app, &format!("/v1/skills/{id}/versions/{v1}"), &app.ws_key).await;
    assert_eq!(by_id.body, version.body);

    // The archive: Mango's own zip under the slug, its length and digest recorded.
    let (status, archive) = app.download_skill(id, &v1, &app.ws_key).await;
    assert_eq!(status, 200);
    assert_eq!(
        archive.len() as i64,
        version.body["content_size_bytes"].as_i64().unwrap()
    );
    assert_eq!(
        hex::encode(Sha256::digest(&archive)),
        version.body["content_sha256"].as_str().unwrap()
    );
    assert_eq!(
        zip_names(&archive),
        ["pdf-tools/SKILL.md", "pdf-tools/scripts/fill.py"]
    );
    let resp = app
        .http
        .get(format!("{}/v1/skills/{id}/versions/{v1}/content", app.base))
        .bearer_auth(&app.ws_key)
        .header("accept", "application/binary")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/zip");
    assert_eq!(
        resp.headers()["content-disposition"],
        "attachment; filename=\"pdf-tools.zip\""
    );
    assert_eq!(stored_files(dir.path()).len(), 1);

    // A second version becomes latest; the first stays as it was.
    let md2 = skill_md("pdf-tools", "Fill and sign PDF forms.");
    let v2 = app
        .upload_version(id, &[("other-dir/SKILL.md", md2.as_bytes())])
        .await;
    v2.expect(200);
    let v2_id = v2.body["id"].as_str().unwrap().to_string();
    assert_ne!(v2_id, v1);
    let skill_now = get(&app, &format!("/v1/skills/{id}"), &app.ws_key).await;
    assert_eq!(skill_now.body["latest_version_id"], v2_id.as_str());
    let (_, again) = app.download_skill(id, &v1, &app.ws_key).await;
    assert_eq!(again, archive, "a version is immutable");

    // Lists: newest first, in cursor pages.
    let (second, _) = app.create_skill("second-skill", "Another.").await;
    let page = get(&app, "/v1/skills?limit=1", &app.ws_key).await;
    page.expect(200);
    assert_eq!(data_ids(&page.body), [second]);
    let next = page.body["next_page"].as_str().unwrap();
    let page2 = get(
        &app,
        &format!("/v1/skills?limit=1&page={next}"),
        &app.ws_key,
    )
    .await;
    assert_eq!(data_ids(&page2.body), [id.to_string()]);
    assert!(page2.body["next_page"].is_null());
    let anthropic = get(&app, "/v1/skills?source=anthropic", &app.ws_key).await;
    assert_eq!(anthropic.body["data"], json!([]));
    let versions = get(&app, &format!("/v1/skills/{id}/versions"), &app.ws_key).await;
    assert_eq!(data_ids(&versions.body), [v2_id.clone(), v1.clone()]);

    // Deleting: a version, never the last one, then the Skill with the rest.
    let del = app
        .call(
            Method::DELETE,
            &format!("/v1/skills/{id}/versions/{v2_id}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    del.expect(200);
    assert_eq!(
        del.body,
        json!({"id": v2_id, "type": "skill_version_deleted"})
    );
    let skill_now = get(&app, &format!("/v1/skills/{id}"), &app.ws_key).await;
    assert_eq!(
        skill_now.body["latest_version_id"],
        v1.as_str(),
        "latest moves back"
    );
    let last = app
        .call(
            Method::DELETE,
            &format!("/v1/skills/{id}/versions/{v1}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    refused(&last, 409, "last_skill_version", "delete the Skill itself");
    let del = app
        .call(
            Method::DELETE,
            &format!("/v1/skills/{id}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    del.expect(200);
    assert_eq!(del.body, json!({"id": id, "type": "skill_deleted"}));
    refused(
        &get(&app, &format!("/v1/skills/{id}"), &app.ws_key).await,
        404,
        "skill_not_found",
        id,
    );
    refused(
        &get(&app, &format!("/v1/skills/{id}/versions/{v1}"), &app.ws_key).await,
        404,
        "skill_not_found",
        id,
    );
    // Only the other Skill's archive is left in the store.
    assert_eq!(stored_files(dir.path()).len(), 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_zip_upload_keeps_its_executables_and_names_the_skill(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let md = skill_md("zipped", "From a zip.");
    let zip = RawZip::new()
        .with(RawEntry::file("zipped/", b"").mode(0o040755))
        .with(RawEntry::file("zipped/SKILL.md", md.as_bytes()).deflated())
        .with(RawEntry::file("zipped/bin/run", b"#!/bin/sh\n").mode(0o100755))
        .bytes();
    let r = app.upload_skill(&[("zipped.zip", &zip)]).await;
    r.expect(200);
    let id = r.body["id"].as_str().unwrap();
    let version = r.body["latest_version_id"].as_str().unwrap();
    let (_, archive) = app.download_skill(id, version, &app.ws_key).await;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(archive)).unwrap();
    let run = zip.by_name("zipped/bin/run").unwrap();
    assert_eq!(run.unix_mode().unwrap() & 0o777, 0o755);
    drop(run);
    let mut text = String::new();
    zip.by_name("zipped/SKILL.md")
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, md);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn bad_uploads_get_a_clear_error_and_leave_nothing(db: sqlx::PgPool) {
    let (app, dir) = app_with_store(db).await;
    let md = skill_md("s", "d");
    let ok_md = ("s/SKILL.md", md.as_bytes());
    for (files, code, says) in [
        (
            vec![("s.zip", &b"PK but not a zip"[..])],
            "invalid_skill",
            "not a readable zip archive",
        ),
        (
            vec![("s/README.md", &b"hi"[..])],
            "invalid_skill",
            "no SKILL.md",
        ),
        (
            vec![("SKILL.md", md.as_bytes())],
            "invalid_skill",
            "not inside a directory",
        ),
        (
            vec![ok_md, ("t/x", &b"x"[..])],
            "invalid_skill",
            "one top-level directory",
        ),
        (vec![ok_md, ("s/../x", &b"x"[..])], "invalid_skill", ".."),
        (
            vec![ok_md, ("/s/x", &b"x"[..])],
            "invalid_skill",
            "absolute",
        ),
        (
            vec![ok_md, ("s/x", &b"1"[..]), ("s/x", &b"2"[..])],
            "invalid_skill",
            "duplicate",
        ),
        (
            vec![("s/SKILL.md", &b"---\nname: s\n---\n"[..])],
            "invalid_skill",
            "description",
        ),
    ] {
        let r = app.upload_skill(&files).await;
        refused(&r, 400, code, says);
    }
    // Not multipart at all, an unknown field, no files.
    let r = app
        .call(
            Method::POST,
            "/v1/skills",
            Some(&app.ws_key),
            Some(json!({"files": []})),
        )
        .await;
    r.expect(400);
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("multipart/form-data"));
    let r = app
        .post_multipart(
            "/v1/skills",
            &app.ws_key,
            &[Part {
                field: "bogus",
                filename: None,
                bytes: b"x",
            }],
        )
        .await;
    refused(&r, 400, "invalid_parameter", "unknown form field \"bogus\"");
    let r = app.post_multipart("/v1/skills", &app.ws_key, &[]).await;
    refused(&r, 400, "invalid_skill", "files is required");
    // A NUL in display_name (PostgreSQL text cannot hold it) is refused before anything is stored.
    for (name, says) in [
        ("", "must not be empty"),
        ("two\nlines", "single line"),
        ("pdf\0tools", "must not contain the NUL character (U+0000)"),
        ("\0", "must not contain the NUL character (U+0000)"),
    ] {
        let r = app
            .post_multipart(
                "/v1/skills",
                &app.ws_key,
                &[
                    Part {
                        field: "files[]",
                        filename: Some("s/SKILL.md"),
                        bytes: md.as_bytes(),
                    },
                    Part {
                        field: "display_name",
                        filename: None,
                        bytes: name.as_bytes(),
                    },
                ],
            )
            .await;
        refused(&r, 400, "invalid_parameter", says);
    }
    let long = "n".repeat(upload_limits::MAX_DISPLAY_NAME_CHARS + 1);
    let r = app
        .post_multipart(
            "/v1/skills",
            &app.ws_key,
            &[
                Part {
                    field: "files[]",
                    filename: Some("s/SKILL.md"),
                    bytes: md.as_bytes(),
                },
                Part {
                    field: "display_name",
                    filename: None,
                    bytes: long.as_bytes(),
                },
            ],
        )
        .await;
    refused(&r, 400, "invalid_parameter", "at most 255");
    assert_eq!(skill_rows(&app).await, (0, 0));
    assert!(stored_files(dir.path()).is_empty());

    // A new version must keep the Skill's name; a version id names one Skill.
    let (a, a_version) = app.create_skill("alpha", "A.").await;
    let (b, _) = app.create_skill("beta", "B.").await;
    let other = skill_md("gamma", "C.");
    let r = app
        .upload_version(&a, &[("gamma/SKILL.md", other.as_bytes())])
        .await;
    refused(&r, 400, "skill_name_mismatch", "\"alpha\"");
    let a_v = a_version["id"].as_str().unwrap();
    let r = get(&app, &format!("/v1/skills/{b}/versions/{a_v}"), &app.ws_key).await;
    refused(
        &r,
        404,
        "skill_version_not_found",
        &format!("belongs to skill {a}"),
    );
    let (status, _) = app.download_skill(&b, a_v, &app.ws_key).await;
    assert_eq!(status, 404);
    let r = get(&app, "/v1/skills/skill_nope/versions/latest", &app.ws_key).await;
    refused(&r, 404, "skill_not_found", "skill_nope");
    let r = app.upload_version("skill_nope", &[ok_md]).await;
    refused(&r, 404, "skill_not_found", "skill_nope");
    assert_eq!(skill_rows(&app).await, (2, 2));
    assert_eq!(stored_files(dir.path()).len(), 2);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn hostile_archives_are_refused_and_leave_nothing(db: sqlx::PgPool) {
    let (app, dir) = app_with_store(db).await;
    let md = skill_md("evil", "Hostile.");
    let good = || RawEntry::file("evil/SKILL.md", md.as_bytes());
    let mut link_target = vec![0u8; 12];
    link_target.extend_from_slice(b"/etc/passwd");
    let over = upload_limits::MAX_EXPANDED_BYTES as usize + 1;
    let mut many = RawZip::new().with(good());
    for i in 0..upload_limits::MAX_FILES {
        many = many.with(RawEntry::file(&format!("evil/f{i}"), b""));
    }
    let cases: Vec<(&str, RawZip, u16, &str)> = vec![
        (
            "traversal",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/../../etc/x", b"x")),
            400,
            "..",
        ),
        (
            "absolute path",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("/etc/cron.d/x", b"x")),
            400,
            "absolute",
        ),
        (
            "symlink",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/link", b"/etc/passwd").mode(0o120777)),
            400,
            "symbolic link",
        ),
        (
            "hard link",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/hard", b"").extra(0x000d, link_target)),
            400,
            "hard or symbolic link",
        ),
        (
            "character device",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/tty", b"").mode(0o020666)),
            400,
            "character device",
        ),
        (
            "block device",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/sda", b"").mode(0o060660)),
            400,
            "block device",
        ),
        (
            "fifo",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/pipe", b"").mode(0o010644)),
            400,
            "FIFO",
        ),
        (
            "duplicate member",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/SKILL.md", b"again")),
            400,
            "more than once",
        ),
        (
            "shared data",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/copy", md.as_bytes()).sharing_previous()),
            400,
            "share their data",
        ),
        (
            "bomb past the expanded limit",
            RawZip::new()
                .with(good())
                .with(RawEntry::file("evil/zeros", &vec![0u8; over]).deflated()),
            413,
            "expand to",
        ),
        (
            "bomb that lies about its size",
            RawZip::new().with(good()).with(
                RawEntry::file("evil/zeros", &vec![0u8; 4096])
                    .deflated()
                    .declared(10),
            ),
            400,
            "expand",
        ),
        (
            "bomb past the file count",
            many,
            413,
            "more than 1000 files",
        ),
    ];
    for (what, zip, status, says) in cases {
        let bytes = zip.bytes();
        let r = app.upload_skill(&[("evil.zip", &bytes)]).await;
        assert_eq!(r.status.as_u16(), status, "{what}: {}", r.body);
        r.expect(status);
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(says),
            "{what}: {says:?} not in {message:?}"
        );
    }
    assert_eq!(skill_rows(&app).await, (0, 0));
    assert!(stored_files(dir.path()).is_empty());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn upload_limits_hold_at_their_edges(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let md = skill_md("edge", "At the edge.");
    let attempt = |files: Vec<(String, Vec<u8>)>| {
        let app = &app;
        async move {
            let refs: Vec<(&str, &[u8])> = files
                .iter()
                .map(|(p, b)| (p.as_str(), b.as_slice()))
                .collect();
            app.upload_skill(&refs).await
        }
    };
    let with_md = |mut rest: Vec<(String, Vec<u8>)>| {
        rest.insert(0, ("edge/SKILL.md".to_string(), md.clone().into_bytes()));
        rest
    };

    // Files: MAX_FILES in all, then one more.
    let files = |n: usize| {
        (1..n)
            .map(|i| (format!("edge/f/{i}"), vec![b'x']))
            .collect::<Vec<_>>()
    };
    attempt(with_md(files(upload_limits::MAX_FILES)))
        .await
        .expect(200);
    let r = attempt(with_md(files(upload_limits::MAX_FILES + 1))).await;
    refused(&r, 413, "request_too_large", "more than 1000 files");

    // The upload's size: exactly the limit (compressible, so the archive fits), then one byte more.
    let filler = |n: usize| vec![(String::from("edge/big.txt"), vec![b'a'; n])];
    let at = upload_limits::MAX_ARCHIVE_BYTES as usize - md.len();
    attempt(with_md(filler(at))).await.expect(200);
    let r = attempt(with_md(filler(at + 1))).await;
    refused(&r, 413, "request_too_large", "8388608");

    // A path: 1024 bytes, then 1025; a component: 255 bytes, then 256.
    let path = |n: usize| {
        format!(
            "edge/{}",
            "p/".repeat((n - 6) / 2) + if n % 2 == 1 { "qq" } else { "q" }
        )
    };
    assert_eq!(path(1024).len(), 1024);
    assert_eq!(path(1025).len(), 1025);
    attempt(with_md(vec![(path(1024), vec![b'x'])]))
        .await
        .expect(200);
    refused(
        &attempt(with_md(vec![(path(1025), vec![b'x'])])).await,
        400,
        "invalid_skill",
        "at most 1024",
    );
    let component = |n: usize| format!("edge/{}", "c".repeat(n));
    attempt(with_md(vec![(component(255), vec![b'x'])]))
        .await
        .expect(200);
    refused(
        &attempt(with_md(vec![(component(256), vec![b'x'])])).await,
        400,
        "invalid_skill",
        "at most 255",
    );

    // Expanded: a zip whose members expand to exactly the limit, then one byte more.
    let zeros = |n: usize| {
        RawZip::new()
            .with(RawEntry::file("edge/SKILL.md", md.as_bytes()))
            .with(RawEntry::file("edge/zeros", &vec![0u8; n]).deflated())
            .bytes()
    };
    let at = upload_limits::MAX_EXPANDED_BYTES as usize - md.len();
    let ok = app.upload_skill(&[("edge.zip", &zeros(at))]).await;
    ok.expect(200);
    let r = app.upload_skill(&[("edge.zip", &zeros(at + 1))]).await;
    refused(&r, 413, "request_too_large", "67108864");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_unavailable_store_or_a_failed_commit_leaves_nothing(db: sqlx::PgPool) {
    let (app, dir) = app_with_store(db).await;
    let md = skill_md("s", "d");
    // A file where the store's folder should be: every write fails.
    std::fs::write(dir.path().join("skills"), b"in the way").unwrap();
    let r = app.upload_skill(&[("s/SKILL.md", md.as_bytes())]).await;
    refused(&r, 503, "overloaded", "nothing was changed");
    assert_eq!(skill_rows(&app).await, (0, 0));
    std::fs::remove_file(dir.path().join("skills")).unwrap();

    // The archive is written, then the rows cannot commit: it is removed again.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
         CREATE TRIGGER refuse BEFORE INSERT ON skill_versions FOR EACH ROW EXECUTE FUNCTION refuse();",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let r = app.upload_skill(&[("s/SKILL.md", md.as_bytes())]).await;
    r.expect(500);
    assert_eq!(skill_rows(&app).await, (0, 0));
    assert!(
        stored_files(dir.path()).is_empty(),
        "{:?}",
        stored_files(dir.path())
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn pins_are_frozen_when_the_session_is_created(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (skill, v1) = app.create_skill("frozen", "Frozen at creation.").await;
    let v1_id = v1["id"].as_str().unwrap().to_string();
    let agent = app
        .create_agent_with_skills(json!([
            {"type": "custom", "skill_id": skill},
            {"type": "anthropic", "skill_id": "xlsx"}
        ]))
        .await;
    // The Agent keeps `latest`; the Session resolves it.
    let a = get(&app, &format!("/v1/agents/{agent}"), &app.ws_key).await;
    assert_eq!(
        a.body["skills"][0],
        json!({"type": "custom", "skill_id": skill, "version": "latest"})
    );
    let first = app.create_session_for(&agent).await;
    let md = skill_md("frozen", "Second version.");
    let v2 = app
        .upload_version(&skill, &[("frozen/SKILL.md", md.as_bytes())])
        .await;
    v2.expect(200);
    let v2_id = v2.body["id"].as_str().unwrap().to_string();
    let second = app.create_session_for(&agent).await;

    let pin_of = |session: Value| session["agent"]["skills"].clone();
    let s1 = get(&app, &format!("/v1/sessions/{first}"), &app.ws_key).await;
    assert_eq!(
        pin_of(s1.body),
        json!([
            {"type": "custom", "skill_id": skill, "version": v1_id, "name": "frozen",
             "description": "Frozen at creation.", "content_size_bytes": v1["content_size_bytes"],
             "content_sha256": v1["content_sha256"]},
            {"type": "anthropic", "skill_id": "xlsx", "version": "latest"}
        ])
    );
    let s2 = get(&app, &format!("/v1/sessions/{second}"), &app.ws_key).await;
    assert_eq!(s2.body["agent"]["skills"][0]["version"], v2_id.as_str());
    assert_eq!(
        s2.body["agent"]["skills"][0]["description"],
        "Second version."
    );

    // An explicit pin stays; a version of another Skill, or a missing Skill, refuses the Session.
    let pinned = app
        .create_agent_with_skills(json!([{"type": "custom", "skill_id": skill, "version": v1_id}]))
        .await;
    let third = app.create_session_for(&pinned).await;
    let s3 = get(&app, &format!("/v1/sessions/{third}"), &app.ws_key).await;
    assert_eq!(s3.body["agent"]["skills"][0]["version"], v1_id.as_str());
    let (other, other_v) = app.create_skill("other", "O.").await;
    let wrong = app
        .create_agent_with_skills(
            json!([{"type": "custom", "skill_id": skill, "version": other_v["id"]}]),
        )
        .await;
    let r = app
        .post_session(json!({"agent": wrong, "environment_id": app.env_id}))
        .await;
    refused(
        &r,
        404,
        "skill_version_not_found",
        &format!("belongs to skill {other}"),
    );
    let missing = app
        .create_agent_with_skills(json!([{"type": "custom", "skill_id": "skill_gone"}]))
        .await;
    let r = app
        .post_session(json!({"agent": missing, "environment_id": app.env_id}))
        .await;
    refused(&r, 404, "skill_not_found", "skill_gone");
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(sessions, 3, "a refused Session leaves no row");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sessions_token_downloads_only_its_pins_while_its_lease_lives(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (skill, v1) = app.create_skill("scoped", "Scoped.").await;
    let v1_id = v1["id"].as_str().unwrap().to_string();
    let agent = app
        .create_agent_with_skills(json!([{"type": "custom", "skill_id": skill}]))
        .await;
    let mine = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id,
                             "initial_events": [user_message("go")]}))
        .await;
    mine.expect(200);
    let claim = app.claim_session_work().await;
    let token = claim.token.clone();

    // Its pin: readable and downloadable, also as `latest` (frozen for it).
    let r = get(
        &app,
        &format!("/v1/skills/{skill}/versions/{v1_id}"),
        &token,
    )
    .await;
    r.expect(200);
    assert_eq!(r.body, v1);
    let (status, bytes) = app.download_skill(&skill, &v1_id, &token).await;
    assert_eq!(status, 200);
    assert_eq!(
        hex::encode(Sha256::digest(&bytes)),
        v1["content_sha256"].as_str().unwrap()
    );
    let md = skill_md("scoped", "Newer.");
    let v2 = app
        .upload_version(&skill, &[("scoped/SKILL.md", md.as_bytes())])
        .await;
    let v2_id = v2.body["id"].as_str().unwrap().to_string();
    let latest = get(&app, &format!("/v1/skills/{skill}/versions/latest"), &token).await;
    assert_eq!(
        latest.body["id"],
        v1_id.as_str(),
        "latest is the Session's frozen pin"
    );

    // Another Session's pin (v2), another Skill, the operator surface: no.
    let _theirs = app.create_session_for(&agent).await;
    let r = get(
        &app,
        &format!("/v1/skills/{skill}/versions/{v2_id}"),
        &token,
    )
    .await;
    refused(
        &r,
        404,
        "skill_version_not_found",
        "not among the Skills this Session pins",
    );
    let (status, _) = app.download_skill(&skill, &v2_id, &token).await;
    assert_eq!(status, 404);
    let (unpinned, unpinned_v) = app.create_skill("unpinned", "U.").await;
    let (status, _) = app
        .download_skill(&unpinned, unpinned_v["id"].as_str().unwrap(), &token)
        .await;
    assert_eq!(status, 404);
    for path in [
        "/v1/skills".to_string(),
        format!("/v1/skills/{skill}"),
        format!("/v1/skills/{skill}/versions"),
    ] {
        get(&app, &path, &token).await.expect(403);
    }
    let r = app
        .post_multipart(
            "/v1/skills",
            &token,
            &file_parts(&[("x/SKILL.md", md.as_bytes())]),
        )
        .await;
    r.expect(403);
    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/skills/{skill}/versions/{v2_id}"),
            Some(&token),
            None,
        )
        .await;
    r.expect(403);
    // The Environment key reads no Skills.
    get(
        &app,
        &format!("/v1/skills/{skill}/versions/{v1_id}"),
        &app.env_key,
    )
    .await
    .expect(403);
    let (status, _) = app.download_skill(&skill, &v1_id, &app.env_key).await;
    assert_eq!(status, 403);

    // Once its Work stops, the token reads nothing.
    app.stop_work(&claim.id, true).await;
    get(
        &app,
        &format!("/v1/skills/{skill}/versions/{v1_id}"),
        &token,
    )
    .await
    .expect(401);
    let (status, _) = app.download_skill(&skill, &v1_id, &token).await;
    assert_eq!(status, 401);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_version_a_live_session_pins_cannot_be_deleted(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (skill, v1) = app.create_skill("kept", "Kept.").await;
    let v1_id = v1["id"].as_str().unwrap().to_string();
    let md = skill_md("kept", "Two.");
    app.upload_version(&skill, &[("kept/SKILL.md", md.as_bytes())])
        .await
        .expect(200);
    let agent = app
        .create_agent_with_skills(json!([{"type": "custom", "skill_id": skill, "version": v1_id}]))
        .await;
    let session = app.create_session_for(&agent).await;
    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/skills/{skill}/versions/{v1_id}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    refused(&r, 409, "skill_in_use", "pinned by 1 Session");
    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/skills/{skill}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    refused(&r, 409, "skill_in_use", "pinned by 1 Session");
    // A terminated Session can never run again: its pin no longer holds the version.
    sqlx::query("UPDATE sessions SET status = 'terminated' WHERE id = $1")
        .bind(&session)
        .execute(&app.db)
        .await
        .unwrap();
    app.call(
        Method::DELETE,
        &format!("/v1/skills/{skill}/versions/{v1_id}"),
        Some(&app.ws_key),
        None,
    )
    .await
    .expect(200);
    app.call(
        Method::DELETE,
        &format!("/v1/skills/{skill}"),
        Some(&app.ws_key),
        None,
    )
    .await
    .expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_workspace_sees_only_its_own_skills(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (skill, v1) = app.create_skill("mine", "Mine.").await;
    sqlx::query("INSERT INTO workspaces (id, name) VALUES ('wrkspc_other', 'Other')")
        .execute(&app.db)
        .await
        .unwrap();
    let (_, other_key) = mango_api::store::keys::create(
        &app.db,
        "wrkspc_other",
        None,
        "other operator",
        mango_protocol::time::now(),
    )
    .await
    .unwrap();
    refused(
        &get(&app, &format!("/v1/skills/{skill}"), &other_key).await,
        404,
        "skill_not_found",
        &skill,
    );
    let v = v1["id"].as_str().unwrap();
    refused(
        &get(
            &app,
            &format!("/v1/skills/{skill}/versions/{v}"),
            &other_key,
        )
        .await,
        404,
        "skill_not_found",
        &skill,
    );
    let (status, _) = app.download_skill(&skill, v, &other_key).await;
    assert_eq!(status, 404);
    assert_eq!(
        get(&app, "/v1/skills", &other_key).await.body["data"],
        json!([])
    );
}
