//! Where a lifecycle meets its limit: an item reclaimed too often, an
//! Environment deleted while Sessions still belong to it, a Workspace key
//! revoked under an open event stream.

use mango_testkit::*;

use mango_api::store::keys;
use mango_api::Settings;
use mango_protocol::time;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::time::timeout;

// ------------------------------------------------------------------ the reclaim limit

/// The api with a reclaim limit of 2: the first claim and two reclaims are
/// handed out, a third reclaim is not.
async fn limited(db: sqlx::PgPool) -> TestApp {
    TestApp::start_with(
        db,
        Settings {
            max_reclaims: 2,
            // The tests append the agent's events themselves.
            caller_plays_model: true,
            ..Default::default()
        },
    )
    .await
}

/// A counter's value on `/metrics`.
async fn metric(app: &TestApp, name: &str) -> u64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.metrics_base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} on /metrics:\n{text}"))
        .parse()
        .unwrap()
}

const LIMIT_FAILURES: &str = "mango_work_reclaim_limit_failures_total";

/// Poll that takes over any pending claim at once.
async fn poll_now(app: &TestApp) -> Option<Claim> {
    app.poll_query("?reclaim_older_than_ms=0").await
}

async fn claim_epoch(app: &TestApp, id: &str) -> i64 {
    sqlx::query_scalar("SELECT claim_epoch FROM work WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_healthcheck_reclaimed_past_the_limit_is_failed_and_poll_hands_out_the_next(
    db: sqlx::PgPool,
) {
    let app = limited(db).await;
    let stuck = app.create_check().await;
    let next = app.create_check().await;
    let failures = metric(&app, LIMIT_FAILURES).await;

    // The first claim, and reclaims up to the limit, are handed out.
    let mut last = None;
    for epoch in 1..=3 {
        let c = poll_now(&app).await.expect("the stuck item, again");
        assert_eq!(c.id, stuck, "claim {epoch}");
        assert_eq!(claim_epoch(&app, &stuck).await, epoch);
        last = Some(c);
    }
    let last = last.unwrap();
    assert_eq!(app.get_work(&stuck).await["state"], "queued");
    assert_eq!(metric(&app, LIMIT_FAILURES).await, failures);

    // The next reclaim would be the third: Poll fails the item instead and
    // returns the next available one.
    let c = poll_now(&app).await.expect("the next item");
    assert_eq!(c.id, next);
    let w = app.get_work(&stuck).await;
    assert_eq!(w["state"], "stopped", "{w}");
    assert_eq!(w["result"]["status"], "failed", "{w}");
    let reason = w["result"]["message"].as_str().unwrap();
    assert!(
        reason.contains("reclaimed 3 times") && reason.contains("the limit is 2"),
        "{reason}"
    );
    assert_eq!(metric(&app, LIMIT_FAILURES).await, failures + 1);
    // Its last holder's token went with the refused claim.
    app.ack(&stuck).await.expect(409);
    let r = app.heartbeat(&stuck, &last.token, "NO_HEARTBEAT").await;
    r.expect(401);

    // It is never handed out again: only the other item comes back.
    let again = poll_now(&app).await.expect("the other item, reclaimed");
    assert_eq!(again.id, next);
    assert_eq!(
        app.get_work(&stuck).await,
        w,
        "the failed item stays as it was"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn session_work_reclaimed_past_the_limit_terminates_the_session(db: sqlx::PgPool) {
    let app = limited(db).await;
    let s = app.create_session().await;
    app.send(&s, json!([user_message("go")])).await.expect(200);
    let failures = metric(&app, LIMIT_FAILURES).await;
    let work_id = app.session_work(&s).await[0].0.clone();
    for _ in 1..=3 {
        let c = poll_now(&app).await.expect("the Session's Work, again");
        assert_eq!(c.id, work_id);
    }
    let events_before = app.all_events(&s).await.len();

    // Nothing else is queued, so the Poll that refuses the third reclaim is null.
    assert!(poll_now(&app).await.is_none());
    assert_eq!(app.session_work(&s).await, [(work_id, "stopped".into())]);
    assert_eq!(metric(&app, LIMIT_FAILURES).await, failures + 1);
    let events = app.all_events(&s).await;
    let added: Vec<&Value> = events[events_before..].iter().collect();
    assert_eq!(added.len(), 2, "{added:?}");
    assert_eq!(added[0]["type"], "session.error");
    assert_eq!(added[0]["error"]["type"], "session_input_failed_error");
    assert_eq!(added[0]["error"]["retry_status"]["type"], "terminal");
    let reason = added[0]["error"]["message"].as_str().unwrap();
    assert!(reason.contains("reclaimed 3 times"), "{reason}");
    assert_eq!(added[1]["type"], "session.status_terminated");
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
    // The poison input starts no new activation.
    let r = app.send(&s, json!([user_message("again")])).await;
    r.expect(409);
    assert_eq!(r.code(), Some("session_terminated"));
    assert!(poll_now(&app).await.is_none());
}

// ------------------------------------------------------------------ an Environment in use

async fn environment_rows(app: &TestApp, env: &str) -> Value {
    sqlx::query_scalar(
        "SELECT jsonb_build_object(
             'environment', (SELECT to_jsonb(e) FROM environments e WHERE id = $1),
             'work', (SELECT jsonb_agg(to_jsonb(w) ORDER BY id) FROM work w WHERE environment_id = $1),
             'keys', (SELECT jsonb_agg(id ORDER BY id) FROM api_keys WHERE environment_id = $1),
             'sessions', (SELECT jsonb_agg(id ORDER BY id) FROM sessions WHERE environment_id = $1))",
    )
    .bind(env)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn deleting_an_environment_with_sessions_is_409_environment_in_use(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    app.send(&s, json!([user_message("go")])).await.expect(200);
    app.create_check().await;
    let env = format!("/v1/environments/{}", app.env_id);
    let before = environment_rows(&app, &app.env_id).await;
    assert_eq!(before["work"].as_array().unwrap().len(), 2);
    assert_eq!(before["keys"].as_array().unwrap().len(), 1);

    // An archived Session still belongs to its Environment.
    for archived in [false, true] {
        let r = app
            .call(Method::DELETE, &env, Some(&app.ws_key), None)
            .await;
        r.expect(409);
        assert_eq!(r.error_type(), Some("conflict_error"));
        assert_eq!(r.code(), Some("environment_in_use"), "{}", r.body);
        assert_eq!(
            r.headers
                .get("x-should-retry")
                .and_then(|v| v.to_str().ok()),
            Some("false"),
            "a retry cannot change the answer"
        );
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("1 Session"), "{message}");
        let mut now = environment_rows(&app, &app.env_id).await;
        if archived {
            // Archiving the Session changed only the Session.
            now["sessions"] = before["sessions"].clone();
        }
        assert_eq!(now, before, "nothing was deleted (archived: {archived})");
        // Its Environment key still works.
        app.call(
            Method::GET,
            &app.work_path("/stats"),
            Some(&app.env_key),
            None,
        )
        .await
        .expect(200);
        if !archived {
            app.call(
                Method::POST,
                &format!("/v1/sessions/{s}/archive"),
                Some(&app.ws_key),
                None,
            )
            .await
            .expect(200);
        }
    }

    // Without its Sessions it deletes, and its Work and keys go with it.
    app.call(
        Method::DELETE,
        &format!("/v1/sessions/{s}"),
        Some(&app.ws_key),
        None,
    )
    .await
    .expect(200);
    let r = app
        .call(Method::DELETE, &env, Some(&app.ws_key), None)
        .await;
    r.expect(200);
    assert_eq!(
        r.body,
        json!({"id": app.env_id, "type": "environment_deleted"})
    );
    assert_eq!(
        environment_rows(&app, &app.env_id).await,
        json!({"environment": null, "work": null, "keys": null, "sessions": null})
    );
    app.call(Method::GET, &env, Some(&app.ws_key), None)
        .await
        .expect(404);
    app.call(
        Method::GET,
        &app.work_path("/stats"),
        Some(&app.env_key),
        None,
    )
    .await
    .expect(401);
}

// ------------------------------------------------------------------ a revoked key's stream

fn agent_message(text: &str) -> Value {
    json!({"type": "agent.message", "content": [{"type": "text", "text": text}]})
}

/// An event appended from outside, and that each reader gets it next.
async fn delivered_to(app: &TestApp, s: &str, readers: &mut [&mut SseReader]) {
    let stored = append_agent_events(&app.db, s, vec![agent_message("hi")])
        .await
        .unwrap();
    for sse in readers.iter_mut() {
        let f = timeout(Duration::from_secs(3), sse.next_event())
            .await
            .expect("the event arrives")
            .expect("the stream is open");
        assert_eq!(f.json()["id"], stored[0]["id"]);
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_workspace_key_stream_closes_soon_after_the_key_is_revoked(db: sqlx::PgPool) {
    let app = TestApp::start_with(
        db,
        Settings {
            stream_ping_interval: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    let s = app.create_session().await;
    let (doomed, secret) = keys::create(&app.db, "wrkspc_default", None, "doomed", time::now())
        .await
        .unwrap();
    let resp = app.open_stream(&s, &secret).await;
    assert_eq!(resp.status().as_u16(), 200);
    let mut revoked_sse = SseReader::new(resp);
    let resp = app.open_stream(&s, &app.ws_key).await;
    assert_eq!(resp.status().as_u16(), 200);
    let mut kept_sse = SseReader::new(resp);
    delivered_to(&app, &s, &mut [&mut revoked_sse, &mut kept_sse]).await;

    // As `mango api-key revoke` does.
    let row = keys::revoke(&app.db, &doomed.id, time::now())
        .await
        .unwrap()
        .expect("the key");
    assert!(row.revoked_at.is_some());
    let revoked = Instant::now();
    let end = timeout(Duration::from_secs(4), async {
        while revoked_sse.next_frame().await.is_some() {}
    })
    .await;
    assert!(
        end.is_ok(),
        "stream still open 4 s after its key was revoked"
    );
    assert!(
        revoked.elapsed() < Duration::from_millis(2500),
        "closed after {:?}",
        revoked.elapsed()
    );
    let r = app.open_stream(&s, &secret).await;
    assert_eq!(
        r.status().as_u16(),
        401,
        "reconnecting with the revoked key"
    );

    // The unrevoked key's stream stayed open all along.
    delivered_to(&app, &s, &mut [&mut kept_sse]).await;
}
