//! The OpenAPI document against the live router: every documented
//! operation is served at its path and method and refuses a caller without
//! a credential in a documented way, and `GET /openapi.json` serves the
//! document. (The full response check is compat/python's schemathesis pass.)

use mango_testkit::TestApp;
use reqwest::Method;
use serde_json::Value;

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn every_documented_operation_is_served_and_refuses_strangers(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let doc: Value =
        serde_json::from_str(&mango_api::openapi::to_json(&mango_api::routes::openapi())).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        // Any value routes; none of these exists.
        let concrete = path
            .split('/')
            .map(|s| if s.starts_with('{') { "x" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        for (method, op) in item.as_object().unwrap() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let reply = app.call(method.clone(), &concrete, None, None).await;
            let status = reply.status.as_u16().to_string();
            let what = format!("{method} {path}: {status} {}", reply.body);
            assert!(
                op["responses"].get(&status).is_some(),
                "{what}: status not documented"
            );
            let message = reply.body["error"]["message"].as_str().unwrap_or("");
            assert!(
                !message.contains("no such endpoint") && !message.contains("method not allowed"),
                "{what}: not served"
            );
            if op.get("security").is_some() {
                assert!(
                    reply.status.is_client_error(),
                    "{what}: served to a stranger"
                );
            } else {
                assert_eq!(reply.status, 200, "{what}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 34, "{checked} operations");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_document_is_served_without_a_credential(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let resp = app
        .http
        .get(format!("{}/openapi.json", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(
        resp.text().await.unwrap(),
        mango_api::openapi::to_json(&mango_api::routes::openapi())
    );
}
