//! Every call gets an answer the api takes: a result too large for the
//! api's limit on an event (measured as JSON, escapes and base64 included)
//! is cut to fit, and a result the api refuses anyway is answered with a
//! short error. Otherwise the call stays open and its Session waits for
//! ever, with the sandbox held.

use crate::support::{finish, results_for, runner_command, start};
use mango_client::Client;
use mango_protocol::events::{SentEvent, MAX_EVENT_BYTES};
use mango_protocol::WorkState;
use mango_runner::tool_result;
use mango_runner::tools::ToolOutput;
use mango_testkit::lossy::LossyProxy;
use mango_testkit::runner::{session_with_work, text_of};
use mango_testkit::{append_agent_events, TestApp};
use serde_json::{json, Value};

/// Appends one allowed call of `tool` with `input`; its id.
async fn call(api: &TestApp, session_id: &str, tool: &str, input: Value) -> String {
    let appended = append_agent_events(
        &api.db,
        session_id,
        vec![
            json!({"type": "agent.tool_use", "name": tool, "input": input, "evaluated_permission": "allow"}),
            json!({"type": "session.status_idle", "stop_reason": {"type": "requires_action"}}),
        ],
    )
    .await
    .unwrap();
    appended[0]["id"].as_str().unwrap().to_string()
}

async fn result_of(api: &TestApp, session_id: &str, call_id: &str) -> Value {
    let operator = Client::new(&api.base, &api.ws_key);
    results_for(&operator, session_id, &[call_id])
        .await
        .remove(0)
}

/// The Session goes on after `api`'s runner answered: a next call is
/// answered too, and the end of the Session ends the runner cleanly.
async fn goes_on_and_ends(
    api: &TestApp,
    session_id: &str,
    work_id: &str,
    runner: std::process::Child,
) {
    let next = call(api, session_id, "bash", json!({"command": "echo going on"})).await;
    let answered = result_of(api, session_id, &next).await;
    assert_eq!(text_of(&answered), "going on");
    append_agent_events(
        &api.db,
        session_id,
        vec![json!({"type": "session.status_terminated"})],
    )
    .await
    .unwrap();
    let (code, stderr) = finish(runner).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, work_id)
        .await
        .unwrap();
    assert_eq!(stored.state, WorkState::Stopped);
}

/// The JSON a stored result was sent as: its type, call id, content and
/// error flag (the server adds the rest).
fn sent_size(result: &Value) -> usize {
    let sent = json!({"type": result["type"], "tool_use_id": result["tool_use_id"],
                      "content": result["content"], "is_error": result["is_error"]});
    serde_json::to_vec(&sent).unwrap().len()
}

/// 100 KiB of control characters from bash are about 600 KiB as JSON: the
/// result keeps its start and end with a marker between, fits the api's
/// limit, and the Session goes on.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn control_characters_from_bash_are_cut_to_fit_and_the_session_goes_on(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let (session_id, work) = session_with_work(&api).await;
    let workspace = tempfile::tempdir().unwrap();
    let runner = start(
        runner_command(&api.base, &api.env_id, &work, &session_id, workspace.path()),
        &work,
    );
    let command = "echo THE-START; head -c 102400 /dev/zero | tr '\\0' '\\1'; echo; echo THE-END";
    let id = call(&api, &session_id, "bash", json!({"command": command})).await;
    let result = result_of(&api, &session_id, &id).await;
    let text = text_of(&result);
    assert_eq!(result["is_error"], false, "the command succeeded");
    assert!(text.ends_with("THE-END"), "the end is kept");
    assert!(
        text.contains("bytes left out here"),
        "a marker says what went"
    );
    assert!(
        text.matches('\u{1}').count() > 30_000,
        "as much as fits is kept"
    );
    let size = sent_size(&result);
    assert!(size <= MAX_EVENT_BYTES, "{size}");
    goes_on_and_ends(&api, &session_id, &work.id, runner).await;
}

/// `read` allows images up to 3.9 MB, but 300 KB are 400 KB of base64: the
/// image becomes a note saying so, an error, and the Session goes on. One
/// that fits still arrives as an image.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_image_too_large_to_send_is_answered_with_a_note(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let (session_id, work) = session_with_work(&api).await;
    let workspace = tempfile::tempdir().unwrap();
    let png = |len: usize| {
        let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
        bytes.extend((0..len).map(|i| (i * 7 % 251) as u8));
        bytes
    };
    std::fs::write(workspace.path().join("large.png"), png(300_000)).unwrap();
    std::fs::write(workspace.path().join("small.png"), png(10_000)).unwrap();
    let runner = start(
        runner_command(&api.base, &api.env_id, &work, &session_id, workspace.path()),
        &work,
    );

    let id = call(&api, &session_id, "read", json!({"file_path": "large.png"})).await;
    let result = result_of(&api, &session_id, &id).await;
    assert_eq!(result["is_error"], true, "the model did not get its image");
    let note = text_of(&result);
    assert!(note.contains("image (image/png) was left out"), "{note}");
    assert!(
        note.contains(&format!("at most {MAX_EVENT_BYTES}")),
        "{note}"
    );

    let id = call(&api, &session_id, "read", json!({"file_path": "small.png"})).await;
    let result = result_of(&api, &session_id, &id).await;
    assert_eq!(result["is_error"], false);
    assert_eq!(
        result["content"][0]["type"], "image",
        "{}",
        result["content"][0]["type"]
    );
    assert_eq!(result["content"][0]["source"]["media_type"], "image/png");
    goes_on_and_ends(&api, &session_id, &work.id, runner).await;
}

/// Whatever a 4xx refusal (other than 401, 403, 404) says, the call gets a
/// short error result naming it, and the Session goes on.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_refused_result_is_answered_with_a_short_error(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let proxy = LossyProxy::start(&api.base).await;
    let (session_id, work) = session_with_work(&api).await;
    let workspace = tempfile::tempdir().unwrap();
    let runner = start(
        runner_command(
            &proxy.base,
            &api.env_id,
            &work,
            &session_id,
            workspace.path(),
        ),
        &work,
    );
    let events_path = format!("/v1/sessions/{session_id}/events");
    for status in [400, 413, 422] {
        proxy.refuse_next("POST", &events_path, status);
        let id = call(
            &api,
            &session_id,
            "bash",
            json!({"command": "echo refused output"}),
        )
        .await;
        let result = result_of(&api, &session_id, &id).await;
        assert_eq!(result["is_error"], true);
        let text = text_of(&result);
        assert!(text.contains("the api refused its result"), "{text}");
        assert!(text.contains(&status.to_string()), "{status}: {text}");
        assert!(!text.contains("refused output"), "{text}");
        assert!(text.len() < 1000, "{text}");
    }
    let refused = proxy.dropped();
    assert_eq!(refused.len(), 3, "{refused:?}");
    goes_on_and_ends(&api, &session_id, &work.id, runner).await;
}

/// The runner measures as the api does: whatever it sends passes the api's
/// own check, at the limit and past it, and what it would have sent before
/// fitting does not.
#[test]
fn a_fitted_result_passes_the_apis_own_check() {
    let check =
        |event: &SentEvent| mango_api::event_shapes::check(0, serde_json::to_value(event).unwrap());
    let overhead = serde_json::to_vec(&json!({"type": "user.tool_result", "tool_use_id": "sevt_1",
        "content": [{"type": "text", "text": ""}], "is_error": false}))
    .unwrap()
    .len();
    let outputs = [
        "a".repeat(MAX_EVENT_BYTES - overhead),
        "a".repeat(MAX_EVENT_BYTES - overhead + 1),
        "\u{1}".repeat(MAX_EVENT_BYTES / 6),
        "\u{1}".repeat(MAX_EVENT_BYTES),
        "é\"\n".repeat(MAX_EVENT_BYTES / 2),
    ];
    for (i, text) in outputs.into_iter().enumerate() {
        let unfitted = SentEvent::UserToolResult(mango_protocol::events::UserToolResult {
            tool_use_id: "sevt_1".into(),
            content: Some(ToolOutput::ok(text.clone()).content),
            is_error: Some(false),
            session_thread_id: None,
        });
        let (fitted, changes) = tool_result::result("sevt_1", ToolOutput::ok(text));
        assert!(check(&fitted).is_ok(), "output {i}");
        assert_eq!(
            check(&unfitted).is_ok(),
            !changes.changed(),
            "output {i}: cut exactly when the api would refuse it"
        );
    }
}
