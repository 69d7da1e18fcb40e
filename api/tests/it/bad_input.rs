//! Bad input: malformed JSON, wrong shapes and types, unknown fields and enum
//! values, and every limit on both sides of its edge. Each refusal must be a
//! complete error envelope and must leave the stored rows exactly as they were.

use mango_testkit::*;

use base64::Engine;
use reqwest::Method;
use serde_json::{json, Map, Value};

const NO_HB: &str = "NO_HEARTBEAT";

// ------------------------------------------------------------------ helpers

/// The whole stored row, so any half-written change shows.
async fn work_row(app: &TestApp, id: &str) -> Value {
    sqlx::query_scalar("SELECT to_jsonb(w) FROM work w WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

async fn env_row(app: &TestApp, id: &str) -> Value {
    sqlx::query_scalar("SELECT to_jsonb(e) FROM environments e WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

async fn count(app: &TestApp, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&app.db)
        .await
        .unwrap()
}

#[track_caller]
fn assert_400(r: &Reply, code: &str, what: &str) {
    assert_eq!(r.status.as_u16(), 400, "{what}: {}", r.body);
    r.expect(400);
    assert_eq!(r.error_type(), Some("invalid_request_error"), "{what}");
    assert_eq!(r.code(), Some(code), "{what}: {}", r.body);
}

fn keys(n: usize) -> Value {
    Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect())
}

fn one(key: &str, value: &str) -> Value {
    let mut m = Map::new();
    m.insert(key.into(), json!(value));
    Value::Object(m)
}

/// Every body-taking endpoint, as (method, path, credential) for one active item.
struct Endpoints {
    list: Vec<(&'static str, Method, String, String)>,
}

async fn body_endpoints(app: &TestApp, id: &str, token: &str) -> Endpoints {
    let w = |s: &str| app.work_path(&format!("/{id}{s}"));
    Endpoints {
        list: vec![
            (
                "create work",
                Method::POST,
                app.work_path(""),
                app.ws_key.clone(),
            ),
            ("update work", Method::POST, w(""), app.ws_key.clone()),
            ("stop", Method::POST, w("/stop"), app.ws_key.clone()),
            (
                "heartbeat",
                Method::POST,
                w("/heartbeat"),
                token.to_string(),
            ),
            ("result", Method::POST, w("/result"), token.to_string()),
            ("fail", Method::POST, w("/fail"), token.to_string()),
            (
                "create environment",
                Method::POST,
                "/v1/environments".into(),
                app.ws_key.clone(),
            ),
            (
                "update environment",
                Method::POST,
                format!("/v1/environments/{}", app.env_id),
                app.ws_key.clone(),
            ),
        ],
    }
}

/// Sends each raw body to each endpoint; all must be 400 `code` and change nothing.
async fn refuse_raw_everywhere(app: &TestApp, bodies: &[&str], code: &str) {
    let (claim, _) = app.active_check().await;
    let endpoints = body_endpoints(app, &claim.id, &claim.token).await;
    let work_before = work_row(app, &claim.id).await;
    let env_before = env_row(app, &app.env_id).await;
    let counts = (count(app, "work").await, count(app, "environments").await);
    for (name, method, path, cred) in &endpoints.list {
        for body in bodies {
            let r = app.call_raw(method.clone(), path, Some(cred), body).await;
            assert_400(&r, code, &format!("{name} with {body:?}"));
        }
    }
    assert_eq!(work_row(app, &claim.id).await, work_before);
    assert_eq!(env_row(app, &app.env_id).await, env_before);
    assert_eq!(
        (count(app, "work").await, count(app, "environments").await),
        counts
    );
}

// ------------------------------------------------------------------ JSON shape

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn malformed_json_is_400_invalid_json(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    refuse_raw_everywhere(
        &app,
        &[
            "{",
            "{\"data\":",
            "nope",
            "{\"a\":1}}",
            "{'a': 1}",
            "\u{feff}{}",
        ],
        "invalid_json",
    )
    .await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn non_object_bodies_are_400_invalid_json(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    refuse_raw_everywhere(
        &app,
        &["[]", "[{}]", "\"x\"", "1", "null", "true"],
        "invalid_json",
    )
    .await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn empty_body_is_refused_where_a_body_is_required(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, _) = app.active_check().await;
    let before = work_row(&app, &claim.id).await;
    let counts = (count(&app, "work").await, count(&app, "environments").await);
    let id = &claim.id;
    for (method, path, cred) in [
        (Method::POST, app.work_path(""), &app.ws_key),
        (Method::POST, app.work_path(&format!("/{id}")), &app.ws_key),
        (
            Method::POST,
            app.work_path(&format!("/{id}/result")),
            &claim.token,
        ),
        (
            Method::POST,
            app.work_path(&format!("/{id}/fail")),
            &claim.token,
        ),
        (Method::POST, "/v1/environments".to_string(), &app.ws_key),
    ] {
        for body in ["", "  \n"] {
            let r = app.call_raw(method.clone(), &path, Some(cred), body).await;
            assert_400(&r, "invalid_json", &format!("{path} with {body:?}"));
        }
    }
    assert_eq!(work_row(&app, &claim.id).await, before);
    assert_eq!(
        (count(&app, "work").await, count(&app, "environments").await),
        counts
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn oversized_body_is_413(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let big = format!(
        "{{\"data\":{{\"type\":\"healthcheck\"}},\"metadata\":{{\"k\":\"{}\"}}}}",
        "x".repeat(1024 * 1024)
    );
    let r = app
        .call_raw(Method::POST, &app.work_path(""), Some(&app.ws_key), &big)
        .await;
    r.expect(413);
    assert_eq!(count(&app, "work").await, 0);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn unknown_routes_and_methods_answer_in_the_envelope(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = app
        .call(Method::GET, "/v1/nothing-here", Some(&app.ws_key), None)
        .await;
    r.expect(404);
    let r = app
        .call(Method::DELETE, &app.work_path(""), Some(&app.ws_key), None)
        .await;
    r.expect(405);
}

// ------------------------------------------------------------------ types, unknown fields, enums

/// (what, method, path, credential, body) cases for one active item.
type Case = (&'static str, Method, String, String, Value);

/// One line per case, so the table stays a table.
#[rustfmt::skip]
fn typed_cases(app: &TestApp, id: &str, token: &str, last: &str) -> Vec<(Case, &'static str)> {
    let w = |s: &str| app.work_path(&format!("/{id}{s}"));
    let ws = app.ws_key.clone();
    let tok = token.to_string();
    let env = format!("/v1/environments/{}", app.env_id);
    let p = "invalid_parameter";
    let m = "invalid_metadata";
    let hc = json!({"type": "healthcheck"});
    vec![
        // Wrong types.
        (("create: data is a string", Method::POST, app.work_path(""), ws.clone(), json!({"data": "healthcheck"})), p),
        (("create: data is an array", Method::POST, app.work_path(""), ws.clone(), json!({"data": [hc]})), p),
        (("create: data is null", Method::POST, app.work_path(""), ws.clone(), json!({"data": null})), p),
        (("create: metadata is a string", Method::POST, app.work_path(""), ws.clone(), json!({"data": hc, "metadata": "a=1"})), m),
        (("create: metadata value is a number", Method::POST, app.work_path(""), ws.clone(), json!({"data": hc, "metadata": {"k": 1}})), m),
        (("create: metadata value is null", Method::POST, app.work_path(""), ws.clone(), json!({"data": hc, "metadata": {"k": null}})), m),
        (("update: metadata is an array", Method::POST, w(""), ws.clone(), json!({"metadata": ["a"]})), m),
        (("update: metadata value is an object", Method::POST, w(""), ws.clone(), json!({"metadata": {"k": {}}})), m),
        (("stop: force is a string", Method::POST, w("/stop"), ws.clone(), json!({"force": "yes"})), p),
        (("stop: force is a number", Method::POST, w("/stop"), ws.clone(), json!({"force": 1})), p),
        (("heartbeat: expected is a number", Method::POST, w("/heartbeat"), tok.clone(), json!({"expected_last_heartbeat": 5})), p),
        (("heartbeat: ttl is a string", Method::POST, w("/heartbeat"), tok.clone(), json!({"expected_last_heartbeat": last, "desired_ttl_seconds": "30"})), p),
        (("heartbeat: ttl is fractional", Method::POST, w("/heartbeat"), tok.clone(), json!({"expected_last_heartbeat": last, "desired_ttl_seconds": 30.5})), p),
        (("result: status is a number", Method::POST, w("/result"), tok.clone(), json!({"status": 1, "message": "m"})), p),
        (("result: message is a number", Method::POST, w("/result"), tok.clone(), json!({"status": "succeeded", "message": 5})), p),
        (("result: message missing", Method::POST, w("/result"), tok.clone(), json!({"status": "succeeded"})), p),
        (("result: status missing", Method::POST, w("/result"), tok.clone(), json!({"message": "m"})), p),
        (("fail: error missing", Method::POST, w("/fail"), tok.clone(), json!({})), p),
        (("fail: error is a string", Method::POST, w("/fail"), tok.clone(), json!({"error": "boom"})), p),
        (("fail: message is a number", Method::POST, w("/fail"), tok.clone(), json!({"error": {"message": 5}})), p),
        (("fail: message is empty", Method::POST, w("/fail"), tok.clone(), json!({"error": {"message": " "}})), p),
        (("env create: name is a number", Method::POST, "/v1/environments".into(), ws.clone(), json!({"name": 7})), p),
        (("env update: description is a number", Method::POST, env.clone(), ws.clone(), json!({"description": 5})), p),
        (("env update: metadata is a list", Method::POST, env.clone(), ws.clone(), json!({"metadata": []})), m),
        // Unknown fields.
        (("create: unknown field", Method::POST, app.work_path(""), ws.clone(), json!({"data": hc, "priority": 1})), p),
        (("create: unknown data field", Method::POST, app.work_path(""), ws.clone(), json!({"data": {"type": "healthcheck", "command": "id"}})), p),
        (("update: unknown field", Method::POST, w(""), ws.clone(), json!({"metadata": {}, "state": "stopped"})), p),
        (("stop: unknown field", Method::POST, w("/stop"), ws.clone(), json!({"force": true, "reason": "x"})), p),
        (("heartbeat: unknown field", Method::POST, w("/heartbeat"), tok.clone(), json!({"expected_last_heartbeat": last, "lease": 1})), p),
        (("result: unknown field", Method::POST, w("/result"), tok.clone(), json!({"status": "succeeded", "message": "m", "at": 1})), p),
        (("fail: unknown field", Method::POST, w("/fail"), tok.clone(), json!({"error": {"message": "m"}, "retry": false})), p),
        (("fail: unknown error field", Method::POST, w("/fail"), tok.clone(), json!({"error": {"message": "m", "code": 3}})), p),
        (("env create: unknown field", Method::POST, "/v1/environments".into(), ws.clone(), json!({"name": "n", "owner": "me"})), p),
        (("env update: unknown field", Method::POST, env.clone(), ws.clone(), json!({"owner": "me"})), p),
        // Unknown enum values.
        (("create: data.type session", Method::POST, app.work_path(""), ws.clone(), json!({"data": {"type": "session", "id": "sesn_1"}})), p),
        (("create: data.type cron", Method::POST, app.work_path(""), ws.clone(), json!({"data": {"type": "cron"}})), p),
        (("create: data.type empty", Method::POST, app.work_path(""), ws.clone(), json!({"data": {"type": ""}})), p),
        (("create: data.type missing", Method::POST, app.work_path(""), ws.clone(), json!({"data": {}})), p),
        (("result: status timed_out", Method::POST, w("/result"), tok.clone(), json!({"status": "timed_out", "message": "m"})), p),
        (("result: status cancelled", Method::POST, w("/result"), tok.clone(), json!({"status": "cancelled", "message": "m"})), p),
        (("result: status SUCCEEDED", Method::POST, w("/result"), tok.clone(), json!({"status": "SUCCEEDED", "message": "m"})), p),
        (("result: status empty", Method::POST, w("/result"), tok.clone(), json!({"status": "", "message": "m"})), p),
        (("env create: scope", Method::POST, "/v1/environments".into(), ws.clone(), json!({"name": "n", "scope": "team"})), p),
        (("env update: scope", Method::POST, env, ws, json!({"scope": "team"})), p),
    ]
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn wrong_types_unknown_fields_and_unknown_enum_values_are_400(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, last) = app.active_check().await;
    let work_before = work_row(&app, &claim.id).await;
    let env_before = env_row(&app, &app.env_id).await;
    let counts = (count(&app, "work").await, count(&app, "environments").await);
    for ((what, method, path, cred, body), code) in
        typed_cases(&app, &claim.id, &claim.token, &last)
    {
        let r = app.call(method, &path, Some(&cred), Some(body)).await;
        assert_400(&r, code, what);
        assert_eq!(
            work_row(&app, &claim.id).await,
            work_before,
            "{what} changed the item"
        );
    }
    assert_eq!(env_row(&app, &app.env_id).await, env_before);
    assert_eq!(
        (count(&app, "work").await, count(&app, "environments").await),
        counts
    );
    // The item is still the live, active lease it was.
    app.heartbeat(&claim.id, &claim.token, &last)
        .await
        .expect(200);
}

/// A 400 `invalid_parameter` whose message starts with the offending field's path.
#[track_caller]
fn assert_names_path(r: &Reply, path: &str, says: &str, what: &str) {
    assert_400(r, "invalid_parameter", what);
    let message = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("{path}: ")) && message.contains(says),
        "{what}: the message names {path:?} and says {says:?}: {message}"
    );
}

/// A wrong type or an unknown field, at the top of a body or nested in it,
/// is refused in the envelope with the field's path leading the message, and
/// nothing is stored. (A wrong type inside a tagged object, such as a
/// resource, is named by that object's path: `resources[0]`.)
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn wrong_types_and_unknown_fields_name_their_path(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let s = app.create_session_for(&agent).await;
    let env = app.env_id.clone();
    let ws = app.ws_key.clone();
    let events = format!("/v1/sessions/{s}/events");
    let resource = |fields: Value| {
        let mut r = json!({"type": "memory_store", "memory_store_id": "memstore_x"});
        r.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        json!({"agent": agent, "environment_id": env, "resources": [r]})
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, String, Value, &str, &str)> = vec![
        ("agent is a number", "/v1/sessions".into(), json!({"agent": 5, "environment_id": env}), "agent", "must be an agent id"),
        ("agent.id is a number", "/v1/sessions".into(), json!({"agent": {"id": 5}, "environment_id": env}), "agent", "invalid type: integer `5`, expected a string"),
        ("environment_id is a number", "/v1/sessions".into(), json!({"agent": agent, "environment_id": 7}), "environment_id", "expected a string"),
        ("title is a list", "/v1/sessions".into(), json!({"agent": agent, "environment_id": env, "title": ["t"]}), "title", "expected a string"),
        ("resources is a string", "/v1/sessions".into(), json!({"agent": agent, "environment_id": env, "resources": "memstore_x"}), "resources", "expected a sequence"),
        ("memory_store_id is a number", "/v1/sessions".into(), resource(json!({"memory_store_id": 5})), "resources[0]", "invalid type: integer `5`, expected a string"),
        ("unknown session field", "/v1/sessions".into(), json!({"agent": agent, "environment_id": env, "owner": "me"}), "owner", "unknown field"),
        ("unknown resource field", "/v1/sessions".into(), resource(json!({"mode": "rw"})), "resources[0].mode", "unknown field"),
        ("event content is a string", events.clone(), json!({"events": [{"type": "user.message", "content": "hi"}]}), "events[0].content", "expected a sequence"),
        ("unknown content block field", events.clone(), json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "hi", "lang": "en"}]}]}), "events[0].content[0].lang", "unknown field"),
        ("memory store name is a number", "/v1/memory_stores".into(), json!({"name": 5}), "name", "expected a string"),
    ];
    let before = stored(&app).await;
    for (what, path, body, field, says) in &cases {
        let r = app
            .call(Method::POST, path, Some(&ws), Some(body.clone()))
            .await;
        assert_names_path(&r, field, says, what);
        assert_eq!(stored(&app).await, before, "{what} stored something");
    }
}

// ------------------------------------------------------------------ heartbeat parameters

async fn lease_seconds(app: &TestApp, id: &str) -> f64 {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM lease_expires_at - latest_heartbeat_at)::float8 FROM work WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn desired_ttl_seconds_is_1_through_300(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let c = app.poll().await.unwrap();
    app.ack(&c.id).await.expect(200);
    let hb = app.work_path(&format!("/{}/heartbeat", c.id));
    let query = |expected: &str, ttl: &str| {
        format!(
            "{hb}?expected_last_heartbeat={}&desired_ttl_seconds={ttl}",
            urlencode(expected)
        )
    };

    let before = work_row(&app, &c.id).await;
    for ttl in ["0", "301", "-1", "ten", "1.5", ""] {
        let r = app
            .call(Method::POST, &query(NO_HB, ttl), Some(&c.token), None)
            .await;
        assert_400(&r, "invalid_parameter", &format!("query ttl {ttl:?}"));
    }
    for ttl in [json!(0), json!(301)] {
        let body = json!({"expected_last_heartbeat": NO_HB, "desired_ttl_seconds": ttl});
        let r = app
            .call(Method::POST, &hb, Some(&c.token), Some(body))
            .await;
        assert_400(&r, "invalid_parameter", &format!("body ttl {ttl}"));
    }
    assert_eq!(
        work_row(&app, &c.id).await,
        before,
        "no refused beat claimed the lease"
    );

    let r = app
        .call(Method::POST, &query(NO_HB, "1"), Some(&c.token), None)
        .await;
    r.expect(200);
    assert_eq!(r.body["ttl_seconds"], 1);
    assert!((lease_seconds(&app, &c.id).await - 1.0).abs() < 0.01);
    let last = r.body["last_heartbeat"].as_str().unwrap().to_string();

    let r = app
        .call(Method::POST, &query(&last, "300"), Some(&c.token), None)
        .await;
    r.expect(200);
    assert_eq!(r.body["ttl_seconds"], 300);
    assert!((lease_seconds(&app, &c.id).await - 300.0).abs() < 0.01);
    let last = r.body["last_heartbeat"].as_str().unwrap().to_string();

    let before = work_row(&app, &c.id).await;
    let r = app
        .call(Method::POST, &query(&last, "301"), Some(&c.token), None)
        .await;
    assert_400(&r, "invalid_parameter", "ttl 301 on a live lease");
    assert_eq!(work_row(&app, &c.id).await, before);

    let body = json!({"expected_last_heartbeat": last, "desired_ttl_seconds": 1});
    let r = app
        .call(Method::POST, &hb, Some(&c.token), Some(body))
        .await;
    r.expect(200);
    assert_eq!(r.body["ttl_seconds"], 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn bad_expected_last_heartbeat_is_400(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, last) = app.active_check().await;
    let before = work_row(&app, &c.id).await;
    let hb = app.work_path(&format!("/{}/heartbeat", c.id));
    for bad in [
        "yesterday",
        "no_heartbeat",
        "",
        "2026-13-01T00:00:00Z",
        "2026-01-01 00:00:00",
        "1767225600",
    ] {
        let r = app.heartbeat(&c.id, &c.token, bad).await;
        assert_400(&r, "invalid_parameter", &format!("query {bad:?}"));
        let body = json!({ "expected_last_heartbeat": bad });
        let r = app
            .call(Method::POST, &hb, Some(&c.token), Some(body))
            .await;
        assert_400(&r, "invalid_parameter", &format!("body {bad:?}"));
    }
    for missing in [
        None,
        Some(json!({})),
        Some(json!({"expected_last_heartbeat": null})),
    ] {
        let r = app.call(Method::POST, &hb, Some(&c.token), missing).await;
        assert_400(&r, "invalid_parameter", "missing expected_last_heartbeat");
    }
    assert_eq!(work_row(&app, &c.id).await, before);
    // The same instant in another offset is the same heartbeat.
    let t = mango_protocol::time::parse(&last).unwrap();
    let shifted = t
        .with_timezone(&chrono::FixedOffset::east_opt(2 * 3600).unwrap())
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, false);
    assert_ne!(shifted, last);
    app.heartbeat(&c.id, &c.token, &shifted).await.expect(200);
}

// ------------------------------------------------------------------ poll parameters

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn block_ms_is_1_through_999(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.create_check().await;
    let before = work_row(&app, &id).await;
    let poll = |q: &str| app.work_path(&format!("/poll{q}"));
    for q in [
        "?block_ms=0",
        "?block_ms=1000",
        "?block_ms=-5",
        "?block_ms=fast",
    ] {
        let r = app
            .call(Method::GET, &poll(q), Some(&app.env_key), None)
            .await;
        assert_400(&r, "invalid_parameter", q);
    }
    for q in [
        "?reclaim_older_than_ms=-1",
        "?reclaim_older_than_ms=soon",
        "?reclaim_older_than_ms=86400001",
    ] {
        let r = app
            .call(Method::GET, &poll(q), Some(&app.env_key), None)
            .await;
        assert_400(&r, "invalid_parameter", q);
    }
    let too_long = format!("?worker_id={}", "w".repeat(257));
    let r = app
        .call(Method::GET, &poll(&too_long), Some(&app.env_key), None)
        .await;
    assert_400(&r, "invalid_parameter", "worker id of 257 characters");
    let r = app
        .http
        .get(format!("{}{}", app.base, poll("")))
        .bearer_auth(&app.env_key)
        .header("anthropic-worker-id", "w".repeat(257))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(
        work_row(&app, &id).await,
        before,
        "no refused Poll claimed it"
    );

    // The accepted edges: 999 with an item returns it at once; 1 on an empty queue is null.
    let started = std::time::Instant::now();
    let claim = app
        .poll_query(&format!("?block_ms=999&worker_id={}", "w".repeat(256)))
        .await
        .expect("the queued item");
    assert_eq!(claim.id, id);
    assert!(started.elapsed() < std::time::Duration::from_millis(900));
    assert!(app.poll_query("?block_ms=1").await.is_none());
}

// ------------------------------------------------------------------ result / fail message

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn result_message_is_at_most_1024_characters(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, _) = app.active_check().await;
    let result = app.work_path(&format!("/{}/result", c.id));
    let before = work_row(&app, &c.id).await;
    let body = json!({"status": "succeeded", "message": "m".repeat(1025)});
    let r = app
        .call(Method::POST, &result, Some(&c.token), Some(body))
        .await;
    assert_400(&r, "invalid_parameter", "message of 1025 characters");
    assert_eq!(work_row(&app, &c.id).await, before);

    let message = "é".repeat(1024);
    let body = json!({"status": "succeeded", "message": message});
    let r = app
        .call(Method::POST, &result, Some(&c.token), Some(body))
        .await;
    r.expect(200);
    assert_eq!(
        r.body["result"]["message"], message,
        "counted in characters, stored whole"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn fail_message_is_at_most_1024_characters(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (c, _) = app.active_check().await;
    let fail = app.work_path(&format!("/{}/fail", c.id));
    let before = work_row(&app, &c.id).await;
    let body = json!({"error": {"message": "m".repeat(1025)}});
    let r = app
        .call(Method::POST, &fail, Some(&c.token), Some(body))
        .await;
    assert_400(&r, "invalid_parameter", "message of 1025 characters");
    assert_eq!(work_row(&app, &c.id).await, before);

    let body = json!({"error": {"message": "m".repeat(1024)}});
    let r = app
        .call(Method::POST, &fail, Some(&c.token), Some(body))
        .await;
    r.expect(200);
    assert_eq!(r.body["result"]["message"].as_str().unwrap().len(), 1024);
}

// ------------------------------------------------------------------ metadata limits

/// (metadata, accepted?) on both sides of each edge.
fn metadata_edges() -> Vec<(Value, bool)> {
    vec![
        (keys(16), true),
        (keys(17), false),
        (one(&"k".repeat(64), "v"), true),
        (one(&"k".repeat(65), "v"), false),
        (one("k", &"v".repeat(512)), true),
        (one("k", &"v".repeat(513)), false),
        (one("k", &"é".repeat(512)), true),
        (one("", "v"), false),
    ]
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn work_metadata_limits_on_create(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    for (metadata, ok) in metadata_edges() {
        let before = count(&app, "work").await;
        let body = json!({"data": {"type": "healthcheck"}, "metadata": metadata});
        let r = app
            .call(
                Method::POST,
                &app.work_path(""),
                Some(&app.ws_key),
                Some(body),
            )
            .await;
        if ok {
            r.expect(201);
            assert_eq!(r.body["metadata"], metadata);
            assert_eq!(count(&app, "work").await, before + 1);
        } else {
            assert_400(&r, "invalid_metadata", &metadata.to_string());
            assert_eq!(count(&app, "work").await, before, "no row for {metadata}");
        }
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn work_metadata_limits_on_update(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.create_check().await;
    let path = app.work_path(&format!("/{id}"));
    for (metadata, ok) in metadata_edges() {
        // Start each case from an empty map.
        let clear: Map<String, Value> = app.get_work(&id).await["metadata"]
            .as_object()
            .unwrap()
            .keys()
            .map(|k| (k.clone(), Value::Null))
            .collect();
        app.call(
            Method::POST,
            &path,
            Some(&app.ws_key),
            Some(json!({"metadata": clear})),
        )
        .await
        .expect(200);
        let before = work_row(&app, &id).await;
        let r = app
            .call(
                Method::POST,
                &path,
                Some(&app.ws_key),
                Some(json!({"metadata": metadata})),
            )
            .await;
        if ok {
            r.expect(200);
            assert_eq!(r.body["metadata"], metadata);
        } else {
            assert_400(&r, "invalid_metadata", &metadata.to_string());
            assert_eq!(
                work_row(&app, &id).await,
                before,
                "{metadata} changed the item"
            );
        }
    }
    // The 16-key limit applies to the merged result.
    app.call(
        Method::POST,
        &path,
        Some(&app.ws_key),
        Some(json!({"metadata": keys(16)})),
    )
    .await
    .expect(200);
    let before = work_row(&app, &id).await;
    let r = app
        .call(
            Method::POST,
            &path,
            Some(&app.ws_key),
            Some(json!({"metadata": {"extra": "x"}})),
        )
        .await;
    assert_400(&r, "invalid_metadata", "a 17th key");
    assert_eq!(work_row(&app, &id).await, before);
    let r = app
        .call(
            Method::POST,
            &path,
            Some(&app.ws_key),
            Some(json!({"metadata": {"extra": "x", "k0": null}})),
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["metadata"].as_object().unwrap().len(), 16);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn environment_metadata_limits(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let env = format!("/v1/environments/{}", app.env_id);
    for (metadata, ok) in metadata_edges() {
        let envs = count(&app, "environments").await;
        let body = json!({"name": "edge", "metadata": metadata});
        let r = app
            .call(
                Method::POST,
                "/v1/environments",
                Some(&app.ws_key),
                Some(body),
            )
            .await;
        let before = env_row(&app, &app.env_id).await;
        let patch = app
            .call(
                Method::POST,
                &env,
                Some(&app.ws_key),
                Some(json!({"metadata": metadata})),
            )
            .await;
        if ok {
            r.expect(200);
            assert_eq!(r.body["metadata"], metadata);
            patch.expect(200);
            // Clean up for the next case.
            let clear: Map<String, Value> = patch.body["metadata"]
                .as_object()
                .unwrap()
                .keys()
                .map(|k| (k.clone(), Value::Null))
                .collect();
            app.call(
                Method::POST,
                &env,
                Some(&app.ws_key),
                Some(json!({"metadata": clear})),
            )
            .await
            .expect(200);
        } else {
            assert_400(&r, "invalid_metadata", &format!("create {metadata}"));
            assert_eq!(count(&app, "environments").await, envs);
            assert_400(&patch, "invalid_metadata", &format!("update {metadata}"));
            assert_eq!(env_row(&app, &app.env_id).await, before);
        }
    }
}

// ------------------------------------------------------------------ list parameters

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn limit_is_1_through_100(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    for _ in 0..3 {
        app.create_check().await;
        app.create_environment("e").await;
    }
    // 3 Work items; 4 Environments (the harness made one).
    for (base, total) in [(app.work_path(""), 3), ("/v1/environments".to_string(), 4)] {
        let app = &app;
        let get = |limit: &str| {
            let path = format!("{base}?limit={limit}");
            async move { app.call(Method::GET, &path, Some(&app.ws_key), None).await }
        };
        let r = get("1").await;
        r.expect(200);
        assert_eq!(r.body["data"].as_array().unwrap().len(), 1);
        assert!(r.body["next_page"].is_string());
        let r = get("100").await;
        r.expect(200);
        assert_eq!(r.body["data"].as_array().unwrap().len(), total);
        assert!(r.body["next_page"].is_null());
        for limit in ["0", "101", "-1", "ten"] {
            assert_400(
                &get(limit).await,
                "invalid_parameter",
                &format!("{base}?limit={limit}"),
            );
        }
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn bad_page_cursor_is_400_invalid_cursor(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let cursors = [
        "garbage!".to_string(),
        "%FF%FE".to_string(),
        b64("v2:1:work_x"),
        b64("v1:abc:work_x"),
        b64("v1:1"),
        b64("v1:99999999999999999999:x"),
    ];
    for base in [app.work_path(""), "/v1/environments".to_string()] {
        for cursor in &cursors {
            let r = app
                .call(
                    Method::GET,
                    &format!("{base}?page={cursor}"),
                    Some(&app.ws_key),
                    None,
                )
                .await;
            assert_400(&r, "invalid_cursor", &format!("{base}?page={cursor}"));
        }
        // An empty page parameter means the first page.
        let r = app
            .call(
                Method::GET,
                &format!("{base}?page="),
                Some(&app.ws_key),
                None,
            )
            .await;
        r.expect(200);
        assert_eq!(r.body["data"].as_array().unwrap().len(), 1);
    }
}

// ------------------------------------------------------------------ NUL characters

/// Every table a request could write, as one value: a refused request must
/// leave it exactly as it was. (Key rows are left out: authenticating records
/// `last_used_at` in the background.)
async fn stored(app: &TestApp) -> Value {
    let mut out = Map::new();
    for table in [
        "environments",
        "work",
        "agents",
        "agent_versions",
        "sessions",
        "session_events",
        "session_tool_calls",
        "outbox",
        "worker_sightings",
        "memory_stores",
        "memories",
        "memory_versions",
        "skills",
        "skill_versions",
    ] {
        let rows: Value = sqlx::query_scalar(&format!(
            "SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY to_jsonb(t)::text), '[]') FROM {table} t"
        ))
        .fetch_one(&app.db)
        .await
        .unwrap();
        out.insert(table.into(), rows);
    }
    Value::Object(out)
}

/// A 400 `invalid_parameter` whose message says the NUL character was the reason.
#[track_caller]
fn assert_nul_refused(r: &Reply, what: &str) {
    assert_400(r, "invalid_parameter", what);
    let message = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("NUL") && message.contains("U+0000"),
        "{what}: the message names the NUL character: {message}"
    );
}

/// `v` with every NUL (in strings and keys) replaced by `-`: the same request, acceptable.
fn without_nul(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace('\0', "-")),
        Value::Array(items) => Value::Array(items.iter().map(without_nul).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.replace('\0', "-"), without_nul(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A NUL anywhere in a JSON body is refused up front (PostgreSQL text and
/// jsonb cannot hold U+0000) with a message that says so, on every kind of
/// body, and nothing is stored; the same bodies without the NUL are accepted.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_nul_in_any_body_string_is_400_and_stores_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (check, _) = app.active_check().await;
    let (failing, _) = app.active_check().await;
    let agent = app.create_agent("a").await;
    let s = app.create_session_for(&agent).await;
    app.send(&s, json!([user_message("go")])).await.expect(200);
    let worker = app.claim_session_work().await;
    let call = json!({"type": "agent.tool_use", "name": "bash", "input": {"command": "ls"},
                      "evaluated_permission": "allow"});
    let calls: Vec<String> = append_agent_events(&app.db, &s, vec![call.clone(), call])
        .await
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let queued = app.create_check().await;
    let memstore = app.create_store("notes").await;
    let memory = app.create_memory(&memstore, "/kept.md", "kept").await;
    let memory = memory["id"].as_str().unwrap();

    let ws = app.ws_key.clone();
    let events = format!("/v1/sessions/{s}/events");
    let store = format!("/v1/memory_stores/{memstore}");
    let memories = format!("{store}/memories");
    let one_memory = format!("{memories}/{memory}");
    let env = format!("/v1/environments/{}", app.env_id);
    let tool_result = |call: &str, text: &str| {
        json!({"events": [{"type": "user.tool_result", "tool_use_id": call, "is_error": false,
                           "content": [{"type": "text", "text": text}]}]})
    };
    let session = |extra: Value| {
        let mut body = json!({"agent": agent, "environment_id": app.env_id});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let hc = json!({"type": "healthcheck"});
    #[rustfmt::skip]
    let cases: Vec<(&str, String, String, Value)> = vec![
        ("tool result text, sessions token", events.clone(), worker.token.clone(), tool_result(&calls[0], "a\0b")),
        ("tool result text, Workspace key", events.clone(), ws.clone(), tool_result(&calls[1], "\0")),
        ("user message text", events.clone(), ws.clone(), json!({"events": [user_message("hi\0")]})),
        ("healthcheck Result message", app.work_path(&format!("/{}/result", check.id)), check.token.clone(), json!({"status": "succeeded", "message": "ok\0"})),
        ("Fail message", app.work_path(&format!("/{}/fail", failing.id)), failing.token.clone(), json!({"error": {"message": "bad\0input"}})),
        ("Environment name on create", "/v1/environments".into(), ws.clone(), json!({"name": "e\0"})),
        ("Environment name on update", env.clone(), ws.clone(), json!({"name": "\0e"})),
        ("Environment description", env.clone(), ws.clone(), json!({"description": "d\0"})),
        ("Environment metadata key", "/v1/environments".into(), ws.clone(), json!({"name": "e", "metadata": {"k\0": "v"}})),
        ("Environment metadata value", env.clone(), ws.clone(), json!({"metadata": {"k": "v\0"}})),
        ("Agent name on create", "/v1/agents".into(), ws.clone(), json!({"name": "a\0", "model": "m"})),
        ("Agent name on update", format!("/v1/agents/{agent}"), ws.clone(), json!({"name": "a\0"})),
        ("Agent metadata key", "/v1/agents".into(), ws.clone(), json!({"name": "a", "model": "m", "metadata": {"\0": "v"}})),
        ("Work metadata key on create", app.work_path(""), ws.clone(), json!({"data": hc, "metadata": {"k\0": "v"}})),
        ("Work metadata value on update", app.work_path(&format!("/{queued}")), ws.clone(), json!({"metadata": {"k": "\0"}})),
        ("Session title", "/v1/sessions".into(), ws.clone(), session(json!({"title": "t\0"}))),
        ("Session metadata key", "/v1/sessions".into(), ws.clone(), session(json!({"metadata": {"\0k": "v"}}))),
        ("Session metadata value", "/v1/sessions".into(), ws.clone(), session(json!({"metadata": {"k": "v\0"}}))),
        ("Memory Store name on create", "/v1/memory_stores".into(), ws.clone(), json!({"name": "s\0"})),
        ("Memory Store description on create", "/v1/memory_stores".into(), ws.clone(), json!({"name": "s", "description": "d\0"})),
        ("Memory Store name on update", store.clone(), ws.clone(), json!({"name": "\0s"})),
        ("Memory Store description on update", store.clone(), ws.clone(), json!({"description": "\0"})),
        ("memory path on create", memories.clone(), ws.clone(), json!({"path": "/a\0.md", "content": "c"})),
        ("memory content on create", memories.clone(), ws.clone(), json!({"path": "/b.md", "content": "c\0"})),
        ("memory path on update", one_memory.clone(), ws.clone(), json!({"path": "/c\0.md"})),
        ("memory content on update", one_memory.clone(), ws.clone(), json!({"content": "\0"})),
    ];
    let before = stored(&app).await;
    for (what, path, cred, body) in &cases {
        let r = app
            .call(Method::POST, path, Some(cred), Some(body.clone()))
            .await;
        assert_nul_refused(&r, what);
        assert_eq!(stored(&app).await, before, "{what} stored something");
    }
    // The NUL was the only thing wrong with each.
    for (what, path, cred, body) in &cases {
        let r = app
            .call(Method::POST, path, Some(cred), Some(without_nul(body)))
            .await;
        assert!(r.status.is_success(), "{what} without the NUL: {}", r.body);
    }
}

/// A NUL in a query parameter's value or name is refused before it reaches
/// a filter, a cursor, a worker id or a heartbeat.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_nul_in_a_query_parameter_is_400(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let s = app.create_session_for(&agent).await;
    app.create_check().await;
    let claim = app.poll().await.expect("the check");
    app.ack(&claim.id).await.expect(200);
    let queued = app.create_check().await;
    let hb = app.work_path(&format!("/{}/heartbeat", claim.id));
    let ws = app.ws_key.clone();
    #[rustfmt::skip]
    let cases: Vec<(Method, String, String)> = vec![
        (Method::GET, format!("/v1/sessions?agent_id={agent}%00"), ws.clone()),
        (Method::GET, format!("/v1/sessions/{s}/events?types[]=agent.message%00"), ws.clone()),
        (Method::GET, format!("/v1/sessions/{s}/events?types%5B%5D=%00agent.message"), ws.clone()),
        (Method::GET, "/v1/environments?page=%00".into(), ws.clone()),
        (Method::GET, format!("{}?limit=5&page=%00", app.work_path("")), ws.clone()),
        (Method::GET, "/v1/agents?created_at[gte]=%00".into(), ws.clone()),
        (Method::GET, "/v1/environments?x%00=1".into(), ws.clone()),
        (Method::GET, app.work_path("/poll?worker_id=w%00"), app.env_key.clone()),
        (Method::POST, format!("{hb}?expected_last_heartbeat=NO_HEARTBEAT%00"), claim.token.clone()),
    ];
    let before = stored(&app).await;
    for (method, path, cred) in &cases {
        let r = app.call(method.clone(), path, Some(cred), None).await;
        assert_nul_refused(&r, path);
    }
    assert_eq!(
        stored(&app).await,
        before,
        "no refused Poll claimed {queued}"
    );
    // Without the NUL each is an ordinary request.
    for (method, path, cred) in &cases {
        let path = path.replace("%00", "");
        let r = app.call(method.clone(), &path, Some(cred), None).await;
        r.expect(200);
    }
}

/// axum percent-decodes `%00` into a path id; no id can hold it, and every
/// route answers 400 saying so (not the database's refusal, never 500),
/// whatever the credential, and stores nothing.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_nul_in_a_path_id_is_400_on_every_route(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, _) = app.active_check().await;
    let agent = app.create_agent("a").await;
    let s = app.create_session_for(&agent).await;
    let e = app.env_id.clone();
    let w = claim.id.clone();
    let (ws, ek, tok) = (&app.ws_key, &app.env_key, &claim.token);
    let get = Method::GET;
    let post = Method::POST;
    let delete = Method::DELETE;
    let msg = json!({"events": [user_message("x")]});
    #[rustfmt::skip]
    let cases: Vec<(Method, String, &String, Option<Value>)> = vec![
        (get.clone(), "/v1/environments/x%00".into(), ws, None),
        (post.clone(), format!("/v1/environments/{e}%00"), ws, Some(json!({"name": "n"}))),
        (delete.clone(), "/v1/environments/%00".into(), ws, None),
        (post.clone(), "/v1/environments/x%00/archive".into(), ws, None),
        (get.clone(), "/v1/environments/x%00/work".into(), ws, None),
        (post.clone(), "/v1/environments/x%00/work".into(), ws, Some(json!({"data": {"type": "healthcheck"}}))),
        (get.clone(), "/v1/environments/x%00/work/poll".into(), ek, None),
        (get.clone(), "/v1/environments/x%00/work/stats".into(), ws, None),
        (get.clone(), "/v1/environments/x%00/work/stats".into(), ek, None),
        (get.clone(), format!("/v1/environments/{e}/work/a%00b"), ws, None),
        (post.clone(), format!("/v1/environments/{e}/work/a%00b"), ws, Some(json!({"metadata": {}}))),
        (post.clone(), format!("/v1/environments/{e}/work/a%00b/ack"), ek, None),
        (post.clone(), format!("/v1/environments/x%00/work/{w}/ack"), ek, None),
        (post.clone(), format!("/v1/environments/{e}/work/{w}%00/heartbeat?expected_last_heartbeat=NO_HEARTBEAT"), tok, None),
        (post.clone(), format!("/v1/environments/{e}/work/a%00b/stop"), ws, None),
        (post.clone(), format!("/v1/environments/{e}/work/{w}%00/stop"), tok, None),
        (post.clone(), format!("/v1/environments/{e}/work/{w}%00/result"), tok, Some(json!({"status": "succeeded", "message": "m"}))),
        (post.clone(), format!("/v1/environments/{e}/work/{w}%00/fail"), tok, Some(json!({"error": {"message": "m"}}))),
        (get.clone(), format!("/v1/agents/{agent}%00"), ws, None),
        (post.clone(), "/v1/agents/a%00b".into(), ws, Some(json!({"name": "n"}))),
        (post.clone(), "/v1/agents/a%00b/archive".into(), ws, None),
        (get.clone(), "/v1/agents/a%00b/versions".into(), ws, None),
        (get.clone(), "/v1/sessions/a%00b".into(), ws, None),
        (get.clone(), format!("/v1/sessions/{s}%00"), tok, None),
        (delete.clone(), "/v1/sessions/a%00b".into(), ws, None),
        (post.clone(), "/v1/sessions/a%00b/archive".into(), ws, None),
        (get.clone(), "/v1/sessions/a%00b/events".into(), ws, None),
        (post.clone(), format!("/v1/sessions/{s}%00/events"), ws, Some(msg)),
        (get.clone(), "/v1/sessions/a%00b/events/stream".into(), ws, None),
    ];
    let before = stored(&app).await;
    for (method, path, cred, body) in cases {
        let r = app.call(method.clone(), &path, Some(cred), body).await;
        assert_nul_refused(&r, &format!("{method} {path}"));
    }
    assert_eq!(stored(&app).await, before);
}

// ------------------------------------------------------------------ the database's refusals

fn sqlstate(err: &sqlx::Error) -> String {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()).unwrap_or_default(),
        other => panic!("not a database error: {other}"),
    }
}

/// `err` as the API answers it: status and the envelope's body.
async fn answered(err: sqlx::Error) -> (u16, Value) {
    use axum::response::IntoResponse;
    let response = mango_api::error::ApiError::from(err).into_response();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// A data exception (SQLSTATE class 22) is the request's fault and changed
/// nothing: 400 `invalid_parameter`; a foreign-key violation (23503) means
/// something it refers to went away: 409. Both with a message in the
/// envelope, neither the 500 an unknown database error is.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn database_data_exceptions_are_400_and_foreign_key_violations_409(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let out_of_range = sqlx::query_scalar::<_, i32>("SELECT $1::int8::int4")
        .bind(i64::from(i32::MAX) + 1)
        .fetch_one(&app.db)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&out_of_range), "22003");
    let (status, body) = answered(out_of_range).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["details"]["error_code"], "invalid_parameter");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("out of range") && message.contains("nothing changed"),
        "{message}"
    );
    assert!(!message.contains("int4"), "no SQL detail leaks: {message}");

    let timestamp = sqlx::query_scalar::<_, String>("SELECT ('294277-01-01'::timestamptz)::text")
        .fetch_one(&app.db)
        .await
        .unwrap_err();
    assert!(sqlstate(&timestamp).starts_with("22"), "{timestamp}");
    assert_eq!(answered(timestamp).await.0, 400);

    let dangling = sqlx::query("UPDATE api_keys SET environment_id = 'env_gone' WHERE id = $1")
        .bind(&app.env_key_id)
        .execute(&app.db)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&dangling), "23503");
    let (status, body) = answered(dangling).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["type"], "conflict_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("deleted") && message.contains("nothing changed"),
        "{message}"
    );
    assert!(
        !message.contains("api_keys"),
        "no SQL detail leaks: {message}"
    );
}

/// The same through a request: an out-of-range value computed in the
/// statement that writes an Environment (a trigger stands in for it) answers
/// 400 and stores nothing; the request works again once it is gone.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_data_exception_in_a_write_is_400_and_stores_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    sqlx::query(
        "CREATE FUNCTION overflow() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN PERFORM 2147483647::int4 + 1; RETURN NEW; END $$",
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER overflow BEFORE INSERT ON environments FOR EACH ROW EXECUTE FUNCTION overflow()",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let before = stored(&app).await;
    let body = json!({"name": "e"});
    let r = app
        .call(
            Method::POST,
            "/v1/environments",
            Some(&app.ws_key),
            Some(body.clone()),
        )
        .await;
    assert_400(&r, "invalid_parameter", "an integer out of range");
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("nothing changed"));
    assert_eq!(stored(&app).await, before);

    sqlx::query("DROP TRIGGER overflow ON environments")
        .execute(&app.db)
        .await
        .unwrap();
    app.call(
        Method::POST,
        "/v1/environments",
        Some(&app.ws_key),
        Some(body),
    )
    .await
    .expect(200);
}

/// A Session created while its Environment is being deleted: the lookup
/// found the Environment, the insert's foreign key finds it gone. 409 with a
/// message saying so, and no Session.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_session_whose_environment_is_deleted_meanwhile_is_409(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let doomed = app.create_environment("doomed").await;
    let mut deleting = app.db.begin().await.unwrap();
    assert!(
        mango_api::store::environments::delete(&mut *deleting, "wrkspc_default", &doomed)
            .await
            .unwrap()
    );
    let (http, url, key) = (
        app.http.clone(),
        format!("{}/v1/sessions", app.base),
        app.ws_key.clone(),
    );
    let racing = tokio::spawn(async move {
        let r = http
            .post(url)
            .bearer_auth(key)
            .json(&json!({"agent": agent, "environment_id": doomed}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    let (status, body) = app
        .commit_past(deleting, racing, "the Session create")
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "conflict_error");
    assert!(body["request_id"]
        .as_str()
        .is_some_and(|r| r.starts_with("req_")));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deleted"),
        "{body}"
    );
    assert_eq!(count(&app, "sessions").await, 0);
}

// ------------------------------------------------------------------ cursors at the edge of time

fn cursor_of(micros: i64, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("v1:{micros}:{id}"))
}

/// Cursors hold microseconds since the epoch. PostgreSQL's `timestamptz`
/// begins at 4714-11-24 00:00:00 BC: a cursor one microsecond before it is
/// not one this API issued, and is 400 `invalid_cursor` (not the database's
/// refusal, and never 500) on every list that takes `page`, as is one
/// beyond chrono's range either way. A cursor exactly at the edge is a
/// valid, empty page; one at chrono's latest instant (which PostgreSQL holds)
/// is valid too.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn out_of_range_cursors_are_400_invalid_cursor_on_every_list(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let s = app.create_session_for(&agent).await;
    app.send(&s, json!([user_message("go")])).await.expect(200);
    app.create_check().await;
    // Asked of PostgreSQL itself, not of the code under test.
    let earliest: i64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM '4714-11-24 00:00:00+00 BC'::timestamptz) * 1000000)::int8",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(earliest, -210_866_803_200_000_000);
    let chrono_latest = chrono::DateTime::<chrono::Utc>::MAX_UTC.timestamp_micros();
    // (list, its path, a cursor id that list accepts)
    let lists = [
        (
            "Environments",
            "/v1/environments".to_string(),
            "env_x".to_string(),
        ),
        ("Work", app.work_path(""), "work_x".into()),
        ("Agents", "/v1/agents".into(), "agent_x".into()),
        (
            "Agent versions",
            format!("/v1/agents/{agent}/versions"),
            "1".into(),
        ),
        ("Sessions", "/v1/sessions".into(), ">sesn_x".into()),
        (
            "Session events",
            format!("/v1/sessions/{s}/events"),
            i64::MAX.to_string(),
        ),
    ];
    let before = stored(&app).await;
    for (list, path, id) in &lists {
        let app = &app;
        let get = |cursor: String| {
            let path = format!("{path}?page={cursor}");
            async move { app.call(Method::GET, &path, Some(&app.ws_key), None).await }
        };
        for micros in [earliest - 1, i64::MIN, chrono_latest + 1, i64::MAX] {
            let r = get(cursor_of(micros, id)).await;
            assert_400(&r, "invalid_cursor", &format!("{list} at {micros}"));
        }
        let r = get(cursor_of(earliest, id)).await;
        r.expect(200);
        assert_eq!(
            r.body["data"].as_array().map(Vec::len),
            Some(0),
            "{list}: nothing is older than the earliest instant: {}",
            r.body
        );
        get(cursor_of(chrono_latest, id)).await.expect(200);
        // An id no list issued holds no NUL either.
        let r = get(cursor_of(earliest, &format!("{id}\0"))).await;
        assert_400(
            &r,
            "invalid_cursor",
            &format!("{list} with a NUL in the id"),
        );
    }
    assert_eq!(stored(&app).await, before);
}

/// The caller is known before its body is read: a bad credential is 401
/// whatever the body holds (bad JSON, a NUL, an unknown event type).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sending_events_with_a_bad_credential_is_401_whatever_the_body(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let session = app.create_session().await;
    let path = format!("/v1/sessions/{session}/events");
    for body in [
        "{not json",
        r#"{"events":[{"type":"user.message","content":[{"type":"text","text":"a\u0000b"}]}]}"#,
        r#"{"events":[{"type":"user.nonsense"}]}"#,
    ] {
        for credential in ["mango_wsk_unknown", "mango_st_unknown"] {
            let r = app
                .call_raw(Method::POST, &path, Some(credential), body)
                .await;
            assert_eq!(r.status, 401, "{credential} with {body}: {}", r.body);
        }
    }
    // With a good key the same bodies are the caller's errors.
    let r = app
        .call_raw(Method::POST, &path, Some(&app.ws_key), "{not json")
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
}
