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

/// `mango serve`'s stderr (JSON log lines) until a line contains `until`,
/// at most 60 s; the server is stopped then. Its model settings come only
/// from `env` (whatever the test's own environment holds is removed), and
/// it listens on a free loopback port.
fn serve_log(url: &str, env: &[(&str, &str)], until: &str) -> Vec<String> {
    use std::io::BufRead;
    let objects = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mango"));
    command
        .arg("serve")
        .env("MANGO_DATABASE_URL", url)
        .env("MANGO_LISTEN_ADDR", "127.0.0.1:0")
        .env("MANGO_OBJECT_STORE", objects.path())
        .env("MANGO_LOG", "info")
        .env_remove("MANGO_MODEL_BASE_URL")
        .env_remove("MANGO_MODEL_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("mango serve starts");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(until);
                lines.push(line);
                if done {
                    break;
                }
            }
            Err(_) => {
                let _ = child.kill();
                panic!("no log line with {until:?} within 60 s: {lines:#?}");
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

fn line_with<'a>(lines: &'a [String], text: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.contains(text))
        .unwrap_or_else(|| panic!("no line with {text:?}: {lines:#?}"))
}

/// With only ANTHROPIC_API_KEY set, the api runs its agent loop on the
/// Anthropic API and says so when it starts, naming the variable the key
/// came from and never the key. (Nothing is sent: the loop calls the model
/// only for a Session's input, and this database has none.)
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn serve_uses_the_anthropic_api_with_anthropic_api_key_and_logs_it_without_the_key(
    db: sqlx::PgPool,
) {
    let url = database_url(&db);
    let key = "sk-ant-api03-never-in-a-log-line";
    let lines = tokio::task::spawn_blocking(move || {
        serve_log(&url, &[("ANTHROPIC_API_KEY", key)], "agent loop running")
    })
    .await
    .unwrap();
    let model: Value = serde_json::from_str(line_with(&lines, "model endpoint")).unwrap();
    assert_eq!(model["level"], "INFO");
    assert_eq!(
        model["fields"]["model"],
        "https://api.anthropic.com (the Anthropic API), key from ANTHROPIC_API_KEY"
    );
    let running: Value = serde_json::from_str(line_with(&lines, "agent loop running")).unwrap();
    assert_eq!(
        running["fields"]["model_base_url"],
        "https://api.anthropic.com"
    );
    assert!(
        lines.iter().all(|l| !l.contains(key)),
        "the key is in the log: {lines:#?}"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn serve_without_a_model_warns_that_sessions_get_errors(db: sqlx::PgPool) {
    let url = database_url(&db);
    let lines =
        tokio::task::spawn_blocking(move || serve_log(&url, &[], "agent loop without a model"))
            .await
            .unwrap();
    let warning: Value =
        serde_json::from_str(line_with(&lines, "agent loop without a model")).unwrap();
    assert_eq!(warning["level"], "WARN");
    let text = warning["fields"]["message"].as_str().unwrap();
    assert!(
        text.contains("MANGO_MODEL_BASE_URL") && text.contains("ANTHROPIC_API_KEY"),
        "{text}"
    );
    assert!(!lines.iter().any(|l| l.contains("model endpoint")));
}

/// A pool of two would stall every Session step (the LISTEN connection
/// keeps one, and a step's lock the other its queries need): refused by
/// name; three is taken (`agent_loop::a_pool_of_three_steps_…` runs turns on it).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_database_pool_of_fewer_than_three_connections_is_refused(db: sqlx::PgPool) {
    let url = database_url(&db);
    let list = |connections: &str| {
        Command::new(env!("CARGO_BIN_EXE_mango"))
            .args(["api-key", "list", "-workspace", "wrkspc_default"])
            .env("MANGO_DATABASE_URL", &url)
            .env("MANGO_DB_MAX_CONNECTIONS", connections)
            .output()
            .expect("mango runs")
    };
    let refused = list("2");
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("db-max-connections") && err.contains("3.."),
        "{err}"
    );
    stdout(&list("3"));
}
