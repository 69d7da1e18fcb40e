//! Notifications only where another process needs them: an api process hands
//! its own commits to its streams and agent loop in-process, so a commit
//! notifies (`mango_events`, `mango_outbox`) unless the committing process is
//! the only one registered in `listeners`. Writers that are not a registered
//! api process, and every process once a second one registers, notify.

use mango_testkit::*;

use mango_api::ApiContext;
use mango_testkit::append_agent_events;
use serde_json::json;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::time::Duration;
use tokio::time::timeout;

/// `notification_wanted()` as a connection named `writer` sees it, with `registered` in the registry.
async fn wanted(db: &PgPool, writer: &str, registered: &[&str]) -> bool {
    let mut tx = db.begin().await.unwrap();
    sqlx::query("SELECT set_config('application_name', $1, true)")
        .bind(writer)
        .execute(&mut *tx)
        .await
        .unwrap();
    for process in registered {
        sqlx::query("INSERT INTO listeners (process, backend_pid) VALUES ($1, 0)")
            .bind(process)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    let wanted: bool = sqlx::query_scalar("SELECT notification_wanted()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    wanted
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_commit_notifies_unless_its_process_is_the_only_one_registered(db: PgPool) {
    let (a, b) = ("mango-api proc_a", "mango-api proc_b");
    assert!(wanted(&db, a, &[]).await, "nobody registered: notify");
    assert!(!wanted(&db, a, &[a]).await, "alone: skip");
    assert!(wanted(&db, a, &[a, b]).await, "another process: notify");
    assert!(wanted(&db, a, &[b]).await, "not registered itself: notify");
    assert!(wanted(&db, "", &[a]).await, "an unnamed writer: notify");
    assert!(wanted(&db, "psql", &[a]).await, "another client: notify");
}

/// The next notification on any channel `listener` listens to: (channel, payload).
async fn next_notification(listener: &mut PgListener) -> (String, String) {
    let n = timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification within 5 s")
        .unwrap();
    (n.channel().to_string(), n.payload().to_string())
}

/// What a `mango_events` notification says of Session `session` at `seq`.
fn grew(session: &str, seq: i64) -> (String, String) {
    ("mango_events".to_string(), format!("{session} {seq}"))
}

/// A write by another client (the test's own pool, not a registered api
/// process, so it always notifies): the log head it made.
async fn another_clients_write(db: &PgPool, session: &str) -> i64 {
    append_agent_events(
        db,
        session,
        vec![json!({"type": "agent.message", "content": []})],
    )
    .await
    .unwrap();
    last_seq(db, session).await
}

async fn last_seq(db: &PgPool, session: &str) -> i64 {
    sqlx::query_scalar("SELECT last_seq FROM sessions WHERE id = $1")
        .bind(session)
        .fetch_one(db)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_process_alone_delivers_its_own_commits_without_notifying(db: PgPool) {
    let app = TestApp::start(db).await;
    let registered: Vec<(String, i32)> =
        sqlx::query_as("SELECT process, backend_pid FROM listeners")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(registered.len(), 1, "{registered:?}");
    assert_eq!(Some(registered[0].0.as_str()), app.ctx.process.as_deref());

    // An observer that is not registered sees what the database sends.
    let mut observer = PgListener::connect_with(&app.db).await.unwrap();
    observer.listen("mango_events").await.unwrap();
    let s = app.create_session().await;
    let mut stream = SseReader::new(app.open_stream(&s, &app.ws_key).await);

    // The api's own admission: no notification, yet its stream has it at once.
    app.send(&s, json!([user_message("hello")]))
        .await
        .expect(200);
    let first = stream.next_event().await.expect("the admitted message");
    assert_eq!(first.json()["type"], "user.message");
    let seq = another_clients_write(&app.db, &s).await;
    assert_eq!(
        next_notification(&mut observer).await,
        grew(&s, seq),
        "the first notification is the other client's commit: the api's own sent none"
    );
    let second = stream.next_event().await.expect("the other client's event");
    assert_eq!(second.json()["type"], "agent.message");
}

/// The processes' registry names, sorted as [`registered`] lists them.
fn names(processes: &[&ApiContext]) -> Vec<String> {
    let mut names: Vec<String> = processes
        .iter()
        .map(|p| p.process.as_deref().expect("an api process").to_string())
        .collect();
    names.sort();
    names
}

async fn registered(db: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT process FROM listeners ORDER BY process")
        .fetch_all(db)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn with_a_second_process_registered_the_first_notifies_again(db: PgPool) {
    let app = TestApp::start(db).await;
    let b = app.second_process().await;
    assert_eq!(registered(&app.db).await, names(&[&app.ctx, &b.ctx]));

    let mut observer = PgListener::connect_with(&app.db).await.unwrap();
    observer.listen("mango_events").await.unwrap();
    let s = app.create_session().await;
    app.send(&s, json!([user_message("hello")]))
        .await
        .expect(200);
    let seq = last_seq(&app.db, &s).await;
    assert_eq!(next_notification(&mut observer).await, grew(&s, seq));

    // B exits: its row stays (its commits' readers are gone, so notifying
    // costs only a little) until a process registers and clears it.
    let (b_pid,): (i32,) = sqlx::query_as("SELECT backend_pid FROM listeners WHERE process = $1")
        .bind(b.ctx.process.as_deref())
        .fetch_one(&app.db)
        .await
        .unwrap();
    b.stop(Duration::from_secs(5)).await.unwrap();
    b.ctx.db.close().await;
    timeout(Duration::from_secs(5), async {
        loop {
            let alive: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                    .bind(b_pid)
                    .fetch_one(&app.db)
                    .await
                    .unwrap();
            if !alive {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("B's LISTEN connection ends with it");
    assert_eq!(registered(&app.db).await.len(), 2, "B's row outlives it");
    let c = app.second_process().await;
    assert_eq!(
        registered(&app.db).await,
        names(&[&app.ctx, &c.ctx]),
        "B's row was cleared"
    );
}

/// Waits until every one of `expected` has been notified (others may come between).
async fn until_notified(listener: &mut PgListener, expected: &[(String, String)]) {
    let mut missing = expected.to_vec();
    while !missing.is_empty() {
        let got = next_notification(listener).await;
        missing.retain(|m| *m != got);
    }
}

fn tool_use() -> serde_json::Value {
    json!({"type": "agent.tool_use", "name": "bash", "input": {"command": "ls"},
           "evaluated_permission": "allow"})
}

fn tool_result(call: &str) -> serde_json::Value {
    json!({"type": "user.tool_result", "tool_use_id": call,
           "content": [{"type": "text", "text": "out"}]})
}

/// The api's own statements notify for themselves (migration 9): a worker's
/// fenced result and an operator's send are silent while the process is
/// alone, and send what the triggers would once another process listens.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_apis_own_statements_notify_as_the_triggers_would(db: PgPool) {
    use std::sync::atomic::Ordering::Relaxed;
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    app.send(&s, json!([user_message("start")]))
        .await
        .expect(200);
    let token = app.claim_session_work().await.token;
    let calls = append_agent_events(&app.db, &s, vec![tool_use(), tool_use()])
        .await
        .unwrap();
    let call = |i: usize| calls[i]["id"].as_str().unwrap().to_string();
    let mut observer = PgListener::connect_with(&app.db).await.unwrap();
    observer
        .listen_all(["mango_events", "mango_outbox"])
        .await
        .unwrap();
    let fenced = app.ctx.metrics.fenced_results.load(Relaxed);

    // Alone: the result commits without a notification; the first one the
    // observer gets is another client's write.
    app.send_as(&s, &token, json!([tool_result(&call(0))]))
        .await
        .expect(200);
    assert_eq!(app.ctx.metrics.fenced_results.load(Relaxed), fenced + 1);
    let seq = another_clients_write(&app.db, &s).await;
    assert_eq!(
        next_notification(&mut observer).await,
        grew(&s, seq),
        "the fenced result sent nothing while its process was alone"
    );

    // Another process listens: the fenced result sends both notifications.
    let _b = app.second_process().await;
    app.send_as(&s, &token, json!([tool_result(&call(1))]))
        .await
        .expect(200);
    assert_eq!(app.ctx.metrics.fenced_results.load(Relaxed), fenced + 2);
    let seq = last_seq(&app.db, &s).await;
    until_notified(
        &mut observer,
        &[grew(&s, seq), ("mango_outbox".to_string(), s.clone())],
    )
    .await;

    // So does the locking path's append of runnable input.
    app.send(&s, json!([user_message("more")]))
        .await
        .expect(200);
    let seq = last_seq(&app.db, &s).await;
    until_notified(
        &mut observer,
        &[grew(&s, seq), ("mango_outbox".to_string(), s.clone())],
    )
    .await;
}
