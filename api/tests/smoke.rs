mod common;
use common::TestApp;

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn healthcheck_lifecycle_end_to_end(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, last) = app.active_check().await;
    assert!(!last.is_empty());
    let work = app.get_work(&claim.id).await;
    assert_eq!(work["state"], "active");
    assert_eq!(work["secret"], serde_json::Value::Null);
}
