//! `/metrics` answers an operator's questions: how deep the queue is and
//! how old, which leases ran out, how model calls fare, where Sessions
//! stand. Each gauge is read after its cause, at its edge.

use mango_api::context::Secret;
use mango_api::Settings;
use mango_testkit::turns::{idle_with, say, session_with_tools, until};
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::json;
use std::time::Duration;

async fn scrape(app: &TestApp) -> String {
    let resp = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

/// The value of the sample spelled exactly `series` (name and labels), if shown.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

fn depth(env: &str, state: &str) -> String {
    format!("mango_work_queue_depth{{environment=\"{env}\",state=\"{state}\"}}")
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_queue_gauges_follow_the_work_by_environment_and_state(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let env = app.env_id.clone();
    let text = scrape(&app).await;
    assert_eq!(
        sample(&text, &depth(&env, "queued")),
        None,
        "no Work, no series"
    );
    assert!(text.contains("# TYPE mango_work_queue_depth gauge"));
    assert_eq!(sample(&text, "mango_api_database_up"), Some(1.0));

    let first = app.create_check().await;
    app.create_check().await;
    let text = scrape(&app).await;
    assert_eq!(sample(&text, &depth(&env, "queued")), Some(2.0));
    let oldest = format!("mango_work_oldest_queued_seconds{{environment=\"{env}\"}}");
    let age = sample(&text, &oldest).unwrap();
    assert!((0.0..60.0).contains(&age), "{age}");

    // Age the first item by an hour: the oldest age is the oldest item's.
    sqlx::query("UPDATE work SET created_at = created_at - interval '1 hour' WHERE id = $1")
        .bind(&first)
        .execute(&app.db)
        .await
        .unwrap();
    let age = sample(&scrape(&app).await, &oldest).unwrap();
    assert!((3600.0..3660.0).contains(&age), "{age}");

    let claim = app.poll().await.unwrap();
    assert_eq!(app.ack(&claim.id).await.status, 200);
    let text = scrape(&app).await;
    assert_eq!(sample(&text, &depth(&env, "queued")), Some(1.0));
    assert_eq!(sample(&text, &depth(&env, "starting")), Some(1.0));
    let expired = format!("mango_work_expired_leases{{environment=\"{env}\"}}");
    assert_eq!(sample(&text, &expired), Some(0.0));

    // Its lease runs out: counted as expired until a poller reclaims it.
    sqlx::query("UPDATE work SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(&claim.id)
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(sample(&scrape(&app).await, &expired), Some(1.0));

    // Stopped Work leaves the gauges.
    app.stop_work(&claim.id, true).await;
    let text = scrape(&app).await;
    assert_eq!(sample(&text, &depth(&env, "starting")), None, "{text}");
    assert_eq!(sample(&text, &expired), Some(0.0));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sessions_are_counted_by_status(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_session().await;
    app.create_session().await;
    let text = scrape(&app).await;
    assert_eq!(sample(&text, "mango_sessions{status=\"idle\"}"), Some(2.0));
    assert_eq!(
        sample(&text, "mango_sessions{status=\"running\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "mango_sessions{status=\"archived\"}"),
        Some(0.0)
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn model_calls_are_timed_and_their_failures_counted_by_type(db: sqlx::PgPool) {
    let overloaded = (
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    );
    let model = ScriptedModel::start(vec![overloaded.clone(); 4]).await;
    let app = TestApp::start_with(
        db,
        Settings {
            model_base_url: Some(model.base.clone()),
            model_api_key: Some(Secret("sk-metrics-model-key".into())),
            model_retry_backoff: Duration::from_millis(10),
            ..Settings::default()
        },
    )
    .await;
    let before = scrape(&app).await;
    assert_eq!(
        sample(&before, "mango_model_request_duration_seconds_count"),
        Some(0.0)
    );
    let s = session_with_tools(&app, json!([])).await;
    say(&app, &s, "hi").await;
    until(&app, &s, "the failed turn", |e| {
        idle_with(e, "retries_exhausted")
    })
    .await;

    let text = scrape(&app).await;
    assert_eq!(
        sample(&text, "mango_model_request_duration_seconds_count"),
        Some(4.0),
        "one call and three retries"
    );
    assert_eq!(
        sample(
            &text,
            "mango_model_request_duration_seconds_bucket{le=\"+Inf\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        sample(
            &text,
            "mango_model_errors_total{type=\"model_overloaded_error\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        sample(
            &text,
            "mango_model_errors_total{type=\"model_rate_limited_error\"}"
        ),
        Some(0.0)
    );
    assert!(!text.contains("sk-metrics-model-key"));
    assert!(!text.contains(&s), "no Session id is a label");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_database_that_does_not_answer_shows_as_not_up_and_keeps_the_counters(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    // Every connection of the api's pool refused from now on.
    app.ctx.db.close().await;
    let text = scrape(&app).await;
    assert_eq!(sample(&text, "mango_api_database_up"), Some(0.0), "{text}");
    assert!(sample(&text, "mango_work_claims_total").is_some());
    assert!(text.contains("# the queue's gauges are missing"));
}
