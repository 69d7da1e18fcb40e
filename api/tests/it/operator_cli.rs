//! The operator's commands (`mango work|sessions|environments`), run as the
//! built `mango` binary against a live api, as an operator would run them.
use mango_api::clock::ManualClock;
use mango_protocol::time;
use mango_testkit::{append_agent_events, user_message, TestApp};
use reqwest::Method;
use serde_json::{json, Value};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::sync::Notify;

/// The exit codes docs/operator-cli.md promises.
const NOT_FOUND: i32 = 3;
const UNAUTHORIZED: i32 = 4;
const UNREACHABLE: i32 = 5;
const USAGE: i32 = 2;

fn command(base: &str, key: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mango"));
    c.args(args)
        .env("MANGO_BASE_URL", base)
        .env("MANGO_API_KEY", key)
        .kill_on_drop(true);
    c
}

async fn mango(app: &TestApp, args: &[&str]) -> Output {
    command(&app.base, &app.ws_key, args)
        .output()
        .await
        .expect("mango runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "mango failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn json_out(out: &Output) -> Value {
    serde_json::from_str(&stdout(out)).expect("--json prints JSON")
}

fn ids(listed: &Value) -> Vec<String> {
    listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_string())
        .collect()
}

/// The one line a failed command prints, checked to be exactly one line.
fn error_line(out: &Output, code: i32) -> String {
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("error: "), "{err:?}");
    err
}

async fn create_check_in(app: &TestApp, env: &str) -> String {
    let r = app
        .call(
            Method::POST,
            &format!("/v1/environments/{env}/work"),
            Some(&app.ws_key),
            Some(json!({"data": {"type": "healthcheck"}})),
        )
        .await;
    r.expect(201);
    r.body["id"].as_str().unwrap().to_string()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn work_is_listed_across_environments_got_and_stopped(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let first = app.create_check().await;
    let second = app.create_check().await;
    let other_env = app.create_environment("other").await;
    let elsewhere = create_check_in(&app, &other_env).await;

    // Without --environment: every Environment's Work, newest first.
    let listed = json_out(&mango(&app, &["work", "list", "--json"]).await);
    assert_eq!(
        ids(&listed),
        [elsewhere.clone(), second.clone(), first.clone()]
    );
    assert_eq!(listed[0]["environment_id"], other_env.as_str());
    assert_eq!(listed[0]["data"]["type"], "healthcheck");

    // One Environment's; a state filter.
    let mine = json_out(
        &mango(
            &app,
            &["work", "list", "--environment", &app.env_id, "--json"],
        )
        .await,
    );
    assert_eq!(ids(&mine), [second.clone(), first.clone()]);

    // The table: a header, a row per item, aligned.
    let table = stdout(&mango(&app, &["work", "list"]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(lines[0].starts_with("ID "), "{table}");
    for column in [
        "ENVIRONMENT",
        "TYPE",
        "STATE",
        "AGE",
        "CLAIM",
        "WORKER",
        "LEASE LEFT",
        "RESULT",
    ] {
        assert!(lines[0].contains(column), "{column} in {table}");
    }
    let state_at = lines[0].find("STATE").unwrap();
    for (line, id) in lines[1..].iter().zip([&elsewhere, &second, &first]) {
        assert!(line.starts_with(id.as_str()), "{table}");
        assert_eq!(&line[state_at..state_at + 6], "queued", "aligned: {table}");
        assert!(line.contains("healthcheck"), "{table}");
    }

    // Get finds the item's Environment itself.
    let got = json_out(&mango(&app, &["work", "get", &elsewhere, "--json"]).await);
    assert_eq!(got["id"], elsewhere.as_str());
    assert_eq!(got["environment_id"], other_env.as_str());
    let shown = stdout(&mango(&app, &["work", "get", &first]).await);
    assert!(
        shown.contains(&first) && shown.contains("queued"),
        "{shown}"
    );

    // Stop: a queued item stops at once; again, it says so and succeeds.
    let stopped = json_out(&mango(&app, &["work", "stop", &first, "--json"]).await);
    assert_eq!(stopped["state"], "stopped");
    assert_eq!(app.get_work(&first).await["state"], "stopped");
    let again = stdout(&mango(&app, &["work", "stop", &first]).await);
    assert!(again.contains("already stopped"), "{again}");

    let queued = json_out(&mango(&app, &["work", "list", "--state", "queued", "--json"]).await);
    assert_eq!(ids(&queued), [elsewhere.clone(), second.clone()]);
    let stopped_only =
        json_out(&mango(&app, &["work", "list", "--state", "stopped", "--json"]).await);
    assert_eq!(ids(&stopped_only), std::slice::from_ref(&first));

    // What is not there.
    let missing = mango(&app, &["work", "get", "work_nope"]).await;
    let err = error_line(&missing, NOT_FOUND);
    assert!(err.contains("work_nope"), "{err}");
    let missing = mango(
        &app,
        &["work", "stop", "work_nope", "--environment", &app.env_id],
    )
    .await;
    error_line(&missing, NOT_FOUND);
    let bad_state = mango(&app, &["work", "list", "--state", "running"]).await;
    assert_eq!(bad_state.status.code(), Some(USAGE), "{bad_state:?}");
}

/// The cell of `column` in `line`, `header`'s columns being aligned.
fn cell<'a>(header: &str, line: &'a str, column: &str) -> &'a str {
    let at = header
        .find(column)
        .unwrap_or_else(|| panic!("{column} in {header}"));
    line[at..].split("  ").next().unwrap().trim()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn work_shows_its_claim_worker_and_the_lease_left_by_the_apis_clock(db: sqlx::PgPool) {
    // The api's clock is 400 days behind this machine's: a CLI that
    // counted the lease from its own clock would call it long expired.
    let clock = ManualClock::starting_at(time::now() - chrono::Duration::days(400));
    let app = TestApp::start_on_clock(db, clock.clone()).await;
    let held = app.create_check().await;
    clock.advance(chrono::Duration::seconds(1)); // so the two are ordered by time
    let unclaimed = app.create_check().await;
    let polled = app
        .http
        .get(format!("{}{}", app.base, app.work_path("/poll")))
        .bearer_auth(&app.env_key)
        .header("Anthropic-Worker-ID", "worker-7")
        .send()
        .await
        .unwrap();
    assert_eq!(polled.status(), 200);
    let claimed: Value = polled.json().await.unwrap();
    // Poll takes the oldest, the first made.
    assert_eq!(claimed["id"], held.as_str());
    app.ack(&held).await.expect(200);
    clock.advance(chrono::Duration::seconds(75));

    let table = stdout(&mango(&app, &["work", "list"]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let (header, newest, oldest) = (lines[0], lines[1], lines[2]);
    assert!(newest.starts_with(unclaimed.as_str()), "{table}");
    for column in ["CLAIM", "WORKER", "LEASE LEFT"] {
        assert_eq!(
            cell(header, newest, column),
            "-",
            "{column} of the unclaimed: {table}"
        );
    }
    assert_eq!(cell(header, oldest, "CLAIM"), "1", "{table}");
    assert_eq!(cell(header, oldest, "WORKER"), "worker-7", "{table}");
    assert_eq!(cell(header, oldest, "LEASE LEFT"), "45s", "{table}");

    let shown = stdout(&mango(&app, &["work", "get", &held]).await);
    let field = |name: &str| {
        shown
            .lines()
            .find(|l| l.starts_with(&format!("{name}  ")))
            .unwrap_or_else(|| panic!("{name} in {shown}"))[name.len()..]
            .trim()
            .to_string()
    };
    assert_eq!(field("claim"), "1", "{shown}");
    assert_eq!(field("worker"), "worker-7", "{shown}");
    assert_eq!(field("lease left"), "45s", "{shown}");
    let listed = json_out(&mango(&app, &["work", "list", "--json"]).await);
    assert_eq!(listed[1]["lease"]["remaining_ms"], 45_000, "{listed}");
    assert_eq!(listed[1]["lease"]["worker_id"], "worker-7");

    // Past its end the lease shows as expired (the item waits for a
    // reclaim); a short TTL ends it before the check's 120 s deadline.
    let token = mango_testkit::claim_of(claimed).token;
    app.call(
        Method::POST,
        &app.work_path(&format!(
            "/{held}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT&desired_ttl_seconds=10"
        )),
        Some(&token),
        None,
    )
    .await
    .expect(200);
    clock.advance(chrono::Duration::seconds(11));
    let table = stdout(&mango(&app, &["work", "list", "--environment", &app.env_id]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(cell(lines[0], lines[2], "LEASE LEFT"), "expired", "{table}");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn work_list_follows_pages_up_to_its_limit_and_says_when_there_is_more(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let mut created = Vec::new();
    for _ in 0..130 {
        created.push(app.create_check().await);
    }
    created.reverse(); // newest first, as listed

    let all = mango(
        &app,
        &[
            "work",
            "list",
            "--environment",
            &app.env_id,
            "--limit",
            "1000",
            "--json",
        ],
    )
    .await;
    assert_eq!(
        ids(&json_out(&all)),
        created,
        "every page, in order, once each"
    );
    assert!(all.stderr.is_empty(), "nothing more to say: {all:?}");

    // Past one page (100) and short of the end: exactly the limit, and a note.
    let some = mango(
        &app,
        &[
            "work",
            "list",
            "--environment",
            &app.env_id,
            "--limit",
            "120",
            "--json",
        ],
    )
    .await;
    assert_eq!(ids(&json_out(&some)), created[..120]);
    let note = String::from_utf8(some.stderr.clone()).unwrap();
    assert!(note.contains("--limit"), "says there is more: {note:?}");

    // The default limit is 100.
    let default = mango(&app, &["work", "list", "--json"]).await;
    assert_eq!(ids(&json_out(&default)), created[..100]);

    // A limit out of range is a usage error.
    let zero = mango(&app, &["work", "list", "--limit", "0"]).await;
    assert_eq!(zero.status.code(), Some(USAGE));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_bad_key_an_absent_key_and_an_unreachable_api_fail_in_one_line(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let bogus = "mango_ws_not_a_real_key_0123456789";
    for args in [
        &["work", "list"][..],
        &["sessions", "list"],
        &["environments", "list"],
    ] {
        let out = command(&app.base, bogus, args).output().await.unwrap();
        let err = error_line(&out, UNAUTHORIZED);
        assert!(
            !err.contains(bogus) && !err.contains("not_a_real_key"),
            "{err}"
        );
    }
    // An Environment key is refused what only a Workspace key may do.
    let out = command(&app.base, &app.env_key, &["sessions", "list"])
        .output()
        .await
        .unwrap();
    let err = error_line(&out, UNAUTHORIZED);
    assert!(!err.contains(&app.env_key), "{err}");

    // Nothing listens on a port just released.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base = format!("http://127.0.0.1:{port}");
    let out = command(&base, &app.ws_key, &["work", "list"])
        .output()
        .await
        .unwrap();
    let err = error_line(&out, UNREACHABLE);
    assert!(err.contains(&base), "names where it looked: {err}");
    assert!(!err.contains(&app.ws_key), "{err}");

    let out = command(&app.base, "", &["environments", "list"])
        .output()
        .await
        .unwrap();
    let err = error_line(&out, USAGE);
    assert!(err.contains("MANGO_API_KEY"), "{err}");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn environments_list_shows_each_queue(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    app.create_check().await;
    app.create_check().await;
    let other = app.create_environment("quiet").await;

    let listed = json_out(&mango(&app, &["environments", "list", "--json"]).await);
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{listed}");
    let mine = rows
        .iter()
        .find(|r| r["environment"]["id"] == app.env_id.as_str())
        .unwrap();
    assert_eq!(mine["stats"]["depth"], 2);
    assert!(mine["stats"]["oldest_queued_at"].is_string());
    let quiet = rows
        .iter()
        .find(|r| r["environment"]["id"] == other.as_str())
        .unwrap();
    assert_eq!(quiet["stats"]["depth"], 0);
    assert_eq!(quiet["environment"]["name"], "quiet");

    let table = stdout(&mango(&app, &["environments", "list"]).await);
    let row = table
        .lines()
        .find(|l| l.starts_with(&app.env_id))
        .expect("a row");
    let header = table.lines().next().unwrap();
    let depth_at = header.find("DEPTH").unwrap();
    assert_eq!(&row[depth_at..depth_at + 1], "2", "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&other) && l.contains("quiet")),
        "{table}"
    );
}

/// A Session with input (so it has live Work), a tool call and its
/// result, an error, and the end of its turn.
async fn session_with_events(app: &TestApp) -> (String, String) {
    let s = app.create_session().await;
    app.send(&s, json!([user_message("run ls please")]))
        .await
        .expect(200);
    let work = app.session_work(&s).await;
    assert_eq!(work.len(), 1);
    append_agent_events(
        &app.db,
        &s,
        vec![
            json!({"type": "agent.tool_use", "name": "bash", "input": {"command": "ls -la /tmp"}}),
            json!({"type": "session.error", "error": {"type": "model_overloaded_error",
                "message": "the model is overloaded", "retry_status": {"type": "retrying"}}}),
            json!({"type": "agent.message", "content": [{"type": "text", "text": "Here are the files."}]}),
        ],
    )
    .await
    .unwrap();
    (s, work[0].0.clone())
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sessions_show_their_status_live_work_last_error_and_events(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, work) = session_with_events(&app).await;
    let quiet = app.create_session().await;

    let listed = json_out(&mango(&app, &["sessions", "list", "--json"]).await);
    assert_eq!(ids(&listed), [quiet.clone(), s.clone()]);
    assert_eq!(listed[1]["environment_id"], app.env_id.as_str());

    let table = stdout(&mango(&app, &["sessions", "list"]).await);
    let row = table.lines().find(|l| l.starts_with(&s)).expect("a row");
    assert!(row.contains(&work), "its live Work: {table}");
    assert!(row.contains(&app.env_id), "{table}");
    assert!(
        row.contains("model_overloaded_error: the model is overloaded"),
        "{table}"
    );
    let quiet_row = table
        .lines()
        .find(|l| l.starts_with(&quiet))
        .expect("a row");
    assert!(
        !quiet_row.contains("work_") && !quiet_row.contains("error"),
        "{table}"
    );

    let got = stdout(&mango(&app, &["sessions", "get", &s]).await);
    assert!(
        got.contains(&work) && got.contains("the model is overloaded"),
        "{got}"
    );
    let got = json_out(&mango(&app, &["sessions", "get", &s, "--json"]).await);
    assert_eq!(got["id"], s.as_str());
    let missing = mango(&app, &["sessions", "get", "sesn_nope"]).await;
    error_line(&missing, NOT_FOUND);

    // The tail: one line per event, with what it says.
    let tail = stdout(&mango(&app, &["sessions", "events", &s]).await);
    let lines: Vec<&str> = tail.lines().collect();
    assert_eq!(lines.len(), app.all_events(&s).await.len(), "{tail}");
    let line_of = |kind: &str| {
        *lines
            .iter()
            .find(|l| l.split_whitespace().nth(2) == Some(kind))
            .unwrap_or_else(|| panic!("a {kind} line in {tail}"))
    };
    assert!(line_of("user.message").ends_with("run ls please"), "{tail}");
    assert!(
        line_of("agent.tool_use").ends_with("bash  ls -la /tmp"),
        "{tail}"
    );
    assert!(line_of("session.error").ends_with("model_overloaded_error: the model is overloaded"));
    assert!(line_of("agent.message").ends_with("Here are the files."));
    let events = json_out(&mango(&app, &["sessions", "events", &s, "--json"]).await);
    assert_eq!(ids(&events), ids(&Value::Array(app.all_events(&s).await)));
}

/// Reads `child`'s stdout lines into a channel.
fn lines_of(child: &mut tokio::process::Child) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = out.next_line().await {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

async fn next_line(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("a line within 30 s")
        .expect("the command is still printing")
}

async fn exits(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("exits within 30 s")
        .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn following_prints_new_events_and_stops_when_the_turn_ends(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, _) = session_with_events(&app).await;
    let history = app.all_events(&s).await.len();

    let mut child = command(
        &app.base,
        &app.ws_key,
        &["sessions", "events", &s, "--follow"],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut rx = lines_of(&mut child);
    for _ in 0..history {
        next_line(&mut rx).await;
    }
    append_agent_events(
        &app.db,
        &s,
        vec![json!({"type": "agent.message", "content": [{"type": "text", "text": "while following"}]})],
    )
    .await
    .unwrap();
    assert!(next_line(&mut rx).await.ends_with("while following"));
    append_agent_events(
        &app.db,
        &s,
        vec![json!({"type": "session.status_idle", "stop_reason": {"type": "end_turn"}})],
    )
    .await
    .unwrap();
    assert!(next_line(&mut rx).await.ends_with("end_turn"));
    assert!(exits(&mut child).await.success());
    assert_eq!(rx.recv().await, None, "nothing after the idle");
}

/// A TCP proxy to `upstream` that can cut every connection it carries,
/// and counts the connections it accepted.
async fn cutting_proxy(upstream: String) -> (String, Arc<Notify>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let cut = Arc::new(Notify::new());
    let accepted = Arc::new(AtomicUsize::new(0));
    let (cuts, count) = (cut.clone(), accepted.clone());
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let upstream = upstream.clone();
            let cuts = cuts.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = cuts.notified() => {}
                }
            });
        }
    });
    (base, cut, accepted)
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn following_resumes_after_a_dropped_stream_without_repeating_events(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let (s, _) = session_with_events(&app).await;
    let history = app.all_events(&s).await.len();
    let (base, cut, accepted) =
        cutting_proxy(app.base.trim_start_matches("http://").to_string()).await;

    let mut child = command(
        &base,
        &app.ws_key,
        &["sessions", "events", &s, "--follow", "--json"],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut rx = lines_of(&mut child);
    let mut printed = Vec::new();
    for _ in 0..history {
        printed.push(next_line(&mut rx).await);
    }
    // The stream is cut, and an event is appended while it is down: the
    // command reconnects and catches up from the history.
    cut.notify_waiters();
    let before_cut = accepted.load(Ordering::SeqCst);
    let during = append_agent_events(
        &app.db,
        &s,
        vec![json!({"type": "agent.message", "content": [{"type": "text", "text": "while cut"}]})],
    )
    .await
    .unwrap();
    printed.push(next_line(&mut rx).await);
    let end = append_agent_events(
        &app.db,
        &s,
        vec![json!({"type": "session.status_idle", "stop_reason": {"type": "end_turn"}})],
    )
    .await
    .unwrap();
    printed.push(next_line(&mut rx).await);
    assert!(exits(&mut child).await.success());
    while let Some(line) = rx.recv().await {
        printed.push(line);
    }

    assert!(
        accepted.load(Ordering::SeqCst) > before_cut,
        "the command reconnected after the cut"
    );
    let printed_ids: Vec<String> = printed
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("a JSON line")["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut expected = ids(&Value::Array(app.all_events(&s).await));
    assert_eq!(printed_ids, expected, "each event once, in order");
    expected.retain(|id| *id == during[0]["id"] || *id == end[0]["id"]);
    assert_eq!(expected.len(), 2);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sessions_list_follows_pages_up_to_its_limit(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let mut created = Vec::new();
    for _ in 0..102 {
        created.push(app.create_session().await);
    }
    created.reverse();
    let some = mango(&app, &["sessions", "list", "--limit", "101", "--json"]).await;
    assert_eq!(ids(&json_out(&some)), created[..101]);
    assert!(
        String::from_utf8_lossy(&some.stderr).contains("--limit"),
        "{some:?}"
    );
    let all = mango(&app, &["sessions", "list", "--limit", "102", "--json"]).await;
    assert_eq!(ids(&json_out(&all)), created);
    assert!(all.stderr.is_empty(), "{all:?}");
}
