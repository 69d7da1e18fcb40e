//! The Work API endpoint by endpoint (spec §3–§4, wire contract §5): each
//! success path with its exact response shape, and every error each handler
//! can answer with. Credential scopes are in `credentials.rs`; input limits in
//! `bad_input.rs`.

use mango_testkit::*;

use chrono::Duration as Span;
use mango_api::clock::ManualClock;
use mango_api::Settings;
use mango_protocol::time::Timestamp;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NO_HB: &str = "NO_HEARTBEAT";
const PASSED: &str = "Sandbox process and workspace check passed";
const TIMED_OUT: &str = "Healthcheck did not finish before its deadline";
const CANCELLED: &str = "Healthcheck was stopped before it finished";

const WORK_FIELDS: [&str; 15] = [
    "acknowledged_at",
    "created_at",
    "data",
    "environment_id",
    "expires_at",
    "id",
    "latest_heartbeat_at",
    "metadata",
    "result",
    "secret",
    "started_at",
    "state",
    "stop_requested_at",
    "stopped_at",
    "type",
];

// ------------------------------------------------------------------ helpers

/// Parses a wire timestamp, asserting the one format Mango writes:
/// RFC 3339, UTC with `Z`, exactly six fractional digits.
#[track_caller]
fn ts(v: &Value) -> Timestamp {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("expected a timestamp string, got {v}"));
    let fixed = s.len() == 27
        && s.bytes().enumerate().all(|(i, c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'.',
            26 => c == b'Z',
            _ => c.is_ascii_digit(),
        });
    assert!(
        fixed,
        "{s:?} is not RFC 3339 UTC with Z and 6 fractional digits"
    );
    mango_protocol::time::parse(s).unwrap()
}

/// Asserts a complete healthcheck Work object in `env` with `state`.
#[track_caller]
fn assert_work(w: &Value, env: &str, state: &str) {
    let obj = w
        .as_object()
        .unwrap_or_else(|| panic!("expected a Work object, got {w}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    // A Poll answer (the one that carries the secret) also names its claim.
    if !w["secret"].is_null() {
        assert!(w["claim"].as_i64().is_some_and(|c| c >= 1), "claim of {w}");
        keys.retain(|k| *k != "claim");
    }
    // A Workspace key's read also says who holds the item and for how long.
    if let Some(lease) = obj.get("lease") {
        let mut fields: Vec<&str> = lease
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            ["claim", "expires_at", "remaining_ms", "worker_id"],
            "{w}"
        );
        assert!(lease["claim"].as_i64().is_some_and(|c| c >= 0), "{w}");
        assert_eq!(
            lease["expires_at"].is_null(),
            lease["remaining_ms"].is_null(),
            "{w}"
        );
        keys.retain(|k| *k != "lease");
    }
    assert_eq!(keys, WORK_FIELDS, "Work fields of {w}");
    assert!(w["id"].as_str().is_some_and(|id| id.starts_with("work_")));
    assert_eq!(w["type"], "work");
    assert_eq!(w["environment_id"], env);
    assert_eq!(w["data"], json!({"type": "healthcheck"}));
    assert!(w["metadata"].is_object());
    assert_eq!(w["state"], state, "state of {w}");
    let created = ts(&w["created_at"]);
    assert_eq!(
        ts(&w["expires_at"]) - created,
        Span::seconds(120),
        "deadline"
    );
    for f in [
        "acknowledged_at",
        "started_at",
        "latest_heartbeat_at",
        "stop_requested_at",
        "stopped_at",
    ] {
        if !w[f].is_null() {
            ts(&w[f]);
        }
    }
}

#[track_caller]
fn assert_error(r: &Reply, status: u16, kind: &str, code: Option<&str>) {
    r.expect(status);
    assert_eq!(r.error_type(), Some(kind), "error type in {}", r.body);
    if code.is_some() {
        assert_eq!(r.code(), code, "error_code in {}", r.body);
    }
}

#[track_caller]
fn assert_final(r: &Reply) {
    assert_eq!(
        r.headers
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false"),
        "a final answer carries x-should-retry: false"
    );
}

fn url(app: &TestApp, path: &str) -> String {
    format!("{}{path}", app.base)
}

/// Sends a prepared request; the reply and its raw body text.
async fn send(req: reqwest::RequestBuilder) -> (Reply, String) {
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text.clone()))
    };
    (
        Reply {
            status,
            headers,
            body,
        },
        text,
    )
}

async fn no_sweeper(db: sqlx::PgPool) -> TestApp {
    TestApp::start_with(
        db,
        Settings {
            sweep_interval: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await
}

async fn short_ttl(db: sqlx::PgPool) -> TestApp {
    TestApp::start_with(
        db,
        Settings {
            default_ttl_seconds: 1,
            ..Default::default()
        },
    )
    .await
}

async fn create(app: &TestApp, body: Value) -> Reply {
    app.call(
        Method::POST,
        &app.work_path(""),
        Some(&app.ws_key),
        Some(body),
    )
    .await
}

/// A new healthcheck's full object.
async fn create_check_body(app: &TestApp) -> Value {
    let r = create(app, json!({"data": {"type": "healthcheck"}})).await;
    r.expect(201);
    r.body
}

async fn get(app: &TestApp, id: &str) -> Reply {
    app.call(
        Method::GET,
        &app.work_path(&format!("/{id}")),
        Some(&app.ws_key),
        None,
    )
    .await
}

async fn update(app: &TestApp, id: &str, body: Value) -> Reply {
    app.call(
        Method::POST,
        &app.work_path(&format!("/{id}")),
        Some(&app.ws_key),
        Some(body),
    )
    .await
}

async fn list(app: &TestApp, query: &str) -> Reply {
    app.call(Method::GET, &app.work_path(query), Some(&app.ws_key), None)
        .await
}

async fn stats(app: &TestApp) -> Value {
    let r = app
        .call(
            Method::GET,
            &app.work_path("/stats"),
            Some(&app.ws_key),
            None,
        )
        .await;
    r.expect(200);
    r.body
}

async fn stop(app: &TestApp, id: &str, credential: &str, body: Value) -> Reply {
    app.call(
        Method::POST,
        &app.work_path(&format!("/{id}/stop")),
        Some(credential),
        Some(body),
    )
    .await
}

async fn heartbeat_ttl(app: &TestApp, id: &str, token: &str, expected: &str, ttl: i64) -> Reply {
    let q = format!(
        "/{id}/heartbeat?expected_last_heartbeat={}&desired_ttl_seconds={ttl}",
        urlencode(expected)
    );
    app.call(Method::POST, &app.work_path(&q), Some(token), None)
        .await
}

async fn post_result(app: &TestApp, id: &str, token: &str, status: &str, message: &str) -> Reply {
    app.call(
        Method::POST,
        &app.work_path(&format!("/{id}/result")),
        Some(token),
        Some(json!({"status": status, "message": message})),
    )
    .await
}

async fn fail(app: &TestApp, id: &str, token: &str, message: &str) -> Reply {
    app.call(
        Method::POST,
        &app.work_path(&format!("/{id}/fail")),
        Some(token),
        Some(json!({"error": {"message": message}})),
    )
    .await
}

/// Moves a check's creation and deadline 121 s into the past: its deadline has passed.
async fn make_overdue(app: &TestApp, id: &str) {
    let done = sqlx::query(
        "UPDATE work SET created_at = created_at - interval '121 seconds',
                         expires_at = expires_at - interval '121 seconds'
         WHERE id = $1",
    )
    .bind(id)
    .execute(&app.db)
    .await
    .unwrap();
    assert_eq!(done.rows_affected(), 1);
}

fn last_of(r: &Reply) -> String {
    r.body["last_heartbeat"].as_str().unwrap().to_string()
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

// ------------------------------------------------------------------ Create

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn create_returns_a_queued_healthcheck(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(
        &app,
        json!({"data": {"type": "healthcheck"}, "metadata": {"team": "infra"}}),
    )
    .await;
    r.expect(201);
    let w = &r.body;
    assert_work(w, &app.env_id, "queued");
    assert_eq!(w["metadata"], json!({"team": "infra"}));
    for f in [
        "acknowledged_at",
        "started_at",
        "latest_heartbeat_at",
        "stop_requested_at",
        "stopped_at",
        "secret",
        "result",
    ] {
        assert!(w[f].is_null(), "{f} of a new check is null: {w}");
    }
    // Each POST makes a new check.
    let second = create_check_body(&app).await;
    assert_ne!(second["id"], w["id"]);
    assert_eq!(second["metadata"], json!({}));
    // Get returns the same object.
    assert_eq!(app.get_work(w["id"].as_str().unwrap()).await, *w);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn create_refuses_what_it_cannot_create(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    for body in [
        json!({}),
        json!({"data": {}}),
        json!({"data": {"type": "session", "id": "sesn_x"}}),
        json!({"data": {"type": "cron"}}),
        json!({"data": {"type": "healthcheck", "command": "rm -rf /"}}),
    ] {
        let r = create(&app, body.clone()).await;
        assert_error(&r, 400, "invalid_request_error", Some("invalid_parameter"));
    }
    let r = create(
        &app,
        json!({"data": {"type": "healthcheck"}, "metadata": {"k": 1}}),
    )
    .await;
    assert_error(&r, 400, "invalid_request_error", Some("invalid_metadata"));
    let r = app
        .call(
            Method::POST,
            "/v1/environments/env_doesnotexist/work",
            Some(&app.ws_key),
            Some(json!({"data": {"type": "healthcheck"}})),
        )
        .await;
    assert_error(&r, 404, "not_found_error", Some("environment_not_found"));
    let listed = list(&app, "").await;
    assert_eq!(
        listed.body["data"],
        json!([]),
        "no refused create wrote a row"
    );
}

// ------------------------------------------------------------------ Get

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn get_shows_the_lease_and_never_the_secret(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, last) = app.active_check().await;
    let w = app.get_work(&claim.id).await;
    assert_work(&w, &app.env_id, "active");
    assert!(w["secret"].is_null());
    assert_eq!(
        w["latest_heartbeat_at"], last,
        "Get shows the exact string heartbeats echo"
    );
    let acked = ts(&w["acknowledged_at"]);
    let started = ts(&w["started_at"]);
    assert!(ts(&w["created_at"]) <= acked && acked <= started);
    assert!(w["stop_requested_at"].is_null() && w["stopped_at"].is_null());
    assert!(w["result"].is_null());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn get_of_unknown_work_or_environment_is_404(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = get(&app, "work_doesnotexist").await;
    assert_error(&r, 404, "not_found_error", Some("work_not_found"));
    let id = app.create_check().await;
    let r = app
        .call(
            Method::GET,
            &format!("/v1/environments/env_doesnotexist/work/{id}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_error(&r, 404, "not_found_error", Some("environment_not_found"));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn work_of_another_environment_is_404_everywhere(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let other_env = app.create_environment("other").await;
    let r = app
        .call(
            Method::POST,
            &format!("/v1/environments/{other_env}/work"),
            Some(&app.ws_key),
            Some(json!({"data": {"type": "healthcheck"}})),
        )
        .await;
    r.expect(201);
    let foreign = r.body["id"].as_str().unwrap().to_string();

    assert_error(
        &get(&app, &foreign).await,
        404,
        "not_found_error",
        Some("work_not_found"),
    );
    let r = update(&app, &foreign, json!({"metadata": {"a": "b"}})).await;
    assert_error(&r, 404, "not_found_error", Some("work_not_found"));
    let r = stop(&app, &foreign, &app.ws_key, json!({"force": true})).await;
    assert_error(&r, 404, "not_found_error", Some("work_not_found"));
    let r = app.ack(&foreign).await;
    assert_error(&r, 404, "not_found_error", Some("work_not_found"));
    // Untouched in its own Environment.
    let r = app
        .call(
            Method::GET,
            &format!("/v1/environments/{other_env}/work/{foreign}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["state"], "queued");
    assert_eq!(r.body["metadata"], json!({}));
}

// ------------------------------------------------------------------ Update

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn update_merges_metadata(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(
        &app,
        json!({"data": {"type": "healthcheck"}, "metadata": {"a": "1", "b": "2"}}),
    )
    .await;
    let id = r.body["id"].as_str().unwrap().to_string();

    let r = update(
        &app,
        &id,
        json!({"metadata": {"a": "x", "b": null, "c": "3", "absent": null}}),
    )
    .await;
    r.expect(200);
    assert_work(&r.body, &app.env_id, "queued");
    assert!(r.body["secret"].is_null());
    assert_eq!(r.body["metadata"], json!({"a": "x", "c": "3"}));
    assert_eq!(
        app.get_work(&id).await["metadata"],
        json!({"a": "x", "c": "3"})
    );

    // An empty patch and a null metadata change nothing.
    for body in [json!({"metadata": {}}), json!({"metadata": null})] {
        let r = update(&app, &id, body).await;
        r.expect(200);
        assert_eq!(r.body["metadata"], json!({"a": "x", "c": "3"}));
    }
    // "" is a value for Work metadata (only Environment metadata deletes on "").
    let r = update(&app, &id, json!({"metadata": {"a": ""}})).await;
    r.expect(200);
    assert_eq!(r.body["metadata"], json!({"a": "", "c": "3"}));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn update_errors_change_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(
        &app,
        json!({"data": {"type": "healthcheck"}, "metadata": {"keep": "me"}}),
    )
    .await;
    let id = r.body["id"].as_str().unwrap().to_string();
    let sixteen_more: serde_json::Map<String, Value> =
        (0..16).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (body, code) in [
        (json!({"metadata": ["a"]}), "invalid_metadata"),
        (json!({"metadata": {"a": 1}}), "invalid_metadata"),
        (
            json!({"metadata": Value::Object(sixteen_more)}),
            "invalid_metadata",
        ),
        (
            json!({"metadata": {}, "state": "stopped"}),
            "invalid_parameter",
        ),
    ] {
        let r = update(&app, &id, body).await;
        assert_error(&r, 400, "invalid_request_error", Some(code));
    }
    let w = app.get_work(&id).await;
    assert_eq!(w["metadata"], json!({"keep": "me"}));
    assert_eq!(w["state"], "queued");

    let r = update(&app, "work_doesnotexist", json!({"metadata": {}})).await;
    assert_error(&r, 404, "not_found_error", Some("work_not_found"));
}

// ------------------------------------------------------------------ List

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn list_is_newest_first_in_cursor_pages(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = list(&app, "").await;
    r.expect(200);
    assert_eq!(r.body, json!({"data": [], "next_page": null}));

    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(app.create_check().await);
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();

    let r = list(&app, "").await;
    r.expect(200);
    let got: Vec<String> = r.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            assert_work(w, &app.env_id, "queued");
            assert!(w["secret"].is_null());
            w["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(got, newest_first);
    assert!(r.body["next_page"].is_null());

    // limit=1, then page=next_page with the same limit, until next_page is null.
    let mut paged = Vec::new();
    let mut query = "?limit=1".to_string();
    loop {
        let r = list(&app, &query).await;
        r.expect(200);
        let data = r.body["data"].as_array().unwrap();
        assert_eq!(data.len(), 1);
        paged.push(data[0]["id"].as_str().unwrap().to_string());
        match r.body["next_page"].as_str() {
            Some(next) => query = format!("?limit=1&page={}", urlencode(next)),
            None => break,
        }
        assert!(paged.len() < 3, "next_page is null on the last page");
    }
    assert_eq!(paged, newest_first);

    let r = list(&app, "?limit=2").await;
    assert_eq!(r.body["data"].as_array().unwrap().len(), 2);
    let next = r.body["next_page"].as_str().unwrap().to_string();
    let r = list(&app, &format!("?limit=2&page={}", urlencode(&next))).await;
    assert_eq!(r.body["data"][0]["id"], newest_first[2]);
    assert!(r.body["next_page"].is_null());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn list_errors(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = list(&app, "?page=not-a-cursor").await;
    assert_error(&r, 400, "invalid_request_error", Some("invalid_cursor"));
    let r = list(&app, "?limit=0").await;
    assert_error(&r, 400, "invalid_request_error", Some("invalid_parameter"));
    let r = app
        .call(
            Method::GET,
            "/v1/environments/env_doesnotexist/work",
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_error(&r, 404, "not_found_error", Some("environment_not_found"));
}

// ------------------------------------------------------------------ Poll

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn poll_claims_the_oldest_item_with_a_secret(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let first = app.create_check().await;
    let second = app.create_check().await;

    let a = app.poll().await.expect("an item");
    assert_eq!(a.id, first, "oldest first");
    assert_work(&a.work, &app.env_id, "queued");
    let secret = a.work["secret"].as_str().unwrap();
    assert!(!secret.contains('=') && !secret.contains('+') && !secret.contains('/'));
    assert!(a.token.starts_with("mango_st_"));
    assert!(a.work["acknowledged_at"].is_null());

    let b = app.poll().await.expect("the second item");
    assert_eq!(b.id, second);
    assert_ne!(a.token, b.token, "every claim has its own token");
    assert!(
        app.poll().await.is_none(),
        "pending claims are not handed out again"
    );
    // The secret is shown once: Get never returns it.
    assert!(app.get_work(&first).await["secret"].is_null());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn empty_poll_is_200_json_null(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (r, text) = send(
        app.http
            .get(url(&app, &app.work_path("/poll")))
            .bearer_auth(&app.env_key),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);
    assert_eq!(text, "null");
    let ct = r.headers["content-type"].to_str().unwrap();
    assert!(ct.starts_with("application/json"), "content-type {ct}");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn blocking_poll_waits_and_is_woken_by_new_work(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let started = Instant::now();
    assert!(app.poll_query("?block_ms=150").await.is_none());
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "block_ms makes an empty Poll wait"
    );

    let (polled, created) = tokio::join!(app.poll_query("?block_ms=999"), async {
        sleep_ms(100).await;
        app.create_check().await
    });
    let claim = polled.expect("the waiting Poll is woken by the new item");
    assert_eq!(claim.id, created);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn poll_errors(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let long_worker = format!("?worker_id={}", "w".repeat(257));
    for q in [
        "?block_ms=0",
        "?block_ms=1000",
        "?block_ms=soon",
        "?reclaim_older_than_ms=-1",
        long_worker.as_str(),
    ] {
        let r = app
            .call(
                Method::GET,
                &app.work_path(&format!("/poll{q}")),
                Some(&app.env_key),
                None,
            )
            .await;
        assert_error(&r, 400, "invalid_request_error", Some("invalid_parameter"));
    }
    let s = stats(&app).await;
    assert_eq!(
        (s["depth"].as_i64(), s["pending"].as_i64()),
        (Some(1), Some(0))
    );
}

// ------------------------------------------------------------------ Ack

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn ack_starts_the_lease_and_is_idempotent(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let claim = app.poll().await.unwrap();
    let r = app.ack(&claim.id).await;
    r.expect(200);
    assert_work(&r.body, &app.env_id, "starting");
    assert!(r.body["secret"].is_null());
    let acked = ts(&r.body["acknowledged_at"]);
    assert!(r.body["started_at"].is_null());

    let again = app.ack(&claim.id).await;
    again.expect(200);
    assert_eq!(again.body, r.body, "a retried Ack answers the same");
    assert_eq!(ts(&app.get_work(&claim.id).await["acknowledged_at"]), acked);

    let s = stats(&app).await;
    assert_eq!(
        (s["depth"].as_i64(), s["pending"].as_i64()),
        (Some(0), Some(0))
    );
    assert!(
        s["oldest_queued_at"].is_null(),
        "acked items left the queue"
    );
    // The lease is live: the token may claim it.
    app.heartbeat(&claim.id, &claim.token, NO_HB)
        .await
        .expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn ack_of_a_never_polled_item_is_409_final(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.create_check().await;
    let r = app.ack(&id).await;
    assert_error(&r, 409, "conflict_error", Some("work_not_claimed"));
    assert_final(&r);
    assert_eq!(app.get_work(&id).await["state"], "queued");
    assert_eq!(app.poll().await.unwrap().id, id, "still available");

    let r = app.ack("work_doesnotexist").await;
    assert_error(&r, 404, "not_found_error", Some("work_not_found"));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn ack_of_a_stopped_item_is_409_final(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let claim = app.poll().await.unwrap();
    stop(&app, &claim.id, &app.ws_key, json!({"force": true}))
        .await
        .expect(204);
    let r = app.ack(&claim.id).await;
    assert_error(&r, 409, "conflict_error", Some("work_already_stopped"));
    assert_final(&r);
    assert_eq!(app.get_work(&claim.id).await["state"], "stopped");
}

// ------------------------------------------------------------------ Heartbeat

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn heartbeat_echo_chain(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);

    let r = app.heartbeat(&c.id, &c.token, NO_HB).await;
    r.expect(200);
    let obj = r.body.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "last_heartbeat",
            "lease_extended",
            "state",
            "ttl_seconds",
            "type"
        ]
    );
    assert_eq!(r.body["type"], "work_heartbeat");
    assert_eq!(r.body["lease_extended"], true);
    assert_eq!(r.body["state"], "active");
    assert_eq!(r.body["ttl_seconds"], 120, "the default TTL");
    let mut last = last_of(&r);
    let mut last_ts = ts(&r.body["last_heartbeat"]);
    let w = app.get_work(&c.id).await;
    assert_eq!(w["state"], "active");
    assert_eq!(w["started_at"], last);

    for _ in 0..3 {
        let r = app.heartbeat(&c.id, &c.token, &last).await;
        r.expect(200);
        assert_eq!(r.body["lease_extended"], true);
        assert_eq!(r.body["state"], "active");
        let next = ts(&r.body["last_heartbeat"]);
        assert!(next > last_ts, "each beat names a later time");
        last = last_of(&r);
        last_ts = next;
        assert_eq!(app.get_work(&c.id).await["latest_heartbeat_at"], last);
    }
    assert!(app.poll().await.is_none(), "a live lease is not available");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn heartbeat_replay_of_the_previous_value_is_a_success(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);
    let first = app.heartbeat(&c.id, &c.token, NO_HB).await;
    first.expect(200);
    // The SDK retries a beat whose response was lost with the same value.
    let replay = app.heartbeat(&c.id, &c.token, NO_HB).await;
    replay.expect(200);
    assert_eq!(replay.body["lease_extended"], true);
    let l1 = last_of(&replay);

    let second = app.heartbeat(&c.id, &c.token, &l1).await;
    second.expect(200);
    let replay = app.heartbeat(&c.id, &c.token, &l1).await;
    replay.expect(200);
    assert_eq!(replay.body["state"], "active");
    let l3 = last_of(&replay);
    assert!(ts(&replay.body["last_heartbeat"]) > ts(&second.body["last_heartbeat"]));
    // The chain continues from the replay's answer.
    app.heartbeat(&c.id, &c.token, &l3).await.expect(200);
    // Older values than the previous one are stale.
    let r = app.heartbeat(&c.id, &c.token, NO_HB).await;
    assert_error(
        &r,
        412,
        "invalid_request_error",
        Some("heartbeat_precondition_failed"),
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stale_heartbeat_is_412_with_the_current_state(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);

    // Before the first beat only NO_HEARTBEAT claims the lease.
    let r = app
        .heartbeat(&c.id, &c.token, "2026-01-01T00:00:00.000000Z")
        .await;
    assert_error(
        &r,
        412,
        "invalid_request_error",
        Some("heartbeat_precondition_failed"),
    );
    assert_eq!(
        r.body["error"]["details"]["current_state"],
        json!({"last_heartbeat": null, "lease_extended": false, "state": "starting", "ttl_seconds": 120})
    );

    let l1 = last_of(&app.heartbeat(&c.id, &c.token, NO_HB).await);
    let l2 = last_of(&app.heartbeat(&c.id, &c.token, &l1).await);
    let l3 = last_of(&app.heartbeat(&c.id, &c.token, &l2).await);
    for stale in [NO_HB, l1.as_str(), "2020-01-01T00:00:00Z"] {
        let r = app.heartbeat(&c.id, &c.token, stale).await;
        assert_error(
            &r,
            412,
            "invalid_request_error",
            Some("heartbeat_precondition_failed"),
        );
        assert_eq!(
            r.body["error"]["details"]["current_state"],
            json!({"last_heartbeat": l3, "lease_extended": false, "state": "active", "ttl_seconds": 120}),
            "expected {stale}"
        );
    }
    // A refused beat changed nothing: the holder of l3 goes on.
    assert_eq!(app.get_work(&c.id).await["latest_heartbeat_at"], l3);
    app.heartbeat(&c.id, &c.token, &l3).await.expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn heartbeat_reads_its_parameters_from_query_or_json_body(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);
    let path = app.work_path(&format!("/{}/heartbeat", c.id));

    let r = app
        .call(
            Method::POST,
            &path,
            Some(&c.token),
            Some(json!({"expected_last_heartbeat": NO_HB, "desired_ttl_seconds": 30})),
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["ttl_seconds"], 30);
    assert_eq!(r.body["state"], "active");

    let r = heartbeat_ttl(&app, &c.id, &c.token, &last_of(&r), 45).await;
    r.expect(200);
    assert_eq!(r.body["ttl_seconds"], 45);

    let r = app
        .call(
            Method::POST,
            &path,
            Some(&c.token),
            Some(json!({"expected_last_heartbeat": last_of(&r)})),
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["ttl_seconds"], 120, "absent means the default TTL");

    // The SDK's form: query parameters on a body-less POST.
    let r = app.heartbeat(&c.id, &c.token, &last_of(&r)).await;
    r.expect(200);

    let r = app.call(Method::POST, &path, Some(&c.token), None).await;
    assert_error(&r, 400, "invalid_request_error", Some("invalid_parameter"));
    let r = app.heartbeat(&c.id, &c.token, "yesterday").await;
    assert_error(&r, 400, "invalid_request_error", Some("invalid_parameter"));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn heartbeat_after_the_lease_expired_is_412(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);
    let r = heartbeat_ttl(&app, &c.id, &c.token, NO_HB, 1).await;
    r.expect(200);
    assert_eq!(r.body["ttl_seconds"], 1);
    let last = last_of(&r);
    sleep_ms(1100).await;
    let r = app.heartbeat(&c.id, &c.token, &last).await;
    assert_error(
        &r,
        412,
        "invalid_request_error",
        Some("heartbeat_precondition_failed"),
    );
    assert_eq!(
        r.body["error"]["details"]["current_state"],
        json!({"last_heartbeat": last, "lease_extended": false, "state": "active", "ttl_seconds": 1})
    );
}

// ------------------------------------------------------------------ Stop

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn graceful_stop_tells_the_holder_to_cancel(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, last) = app.active_check().await;
    let (r, text) = send(
        app.http
            .post(url(&app, &app.work_path(&format!("/{}/stop", c.id))))
            .bearer_auth(&app.ws_key)
            .json(&json!({})),
    )
    .await;
    assert_eq!(r.status.as_u16(), 204);
    assert_eq!(text, "", "204 has an empty body");

    let w = app.get_work(&c.id).await;
    assert_work(&w, &app.env_id, "stopping");
    ts(&w["stop_requested_at"]);
    assert!(w["stopped_at"].is_null() && w["result"].is_null());

    let r = app.heartbeat(&c.id, &c.token, &last).await;
    r.expect(200);
    assert_eq!(r.body["state"], "stopping");
    assert_eq!(r.body["lease_extended"], false);
    assert_eq!(r.body["last_heartbeat"], last);
    // While stopping the value is not compared.
    let r = app
        .heartbeat(&c.id, &c.token, "2020-01-01T00:00:00.000000Z")
        .await;
    r.expect(200);
    assert_eq!(r.body["state"], "stopping");

    // A second graceful Stop keeps it stopping; the holder's own final Stop is forced.
    stop(&app, &c.id, &app.ws_key, json!({"force": false}))
        .await
        .expect(204);
    assert_eq!(
        app.get_work(&c.id).await["stop_requested_at"],
        w["stop_requested_at"]
    );
    stop(&app, &c.id, &c.token, json!({"force": true}))
        .await
        .expect(204);
    let w = app.get_work(&c.id).await;
    assert_eq!(w["state"], "stopped");
    ts(&w["stopped_at"]);
    assert_eq!(
        w["result"],
        json!({"status": "cancelled", "message": CANCELLED})
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_stopping_token_expires_with_its_ttl(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);
    let last = last_of(&heartbeat_ttl(&app, &c.id, &c.token, NO_HB, 2).await);
    stop(&app, &c.id, &app.ws_key, json!({})).await.expect(204);
    let r = app.heartbeat(&c.id, &c.token, &last).await;
    r.expect(200);
    assert_eq!(
        (r.body["state"].as_str(), r.body["ttl_seconds"].as_i64()),
        (Some("stopping"), Some(2))
    );
    sleep_ms(2100).await;
    // Nobody called: the read already shows it stopped.
    let w = app.get_work(&c.id).await;
    assert_eq!(w["state"], "stopped");
    assert!(ts(&w["stopped_at"]) >= ts(&w["stop_requested_at"]));
    assert_eq!(w["result"]["status"], "cancelled");
    let r = app.heartbeat(&c.id, &c.token, &last).await;
    assert_error(&r, 401, "authentication_error", None);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn forced_stop_records_stopped_at_once(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, last) = app.active_check().await;
    stop(&app, &c.id, &app.ws_key, json!({"force": true}))
        .await
        .expect(204);
    let w = app.get_work(&c.id).await;
    assert_work(&w, &app.env_id, "stopped");
    assert_eq!(w["stop_requested_at"], w["stopped_at"]);
    assert_eq!(
        w["result"],
        json!({"status": "cancelled", "message": CANCELLED})
    );
    let r = app.heartbeat(&c.id, &c.token, &last).await;
    assert_error(&r, 401, "authentication_error", None);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stop_of_an_item_that_never_went_active_stops_it_at_once(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    // Queued, never polled.
    let queued = app.create_check().await;
    stop(&app, &queued, &app.ws_key, json!({}))
        .await
        .expect(204);
    // Polled and acked, never heartbeated.
    let starting = app.create_check().await;
    let c = app.poll().await.unwrap();
    assert_eq!(c.id, starting);
    app.ack(&c.id).await.expect(200);
    stop(&app, &c.id, &app.ws_key, json!({})).await.expect(204);
    // The worker's own Stop before its first beat (token, empty body).
    app.create_check().await;
    let c2 = app.poll().await.unwrap();
    app.ack(&c2.id).await.expect(200);
    let (r, _) = send(
        app.http
            .post(url(&app, &app.work_path(&format!("/{}/stop", c2.id))))
            .bearer_auth(&c2.token),
    )
    .await;
    r.expect(204);

    for id in [queued, starting, c2.id] {
        let w = app.get_work(&id).await;
        assert_eq!(w["state"], "stopped", "{id}");
        assert_eq!(w["result"]["status"], "cancelled");
    }
    assert!(app.poll().await.is_none(), "stopped items are never polled");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stop_of_a_stopped_item_is_409_final(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.create_check().await;
    stop(&app, &id, &app.ws_key, json!({"force": true}))
        .await
        .expect(204);
    let before = app.get_work(&id).await;
    for force in [true, false] {
        let r = stop(&app, &id, &app.ws_key, json!({ "force": force })).await;
        assert_error(&r, 409, "conflict_error", Some("work_already_stopped"));
        assert_final(&r);
    }
    assert_eq!(app.get_work(&id).await, before);
    let r = stop(&app, "work_doesnotexist", &app.ws_key, json!({})).await;
    assert_error(&r, 404, "not_found_error", Some("work_not_found"));
}

// ------------------------------------------------------------------ Result

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn result_stores_the_outcome_and_stops(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, _) = app.active_check().await;
    let r = post_result(&app, &c.id, &c.token, "succeeded", PASSED).await;
    r.expect(200);
    assert_work(&r.body, &app.env_id, "stopped");
    assert!(r.body["secret"].is_null());
    assert_eq!(
        r.body["result"],
        json!({"status": "succeeded", "message": PASSED})
    );
    ts(&r.body["stopped_at"]);
    assert_eq!(without_lease(app.get_work(&c.id).await), r.body);

    // An identical retry within 30 s: 200 with the same object.
    let again = post_result(&app, &c.id, &c.token, "succeeded", PASSED).await;
    again.expect(200);
    assert_eq!(again.body, r.body);
    // A different one: 409, final.
    for (status, message) in [("failed", PASSED), ("succeeded", "something else")] {
        let r = post_result(&app, &c.id, &c.token, status, message).await;
        assert_error(&r, 409, "conflict_error", Some("result_conflict"));
        assert_final(&r);
    }
    assert_eq!(
        without_lease(app.get_work(&c.id).await),
        r.body,
        "the result is immutable"
    );
    assert!(app.poll().await.is_none());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn failed_result_is_stored_as_failed(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, _) = app.active_check().await;
    let r = post_result(&app, &c.id, &c.token, "failed", "workspace file mismatch").await;
    r.expect(200);
    assert_eq!(
        r.body["result"],
        json!({"status": "failed", "message": "workspace file mismatch"})
    );
    assert_eq!(r.body["state"], "stopped");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn result_needs_an_active_lease(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    // Acked, but no heartbeat yet.
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);
    let r = post_result(&app, &c.id, &c.token, "succeeded", PASSED).await;
    assert_error(&r, 409, "conflict_error", Some("work_not_active"));
    assert_final(&r);
    let w = app.get_work(&c.id).await;
    assert_eq!(
        (w["state"].as_str(), &w["result"]),
        (Some("starting"), &Value::Null)
    );

    // Stopping: the holder was told to cancel; no result may land.
    let last = last_of(&app.heartbeat(&c.id, &c.token, NO_HB).await);
    stop(&app, &c.id, &app.ws_key, json!({})).await.expect(204);
    let r = post_result(&app, &c.id, &c.token, "succeeded", PASSED).await;
    assert_error(&r, 409, "conflict_error", Some("work_not_active"));
    assert!(app.get_work(&c.id).await["result"].is_null());
    app.heartbeat(&c.id, &c.token, &last).await.expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn result_retry_window_closes_after_30_seconds(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, _) = app.active_check().await;
    post_result(&app, &c.id, &c.token, "succeeded", PASSED)
        .await
        .expect(200);
    sqlx::query(
        "UPDATE work SET result_committed_at = result_committed_at - interval '31 seconds' WHERE id = $1",
    )
    .bind(&c.id)
    .execute(&app.db)
    .await
    .unwrap();
    let r = post_result(&app, &c.id, &c.token, "succeeded", PASSED).await;
    assert_error(&r, 401, "authentication_error", None);
}

// ------------------------------------------------------------------ Fail

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn fail_stops_the_work_with_a_failed_result(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, last) = app.active_check().await;
    let r = fail(&app, &c.id, &c.token, "the input is invalid").await;
    r.expect(200);
    assert_work(&r.body, &app.env_id, "stopped");
    assert_eq!(
        r.body["result"],
        json!({"status": "failed", "message": "the input is invalid"})
    );
    ts(&r.body["stop_requested_at"]);
    ts(&r.body["stopped_at"]);
    assert!(r.body["secret"].is_null());
    assert_eq!(without_lease(app.get_work(&c.id).await), r.body);
    // The token ends with the Work.
    let r = app.heartbeat(&c.id, &c.token, &last).await;
    assert_error(&r, 401, "authentication_error", None);
    let r = fail(&app, &c.id, &c.token, "again").await;
    assert_error(&r, 401, "authentication_error", None);
    assert!(app.poll().await.is_none());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn fail_before_the_first_heartbeat_and_while_stopping(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);
    let r = fail(&app, &c.id, &c.token, "bad skill archive").await;
    r.expect(200);
    assert_eq!(r.body["state"], "stopped");
    assert_eq!(r.body["result"]["status"], "failed");

    let (c, _) = app.active_check().await;
    stop(&app, &c.id, &app.ws_key, json!({})).await.expect(204);
    let r = fail(&app, &c.id, &c.token, "bad input while stopping").await;
    r.expect(200);
    assert_eq!(r.body["state"], "stopped");
    assert_eq!(
        r.body["result"],
        json!({"status": "failed", "message": "bad input while stopping"})
    );
}

// ------------------------------------------------------------------ timed_out / cancelled

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn overdue_check_reads_as_timed_out_on_get_and_list(db: sqlx::PgPool) {
    let app = no_sweeper(db).await;
    let id = app.create_check().await;
    make_overdue(&app, &id).await;
    let w = app.get_work(&id).await;
    assert_work(&w, &app.env_id, "stopped");
    assert_eq!(
        w["result"],
        json!({"status": "timed_out", "message": TIMED_OUT})
    );
    assert_eq!(
        w["stopped_at"], w["expires_at"],
        "it stopped at its deadline"
    );

    let r = list(&app, "").await;
    r.expect(200);
    assert_eq!(r.body["data"][0], w);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn overdue_check_is_neither_polled_nor_counted(db: sqlx::PgPool) {
    let app = no_sweeper(db).await;
    let id = app.create_check().await;
    make_overdue(&app, &id).await;
    let s = stats(&app).await;
    assert_eq!(
        (s["depth"].as_i64(), s["pending"].as_i64()),
        (Some(0), Some(0))
    );
    assert!(s["oldest_queued_at"].is_null());
    assert!(app.poll().await.is_none());
    assert_eq!(app.get_work(&id).await["result"]["status"], "timed_out");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn overdue_check_refuses_ack_and_stop(db: sqlx::PgPool) {
    let app = no_sweeper(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    make_overdue(&app, &c.id).await;
    let r = app.ack(&c.id).await;
    assert_error(&r, 409, "conflict_error", Some("work_already_stopped"));
    let r = stop(&app, &c.id, &app.ws_key, json!({"force": true})).await;
    assert_error(&r, 409, "conflict_error", Some("work_already_stopped"));
    assert_eq!(app.get_work(&c.id).await["result"]["status"], "timed_out");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn overdue_check_refuses_heartbeat_result_and_holder_stop(db: sqlx::PgPool) {
    let app = no_sweeper(db).await;
    let (c, last) = app.active_check().await;
    make_overdue(&app, &c.id).await;
    let r = app.heartbeat(&c.id, &c.token, &last).await;
    assert_error(&r, 401, "authentication_error", None);
    let r = post_result(&app, &c.id, &c.token, "succeeded", PASSED).await;
    assert_error(&r, 401, "authentication_error", None);
    let r = stop(&app, &c.id, &c.token, json!({"force": true})).await;
    assert_error(&r, 401, "authentication_error", None);
    let w = app.get_work(&c.id).await;
    assert_eq!(
        w["result"],
        json!({"status": "timed_out", "message": TIMED_OUT})
    );
    assert_eq!(w["stopped_at"], w["expires_at"]);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn check_stopped_before_it_finished_is_cancelled(db: sqlx::PgPool) {
    let app = no_sweeper(db).await;
    // Gracefully stopped, then its deadline passed while stopping: cancelled, not timed_out.
    let (c, _) = app.active_check().await;
    stop(&app, &c.id, &app.ws_key, json!({})).await.expect(204);
    make_overdue(&app, &c.id).await;
    let w = app.get_work(&c.id).await;
    assert_eq!(w["state"], "stopped");
    assert_eq!(
        w["result"],
        json!({"status": "cancelled", "message": CANCELLED})
    );
    // A forced stop after the check finished leaves its result alone.
    let (c, _) = app.active_check().await;
    post_result(&app, &c.id, &c.token, "succeeded", PASSED)
        .await
        .expect(200);
    let r = stop(&app, &c.id, &app.ws_key, json!({"force": true})).await;
    assert_error(&r, 409, "conflict_error", Some("work_already_stopped"));
    assert_eq!(app.get_work(&c.id).await["result"]["status"], "succeeded");
}

// ------------------------------------------------------------------ Stats

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stats_count_depth_pending_and_the_oldest_item(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = stats(&app).await;
    assert_eq!(
        s,
        json!({"type": "work_queue_stats", "depth": 0, "pending": 0, "oldest_queued_at": null, "workers_polling": 0})
    );
    let a = create_check_body(&app).await;
    let b = create_check_body(&app).await;
    create_check_body(&app).await;

    let s = stats(&app).await;
    assert_eq!(
        (s["depth"].as_i64(), s["pending"].as_i64()),
        (Some(3), Some(0))
    );
    assert_eq!(s["oldest_queued_at"], a["created_at"]);
    ts(&s["oldest_queued_at"]);

    let claim = app.poll().await.unwrap();
    let s = stats(&app).await;
    assert_eq!(
        (s["depth"].as_i64(), s["pending"].as_i64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        s["oldest_queued_at"], a["created_at"],
        "pending items are still in the stream"
    );

    app.ack(&claim.id).await.expect(200);
    let s = stats(&app).await;
    assert_eq!(
        (s["depth"].as_i64(), s["pending"].as_i64()),
        (Some(2), Some(0))
    );
    assert_eq!(s["oldest_queued_at"], b["created_at"]);

    // The Environment key may read its own stats too.
    let r = app
        .call(
            Method::GET,
            &app.work_path("/stats"),
            Some(&app.env_key),
            None,
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["depth"], 2);
    let r = app
        .call(
            Method::GET,
            "/v1/environments/env_doesnotexist/work/stats",
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_error(&r, 404, "not_found_error", Some("environment_not_found"));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stats_count_polling_workers_by_header_and_query(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let poll_url = url(&app, &app.work_path("/poll"));
    let polls = [
        app.http
            .get(&poll_url)
            .bearer_auth(&app.env_key)
            .header("Anthropic-Worker-ID", "worker-a"),
        app.http
            .get(format!("{poll_url}?worker_id=worker-b"))
            .bearer_auth(&app.env_key),
        app.http
            .get(&poll_url)
            .bearer_auth(&app.env_key)
            .header("Anthropic-Worker-ID", "worker-a"),
        app.http.get(&poll_url).bearer_auth(&app.env_key),
    ];
    for req in polls {
        send(req).await.0.expect(200);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let n = stats(&app).await["workers_polling"].as_i64();
        if n == Some(2) {
            break;
        }
        assert!(
            Instant::now() < deadline && n < Some(2),
            "workers_polling is {n:?}, want 2"
        );
        sleep_ms(20).await;
    }
    sleep_ms(100).await;
    assert_eq!(
        stats(&app).await["workers_polling"],
        2,
        "anonymous polls are not workers"
    );
}

// ------------------------------------------------------------------ reclaim

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn expired_lease_is_reclaimed_with_the_same_id_and_a_new_token(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let old = app.poll().await.unwrap();
    app.ack(&old.id).await.expect(200);
    let last = last_of(&heartbeat_ttl(&app, &old.id, &old.token, NO_HB, 1).await);
    sleep_ms(1100).await;
    assert_eq!(
        stats(&app).await["depth"],
        1,
        "a lost lease waits to be picked up"
    );

    let new = app.poll().await.expect("the lost lease is reclaimable");
    assert_eq!(new.id, old.id, "same Work ID");
    assert_ne!(new.token, old.token, "rotated token");
    assert_work(&new.work, &app.env_id, "queued");
    for f in ["acknowledged_at", "started_at", "latest_heartbeat_at"] {
        assert!(new.work[f].is_null(), "{f} cleared by the reclaim");
    }
    let r = app.heartbeat(&old.id, &old.token, &last).await;
    assert_error(&r, 401, "authentication_error", None);

    let r = app.ack(&new.id).await;
    r.expect(200);
    assert_eq!(r.body["state"], "starting");
    let r = app.heartbeat(&new.id, &new.token, NO_HB).await;
    r.expect(200);
    assert_eq!(r.body["state"], "active");
    let r = app.heartbeat(&old.id, &old.token, NO_HB).await;
    assert_error(&r, 401, "authentication_error", None);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn acked_item_that_never_beat_is_reclaimed_after_the_ttl(db: sqlx::PgPool) {
    let app = short_ttl(db).await;
    app.create_check().await;
    let old = app.poll().await.unwrap();
    app.ack(&old.id).await.expect(200);
    sleep_ms(1100).await;
    let new = app.poll().await.expect("the pre-heartbeat lease ran out");
    assert_eq!(new.id, old.id);
    assert_ne!(new.token, old.token);
    let r = app.heartbeat(&old.id, &old.token, NO_HB).await;
    assert_error(&r, 401, "authentication_error", None);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn lost_check_is_reclaimable_only_until_its_deadline(db: sqlx::PgPool) {
    let app = no_sweeper(db).await;
    app.create_check().await;
    let old = app.poll().await.unwrap();
    app.ack(&old.id).await.expect(200);
    heartbeat_ttl(&app, &old.id, &old.token, NO_HB, 1)
        .await
        .expect(200);
    sleep_ms(1100).await;
    make_overdue(&app, &old.id).await;
    assert!(
        app.poll().await.is_none(),
        "past its deadline a lost check is not reclaimed"
    );
    assert_eq!(stats(&app).await["depth"], 0);
    let w = app.get_work(&old.id).await;
    assert_eq!(w["result"]["status"], "timed_out");
    assert_eq!(w["stopped_at"], w["expires_at"]);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stale_pending_claim_is_repolled_after_reclaim_older_than_ms(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.create_check().await;
    let first = app.poll().await.unwrap();
    assert!(app.poll().await.is_none(), "default 5000 ms: not yet");
    assert!(app
        .poll_query("?reclaim_older_than_ms=60000")
        .await
        .is_none());
    sleep_ms(100).await;
    let again = app
        .poll_query("?reclaim_older_than_ms=50")
        .await
        .expect("an un-acked claim older than 50 ms is available");
    assert_eq!(again.id, id);
    assert_ne!(again.token, first.token);

    // Ack acknowledges whichever claim is pending: the newer one.
    app.ack(&id).await.expect(200);
    let r = app.heartbeat(&id, &first.token, NO_HB).await;
    assert_error(&r, 401, "authentication_error", None);
    app.heartbeat(&id, &again.token, NO_HB).await.expect(200);
}

// ------------------------------------------------------------------ supervisor extensions

/// Poll names the claim it made (1, then one more per reclaim); nothing
/// else carries it.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn poll_answers_name_their_claim_and_nothing_else_does(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.create_check().await;
    let first = app.poll().await.expect("the check");
    assert_eq!(first.work["claim"], 1);
    let again = app
        .poll_query("?reclaim_older_than_ms=0")
        .await
        .expect("reclaimed");
    assert_eq!(again.id, id);
    assert_eq!(again.work["claim"], 2);
    let acked = app.ack(&id).await;
    acked.expect(200);
    assert!(acked.body.get("claim").is_none(), "{}", acked.body);
    assert!(get(&app, &id).await.body.get("claim").is_none());
}

async fn claims(app: &TestApp, credential: &str, ids: &[&str]) -> Reply {
    let query: Vec<String> = ids
        .iter()
        .map(|id| format!("ids%5B%5D={}", urlencode(id)))
        .collect();
    app.call(
        Method::GET,
        &app.work_path(&format!("/claims?{}", query.join("&"))),
        Some(credential),
        None,
    )
    .await
}

/// A supervisor reads where the items its key claimed stand, and only
/// those: another key's claim, an unclaimed item and an unknown id are left
/// out. Operators and other Environments' keys are refused.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn claims_show_a_key_its_own_items_only(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let mine = app.create_check().await;
    let claim = app.poll().await.expect("mine");
    assert_eq!(claim.id, mine);
    app.ack(&mine).await.expect(200);
    let unclaimed = app.create_check().await;
    // Another key of the same Environment reclaims a third item later.
    let theirs = app.create_check().await;
    let (_, other_key) = app.environment_key(&app.env_id).await;
    let polled = app
        .call(Method::GET, &app.work_path("/poll"), Some(&other_key), None)
        .await;
    polled.expect(200);
    assert_eq!(polled.body["id"], unclaimed, "oldest first");
    let polled = app
        .call(Method::GET, &app.work_path("/poll"), Some(&other_key), None)
        .await;
    assert_eq!(polled.body["id"], theirs);

    let r = claims(
        &app,
        &app.env_key,
        &[&mine, &unclaimed, &theirs, "work_nope"],
    )
    .await;
    r.expect(200);
    assert_eq!(r.body["type"], "work_claims");
    assert_eq!(
        r.body["data"],
        json!([{"id": mine, "state": "starting", "claim": 1, "stop_requested_at": null, "lease_lost": false, "keepable": false}])
    );
    // A stop shows at once, reconciled.
    app.stop_work(&mine, true).await;
    let r = claims(&app, &app.env_key, &[&mine]).await;
    assert_eq!(r.body["data"][0]["state"], "stopped");
    // The other key sees its own two.
    let r = claims(&app, &other_key, &[&mine, &unclaimed, &theirs]).await;
    let ids: Vec<&str> = r.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    let mut want = vec![unclaimed.as_str(), theirs.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want);

    assert_error(
        &claims(&app, &app.ws_key, &[&mine]).await,
        403,
        "permission_error",
        None,
    );
    let elsewhere = app.create_environment("elsewhere").await;
    let (_, elsewhere_key) = app.environment_key(&elsewhere).await;
    assert_error(
        &claims(&app, &elsewhere_key, &[&mine]).await,
        403,
        "permission_error",
        None,
    );
    let hundred: Vec<String> = (0..100).map(|i| format!("work_{i}")).collect();
    let refs: Vec<&str> = hundred.iter().map(String::as_str).collect();
    claims(&app, &app.env_key, &refs).await.expect(200);
    let mut over = refs.clone();
    over.push("work_x");
    assert_error(
        &claims(&app, &app.env_key, &over).await,
        400,
        "invalid_request_error",
        Some("invalid_parameter"),
    );
}

/// A claim whose lease ran out (or whose pending claim lapsed before Ack)
/// is reported lost while the row still reads `starting`/`queued`: nobody
/// has reclaimed it yet, but any Poll may, so its sandbox should go.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn claims_report_a_lease_that_ran_out(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let acked = app.create_check().await;
    app.poll().await.expect("acked");
    app.ack(&acked).await.expect(200);
    let pending = app.create_check().await;
    app.poll().await.expect("pending");
    let lost = |r: &Reply, id: &str| -> bool {
        r.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {}", r.body))["lease_lost"]
            .as_bool()
            .unwrap()
    };
    let r = claims(&app, &app.env_key, &[&acked, &pending]).await;
    assert!(!lost(&r, &acked) && !lost(&r, &pending), "{}", r.body);

    sqlx::query("UPDATE work SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(&acked)
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("UPDATE work SET claimed_at = now() - interval '1 hour' WHERE id = $1")
        .bind(&pending)
        .execute(&app.db)
        .await
        .unwrap();
    let r = claims(&app, &app.env_key, &[&acked, &pending]).await;
    assert!(lost(&r, &acked), "an expired lease is lost: {}", r.body);
    assert!(
        lost(&r, &pending),
        "a lapsed pending claim is lost: {}",
        r.body
    );
    let states: Vec<&str> = r.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert!(
        !states.contains(&"stopped"),
        "nothing is stopped: {states:?}"
    );
}

async fn deleted_sessions(app: &TestApp, credential: &str, ids: &[&str]) -> Reply {
    let query: Vec<String> = ids
        .iter()
        .map(|id| format!("ids%5B%5D={}", urlencode(id)))
        .collect();
    app.call(
        Method::GET,
        &format!(
            "/v1/environments/{}/sessions/deleted?{}",
            app.env_id,
            query.join("&")
        ),
        Some(credential),
        None,
    )
    .await
}

/// A supervisor learns which Sessions it keeps workspaces for are gone:
/// deleted ones and ids that name no Session of its Environment, never a
/// live one. Operators and other Environments' keys are refused.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn deleted_sessions_name_the_gone_and_never_the_live(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let live = app.create_session().await;
    let doomed = app.create_session().await;
    let r = deleted_sessions(&app, &app.env_key, &[&live, &doomed, "sesn_never"]).await;
    r.expect(200);
    assert_eq!(
        r.body,
        json!({"type": "deleted_sessions", "data": ["sesn_never"]})
    );
    app.call(
        Method::DELETE,
        &format!("/v1/sessions/{doomed}"),
        Some(&app.ws_key),
        None,
    )
    .await
    .expect(200);
    let r = deleted_sessions(&app, &app.env_key, &[&live, &doomed, &doomed]).await;
    assert_eq!(r.body["data"], json!([doomed]));
    // A key of another Environment is refused.
    let elsewhere = app.create_environment("elsewhere").await;
    let (_, elsewhere_key) = app.environment_key(&elsewhere).await;
    let r = deleted_sessions(&app, &elsewhere_key, &[&live]).await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_error(
        &deleted_sessions(&app, &app.ws_key, &[&live]).await,
        403,
        "permission_error",
        None,
    );
    let many: Vec<String> = (0..101).map(|i| format!("sesn_{i}")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_error(
        &deleted_sessions(&app, &app.env_key, &refs).await,
        400,
        "invalid_request_error",
        Some("invalid_parameter"),
    );
    deleted_sessions(&app, &app.env_key, &refs[..100])
        .await
        .expect(200);
}

// ------------------------------------------------------------------ who holds an item (Mango's extension)

/// A Poll as the official SDK's poller sends it, naming its worker in the
/// header; the raw reply.
async fn poll_as_worker(app: &TestApp, header: Option<&[u8]>, query: &str) -> Reply {
    let mut req = app
        .http
        .get(url(app, &app.work_path(&format!("/poll{query}"))))
        .bearer_auth(&app.env_key);
    if let Some(value) = header {
        req = req.header(
            "Anthropic-Worker-ID",
            reqwest::header::HeaderValue::from_bytes(value).unwrap(),
        );
    }
    send(req).await.0
}

/// A Workspace key's read of an item, as the holder reads it (which has no
/// `lease`).
fn without_lease(mut work: Value) -> Value {
    work.as_object_mut().unwrap().remove("lease");
    work
}

async fn lease_of(app: &TestApp, id: &str) -> Value {
    let r = get(app, id).await;
    r.expect(200);
    r.body["lease"].clone()
}

/// The api on a clock the test moves, far from this machine's, so a lease
/// time left that matched is the api's count and no one else's.
async fn app_on_manual_clock(db: sqlx::PgPool) -> (TestApp, ManualClock) {
    let clock = ManualClock::starting_at(mango_protocol::time::now() - Span::days(400));
    (TestApp::start_on_clock(db, clock.clone()).await, clock)
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn workspace_reads_show_the_claim_its_worker_and_the_lease_left(db: sqlx::PgPool) {
    let (app, clock) = app_on_manual_clock(db).await;
    let id = app.create_check().await;
    assert_eq!(
        lease_of(&app, &id).await,
        json!({"claim": 0, "worker_id": null, "expires_at": null, "remaining_ms": null}),
        "nobody has claimed it"
    );

    let polled = poll_as_worker(&app, Some(b"worker-a"), "").await;
    polled.expect(200);
    assert!(
        polled.body.get("lease").is_none(),
        "Poll answers no lease: {}",
        polled.body
    );
    assert_eq!(
        lease_of(&app, &id).await,
        json!({"claim": 1, "worker_id": "worker-a", "expires_at": null, "remaining_ms": null}),
        "a claim not yet acknowledged runs no lease"
    );

    // A reclaim records its own poller; one that names none leaves no stale name.
    poll_as_worker(&app, None, "?reclaim_older_than_ms=0&worker_id=worker-b")
        .await
        .expect(200);
    assert_eq!(lease_of(&app, &id).await["worker_id"], "worker-b");
    assert_eq!(lease_of(&app, &id).await["claim"], 2);
    let anonymous = poll_as_worker(&app, None, "?reclaim_older_than_ms=0").await;
    anonymous.expect(200);
    assert_eq!(lease_of(&app, &id).await["worker_id"], Value::Null);
    let claim = claim_of(anonymous.body);

    // Ack starts the pre-heartbeat lease (120 s); the Environment key's answer has no lease.
    let acked = app.ack(&id).await;
    acked.expect(200);
    assert!(acked.body.get("lease").is_none(), "{}", acked.body);
    let lease = lease_of(&app, &id).await;
    assert_eq!(lease["claim"], 3);
    assert_eq!(ts(&lease["expires_at"]), clock.now() + Span::seconds(120));
    assert_eq!(lease["remaining_ms"], 120_000);

    clock.advance(Span::milliseconds(30_250));
    let listed = app
        .call(Method::GET, &app.work_path(""), Some(&app.ws_key), None)
        .await;
    listed.expect(200);
    assert_eq!(
        listed.body["data"][0]["lease"]["remaining_ms"], 89_750,
        "List shows it too"
    );

    // Heartbeats extend it; once it runs out the time left is 0, never negative.
    // (A short TTL, so the lease runs out before the check's 120 s deadline.)
    let beat = app
        .call(
            Method::POST,
            &app.work_path(&format!(
                "/{id}/heartbeat?expected_last_heartbeat={NO_HB}&desired_ttl_seconds=10"
            )),
            Some(&claim.token),
            None,
        )
        .await;
    beat.expect(200);
    assert_eq!(lease_of(&app, &id).await["remaining_ms"], 10_000);
    clock.advance(Span::seconds(11));
    let lost = lease_of(&app, &id).await;
    assert_eq!(lost["remaining_ms"], 0, "{lost}");
    assert!(!lost["expires_at"].is_null());

    // Stopped: the last claim and its worker stay, no lease runs.
    app.stop_work(&id, true).await;
    let stopped = lease_of(&app, &id).await;
    assert_eq!(stopped["claim"], 3);
    assert_eq!(stopped["expires_at"], Value::Null);
    assert_eq!(stopped["remaining_ms"], Value::Null);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn worker_ids_are_kept_whole_up_to_256_printable_characters_and_refused_past(
    db: sqlx::PgPool,
) {
    let app = TestApp::start(db).await;
    let id = app.create_check().await;
    let longest = "w".repeat(256);
    let too_long = "w".repeat(257);
    let wide = "é".repeat(256); // 256 characters, 512 bytes: characters count
    let refused: [(Option<&[u8]>, String, &str); 7] = [
        (
            Some(too_long.as_bytes()),
            String::new(),
            "257 characters long",
        ),
        (
            None,
            format!("?worker_id={too_long}"),
            "257 characters long",
        ),
        (None, format!("?worker_id={}é", wide), "257 characters long"),
        (Some(b"worker\tone"), String::new(), "U+0009"),
        (None, "?worker_id=worker%0Aone".into(), "U+000A"),
        (None, "?worker_id=%1B%5B2J".into(), "U+001B"),
        (Some("wörker".as_bytes()), String::new(), "printable ASCII"),
    ];
    for (header, query, says) in refused {
        let r = poll_as_worker(&app, header, &query).await;
        assert_error(&r, 400, "invalid_request_error", Some("invalid_parameter"));
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message} for {header:?} {query}");
    }
    assert_eq!(
        lease_of(&app, &id).await["claim"],
        0,
        "a refused Poll claims nothing"
    );

    // The header wins over the query, as for workers_polling.
    let polled = poll_as_worker(&app, Some(longest.as_bytes()), "?worker_id=other").await;
    polled.expect(200);
    assert_eq!(lease_of(&app, &id).await["worker_id"], longest.as_str());
    poll_as_worker(
        &app,
        None,
        &format!("?reclaim_older_than_ms=0&worker_id={wide}"),
    )
    .await
    .expect(200);
    assert_eq!(lease_of(&app, &id).await["worker_id"], wide.as_str());
    // An empty id is no id.
    poll_as_worker(&app, Some(b""), "?reclaim_older_than_ms=0")
        .await
        .expect(200);
    assert_eq!(lease_of(&app, &id).await["worker_id"], Value::Null);
}
