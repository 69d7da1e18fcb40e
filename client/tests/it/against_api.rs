//! The client against a real `mango` api on PostgreSQL (`DATABASE_URL`).

use mango_client::{Client, RetryPolicy, StreamFrame};
use mango_protocol::WorkState;
use mango_testkit::{sent, TestApp};
use serde_json::json;
use std::time::{Duration, Instant};

struct Api {
    base: String,
    ws: Client,
    ws_secret: String,
    env_id: String,
    env: Client,
    _live: TestApp,
}

async fn start(db: sqlx::PgPool) -> Api {
    let live = TestApp::start(db).await;
    Api {
        base: live.base.clone(),
        ws: Client::new(&live.base, &live.ws_key),
        ws_secret: live.ws_key.clone(),
        env_id: live.env_id.clone(),
        env: Client::new(&live.base, &live.env_key),
        _live: live,
    }
}

fn token_of(secret: &str) -> String {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(secret)
        .unwrap();
    serde_json::from_slice::<mango_protocol::WorkSecret>(&raw)
        .unwrap()
        .sessions_token
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_healthcheck_through_the_client(db: sqlx::PgPool) {
    let api = start(db).await;
    assert!(
        api.env
            .poll(&api.env_id, None, Some("w1"))
            .await
            .unwrap()
            .is_none(),
        "empty poll is None"
    );
    let check = api.ws.create_healthcheck(&api.env_id).await.unwrap();
    let polled = api
        .env
        .poll(&api.env_id, Some(500), Some("w1"))
        .await
        .unwrap()
        .expect("an item");
    assert_eq!(polled.id, check.id);
    api.env.ack(&api.env_id, &polled.id).await.unwrap();

    let holder = Client::new(&api.base, &token_of(polled.secret.as_deref().unwrap()));
    let first = holder
        .heartbeat(&api.env_id, &polled.id, None, Some(30))
        .await
        .unwrap();
    assert_eq!(
        (first.state, first.ttl_seconds, first.lease_extended),
        (WorkState::Active, 30, true)
    );
    let second = holder
        .heartbeat(&api.env_id, &polled.id, Some(&first.last_heartbeat), None)
        .await
        .unwrap();
    let stale = holder
        .heartbeat(&api.env_id, &polled.id, Some("2020-01-01T00:00:00Z"), None)
        .await
        .unwrap_err();
    assert!(stale.is_lease_lost() && !stale.is_transient());
    assert_eq!(stale.error_code(), Some("heartbeat_precondition_failed"));
    assert_ne!(second.last_heartbeat, first.last_heartbeat);

    let done = holder
        .result(
            &api.env_id,
            &polled.id,
            true,
            "Sandbox process and workspace check passed",
        )
        .await
        .unwrap();
    assert_eq!(done.state, WorkState::Stopped);
    assert_eq!(
        api.ws
            .work(&api.env_id, &polled.id)
            .await
            .unwrap()
            .result
            .unwrap()
            .message,
        "Sandbox process and workspace check passed"
    );
    assert_eq!(api.env.stats(&api.env_id).await.unwrap().depth, 0);
    assert!(
        !api.ws.stop(&api.env_id, &polled.id, true).await.unwrap(),
        "already stopped is Ok(false)"
    );
    assert_eq!(api.ws.list_work(&api.env_id).await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn final_errors_are_not_retried(db: sqlx::PgPool) {
    let api = start(db).await;
    let slow = RetryPolicy {
        attempts: 5,
        first_delay: Duration::from_secs(5),
        max_delay: Duration::from_secs(5),
    };
    let bad = Client::new(&api.base, "mango_envk_nope").with_retry(slow.clone());
    let started = Instant::now();
    let err = bad.poll(&api.env_id, None, None).await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(401));
    let forbidden = api
        .env
        .clone()
        .with_retry(slow)
        .work(&api.env_id, "work_x")
        .await
        .unwrap_err();
    assert_eq!(forbidden.status().map(|s| s.as_u16()), Some(403));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "401 and 403 are final: no back-off"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn session_events_list_send_and_stream(db: sqlx::PgPool) {
    let api = start(db).await;
    let http = reqwest::Client::new();
    let ws_key = api.ws_secret.clone();
    let agent: serde_json::Value = http
        .post(format!("{}/v1/agents", api.base))
        .bearer_auth(&ws_key)
        .json(&json!({"name": "a", "model": "m"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session: serde_json::Value = http
        .post(format!("{}/v1/sessions", api.base))
        .bearer_auth(&ws_key)
        .json(&json!({"agent": agent["id"], "environment_id": api.env_id}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid = session["id"].as_str().unwrap();
    let operator = Client::new(&api.base, &ws_key);
    let mut stream = operator.stream_events(sid).await.unwrap();
    let stored = operator
        .send_events(
            sid,
            &[sent(
                json!({"type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
            )],
        )
        .await
        .unwrap();
    let got = loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            StreamFrame::Event(e) => break e,
            StreamFrame::Ping => continue,
            StreamFrame::Error(e) => panic!("stream error {e}"),
        }
    };
    assert_eq!(got.id, stored[0].id);
    assert_eq!(operator.all_events(sid).await.unwrap().len(), 1);
    assert_eq!(operator.session(sid).await.unwrap().id, sid);
}
