//! The agent loop survives restarts and replicas (spec §6): an in-flight model
//! call is resumed, a stored reply is never requested again, one replica
//! drives a Session at a time, and an interrupt ends a turn that waits for tools.
use mango_api::context::Secret;
use mango_api::Settings;
use mango_testkit::turns::{idle_with, say, session_with_tools, types, until};
use mango_testkit::TestApp;
use mango_testkit::{model_reply, ScriptedModel};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::time::{Duration, Instant};

const MODEL_KEY: &str = "sk-durability-model-key";

/// A pool of its own on the test's database: one per "process", so dropping
/// a replica's pool drops its connections (and their advisory locks) as a
/// process exit would.
async fn own_pool(db: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(8)
        .connect_with((*db.connect_options()).clone())
        .await
        .unwrap()
}

async fn replica(db: &PgPool, model: &ScriptedModel) -> TestApp {
    TestApp::start_with(
        own_pool(db).await,
        Settings {
            model_base_url: Some(model.base.clone()),
            model_api_key: Some(Secret(MODEL_KEY.into())),
            ..Settings::default()
        },
    )
    .await
}

/// Stops a replica as a crash would: its server and background tasks end and
/// its database connections close.
async fn kill(app: TestApp) {
    let pools = [app.ctx.db.clone(), app.db.clone()];
    drop(app);
    for pool in pools {
        tokio::time::timeout(Duration::from_secs(10), pool.close())
            .await
            .expect("the replica's connections close");
    }
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

fn ended_turns(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["type"] == "session.status_idle" && e["stop_reason"]["type"] == "end_turn")
        .count()
}

async fn pending_outbox_rows(db: &PgPool, session: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox WHERE session_id = $1")
        .bind(session)
        .fetch_one(db)
        .await
        .unwrap();
    n
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_restart_mid_call_resumes_the_open_request(db: PgPool) {
    let model = ScriptedModel::start(vec![]).await;
    // The first call hangs past the restart; its answer reaches nobody.
    model.push_delayed_reply(
        Duration::from_secs(4),
        200,
        model_reply(json!([{"type": "text", "text": "lost"}]), "end_turn"),
    );
    model.push_reply(
        200,
        model_reply(json!([{"type": "text", "text": "resumed"}]), "end_turn"),
    );
    let first = replica(&db, &model).await;
    let s = session_with_tools(&first, json!([])).await;
    say(&first, &s, "hello").await;
    model.until_asked(1).await;
    let before = first.all_events(&s).await;
    assert_eq!(
        types(&before),
        [
            "user.message",
            "session.status_running",
            "span.model_request_start"
        ]
    );
    kill(first).await;

    let second = replica(&db, &model).await;
    let e = until(&second, &s, "the resumed turn", |e| {
        idle_with(e, "end_turn")
    })
    .await;
    assert_eq!(
        types(&e),
        [
            "user.message",
            "session.status_running",
            "span.model_request_start",
            "agent.message",
            "span.model_request_end",
            "session.status_idle"
        ],
        "resumed, not duplicated"
    );
    assert_eq!(e[2]["id"], before[2]["id"], "the same request span");
    assert_eq!(e[4]["model_request_start_id"], e[2]["id"]);
    assert_eq!(e[3]["content"][0]["text"], "resumed");
    assert_eq!(
        model.requests().len(),
        2,
        "the lost call is asked once more"
    );
    assert_eq!(
        model.requests()[0].1,
        model.requests()[1].1,
        "the resumed call asks the same thing"
    );
    // The lost reply arriving later changes nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(second.all_events(&s).await.len(), e.len());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_stored_reply_is_never_requested_again(db: PgPool) {
    let model = ScriptedModel::start(vec![(
        200,
        model_reply(json!([{"type": "text", "text": "once"}]), "end_turn"),
    )])
    .await;
    let first = replica(&db, &model).await;
    let s = session_with_tools(&first, json!([])).await;
    say(&first, &s, "hello").await;
    let e = until(&first, &s, "end of turn", |e| idle_with(e, "end_turn")).await;
    kill(first).await;
    // As if the process died after the reply committed but before it deleted
    // the outbox row: the next process looks at the Session again.
    sqlx::query(
        "INSERT INTO outbox (session_id, last_seq, created_at)
         SELECT id, last_seq, now() FROM sessions WHERE id = $1",
    )
    .bind(&s)
    .execute(&db)
    .await
    .unwrap();

    let second = replica(&db, &model).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending_outbox_rows(&db, &s).await > 0 {
        assert!(Instant::now() < deadline, "the new process never looked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        model.requests().len(),
        1,
        "the stored reply is not asked for again"
    );
    assert_eq!(second.all_events(&s).await, e, "no new events");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn two_replicas_make_one_model_call_per_turn(db: PgPool) {
    let model = ScriptedModel::start(vec![]).await;
    for text in ["one", "two", "three"] {
        model.push_delayed_reply(
            Duration::from_millis(700),
            200,
            model_reply(json!([{"type": "text", "text": text}]), "end_turn"),
        );
    }
    let a = replica(&db, &model).await;
    let b = replica(&db, &model).await;
    let s = session_with_tools(&a, json!([])).await;
    for (turn, via) in [&a, &b, &a].into_iter().enumerate() {
        say(via, &s, &format!("turn {turn}")).await;
        until(via, &s, "end of turn", |e| ended_turns(e) == turn + 1).await;
    }
    // Give a straggling replica time to misbehave.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = a.all_events(&s).await;
    assert_eq!(model.requests().len(), 3, "one model call per turn");
    assert_eq!(count(&e, "span.model_request_start"), 3);
    assert_eq!(count(&e, "span.model_request_end"), 3);
    assert_eq!(count(&e, "agent.message"), 3);
    assert_eq!(ended_turns(&e), 3);
    assert_eq!(count(&e, "session.error"), 0);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_interrupt_ends_a_turn_waiting_for_tools_and_a_late_result_is_harmless(db: PgPool) {
    let model = ScriptedModel::start(vec![
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": "toolu_slow", "name": "bash", "input": {"command": "sleep 100"}}]),
                "tool_use",
            ),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "next turn"}]), "end_turn"),
        ),
    ])
    .await;
    let app = replica(&db, &model).await;
    let s = session_with_tools(&app, json!([{"type": "agent_toolset_20260401"}])).await;
    say(&app, &s, "run something slow").await;
    let e = until(&app, &s, "requires_action", |e| {
        idle_with(e, "requires_action")
    })
    .await;
    let call = e
        .iter()
        .find(|e| e["type"] == "agent.tool_use")
        .unwrap()
        .clone();
    let claim = app.poll().await.expect("session work for the call");
    app.ack(&claim.id).await.expect(200);

    app.send(&s, json!([{"type": "user.interrupt"}]))
        .await
        .expect(200);
    let e = until(&app, &s, "the interrupted turn to end", |e| {
        idle_with(e, "end_turn")
    })
    .await;
    assert_eq!(model.requests().len(), 1, "an interrupt calls no model");
    let after_interrupt = e.len();

    // The worker's result arrives late: stored, but it starts nothing.
    app.send_as(
        &s,
        &claim.token,
        json!([{"type": "user.tool_result", "tool_use_id": call["id"],
                "content": [{"type": "text", "text": "LATE OUTPUT"}], "is_error": false}]),
    )
    .await
    .expect(200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending_outbox_rows(&db, &s).await > 0 {
        assert!(Instant::now() < deadline, "the loop never looked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = app.all_events(&s).await;
    assert_eq!(
        types(&e[after_interrupt..]),
        ["user.tool_result"],
        "a late result starts no turn"
    );
    assert_eq!(model.requests().len(), 1);

    // The next turn works, and the model sees the interrupted call answered once.
    say(&app, &s, "something else").await;
    let e = until(&app, &s, "the next turn", |e| ended_turns(e) == 2).await;
    assert!(idle_with(&e, "end_turn"));
    assert_eq!(model.requests().len(), 2);
    let body = &model.requests()[1].1;
    let results: Vec<&Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter(|b| b["type"] == "tool_result")
        .collect();
    assert_eq!(results.len(), 1, "{body:#}");
    assert_eq!(results[0]["tool_use_id"], call["id"]);
    assert_eq!(results[0]["is_error"], true);
    assert!(!body.to_string().contains("LATE OUTPUT"));
    let messages = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"], "{body:#}");
    assert_eq!(
        messages[2]["content"].as_array().unwrap().last().unwrap()["text"],
        "something else"
    );
}
