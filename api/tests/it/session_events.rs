//! Session events (spec §5, wire contract §7.2–§7.5): list (order, limit,
//! complete cursor pages, `types[]`, `created_at[…]`), send (shapes, limits,
//! refusals that store nothing), and the SSE stream (frame rules, pings,
//! ordering, no loss between history and stream, many readers, token expiry).

use mango_testkit::*;

use mango_api::Settings;
use mango_testkit::append_agent_events;
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tokio::time::timeout;

#[track_caller]
fn assert_error(r: &Reply, status: u16, code: &str) {
    r.expect(status);
    assert_eq!(r.code(), Some(code), "{}", r.body);
}

fn agent_message(text: &str) -> Value {
    json!({"type": "agent.message", "content": [{"type": "text", "text": text}]})
}

async fn fast_app(db: sqlx::PgPool) -> TestApp {
    TestApp::start_with(
        db,
        Settings {
            stream_ping_interval: Duration::from_millis(300),
            // The tests append the agent's events themselves.
            caller_plays_model: true,
            ..Default::default()
        },
    )
    .await
}

/// Sends `n` text messages `prefix0..` in one request; returns their ids.
async fn send_n(app: &TestApp, session: &str, prefix: &str, n: usize) -> Vec<String> {
    let events: Vec<Value> = (0..n)
        .map(|i| user_message(&format!("{prefix}{i}")))
        .collect();
    let r = app.send(session, Value::Array(events)).await;
    r.expect(200);
    data_ids(&r.body)
}

/// Follows `next_page` for `query` (which must already have a `?`).
async fn pages(app: &TestApp, session: &str, query: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut page: Option<String> = None;
    for _ in 0..100 {
        let q = match &page {
            Some(p) => format!("{query}&page={}", urlencode(p)),
            None => query.to_string(),
        };
        let r = app.list_events(session, &q).await;
        r.expect(200);
        out.push(data_ids(&r.body));
        match r.body["next_page"].as_str() {
            Some(p) if !p.is_empty() => page = Some(p.to_string()),
            _ => return out,
        }
    }
    panic!("pagination did not end");
}

// ------------------------------------------------------------------ list

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn list_is_ascending_with_complete_cursor_pages(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    let mut ids = send_n(&app, &s, "a", 20).await;
    ids.extend(send_n(&app, &s, "b", 5).await);
    assert_eq!(ids.len(), 25);

    let all = app.list_events(&s, "").await;
    all.expect(200);
    assert_eq!(data_ids(&all.body), ids, "default order is ascending");
    assert!(all.body["next_page"].is_null());

    let p = pages(&app, &s, "?limit=10").await;
    assert_eq!(p.iter().map(Vec::len).collect::<Vec<_>>(), vec![10, 10, 5]);
    assert_eq!(p.concat(), ids, "every id once, in order");

    // An exact multiple of the limit ends without an empty page.
    let p = pages(&app, &s, "?limit=5").await;
    assert_eq!(p.len(), 5);
    assert_eq!(p.concat(), ids);

    let mut rev = ids.clone();
    rev.reverse();
    let desc = app.list_events(&s, "?order=desc").await;
    desc.expect(200);
    assert_eq!(data_ids(&desc.body), rev);
    let p = pages(&app, &s, "?order=desc&limit=10").await;
    assert_eq!(p.iter().map(Vec::len).collect::<Vec<_>>(), vec![10, 10, 5]);
    assert_eq!(p.concat(), rev);

    for ok in ["?limit=1", "?limit=1000", "?order=asc"] {
        app.list_events(&s, ok).await.expect(200);
    }
    assert_eq!(
        data_ids(&app.list_events(&s, "?limit=1").await.body),
        ids[..1]
    );
    for bad in [
        "?limit=0",
        "?limit=1001",
        "?limit=-1",
        "?limit=ten",
        "?order=up",
        "?page=not-a-cursor",
    ] {
        let r = app.list_events(&s, bad).await;
        r.expect(400);
        assert_eq!(r.error_type(), Some("invalid_request_error"), "{bad}");
    }
    assert_error(
        &app.list_events("sesn_nope", "").await,
        404,
        "session_not_found",
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn list_filters_by_type_and_processed_at(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    let first = app
        .send(
            &s,
            json!([user_message("m1"), {"type": "user.interrupt"},
                   {"type": "user.message", "content": [{"type": "text", "text": "m2"}]},
                   {"type": "system.message", "content": [{"type": "text", "text": "sys"}]}]),
        )
        .await;
    first.expect(200);
    let first_ids = data_ids(&first.body);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let agent = append_agent_events(&app.db, &s, vec![agent_message("a1")])
        .await
        .unwrap();
    let agent_id = agent[0]["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let last = app.send(&s, json!([{"type": "user.interrupt"}])).await;
    last.expect(200);
    let last_id = data_ids(&last.body)[0].clone();

    let r = app
        .list_events(&s, "?types%5B%5D=user.message&types%5B%5D=user.interrupt")
        .await;
    r.expect(200);
    assert_eq!(
        data_ids(&r.body),
        vec![
            first_ids[0].clone(),
            first_ids[1].clone(),
            first_ids[2].clone(),
            last_id.clone()
        ]
    );
    let r = app.list_events(&s, "?types[]=agent.message").await;
    assert_eq!(data_ids(&r.body), vec![agent_id.clone()]);
    let r = app
        .list_events(&s, "?types[]=system.message&order=desc")
        .await;
    assert_eq!(data_ids(&r.body), vec![first_ids[3].clone()]);
    let r = app.list_events(&s, "?types[]=session.status_idle").await;
    r.expect(200);
    assert!(data_ids(&r.body).is_empty());
    // A filtered walk is complete too.
    let p = pages(
        &app,
        &s,
        "?types[]=user.message&types[]=user.interrupt&limit=1",
    )
    .await;
    assert_eq!(p.concat().len(), 4);
    for bad in [
        "?types[]=user.bogus",
        "?types%5B%5D=user.message&types%5B%5D=nope",
    ] {
        let r = app.list_events(&s, bad).await;
        r.expect(400);
    }

    // created_at[…] compares processed_at.
    let at = |v: &Value| v["processed_at"].as_str().unwrap().to_string();
    // Events of one request may carry distinct instants; use the batch's last.
    let t_first = at(&first.body["data"][3]);
    let t_agent = at(&agent[0]);
    let q = |op: &str, t: &str| format!("?created_at%5B{op}%5D={}", urlencode(t));
    let ids_of = |r: Reply| {
        r.expect(200);
        data_ids(&r.body)
    };
    assert_eq!(
        ids_of(app.list_events(&s, &q("gt", &t_first)).await),
        vec![agent_id.clone(), last_id.clone()]
    );
    assert_eq!(
        ids_of(app.list_events(&s, &q("gte", &t_agent)).await),
        vec![agent_id.clone(), last_id.clone()]
    );
    assert_eq!(
        ids_of(app.list_events(&s, &q("gt", &t_agent)).await),
        vec![last_id.clone()]
    );
    assert_eq!(
        ids_of(app.list_events(&s, &q("lt", &t_agent)).await),
        first_ids
    );
    let mut upto_agent = first_ids.clone();
    upto_agent.push(agent_id.clone());
    assert_eq!(
        ids_of(app.list_events(&s, &q("lte", &t_agent)).await),
        upto_agent
    );
    let both = format!(
        "?created_at[gte]={}&created_at[lte]={}",
        urlencode(&t_agent),
        urlencode(&t_agent)
    );
    assert_eq!(
        ids_of(app.list_events(&s, &both).await),
        vec![agent_id.clone()]
    );
    app.list_events(&s, "?created_at[gt]=yesterday")
        .await
        .expect(400);
}

// ------------------------------------------------------------------ send

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn send_returns_the_stored_events_with_server_ids(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    let r = app
        .send(
            &s,
            json!([user_message("hello"), {"type": "user.interrupt"},
                   {"type": "user.define_outcome", "description": "d", "rubric": {"type": "text", "content": "c"}}]),
        )
        .await;
    r.expect(200);
    let data = r.body["data"].as_array().expect("data array");
    assert_eq!(data.len(), 3);
    assert_eq!(data[0]["type"], "user.message");
    assert_eq!(data[0]["content"][0]["text"], "hello");
    assert_eq!(data[1]["type"], "user.interrupt");
    assert_eq!(data[2]["type"], "user.define_outcome");
    let mut seen = HashSet::new();
    for e in data {
        assert!(
            e["id"].as_str().is_some_and(|i| i.starts_with("sevt_")),
            "{e}"
        );
        assert!(seen.insert(e["id"].as_str().unwrap().to_string()));
        assert!(e["processed_at"].is_string(), "{e}");
    }
    // History holds exactly what send returned.
    assert_eq!(app.all_events(&s).await, data.clone());

    // A client-supplied id is not accepted as a field.
    let r = app
        .send(&s, json!([{"type": "user.interrupt", "id": "sevt_mine"}]))
        .await;
    r.expect(400);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn refused_sends_store_nothing(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let s = app.create_session().await;
    let text = |t: &str| json!([{"type": "text", "text": t}]);
    let huge = "x".repeat(256 * 1024 + 1);
    let cases: Vec<(Value, u16, Option<&str>)> = vec![
        (
            json!([{"type": "user.bogus"}]),
            400,
            Some("unknown_event_type"),
        ),
        (
            json!([{"content": text("no type")}]),
            400,
            Some("unknown_event_type"),
        ),
        (
            json!([{"type": "agent.message", "content": text("x")}]),
            400,
            Some("event_not_sendable"),
        ),
        (
            json!([{"type": "agent.tool_use", "name": "bash", "input": {}}]),
            400,
            Some("event_not_sendable"),
        ),
        (
            json!([{"type": "session.status_idle"}]),
            400,
            Some("event_not_sendable"),
        ),
        (
            json!([{"type": "span.model_request_start"}]),
            400,
            Some("event_not_sendable"),
        ),
        // Valid first event, refused second: the whole request stores nothing.
        (
            json!([user_message("ok"), {"type": "agent.message", "content": text("x")}]),
            400,
            Some("event_not_sendable"),
        ),
        (
            json!([user_message("ok"), {"type": "user.nope"}]),
            400,
            Some("unknown_event_type"),
        ),
        // Shapes.
        (json!([{"type": "user.message"}]), 400, None),
        (json!([{"type": "user.message", "content": []}]), 400, None),
        (
            json!([{"type": "user.message", "content": "hi"}]),
            400,
            None,
        ),
        (
            json!([{"type": "user.message", "content": [{"type": "text"}]}]),
            400,
            None,
        ),
        (
            json!([{"type": "user.message", "content": [{"type": "video"}]}]),
            400,
            None,
        ),
        (
            json!([{"type": "user.message", "content": [{"type": "image", "source": {"type": "ftp"}}]}]),
            400,
            None,
        ),
        (
            json!([{"type": "user.message", "content": text("x"), "extra": 1}]),
            400,
            None,
        ),
        (json!([{"type": "user.tool_result"}]), 400, None),
        (
            json!([{"type": "user.tool_result", "tool_use_id": "x", "is_error": "yes"}]),
            400,
            None,
        ),
        (
            json!([{"type": "user.tool_confirmation", "tool_use_id": "x", "result": "maybe"}]),
            400,
            None,
        ),
        (
            json!([{"type": "system.message", "content": text("alone")}]),
            400,
            None,
        ),
        (json!([]), 400, None),
        (json!("nope"), 400, None),
        (json!([1]), 400, None),
        // Limits.
        (Value::Array(vec![user_message("m"); 51]), 400, None),
        (
            json!([{"type": "user.message", "content": [{"type": "text", "text": huge}]}]),
            400,
            None,
        ),
        // Unknown tool call ids.
        (
            json!([{"type": "user.tool_result", "tool_use_id": "sevt_nope"}]),
            400,
            Some("unknown_tool_use_id"),
        ),
    ];
    for (events, status, code) in cases {
        let r = app.send(&s, events.clone()).await;
        r.expect(status);
        if let Some(code) = code {
            assert_eq!(r.code(), Some(code), "{events}: {}", r.body);
        }
        assert_eq!(
            app.session_counts(&s).await,
            (0, 0, 0),
            "refused {events} left rows"
        );
    }
    let last_seq: i64 = sqlx::query_scalar("SELECT last_seq FROM sessions WHERE id = $1")
        .bind(&s)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(last_seq, 0);
    // Body-level refusals.
    app.call_raw(
        Method::POST,
        &format!("/v1/sessions/{s}/events"),
        Some(&app.ws_key),
        "{not json",
    )
    .await
    .expect(400);
    app.call(
        Method::POST,
        &format!("/v1/sessions/{s}/events"),
        Some(&app.ws_key),
        Some(json!({"events": [user_message("x")], "extra": true})),
    )
    .await
    .expect(400);
    assert_error(
        &app.send("sesn_nope", json!([user_message("x")])).await,
        404,
        "session_not_found",
    );

    // The edges themselves are accepted: 50 events, and one event just under the size cap.
    let overhead = serde_json::to_vec(&user_message("")).unwrap().len();
    let fits = user_message(&"y".repeat(256 * 1024 - overhead));
    app.send(&s, json!([fits])).await.expect(200);
    app.send(&s, Value::Array(vec![user_message("m"); 50]))
        .await
        .expect(200);
    assert_eq!(app.count_for("session_events", &s).await, 51);
}

// ------------------------------------------------------------------ stream

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stream_frames_carry_event_names_pings_and_events_in_order(db: sqlx::PgPool) {
    let app = fast_app(db).await;
    let s = app.create_session().await;
    let before = send_n(&app, &s, "old", 2).await;
    let resp = app.open_stream(&s, &app.ws_key).await;
    assert_eq!(resp.status().as_u16(), 200);
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let mut sse = SseReader::new(resp);

    // A ping within the configured interval (300 ms), with slack.
    let started = Instant::now();
    let ping = timeout(Duration::from_millis(1500), sse.next_frame())
        .await
        .expect("a frame within 1.5 s")
        .expect("stream open");
    assert_eq!(ping.event.as_deref(), Some("ping"), "{ping:?}");
    assert!(started.elapsed() < Duration::from_millis(1500));

    // Events appended after opening arrive, in order, named by their type.
    let mut want = send_n(&app, &s, "new", 3).await;
    let agent = append_agent_events(
        &app.db,
        &s,
        vec![
            agent_message("a"),
            json!({"type": "session.status_idle", "stop_reason": {"type": "end_turn"}}),
        ],
    )
    .await
    .unwrap();
    want.extend(agent.iter().map(|e| e["id"].as_str().unwrap().to_string()));
    let mut got = Vec::new();
    let mut pings = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < want.len() {
        let f = timeout(deadline - Instant::now(), sse.next_frame())
            .await
            .expect("events within 5 s")
            .expect("stream open");
        let name = f.event.clone().expect("every frame has an event: line");
        if name == "ping" {
            pings += 1;
            continue;
        }
        let e = f.json();
        assert_eq!(name, e["type"].as_str().unwrap(), "event: names the type");
        assert!(e["processed_at"].is_string());
        got.push(e["id"].as_str().unwrap().to_string());
    }
    assert_eq!(got, want, "in order, nothing from before the stream opened");
    assert!(!got.iter().any(|id| before.contains(id)));
    let _ = pings;

    // More pings keep coming while idle, and every frame is named.
    let mut more = 0;
    while more < 2 {
        let f = timeout(Duration::from_millis(1500), sse.next_frame())
            .await
            .expect("pings keep coming")
            .expect("stream open");
        assert!(f.event.is_some(), "{f:?}");
        if f.event.as_deref() == Some("ping") {
            more += 1;
        }
    }

    // Refusals at connect time.
    let r = app.open_stream("sesn_nope", &app.ws_key).await;
    assert_eq!(r.status().as_u16(), 404);
    let r = app.open_stream(&s, "mango_wsk_bogus").await;
    assert_eq!(r.status().as_u16(), 401);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn history_plus_stream_loses_nothing_under_concurrent_appends(db: sqlx::PgPool) {
    let app = fast_app(db).await;
    let s = app.create_session().await;
    send_n(&app, &s, "pre", 3).await;

    let mut sse = SseReader::new(app.open_stream(&s, &app.ws_key).await);
    // A writer appends via HTTP and in-process while we read history.
    let writer = {
        let (base, http, key, pool, s) = (
            app.base.clone(),
            app.http.clone(),
            app.ws_key.clone(),
            app.db.clone(),
            s.clone(),
        );
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..30 {
                if i % 2 == 0 {
                    let r: Value = http
                        .post(format!("{base}/v1/sessions/{s}/events"))
                        .bearer_auth(&key)
                        .json(&json!({"events": [user_message(&format!("w{i}"))]}))
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    ids.extend(data_ids(&r));
                } else {
                    let stored =
                        append_agent_events(&pool, &s, vec![agent_message(&format!("a{i}"))])
                            .await
                            .unwrap();
                    ids.push(stored[0]["id"].as_str().unwrap().to_string());
                }
            }
            ids
        })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    let history: Vec<String> = app
        .all_events(&s)
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let written = timeout(Duration::from_secs(20), writer)
        .await
        .expect("writer finishes")
        .unwrap();
    let final_history: Vec<String> = app
        .all_events(&s)
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(final_history.len(), 33);
    let last = final_history.last().unwrap().clone();

    // Read the stream until the last event arrives.
    let mut streamed: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while streamed.last() != Some(&last) {
        let f = timeout(deadline - Instant::now(), sse.next_event())
            .await
            .expect("the stream delivers the last event within 10 s")
            .expect("stream open");
        streamed.push(f.json()["id"].as_str().unwrap().to_string());
    }
    let union: HashSet<&String> = history.iter().chain(streamed.iter()).collect();
    for id in &final_history {
        assert!(
            union.contains(id),
            "event {id} lost between history and stream"
        );
    }
    for id in &written {
        assert!(union.contains(id));
    }
    // The stream itself has no duplicates and follows history order.
    let pos: Vec<usize> = streamed
        .iter()
        .map(|id| {
            final_history
                .iter()
                .position(|h| h == id)
                .expect("streamed id is in history")
        })
        .collect();
    assert!(
        pos.windows(2).all(|w| w[0] < w[1]),
        "stream out of order: {pos:?}"
    );
    // The stream begins exactly where the Session stood when it opened.
    assert!(pos[0] >= 3, "pre-existing events are not replayed");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn fifty_concurrent_readers_all_receive_every_event(db: sqlx::PgPool) {
    let app = fast_app(db).await;
    let s = app.create_session().await;
    let mut readers = Vec::new();
    for _ in 0..50 {
        let resp = app.open_stream(&s, &app.ws_key).await;
        assert_eq!(resp.status().as_u16(), 200);
        readers.push(SseReader::new(resp));
    }
    let mut want = Vec::new();
    for i in 0..5 {
        want.extend(send_n(&app, &s, &format!("r{i}-"), 2).await);
        let stored = append_agent_events(&app.db, &s, vec![agent_message("x")])
            .await
            .unwrap();
        want.push(stored[0]["id"].as_str().unwrap().to_string());
    }
    let tasks: Vec<_> = readers
        .into_iter()
        .map(|mut sse| {
            let n = want.len();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while got.len() < n {
                    match sse.next_event().await {
                        Some(f) => got.push(f.json()["id"].as_str().unwrap().to_string()),
                        None => break,
                    }
                }
                got
            })
        })
        .collect();
    let all = timeout(Duration::from_secs(30), futures::future::join_all(tasks))
        .await
        .expect("every reader finishes within 30 s");
    for (i, got) in all.into_iter().enumerate() {
        assert_eq!(got.unwrap(), want, "reader {i}");
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_token_stream_closes_after_its_work_stops_and_other_sessions_are_403(db: sqlx::PgPool) {
    let app = fast_app(db).await;
    let agent = app.create_agent("a").await;
    let s = app.create_session_for(&agent).await;
    let other = app.create_session_for(&agent).await;
    app.send(&s, json!([user_message("go")])).await.expect(200);
    let claim = app.claim_session_work().await;

    let r = app.open_stream(&other, &claim.token).await;
    assert_eq!(r.status().as_u16(), 403);

    let resp = app.open_stream(&s, &claim.token).await;
    assert_eq!(resp.status().as_u16(), 200);
    let mut sse = SseReader::new(resp);
    // It works while the token is valid.
    let stored = append_agent_events(&app.db, &s, vec![agent_message("hi")])
        .await
        .unwrap();
    // A bound for liveness, not latency: under a full suite on two cores
    // a NOTIFY has taken more than 3 s to arrive.
    let f = timeout(Duration::from_secs(15), sse.next_event())
        .await
        .expect("event arrives")
        .expect("stream open");
    assert_eq!(f.json()["id"], stored[0]["id"]);

    app.stop_work(&claim.id, true).await;
    let stopped = Instant::now();
    let end = timeout(Duration::from_secs(4), async {
        while sse.next_frame().await.is_some() {}
    })
    .await;
    assert!(end.is_ok(), "stream still open 4 s after the Work stopped");
    assert!(
        stopped.elapsed() < Duration::from_millis(2500),
        "closed after {:?}",
        stopped.elapsed()
    );
    // Reconnecting with the dead token is refused.
    let r = app.open_stream(&s, &claim.token).await;
    assert_eq!(r.status().as_u16(), 401);
}
