//! Credentials and scopes (spec §2): every endpoint against every kind of
//! credential, and the lifetime of a sessions token.
//!
//! Valid credentials used outside their scope get 403 `permission_error`;
//! invalid, revoked or expired ones 401 `authentication_error`. A refused
//! request changes nothing.

use mango_testkit::*;

use mango_api::store::keys;
use mango_protocol::time;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

const NO_HB: &str = "NO_HEARTBEAT";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Cred {
    Workspace,
    /// Bound to the Environment the request addresses.
    EnvKey,
    /// Bound to another Environment of the same workspace.
    OtherEnvKey,
    /// The live sessions token of the Work the request addresses.
    Token,
    /// The live sessions token of another Work item.
    OtherToken,
    RevokedWorkspace,
    RevokedEnvKey,
    Garbage,
    /// Well-formed prefixes, never issued.
    ForgedWorkspace,
    ForgedToken,
    Missing,
}

/// The columns of [`SCOPES`].
const VALID: [Cred; 5] = [
    Cred::Workspace,
    Cred::EnvKey,
    Cred::OtherEnvKey,
    Cred::Token,
    Cred::OtherToken,
];
/// Always 401, whatever the endpoint.
const INVALID: [Cred; 6] = [
    Cred::RevokedWorkspace,
    Cred::RevokedEnvKey,
    Cred::Garbage,
    Cred::ForgedWorkspace,
    Cred::ForgedToken,
    Cred::Missing,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ep {
    Create,
    Get,
    Update,
    List,
    Stats,
    Poll,
    Ack,
    Heartbeat,
    Result,
    Fail,
    Stop,
    EnvCreate,
    EnvGet,
    EnvList,
    EnvUpdate,
    EnvArchive,
    EnvDelete,
}

/// Spec §2 as a table: the status each valid credential gets.
#[rustfmt::skip]
const SCOPES: [(Ep, [u16; 5]); 17] = [
    //                Workspace  EnvKey  OtherEnvKey  Token  OtherToken
    (Ep::Create,     [201,       403,    403,         403,   403]),
    (Ep::Get,        [200,       403,    403,         403,   403]),
    (Ep::Update,     [200,       403,    403,         403,   403]),
    (Ep::List,       [200,       403,    403,         403,   403]),
    (Ep::Stats,      [200,       200,    403,         403,   403]),
    (Ep::Poll,       [403,       200,    403,         403,   403]),
    (Ep::Ack,        [403,       200,    403,         403,   403]),
    (Ep::Heartbeat,  [403,       403,    403,         200,   403]),
    (Ep::Result,     [403,       403,    403,         200,   403]),
    (Ep::Fail,       [403,       403,    403,         200,   403]),
    (Ep::Stop,       [204,       403,    403,         204,   403]),
    (Ep::EnvCreate,  [200,       403,    403,         403,   403]),
    (Ep::EnvGet,     [200,       403,    403,         403,   403]),
    (Ep::EnvList,    [200,       403,    403,         403,   403]),
    (Ep::EnvUpdate,  [200,       403,    403,         403,   403]),
    (Ep::EnvArchive, [200,       403,    403,         403,   403]),
    (Ep::EnvDelete,  [200,       403,    403,         403,   403]),
];

/// Credentials that live for the whole test.
struct Standing {
    other_env_key: String,
    revoked_ws: String,
    revoked_env: String,
}

/// What one request addresses, freshly made for it.
struct Target {
    env: String,
    env_key: String,
    work: String,
    token: String,
    last_heartbeat: String,
    other_token: String,
}

impl Ep {
    fn is_environment_endpoint(self) -> bool {
        matches!(
            self,
            Ep::EnvCreate
                | Ep::EnvGet
                | Ep::EnvList
                | Ep::EnvUpdate
                | Ep::EnvArchive
                | Ep::EnvDelete
        )
    }

    fn request(self, t: &Target) -> (Method, String, Option<Value>) {
        let work = format!("/v1/environments/{}/work", t.env);
        let item = format!("{work}/{}", t.work);
        let env = format!("/v1/environments/{}", t.env);
        match self {
            Ep::Create => (
                Method::POST,
                work,
                Some(json!({"data": {"type": "healthcheck"}})),
            ),
            Ep::Get => (Method::GET, item, None),
            Ep::Update => (Method::POST, item, Some(json!({"metadata": {"k": "v"}}))),
            Ep::List => (Method::GET, work, None),
            Ep::Stats => (Method::GET, format!("{work}/stats"), None),
            Ep::Poll => (Method::GET, format!("{work}/poll"), None),
            Ep::Ack => (Method::POST, format!("{item}/ack"), None),
            Ep::Heartbeat => (
                Method::POST,
                format!(
                    "{item}/heartbeat?expected_last_heartbeat={}",
                    urlencode(&t.last_heartbeat)
                ),
                None,
            ),
            Ep::Result => (
                Method::POST,
                format!("{item}/result"),
                Some(json!({"status": "succeeded", "message": "ok"})),
            ),
            Ep::Fail => (
                Method::POST,
                format!("{item}/fail"),
                Some(json!({"error": {"message": "bad input"}})),
            ),
            Ep::Stop => (
                Method::POST,
                format!("{item}/stop"),
                Some(json!({"force": true})),
            ),
            Ep::EnvCreate => (
                Method::POST,
                "/v1/environments".into(),
                Some(json!({"name": "made by the matrix"})),
            ),
            Ep::EnvGet => (Method::GET, env, None),
            Ep::EnvList => (Method::GET, "/v1/environments".into(), None),
            Ep::EnvUpdate => (Method::POST, env, Some(json!({"name": "renamed"}))),
            Ep::EnvArchive => (Method::POST, format!("{env}/archive"), None),
            Ep::EnvDelete => (Method::DELETE, env, None),
        }
    }
}

fn forged(prefix: &str) -> String {
    format!("{prefix}{}", "A".repeat(43))
}

async fn revoke(app: &TestApp, key_id: &str) {
    keys::revoke(&app.db, key_id, time::now())
        .await
        .unwrap()
        .expect("the key exists");
}

async fn standing(app: &TestApp) -> Standing {
    let other_env = app.create_environment("another env").await;
    let (_, other_env_key) = app.environment_key(&other_env).await;
    let (ws_row, revoked_ws) = keys::create(&app.db, "wrkspc_default", None, "old", time::now())
        .await
        .unwrap();
    revoke(app, &ws_row.id).await;
    let (env_key_id, revoked_env) = app.environment_key(&app.env_id).await;
    revoke(app, &env_key_id).await;
    Standing {
        other_env_key,
        revoked_ws,
        revoked_env,
    }
}

/// Two active items in the test Environment; Environment endpoints address a
/// fresh Environment (with its own key) so archive and delete can succeed.
async fn target(app: &TestApp, ep: Ep) -> Target {
    let (claim, last_heartbeat) = app.active_check().await;
    let (other, _) = app.active_check().await;
    let (env, env_key) = if ep.is_environment_endpoint() {
        let env = app.create_environment("matrix target").await;
        let (_, key) = app.environment_key(&env).await;
        (env, key)
    } else {
        (app.env_id.clone(), app.env_key.clone())
    };
    if ep == Ep::Poll {
        app.create_check().await;
    }
    Target {
        env,
        env_key,
        work: claim.id,
        token: claim.token,
        last_heartbeat,
        other_token: other.token,
    }
}

fn secret_of(cred: Cred, app: &TestApp, s: &Standing, t: &Target) -> Option<String> {
    Some(match cred {
        Cred::Workspace => app.ws_key.clone(),
        Cred::EnvKey => t.env_key.clone(),
        Cred::OtherEnvKey => s.other_env_key.clone(),
        Cred::Token => t.token.clone(),
        Cred::OtherToken => t.other_token.clone(),
        Cred::RevokedWorkspace => s.revoked_ws.clone(),
        Cred::RevokedEnvKey => s.revoked_env.clone(),
        Cred::Garbage => "garbage".into(),
        Cred::ForgedWorkspace => forged("mango_wsk_"),
        Cred::ForgedToken => forged("mango_st_"),
        Cred::Missing => return None,
    })
}

/// Everything a request could have changed, as the operator sees it.
async fn world(app: &TestApp, t: &Target) -> Value {
    let mut out = serde_json::Map::new();
    for (name, path) in [
        (
            "envs",
            "/v1/environments?include_archived=true&limit=100".to_string(),
        ),
        ("env", format!("/v1/environments/{}", t.env)),
        ("work", format!("/v1/environments/{}/work?limit=100", t.env)),
        ("stats", format!("/v1/environments/{}/work/stats", t.env)),
    ] {
        let r = app.call(Method::GET, &path, Some(&app.ws_key), None).await;
        r.expect(200);
        let mut body = r.body;
        if name == "work" {
            // A lease's time left moves with the clock, not with any write.
            for work in body["data"].as_array_mut().unwrap() {
                work["lease"]
                    .as_object_mut()
                    .expect("a Workspace key reads the lease")
                    .remove("remaining_ms");
            }
        }
        out.insert(name.into(), body);
    }
    Value::Object(out)
}

async fn run_matrix(db: sqlx::PgPool, ep: Ep) {
    let app = TestApp::start(db).await;
    let s = standing(&app).await;
    let (_, row) = SCOPES.iter().find(|(e, _)| *e == ep).unwrap();
    let cases = VALID
        .iter()
        .zip(row.iter().copied())
        .chain(INVALID.iter().map(|c| (c, 401)));
    for (&cred, want) in cases {
        let t = target(&app, ep).await;
        let (method, path, body) = ep.request(&t);
        let before = if want >= 400 {
            Some(world(&app, &t).await)
        } else {
            None
        };
        let credential = secret_of(cred, &app, &s, &t);
        let r = app.call(method, &path, credential.as_deref(), body).await;
        assert_eq!(
            r.status.as_u16(),
            want,
            "{ep:?} with {cred:?}: body {}",
            r.body
        );
        r.expect(want);
        match want {
            401 => assert_eq!(
                r.error_type(),
                Some("authentication_error"),
                "{ep:?} {cred:?}"
            ),
            403 => assert_eq!(r.error_type(), Some("permission_error"), "{ep:?} {cred:?}"),
            _ => {}
        }
        if let Some(before) = before {
            assert_eq!(
                world(&app, &t).await,
                before,
                "{ep:?} refused to {cred:?} changed nothing"
            );
        } else if ep == Ep::Poll {
            assert!(
                r.body["secret"].is_string(),
                "a successful Poll claims an item"
            );
        }
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_work_create(db: sqlx::PgPool) {
    run_matrix(db, Ep::Create).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_work_get(db: sqlx::PgPool) {
    run_matrix(db, Ep::Get).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_work_update(db: sqlx::PgPool) {
    run_matrix(db, Ep::Update).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_work_list(db: sqlx::PgPool) {
    run_matrix(db, Ep::List).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_work_stats(db: sqlx::PgPool) {
    run_matrix(db, Ep::Stats).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_poll(db: sqlx::PgPool) {
    run_matrix(db, Ep::Poll).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_ack(db: sqlx::PgPool) {
    run_matrix(db, Ep::Ack).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_heartbeat(db: sqlx::PgPool) {
    run_matrix(db, Ep::Heartbeat).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_result(db: sqlx::PgPool) {
    run_matrix(db, Ep::Result).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_fail(db: sqlx::PgPool) {
    run_matrix(db, Ep::Fail).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_stop(db: sqlx::PgPool) {
    run_matrix(db, Ep::Stop).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_environment_create(db: sqlx::PgPool) {
    run_matrix(db, Ep::EnvCreate).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_environment_get(db: sqlx::PgPool) {
    run_matrix(db, Ep::EnvGet).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_environment_list(db: sqlx::PgPool) {
    run_matrix(db, Ep::EnvList).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_environment_update(db: sqlx::PgPool) {
    run_matrix(db, Ep::EnvUpdate).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_environment_archive(db: sqlx::PgPool) {
    run_matrix(db, Ep::EnvArchive).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn scope_of_environment_delete(db: sqlx::PgPool) {
    run_matrix(db, Ep::EnvDelete).await;
}

// ------------------------------------------------------------------ how credentials are presented

async fn send(req: reqwest::RequestBuilder) -> Reply {
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply {
        status,
        headers,
        body,
    }
}

#[track_caller]
fn assert_401(r: &Reply) {
    r.expect(401);
    assert_eq!(r.error_type(), Some("authentication_error"), "{}", r.body);
}

#[track_caller]
fn assert_403(r: &Reply) {
    r.expect(403);
    assert_eq!(r.error_type(), Some("permission_error"), "{}", r.body);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn x_api_key_carries_workspace_keys_only(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, last) = app.active_check().await;
    let env_url = format!("{}/v1/environments/{}", app.base, app.env_id);
    let r = send(app.http.get(&env_url).header("x-api-key", &app.ws_key)).await;
    r.expect(200);
    assert_eq!(r.body["id"], app.env_id);

    let stats_url = format!("{}{}", app.base, app.work_path("/stats"));
    let r = send(app.http.get(&stats_url).header("x-api-key", &app.env_key)).await;
    assert_401(&r);
    let hb_url = format!(
        "{}{}?expected_last_heartbeat={}",
        app.base,
        app.work_path(&format!("/{}/heartbeat", claim.id)),
        urlencode(&last)
    );
    let r = send(app.http.post(&hb_url).header("x-api-key", &claim.token)).await;
    assert_401(&r);
    // The refused beat changed nothing; the Bearer form works.
    app.heartbeat(&claim.id, &claim.token, &last)
        .await
        .expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn authorization_must_be_a_bearer_credential(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let env_url = format!("{}/v1/environments/{}", app.base, app.env_id);
    for value in [
        format!("Basic {}", app.ws_key),
        "Bearer ".to_string(),
        "Bearer".to_string(),
        app.ws_key.clone(),
    ] {
        let r = send(app.http.get(&env_url).header("authorization", value)).await;
        assert_401(&r);
    }
    let r = send(
        app.http
            .get(&env_url)
            .header("authorization", format!("bearer {}", app.ws_key)),
    )
    .await;
    r.expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn workspace_id_header_must_match_the_key(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let env_url = format!("{}/v1/environments/{}", app.base, app.env_id);
    let r = send(
        app.http
            .get(&env_url)
            .bearer_auth(&app.ws_key)
            .header("anthropic-workspace-id", "wrkspc_default"),
    )
    .await;
    r.expect(200);
    let r = send(
        app.http
            .get(&env_url)
            .bearer_auth(&app.ws_key)
            .header("anthropic-workspace-id", "wrkspc_other"),
    )
    .await;
    assert_403(&r);

    app.create_check().await;
    let poll_url = format!("{}{}", app.base, app.work_path("/poll"));
    let r = send(
        app.http
            .get(&poll_url)
            .bearer_auth(&app.env_key)
            .header("anthropic-workspace-id", "wrkspc_other"),
    )
    .await;
    assert_403(&r);
    assert!(
        app.poll().await.is_some(),
        "the refused Poll claimed nothing"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn workspace_key_of_another_workspace_sees_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    sqlx::query("INSERT INTO workspaces (id, name) VALUES ('wrkspc_other', 'Other')")
        .execute(&app.db)
        .await
        .unwrap();
    let (_, foreign) = keys::create(&app.db, "wrkspc_other", None, "other", time::now())
        .await
        .unwrap();
    let id = app.create_check().await;

    let r = app
        .call(Method::GET, "/v1/environments", Some(&foreign), None)
        .await;
    r.expect(200);
    assert_eq!(r.body["data"], json!([]));
    for (method, path, body) in [
        (
            Method::GET,
            format!("/v1/environments/{}", app.env_id),
            None,
        ),
        (
            Method::DELETE,
            format!("/v1/environments/{}", app.env_id),
            None,
        ),
        (Method::GET, app.work_path(&format!("/{id}")), None),
        (Method::GET, app.work_path(""), None),
        (
            Method::POST,
            app.work_path(""),
            Some(json!({"data": {"type": "healthcheck"}})),
        ),
        (
            Method::POST,
            app.work_path(&format!("/{id}/stop")),
            Some(json!({"force": true})),
        ),
    ] {
        let r = app.call(method, &path, Some(&foreign), body).await;
        r.expect(404);
        assert_eq!(r.code(), Some("environment_not_found"), "{path}");
    }
    assert_eq!(app.get_work(&id).await["state"], "queued");
}

// ------------------------------------------------------------------ the sessions token's lifetime

async fn token_call(app: &TestApp, id: &str, token: &str, action: &str, last: &str) -> Reply {
    let (path, body) = match action {
        "heartbeat" => (
            format!(
                "/{id}/heartbeat?expected_last_heartbeat={}",
                urlencode(last)
            ),
            None,
        ),
        "stop" => (format!("/{id}/stop"), Some(json!({"force": true}))),
        "fail" => (
            format!("/{id}/fail"),
            Some(json!({"error": {"message": "bad input"}})),
        ),
        "result" => (
            format!("/{id}/result"),
            Some(json!({"status": "succeeded", "message": "ok"})),
        ),
        "get" => {
            return app
                .call(
                    Method::GET,
                    &app.work_path(&format!("/{id}")),
                    Some(token),
                    None,
                )
                .await
        }
        other => panic!("unknown action {other}"),
    };
    app.call(Method::POST, &app.work_path(&path), Some(token), body)
        .await
}

const TOKEN_ACTIONS: [&str; 5] = ["heartbeat", "stop", "fail", "result", "get"];

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn token_before_ack_is_401(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let claim = app.poll().await.unwrap();
    for action in TOKEN_ACTIONS {
        let r = token_call(&app, &claim.id, &claim.token, action, NO_HB).await;
        assert_401(&r);
    }
    let w = app.get_work(&claim.id).await;
    assert_eq!(w["state"], "queued");
    app.ack(&claim.id).await.expect(200);
    app.heartbeat(&claim.id, &claim.token, NO_HB)
        .await
        .expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn token_after_stop_is_401(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, last) = app.active_check().await;
    app.stop_work(&claim.id, true).await;
    for action in TOKEN_ACTIONS {
        let r = token_call(&app, &claim.id, &claim.token, action, &last).await;
        assert_401(&r);
    }
    assert_eq!(
        app.get_work(&claim.id).await["result"]["status"],
        "cancelled"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn token_in_the_result_window_may_only_repeat_the_result(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (claim, last) = app.active_check().await;
    let stored = token_call(&app, &claim.id, &claim.token, "result", &last).await;
    stored.expect(200);
    for action in ["heartbeat", "stop", "fail", "get"] {
        let r = token_call(&app, &claim.id, &claim.token, action, &last).await;
        assert_401(&r);
    }
    let again = token_call(&app, &claim.id, &claim.token, "result", &last).await;
    again.expect(200);
    assert_eq!(again.body, stored.body);
    let mut read = app.get_work(&claim.id).await;
    read.as_object_mut().unwrap().remove("lease"); // the holder's answer has none
    assert_eq!(read, stored.body);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn token_of_a_lapsed_lease_is_401_and_its_heartbeat_412(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let claim = app.poll().await.unwrap();
    app.ack(&claim.id).await.expect(200);
    let r = app
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
    r.expect(200);
    let last = r.body["last_heartbeat"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for action in ["stop", "fail", "result", "get"] {
        let r = token_call(&app, &claim.id, &claim.token, action, &last).await;
        assert_401(&r);
    }
    // The holder learns it lost the lease the way the SDK expects: 412.
    let r = token_call(&app, &claim.id, &claim.token, "heartbeat", &last).await;
    r.expect(412);
    assert_eq!(r.code(), Some("heartbeat_precondition_failed"));
    assert_eq!(app.get_work(&claim.id).await["state"], "active");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn token_is_bound_to_its_own_work(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (mine, last) = app.active_check().await;
    let (theirs, _) = app.active_check().await;
    let other_env = app.create_environment("other").await;
    // Another item's path, or this item under another Environment's path: 403.
    for path in [
        app.work_path(&format!(
            "/{}/heartbeat?expected_last_heartbeat={}",
            theirs.id,
            urlencode(&last)
        )),
        format!(
            "/v1/environments/{other_env}/work/{}/heartbeat?expected_last_heartbeat={}",
            mine.id,
            urlencode(&last)
        ),
    ] {
        let r = app.call(Method::POST, &path, Some(&mine.token), None).await;
        assert_403(&r);
    }
    app.heartbeat(&mine.id, &mine.token, &last)
        .await
        .expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn revoked_environment_key_can_no_longer_poll_or_ack(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    let claim = app.poll().await.unwrap();
    revoke(&app, &app.env_key_id).await;
    assert_401(&app.ack(&claim.id).await);
    let r = app
        .call(
            Method::GET,
            &app.work_path("/poll"),
            Some(&app.env_key),
            None,
        )
        .await;
    assert_401(&r);
    assert_eq!(app.get_work(&claim.id).await["state"], "queued");

    // A new key for the same Environment acks the pending claim.
    let (_, fresh) = app.environment_key(&app.env_id).await;
    let r = app
        .call(
            Method::POST,
            &app.work_path(&format!("/{}/ack", claim.id)),
            Some(&fresh),
            None,
        )
        .await;
    r.expect(200);
    assert_eq!(r.body["state"], "starting");
}
