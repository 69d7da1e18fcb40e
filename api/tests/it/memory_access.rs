//! Who may use a Memory Store (issue 18, item 3; spec §2): Sessions attach
//! stores as `resources`, a sessions token reads the stores its Session
//! attaches and writes only `read_write` ones, fenced on its live Work
//! claim in the write's own transaction; an Environment key gets 403.

use mango_testkit::*;

use reqwest::Method;
use serde_json::{json, Value};

#[track_caller]
fn assert_error(r: &Reply, status: u16, code: &str) {
    r.expect(status);
    assert_eq!(r.code(), Some(code), "{}", r.body);
}

/// A Session attaching `resources`, with its Work polled and acked: its id and the claim.
async fn session_attaching(app: &TestApp, resources: Value) -> (String, Claim) {
    let agent = app.create_agent("memory agent").await;
    let r = app
        .post_session(
            json!({"agent": agent, "environment_id": app.env_id, "resources": resources,
                             "initial_events": [user_message("go")]}),
        )
        .await;
    r.expect(200);
    let claim = app.claim_session_work().await;
    (r.body["id"].as_str().unwrap().to_string(), claim)
}

fn attach(store: &str, access: &str) -> Value {
    json!({"type": "memory_store", "memory_store_id": store, "access": access})
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sessions_attach_stores_with_snapshots_and_derived_mount_paths(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let prefs = app.create_store("User Preferences").await;
    app.call(
        Method::POST,
        &format!("/v1/memory_stores/{prefs}"),
        Some(&app.ws_key),
        Some(json!({"description": "what the user likes"})),
    )
    .await
    .expect(200);
    let twin = app.create_store("user preferences!").await;
    let agent = app.create_agent("a").await;
    let r = app
        .post_session(
            json!({"agent": agent, "environment_id": app.env_id, "resources": [
                {"type": "memory_store", "memory_store_id": prefs, "instructions": "read first"},
                {"type": "memory_store", "memory_store_id": twin, "access": "read_only"},
                {"type": "file", "file_id": "file_1"},
            ]}),
        )
        .await;
    r.expect(200);
    let res = &r.body["resources"];
    assert_eq!(
        res[0],
        json!({"type": "memory_store", "memory_store_id": prefs, "access": "read_write",
               "mount_path": "/mnt/memory/user-preferences", "name": "User Preferences",
               "description": "what the user likes", "instructions": "read first"})
    );
    assert_eq!(res[1]["mount_path"], "/mnt/memory/user-preferences-2");
    assert_eq!(res[1]["access"], "read_only");
    assert_eq!(res[1]["description"], "");
    assert_eq!(res[2]["type"], "file");
    let session = r.body["id"].as_str().unwrap().to_string();

    // Later edits of the store do not reach the Session's snapshot.
    app.call(
        Method::POST,
        &format!("/v1/memory_stores/{prefs}"),
        Some(&app.ws_key),
        Some(json!({"name": "Renamed"})),
    )
    .await
    .expect(200);
    let got = app
        .call(
            Method::GET,
            &format!("/v1/sessions/{session}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_eq!(got.body["resources"], r.body["resources"]);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn bad_attachments_are_refused_and_create_no_session(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let store = app.create_store("s").await;
    let archived = app.create_store("old").await;
    app.call(
        Method::POST,
        &format!("/v1/memory_stores/{archived}/archive"),
        Some(&app.ws_key),
        None,
    )
    .await
    .expect(200);
    let stores: Vec<String> = {
        let mut v = Vec::new();
        for i in 0..9 {
            v.push(app.create_store(&format!("s{i}")).await);
        }
        v
    };
    let sessions = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sessions")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    let before = sessions().await;
    let nine: Vec<Value> = stores.iter().map(|s| attach(s, "read_write")).collect();
    for (resources, status, code) in [
        (
            json!([attach("memstore_missing", "read_write")]),
            404,
            "memory_store_not_found",
        ),
        (
            json!([attach(&archived, "read_only")]),
            400,
            "memory_store_archived",
        ),
        (
            json!([attach(&store, "read_write"), attach(&store, "read_only")]),
            400,
            "invalid_parameter",
        ),
        (json!(nine), 400, "invalid_parameter"),
        (
            json!([{"type": "memory_store", "memory_store_id": store, "mount_path": "/mnt/memory/x"}]),
            400,
            "invalid_parameter",
        ),
        (
            json!([{"type": "memory_store", "memory_store_id": store, "name": "x"}]),
            400,
            "invalid_parameter",
        ),
        (
            json!([{"type": "memory_store", "memory_store_id": store, "instructions": "i".repeat(4097)}]),
            400,
            "invalid_parameter",
        ),
        (
            json!([attach(&store, "write_only")]),
            400,
            "invalid_parameter",
        ),
    ] {
        let r = app
            .post_session(
                json!({"agent": agent, "environment_id": app.env_id, "resources": resources}),
            )
            .await;
        assert_error(&r, status, code);
    }
    assert_eq!(sessions().await, before);
    // The edges that pass: eight stores, 4,096 characters of instructions.
    let eight: Vec<Value> = stores[..8].iter().map(|s| attach(s, "read_only")).collect();
    app.post_session(json!({"agent": agent, "environment_id": app.env_id, "resources": eight}))
        .await
        .expect(200);
    app.post_session(
        json!({"agent": agent, "environment_id": app.env_id, "resources": [
        {"type": "memory_store", "memory_store_id": store, "instructions": "i".repeat(4096)}]}),
    )
    .await
    .expect(200);
    // A store of another workspace is not found.
    let foreign: String = {
        sqlx::query("INSERT INTO workspaces (id, name) VALUES ('wrkspc_other', 'other') ON CONFLICT DO NOTHING")
            .execute(&app.db)
            .await
            .ok();
        let id = "memstore_foreign".to_string();
        sqlx::query("INSERT INTO memory_stores (id, workspace_id, name, created_at, updated_at) VALUES ($1, 'wrkspc_other', 'f', now(), now())")
            .bind(&id)
            .execute(&app.db)
            .await
            .unwrap();
        id
    };
    let r = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id,
                             "resources": [attach(&foreign, "read_write")]}))
        .await;
    assert_error(&r, 404, "memory_store_not_found");
    let r = app
        .call(
            Method::GET,
            &format!("/v1/memory_stores/{foreign}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_error(&r, 404, "memory_store_not_found");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sessions_token_reads_attached_stores_and_writes_only_read_write_ones(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let rw = app.create_store("rw").await;
    let ro = app.create_store("ro").await;
    let other = app.create_store("not attached").await;
    let in_ro = app.create_memory(&ro, "/fixed.md", "read me").await;
    let in_other = app.create_memory(&other, "/secret.md", "not yours").await;
    let (session, claim) = session_attaching(
        &app,
        json!([attach(&rw, "read_write"), attach(&ro, "read_only")]),
    )
    .await;
    let token = claim.token.clone();

    // Reads of attached stores.
    for store in [&rw, &ro] {
        let r = app.store_call(Method::GET, store, "", &token, None).await;
        r.expect(200);
        assert_eq!(r.body["id"], **store);
        app.store_call(
            Method::GET,
            store,
            "/memories?view=full&limit=20",
            &token,
            None,
        )
        .await
        .expect(200);
        app.store_call(Method::GET, store, "/memory_versions", &token, None)
            .await
            .expect(200);
    }
    let ro_mem = in_ro["id"].as_str().unwrap();
    let r = app
        .store_call(
            Method::GET,
            &ro,
            &format!("/memories/{ro_mem}"),
            &token,
            None,
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["content"], "read me");

    // A store the Session does not attach is not found for it.
    let other_mem = in_other["id"].as_str().unwrap();
    for suffix in [
        "".to_string(),
        "/memories".into(),
        format!("/memories/{other_mem}"),
    ] {
        let r = app
            .store_call(Method::GET, &other, &suffix, &token, None)
            .await;
        assert_error(&r, 404, "memory_store_not_found");
        assert!(!r.body.to_string().contains("not yours"));
    }

    // Writes: read_write yes, as the Session; read_only no.
    let r = app
        .create_memory_as(&rw, "/learned.md", "a fact", &token)
        .await;
    r.expect(200);
    let learned = r.body["id"].as_str().unwrap().to_string();
    let versions = app
        .store_call(Method::GET, &rw, "/memory_versions", &app.ws_key, None)
        .await;
    assert_eq!(
        versions.body["data"][0]["created_by"],
        json!({"type": "session_actor", "session_id": session})
    );
    let by_session = app
        .store_call(
            Method::GET,
            &rw,
            &format!("/memory_versions?session_id={session}"),
            &app.ws_key,
            None,
        )
        .await;
    assert_eq!(by_session.body["data"].as_array().unwrap().len(), 1);
    app.store_call(
        Method::POST,
        &rw,
        &format!("/memories/{learned}"),
        &token,
        Some(json!({"content": "a better fact",
                    "precondition": {"type": "content_sha256", "content_sha256": sha256_hex("a fact")}})),
    )
    .await
    .expect(200);
    for (method, suffix, body) in [
        (
            Method::POST,
            "/memories".to_string(),
            Some(json!({"path": "/x", "content": "x"})),
        ),
        (
            Method::POST,
            format!("/memories/{ro_mem}"),
            Some(json!({"content": "changed"})),
        ),
        (Method::DELETE, format!("/memories/{ro_mem}"), None),
    ] {
        let r = app.store_call(method, &ro, &suffix, &token, body).await;
        r.expect(403);
        assert_eq!(r.error_type(), Some("permission_error"));
    }
    assert_eq!(
        app.memory_at(&ro, "/fixed.md").await.unwrap()["content"],
        "read me"
    );
    // The store's own operations are the operator's.
    for (method, path) in [
        (Method::POST, "/v1/memory_stores".to_string()),
        (Method::GET, "/v1/memory_stores".into()),
        (Method::POST, format!("/v1/memory_stores/{rw}")),
        (Method::POST, format!("/v1/memory_stores/{rw}/archive")),
        (Method::DELETE, format!("/v1/memory_stores/{rw}")),
    ] {
        let r = app
            .call(method, &path, Some(&token), Some(json!({"name": "n"})))
            .await;
        r.expect(403);
    }
    let version = app
        .store_call(
            Method::GET,
            &rw,
            "/memory_versions?operation=created",
            &app.ws_key,
            None,
        )
        .await
        .body["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.store_call(
        Method::POST,
        &rw,
        &format!("/memory_versions/{version}/redact"),
        &token,
        None,
    )
    .await
    .expect(403);

    // Once the Work stops, the token is refused.
    app.stop_work(&claim.id, true).await;
    let r = app.store_call(Method::GET, &rw, "", &token, None).await;
    r.expect(401);
    let r = app.create_memory_as(&rw, "/late.md", "late", &token).await;
    r.expect(401);
    assert!(app.memory_at(&rw, "/late.md").await.is_none());
    assert!(!r.body.to_string().contains(&token));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn environment_keys_get_403_everywhere(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let store = app.create_store("s").await;
    let mem = app.create_memory(&store, "/m", "m").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let key = app.env_key.clone();
    for (method, path, body) in [
        (
            Method::POST,
            "/v1/memory_stores".to_string(),
            Some(json!({"name": "n"})),
        ),
        (Method::GET, "/v1/memory_stores".into(), None),
        (Method::GET, format!("/v1/memory_stores/{store}"), None),
        (
            Method::POST,
            format!("/v1/memory_stores/{store}"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/v1/memory_stores/{store}/archive"),
            None,
        ),
        (Method::DELETE, format!("/v1/memory_stores/{store}"), None),
        (
            Method::GET,
            format!("/v1/memory_stores/{store}/memories"),
            None,
        ),
        (
            Method::POST,
            format!("/v1/memory_stores/{store}/memories"),
            Some(json!({"path": "/n", "content": "n"})),
        ),
        (
            Method::GET,
            format!("/v1/memory_stores/{store}/memories/{mem}"),
            None,
        ),
        (
            Method::POST,
            format!("/v1/memory_stores/{store}/memories/{mem}"),
            Some(json!({"content": "x"})),
        ),
        (
            Method::DELETE,
            format!("/v1/memory_stores/{store}/memories/{mem}"),
            None,
        ),
        (
            Method::GET,
            format!("/v1/memory_stores/{store}/memory_versions"),
            None,
        ),
    ] {
        let r = app.call(method.clone(), &path, Some(&key), body).await;
        r.expect(403);
        assert_eq!(r.error_type(), Some("permission_error"), "{method} {path}");
    }
    let r = app
        .call(
            Method::GET,
            "/v1/memory_stores",
            Some("mango_wsk_forged"),
            None,
        )
        .await;
    r.expect(401);
    assert_eq!(app.all_memories(&store).await.len(), 1);
}

/// The write and the claim check are one transaction: while a Stop holds
/// the Work row, a runner's write waits for it, and once the Stop commits
/// the write finds the claim ended and writes nothing.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_write_is_fenced_on_the_live_claim_in_its_own_transaction(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let store = app.create_store("fenced").await;
    let (_, claim) = session_attaching(&app, json!([attach(&store, "read_write")])).await;
    let hb = app.heartbeat(&claim.id, &claim.token, "NO_HEARTBEAT").await;
    hb.expect(200);

    // A concurrent stop: the Work row locked, then stopped.
    let mut stop = app.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM work WHERE id = $1 FOR UPDATE")
        .bind(&claim.id)
        .execute(&mut *stop)
        .await
        .unwrap();
    let write = {
        let base = app.base.clone();
        let token = claim.token.clone();
        let store = store.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/memory_stores/{store}/memories"))
                .bearer_auth(token)
                .json(&json!({"path": "/raced.md", "content": "after the stop?"}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    // The write authenticated and now waits on the row lock.
    app.until_a_lock_wait().await;
    sqlx::query(
        "UPDATE work SET state = 'stopped', stopped_at = now(), row_version = row_version + 1 WHERE id = $1",
    )
    .bind(&claim.id)
    .execute(&mut *stop)
    .await
    .unwrap();
    stop.commit().await.unwrap();
    let status = write.await.unwrap();
    assert_eq!(status, 401);
    assert!(app.memory_at(&store, "/raced.md").await.is_none());
    let versions: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_versions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(versions, 0);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn another_sessions_token_cannot_reach_this_sessions_store(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let mine = app.create_store("mine").await;
    let theirs = app.create_store("theirs").await;
    let (_, first) = session_attaching(&app, json!([attach(&mine, "read_write")])).await;
    let (_, second) = session_attaching(&app, json!([attach(&theirs, "read_write")])).await;
    app.create_memory(&mine, "/private.md", "mine only").await;
    let r = app
        .store_call(Method::GET, &mine, "/memories", &second.token, None)
        .await;
    assert_error(&r, 404, "memory_store_not_found");
    let r = app
        .create_memory_as(&mine, "/intruder.md", "x", &second.token)
        .await;
    assert_error(&r, 404, "memory_store_not_found");
    app.store_call(Method::GET, &mine, "/memories", &first.token, None)
        .await
        .expect(200);
    assert!(app.memory_at(&mine, "/intruder.md").await.is_none());
}
