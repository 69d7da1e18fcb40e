//! The `mango api-key` commands, run as a user would run them.
use mango_testkit::TestApp;
use reqwest::Method;
use serde_json::Value;
use std::process::{Command, Output};

fn database_url(db: &sqlx::PgPool) -> String {
    let o = db.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().expect("sqlx::test names its database")
    )
}

fn mango(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mango"))
        .args(args)
        .env("MANGO_DATABASE_URL", url)
        .output()
        .expect("mango runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "mango failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn api_keys_are_created_listed_and_revoked_with_either_flag_spelling(db: sqlx::PgPool) {
    let url = database_url(&db);
    let app = TestApp::start(db).await;

    // One dash, as in the seed: the key is printed once, with exactly these fields.
    let created: Value = serde_json::from_str(&stdout(&mango(
        &url,
        &[
            "api-key",
            "create",
            "-workspace",
            "wrkspc_default",
            "-environment",
            &app.env_id,
            "-label",
            "pool",
            "-json",
        ],
    )))
    .unwrap();
    let mut fields: Vec<&str> = created
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "api_key",
            "created_at",
            "environment_id",
            "id",
            "kind",
            "label",
            "workspace_id"
        ]
    );
    assert_eq!(created["kind"], "environment");
    assert_eq!(created["environment_id"], app.env_id.as_str());
    let secret = created["api_key"].as_str().unwrap().to_string();
    let id = created["id"].as_str().unwrap().to_string();

    // The new key works for what an Environment key may do.
    let stats = app
        .call(Method::GET, &app.work_path("/stats"), Some(&secret), None)
        .await;
    stats.expect(200);

    // Two dashes work too; list never shows a secret, in JSON or as a table.
    let listed = stdout(&mango(
        &url,
        &["api-key", "list", "--workspace", "wrkspc_default", "--json"],
    ));
    assert!(
        !listed.contains(&secret) && !listed.contains("api_key"),
        "{listed}"
    );
    let keys: Vec<Value> = serde_json::from_str(&listed).unwrap();
    let row = keys
        .iter()
        .find(|k| k["id"] == id.as_str())
        .expect("the new key is listed");
    assert_eq!(row["label"], "pool");
    assert_eq!(row["revoked_at"], Value::Null);
    let table = stdout(&mango(
        &url,
        &["api-key", "list", "-workspace", "wrkspc_default"],
    ));
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains(&id) && !table.contains(&secret), "{table}");

    // Revoke: the key stops working at once.
    let revoked: Value = serde_json::from_str(&stdout(&mango(
        &url,
        &["api-key", "revoke", "-id", &id, "--json"],
    )))
    .unwrap();
    assert!(revoked["revoked_at"].is_string());
    let after = app
        .call(Method::GET, &app.work_path("/stats"), Some(&secret), None)
        .await;
    after.expect(401);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn api_key_errors_are_clear_and_change_nothing(db: sqlx::PgPool) {
    let url = database_url(&db);
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM api_keys")
        .fetch_one(&db)
        .await
        .unwrap();

    let out = mango(
        &url,
        &[
            "api-key",
            "create",
            "-workspace",
            "wrkspc_default",
            "-environment",
            "env_nope",
            "-label",
            "x",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("environment env_nope does not exist"), "{err}");

    let out = mango(
        &url,
        &[
            "api-key",
            "create",
            "-workspace",
            "wrkspc_nope",
            "-label",
            "x",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("workspace wrkspc_nope does not exist"));

    let out = mango(&url, &["api-key", "revoke", "-id", "key_nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no key with id key_nope"));

    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM api_keys")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(before, after);
}
