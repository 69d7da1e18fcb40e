//! `/v1/memory_stores` (issue 18, item 3; the SDK's `beta.memory_stores`):
//! stores, their memories and versions in the SDK's shapes, every rule and
//! limit at its edge, preconditions and path conflicts, and bad input that
//! leaves nothing behind.

use mango_testkit::*;

use reqwest::Method;
use serde_json::{json, Value};

#[track_caller]
fn assert_error(r: &Reply, status: u16, code: &str) {
    r.expect(status);
    assert_eq!(r.code(), Some(code), "{}", r.body);
}

async fn count(app: &TestApp, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Rows of every memory table, to show a refusal wrote nothing.
async fn rows(app: &TestApp) -> (i64, i64, i64) {
    (
        count(app, "memory_stores").await,
        count(app, "memories").await,
        count(app, "memory_versions").await,
    )
}

async fn ws(app: &TestApp, method: Method, path: &str, body: Option<Value>) -> Reply {
    app.call(method, path, Some(&app.ws_key.clone()), body)
        .await
}

const STORE_FIELDS: [&str; 8] = [
    "archived_at",
    "created_at",
    "description",
    "id",
    "metadata",
    "name",
    "type",
    "updated_at",
];
const MEMORY_FIELDS: [&str; 10] = [
    "content",
    "content_sha256",
    "content_size_bytes",
    "created_at",
    "id",
    "memory_store_id",
    "memory_version_id",
    "path",
    "type",
    "updated_at",
];

#[track_caller]
fn assert_fields(v: &Value, want: &[&str]) {
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, want, "{v}");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stores_are_created_read_updated_listed_archived_and_deleted(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = ws(
        &app,
        Method::POST,
        "/v1/memory_stores",
        Some(json!({"name": "User Preferences"})),
    )
    .await;
    r.expect(200);
    assert_fields(&r.body, &STORE_FIELDS);
    let id = r.body["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("memstore_"), "{id}");
    assert_eq!(r.body["type"], "memory_store");
    assert_eq!(r.body["description"], "");
    assert_eq!(r.body["metadata"], json!({}));
    assert!(r.body["archived_at"].is_null());

    let got = ws(&app, Method::GET, &format!("/v1/memory_stores/{id}"), None).await;
    got.expect(200);
    assert_eq!(got.body, r.body);

    // Update: name, description, a metadata patch; absent keys are kept.
    let r = ws(
        &app,
        Method::POST,
        &format!("/v1/memory_stores/{id}"),
        Some(
            json!({"description": "what the user likes", "metadata": {"user": "u1", "team": "t"}}),
        ),
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["name"], "User Preferences");
    assert_eq!(r.body["description"], "what the user likes");
    let r = ws(
        &app,
        Method::POST,
        &format!("/v1/memory_stores/{id}"),
        Some(json!({"name": "Prefs", "description": "", "metadata": {"team": null}})),
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["name"], "Prefs");
    assert_eq!(r.body["description"], "");
    assert_eq!(r.body["metadata"], json!({"user": "u1"}));
    // An empty body changes nothing.
    let same = ws(&app, Method::POST, &format!("/v1/memory_stores/{id}"), None).await;
    same.expect(200);
    assert_eq!(same.body, r.body);

    // List: newest first, paged, archived ones only on request.
    let second = app.create_store("second").await;
    let third = app.create_store("third").await;
    let page = ws(&app, Method::GET, "/v1/memory_stores?limit=2", None).await;
    page.expect(200);
    assert_eq!(data_ids(&page.body), [third.clone(), second.clone()]);
    let next = page.body["next_page"].as_str().unwrap();
    let page = ws(
        &app,
        Method::GET,
        &format!("/v1/memory_stores?limit=2&page={}", urlencode(next)),
        None,
    )
    .await;
    assert_eq!(data_ids(&page.body), [id.as_str()]);
    assert!(page.body["next_page"].is_null());

    let archived = ws(
        &app,
        Method::POST,
        &format!("/v1/memory_stores/{second}/archive"),
        None,
    )
    .await;
    archived.expect(200);
    let at = archived.body["archived_at"].clone();
    assert!(at.is_string());
    // Archiving again returns it unchanged.
    let again = ws(
        &app,
        Method::POST,
        &format!("/v1/memory_stores/{second}/archive"),
        None,
    )
    .await;
    assert_eq!(again.body, archived.body);
    let listed = ws(&app, Method::GET, "/v1/memory_stores", None).await;
    assert_eq!(data_ids(&listed.body), [third.clone(), id.clone()]);
    let listed = ws(
        &app,
        Method::GET,
        "/v1/memory_stores?include_archived=true",
        None,
    )
    .await;
    assert_eq!(listed.body["data"].as_array().unwrap().len(), 3);
    // created_at bounds, inclusive.
    let created = archived.body["created_at"].as_str().unwrap().to_string();
    let only = ws(
        &app,
        Method::GET,
        &format!(
            "/v1/memory_stores?include_archived=true&created_at[gte]={0}&created_at[lte]={0}",
            urlencode(&created)
        ),
        None,
    )
    .await;
    assert_eq!(data_ids(&only.body), [second.as_str()]);
    // An archived store cannot be updated.
    let r = ws(
        &app,
        Method::POST,
        &format!("/v1/memory_stores/{second}"),
        Some(json!({"name": "x"})),
    )
    .await;
    assert_error(&r, 400, "memory_store_archived");

    // Delete takes the memories and versions with it.
    app.create_memory(&id, "/a.md", "a").await;
    let r = ws(
        &app,
        Method::DELETE,
        &format!("/v1/memory_stores/{id}"),
        None,
    )
    .await;
    r.expect(200);
    assert_eq!(r.body, json!({"id": id, "type": "memory_store_deleted"}));
    let r = ws(&app, Method::GET, &format!("/v1/memory_stores/{id}"), None).await;
    assert_error(&r, 404, "memory_store_not_found");
    let r = ws(
        &app,
        Method::DELETE,
        &format!("/v1/memory_stores/{id}"),
        None,
    )
    .await;
    assert_error(&r, 404, "memory_store_not_found");
    assert_eq!(count(&app, "memories").await, 0);
    assert_eq!(count(&app, "memory_versions").await, 0);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn bad_store_input_is_refused_at_each_edge_and_writes_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    // The edges that pass.
    let sixteen: serde_json::Map<String, Value> =
        (0..16).map(|i| (format!("k{i}"), json!("v"))).collect();
    for ok in [
        json!({"name": "a"}),
        json!({"name": "é".repeat(255), "description": "d".repeat(1024), "metadata": sixteen}),
    ] {
        ws(&app, Method::POST, "/v1/memory_stores", Some(ok))
            .await
            .expect(200);
    }
    let before = rows(&app).await;
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (bad, code) in [
        (json!({}), "invalid_parameter"),
        (json!({"name": ""}), "invalid_parameter"),
        (json!({"name": "a".repeat(256)}), "invalid_parameter"),
        (json!({"name": "tab\there"}), "invalid_parameter"),
        (
            json!({"name": "a", "description": "d".repeat(1025)}),
            "invalid_parameter",
        ),
        (json!({"name": "a", "metadata": many}), "invalid_metadata"),
        (
            json!({"name": "a", "metadata": {"k": 1}}),
            "invalid_metadata",
        ),
        (json!({"name": "a", "unknown": 1}), "invalid_parameter"),
        (json!({"name": 5}), "invalid_parameter"),
    ] {
        let r = ws(&app, Method::POST, "/v1/memory_stores", Some(bad.clone())).await;
        assert_error(&r, 400, code);
        assert!(!r.body.to_string().contains(&app.ws_key));
    }
    let r = app
        .call_raw(
            Method::POST,
            "/v1/memory_stores",
            Some(&app.ws_key),
            "{nope",
        )
        .await;
    assert_error(&r, 400, "invalid_json");
    let id = app.create_store("s").await;
    for bad in [
        json!({"name": ""}),
        json!({"description": "d".repeat(1025)}),
        json!({"metadata": {"": "v"}}),
    ] {
        let r = ws(
            &app,
            Method::POST,
            &format!("/v1/memory_stores/{id}"),
            Some(bad),
        )
        .await;
        r.expect(400);
    }
    assert_eq!(
        ws(&app, Method::GET, &format!("/v1/memory_stores/{id}"), None)
            .await
            .body["name"],
        "s"
    );
    for bad in [
        "limit=0",
        "limit=101",
        "page=garbage",
        "include_archived=yes",
        "created_at[gte]=yesterday",
    ] {
        let r = ws(&app, Method::GET, &format!("/v1/memory_stores?{bad}"), None).await;
        r.expect(400);
    }
    assert_eq!(rows(&app).await.0, before.0 + 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn memories_in_the_sdk_shapes_with_preconditions_and_path_conflicts(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let store = app.create_store("notes").await;
    let base = format!("/v1/memory_stores/{store}/memories");

    // Create: basic view by default (no content, the digest and size always).
    let r = ws(
        &app,
        Method::POST,
        &base,
        Some(json!({"path": "/projects/mango.md", "content": "héllo"})),
    )
    .await;
    r.expect(200);
    assert_fields(&r.body, &MEMORY_FIELDS);
    let mem = r.body["id"].as_str().unwrap().to_string();
    assert!(mem.starts_with("mem_"));
    assert_eq!(r.body["type"], "memory");
    assert!(r.body["content"].is_null());
    assert_eq!(r.body["content_sha256"], sha256_hex("héllo"));
    assert_eq!(r.body["content_size_bytes"], 6);
    assert_eq!(r.body["memory_store_id"], store);
    let v1 = r.body["memory_version_id"].as_str().unwrap().to_string();
    assert!(v1.starts_with("memver_"));
    // ?view=full on create.
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}?view=full"),
        Some(json!({"path": "/empty", "content": ""})),
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["content"], "");
    assert_eq!(r.body["content_sha256"], sha256_hex(""));
    let empty = r.body["id"].as_str().unwrap().to_string();
    // null content is an empty memory too.
    let r = ws(
        &app,
        Method::POST,
        &base,
        Some(json!({"path": "/null", "content": null})),
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["content_size_bytes"], 0);

    // Retrieve: full by default.
    let got = ws(&app, Method::GET, &format!("{base}/{mem}"), None).await;
    got.expect(200);
    assert_eq!(got.body["content"], "héllo");
    let basic = ws(&app, Method::GET, &format!("{base}/{mem}?view=basic"), None).await;
    assert!(basic.body["content"].is_null());
    let r = ws(&app, Method::GET, &format!("{base}/{mem}?view=most"), None).await;
    assert_error(&r, 400, "invalid_parameter");

    // The same path again: a path conflict, not retried.
    let r = ws(
        &app,
        Method::POST,
        &base,
        Some(json!({"path": "/projects/mango.md", "content": "other"})),
    )
    .await;
    r.expect(409);
    assert_eq!(r.error_type(), Some("memory_path_conflict_error"));
    assert_eq!(r.code(), Some("memory_path_conflict"));
    assert_eq!(r.body["error"]["details"]["memory_id"], mem);
    assert_eq!(r.headers["x-should-retry"], "false");

    // Update with the right precondition; a lost one is a 409 that writes nothing.
    let sha = sha256_hex("héllo");
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/{mem}?view=full"),
        Some(json!({"content": "v2", "precondition": {"type": "content_sha256", "content_sha256": sha}})),
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["content"], "v2");
    assert_eq!(r.body["id"], mem);
    let v2 = r.body["memory_version_id"].as_str().unwrap().to_string();
    assert_ne!(v2, v1);
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/{mem}"),
        Some(json!({"content": "v3", "precondition": {"type": "content_sha256", "content_sha256": sha}})),
    )
    .await;
    r.expect(409);
    assert_eq!(r.error_type(), Some("memory_precondition_failed_error"));
    assert_eq!(r.code(), Some("memory_precondition_failed"));
    assert_eq!(
        r.body["error"]["details"]["current_content_sha256"],
        sha256_hex("v2")
    );
    assert_eq!(r.headers["x-should-retry"], "false");
    let got = ws(&app, Method::GET, &format!("{base}/{mem}"), None).await;
    assert_eq!(got.body["content"], "v2");

    // Bad preconditions are 400s.
    for bad in [
        json!({"type": "content_sha256", "content_sha256": sha256_hex("v2").to_uppercase()}),
        json!({"type": "content_sha256", "content_sha256": &sha256_hex("v2")[..63]}),
        json!({"type": "content_sha256", "content_sha256": format!("{}0", sha256_hex("v2"))}),
        json!({"type": "content_sha256"}),
        json!({"type": "etag", "content_sha256": sha256_hex("v2")}),
    ] {
        let r = ws(
            &app,
            Method::POST,
            &format!("{base}/{mem}"),
            Some(json!({"content": "x", "precondition": bad})),
        )
        .await;
        assert_error(&r, 400, "invalid_parameter");
    }

    // Rename: the id stays; onto a taken path it is a conflict.
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/{mem}"),
        Some(json!({"path": "/empty"})),
    )
    .await;
    r.expect(409);
    assert_eq!(r.error_type(), Some("memory_path_conflict_error"));
    assert_eq!(r.body["error"]["details"]["memory_id"], empty);
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/{mem}"),
        Some(json!({"path": "/archive/mango.md"})),
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["id"], mem);
    assert_eq!(r.body["path"], "/archive/mango.md");
    assert_eq!(r.body["content_sha256"], sha256_hex("v2"));
    let v3 = r.body["memory_version_id"].as_str().unwrap().to_string();
    // An update that changes nothing writes no version.
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/{mem}"),
        Some(json!({"content": "v2", "path": "/archive/mango.md"})),
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["memory_version_id"], v3);
    let versions = count(&app, "memory_versions").await;

    // Delete: a wrong expectation is a 409, a malformed one a 400.
    let r = ws(
        &app,
        Method::DELETE,
        &format!("{base}/{mem}?expected_content_sha256={}", sha256_hex("v1")),
        None,
    )
    .await;
    r.expect(409);
    assert_eq!(r.error_type(), Some("memory_precondition_failed_error"));
    for bad in ["ABC", "", "zz"] {
        let r = ws(
            &app,
            Method::DELETE,
            &format!("{base}/{mem}?expected_content_sha256={bad}"),
            None,
        )
        .await;
        assert_error(&r, 400, "invalid_parameter");
    }
    assert_eq!(count(&app, "memory_versions").await, versions);
    let r = ws(
        &app,
        Method::DELETE,
        &format!("{base}/{mem}?expected_content_sha256={}", sha256_hex("v2")),
        None,
    )
    .await;
    r.expect(200);
    assert_eq!(r.body, json!({"id": mem, "type": "memory_deleted"}));
    for method in [Method::GET, Method::DELETE] {
        let r = ws(&app, method, &format!("{base}/{mem}"), None).await;
        assert_error(&r, 404, "memory_not_found");
    }
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/{mem}"),
        Some(json!({"content": "x"})),
    )
    .await;
    assert_error(&r, 404, "memory_not_found");
    // The path is free again.
    app.create_memory(&store, "/projects/mango.md", "again")
        .await;

    // A memory of another store is not found through this one.
    let other = app.create_store("other").await;
    let r = ws(
        &app,
        Method::GET,
        &format!("/v1/memory_stores/{other}/memories/{empty}"),
        None,
    )
    .await;
    assert_error(&r, 404, "memory_not_found");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn paths_and_content_are_checked_at_their_edges_and_refusals_write_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let store = app.create_store("edges").await;
    let base = format!("/v1/memory_stores/{store}/memories");
    // The edges that pass.
    let longest = format!("/{}", "a".repeat(1023));
    let deepest = "/d".repeat(20);
    let full = "x".repeat(102_400);
    for (path, content) in [
        (longest.as_str(), "a"),
        (deepest.as_str(), "b"),
        ("/full.txt", full.as_str()),
        ("/é.md", "composed"),
    ] {
        let r = ws(
            &app,
            Method::POST,
            &base,
            Some(json!({"path": path, "content": content})),
        )
        .await;
        r.expect(200);
    }
    let before = rows(&app).await;
    let too_long = format!("/{}", "a".repeat(1024));
    let too_deep = "/d".repeat(21);
    for path in [
        "relative.md",
        "/a//b",
        "/a/../b",
        "/a/./b",
        "/..",
        "/",
        "/trailing/",
        "/a\u{0}b",
        "/line\nbreak",
        "/zero\u{200b}width",
        "/sep\u{2028}",
        "/e\u{301}",
        too_long.as_str(),
        too_deep.as_str(),
    ] {
        let r = ws(
            &app,
            Method::POST,
            &base,
            Some(json!({"path": path, "content": "x"})),
        )
        .await;
        r.expect(400);
        assert!(
            matches!(r.code(), Some("invalid_memory_path" | "invalid_parameter")),
            "{path:?}: {}",
            r.body
        );
    }
    // Over the content limit by one byte (and in multi-byte characters).
    for content in ["x".repeat(102_401), "é".repeat(51_201)] {
        let r = ws(
            &app,
            Method::POST,
            &base,
            Some(json!({"path": "/big", "content": content})),
        )
        .await;
        assert_error(&r, 400, "memory_content_too_large");
    }
    for bad in [
        json!({"content": "x"}),
        json!({"path": "/a"}),
        json!({"path": "/a", "content": 5}),
        json!({"path": "/a", "content": "x", "extra": true}),
    ] {
        let r = ws(&app, Method::POST, &base, Some(bad)).await;
        r.expect(400);
    }
    // Updates are held to the same rules.
    let mem = app.create_memory(&store, "/u", "u").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let before_update = rows(&app).await;
    for bad in [
        json!({"path": "/a//b"}),
        json!({"path": "no-slash"}),
        json!({"content": "x".repeat(102_401)}),
        json!({"precondition": {"type": "content_sha256", "content_sha256": "nothex"}}),
    ] {
        let r = ws(&app, Method::POST, &format!("{base}/{mem}"), Some(bad)).await;
        r.expect(400);
    }
    assert_eq!(rows(&app).await, before_update);
    assert_eq!(before_update.1, before.1 + 1);
    assert_eq!(
        ws(&app, Method::GET, &format!("{base}/{mem}"), None)
            .await
            .body["path"],
        "/u"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn lists_page_by_path_with_prefixes_depth_and_views(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let store = app.create_store("tree").await;
    for path in [
        "/a.md",
        "/notes/todo.md",
        "/notes/2026/jan.md",
        "/notes/2026/feb.md",
        "/notes-archive/old.md",
        "/z/y/x/w.md",
    ] {
        app.create_memory(&store, path, path).await;
    }
    let list = |q: &str| {
        let q = q.to_string();
        let app = &app;
        let store = store.clone();
        async move {
            let r = ws(
                app,
                Method::GET,
                &format!("/v1/memory_stores/{store}/memories{q}"),
                None,
            )
            .await;
            r.expect(200);
            r.body
        }
    };
    let paths = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                format!(
                    "{}:{}",
                    i["type"].as_str().unwrap(),
                    i["path"].as_str().unwrap()
                )
            })
            .collect()
    };
    // Everything, in byte order, basic view.
    let all = list("").await;
    assert_eq!(
        paths(&all),
        [
            "memory:/a.md",
            "memory:/notes-archive/old.md",
            "memory:/notes/2026/feb.md",
            "memory:/notes/2026/jan.md",
            "memory:/notes/todo.md",
            "memory:/z/y/x/w.md"
        ]
    );
    assert!(all["data"][0]["content"].is_null());
    assert!(all["next_page"].is_null());
    // A prefix matches whole segments.
    let notes = list("?path_prefix=/notes/").await;
    assert_eq!(
        paths(&notes),
        [
            "memory:/notes/2026/feb.md",
            "memory:/notes/2026/jan.md",
            "memory:/notes/todo.md"
        ]
    );
    // depth=1: direct children, deeper ones rolled up.
    let top = list("?depth=1").await;
    assert_eq!(
        paths(&top),
        [
            "memory:/a.md",
            "memory_prefix:/notes-archive/",
            "memory_prefix:/notes/",
            "memory_prefix:/z/"
        ]
    );
    assert_eq!(
        top["data"][1],
        json!({"type": "memory_prefix", "path": "/notes-archive/"})
    );
    let sub = list("?depth=1&path_prefix=/notes/").await;
    assert_eq!(
        paths(&sub),
        ["memory_prefix:/notes/2026/", "memory:/notes/todo.md"]
    );
    let two = list("?depth=2&path_prefix=/z/").await;
    assert_eq!(paths(&two), ["memory_prefix:/z/y/x/"]);
    // The deepest depth there is lists everything.
    assert_eq!(paths(&list("?depth=20").await), paths(&all));
    // Pages: prefixes and memories both count toward the limit.
    let mut seen = Vec::new();
    let mut q = "?depth=1&limit=1".to_string();
    loop {
        let page = list(&q).await;
        assert_eq!(page["data"].as_array().unwrap().len(), 1);
        seen.extend(paths(&page));
        match page["next_page"].as_str() {
            Some(p) => q = format!("?depth=1&limit=1&page={}", urlencode(p)),
            None => break,
        }
    }
    assert_eq!(seen, paths(&top));
    // view=full carries content, at most 20 a page whatever the limit.
    let full = list("?view=full&path_prefix=/z/").await;
    assert_eq!(full["data"][0]["content"], "/z/y/x/w.md");
    for i in 0..25 {
        app.create_memory(&store, &format!("/many/{i:02}"), "m")
            .await;
    }
    let capped = list("?view=full&limit=100&path_prefix=/many/").await;
    assert_eq!(capped["data"].as_array().unwrap().len(), 20);
    assert!(capped["next_page"].is_string());
    let basic = list("?limit=100&path_prefix=/many/").await;
    assert_eq!(basic["data"].as_array().unwrap().len(), 25);
    assert!(basic["next_page"].is_null());
    // Bad parameters.
    for bad in [
        "?path_prefix=notes/",
        "?path_prefix=/notes",
        "?path_prefix=/a//",
        "?depth=-1",
        "?depth=21",
        "?limit=0",
        "?limit=101",
        "?view=all",
        "?page=garbage",
    ] {
        let r = ws(
            &app,
            Method::GET,
            &format!("/v1/memory_stores/{store}/memories{bad}"),
            None,
        )
        .await;
        r.expect(400);
    }
    let r = ws(
        &app,
        Method::GET,
        "/v1/memory_stores/memstore_nope/memories",
        None,
    )
    .await;
    assert_error(&r, 404, "memory_store_not_found");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn every_change_is_a_version_with_its_author(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let store = app.create_store("audit").await;
    let base = format!("/v1/memory_stores/{store}");
    let created = app.create_memory(&store, "/a", "one").await;
    let mem = created["id"].as_str().unwrap().to_string();
    let v1 = created["memory_version_id"].as_str().unwrap().to_string();
    ws(
        &app,
        Method::POST,
        &format!("{base}/memories/{mem}"),
        Some(json!({"content": "two"})),
    )
    .await
    .expect(200);
    ws(
        &app,
        Method::DELETE,
        &format!("{base}/memories/{mem}"),
        None,
    )
    .await
    .expect(200);
    app.create_memory(&store, "/b", "other").await;

    let r = ws(
        &app,
        Method::GET,
        &format!("{base}/memory_versions?memory_id={mem}"),
        None,
    )
    .await;
    r.expect(200);
    let ops: Vec<&str> = r.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["operation"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["deleted", "modified", "created"]);
    let deleted = &r.body["data"][0];
    assert_eq!(deleted["type"], "memory_version");
    assert_eq!(deleted["path"], "/a");
    assert!(deleted["content_sha256"].is_null() && deleted["content_size_bytes"].is_null());
    let modified = &r.body["data"][1];
    assert!(
        modified["content"].is_null(),
        "basic by default: {modified}"
    );
    assert_eq!(modified["content_sha256"], sha256_hex("two"));
    let key_id: String =
        sqlx::query_scalar("SELECT id FROM api_keys WHERE kind = 'workspace' LIMIT 1")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        modified["created_by"],
        json!({"type": "api_actor", "api_key_id": key_id})
    );
    // Filters and the full view.
    let r = ws(
        &app,
        Method::GET,
        &format!("{base}/memory_versions?operation=created&view=full"),
        None,
    )
    .await;
    let contents: Vec<&str> = r.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["other", "one"]);
    let r = ws(
        &app,
        Method::GET,
        &format!("{base}/memory_versions?api_key_id={key_id}&limit=1"),
        None,
    )
    .await;
    assert_eq!(r.body["data"].as_array().unwrap().len(), 1);
    let next = r.body["next_page"].as_str().unwrap();
    let r2 = ws(
        &app,
        Method::GET,
        &format!(
            "{base}/memory_versions?api_key_id={key_id}&limit=1&page={}",
            urlencode(next)
        ),
        None,
    )
    .await;
    assert_ne!(r2.body["data"][0]["id"], r.body["data"][0]["id"]);
    for q in [
        "session_id=sesn_none",
        "service_account_id=svac_x",
        "api_key_id=key_other",
    ] {
        let r = ws(
            &app,
            Method::GET,
            &format!("{base}/memory_versions?{q}"),
            None,
        )
        .await;
        assert_eq!(r.body["data"], json!([]), "{q}");
    }
    for bad in [
        "operation=renamed",
        "view=x",
        "limit=101",
        "created_at[lte]=soon",
    ] {
        let r = ws(
            &app,
            Method::GET,
            &format!("{base}/memory_versions?{bad}"),
            None,
        )
        .await;
        r.expect(400);
    }

    // Retrieve: full by default.
    let r = ws(
        &app,
        Method::GET,
        &format!("{base}/memory_versions/{v1}"),
        None,
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["content"], "one");
    assert_eq!(r.body["memory_id"], mem);
    let r = ws(
        &app,
        Method::GET,
        &format!("{base}/memory_versions/memver_nope"),
        None,
    )
    .await;
    assert_error(&r, 404, "memory_version_not_found");

    // Redact: gone for good; the version of a live memory's content is refused.
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/memory_versions/{v1}/redact"),
        None,
    )
    .await;
    r.expect(200);
    assert!(r.body["content"].is_null() && r.body["path"].is_null());
    assert!(r.body["content_sha256"].is_null() && r.body["redacted_at"].is_string());
    assert_eq!(r.body["redacted_by"]["type"], "api_actor");
    let stored: Option<String> =
        sqlx::query_scalar("SELECT content FROM memory_versions WHERE id = $1")
            .bind(&v1)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(stored, None);
    let live = app.memory_at(&store, "/b").await.unwrap();
    let current = live["memory_version_id"].as_str().unwrap();
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/memory_versions/{current}/redact"),
        None,
    )
    .await;
    assert_error(&r, 409, "memory_version_current");
    let r = ws(
        &app,
        Method::GET,
        &format!("{base}/memory_versions/{current}"),
        None,
    )
    .await;
    assert_eq!(r.body["content"], "other");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_archived_store_is_read_and_deleted_from_but_not_written(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let store = app.create_store("old").await;
    let mem = app.create_memory(&store, "/keep", "k").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let gone = app.create_memory(&store, "/gone", "g").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    ws(
        &app,
        Method::POST,
        &format!("/v1/memory_stores/{store}/archive"),
        None,
    )
    .await
    .expect(200);
    let base = format!("/v1/memory_stores/{store}/memories");
    let r = ws(
        &app,
        Method::POST,
        &base,
        Some(json!({"path": "/new", "content": "n"})),
    )
    .await;
    assert_error(&r, 400, "memory_store_archived");
    let r = ws(
        &app,
        Method::POST,
        &format!("{base}/{mem}"),
        Some(json!({"content": "x"})),
    )
    .await;
    assert_error(&r, 400, "memory_store_archived");
    ws(&app, Method::GET, &format!("{base}/{mem}"), None)
        .await
        .expect(200);
    ws(&app, Method::DELETE, &format!("{base}/{gone}"), None)
        .await
        .expect(200);
    assert_eq!(app.all_memories(&store).await.len(), 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn racing_writers_with_one_precondition_make_one_winner(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let store = app.create_store("race").await;
    let mem = app.create_memory(&store, "/r", "start").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let sha = sha256_hex("start");
    let path = format!("/v1/memory_stores/{store}/memories/{mem}");
    let tries = (0..8).map(|i| {
        let app = &app;
        let path = path.clone();
        let sha = sha.clone();
        async move {
            ws(
                app,
                Method::POST,
                &path,
                Some(json!({"content": format!("writer {i}"),
                            "precondition": {"type": "content_sha256", "content_sha256": sha}})),
            )
            .await
        }
    });
    let replies = futures::future::join_all(tries).await;
    let won: Vec<_> = replies.iter().filter(|r| r.status == 200).collect();
    assert_eq!(
        won.len(),
        1,
        "{:?}",
        replies.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    for r in replies.iter().filter(|r| r.status != 200) {
        assert_eq!(r.status, 409);
        assert_eq!(r.error_type(), Some("memory_precondition_failed_error"));
    }
    // Racing creates of one path: one memory.
    let creates = (0..8).map(|i| {
        let app = &app;
        let store = store.clone();
        async move {
            app.create_memory_as(&store, "/same", &format!("c{i}"), &app.ws_key)
                .await
        }
    });
    let replies = futures::future::join_all(creates).await;
    assert_eq!(replies.iter().filter(|r| r.status == 200).count(), 1);
    assert!(replies
        .iter()
        .filter(|r| r.status != 200)
        .all(|r| r.error_type() == Some("memory_path_conflict_error")));
    let versions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM memory_versions WHERE memory_id = $1")
            .bind(&mem)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(versions, 2);
}
