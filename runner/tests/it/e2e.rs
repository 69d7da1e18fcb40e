//! The agent loop end to end (issue 4): an agent with the toolset, a Session
//! and a `user.message` over HTTP; a scripted model asks for `bash` and
//! `write`; the Work that admission created is polled and acked with the
//! Environment key and the real `mango-runner` is started with the Work
//! secret on stdin (as a supervisor would); it runs both calls, the results
//! flow back, the loop calls the model again and the turn ends.

use mango_testkit::runner::text_of;

use mango_api::context::Secret;
use mango_api::Settings;
use mango_client::Client;
use mango_protocol::WorkState;
use mango_testkit::{json_events, model_reply, ScriptedModel, TestApp};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MODEL_KEY: &str = "sk-e2e-model-key-must-stay-in-the-control-plane";

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}

fn idle_end_turn(events: &[Value]) -> bool {
    events.last().is_some_and(|e| {
        e["type"] == "session.status_idle" && e["stop_reason"]["type"] == "end_turn"
    })
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_turn_runs_tools_on_the_real_runner_and_ends(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![
        (
            200,
            model_reply(
                json!([
                    {"type": "text", "text": "Let me do that."},
                    {"type": "tool_use", "id": "toolu_bash", "name": "bash",
                     "input": {"command": "echo from-bash > made_by_bash.txt && echo BASH-OK; env"}},
                    {"type": "tool_use", "id": "toolu_write", "name": "write",
                     "input": {"file_path": "notes/hello.txt", "content": "hello from write"}}
                ]),
                "tool_use",
            ),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "Both done."}]), "end_turn"),
        ),
    ])
    .await;
    let api = TestApp::start_with(
        db.clone(),
        Settings {
            model_base_url: Some(model.base.clone()),
            model_api_key: Some(Secret(MODEL_KEY.into())),
            ..Default::default()
        },
    )
    .await;
    let operator = Client::new(&api.base, &api.ws_key);
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{}{path}", api.base))
            .bearer_auth(&api.ws_key)
            .json(&body)
            .send()
    };

    // Agent, Session and the user's message, over HTTP.
    let agent: Value = post(
        "/v1/agents",
        json!({"name": "e2e", "model": "claude-scripted", "system": "be useful",
               "tools": [{"type": "agent_toolset_20260401"}]}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert!(agent["id"].is_string(), "{agent}");
    let session: Value = post(
        "/v1/sessions",
        json!({"agent": agent["id"], "environment_id": api.env_id}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let session_id = session["id"].as_str().expect("a Session id").to_string();
    let sent = post(
        &format!("/v1/sessions/{session_id}/events"),
        json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "make two files"}]}]}),
    )
    .await
    .unwrap();
    assert_eq!(sent.status(), 200);

    // The supervisor's part: poll and ack the Work admission created.
    let supervisor = Client::new(&api.base, &api.env_key);
    let work = supervisor
        .poll(&api.env_id, None, None)
        .await
        .unwrap()
        .expect("the user.message made Session Work");
    assert_eq!(
        work.data,
        mango_protocol::WorkData::Session {
            id: session_id.clone()
        }
    );
    supervisor.ack(&api.env_id, &work.id).await.unwrap();

    let workspace = tempfile::tempdir().unwrap();
    let mut runner = Command::new(env!("CARGO_BIN_EXE_mango-runner"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MANGO_BASE_URL", &api.base)
        .env("MANGO_WORK_ID", &work.id)
        .env("MANGO_ENVIRONMENT_ID", &api.env_id)
        .env("MANGO_WORK_TYPE", "session")
        .env("MANGO_SESSION_ID", &session_id)
        .env("MANGO_WORKSPACE", workspace.path())
        .env("MANGO_IDLE_AFTER_END_TURN_SECONDS", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mango-runner starts");
    {
        let mut stdin = runner.stdin.take().unwrap();
        writeln!(stdin, "{}", work.secret.as_deref().unwrap()).unwrap();
    }
    // What the runner was started with (and, if this kernel lets us read a
    // non-dumpable process's environ, what it actually holds).
    if let Ok(environ) = std::fs::read(format!("/proc/{}/environ", runner.id())) {
        assert!(!String::from_utf8_lossy(&environ).contains(MODEL_KEY));
    }

    // The turn runs to its end.
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let events = json_events(operator.all_events(&session_id).await.unwrap());
        if idle_end_turn(&events) {
            break events;
        }
        assert!(
            Instant::now() < deadline,
            "the turn did not end: {:?}",
            types(&events)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The events, in order.
    let t = types(&events);
    let mut at = 0;
    let expect = |at: &mut usize, kind: &str| -> Value {
        assert_eq!(t.get(*at).copied(), Some(kind), "event {at} of {t:#?}");
        *at += 1;
        events[*at - 1].clone()
    };
    expect(&mut at, "user.message");
    expect(&mut at, "session.status_running");
    let start1 = expect(&mut at, "span.model_request_start");
    assert_eq!(
        text_of(&expect(&mut at, "agent.message")),
        "Let me do that."
    );
    let bash = expect(&mut at, "agent.tool_use");
    assert_eq!(bash["name"], "bash");
    assert_eq!(bash["evaluated_permission"], "allow");
    let write = expect(&mut at, "agent.tool_use");
    assert_eq!(write["name"], "write");
    let end1 = expect(&mut at, "span.model_request_end");
    assert_eq!(end1["model_request_start_id"], start1["id"]);
    let waiting = expect(&mut at, "session.status_idle");
    assert_eq!(waiting["stop_reason"]["type"], "requires_action");
    assert_eq!(
        waiting["stop_reason"]["event_ids"],
        json!([bash["id"], write["id"]])
    );
    let r1 = expect(&mut at, "user.tool_result");
    let r2 = expect(&mut at, "user.tool_result");
    let mut answered = [
        r1["tool_use_id"].as_str().unwrap(),
        r2["tool_use_id"].as_str().unwrap(),
    ];
    answered.sort();
    let mut asked = [bash["id"].as_str().unwrap(), write["id"].as_str().unwrap()];
    asked.sort();
    assert_eq!(answered, asked, "one result per call");
    // Resuming after requires_action reports the Session running again.
    expect(&mut at, "session.status_running");
    let start2 = expect(&mut at, "span.model_request_start");
    assert_eq!(text_of(&expect(&mut at, "agent.message")), "Both done.");
    let end2 = expect(&mut at, "span.model_request_end");
    assert_eq!(end2["model_request_start_id"], start2["id"]);
    let done = expect(&mut at, "session.status_idle");
    assert_eq!(done["stop_reason"]["type"], "end_turn");
    assert_eq!(at, events.len(), "nothing else: {t:#?}");

    // The tools really ran in the workspace.
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("made_by_bash.txt")).unwrap(),
        "from-bash\n"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("notes/hello.txt")).unwrap(),
        "hello from write"
    );
    let result_of = |call: &Value| {
        [&r1, &r2]
            .into_iter()
            .find(|r| r["tool_use_id"] == call["id"])
            .unwrap()
            .clone()
    };
    let bash_out = text_of(&result_of(&bash));
    assert!(bash_out.contains("BASH-OK"), "{bash_out}");
    assert!(
        !bash_out.contains(MODEL_KEY),
        "the model key reached a tool's environment"
    );
    assert!(
        !bash_out.lines().any(|l| l.starts_with("MANGO_BASE_URL")
            || l.contains("mango_st_")
            || l.starts_with("ANTHROPIC")),
        "tools get an allow-listed environment: {bash_out}"
    );
    let write_out = text_of(&result_of(&write));

    // The model's second request carries both results with the real outputs.
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "one model call per step");
    for (headers, _) in &requests {
        assert_eq!(headers.get("x-api-key").unwrap(), MODEL_KEY);
    }
    let second = &requests[1].1;
    let results: Vec<&Value> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter(|b| b["type"] == "tool_result")
        .collect();
    assert_eq!(results.len(), 2, "{second:#}");
    let sent_back = |call: &Value| {
        results
            .iter()
            .find(|r| r["tool_use_id"] == call["id"])
            .unwrap_or_else(|| panic!("no result for {call} in {second:#}"))
            .to_owned()
            .clone()
    };
    assert!(text_of(&sent_back(&bash)).contains("BASH-OK"));
    assert_eq!(sent_back(&bash)["is_error"], false);
    assert_eq!(text_of(&sent_back(&write)), write_out);
    assert!(
        write_out.contains("notes/hello.txt"),
        "the write result: {write_out}"
    );
    let declared: Vec<&str> = requests[0].1["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(declared.contains(&"bash") && declared.contains(&"write"));

    // The model key is in no event.
    assert!(!serde_json::to_string(&events).unwrap().contains(MODEL_KEY));

    // The runner leaves shortly after the end-of-turn idle and stops the Work.
    let status = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || runner.wait_with_output()),
    )
    .await
    .expect("the runner exits after the end-of-turn idle")
    .unwrap()
    .unwrap();
    let log = String::from_utf8_lossy(&status.stderr).to_string();
    assert!(status.status.success(), "{:?}: {log}", status.status);
    assert!(!log.contains(MODEL_KEY));
    let stored = operator.work(&api.env_id, &work.id).await.unwrap();
    assert_eq!(stored.state, WorkState::Stopped, "{stored:?}");
    let session = operator.session(&session_id).await.unwrap();
    assert_eq!(session.status.as_str(), "idle");
}
