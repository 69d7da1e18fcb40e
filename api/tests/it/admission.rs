//! Session Work admission (spec §5): runnable input makes exactly one live
//! Work (coalescing) and an outbox row in one transaction; input after the
//! Work stopped makes a new activation; concurrency; atomicity under an
//! injected failure; the permission barrier; and Fail terminating the Session.

use mango_testkit::*;

use mango_testkit::append_agent_events;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::time::timeout;

#[track_caller]
fn assert_error(r: &Reply, status: u16, code: &str) {
    r.expect(status);
    assert_eq!(r.code(), Some(code), "{}", r.body);
}

async fn live_work(app: &TestApp, session: &str) -> Vec<(String, String)> {
    app.session_work(session)
        .await
        .into_iter()
        .filter(|(_, state)| state != "stopped")
        .collect()
}

async fn last_seq(app: &TestApp, session: &str) -> i64 {
    sqlx::query_scalar("SELECT last_seq FROM sessions WHERE id = $1")
        .bind(session)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

// ------------------------------------------------------------------ coalescing

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn runnable_input_creates_one_work_and_one_outbox_row(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;

    // Non-runnable input needs no worker.
    app.send(&s, json!([{"type": "user.interrupt"}]))
        .await
        .expect(200);
    assert!(app.session_work(&s).await.is_empty());
    let outbox_before = app.count_for("outbox", &s).await;

    app.send(&s, json!([user_message("hi")])).await.expect(200);
    let work = app.session_work(&s).await;
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].1, "queued");
    assert_eq!(app.count_for("outbox", &s).await, outbox_before + 1);
    // The outbox row and the Work were written with the events: same instant,
    // and the outbox points at the Session's last event.
    let (outbox_seq, outbox_at, work_at): (i64, chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as(
            "SELECT o.last_seq, o.created_at, w.created_at FROM outbox o JOIN work w ON w.session_id = o.session_id
             WHERE o.session_id = $1 ORDER BY o.last_seq DESC LIMIT 1",
        )
        .bind(&s)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(outbox_seq, last_seq(&app, &s).await);
    assert_eq!(outbox_seq, 2);
    assert_eq!(outbox_at, work_at, "one transaction, one clock reading");
    let w = app.get_work(&work[0].0).await;
    assert_eq!(w["data"], json!({"type": "session", "id": s}));
    assert_eq!(w["environment_id"], app.env_id.as_str());

    // Agent-loop events never create Work.
    let other = app.create_session().await;
    append_agent_events(
        &app.db,
        &other,
        vec![json!({"type": "agent.message", "content": [{"type": "text", "text": "x"}]})],
    )
    .await
    .unwrap();
    assert!(app.session_work(&other).await.is_empty());
}

/// Sends input while the Session's only Work `first` is in `state`: no new
/// Work, one more outbox row. Returns the new outbox count.
async fn coalesces(app: &TestApp, s: &str, first: &str, state: &str, outbox: i64) -> i64 {
    app.send(s, json!([user_message(state)])).await.expect(200);
    let work = app.session_work(s).await;
    assert_eq!(
        work,
        vec![(first.to_string(), state.to_string())],
        "coalesced while {state}"
    );
    assert_eq!(
        app.count_for("outbox", s).await,
        outbox + 1,
        "a new outbox row while {state}"
    );
    outbox + 1
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn input_coalesces_while_work_lives_and_reactivates_after_it_stops(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    app.send(&s, json!([user_message("1")])).await.expect(200);
    let first = app.session_work(&s).await[0].0.clone();
    let mut outbox = app.count_for("outbox", &s).await;

    outbox = coalesces(&app, &s, &first, "queued", outbox).await;
    let claim = app.poll().await.expect("claim");
    assert_eq!(claim.id, first);
    outbox = coalesces(&app, &s, &first, "queued", outbox).await; // claimed, not yet acknowledged
    app.ack(&claim.id).await.expect(200);
    outbox = coalesces(&app, &s, &first, "starting", outbox).await;
    app.heartbeat(&claim.id, &claim.token, "NO_HEARTBEAT")
        .await
        .expect(200);
    outbox = coalesces(&app, &s, &first, "active", outbox).await;
    app.stop_work(&first, false).await;
    coalesces(&app, &s, &first, "stopping", outbox).await;
    app.stop_work(&first, true).await;
    assert_eq!(app.session_work(&s).await[0].1, "stopped");

    // New input after the Work stopped: a new activation.
    app.send(&s, json!([user_message("again")]))
        .await
        .expect(200);
    let work = app.session_work(&s).await;
    assert_eq!(work.len(), 2);
    let live = live_work(&app, &s).await;
    assert_eq!(live.len(), 1);
    assert_ne!(live[0].0, first, "a new work id");
    assert_eq!(live[0].1, "queued");
    let next = app.poll().await.expect("the new activation is claimable");
    assert_eq!(next.id, live[0].0);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn concurrent_input_still_makes_exactly_one_live_work(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    for round in 0..3 {
        let s = app.create_session().await;
        let sends = (0..20).map(|i| {
            let app = &app;
            let s = s.clone();
            async move {
                app.send(&s, json!([user_message(&format!("{round}-{i}"))]))
                    .await
            }
        });
        let replies = timeout(Duration::from_secs(30), futures::future::join_all(sends))
            .await
            .expect("20 sends finish");
        for r in &replies {
            r.expect(200);
        }
        assert_eq!(app.session_work(&s).await.len(), 1, "round {round}");
        assert_eq!(live_work(&app, &s).await.len(), 1);
        assert_eq!(app.count_for("session_events", &s).await, 20);
        assert_eq!(app.count_for("outbox", &s).await, 20);
        assert_eq!(last_seq(&app, &s).await, 20);
        // Sequence numbers are dense: 1..=20.
        let seqs: Vec<i64> =
            sqlx::query_scalar("SELECT seq FROM session_events WHERE session_id = $1 ORDER BY seq")
                .bind(&s)
                .fetch_all(&app.db)
                .await
                .unwrap();
        assert_eq!(seqs, (1..=20).collect::<Vec<i64>>());
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_failed_outbox_write_rolls_back_the_events_and_the_work(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    app.send(&s, json!([user_message("first")]))
        .await
        .expect(200);
    let first = app.session_work(&s).await[0].0.clone();
    app.stop_work(&first, true).await;
    let before = app.session_counts(&s).await;
    let seq_before = last_seq(&app, &s).await;
    // One event, one Work; two outbox rows: the admission's, and the stop's
    // (a stopped Session Work asks the agent loop to look at the Session again).
    assert_eq!(before, (1, 1, 2));

    sqlx::query(
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'boom: outbox write refused by test'; END $$",
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query("CREATE TRIGGER boom BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION boom()")
        .execute(&app.db)
        .await
        .unwrap();

    let r = app.send(&s, json!([user_message("doomed")])).await;
    r.expect(500);
    assert_eq!(r.error_type(), Some("api_error"));
    assert!(
        !r.body.to_string().contains("boom"),
        "internal errors are not leaked: {}",
        r.body
    );
    assert_eq!(
        app.session_counts(&s).await,
        before,
        "no event, Work or outbox row"
    );
    assert_eq!(last_seq(&app, &s).await, seq_before);
    assert!(live_work(&app, &s).await.is_empty());
    let texts: Vec<Value> = app
        .all_events(&s)
        .await
        .iter()
        .map(|e| e["content"][0]["text"].clone())
        .collect();
    assert_eq!(texts, vec![json!("first")]);
    // Session creation with initial events is one transaction too.
    let agent = app.create_agent("a").await;
    let r = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id,
            "initial_events": [user_message("x")]}))
        .await;
    r.expect(500);
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(sessions, 1, "no half-created Session");

    sqlx::query("DROP TRIGGER boom ON outbox")
        .execute(&app.db)
        .await
        .unwrap();
    app.send(&s, json!([user_message("works")]))
        .await
        .expect(200);
    assert_eq!(app.session_counts(&s).await, (2, 2, 3));
    assert_eq!(last_seq(&app, &s).await, seq_before + 1);
    assert_eq!(live_work(&app, &s).await.len(), 1);
}

// ------------------------------------------------------------------ permission barrier

fn tool_use(permission: Option<&str>, thread: Option<&str>) -> Value {
    let mut e = json!({"type": "agent.tool_use", "name": "bash", "input": {"command": "ls"}});
    if let Some(p) = permission {
        e["evaluated_permission"] = json!(p);
    }
    if let Some(t) = thread {
        e["session_thread_id"] = json!(t);
    }
    e
}

fn tool_result(id: &str) -> Value {
    json!({"type": "user.tool_result", "tool_use_id": id, "is_error": false,
           "content": [{"type": "text", "text": "out"}]})
}

fn confirm(id: &str, result: &str) -> Value {
    json!({"type": "user.tool_confirmation", "tool_use_id": id, "result": result})
}

async fn append_one(app: &TestApp, s: &str, event: Value) -> String {
    let stored = append_agent_events(&app.db, s, vec![event]).await.unwrap();
    assert_eq!(stored.len(), 1);
    stored[0]["id"].as_str().unwrap().to_string()
}

/// A Session with acknowledged Work: (session, worker token).
async fn worked_session(app: &TestApp) -> (String, String) {
    let s = app.create_session().await;
    app.send(&s, json!([user_message("start")]))
        .await
        .expect(200);
    let claim = app.claim_session_work().await;
    (s, claim.token)
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn ask_waits_for_a_persisted_allow_then_takes_one_result(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, tok) = worked_session(&app).await;
    let call = append_one(&app, &s, tool_use(Some("ask"), None)).await;
    let events = app.count_for("session_events", &s).await;

    let r = app.send_as(&s, &tok, json!([tool_result(&call)])).await;
    assert_error(&r, 409, "awaiting_confirmation");
    assert_eq!(r.error_type(), Some("conflict_error"));
    // The worker may not confirm.
    let r = app
        .send_as(&s, &tok, json!([confirm(&call, "allow")]))
        .await;
    r.expect(403);
    assert_eq!(r.error_type(), Some("permission_error"));
    assert_eq!(app.count_for("session_events", &s).await, events);

    // The operator allows; a retried allow returns the same event.
    let r = app.send(&s, json!([confirm(&call, "allow")])).await;
    r.expect(200);
    let confirmation = r.body["data"][0].clone();
    assert_eq!(confirmation["type"], "user.tool_confirmation");
    assert_eq!(confirmation["tool_use_id"], call.as_str());
    let again = app.send(&s, json!([confirm(&call, "allow")])).await;
    again.expect(200);
    assert_eq!(again.body["data"][0], confirmation);
    let r = app.send(&s, json!([confirm(&call, "deny")])).await;
    assert_error(&r, 409, "already_confirmed");
    assert_eq!(app.count_for("session_events", &s).await, events + 1);

    // Now the worker's result is accepted, once.
    let r = app.send_as(&s, &tok, json!([tool_result(&call)])).await;
    r.expect(200);
    let result = r.body["data"][0].clone();
    assert_eq!(result["type"], "user.tool_result");
    assert_eq!(result["tool_use_id"], call.as_str());
    assert!(result.get("session_thread_id").is_none_or(Value::is_null));
    let n = app.count_for("session_events", &s).await;
    assert_eq!(n, events + 2);
    let outbox = app.count_for("outbox", &s).await;
    let dup = app.send_as(&s, &tok, json!([tool_result(&call)])).await;
    assert!(dup.status.is_success(), "{}", dup.body);
    assert_eq!(dup.body["data"][0], result, "the original result event");
    assert_eq!(
        app.count_for("session_events", &s).await,
        n,
        "nothing new stored"
    );
    assert_eq!(app.count_for("outbox", &s).await, outbox);
    // A confirmation after the result changes nothing either.
    let r = app.send(&s, json!([confirm(&call, "allow")])).await;
    r.expect(200);
    assert_eq!(app.count_for("session_events", &s).await, n);
    assert_eq!(live_work(&app, &s).await.len(), 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn denied_calls_never_take_a_result(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, tok) = worked_session(&app).await;

    // Denied by confirmation.
    let asked = append_one(&app, &s, tool_use(Some("ask"), None)).await;
    let r = app
        .send(
            &s,
            json!([{"type": "user.tool_confirmation", "tool_use_id": asked, "result": "deny", "deny_message": "no"}]),
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["data"][0]["deny_message"], "no");
    let n = app.count_for("session_events", &s).await;
    let r = app.send_as(&s, &tok, json!([tool_result(&asked)])).await;
    assert_error(&r, 409, "tool_use_denied");
    let r = app.send(&s, json!([confirm(&asked, "allow")])).await;
    assert_error(&r, 409, "already_confirmed");

    // Denied by policy.
    let denied = append_one(&app, &s, tool_use(Some("deny"), None)).await;
    let n2 = app.count_for("session_events", &s).await;
    assert_eq!(n2, n + 1);
    let r = app.send_as(&s, &tok, json!([tool_result(&denied)])).await;
    assert_error(&r, 409, "tool_use_denied");
    let r = app.send(&s, json!([confirm(&denied, "allow")])).await;
    assert_error(&r, 409, "confirmation_not_requested");
    assert_eq!(app.count_for("session_events", &s).await, n2);

    // Allowed (explicitly or by absence): the result is accepted at once.
    for permission in [Some("allow"), None] {
        let ok = append_one(&app, &s, tool_use(permission, None)).await;
        app.send_as(&s, &tok, json!([tool_result(&ok)]))
            .await
            .expect(200);
        let r = app.send(&s, json!([confirm(&ok, "allow")])).await;
        assert_error(&r, 409, "confirmation_not_requested");
    }
    // An unknown evaluated_permission is treated as ask.
    let odd = append_one(&app, &s, tool_use(Some("something_new"), None)).await;
    let r = app.send_as(&s, &tok, json!([tool_result(&odd)])).await;
    assert_error(&r, 409, "awaiting_confirmation");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn results_must_name_a_call_of_this_session_and_kind(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, tok) = worked_session(&app).await;
    let other = app.create_session().await;
    let foreign = append_one(&app, &other, tool_use(Some("allow"), None)).await;
    let n = app.count_for("session_events", &s).await;

    let r = app.send_as(&s, &tok, json!([tool_result(&foreign)])).await;
    assert_error(&r, 400, "unknown_tool_use_id");
    let r = app.send(&s, json!([confirm(&foreign, "allow")])).await;
    assert_error(&r, 400, "unknown_tool_use_id");
    let r = app
        .send_as(
            &s,
            &tok,
            json!([{"type": "user.custom_tool_result", "custom_tool_use_id": "sevt_nope"}]),
        )
        .await;
    assert_error(&r, 400, "unknown_tool_use_id");
    assert_eq!(app.count_for("session_events", &s).await, n);
    assert_eq!(app.count_for("session_events", &other).await, 1);

    // Custom tool calls take user.custom_tool_result, not user.tool_result.
    let custom = append_one(
        &app,
        &s,
        json!({"type": "agent.custom_tool_use", "name": "lookup", "input": {"id": "1"}}),
    )
    .await;
    let r = app.send_as(&s, &tok, json!([tool_result(&custom)])).await;
    assert_error(&r, 400, "wrong_result_type");
    let r = app.send(&s, json!([confirm(&custom, "allow")])).await;
    assert_error(&r, 409, "confirmation_not_requested");
    let r = app
        .send_as(
            &s,
            &tok,
            json!([{"type": "user.custom_tool_result", "custom_tool_use_id": custom,
                    "content": [{"type": "text", "text": "found"}], "is_error": false}]),
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["data"][0]["type"], "user.custom_tool_result");
    assert_eq!(r.body["data"][0]["custom_tool_use_id"], custom.as_str());
    // And a toolset call does not take a custom result.
    let tool = append_one(&app, &s, tool_use(Some("allow"), None)).await;
    let r = app
        .send_as(
            &s,
            &tok,
            json!([{"type": "user.custom_tool_result", "custom_tool_use_id": tool}]),
        )
        .await;
    assert_error(&r, 400, "wrong_result_type");
    app.send_as(&s, &tok, json!([tool_result(&tool)]))
        .await
        .expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn results_inherit_the_calls_thread(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, tok) = worked_session(&app).await;
    let threaded = append_one(&app, &s, tool_use(Some("ask"), Some("sthr_sub1"))).await;
    let r = app.send(&s, json!([confirm(&threaded, "allow")])).await;
    r.expect(200);
    assert_eq!(r.body["data"][0]["session_thread_id"], "sthr_sub1");
    let r = app.send_as(&s, &tok, json!([tool_result(&threaded)])).await;
    r.expect(200);
    assert_eq!(r.body["data"][0]["session_thread_id"], "sthr_sub1");
    let custom = append_one(
        &app,
        &s,
        json!({"type": "agent.custom_tool_use", "name": "c", "input": {}, "session_thread_id": "sthr_sub2"}),
    )
    .await;
    let r = app
        .send_as(
            &s,
            &tok,
            json!([{"type": "user.custom_tool_result", "custom_tool_use_id": custom}]),
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["data"][0]["session_thread_id"], "sthr_sub2");
    // History stores it too.
    let stored = app.all_events(&s).await;
    let result = stored
        .iter()
        .find(|e| e["type"] == "user.tool_result")
        .unwrap();
    assert_eq!(result["session_thread_id"], "sthr_sub1");
    // A call without a thread gives a result without one.
    let plain = append_one(&app, &s, tool_use(Some("allow"), None)).await;
    let r = app.send_as(&s, &tok, json!([tool_result(&plain)])).await;
    r.expect(200);
    assert!(r.body["data"][0]
        .get("session_thread_id")
        .is_none_or(Value::is_null));
}

// ------------------------------------------------------------------ the fenced result path

/// The result event that answered `call`, if any.
async fn answered_by(app: &TestApp, session: &str, call: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT answered_by FROM session_tool_calls WHERE session_id = $1 AND id = $2",
    )
    .bind(session)
    .bind(call)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

fn counter(app: &TestApp, which: &str) -> u64 {
    let m = &app.ctx.metrics;
    let c = match which {
        "fenced" => &m.fenced_results,
        "unlocked" => &m.unlocked_admissions,
        _ => &m.locked_admissions,
    };
    c.load(std::sync::atomic::Ordering::Relaxed)
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_workers_first_result_takes_the_fenced_path_and_everything_else_the_lock(
    db: sqlx::PgPool,
) {
    let app = TestApp::start(db).await;
    let (s, tok) = worked_session(&app).await;
    let call = append_one(&app, &s, tool_use(Some("allow"), Some("sthr_sub1"))).await;
    let (fenced, locked) = (counter(&app, "fenced"), counter(&app, "locked"));
    let outbox = app.count_for("outbox", &s).await;

    let first = app.send_as(&s, &tok, json!([tool_result(&call)])).await;
    first.expect(200);
    assert_eq!(counter(&app, "fenced"), fenced + 1);
    assert_eq!(counter(&app, "locked"), locked);
    // Everything the locking path writes: the event (with the call's
    // thread), the call answered, the projection, the outbox row.
    let stored = &first.body["data"][0];
    assert_eq!(stored["session_thread_id"], "sthr_sub1");
    let answer = answered_by(&app, &s, &call).await;
    assert_eq!(answer.as_deref(), stored["id"].as_str());
    assert_eq!(app.count_for("outbox", &s).await, outbox + 1);
    let history = app.all_events(&s).await;
    assert_eq!(history.last().unwrap()["id"], stored["id"]);
    assert_eq!(
        last_seq(&app, &s).await,
        history.len() as i64,
        "the projection follows the log"
    );

    // A retry is answered by the lock path with the event that answered.
    let again = app.send_as(&s, &tok, json!([tool_result(&call)])).await;
    again.expect(200);
    assert_eq!(again.body["data"][0]["id"], stored["id"]);
    assert_eq!(counter(&app, "fenced"), fenced + 1);
    assert_eq!(counter(&app, "locked"), locked + 1);
    assert_eq!(app.all_events(&s).await.len(), history.len());

    // Refusals come from the one locking implementation too.
    let denied = append_one(&app, &s, tool_use(Some("deny"), None)).await;
    let r = app.send_as(&s, &tok, json!([tool_result(&denied)])).await;
    assert_error(&r, 409, "tool_use_denied");
    let r = app
        .send_as(&s, &tok, json!([tool_result("sevt_nosuchcall")]))
        .await;
    assert_error(&r, 400, "unknown_tool_use_id");
    assert_eq!(counter(&app, "fenced"), fenced + 1);

    // The next call's result is fenced again (the claim lookup is reused).
    let next = append_one(&app, &s, tool_use(Some("allow"), None)).await;
    app.send_as(&s, &tok, json!([tool_result(&next)]))
        .await
        .expect(200);
    assert_eq!(counter(&app, "fenced"), fenced + 2);
    // Once the Work stopped, the token is refused at once, however recently
    // its claim was seen: the fence notices the claim moved on.
    let last = append_one(&app, &s, tool_use(Some("allow"), None)).await;
    let work = live_work(&app, &s).await;
    app.stop_work(&work[0].0, true).await;
    let events = app.count_for("session_events", &s).await;
    let r = app.send_as(&s, &tok, json!([tool_result(&last)])).await;
    r.expect(401);
    assert_eq!(app.count_for("session_events", &s).await, events);
    assert_eq!(counter(&app, "fenced"), fenced + 2);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn input_that_needs_no_lock_is_admitted_by_one_fenced_append(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    let (unlocked, locked) = (counter(&app, "unlocked"), counter(&app, "locked"));
    // The first input needs an activation: the locking path makes it.
    app.send(&s, json!([user_message("first")]))
        .await
        .expect(200);
    assert_eq!(counter(&app, "locked"), locked + 1);
    assert_eq!(counter(&app, "unlocked"), unlocked);
    assert_eq!(live_work(&app, &s).await.len(), 1);

    // While that Work lives, input only appends: no lock, the same writes.
    let r = app
        .send(&s, json!([user_message("second"), user_message("third")]))
        .await;
    r.expect(200);
    assert_eq!(counter(&app, "unlocked"), unlocked + 1);
    assert_eq!(counter(&app, "locked"), locked + 1);
    assert_eq!(app.session_counts(&s).await, (3, 1, 2));
    assert_eq!(last_seq(&app, &s).await, 3);
    let history = app.all_events(&s).await;
    assert_eq!(history[1]["id"], r.body["data"][0]["id"]);
    assert_eq!(history[2]["id"], r.body["data"][1]["id"]);
    assert_eq!(history[2]["content"][0]["text"], "third");

    // What the rules refuse or must look into still gets the lock's answer.
    let call = append_one(&app, &s, tool_use(Some("ask"), None)).await;
    app.send(&s, json!([confirm(&call, "allow")]))
        .await
        .expect(200);
    assert_eq!(counter(&app, "unlocked"), unlocked + 1);
    assert_eq!(counter(&app, "locked"), locked + 2);
    sqlx::query("INSERT INTO workspaces (id, name) VALUES ('wrkspc_other', 'other')")
        .execute(&app.db)
        .await
        .unwrap();
    let (_, foreign) = mango_api::store::keys::create(
        &app.db,
        "wrkspc_other",
        None,
        "other",
        mango_protocol::time::now(),
    )
    .await
    .unwrap();
    let r = app.send_as(&s, &foreign, json!([user_message("x")])).await;
    assert_error(&r, 404, "session_not_found");
    let ws_key = app.ws_key.clone();
    app.call(
        Method::POST,
        &format!("/v1/sessions/{s}/archive"),
        Some(&ws_key),
        None,
    )
    .await
    .expect(200);
    let r = app.send(&s, json!([user_message("late")])).await;
    assert_error(&r, 409, "session_archived");
    assert_eq!(counter(&app, "unlocked"), unlocked + 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_unlocked_append_writes_nothing_once_its_sessions_status_or_archival_moved(
    db: sqlx::PgPool,
) {
    use mango_api::store::{events, sessions};
    let app = TestApp::start(db).await;
    let running = json!({"type": "session.status_running"});
    for change in ["status", "archival"] {
        let s = app.create_session().await;
        let mut conn = app.db.acquire().await.unwrap();
        let (mut seen, _) = sessions::read_for_admission(&mut conn, &s, None)
            .await
            .unwrap()
            .unwrap();
        match change {
            "status" => {
                append_agent_events(&app.db, &s, vec![running.clone()])
                    .await
                    .unwrap();
            }
            _ => {
                sessions::set_archived(&app.db, &s, mango_protocol::time::now())
                    .await
                    .unwrap();
            }
        }
        let before = app.session_counts(&s).await;
        let message = mango_testkit::events::body(user_message("stale"));
        let now = mango_protocol::time::now();
        let written = events::append_if_unchanged(&mut conn, &mut seen, vec![message], true, now)
            .await
            .unwrap();
        assert!(written.is_none(), "fenced out after the {change} moved");
        assert_eq!(app.session_counts(&s).await, before, "{change}");
    }
    // A writer holding the row with another append: the unlocked one waits
    // for it and numbers its event after it, as commit order.
    let s = app.create_session().await;
    let mut conn = app.db.acquire().await.unwrap();
    let (seen, _) = sessions::read_for_admission(&mut conn, &s, None)
        .await
        .unwrap()
        .unwrap();
    let mut first = app.db.begin().await.unwrap();
    let mut locked = sessions::lock(&mut first, &s).await.unwrap().unwrap();
    let now = mango_protocol::time::now();
    let agent_message =
        mango_testkit::events::body(json!({"type": "agent.message", "content": []}));
    events::append(
        &mut first,
        &mut locked,
        vec![agent_message, mango_testkit::events::body(running)],
        false,
        now,
    )
    .await
    .unwrap();
    let racing = tokio::spawn(async move {
        let mut seen = seen;
        let message = mango_testkit::events::body(user_message("after"));
        let written = events::append_if_unchanged(
            &mut conn,
            &mut seen,
            vec![message],
            true,
            mango_protocol::time::now(),
        )
        .await
        .unwrap();
        written.map(|w| w.iter().map(|e| e.seq).collect::<Vec<_>>())
    });
    let written = app.commit_past(first, racing, "the unlocked append").await;
    assert_eq!(written, None, "the status moved under it: {written:?}");

    let s = app.create_session().await;
    let mut conn = app.db.acquire().await.unwrap();
    let (seen, _) = sessions::read_for_admission(&mut conn, &s, None)
        .await
        .unwrap()
        .unwrap();
    let mut first = app.db.begin().await.unwrap();
    let mut locked = sessions::lock(&mut first, &s).await.unwrap().unwrap();
    let agent_message =
        mango_testkit::events::body(json!({"type": "agent.message", "content": []}));
    events::append(
        &mut first,
        &mut locked,
        vec![agent_message.clone(), agent_message],
        false,
        now,
    )
    .await
    .unwrap();
    let racing = tokio::spawn(async move {
        let mut seen = seen;
        let message = mango_testkit::events::body(user_message("after"));
        let written = events::append_if_unchanged(
            &mut conn,
            &mut seen,
            vec![message],
            true,
            mango_protocol::time::now(),
        )
        .await
        .unwrap();
        written.map(|w| (w.iter().map(|e| e.seq).collect::<Vec<_>>(), seen.last_seq))
    });
    let written = app.commit_past(first, racing, "the unlocked append").await;
    assert_eq!(
        written,
        Some((vec![3], 3)),
        "numbered after the holder's two events"
    );
    let seqs: Vec<i64> =
        sqlx::query_scalar("SELECT seq FROM session_events WHERE session_id = $1 ORDER BY seq")
            .bind(&s)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(last_seq(&app, &s).await, 3);
}

/// One worker result through the one-statement path, on `db` (a pool, or a
/// transaction a test holds open).
async fn fenced_write(
    db: &mut sqlx::PgConnection,
    session: &str,
    call: &str,
    claim: (&str, i64),
) -> Option<mango_api::store::events::LoggedEvent> {
    mango_api::store::tool_calls::answer_open_call(
        db,
        session,
        call,
        mango_api::session_rules::CallKind::Tool,
        mango_testkit::events::body(tool_result(call)),
        mango_protocol::time::now(),
        mango_api::store::tool_calls::ClaimFence {
            work_id: claim.0,
            row_version: claim.1,
        },
    )
    .await
    .unwrap()
}

/// [`fenced_write`] on a pool connection of its own, in the background.
fn spawn_fenced_write(
    app: &TestApp,
    session: &str,
    call: &str,
    work_id: &str,
    row_version: i64,
) -> tokio::task::JoinHandle<Option<mango_api::store::events::LoggedEvent>> {
    let (db, s, call, work_id) = (
        app.db.clone(),
        session.to_string(),
        call.to_string(),
        work_id.to_string(),
    );
    tokio::spawn(async move {
        let mut conn = db.acquire().await.unwrap();
        fenced_write(&mut conn, &s, &call, (&work_id, row_version)).await
    })
}

/// A Session whose live Work is acknowledged and which has one unanswered
/// `allow` call: (session, call, the Work's id, its row version).
async fn open_call_with_live_work(app: &TestApp) -> (String, String, String, i64) {
    let (s, _tok) = worked_session(app).await;
    let call = append_one(app, &s, tool_use(Some("allow"), None)).await;
    let (work_id, row_version): (String, i64) = sqlx::query_as(
        "SELECT id, row_version FROM work WHERE session_id = $1 AND state <> 'stopped'",
    )
    .bind(&s)
    .fetch_one(&app.db)
    .await
    .unwrap();
    (s, call, work_id, row_version)
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_fenced_write_whose_claim_or_session_moved_on_changes_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, call, work_id, row_version) = open_call_with_live_work(&app).await;
    let mut conn = app.db.acquire().await.unwrap();
    let events = app.count_for("session_events", &s).await;
    let outbox = app.count_for("outbox", &s).await;

    // The claim moved on (any change bumps its row version): nothing is written.
    let moved = (work_id.as_str(), row_version - 1);
    assert!(fenced_write(&mut conn, &s, &call, moved).await.is_none());
    // Nor into an archived Session, nor for a call it does not have.
    let claim = (work_id.as_str(), row_version);
    let mut archiving = app.db.begin().await.unwrap();
    sqlx::query("UPDATE sessions SET archived_at = now() WHERE id = $1")
        .bind(&s)
        .execute(&mut *archiving)
        .await
        .unwrap();
    assert!(fenced_write(&mut archiving, &s, &call, claim)
        .await
        .is_none());
    archiving.rollback().await.unwrap();
    assert!(fenced_write(&mut conn, &s, "sevt_nosuchcall", claim)
        .await
        .is_none());
    assert_eq!(app.count_for("session_events", &s).await, events);
    assert_eq!(app.count_for("outbox", &s).await, outbox);
    assert!(answered_by(&app, &s, &call).await.is_none());

    // As it stands: written, with the call answered and the outbox row.
    let written = fenced_write(&mut conn, &s, &call, claim)
        .await
        .expect("an open call with its claim unchanged is answered");
    assert_eq!(written.seq, last_seq(&app, &s).await);
    assert_eq!(app.count_for("session_events", &s).await, events + 1);
    assert_eq!(app.count_for("outbox", &s).await, outbox + 1);
    assert_eq!(
        answered_by(&app, &s, &call).await.as_deref(),
        written.body["id"].as_str()
    );
}

/// Two answers racing for one call: the second waits for the first's row
/// lock, then finds the log head moved past what it read and writes
/// nothing (its sender then gets the first answer from the locking path).
/// A commit of anything else in between fences it out the same way.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_fenced_write_racing_another_commit_writes_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    for other in [None, Some(json!({"type": "agent.message", "content": []}))] {
        let (s, call, work_id, row_version) = open_call_with_live_work(&app).await;
        let events = app.count_for("session_events", &s).await;
        let mut first = app.db.begin().await.unwrap();
        match &other {
            None => {
                let claim = (work_id.as_str(), row_version);
                assert!(fenced_write(&mut first, &s, &call, claim).await.is_some());
            }
            Some(event) => {
                let mut session = mango_api::store::sessions::lock(&mut first, &s)
                    .await
                    .unwrap()
                    .unwrap();
                let event = mango_testkit::events::body(event.clone());
                let now = mango_protocol::time::now();
                mango_api::store::events::append(&mut first, &mut session, vec![event], false, now)
                    .await
                    .unwrap();
            }
        }
        let racing = spawn_fenced_write(&app, &s, &call, &work_id, row_version);
        let second = app.commit_past(first, racing, "the second write").await;
        assert!(second.is_none(), "fenced out after {other:?}");
        assert_eq!(app.count_for("session_events", &s).await, events + 1);
        let answers: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM session_events WHERE session_id = $1 AND body->>'tool_use_id' = $2",
        )
        .bind(&s)
        .bind(&call)
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!(answers, i64::from(other.is_none()));
    }
}

/// A Session deleted while a worker's answer waits for its row leaves the
/// answer nothing to fence on, so it writes nothing and no row outlives the
/// Session.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_fenced_write_racing_the_sessions_deletion_leaves_no_rows(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, call, work_id, row_version) = open_call_with_live_work(&app).await;
    assert!(app.count_for("session_events", &s).await > 0);
    let deleting = app.delete_session_uncommitted(&s).await;
    let racing = spawn_fenced_write(&app, &s, &call, &work_id, row_version);
    let answer = app.commit_past(deleting, racing, "the answer").await;
    assert!(
        answer.is_none(),
        "nothing is written into a deleted Session"
    );
    assert_eq!(app.count_for("session_events", &s).await, 0);
    assert_eq!(app.count_for("outbox", &s).await, 0);
}

/// Event and outbox rows reference their Session: the database refuses one
/// that names no Session, whoever writes it, not only the api's statements.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_database_refuses_log_rows_of_a_missing_session(db: sqlx::PgPool) {
    let refused =
        |result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>, what: &str| match result {
            Err(sqlx::Error::Database(e)) => {
                assert!(e.is_foreign_key_violation(), "{what}: {e}");
            }
            other => panic!("{what} for a missing Session was stored: {other:?}"),
        };
    refused(
        sqlx::query(
            "INSERT INTO session_events (session_id, seq, id, type, processed_at, body)
             VALUES ('sesn_missing', 1, 'sevt_orphan', 'user.message', now(), '{}')",
        )
        .execute(&db)
        .await,
        "an event",
    );
    refused(
        sqlx::query(
            "INSERT INTO outbox (session_id, last_seq, created_at) VALUES ('sesn_missing', 0, now())",
        )
        .execute(&db)
        .await,
        "a wake-up row",
    );
}

/// Admission's lock on a Session (as Fail takes it before it stops its
/// Work) leaves the Session's key free: a Work of the Session stopping
/// meanwhile writes its wake-up row, whose key check share-locks that key,
/// without waiting for the admission. If it waited, Fail going on to stop
/// the same Work would wait for the stop, and the two would deadlock.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_work_stopping_under_its_sessions_admission_lock_does_not_wait_for_it(db: sqlx::PgPool) {
    use mango_api::store::sessions;
    let app = TestApp::start(db).await;
    for by_admission in [false, true] {
        let (s, _call, work_id, _) = open_call_with_live_work(&app).await;
        let wakeups = app.count_for("outbox", &s).await;
        let mut admitting = app.db.begin().await.unwrap();
        let locked = if by_admission {
            sessions::lock_for_admission(&mut admitting, &s, Some("wrkspc_default"))
                .await
                .unwrap()
                .map(|(session, _)| session)
        } else {
            sessions::lock(&mut admitting, &s).await.unwrap()
        };
        assert!(locked.is_some());
        timeout(Duration::from_secs(3), app.stop_work(&work_id, true))
            .await
            .expect("the stop does not wait for the admission's lock");
        assert_eq!(
            app.count_for("outbox", &s).await,
            wakeups + 1,
            "its wake-up row"
        );
        admitting.commit().await.unwrap();
    }
}

/// Deleting a Session takes everything that hangs off it: events, tool
/// calls, Work and wake-up rows.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn deleting_a_session_takes_its_log_calls_work_and_wakeups(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, _call, _work, _version) = open_call_with_live_work(&app).await;
    let keep = open_call_with_live_work(&app).await.0;
    let tables = ["session_events", "session_tool_calls", "work", "outbox"];
    for table in tables {
        assert!(app.count_for(table, &s).await > 0, "{table} before");
    }
    app.delete_session_uncommitted(&s)
        .await
        .commit()
        .await
        .unwrap();
    for table in tables {
        assert_eq!(app.count_for(table, &s).await, 0, "{table} after");
        assert!(
            app.count_for(table, &keep).await > 0,
            "{table} of another Session"
        );
    }
}

/// A Session and call state as stored, for the guard's exhaustive test.
#[derive(Debug)]
struct StoredState {
    status: mango_protocol::sessions::SessionStatus,
    archived: bool,
    call: Option<mango_api::session_rules::ToolCall>,
}

/// Every combination of the values the schema allows in the columns the
/// one-statement path's guard reads (absent call included).
fn every_stored_state() -> Vec<StoredState> {
    use mango_api::session_rules::{CallKind, ToolCall};
    use mango_protocol::events::Permission;
    use mango_protocol::sessions::SessionStatus as Status;
    let statuses = [
        Status::Idle,
        Status::Running,
        Status::Rescheduling,
        Status::Terminated,
    ];
    let mut calls = vec![None];
    for kind in [CallKind::Tool, CallKind::Custom] {
        for permission in [Permission::Allow, Permission::Ask, Permission::Deny] {
            for confirmation in [None, Some(Permission::Allow), Some(Permission::Deny)] {
                for answered in [false, true] {
                    calls.push(Some(ToolCall {
                        kind,
                        permission,
                        confirmation,
                        answered_by: answered.then(|| "sevt_earlier".to_string()),
                    }));
                }
            }
        }
    }
    let mut states = Vec::new();
    for status in statuses {
        for archived in [false, true] {
            for call in &calls {
                states.push(StoredState {
                    status,
                    archived,
                    call: call.clone(),
                });
            }
        }
    }
    states
}

/// Writes `state` over Session `s` and its call `call` inside `tx`.
async fn store_state(tx: &mut sqlx::PgConnection, s: &str, call: &str, state: &StoredState) {
    use mango_protocol::events::Permission;
    sqlx::query(
        "UPDATE sessions SET status = $2, archived_at = CASE WHEN $3 THEN now() END WHERE id = $1",
    )
    .bind(s)
    .bind(state.status.as_str())
    .bind(state.archived)
    .execute(&mut *tx)
    .await
    .unwrap();
    let stored = match &state.call {
        Some(c) => sqlx::query(
            "UPDATE session_tool_calls SET kind = $3, permission = $4, confirmation = $5,
                 answered_by = $6
             WHERE session_id = $1 AND id = $2",
        )
        .bind(s)
        .bind(call)
        .bind(c.kind.as_str())
        .bind(c.permission.as_str())
        .bind(c.confirmation.map(Permission::as_str))
        .bind(&c.answered_by),
        None => sqlx::query("DELETE FROM session_tool_calls WHERE session_id = $1 AND id = $2")
            .bind(s)
            .bind(call),
    };
    stored.execute(&mut *tx).await.unwrap();
}

/// The Session's `last_seq` and its outbox rows.
async fn log_head_and_outbox(tx: &mut sqlx::PgConnection, s: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT last_seq FROM sessions WHERE id = $1),
                (SELECT count(*) FROM outbox WHERE session_id = $1)",
    )
    .bind(s)
    .fetch_one(&mut *tx)
    .await
    .unwrap()
}

/// The one-statement path's SQL guard decides exactly as the rules do, for
/// every value the schema allows in the columns it reads; where it refuses,
/// nothing changes (the locking path then answers).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_fenced_paths_sql_guard_is_the_rule_for_every_stored_state(db: sqlx::PgPool) {
    use mango_api::session_rules::{self as rules, CallKind, ResultDecision, Sender};
    use mango_api::store::tool_calls::{answer_open_call, ClaimFence};
    let app = TestApp::start(db).await;
    let (s, call, work_id, row_version) = open_call_with_live_work(&app).await;
    let (mut cases, mut accepted) = (0, 0);
    for state in every_stored_state() {
        for result_kind in [CallKind::Tool, CallKind::Custom] {
            let any_result =
                mango_testkit::sent(json!({"type": "user.tool_result", "tool_use_id": "x"}));
            let rule = !state.archived
                && rules::may_send(Sender::Worker, &any_result, state.status).is_ok()
                && rules::admit_result(state.call.as_ref(), result_kind)
                    == Ok(ResultDecision::Accept);
            let mut tx = app.db.begin().await.unwrap();
            store_state(&mut tx, &s, &call, &state).await;
            let before = log_head_and_outbox(&mut tx, &s).await;
            let key = match result_kind {
                CallKind::Tool => "tool_use_id",
                CallKind::Custom => "custom_tool_use_id",
            };
            let kind = match result_kind {
                CallKind::Tool => "user.tool_result",
                CallKind::Custom => "user.custom_tool_result",
            };
            let event = json!({"type": kind, key: call, "content": []});
            let written = answer_open_call(
                &mut tx,
                &s,
                &call,
                result_kind,
                mango_testkit::events::body(event),
                mango_protocol::time::now(),
                ClaimFence {
                    work_id: &work_id,
                    row_version,
                },
            )
            .await
            .unwrap();
            let after = log_head_and_outbox(&mut tx, &s).await;
            let case = format!("{state:?} result={result_kind:?}");
            assert_eq!(written.is_some(), rule, "{case}");
            let moved = i64::from(rule);
            assert_eq!(after, (before.0 + moved, before.1 + moved), "{case}");
            tx.rollback().await.unwrap();
            cases += 1;
            accepted += usize::from(rule);
        }
    }
    assert_eq!(cases, 4 * 2 * (1 + 2 * 3 * 3 * 2) * 2);
    assert!(accepted > 0 && accepted < cases);
}

/// Fail locks the Session and then updates the Work; a fenced result racing
/// it must not hold the Work row while it waits for the Session (a deadlock
/// PostgreSQL would break by failing one of them).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_fenced_result_racing_fail_does_not_deadlock(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, call, work_id, row_version) = open_call_with_live_work(&app).await;

    // Fail's order: the Session row first …
    let mut fail = app.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(&s)
        .execute(&mut *fail)
        .await
        .unwrap();
    let racing = spawn_fenced_write(&app, &s, &call, &work_id, row_version);
    // … (once the fenced write is waiting for it) … then the Work row.
    app.until_a_lock_wait().await;
    let updated = timeout(
        Duration::from_secs(5),
        sqlx::query("UPDATE work SET row_version = row_version + 1 WHERE id = $1")
            .bind(&work_id)
            .execute(&mut *fail),
    )
    .await
    .expect("Fail's Work update does not wait for the fenced write");
    updated.expect("no deadlock");
    fail.commit().await.unwrap();
    timeout(Duration::from_secs(5), racing)
        .await
        .expect("the fenced write finishes once the Session is free")
        .expect("no panic, no deadlock error");
}

// ------------------------------------------------------------------ Fail

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn fail_stops_the_work_and_terminates_the_session(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    app.send(&s, json!([user_message("go")])).await.expect(200);
    let claim = app.claim_session_work().await;
    let n = app.count_for("session_events", &s).await;

    let r = app
        .call(
            Method::POST,
            &app.work_path(&format!("/{}/fail", claim.id)),
            Some(&claim.token),
            Some(json!({"error": {"message": "m"}})),
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["state"], "stopped");
    assert_eq!(app.get_work(&claim.id).await["state"], "stopped");
    assert!(live_work(&app, &s).await.is_empty());

    let session = app
        .call(
            Method::GET,
            &format!("/v1/sessions/{s}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    session.expect(200);
    assert_eq!(session.body["status"], "terminated");
    let events = app.all_events(&s).await;
    assert_eq!(events.len() as i64, n + 2);
    let err = &events[events.len() - 2];
    let term = &events[events.len() - 1];
    assert_eq!(err["type"], "session.error");
    assert_eq!(err["error"]["type"], "session_input_failed_error");
    assert_eq!(err["error"]["message"], "m");
    assert_eq!(err["error"]["retry_status"]["type"], "terminal");
    assert_eq!(term["type"], "session.status_terminated");
    assert!(term["processed_at"].is_string());

    // Terminated: no more input, no new Work.
    let counts = app.session_counts(&s).await;
    let r = app.send(&s, json!([user_message("more")])).await;
    assert_error(&r, 409, "session_terminated");
    assert_eq!(app.session_counts(&s).await, counts);
    assert!(live_work(&app, &s).await.is_empty());
    // The token died with the Work.
    let r = app
        .call(
            Method::GET,
            &format!("/v1/sessions/{s}"),
            Some(&claim.token),
            None,
        )
        .await;
    r.expect(401);
    let r = app
        .call(
            Method::POST,
            &app.work_path(&format!("/{}/fail", claim.id)),
            Some(&claim.token),
            Some(json!({"error": {"message": "again"}})),
        )
        .await;
    r.expect(401);
    assert_eq!(app.count_for("session_events", &s).await, n + 2);
    // The list filter sees it.
    let list = app
        .call(
            Method::GET,
            "/v1/sessions?statuses[]=terminated",
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_eq!(data_ids(&list.body), vec![s.clone()]);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn fail_is_one_transaction_with_the_session_events(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    app.send(&s, json!([user_message("go")])).await.expect(200);
    let claim = app.claim_session_work().await;
    let before = app.session_counts(&s).await;

    // The terminating events cannot be written: the Work must not stop either.
    sqlx::query(
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'boom: event write refused by test'; END $$",
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER boom BEFORE INSERT ON session_events FOR EACH ROW EXECUTE FUNCTION boom()",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let fail_path = app.work_path(&format!("/{}/fail", claim.id));
    let fail = |message: &'static str| {
        app.call(
            Method::POST,
            &fail_path,
            Some(&claim.token),
            Some(json!({"error": {"message": message}})),
        )
    };
    fail("m").await.expect(500);
    assert_eq!(app.get_work(&claim.id).await["state"], "starting");
    assert_eq!(app.session_counts(&s).await, before);
    let status: String = sqlx::query_scalar("SELECT status FROM sessions WHERE id = $1")
        .bind(&s)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(status, "idle");

    sqlx::query("DROP TRIGGER boom ON session_events")
        .execute(&app.db)
        .await
        .unwrap();
    fail("m").await.expect(200);
    assert_eq!(app.get_work(&claim.id).await["state"], "stopped");
    assert_eq!(app.count_for("session_events", &s).await, before.0 + 2);
}
