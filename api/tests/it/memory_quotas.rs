//! Memory Store quotas (issue 25, item 8; docs/memory.md, "Quotas"): a
//! store's content bytes and count of memories, each refused one past its
//! limit with 413 `memory_store_full` and nothing written, whoever writes
//! (a Workspace key or a Session's runner); its history pruned oldest first
//! past its bounds, so rewriting a store round after round cannot grow the
//! database for ever; and a sessions token's write allowance, refused with
//! 429 and `retry-after`, shared by every api process.

use mango_api::memory_quota::MemoryLimits;
use mango_api::Settings;
use mango_testkit::*;

use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

fn limits(change: impl FnOnce(&mut MemoryLimits)) -> Settings {
    let mut memory_limits = MemoryLimits::default();
    change(&mut memory_limits);
    Settings {
        memory_limits,
        // The test plays the model's part: input starts Work for the runner's token.
        caller_plays_model: true,
        ..Settings::default()
    }
}

/// The sessions token of a new Session attaching `store` read_write, its Work claimed.
async fn runner_token(app: &TestApp, store: &str) -> String {
    let agent = app.create_agent("memory agent").await;
    let r = app
        .post_session(json!({
            "agent": agent, "environment_id": app.env_id,
            "resources": [{"type": "memory_store", "memory_store_id": store, "access": "read_write"}],
            "initial_events": [user_message("go")]
        }))
        .await;
    r.expect(200);
    app.claim_session_work().await.token
}

async fn create(app: &TestApp, store: &str, path: &str, size: usize, credential: &str) -> Reply {
    app.create_memory_as(store, path, &"x".repeat(size), credential)
        .await
}

async fn update(app: &TestApp, store: &str, id: &str, size: usize, credential: &str) -> Reply {
    app.store_call(
        Method::POST,
        store,
        &format!("/memories/{id}"),
        credential,
        Some(json!({"content": "y".repeat(size)})),
    )
    .await
}

async fn delete(app: &TestApp, store: &str, id: &str, credential: &str) -> Reply {
    app.store_call(
        Method::DELETE,
        store,
        &format!("/memories/{id}"),
        credential,
        None,
    )
    .await
}

fn id_of(r: &Reply) -> String {
    r.body["id"].as_str().unwrap().to_string()
}

#[track_caller]
fn assert_full(r: &Reply, quota: &str, limit: i64, current: i64, requested: i64) {
    r.expect(413);
    assert_eq!(r.error_type(), Some("request_too_large"), "{}", r.body);
    assert_eq!(r.code(), Some("memory_store_full"), "{}", r.body);
    let d = &r.body["error"]["details"];
    assert_eq!(
        (&d["quota"], &d["limit"], &d["current"], &d["requested"]),
        (
            &json!(quota),
            &json!(limit),
            &json!(current),
            &json!(requested)
        ),
        "{}",
        r.body
    );
    assert_eq!(
        r.headers.get("x-should-retry").unwrap(),
        "false",
        "a retry cannot help"
    );
}

/// What the store's rows hold, counted afresh: (memories, content bytes,
/// versions, version content bytes).
async fn counted(app: &TestApp, store: &str) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM memories WHERE memory_store_id = $1),
                (SELECT coalesce(sum(content_size_bytes), 0)::bigint FROM memories WHERE memory_store_id = $1),
                (SELECT count(*) FROM memory_versions WHERE memory_store_id = $1),
                (SELECT coalesce(sum(content_size_bytes), 0)::bigint FROM memory_versions WHERE memory_store_id = $1)",
    )
    .bind(store)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// The store's own counts, which must always equal [`counted`].
async fn kept(app: &TestApp, store: &str) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT memory_count, content_bytes, version_count, version_bytes FROM memory_stores WHERE id = $1",
    )
    .bind(store)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

#[track_caller]
fn same<T: PartialEq + std::fmt::Debug>(a: T, b: T) {
    assert_eq!(a, b, "the store's counts match its rows");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_store_takes_content_up_to_its_byte_limit_from_every_writer(db: sqlx::PgPool) {
    let app = TestApp::start_with(db, limits(|l| l.store_max_bytes = 1_000)).await;
    let store = app.create_store("bytes").await;
    let token = runner_token(&app, &store).await;
    let ws = app.ws_key.clone();

    let a = create(&app, &store, "/a", 600, &ws).await;
    a.expect(200);
    // The runner's write counts toward the same limit: exactly the limit is taken.
    let b = create(&app, &store, "/b", 400, &token).await;
    b.expect(200);
    let before = counted(&app, &store).await;
    same(kept(&app, &store).await, before);
    assert_eq!(before.1, 1_000);

    // One byte more is refused, whoever writes it, and nothing is stored.
    assert_full(
        &create(&app, &store, "/c", 1, &ws).await,
        "content_size_bytes",
        1_000,
        1_000,
        1_001,
    );
    assert_full(
        &create(&app, &store, "/c", 1, &token).await,
        "content_size_bytes",
        1_000,
        1_000,
        1_001,
    );
    assert_full(
        &update(&app, &store, &id_of(&b), 401, &token).await,
        "content_size_bytes",
        1_000,
        1_000,
        1_001,
    );
    assert!(app.memory_at(&store, "/c").await.is_none());
    assert_eq!(
        app.memory_at(&store, "/b").await.unwrap()["content"],
        "x".repeat(400)
    );
    same(counted(&app, &store).await, before);
    same(kept(&app, &store).await, before);

    // A full store takes edits that do not grow it, renames, and deletions.
    update(&app, &store, &id_of(&b), 400, &token)
        .await
        .expect(200);
    app.store_call(
        Method::POST,
        &store,
        &format!("/memories/{}", id_of(&a)),
        &ws,
        Some(json!({"path": "/renamed"})),
    )
    .await
    .expect(200);
    update(&app, &store, &id_of(&b), 100, &ws).await.expect(200);
    // The room that made is there for anyone.
    create(&app, &store, "/c", 300, &token).await.expect(200);
    assert_full(
        &create(&app, &store, "/d", 1, &ws).await,
        "content_size_bytes",
        1_000,
        1_000,
        1_001,
    );
    delete(&app, &store, &id_of(&a), &token).await.expect(200);
    create(&app, &store, "/d", 600, &ws).await.expect(200);
    same(kept(&app, &store).await, counted(&app, &store).await);
    assert_eq!(kept(&app, &store).await.1, 1_000);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_store_takes_memories_up_to_its_count_limit_even_when_creates_race(db: sqlx::PgPool) {
    let app = TestApp::start_with(db, limits(|l| l.store_max_memories = 5)).await;
    let store = app.create_store("count").await;
    let token = runner_token(&app, &store).await;
    let ws = app.ws_key.clone();
    create(&app, &store, "/one", 0, &token).await.expect(200);
    // Nine creates at once for the four places left: four are made.
    let racing = (0..9).map(|i| {
        let (app, store, credential) = (&app, &store, if i % 2 == 0 { &ws } else { &token });
        async move { create(app, store, &format!("/race/{i}"), 10, credential).await }
    });
    let replies = futures::future::join_all(racing).await;
    assert_eq!(replies.iter().filter(|r| r.status == 200).count(), 4);
    for r in replies.iter().filter(|r| r.status != 200) {
        assert_full(r, "memory_count", 5, 5, 6);
    }
    let listed = app.all_memories(&store).await;
    assert_eq!(listed.len(), 5);
    same(kept(&app, &store).await, counted(&app, &store).await);

    // Full: a rename or an edit is no new memory; a deletion makes room for one.
    let one = listed.iter().find(|m| m["path"] == "/one").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.store_call(
        Method::POST,
        &store,
        &format!("/memories/{one}"),
        &token,
        Some(json!({"path": "/first", "content": "grew"})),
    )
    .await
    .expect(200);
    assert_full(
        &create(&app, &store, "/six", 0, &ws).await,
        "memory_count",
        5,
        5,
        6,
    );
    delete(&app, &store, &one, &ws).await.expect(200);
    create(&app, &store, "/six", 0, &token).await.expect(200);
    assert_full(
        &create(&app, &store, "/seven", 0, &token).await,
        "memory_count",
        5,
        5,
        6,
    );
    same(kept(&app, &store).await, counted(&app, &store).await);
}

async fn versions(app: &TestApp, store: &str, query: &str) -> Vec<Value> {
    let r = app
        .store_call(
            Method::GET,
            store,
            &format!("/memory_versions?limit=100{query}"),
            &app.ws_key,
            None,
        )
        .await;
    r.expect(200);
    r.body["data"].as_array().unwrap().clone()
}

/// The tool rewrote every file of a store each round; with the
/// history bounded the database stops growing after the first rounds.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn rewriting_a_store_round_after_round_keeps_its_history_within_bounds(db: sqlx::PgPool) {
    let app = TestApp::start_with(
        db,
        limits(|l| {
            l.history_max_bytes = 2_500;
            l.history_max_versions = 4;
        }),
    )
    .await;
    let store = app.create_store("churn").await;
    let token = runner_token(&app, &store).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = create(&app, &store, &format!("/f{i}"), 1_000, &token).await;
        r.expect(200);
        ids.push(id_of(&r));
    }
    for round in 1..=10 {
        for id in &ids {
            app.store_call(
                Method::POST,
                &store,
                &format!("/memories/{id}"),
                &token,
                Some(json!({"content": format!("{round:04}").repeat(250)})),
            )
            .await
            .expect(200);
        }
        let (memories, content, versions, version_bytes) = kept(&app, &store).await;
        same(
            (memories, content, versions, version_bytes),
            counted(&app, &store).await,
        );
        // The current versions, and at most 2,500 bytes in at most 4 others.
        assert!(versions - memories <= 4, "round {round}: {versions}");
        assert!(version_bytes - content <= 2_500, "round {round}");
    }
    // What is kept is the newest history, and every memory's current version.
    let listed = versions(&app, &store, "&view=full").await;
    assert_eq!(listed.len(), 3 + 2, "2 of 1,000 bytes fit in 2,500");
    let rounds: Vec<&str> = listed
        .iter()
        .map(|v| &v["content"].as_str().unwrap()[..4])
        .collect();
    assert_eq!(rounds, ["0010", "0010", "0010", "0009", "0009"]);
    for id in &ids {
        let m = app
            .store_call(
                Method::GET,
                &store,
                &format!("/memories/{id}"),
                &app.ws_key,
                None,
            )
            .await;
        m.expect(200);
        let current = m.body["memory_version_id"].as_str().unwrap();
        app.store_call(
            Method::GET,
            &store,
            &format!("/memory_versions/{current}"),
            &app.ws_key,
            None,
        )
        .await
        .expect(200);
    }
    // A deleted memory's versions are history too: the versions bound prunes them.
    for id in &ids {
        delete(&app, &store, id, &token).await.expect(200);
    }
    let (memories, _, versions_left, _) = kept(&app, &store).await;
    assert_eq!(memories, 0);
    assert!(versions_left <= 4, "{versions_left}");
    same(kept(&app, &store).await, counted(&app, &store).await);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn history_bounds_prune_exactly_past_their_edges_and_redaction_frees_content(
    db: sqlx::PgPool,
) {
    let app = TestApp::start_with(
        db,
        limits(|l| {
            l.history_max_bytes = 300;
            l.history_max_versions = 3;
        }),
    )
    .await;
    let store = app.create_store("edges").await;
    let ws = app.ws_key.clone();
    let m = create(&app, &store, "/m", 100, &ws).await;
    m.expect(200);
    let id = id_of(&m);
    let edit = |content: String| {
        let (app, store, id, ws) = (&app, &store, &id, &ws);
        async move {
            app.store_call(
                Method::POST,
                store,
                &format!("/memories/{id}"),
                ws,
                Some(json!({ "content": content })),
            )
            .await
            .expect(200);
        }
    };
    // Three edits: three versions of 100 bytes in history, both bounds exactly met.
    for i in 1..=3 {
        edit(format!("{i:0100}")).await;
    }
    let all = versions(&app, &store, "").await;
    assert_eq!(all.len(), 4, "current + 3 kept: nothing pruned at the edge");
    let oldest = all[3]["id"].as_str().unwrap().to_string();
    assert_eq!(all[3]["operation"], "created");
    // One more version than the bound: the oldest goes, and only it.
    edit("y".repeat(100)).await;
    let after = versions(&app, &store, "").await;
    assert_eq!(&after[1..], &all[..3], "the newer three stay");
    app.store_call(
        Method::GET,
        &store,
        &format!("/memory_versions/{oldest}"),
        &ws,
        None,
    )
    .await
    .expect(404);

    // A redacted version holds no content: the bytes bound no longer counts it.
    let redacted = after[3]["id"].as_str().unwrap().to_string();
    app.store_call(
        Method::POST,
        &store,
        &format!("/memory_versions/{redacted}/redact"),
        &ws,
        None,
    )
    .await
    .expect(200);
    same(kept(&app, &store).await, counted(&app, &store).await);
    assert_eq!(kept(&app, &store).await.3, 300, "current 100 + 2 × 100");
    // The versions bound prunes the redacted one; 300 bytes of history stay, at the edge.
    edit("z".repeat(101)).await;
    let now = versions(&app, &store, "").await;
    assert_eq!(now.len(), 4);
    assert!(now.iter().all(|v| v["id"] != redacted.as_str()));
    let (_, content, _, version_bytes) = kept(&app, &store).await;
    assert_eq!(version_bytes - content, 300);
    // 401 bytes: 101 past the bound, which the oldest (100) alone cannot free.
    edit("w".repeat(50)).await;
    let sizes: Vec<i64> = versions(&app, &store, "")
        .await
        .iter()
        .map(|v| v["content_size_bytes"].as_i64().unwrap())
        .collect();
    assert_eq!(sizes, [50, 101, 100], "current, then the two newest");
    same(kept(&app, &store).await, counted(&app, &store).await);
}

#[track_caller]
fn assert_rate_limited(r: &Reply) -> u64 {
    r.expect(429);
    assert_eq!(r.error_type(), Some("rate_limit_error"), "{}", r.body);
    assert_eq!(r.code(), Some("memory_write_rate_limited"), "{}", r.body);
    r.headers
        .get("retry-after")
        .expect("a retry-after header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sessions_token_writes_at_its_allowance_then_gets_429_with_retry_after(db: sqlx::PgPool) {
    let app = TestApp::start_with(
        db,
        limits(|l| {
            l.writes_per_minute = 30;
            l.write_burst = 3;
        }),
    )
    .await;
    let store = app.create_store("rate").await;
    let token = runner_token(&app, &store).await;
    let other = runner_token(&app, &store).await;
    let ws = app.ws_key.clone();

    // The burst: three writes (a create, an update, a delete), served by two
    // api processes, which share the allowance.
    let second = app.second_process().await;
    let a = create(&app, &store, "/a", 1, &token).await;
    a.expect(200);
    update(&second, &store, &id_of(&a), 2, &token)
        .await
        .expect(200);
    let b = create(&app, &store, "/b", 1, &ws).await;
    b.expect(200);
    delete(&second, &store, &id_of(&b), &token)
        .await
        .expect(200);
    // The fourth, on either process, is refused and changes nothing.
    let versions_before = counted(&app, &store).await;
    let mut wait = 0;
    for api in [&app, &second, &app] {
        wait = assert_rate_limited(&create(api, &store, "/c", 1, &token).await);
        assert!(
            (1..=2).contains(&wait),
            "one write accrues every 2 s: {wait}"
        );
    }
    assert_rate_limited(&update(&app, &store, &id_of(&a), 3, &token).await);
    assert!(app.memory_at(&store, "/c").await.is_none());
    same(counted(&app, &store).await, versions_before);
    // Other writers have their own allowance: a Workspace key has none to spend.
    create(&app, &store, "/other", 1, &other).await.expect(200);
    for i in 0..5 {
        create(&app, &store, &format!("/ws/{i}"), 1, &ws)
            .await
            .expect(200);
    }
    // Refused writes charged nothing: after retry-after, exactly one more is due.
    tokio::time::sleep(Duration::from_secs(wait) + Duration::from_millis(50)).await;
    create(&second, &store, "/c", 1, &token).await.expect(200);
    assert_rate_limited(&create(&app, &store, "/d", 1, &token).await);
    second.stop(Duration::from_secs(5)).await.unwrap();
}
