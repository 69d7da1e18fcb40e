//! What a Session sees when its model cannot answer: no endpoint
//! configured, or one that fails in each of the ways endpoints fail. Every
//! case ends in `session.error` events whose type and message say what
//! happened (never the key), and a failure the endpoint may get over (429,
//! 529, timeouts, no connection) is retried with back-off, after the wait
//! its answer asked for; a refused key or an unknown model is not.
use mango_api::context::Secret;
use mango_api::Settings;
use mango_testkit::turns::{idle_with, say, session_with_tools, types, until};
use mango_testkit::{model_reply, ScriptedModel, TestApp};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

const MODEL_KEY: &str = "sk-model-secret-never-shown";

fn settings_for(base: &str) -> Settings {
    Settings {
        model_base_url: Some(base.to_string()),
        model_api_key: Some(Secret(MODEL_KEY.into())),
        // Short, so a test without retry-after is quick; a retry-after
        // honoured is then plainly longer than this.
        model_retry_backoff: Duration::from_millis(20),
        ..Settings::default()
    }
}

fn errors(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["type"] == "session.error")
        .collect()
}

fn message(error: &Value) -> &str {
    error["error"]["message"].as_str().unwrap()
}

/// A failed turn: its request ended in error, then the final error, then
/// the idle; the key in none of it.
fn assert_failed_turn(events: &[Value], retry_status: &str) {
    let n = events.len();
    assert_eq!(
        types(&events[n - 3..]),
        [
            "span.model_request_end",
            "session.error",
            "session.status_idle"
        ],
        "{events:#?}"
    );
    assert_eq!(events[n - 3]["is_error"], true);
    assert_eq!(
        events[n - 2]["error"]["retry_status"]["type"],
        retry_status,
        "{events:#?}"
    );
    assert!(!serde_json::to_string(events).unwrap().contains(MODEL_KEY));
}

async fn one_failed_turn(app: &TestApp) -> Vec<Value> {
    let s = session_with_tools(app, json!([])).await;
    say(app, &s, "hi").await;
    until(app, &s, "the failed turn", |e| {
        idle_with(e, "retries_exhausted")
    })
    .await
}

fn model_error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn without_a_model_input_gets_an_error_that_names_the_settings_and_no_work(db: sqlx::PgPool) {
    // What `mango serve` runs with neither MANGO_MODEL_BASE_URL nor ANTHROPIC_API_KEY.
    let app = TestApp::start_with(db, Settings::default()).await;
    let s = session_with_tools(&app, json!([{"type": "agent_toolset_20260401"}])).await;
    say(&app, &s, "run ls").await;
    let e = until(&app, &s, "the error", |e| idle_with(e, "retries_exhausted")).await;
    assert_eq!(
        types(&e),
        ["user.message", "session.error", "session.status_idle"]
    );
    let error = &e[1]["error"];
    assert_eq!(error["type"], "model_request_failed_error");
    assert_eq!(error["retry_status"]["type"], "terminal");
    let text = error["message"].as_str().unwrap();
    assert!(
        text.contains("no model endpoint is configured")
            && text.contains("MANGO_MODEL_BASE_URL")
            && text.contains("ANTHROPIC_API_KEY"),
        "{text}"
    );
    let session = app
        .call(
            Method::GET,
            &format!("/v1/sessions/{s}"),
            Some(&app.ws_key),
            None,
        )
        .await;
    assert_eq!(session.body["status"], "idle");
    assert!(
        app.poll().await.is_none(),
        "no Work, so no sandbox, waits for nothing"
    );
    assert_eq!(app.count_for("work", &s).await, 0);

    // Each later input gets its answer too, and the loop does not repeat itself.
    say(&app, &s, "hello?").await;
    let e = until(&app, &s, "the second error", |e| {
        errors(e).len() == 2 && idle_with(e, "retries_exhausted")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.all_events(&s).await.len(), e.len(), "{:#?}", types(&e));
    assert_eq!(app.count_for("work", &s).await, 0);
    assert_eq!(
        app.count_for("outbox", &s).await,
        0,
        "its wake-ups are handled"
    );

    // A Session created with its first message is answered the same way.
    let agent = app.create_agent("another").await;
    let created = app
        .post_session(json!({"agent": agent, "environment_id": app.env_id,
                             "initial_events": [mango_testkit::user_message("go")]}))
        .await;
    created.expect(200);
    let other = created.body["id"].as_str().unwrap().to_string();
    let e = until(&app, &other, "the error", |e| {
        idle_with(e, "retries_exhausted")
    })
    .await;
    assert_eq!(
        types(&e),
        ["user.message", "session.error", "session.status_idle"]
    );
    assert!(app.poll().await.is_none());
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_refused_connection_is_retried_then_reported(db: sqlx::PgPool) {
    // A port nothing listens on: bind one, then free it.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let app = TestApp::start_with(db, settings_for(&closed)).await;
    let e = one_failed_turn(&app).await;
    assert_failed_turn(&e, "exhausted");
    let errors = errors(&e);
    assert_eq!(errors.len(), 4, "three retries, then the final error");
    assert!(errors
        .iter()
        .all(|e| e["error"]["type"] == "model_request_failed_error"));
    let port = closed.rsplit(':').next().unwrap();
    for error in &errors {
        let text = message(error);
        assert!(
            text.starts_with("could not connect to the model endpoint at 127.0.0.1:")
                && text.contains(port)
                && text.to_lowercase().contains("connection refused"),
            "{text}"
        );
    }
    assert!(errors[..3]
        .iter()
        .all(|e| e["error"]["retry_status"]["type"] == "retrying"));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn after_a_failed_turn_the_next_message_runs(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![
        (400, model_error("invalid_request_error", "bad")),
        (
            200,
            model_reply(json!([{"type": "text", "text": "back"}]), "end_turn"),
        ),
    ])
    .await;
    let app = TestApp::start_with(db, settings_for(&model.base)).await;
    let s = session_with_tools(&app, json!([])).await;
    say(&app, &s, "1").await;
    let e = until(&app, &s, "a failed turn", |e| {
        idle_with(e, "retries_exhausted")
    })
    .await;
    assert_failed_turn(&e, "terminal");
    assert_eq!(
        message(errors(&e)[0]),
        "the model endpoint refused the request (400 Bad Request: invalid_request_error: bad)"
    );
    say(&app, &s, "2").await;
    until(&app, &s, "recovery", |e| {
        idle_with(e, "end_turn") && e.iter().any(|x| x["content"][0]["text"] == "back")
    })
    .await;
    assert_eq!(model.requests().len(), 2);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_refused_key_is_reported_once_without_the_key(db: sqlx::PgPool) {
    // Some gateways echo the key they refused.
    let model = ScriptedModel::start(vec![(
        401,
        model_error(
            "authentication_error",
            &format!("invalid x-api-key: {MODEL_KEY}"),
        ),
    )])
    .await;
    let app = TestApp::start_with(db, settings_for(&model.base)).await;
    let e = one_failed_turn(&app).await;
    assert_failed_turn(&e, "terminal");
    let errors = errors(&e);
    assert_eq!(errors.len(), 1, "a refused key is not retried");
    assert_eq!(errors[0]["error"]["type"], "model_request_failed_error");
    assert_eq!(
        message(errors[0]),
        "the model endpoint refused the API key (401 Unauthorized: authentication_error: \
         invalid x-api-key: [redacted]): check MANGO_MODEL_API_KEY or ANTHROPIC_API_KEY"
    );
    assert_eq!(model.requests().len(), 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_unknown_model_is_reported_once_by_name(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![(
        404,
        model_error("not_found_error", "model: claude-scripted"),
    )])
    .await;
    let app = TestApp::start_with(db, settings_for(&model.base)).await;
    let e = one_failed_turn(&app).await;
    assert_failed_turn(&e, "terminal");
    let errors = errors(&e);
    assert_eq!(errors.len(), 1, "an unknown model is not retried");
    assert_eq!(errors[0]["error"]["type"], "model_request_failed_error");
    assert_eq!(
        message(errors[0]),
        "the model endpoint has no model \"claude-scripted\" (404 Not Found: not_found_error: \
         model: claude-scripted): check the Agent's model and MANGO_MODEL_BASE_URL"
    );
    assert_eq!(model.requests().len(), 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_rate_limit_is_retried_after_the_wait_it_asks_for(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![]).await;
    model.push_reply_with_headers(
        429,
        &[("retry-after", "1")],
        model_error("rate_limit_error", "slow down"),
    );
    model.push_reply(
        200,
        model_reply(json!([{"type": "text", "text": "there"}]), "end_turn"),
    );
    let app = TestApp::start_with(db, settings_for(&model.base)).await;
    let s = session_with_tools(&app, json!([])).await;
    say(&app, &s, "hi").await;
    let e = until(&app, &s, "the retried turn", |e| idle_with(e, "end_turn")).await;
    let errors = errors(&e);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["error"]["type"], "model_rate_limited_error");
    assert_eq!(errors[0]["error"]["retry_status"]["type"], "retrying");
    assert_eq!(
        message(errors[0]),
        "the model endpoint is rate limiting this api (429 Too Many Requests: rate_limit_error: slow down)"
    );
    assert!(e.iter().any(|x| x["content"][0]["text"] == "there"));
    let at = model.arrivals();
    assert_eq!(at.len(), 2);
    assert!(
        at[1] - at[0] >= Duration::from_millis(950),
        "retry-after: 1 is honoured over the 20 ms back-off: {:?}",
        at[1] - at[0]
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_overloaded_endpoint_is_retried_until_the_retries_run_out(db: sqlx::PgPool) {
    let overloaded = || (529, model_error("overloaded_error", "Overloaded"));
    let model =
        ScriptedModel::start(vec![overloaded(), overloaded(), overloaded(), overloaded()]).await;
    let app = TestApp::start_with(db, settings_for(&model.base)).await;
    let e = one_failed_turn(&app).await;
    assert_failed_turn(&e, "exhausted");
    let errors = errors(&e);
    assert_eq!(errors.len(), 4, "three retries, then the final error");
    for error in &errors {
        assert_eq!(error["error"]["type"], "model_overloaded_error");
        assert_eq!(
            message(error),
            "the model endpoint is overloaded (529: overloaded_error: Overloaded)"
        );
    }
    assert_eq!(model.requests().len(), 4);
    let at = model.arrivals();
    assert!(
        at[3] - at[2] >= Duration::from_millis(80),
        "the back-off doubles (20, 40, 80 ms): {:?}",
        at.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_call_that_times_out_is_retried(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![]).await;
    model.push_delayed_reply(
        Duration::from_secs(3),
        200,
        model_reply(json!([{"type": "text", "text": "too late"}]), "end_turn"),
    );
    model.push_reply(
        200,
        model_reply(json!([{"type": "text", "text": "in time"}]), "end_turn"),
    );
    let app = TestApp::start_with(
        db,
        Settings {
            model_request_timeout: Duration::from_millis(300),
            ..settings_for(&model.base)
        },
    )
    .await;
    let s = session_with_tools(&app, json!([])).await;
    say(&app, &s, "hi").await;
    let e = until(&app, &s, "the retried turn", |e| idle_with(e, "end_turn")).await;
    let errors = errors(&e);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["error"]["type"], "model_request_failed_error");
    assert_eq!(errors[0]["error"]["retry_status"]["type"], "retrying");
    let port = model.base.rsplit(':').next().unwrap();
    assert_eq!(
        message(errors[0]),
        format!("the model endpoint at 127.0.0.1:{port} did not answer within 0.300 s")
    );
    let texts: Vec<&Value> = e
        .iter()
        .filter(|x| x["type"] == "agent.message")
        .map(|x| &x["content"][0]["text"])
        .collect();
    assert_eq!(texts, [&json!("in time")], "the late answer is not used");
    assert_eq!(model.requests().len(), 2);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_reply_that_is_not_json_is_reported_once(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![]).await;
    let page = "<html><body>Welcome to nginx!</body></html>";
    model.push_raw_reply(200, "text/html", page);
    let app = TestApp::start_with(db, settings_for(&model.base)).await;
    let e = one_failed_turn(&app).await;
    assert_failed_turn(&e, "terminal");
    let errors = errors(&e);
    assert_eq!(errors.len(), 1, "a body that is not JSON is not retried");
    assert_eq!(errors[0]["error"]["type"], "model_request_failed_error");
    assert_eq!(
        message(errors[0]),
        format!(
            "the model endpoint answered 200 OK with a body that is not JSON (text/html, {} bytes): \
             check that MANGO_MODEL_BASE_URL names a Messages-API-compatible endpoint",
            page.len()
        )
    );
    assert_eq!(model.requests().len(), 1);
}
