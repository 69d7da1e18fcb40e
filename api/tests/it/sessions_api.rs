//! `/v1/sessions` (spec §5, wire contract §7.1): create with a frozen agent
//! snapshot, get, list with bidirectional cursors and filters, archive,
//! delete, metadata and resources, `initial_events` with its first Work, and
//! the credential scopes of §2.

use mango_testkit::*;

use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

const SESSION_FIELDS: [&str; 17] = [
    "agent",
    "archived_at",
    "budget",
    "created_at",
    "deployment_id",
    "environment_id",
    "id",
    "metadata",
    "outcome_evaluations",
    "resources",
    "stats",
    "status",
    "title",
    "type",
    "updated_at",
    "usage",
    "vault_ids",
];

#[track_caller]
fn assert_error(r: &Reply, status: u16, code: &str) {
    r.expect(status);
    assert_eq!(r.code(), Some(code), "{}", r.body);
}

#[track_caller]
fn assert_session(s: &Value) {
    let obj = s
        .as_object()
        .unwrap_or_else(|| panic!("expected a Session, got {s}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, SESSION_FIELDS, "{s}");
    assert!(s["id"].as_str().is_some_and(|id| id.starts_with("sesn_")));
    assert_eq!(s["type"], "session");
    assert!(s["metadata"].is_object() && s["resources"].is_array());
    assert_eq!(s["agent"]["type"], "agent", "{s}");
}

async fn get_session(app: &TestApp, id: &str) -> Reply {
    app.call(
        Method::GET,
        &format!("/v1/sessions/{id}"),
        Some(&app.ws_key),
        None,
    )
    .await
}

async fn list(app: &TestApp, query: &str) -> Reply {
    app.call(
        Method::GET,
        &format!("/v1/sessions{query}"),
        Some(&app.ws_key),
        None,
    )
    .await
}

async fn session_rows(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

// ------------------------------------------------------------------ create / get

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn create_with_an_agent_id_or_id_and_version_freezes_the_snapshot(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("first name").await;

    let by_id = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id, "title": "t"}))
        .await;
    by_id.expect(200);
    assert_session(&by_id.body);
    assert_eq!(by_id.body["status"], "idle");
    assert_eq!(by_id.body["environment_id"], app.env_id.as_str());
    assert_eq!(by_id.body["title"], "t");
    assert_eq!(by_id.body["agent"]["id"], agent.as_str());
    assert_eq!(by_id.body["agent"]["version"], 1);
    assert_eq!(by_id.body["agent"]["name"], "first name");
    assert_eq!(by_id.body["agent"]["model"]["id"], "m");
    assert!(by_id.body["archived_at"].is_null());

    let by_obj = app
        .post_session(
            json!({"agent": {"type": "agent", "id": agent, "version": 1}, "environment_id": app.env_id}),
        )
        .await;
    by_obj.expect(200);
    assert_eq!(by_obj.body["agent"]["version"], 1);

    // A new Agent version does not touch existing Sessions.
    let upd = app
        .call(
            Method::POST,
            &format!("/v1/agents/{agent}"),
            Some(&app.ws_key),
            Some(json!({"version": 1, "name": "second name", "system": "new"})),
        )
        .await;
    upd.expect(200);
    assert_eq!(upd.body["version"], 2);

    for s in [&by_id.body, &by_obj.body] {
        let id = s["id"].as_str().unwrap();
        let now = get_session(&app, id).await;
        now.expect(200);
        assert_session(&now.body);
        assert_eq!(now.body["agent"], s["agent"], "snapshot frozen");
        assert_eq!(now.body["agent"]["name"], "first name");
        let (v,): (i32,) = sqlx::query_as("SELECT agent_version FROM sessions WHERE id = $1")
            .bind(id)
            .fetch_one(&app.db)
            .await
            .unwrap();
        assert_eq!(v, 1, "agent_version recorded");
    }

    // Pinning the old version still gets it; the bare id gets the latest.
    let old = app
        .post_session(json!({"agent": {"id": agent, "version": 1}, "environment_id": app.env_id}))
        .await;
    old.expect(200);
    assert_eq!(old.body["agent"]["name"], "first name");
    assert_eq!(old.body["agent"]["version"], 1);
    let latest = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id}))
        .await;
    latest.expect(200);
    assert_eq!(latest.body["agent"]["name"], "second name");
    assert_eq!(latest.body["agent"]["version"], 2);
    assert_eq!(latest.body["agent"]["system"], "new");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn missing_environment_or_agent_is_404_and_archived_ones_are_400(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;

    let r = app
        .post_session(json!({"agent": agent, "environment_id": "env_nope"}))
        .await;
    assert_error(&r, 404, "environment_not_found");
    let r = app
        .post_session(json!({"agent": "agent_nope", "environment_id": app.env_id}))
        .await;
    assert_error(&r, 404, "agent_not_found");
    let r = app
        .post_session(json!({"agent": {"id": agent, "version": 9}, "environment_id": app.env_id}))
        .await;
    assert_error(&r, 404, "agent_not_found");
    // Missing required fields and bad agent shapes are 400.
    for body in [
        json!({"environment_id": app.env_id}),
        json!({"agent": agent}),
        json!({"agent": 5, "environment_id": app.env_id}),
        json!({"agent": {"version": 1}, "environment_id": app.env_id}),
        json!({"agent": {"id": agent, "version": 0}, "environment_id": app.env_id}),
        json!({"agent": agent, "environment_id": app.env_id, "bogus": 1}),
    ] {
        app.post_session(body).await.expect(400);
    }
    assert_eq!(session_rows(&app).await, 0);

    // Archived Environment.
    let env2 = app.create_environment("to archive").await;
    app.call(
        Method::POST,
        &format!("/v1/environments/{env2}/archive"),
        Some(&app.ws_key),
        None,
    )
    .await
    .expect(200);
    let r = app
        .post_session(json!({"agent": agent, "environment_id": env2}))
        .await;
    assert_error(&r, 400, "environment_archived");
    assert_eq!(session_rows(&app).await, 0, "no session row left");

    // Archived Agent.
    let gone = app.create_agent("gone").await;
    app.call(
        Method::POST,
        &format!("/v1/agents/{gone}/archive"),
        Some(&app.ws_key),
        None,
    )
    .await
    .expect(200);
    let r = app
        .post_session(json!({"agent": gone, "environment_id": app.env_id,
            "initial_events": [user_message("hi")]}))
        .await;
    assert_error(&r, 400, "agent_archived");
    assert_eq!(session_rows(&app).await, 0, "no session row left");
    let work: i64 = sqlx::query_scalar("SELECT count(*) FROM work WHERE kind = 'session'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(work, 0);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn get_returns_the_session_and_unknown_ids_are_404(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.create_session().await;
    let r = get_session(&app, &id).await;
    r.expect(200);
    assert_session(&r.body);
    assert_eq!(r.body["id"], id.as_str());
    assert_eq!(r.body["status"], "idle");
    assert_eq!(r.body["vault_ids"], json!([]));
    assert_eq!(r.body["outcome_evaluations"], json!([]));
    assert!(r.body["created_at"].is_string() && r.body["updated_at"].is_string());
    assert_error(
        &get_session(&app, "sesn_nope").await,
        404,
        "session_not_found",
    );
    // No credential at all.
    app.call(Method::GET, &format!("/v1/sessions/{id}"), None, None)
        .await
        .expect(401);
}

// ------------------------------------------------------------------ list

/// Walks `query` forward with `next_page`, returning every page's ids and the
/// pages' `prev_page` cursors.
async fn walk_forward(app: &TestApp, query: &str) -> (Vec<Vec<String>>, Vec<Option<String>>) {
    let mut pages = Vec::new();
    let mut prevs = Vec::new();
    let mut page: Option<String> = None;
    for _ in 0..50 {
        let q = match &page {
            Some(p) => format!("{query}&page={}", urlencode(p)),
            None => query.to_string(),
        };
        let r = list(app, &q).await;
        r.expect(200);
        pages.push(data_ids(&r.body));
        prevs.push(r.body["prev_page"].as_str().map(str::to_string));
        match r.body["next_page"].as_str() {
            Some(p) if !p.is_empty() => page = Some(p.to_string()),
            _ => return (pages, prevs),
        }
    }
    panic!("pagination did not end");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn list_walks_forward_with_next_page_and_back_with_prev_page(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(app.create_session_for(&agent).await);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    // Default order is newest first.
    let all = list(&app, "?limit=100").await;
    all.expect(200);
    assert_eq!(data_ids(&all.body), newest_first);
    assert!(all.body["next_page"].is_null() && all.body["prev_page"].is_null());
    for s in all.body["data"].as_array().unwrap() {
        assert_session(s);
    }

    let (pages, prevs) = walk_forward(&app, "?limit=2").await;
    assert_eq!(
        pages,
        vec![
            newest_first[0..2].to_vec(),
            newest_first[2..4].to_vec(),
            newest_first[4..5].to_vec()
        ]
    );
    assert!(prevs[0].is_none(), "the first page has no prev_page");
    assert!(prevs[1].is_some() && prevs[2].is_some());

    // Back from the last page: page 2, then page 1 (whose prev_page is null).
    let back = list(
        &app,
        &format!("?limit=2&page={}", urlencode(prevs[2].as_ref().unwrap())),
    )
    .await;
    back.expect(200);
    assert_eq!(data_ids(&back.body), newest_first[2..4].to_vec());
    let next = back.body["next_page"]
        .as_str()
        .expect("next_page going back");
    let prev = back.body["prev_page"]
        .as_str()
        .expect("prev_page going back");
    let first = list(&app, &format!("?limit=2&page={}", urlencode(prev))).await;
    first.expect(200);
    assert_eq!(data_ids(&first.body), newest_first[0..2].to_vec());
    assert!(first.body["prev_page"].is_null(), "{}", first.body);
    // And forward again from the page reached going back.
    let again = list(&app, &format!("?limit=2&page={}", urlencode(next))).await;
    again.expect(200);
    assert_eq!(data_ids(&again.body), newest_first[4..5].to_vec());
    assert!(again.body["next_page"].is_null());

    // order=asc walks oldest first.
    let (asc, _) = walk_forward(&app, "?limit=2&order=asc").await;
    assert_eq!(asc.concat(), created);
    list(&app, "?order=sideways").await.expect(400);
    list(&app, "?limit=0").await.expect(400);
    list(&app, "?page=garbage").await.expect(400);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn list_filters_statuses_agent_and_archived(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let a1 = app.create_agent("one").await;
    let a2 = app.create_agent("two").await;
    let s1 = app.create_session_for(&a1).await;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let s2 = app.create_session_for(&a2).await;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let s3 = app.create_session_for(&a1).await;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let s4 = app.create_session_for(&a2).await;

    // s2 terminated, s3 running (agent-loop status events).
    mango_testkit::append_agent_events(
        &app.db,
        &s2,
        vec![json!({"type": "session.status_terminated"})],
    )
    .await
    .unwrap();
    mango_testkit::append_agent_events(
        &app.db,
        &s3,
        vec![json!({"type": "session.status_running"})],
    )
    .await
    .unwrap();
    app.call(
        Method::POST,
        &format!("/v1/sessions/{s4}/archive"),
        Some(&app.ws_key),
        None,
    )
    .await
    .expect(200);

    let ids = |r: &Reply| {
        r.expect(200);
        data_ids(&r.body)
    };
    assert_eq!(
        ids(&list(&app, "").await),
        vec![s3.clone(), s2.clone(), s1.clone()]
    );
    assert_eq!(
        ids(&list(&app, "?include_archived=true").await),
        vec![s4.clone(), s3.clone(), s2.clone(), s1.clone()]
    );
    assert_eq!(
        ids(&list(&app, "?include_archived=false&order=asc").await),
        vec![s1.clone(), s2.clone(), s3.clone()]
    );
    assert_eq!(
        ids(&list(&app, "?statuses%5B%5D=terminated").await),
        vec![s2.clone()]
    );
    assert_eq!(
        ids(&list(&app, "?statuses[]=idle&statuses[]=running").await),
        vec![s3.clone(), s1.clone()]
    );
    assert_eq!(
        ids(&list(&app, "?statuses[]=idle&include_archived=true").await),
        vec![s4.clone(), s1.clone()]
    );
    assert_eq!(
        ids(&list(&app, &format!("?agent_id={a1}")).await),
        vec![s3.clone(), s1.clone()]
    );
    assert_eq!(
        ids(&list(
            &app,
            &format!("?agent_id={a2}&include_archived=true&order=asc")
        )
        .await),
        vec![s2.clone(), s4.clone()]
    );
    assert_eq!(
        ids(&list(&app, &format!("?agent_id={a2}&statuses[]=running")).await),
        Vec::<String>::new()
    );
    list(&app, "?statuses[]=sleeping").await.expect(400);
    list(&app, "?include_archived=maybe").await.expect(400);
}

// ------------------------------------------------------------------ archive / delete

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn archive_marks_the_session_and_it_takes_no_more_input(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let id = app.create_session().await;
    let r = app
        .call(
            Method::POST,
            &format!("/v1/sessions/{id}/archive"),
            Some(&app.ws_key),
            None,
        )
        .await;
    r.expect(200);
    assert_session(&r.body);
    let at = r.body["archived_at"]
        .as_str()
        .expect("archived_at")
        .to_string();
    // Idempotent: archiving again keeps the first time.
    let again = app
        .call(
            Method::POST,
            &format!("/v1/sessions/{id}/archive"),
            Some(&app.ws_key),
            None,
        )
        .await;
    again.expect(200);
    assert_eq!(again.body["archived_at"], at.as_str());
    let got = get_session(&app, &id).await;
    assert_eq!(got.body["archived_at"], at.as_str());
    let send = app.send(&id, json!([user_message("late")])).await;
    assert_error(&send, 409, "session_archived");
    assert_eq!(app.session_counts(&id).await, (0, 0, 0));
    assert_error(
        &app.call(
            Method::POST,
            "/v1/sessions/sesn_nope/archive",
            Some(&app.ws_key),
            None,
        )
        .await,
        404,
        "session_not_found",
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn delete_removes_the_session_its_events_and_work(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let r = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id,
            "initial_events": [user_message("hello")]}))
        .await;
    r.expect(200);
    let id = r.body["id"].as_str().unwrap().to_string();
    let keep = app.create_session_for(&agent).await;
    app.send(&keep, json!([user_message("stay")]))
        .await
        .expect(200);
    assert_eq!(app.session_counts(&id).await, (1, 1, 1));

    let d = app
        .call(
            Method::DELETE,
            &format!("/v1/sessions/{id}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    d.expect(200);
    assert_eq!(d.body, json!({"id": id, "type": "session_deleted"}));
    assert_error(&get_session(&app, &id).await, 404, "session_not_found");
    assert_error(&app.list_events(&id, "").await, 404, "session_not_found");
    assert_eq!(
        app.session_counts(&id).await,
        (0, 0, 0),
        "events, work, outbox gone"
    );
    let again = app
        .call(
            Method::DELETE,
            &format!("/v1/sessions/{id}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_error(&again, 404, "session_not_found");
    // The other Session is untouched.
    assert_eq!(app.session_counts(&keep).await, (1, 1, 1));
    get_session(&app, &keep).await.expect(200);
}

// ------------------------------------------------------------------ metadata / resources

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn metadata_limits_hold_at_their_edges(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let sixteen: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("k{i}"), Value::String("v".into())))
        .collect();
    let mut seventeen = sixteen.clone();
    seventeen.insert("k16".into(), "v".into());
    let ok = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id, "metadata": sixteen}))
        .await;
    ok.expect(200);
    assert_eq!(ok.body["metadata"], Value::Object(sixteen.clone()));
    let edge = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id,
            "metadata": {"k".repeat(64): "v".repeat(512)}}))
        .await;
    edge.expect(200);
    let before = session_rows(&app).await;
    for bad in [
        Value::Object(seventeen),
        json!({"k".repeat(65): "v"}),
        json!({"k": "v".repeat(513)}),
        json!({"k": 1}),
        json!({"": "v"}),
        json!(["not", "a", "map"]),
    ] {
        let r = app
            .post_session(json!({"agent": agent, "environment_id": app.env_id, "metadata": bad}))
            .await;
        assert_error(&r, 400, "invalid_metadata");
    }
    assert_eq!(session_rows(&app).await, before);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn resources_are_checked_and_tokens_never_echoed(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let (rw, ro) = (app.create_store("rw").await, app.create_store("ro").await);
    let r = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id, "resources": [
            {"type": "memory_store", "memory_store_id": rw, "access": "read_write"},
            {"type": "memory_store", "memory_store_id": ro, "access": "read_only"},
            {"type": "github_repository", "url": "https://github.com/o/r", "mount_path": "/work/r",
             "authorization_token": "ghp_SECRET_VALUE", "checkout": {"type": "branch", "name": "main"}},
        ]}))
        .await;
    r.expect(200);
    let res = r.body["resources"].as_array().unwrap();
    assert_eq!(res.len(), 3);
    assert_eq!(res[0]["memory_store_id"], rw);
    assert_eq!(res[0]["access"], "read_write");
    assert_eq!(res[0]["mount_path"], "/mnt/memory/rw");
    assert_eq!(res[1]["access"], "read_only");
    assert_eq!(res[2]["url"], "https://github.com/o/r");
    assert!(
        !r.body.to_string().contains("ghp_SECRET_VALUE"),
        "token echoed: {}",
        r.body
    );
    let id = r.body["id"].as_str().unwrap();
    let got = get_session(&app, id).await;
    assert!(!got.body.to_string().contains("ghp_SECRET_VALUE"));
    assert_eq!(got.body["resources"], r.body["resources"]);
    let stored: (Value,) = sqlx::query_as("SELECT resources FROM sessions WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(
        !stored.0.to_string().contains("ghp_SECRET_VALUE"),
        "token stored"
    );

    let before = session_rows(&app).await;
    for bad in [
        json!([{"type": "memory_store", "memory_store_id": "m", "access": "write_only"}]),
        json!([{"type": "memory_store", "memory_store_id": "m", "access": 1}]),
        json!([{"type": "memory_store"}]),
        json!([{"type": "memory_store", "memory_store_id": "m", "bogus": true}]),
        json!([{"type": "github_repository"}]),
        json!([{"type": "vault"}]),
        json!(["memstore_x"]),
        json!({"type": "memory_store"}),
    ] {
        let r = app
            .post_session(json!({"agent": agent, "environment_id": app.env_id, "resources": bad}))
            .await;
        r.expect(400);
        assert_eq!(r.error_type(), Some("invalid_request_error"));
    }
    assert_eq!(session_rows(&app).await, before);
}

// ------------------------------------------------------------------ initial_events

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn initial_events_create_the_first_events_and_one_work_item(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let r = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id,
            "initial_events": [user_message("one"), user_message("two")]}))
        .await;
    r.expect(200);
    let id = r.body["id"].as_str().unwrap().to_string();
    assert_eq!(app.session_counts(&id).await, (2, 1, 1));
    let events = app.all_events(&id).await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["type"], "user.message");
    assert_eq!(events[0]["content"][0]["text"], "one");
    assert_eq!(events[1]["content"][0]["text"], "two");
    for e in &events {
        assert!(e["id"].as_str().is_some_and(|i| i.starts_with("sevt_")));
        assert!(e["processed_at"].is_string());
    }
    let work = app.session_work(&id).await;
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].1, "queued");
    let w = app.get_work(&work[0].0).await;
    assert_eq!(w["data"], json!({"type": "session", "id": id}));
    assert_eq!(w["state"], "queued");

    // Refused initial events leave no Session, event or Work behind.
    let before = session_rows(&app).await;
    for bad in [
        json!([{"type": "user.interrupt"}]),
        json!([user_message("ok"), {"type": "user.message", "content": []}]),
        json!([{"type": "agent.message", "content": [{"type": "text", "text": "x"}]}]),
        Value::Array(vec![user_message("x"); 51]),
    ] {
        app.post_session(
            json!({"agent": agent, "environment_id": app.env_id, "initial_events": bad}),
        )
        .await
        .expect(400);
    }
    assert_eq!(session_rows(&app).await, before);
    let all: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM session_events), (SELECT count(*) FROM work WHERE kind = 'session')",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(all, (2, 1));

    // Without initial events there is no Work.
    let quiet = app.create_session_for(&agent).await;
    assert_eq!(app.session_counts(&quiet).await, (0, 0, 0));
}

// ------------------------------------------------------------------ credential scopes

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_environment_key_is_refused_on_every_session_route(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let id = app.create_session_for(&agent).await;
    let key = app.env_key.clone();
    let routes: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::POST,
            "/v1/sessions".into(),
            Some(json!({"agent": agent, "environment_id": app.env_id})),
        ),
        (Method::GET, "/v1/sessions".into(), None),
        (Method::GET, format!("/v1/sessions/{id}"), None),
        (Method::POST, format!("/v1/sessions/{id}/archive"), None),
        (Method::DELETE, format!("/v1/sessions/{id}"), None),
        (Method::GET, format!("/v1/sessions/{id}/events"), None),
        (
            Method::POST,
            format!("/v1/sessions/{id}/events"),
            Some(json!({"events": [user_message("x")]})),
        ),
        (
            Method::GET,
            format!("/v1/sessions/{id}/events/stream"),
            None,
        ),
    ];
    for (method, path, body) in routes {
        let r = app.call(method.clone(), &path, Some(&key), body).await;
        r.expect(403);
        assert_eq!(r.error_type(), Some("permission_error"), "{method} {path}");
    }
    assert_eq!(session_rows(&app).await, 1);
    let s = get_session(&app, &id).await;
    assert!(s.body["archived_at"].is_null());
    assert_eq!(app.session_counts(&id).await, (0, 0, 0));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sessions_token_reads_only_its_own_session_while_its_work_lives(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("a").await;
    let mine = app.create_session_for(&agent).await;
    let other = app.create_session_for(&agent).await;
    app.send(&mine, json!([user_message("go")]))
        .await
        .expect(200);

    let claim = app.poll().await.expect("session Work");
    assert_eq!(claim.work["data"], json!({"type": "session", "id": mine}));
    let tok = claim.token.clone();
    // Before Ack: 401.
    let r = app
        .call(
            Method::GET,
            &format!("/v1/sessions/{mine}"),
            Some(&tok),
            None,
        )
        .await;
    r.expect(401);
    assert_eq!(r.error_type(), Some("authentication_error"));
    app.ack(&claim.id).await.expect(200);

    let r = app
        .call(
            Method::GET,
            &format!("/v1/sessions/{mine}"),
            Some(&tok),
            None,
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["id"], mine.as_str());
    app.call(
        Method::GET,
        &format!("/v1/sessions/{mine}/events"),
        Some(&tok),
        None,
    )
    .await
    .expect(200);
    // Another Session: 403 everywhere.
    for (m, p) in [
        (Method::GET, format!("/v1/sessions/{other}")),
        (Method::GET, format!("/v1/sessions/{other}/events")),
        (Method::GET, format!("/v1/sessions/{other}/events/stream")),
    ] {
        let r = app.call(m, &p, Some(&tok), None).await;
        r.expect(403);
        assert_eq!(r.error_type(), Some("permission_error"), "{p}");
    }
    let r = app.send_as(&other, &tok, json!([user_message("x")])).await;
    r.expect(403);
    // Operator-only routes.
    for (m, p, b) in [
        (Method::GET, "/v1/sessions".to_string(), None),
        (
            Method::POST,
            "/v1/sessions".to_string(),
            Some(json!({"agent": agent, "environment_id": app.env_id})),
        ),
        (Method::POST, format!("/v1/sessions/{mine}/archive"), None),
        (Method::DELETE, format!("/v1/sessions/{mine}"), None),
    ] {
        app.call(m, &p, Some(&tok), b).await.expect(403);
    }
    // The worker may not send user input to its own Session either.
    let r = app.send_as(&mine, &tok, json!([user_message("x")])).await;
    assert_error(&r, 403, "permission_denied");
    assert_eq!(app.count_for("session_events", &mine).await, 1);

    // After its Work stops: 401.
    app.stop_work(&claim.id, true).await;
    let r = app
        .call(
            Method::GET,
            &format!("/v1/sessions/{mine}"),
            Some(&tok),
            None,
        )
        .await;
    r.expect(401);
    assert_eq!(r.error_type(), Some("authentication_error"));
    app.call(
        Method::GET,
        &format!("/v1/sessions/{mine}/events"),
        Some(&tok),
        None,
    )
    .await
    .expect(401);
    app.call(
        Method::GET,
        &format!("/v1/sessions/{mine}/events/stream"),
        Some(&tok),
        None,
    )
    .await
    .expect(401);
}
