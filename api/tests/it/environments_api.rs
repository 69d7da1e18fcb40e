//! `/v1/environments` (wire contract §3): create, get, list, update, archive,
//! delete, and how an Environment's state governs its Work.

use mango_testkit::*;

use reqwest::Method;
use serde_json::{json, Value};

const ENV_FIELDS: [&str; 10] = [
    "archived_at",
    "config",
    "created_at",
    "description",
    "id",
    "metadata",
    "name",
    "scope",
    "type",
    "updated_at",
];

#[track_caller]
fn assert_ts(v: &Value) -> mango_protocol::time::Timestamp {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("expected a timestamp, got {v}"));
    assert!(
        s.len() == 27 && s.ends_with('Z') && s.as_bytes()[19] == b'.',
        "{s:?} is not RFC 3339 UTC with 6 fractional digits"
    );
    mango_protocol::time::parse(s).unwrap()
}

#[track_caller]
fn assert_environment(e: &Value) {
    let obj = e
        .as_object()
        .unwrap_or_else(|| panic!("expected an Environment, got {e}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ENV_FIELDS);
    assert!(e["id"].as_str().is_some_and(|id| id.starts_with("env_")));
    assert_eq!(e["type"], "environment");
    assert_eq!(e["config"], json!({"type": "self_hosted"}));
    assert!(e["metadata"].is_object());
    assert!(assert_ts(&e["created_at"]) <= assert_ts(&e["updated_at"]));
    if !e["archived_at"].is_null() {
        assert_ts(&e["archived_at"]);
    }
}

#[track_caller]
fn assert_error(r: &Reply, status: u16, code: &str) {
    r.expect(status);
    assert_eq!(r.code(), Some(code), "{}", r.body);
}

async fn create(app: &TestApp, body: Value) -> Reply {
    app.call(
        Method::POST,
        "/v1/environments",
        Some(&app.ws_key),
        Some(body),
    )
    .await
}

async fn get(app: &TestApp, id: &str) -> Reply {
    app.call(
        Method::GET,
        &format!("/v1/environments/{id}"),
        Some(&app.ws_key),
        None,
    )
    .await
}

async fn update(app: &TestApp, id: &str, body: Value) -> Reply {
    app.call(
        Method::POST,
        &format!("/v1/environments/{id}"),
        Some(&app.ws_key),
        Some(body),
    )
    .await
}

async fn archive(app: &TestApp, id: &str) -> Reply {
    app.call(
        Method::POST,
        &format!("/v1/environments/{id}/archive"),
        Some(&app.ws_key),
        None,
    )
    .await
}

async fn list(app: &TestApp, query: &str) -> Reply {
    app.call(
        Method::GET,
        &format!("/v1/environments{query}"),
        Some(&app.ws_key),
        None,
    )
    .await
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

async fn env_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM environments")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

// ------------------------------------------------------------------ create

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn create_with_only_a_name_fills_the_defaults(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(&app, json!({"name": "builders"})).await;
    r.expect(200);
    let e = &r.body;
    assert_environment(e);
    assert_eq!(e["name"], "builders");
    assert!(e["description"].is_null() && e["scope"].is_null() && e["archived_at"].is_null());
    assert_eq!(e["metadata"], json!({}));
    assert_eq!(e["created_at"], e["updated_at"]);
    let got = get(&app, e["id"].as_str().unwrap()).await;
    got.expect(200);
    assert_eq!(got.body, *e);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn create_with_every_field(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(
        &app,
        json!({
            "name": "gpu pool",
            "description": "runs the GPU jobs",
            "config": {"type": "self_hosted"},
            "metadata": {"team": "ml", "tier": "1"},
            "scope": "organization",
        }),
    )
    .await;
    r.expect(200);
    assert_environment(&r.body);
    assert_eq!(r.body["description"], "runs the GPU jobs");
    assert_eq!(r.body["metadata"], json!({"team": "ml", "tier": "1"}));
    assert_eq!(r.body["scope"], "organization");
    // A null config means self_hosted.
    let r = create(
        &app,
        json!({"name": "n", "config": null, "description": null}),
    )
    .await;
    r.expect(200);
    assert_environment(&r.body);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn create_refuses_cloud_config_and_bad_fields(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let before = env_count(&app).await;
    let cloud = json!({
        "name": "cloudy",
        "config": {"type": "cloud", "networking": {"type": "unrestricted"}, "packages": {"pip": []}},
    });
    assert_error(&create(&app, cloud).await, 400, "unsupported_config_type");
    for body in [
        json!({}),
        json!({"name": ""}),
        json!({"name": "   "}),
        json!({"name": 7}),
        json!({"name": "x".repeat(257)}),
        json!({"name": "n", "scope": "galaxy"}),
        json!({"name": "n", "config": {}}),
        json!({"name": "n", "config": "self_hosted"}),
        json!({"name": "n", "config": {"type": "self_hosted", "image": "x"}}),
        json!({"name": "n", "description": "d".repeat(2049)}),
        json!({"name": "n", "owner": "me"}),
    ] {
        let r = create(&app, body.clone()).await;
        assert_error(&r, 400, "invalid_parameter");
    }
    assert_error(
        &create(&app, json!({"name": "n", "metadata": {"k": 1}})).await,
        400,
        "invalid_metadata",
    );
    assert_eq!(
        env_count(&app).await,
        before,
        "no refused create wrote a row"
    );
    // The edges that are allowed.
    create(
        &app,
        json!({"name": "x".repeat(256), "description": "d".repeat(2048)}),
    )
    .await
    .expect(200);
}

// ------------------------------------------------------------------ get / list

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn get_of_an_unknown_environment_is_404(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = get(&app, "env_doesnotexist").await;
    assert_error(&r, 404, "environment_not_found");
    assert_eq!(r.error_type(), Some("not_found_error"));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn list_is_newest_first_pages_and_hides_archived(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let a = app.env_id.clone();
    let b = app.create_environment("b").await;
    let c = app.create_environment("c").await;
    let d = app.create_environment("d").await;
    archive(&app, &c).await.expect(200);

    let r = list(&app, "").await;
    r.expect(200);
    assert_eq!(ids(&r.body), [d.as_str(), b.as_str(), a.as_str()]);
    assert!(r.body["next_page"].is_null());
    for e in r.body["data"].as_array().unwrap() {
        assert_environment(e);
    }
    let r = list(&app, "?include_archived=false").await;
    assert_eq!(ids(&r.body), [d.as_str(), b.as_str(), a.as_str()]);
    let r = list(&app, "?include_archived=true").await;
    assert_eq!(
        ids(&r.body),
        [d.as_str(), c.as_str(), b.as_str(), a.as_str()]
    );

    // limit=1, then page=next_page, until next_page is null.
    let mut seen = Vec::new();
    let mut query = "?include_archived=true&limit=1".to_string();
    loop {
        let r = list(&app, &query).await;
        r.expect(200);
        let page = ids(&r.body);
        assert_eq!(page.len(), 1);
        seen.extend(page);
        match r.body["next_page"].as_str() {
            Some(next) => {
                query = format!("?include_archived=true&limit=1&page={}", urlencode(next))
            }
            None => break,
        }
        assert!(seen.len() < 4, "next_page is null on the last page");
    }
    assert_eq!(seen, [d.as_str(), c.as_str(), b.as_str(), a.as_str()]);

    let r = list(&app, "?limit=2").await;
    assert_eq!(ids(&r.body), [d.as_str(), b.as_str()]);
    let next = r.body["next_page"].as_str().unwrap().to_string();
    let r = list(&app, &format!("?limit=2&page={}", urlencode(&next))).await;
    assert_eq!(ids(&r.body), [a.as_str()]);
    assert!(r.body["next_page"].is_null());

    for q in ["?include_archived=yes", "?limit=0", "?limit=101"] {
        assert_error(&list(&app, q).await, 400, "invalid_parameter");
    }
    assert_error(&list(&app, "?page=garbage").await, 400, "invalid_cursor");
}

// ------------------------------------------------------------------ update

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn update_changes_name_and_description(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(&app, json!({"name": "old", "description": "first"})).await;
    let created = r.body.clone();
    let id = created["id"].as_str().unwrap().to_string();

    let r = update(&app, &id, json!({"name": "new"})).await;
    r.expect(200);
    assert_environment(&r.body);
    assert_eq!(r.body["name"], "new");
    assert_eq!(r.body["description"], "first", "omitted keeps");
    assert_eq!(r.body["created_at"], created["created_at"]);
    assert!(assert_ts(&r.body["updated_at"]) > assert_ts(&created["updated_at"]));

    let r = update(&app, &id, json!({"description": ""})).await;
    assert_eq!(r.body["description"], "", "\"\" is stored as \"\"");
    let r = update(&app, &id, json!({"description": null, "name": null})).await;
    r.expect(200);
    assert!(r.body["description"].is_null(), "null clears");
    assert_eq!(r.body["name"], "new", "a null name keeps the name");
    // An empty body changes nothing but is accepted (the SDK may send one).
    let r = app
        .call_raw(
            Method::POST,
            &format!("/v1/environments/{id}"),
            Some(&app.ws_key),
            "",
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["name"], "new");
    assert_eq!(get(&app, &id).await.body["name"], "new");

    assert_error(
        &update(&app, &id, json!({"name": ""})).await,
        400,
        "invalid_parameter",
    );
    assert_error(
        &update(&app, "env_doesnotexist", json!({"name": "x"})).await,
        404,
        "environment_not_found",
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn update_merges_metadata_and_null_or_empty_deletes(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(
        &app,
        json!({"name": "m", "metadata": {"a": "1", "b": "2", "c": "3"}}),
    )
    .await;
    let id = r.body["id"].as_str().unwrap().to_string();
    let r = update(
        &app,
        &id,
        json!({"metadata": {"a": null, "b": "", "c": "three", "d": "4"}}),
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["metadata"], json!({"c": "three", "d": "4"}));
    assert_eq!(
        get(&app, &id).await.body["metadata"],
        json!({"c": "three", "d": "4"})
    );

    let r = update(&app, &id, json!({"metadata": {"bad": 1}})).await;
    assert_error(&r, 400, "invalid_metadata");
    let r = update(&app, &id, json!({"metadata": "a=1"})).await;
    assert_error(&r, 400, "invalid_metadata");
    assert_eq!(
        get(&app, &id).await.body["metadata"],
        json!({"c": "three", "d": "4"})
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn update_cannot_change_the_config_type(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.env_id.clone();
    let before = get(&app, &id).await.body;
    let r = update(
        &app,
        &id,
        json!({"config": {"type": "cloud"}, "name": "renamed"}),
    )
    .await;
    assert_error(&r, 400, "invalid_config_type_change");
    assert_eq!(
        get(&app, &id).await.body,
        before,
        "nothing of it was applied"
    );

    let r = update(&app, &id, json!({"config": {"type": "self_hosted"}})).await;
    r.expect(200);
    assert_eq!(r.body["config"], json!({"type": "self_hosted"}));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn archived_environment_cannot_be_updated(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.env_id.clone();
    let archived = archive(&app, &id).await.body.clone();
    let r = update(&app, &id, json!({"name": "renamed"})).await;
    assert_error(&r, 400, "environment_archived");
    assert_eq!(r.error_type(), Some("invalid_request_error"));
    assert_eq!(get(&app, &id).await.body, archived);
}

// ------------------------------------------------------------------ archive / delete

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn archive_is_idempotent(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.env_id.clone();
    let r = archive(&app, &id).await;
    r.expect(200);
    assert_environment(&r.body);
    let at = assert_ts(&r.body["archived_at"]);
    assert_eq!(r.body["updated_at"], r.body["archived_at"]);

    let again = archive(&app, &id).await;
    again.expect(200);
    assert_eq!(again.body, r.body, "archiving twice keeps the first time");
    assert_eq!(assert_ts(&get(&app, &id).await.body["archived_at"]), at);
    assert_error(
        &archive(&app, "env_doesnotexist").await,
        404,
        "environment_not_found",
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn archived_environment_gets_no_new_work(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let existing = app.create_check().await;
    archive(&app, &app.env_id).await.expect(200);
    let r = app
        .call(
            Method::POST,
            &app.work_path(""),
            Some(&app.ws_key),
            Some(json!({"data": {"type": "healthcheck"}})),
        )
        .await;
    assert_error(&r, 400, "environment_archived");
    let listed = app
        .call(Method::GET, &app.work_path(""), Some(&app.ws_key), None)
        .await;
    assert_eq!(
        ids(&listed.body),
        [existing.as_str()],
        "only the earlier item exists"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn delete_removes_the_environment_its_work_and_its_keys(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.env_id.clone();
    let (claim, last) = app.active_check().await;
    app.create_check().await;
    let other = app.create_environment("survivor").await;

    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/environments/{id}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    r.expect(200);
    assert_eq!(r.body, json!({"id": id, "type": "environment_deleted"}));

    assert_error(&get(&app, &id).await, 404, "environment_not_found");
    let r = app
        .call(
            Method::GET,
            &format!("/v1/environments/{id}/work/{}", claim.id),
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_error(&r, 404, "environment_not_found");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM work WHERE environment_id = $1")
        .bind(&id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(left, 0, "its Work is gone");
    // Its key and the tokens of its Work no longer authenticate.
    let r = app
        .call(
            Method::GET,
            &app.work_path("/poll"),
            Some(&app.env_key),
            None,
        )
        .await;
    r.expect(401);
    let r = app.heartbeat(&claim.id, &claim.token, &last).await;
    r.expect(401);

    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/environments/{id}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_error(&r, 404, "environment_not_found");
    assert_eq!(
        ids(&list(&app, "?include_archived=true").await.body),
        [other.as_str()]
    );
}
