//! The agent loop against a scripted model endpoint, on PostgreSQL.
use mango_api::context::Secret;
use mango_api::Settings;
use mango_testkit::turns::{idle_with, say, session_with_tools, types, until};
use mango_testkit::TestApp;
use mango_testkit::{model_reply, ScriptedModel};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const MODEL_KEY: &str = "sk-model-secret-never-stored";

async fn app_with_model(db: sqlx::PgPool, model: &ScriptedModel) -> TestApp {
    TestApp::start_with(
        db,
        Settings {
            model_base_url: Some(model.base.clone()),
            model_api_key: Some(Secret(MODEL_KEY.into())),
            ..Settings::default()
        },
    )
    .await
}

async fn send(app: &TestApp, session: &str, credential: &str, events: Value) -> Value {
    let r = app
        .call(
            Method::POST,
            &format!("/v1/sessions/{session}/events"),
            Some(credential),
            Some(json!({"events": events})),
        )
        .await;
    r.expect(200);
    r.body
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_text_reply_ends_the_turn(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![(
        200,
        model_reply(json!([{"type": "text", "text": "hello there"}]), "end_turn"),
    )])
    .await;
    let app = app_with_model(db, &model).await;
    let s = session_with_tools(&app, json!([])).await;
    say(&app, &s, "hi").await;
    let e = until(&app, &s, "end of turn", |e| idle_with(e, "end_turn")).await;
    assert_eq!(
        types(&e),
        [
            "user.message",
            "session.status_running",
            "span.model_request_start",
            "agent.message",
            "span.model_request_end",
            "session.status_idle"
        ]
    );
    assert_eq!(e[3]["content"][0]["text"], "hello there");
    assert_eq!(e[4]["model_request_start_id"], e[2]["id"]);
    assert_eq!(e[4]["model_usage"]["input_tokens"], 12);

    let requests = model.requests();
    assert_eq!(requests.len(), 1, "one model call per turn");
    let (headers, body) = &requests[0];
    assert_eq!(headers.get("x-api-key").unwrap(), MODEL_KEY);
    assert_eq!(body["model"], "claude-scripted");
    assert_eq!(body["system"][0]["text"], "be brief");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );
    let everything = serde_json::to_string(&e).unwrap();
    assert!(
        !everything.contains(MODEL_KEY),
        "the model key never reaches an event"
    );
    let status = app
        .call(
            Method::GET,
            &format!("/v1/sessions/{s}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_eq!(status.body["status"], "idle");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn tool_calls_wait_for_results_then_the_model_continues(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![
        (200, model_reply(json!([
            {"type": "text", "text": "running it"},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "echo hi"}},
            {"type": "tool_use", "id": "toolu_2", "name": "no_such_tool", "input": {}}
        ]), "tool_use")),
        (200, model_reply(json!([{"type": "text", "text": "all done"}]), "end_turn")),
    ])
    .await;
    let app = app_with_model(db, &model).await;
    let s = session_with_tools(&app, json!([{"type": "agent_toolset_20260401"}])).await;
    say(&app, &s, "go").await;
    let e = until(&app, &s, "requires_action", |e| {
        idle_with(e, "requires_action")
    })
    .await;
    let call = e
        .iter()
        .find(|e| e["type"] == "agent.tool_use" && e["name"] == "bash")
        .unwrap()
        .clone();
    let unknown = e.iter().find(|e| e["name"] == "no_such_tool").unwrap();
    assert_eq!(call["evaluated_permission"], "allow");
    assert_eq!(
        unknown["evaluated_permission"], "deny",
        "a tool the agent does not have is refused, visibly"
    );
    assert_eq!(
        e.last().unwrap()["stop_reason"]["event_ids"],
        json!([call["id"]])
    );

    // The worker answers with its sessions token.
    let claim = app.poll().await.expect("session work for the tool call");
    app.ack(&claim.id).await.expect(200);
    send(&app, &s, &claim.token, json!([{"type": "user.tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "hi"}], "is_error": false}])).await;
    let e = until(&app, &s, "end of turn", |e| idle_with(e, "end_turn")).await;
    assert_eq!(
        e.iter()
            .filter(|e| e["type"] == "span.model_request_start")
            .count(),
        2
    );
    let second = &model.requests()[1].1;
    let results: Vec<&Value> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter(|b| b["type"] == "tool_result")
        .collect();
    assert_eq!(
        results.len(),
        2,
        "the model sees the bash result and the refusal: {second:#}"
    );
    assert!(results
        .iter()
        .any(|r| r["tool_use_id"] == call["id"] && r["content"][0]["text"] == "hi"));
    assert!(results
        .iter()
        .any(|r| r["tool_use_id"] == unknown["id"] && r["is_error"] == true));
}

/// Each text block of a request's messages, with its role.
fn said(body: &Value) -> Vec<(&str, &str)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| {
            let role = m["role"].as_str().unwrap();
            m["content"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |b| (role, b["text"].as_str().unwrap()))
        })
        .collect()
}

fn text_reply(text: &str) -> Value {
    model_reply(json!([{"type": "text", "text": text}]), "end_turn")
}

/// A message sent while the model is thinking about the last one: the
/// reply stands, and the turn goes on with the model answering the new
/// message after it. The reply used to end the turn, and the message sat
/// unanswered on an idle Session.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_message_sent_while_the_model_is_asked_is_answered_next(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![]).await;
    let release = model.push_held_reply(200, text_reply("first answer"));
    model.push_reply(200, text_reply("second answer"));
    let app = app_with_model(db, &model).await;
    let s = session_with_tools(&app, json!([])).await;
    say(&app, &s, "hi").await;
    model.until_asked(1).await;
    say(&app, &s, "and one more thing").await;
    release.send(()).unwrap();
    let e = until(&app, &s, "the second answer", |e| {
        idle_with(e, "end_turn") && e.iter().any(|e| e["content"][0]["text"] == "second answer")
    })
    .await;
    assert_eq!(
        types(&e),
        [
            "user.message",
            "session.status_running",
            "span.model_request_start",
            "user.message",
            "agent.message",
            "span.model_request_end",
            "span.model_request_start",
            "agent.message",
            "span.model_request_end",
            "session.status_idle"
        ],
        "one turn, two requests"
    );
    let requests = model.requests();
    assert_eq!(
        said(&requests[0].1),
        [("user", "hi")],
        "the first request has what was there when it started"
    );
    assert_eq!(
        said(&requests[1].1),
        [
            ("user", "hi"),
            ("assistant", "first answer"),
            ("user", "and one more thing")
        ],
        "the reply stands where its request began, the late message after it"
    );
}

/// An interrupt sent while the model is asked: its reply is dropped (the
/// request's end and usage stay), the turn ends, and a message sent after
/// the interrupt starts the next turn.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_interrupt_while_the_model_is_asked_drops_its_reply(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![]).await;
    let release = model.push_held_reply(200, text_reply("an unwanted answer"));
    model.push_reply(200, text_reply("answering y"));
    let app = app_with_model(db, &model).await;
    let s = session_with_tools(&app, json!([])).await;
    say(&app, &s, "hi").await;
    model.until_asked(1).await;
    app.send(
        &s,
        json!([{"type": "user.interrupt"},
               {"type": "user.message", "content": [{"type": "text", "text": "y"}]}]),
    )
    .await
    .expect(200);
    release.send(()).unwrap();
    let e = until(&app, &s, "the answer to y", |e| {
        idle_with(e, "end_turn") && e.iter().any(|e| e["content"][0]["text"] == "answering y")
    })
    .await;
    assert_eq!(
        types(&e),
        [
            "user.message",
            "session.status_running",
            "span.model_request_start",
            "user.interrupt",
            "user.message",
            "span.model_request_end",
            "session.status_idle",
            "session.status_running",
            "span.model_request_start",
            "agent.message",
            "span.model_request_end",
            "session.status_idle"
        ],
        "the interrupted turn ends, and y's turn follows"
    );
    assert_eq!(e[5]["model_request_start_id"], e[2]["id"]);
    assert_eq!(
        e[5]["model_usage"]["output_tokens"], 7,
        "what was spent is kept"
    );
    assert_eq!(
        said(&model.requests()[1].1),
        [("user", "hi"), ("user", "y")]
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn overload_is_retried_and_a_dead_endpoint_leaves_the_session_usable(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![
        (
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "ok"}]), "end_turn"),
        ),
        (
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "back"}]), "end_turn"),
        ),
    ])
    .await;
    let app = app_with_model(db, &model).await;
    let s = session_with_tools(&app, json!([])).await;
    say(&app, &s, "1").await;
    let e = until(&app, &s, "retry then end of turn", |e| {
        idle_with(e, "end_turn")
    })
    .await;
    let error = e
        .iter()
        .find(|e| e["type"] == "session.error")
        .expect("the overload is reported");
    assert_eq!(error["error"]["type"], "model_overloaded_error");
    assert_eq!(error["error"]["retry_status"]["type"], "retrying");
    assert_eq!(
        e.iter()
            .filter(|e| e["type"] == "span.model_request_start")
            .count(),
        1,
        "the retry resumes the same request"
    );

    // A permanent failure ends the turn with an error, and the next message works.
    say(&app, &s, "2").await;
    let e = until(&app, &s, "a failed turn", |e| {
        idle_with(e, "retries_exhausted")
    })
    .await;
    assert_eq!(
        e.iter()
            .rev()
            .find(|e| e["type"] == "session.error")
            .unwrap()["error"]["retry_status"]["type"],
        "terminal"
    );
    say(&app, &s, "3").await;
    let e = until(&app, &s, "recovery", |e| {
        idle_with(e, "end_turn") && e.iter().any(|x| x["content"][0]["text"] == "back")
    })
    .await;
    assert_eq!(model.requests().len(), 4);
    let _ = e;
}

/// The `cache_control` marks of a request, as JSON pointers.
fn cache_breakpoints(body: &Value) -> Vec<String> {
    fn walk(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(mark) = m.get("cache_control") {
                    assert_eq!(mark, &json!({"type": "ephemeral"}), "at {at}");
                    out.push(at.clone());
                }
                for (k, v) in m {
                    walk(v, format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    walk(v, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(body, String::new(), &mut out);
    out.sort();
    out
}

/// Each turn's request marks prompt-cache breakpoints on what stays the
/// same from one turn to the next: the system prompt, the last tool
/// declaration, and the transcript up to the newest input, so a long
/// Session's turns reuse the cache (at most the API's 4 marks).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn model_calls_mark_the_stable_prefix_for_the_prompt_cache(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![
        (200, model_reply(json!([
            {"type": "text", "text": "looking"},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}
        ]), "tool_use")),
        (200, model_reply(json!([{"type": "text", "text": "a.txt is there"}]), "end_turn")),
        (200, model_reply(json!([{"type": "text", "text": "bye"}]), "end_turn")),
    ])
    .await;
    let app = app_with_model(db, &model).await;
    let s = session_with_tools(&app, json!([{"type": "agent_toolset_20260401"}])).await;
    say(&app, &s, "run ls").await;
    let e = until(&app, &s, "requires_action", |e| {
        idle_with(e, "requires_action")
    })
    .await;
    let call = e.iter().find(|e| e["type"] == "agent.tool_use").unwrap();
    let claim = app.claim_session_work().await;
    send(
        &app,
        &s,
        &claim.token,
        json!([{"type": "user.tool_result", "tool_use_id": call["id"],
        "content": [{"type": "text", "text": "a.txt"}], "is_error": false}]),
    )
    .await;
    until(&app, &s, "end of turn", |e| idle_with(e, "end_turn")).await;
    say(&app, &s, "thanks").await;
    until(&app, &s, "the third turn", |e| {
        idle_with(e, "end_turn") && e.iter().any(|x| x["content"][0]["text"] == "bye")
    })
    .await;

    let requests: Vec<Value> = model.requests().into_iter().map(|(_, b)| b).collect();
    assert_eq!(requests.len(), 3);
    let last_tool = requests[0]["tools"].as_array().unwrap().len() - 1;
    let fixed = ["/system/0".to_string(), format!("/tools/{last_tool}")];
    assert_eq!(
        requests[0]["system"],
        json!([{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}])
    );
    assert_eq!(
        cache_breakpoints(&requests[0]),
        fixed,
        "the first turn: nothing before its input"
    );
    // The second: the call is the last block before the newest input (its result).
    let mut second = vec!["/messages/1/content/1".to_string()];
    second.extend(fixed.iter().cloned());
    assert_eq!(cache_breakpoints(&requests[1]), second);
    assert_eq!(requests[1]["messages"][1]["content"][1]["type"], "tool_use");
    assert_eq!(
        requests[1]["messages"][2]["content"][0]["type"],
        "tool_result"
    );
    // The third: the answer to the result, before the new message.
    let mut third = vec!["/messages/3/content/0".to_string()];
    third.extend(fixed.iter().cloned());
    assert_eq!(cache_breakpoints(&requests[2]), third);
    assert_eq!(
        requests[2]["messages"][3]["content"][0]["text"],
        "a.txt is there"
    );
    for r in &requests {
        assert!(cache_breakpoints(r).len() <= 4, "the API's limit");
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn calls_still_waiting_when_the_work_stops_get_a_new_activation(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![(
        200,
        model_reply(json!([{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "true"}}]), "tool_use"),
    )])
    .await;
    let app = app_with_model(db, &model).await;
    let s = session_with_tools(&app, json!([{"type": "agent_toolset_20260401"}])).await;
    say(&app, &s, "go").await;
    until(&app, &s, "requires_action", |e| {
        idle_with(e, "requires_action")
    })
    .await;
    let first = app.poll().await.expect("the Session's Work");
    app.ack(&first.id).await.expect(200);
    // The Work goes away before anyone ran the call.
    app.stop_work(&first.id, true).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let second = loop {
        if let Some(claim) = app.poll().await {
            break claim;
        }
        assert!(
            Instant::now() < deadline,
            "no new activation for the waiting call"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(second.id, first.id);
    assert_eq!(second.work["data"], json!({"type": "session", "id": s}));
    assert_eq!(
        model.requests().len(),
        1,
        "no extra model call: the turn is still waiting for the result"
    );
}

/// The loop's clean-up takes the Session row before the Session's wake-up
/// rows, in the order a deletion takes them, so the two cannot deadlock: a
/// Session deleted while a step looks at it ends the step quietly, leaving
/// no row behind and starting no Work for it.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_session_deleted_during_a_step_ends_it_quietly(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    // A call a worker could run, and no live Work to run it: the step will
    // want a new activation.
    let s = app.create_session().await;
    app.send(
        &s,
        json!([{"type": "user.message", "content": [{"type": "text", "text": "go"}]}]),
    )
    .await
    .expect(200);
    mango_testkit::append_agent_events(
        &app.db,
        &s,
        vec![
            json!({"type": "agent.tool_use", "name": "bash", "input": {"command": "true"},
                    "evaluated_permission": "allow"}),
        ],
    )
    .await
    .unwrap();
    let claim = app.claim_session_work().await;
    app.stop_work(&claim.id, true).await;
    assert!(app.count_for("outbox", &s).await > 0);

    let deleting = app.delete_session_uncommitted(&s).await;
    let step = {
        let (ctx, s) = (app.ctx.clone(), s.clone());
        tokio::spawn(async move {
            // Never called: the step only waits for a worker.
            let model = mango_api::model::ModelEndpoint::new(
                "http://127.0.0.1:9",
                None,
                Duration::from_secs(1),
            );
            mango_api::agent_loop::drive(&ctx, Some(&model), &s).await
        })
    };
    // The step reads the Session (the deletion is not committed) and then
    // waits for a row the deletion holds.
    let stepped = app.commit_past(deleting, step, "the step").await;
    assert!(
        matches!(stepped, Ok(true)),
        "{:?}",
        stepped.err().map(|e| e.message)
    );
    assert_eq!(
        app.session_counts(&s).await,
        (0, 0, 0),
        "events, work, outbox"
    );
}

/// More Sessions getting input at once than the api's pool has connections
/// (`mango serve`'s default pool of 10), each model call slow enough that
/// their steps overlap: every turn ends well inside the pool's 10 s acquire
/// timeout. Each step holds a connection for its lock and needs another
/// for its queries, so ten steps at once held the whole pool and stalled
/// until the timeout, then failed with "the database is busy".
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn more_sessions_at_once_than_pool_connections_all_end_their_turns(db: sqlx::PgPool) {
    turns_at_once_on_a_pool(db, 10, 16, Duration::from_secs(8)).await;
}

/// The smallest pool `mango serve` takes (3: the LISTEN connection, a
/// step's lock, its queries) steps Sessions one after another.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_of_three_steps_sessions_one_after_another(db: sqlx::PgPool) {
    turns_at_once_on_a_pool(db, 3, 3, Duration::from_secs(8)).await;
}

/// `sessions` Sessions say "hi" at once to an api with a pool of
/// `connections`, each model call taking 0.5 s: every turn ends, with no
/// `session.error`, within `bound` of the sends.
async fn turns_at_once_on_a_pool(
    db: sqlx::PgPool,
    connections: u32,
    sessions: usize,
    bound: Duration,
) {
    let model = ScriptedModel::start(vec![]).await;
    for _ in 0..sessions {
        model.push_delayed_reply(
            Duration::from_millis(500),
            200,
            model_reply(json!([{"type": "text", "text": "hello"}]), "end_turn"),
        );
    }
    let pool = mango_api::db::api_pool(&db, connections).await.unwrap();
    let settings = Settings {
        model_base_url: Some(model.base.clone()),
        model_api_key: Some(Secret(MODEL_KEY.into())),
        ..Settings::default()
    };
    let app = TestApp::serve(db, mango_api::context::ApiContext::new(pool, settings)).await;
    let mut ids = Vec::new();
    for _ in 0..sessions {
        ids.push(session_with_tools(&app, json!([])).await);
    }
    let sent = Instant::now();
    futures::future::join_all(ids.iter().map(|s| say(&app, s, "hi"))).await;
    for s in &ids {
        let e = until(&app, s, "end of turn", |e| idle_with(e, "end_turn")).await;
        assert!(
            !types(&e).contains(&"session.error"),
            "{s}: {:?}",
            types(&e)
        );
    }
    let took = sent.elapsed();
    assert!(
        took < bound,
        "{sessions} turns of 0.5 s model calls on a pool of {connections} took {took:?}: the steps stalled on the pool"
    );
}
