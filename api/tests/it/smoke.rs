use mango_testkit::TestApp;

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn healthcheck_lifecycle_end_to_end(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, last) = app.active_check().await;
    assert!(!last.is_empty());
    let work = app.get_work(&claim.id).await;
    assert_eq!(work["state"], "active");
    assert_eq!(work["secret"], serde_json::Value::Null);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn metrics_count_the_lease_operations(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    assert!(app.poll().await.is_none());
    let (claim, last) = app.active_check().await;
    app.heartbeat(&claim.id, &claim.token, "2020-01-01T00:00:00Z")
        .await
        .expect(412);
    app.heartbeat(&claim.id, &claim.token, &last)
        .await
        .expect(200);

    let text = app
        .http
        .get(format!("{}/metrics", app.metrics_base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("mango_work_empty_polls_total"), 1);
    assert_eq!(value("mango_work_claims_total"), 1);
    assert_eq!(value("mango_work_reclaims_total"), 0);
    assert_eq!(value("mango_work_acks_total"), 1);
    assert_eq!(value("mango_work_heartbeats_total"), 2);
    assert_eq!(value("mango_work_heartbeat_precondition_failures_total"), 1);
    assert!(value("mango_http_responses_total{class=\"4xx\"}") >= 1);
}
