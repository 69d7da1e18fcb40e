//! Who ended a Work item, as its supervisor reads it from the claims (spec
//! §7.1): only the runner's own idle Stop of an active Session item makes it
//! keepable; an operator's Stop (graceful or forced), a Fail, a lost lease
//! or a reclaim never does, and neither does the runner's ordinary Stop.

use mango_testkit::*;

use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

/// A Session with input, its Work claimed by the Environment key, acked,
/// and its lease claimed by the runner's first beat.
async fn active_session_work(app: &TestApp) -> Claim {
    let agent = app.create_agent("kept").await;
    app.post_session(json!({"agent": agent, "environment_id": app.env_id,
                            "initial_events": [user_message("go")]}))
        .await
        .expect(200);
    let claim = app.claim_session_work().await;
    app.heartbeat(&claim.id, &claim.token, "NO_HEARTBEAT")
        .await
        .expect(200);
    claim
}

async fn stop_as(app: &TestApp, id: &str, credential: &str, body: Value) -> Reply {
    app.call(
        Method::POST,
        &app.work_path(&format!("/{id}/stop")),
        Some(credential),
        Some(body),
    )
    .await
}

/// The claims entry of `id` for the Environment key.
async fn claim_state(app: &TestApp, id: &str) -> Value {
    let r = app
        .call(
            Method::GET,
            &app.work_path(&format!("/claims?ids%5B%5D={}", urlencode(id))),
            Some(&app.env_key),
            None,
        )
        .await;
    r.expect(200);
    r.body["data"][0].clone()
}

fn idle_stop() -> Value {
    json!({"force": true, "reason": "idle"})
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_runners_idle_stop_is_keepable(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let claim = active_session_work(&app).await;
    assert_eq!(claim_state(&app, &claim.id).await["keepable"], false);
    stop_as(&app, &claim.id, &claim.token, idle_stop())
        .await
        .expect(204);
    let state = claim_state(&app, &claim.id).await;
    assert_eq!(state["state"], "stopped");
    assert_eq!(state["keepable"], true, "{state}");
    // The token is spent like any stopped item's.
    assert_eq!(
        stop_as(&app, &claim.id, &claim.token, idle_stop())
            .await
            .status,
        401
    );
    // The typed client says the same thing.
    let env_key = mango_client::Client::new(&app.base, &app.env_key);
    let claims = env_key
        .claims(&app.env_id, std::slice::from_ref(&claim.id))
        .await
        .unwrap();
    assert!(claims.data[0].keepable);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_client_sends_the_idle_stop(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let claim = active_session_work(&app).await;
    let holder = mango_client::Client::new(&app.base, &claim.token);
    assert!(holder.stop_idle(&app.env_id, &claim.id).await.unwrap());
    assert_eq!(claim_state(&app, &claim.id).await["keepable"], true);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_operators_stop_is_never_keepable(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    // Forced: stopped at once, by the operator.
    let forced = active_session_work(&app).await;
    app.stop_work(&forced.id, true).await;
    let state = claim_state(&app, &forced.id).await;
    assert_eq!(
        (state["state"].clone(), state["keepable"].clone()),
        (json!("stopped"), json!(false))
    );

    // Graceful: the runner's idle Stop that follows it ends the item, but
    // the operator asked first.
    let graceful = active_session_work(&app).await;
    app.stop_work(&graceful.id, false).await;
    let state = claim_state(&app, &graceful.id).await;
    assert_eq!(state["state"], "stopping");
    assert_eq!(state["keepable"], false);
    stop_as(&app, &graceful.id, &graceful.token, idle_stop())
        .await
        .expect(204);
    let state = claim_state(&app, &graceful.id).await;
    assert_eq!(
        (state["state"].clone(), state["keepable"].clone()),
        (json!("stopped"), json!(false))
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_runners_ordinary_stop_and_a_fail_are_not_keepable(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let ordinary = active_session_work(&app).await;
    stop_as(&app, &ordinary.id, &ordinary.token, json!({"force": true}))
        .await
        .expect(204);
    assert_eq!(claim_state(&app, &ordinary.id).await["keepable"], false);

    let failed = active_session_work(&app).await;
    app.call(
        Method::POST,
        &app.work_path(&format!("/{}/fail", failed.id)),
        Some(&failed.token),
        Some(json!({"error": {"message": "the input is bad"}})),
    )
    .await
    .expect(200);
    let state = claim_state(&app, &failed.id).await;
    assert_eq!(
        (state["state"].clone(), state["keepable"].clone()),
        (json!("stopped"), json!(false))
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_lost_lease_and_a_reclaim_are_not_keepable(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let agent = app.create_agent("kept").await;
    app.post_session(json!({"agent": agent, "environment_id": app.env_id,
                            "initial_events": [user_message("go")]}))
        .await
        .expect(200);
    let claim = app.claim_session_work().await;
    let beat = app
        .call(
            Method::POST,
            &app.work_path(&format!(
                "/{}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT&desired_ttl_seconds=1",
                claim.id
            )),
            Some(&claim.token),
            None,
        )
        .await;
    beat.expect(200);
    // Poll interval inside a deadline: the 1 s lease must run out.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = claim_state(&app, &claim.id).await;
        if state["lease_lost"] == true {
            assert_eq!(state["keepable"], false, "{state}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The runner that lost its lease cannot make it keepable after.
    assert_eq!(
        stop_as(&app, &claim.id, &claim.token, idle_stop())
            .await
            .status,
        401
    );
    // Reclaimed by the same key: a new claim, not stopped, not keepable.
    let again = app.poll().await.expect("the lost item, reclaimed");
    assert_eq!(again.id, claim.id);
    let state = claim_state(&app, &claim.id).await;
    assert_eq!(state["claim"], 2);
    assert_eq!(state["state"], "queued");
    assert_eq!(state["keepable"], false);
    assert_eq!(
        stop_as(&app, &claim.id, &claim.token, idle_stop())
            .await
            .status,
        401,
        "the old claim's token is gone with its claim"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_idle_stop_is_the_holders_forced_stop_of_session_work(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let claim = active_session_work(&app).await;
    let refused = |r: &Reply, why: &str| {
        assert_eq!(r.status, 400, "{why}: {}", r.body);
        assert_eq!(r.body["error"]["type"], "invalid_request_error", "{why}");
    };
    refused(
        &stop_as(&app, &claim.id, &app.ws_key, idle_stop()).await,
        "an operator",
    );
    refused(
        &stop_as(
            &app,
            &claim.id,
            &claim.token,
            json!({"force": false, "reason": "idle"}),
        )
        .await,
        "not forced",
    );
    refused(
        &stop_as(&app, &claim.id, &claim.token, json!({"reason": "idle"})).await,
        "force absent",
    );
    refused(
        &stop_as(
            &app,
            &claim.id,
            &claim.token,
            json!({"force": true, "reason": "sleepy"}),
        )
        .await,
        "an unknown reason",
    );
    // None of them touched the item.
    assert_eq!(claim_state(&app, &claim.id).await["state"], "active");

    let (check, _) = app.active_check().await;
    refused(
        &stop_as(&app, &check.id, &check.token, idle_stop()).await,
        "a healthcheck",
    );
    assert_eq!(claim_state(&app, &check.id).await["state"], "active");
}
