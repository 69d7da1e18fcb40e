//! The agent loop tells the model about the Session's Memory Stores
//! (issue 18, item 4): each attached store's name, description, the
//! attachment's instructions, its mount path and its access, after the
//! Agent's own system prompt, as the Session snapshot has them.

use mango_api::Settings;
use mango_testkit::turns::{idle_with, say, until};
use mango_testkit::{model_reply, ScriptedModel, TestApp};
use reqwest::Method;
use serde_json::json;

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_system_prompt_names_every_attached_store(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![(
        200,
        model_reply(json!([{"type": "text", "text": "noted"}]), "end_turn"),
    )])
    .await;
    let app = TestApp::start_with(
        db,
        Settings {
            model_base_url: Some(model.base.clone()),
            memory_mount_root: "/srv/memories".into(),
            ..Settings::default()
        },
    )
    .await;
    let prefs = app.create_store("User Preferences").await;
    app.call(
        Method::POST,
        &format!("/v1/memory_stores/{prefs}"),
        Some(&app.ws_key),
        Some(json!({"description": "What the user told us they like"})),
    )
    .await
    .expect(200);
    let team = app.create_store("Team Handbook").await;
    let agent = app
        .call(
            Method::POST,
            "/v1/agents",
            Some(&app.ws_key),
            Some(json!({"name": "a", "model": "claude-scripted", "system": "be brief"})),
        )
        .await;
    agent.expect(200);
    let session = app
        .post_session(json!({"agent": agent.body["id"], "environment_id": app.env_id, "resources": [
            {"type": "memory_store", "memory_store_id": prefs, "instructions": "Update it when the user corrects you"},
            {"type": "memory_store", "memory_store_id": team, "access": "read_only"},
        ]}))
        .await;
    session.expect(200);
    let s = session.body["id"].as_str().unwrap().to_string();
    // A rename after creation changes nothing the model is told.
    app.call(
        Method::POST,
        &format!("/v1/memory_stores/{team}"),
        Some(&app.ws_key),
        Some(json!({"name": "Renamed later"})),
    )
    .await
    .expect(200);
    say(&app, &s, "hi").await;
    until(&app, &s, "end of turn", |e| idle_with(e, "end_turn")).await;

    let requests = model.requests();
    // One text block, marked for the prompt cache.
    let system = requests[0].1["system"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(system.starts_with("be brief\n\n# Memory\n"), "{system}");
    assert!(
        system.contains(
            "## User Preferences\n\n- Path: /srv/memories/user-preferences\n- Access: read and write\n\
             - Description: What the user told us they like\n\
             - Instructions: Update it when the user corrects you\n"
        ),
        "{system}"
    );
    assert!(
        system.contains(
            "## Team Handbook\n\n- Path: /srv/memories/team-handbook\n- Access: read only"
        ),
        "{system}"
    );
    assert!(!system.contains("Renamed later"), "{system}");
    assert!(
        !system.contains(&prefs),
        "ids stay out of the prompt: {system}"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_session_without_stores_gets_the_agents_prompt_unchanged(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![(
        200,
        model_reply(json!([{"type": "text", "text": "hi"}]), "end_turn"),
    )])
    .await;
    let app = TestApp::start_with(
        db,
        Settings {
            model_base_url: Some(model.base.clone()),
            ..Settings::default()
        },
    )
    .await;
    let s = mango_testkit::turns::session_with_tools(&app, json!([])).await;
    say(&app, &s, "hi").await;
    until(&app, &s, "end of turn", |e| idle_with(e, "end_turn")).await;
    assert_eq!(
        model.requests()[0].1["system"],
        json!([{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}])
    );
}
