//! Concurrency tests of the Work lease API against a real PostgreSQL (spec §2–§3.1):
//! many pollers, key revocation under load, lease expiry and reclaim, racing
//! heartbeats, LISTEN/NOTIFY wake-ups across replicas, and graceful stop.
//!
//! Every wait is bounded: each concurrent phase runs under [`within`].

use mango_testkit::*;

use futures::future::join_all;
use futures::StreamExt;
use mango_api::lease::Lease;
use mango_api::store::{keys, work};
use mango_api::{ids, Settings};
use mango_protocol::time::{self, Timestamp};
use mango_protocol::WorkType as Kind;
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------ helpers

/// Runs `fut`, failing the test if it takes longer than `secs`.
async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {secs} s"))
}

/// A pool of its own with more connections than `#[sqlx::test]` grants (5).
async fn bigger_pool(db: &PgPool, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .connect_with(db.connect_options().as_ref().clone())
        .await
        .expect("connect a bigger pool to the test database")
}

/// Shuts the api down and closes `pool`, so the test database can be dropped.
async fn finish(app: TestApp, pool: PgPool) {
    drop(app);
    let _ = tokio::time::timeout(Duration::from_secs(5), pool.close()).await;
}

/// One request against any api replica (`base`), as [`TestApp::call`] does.
async fn send(
    http: &reqwest::Client,
    base: &str,
    method: Method,
    path: &str,
    credential: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let mut req = http.request(method, format!("{base}{path}"));
    if let Some(c) = credential {
        req = req.bearer_auth(c);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request reaches the api");
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("response body");
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn env_path(env: &str, suffix: &str) -> String {
    format!("/v1/environments/{env}/work{suffix}")
}

async fn poll_env(app: &TestApp, env: &str, key: &str, query: &str) -> Reply {
    app.call(
        Method::GET,
        &env_path(env, &format!("/poll{query}")),
        Some(key),
        None,
    )
    .await
}

async fn ack_env(app: &TestApp, env: &str, key: &str, id: &str) -> Reply {
    app.call(
        Method::POST,
        &env_path(env, &format!("/{id}/ack")),
        Some(key),
        None,
    )
    .await
}

async fn heartbeat_env(app: &TestApp, env: &str, id: &str, token: &str, expected: &str) -> Reply {
    let q = format!(
        "/{id}/heartbeat?expected_last_heartbeat={}",
        urlencode(expected)
    );
    app.call(Method::POST, &env_path(env, &q), Some(token), None)
        .await
}

async fn create_check_env(app: &TestApp, env: &str) -> String {
    let r = app
        .call(
            Method::POST,
            &env_path(env, ""),
            Some(&app.ws_key),
            Some(json!({"data": {"type": "healthcheck"}})),
        )
        .await;
    r.expect(201);
    r.body["id"].as_str().unwrap().to_string()
}

/// A fresh Environment with its own key: (environment id, key secret).
async fn new_environment(app: &TestApp, name: &str) -> (String, String) {
    let env = app.create_environment(name).await;
    let (_, secret) = app.environment_key(&env).await;
    (env, secret)
}

/// Create → Poll → Ack → first heartbeat in `env`: (claim, last_heartbeat).
async fn active_in(app: &TestApp, env: &str, key: &str) -> (Claim, String) {
    create_check_env(app, env).await;
    let r = poll_env(app, env, key, "").await;
    r.expect(200);
    let claim = claim_of(r.body);
    ack_env(app, env, key, &claim.id).await.expect(200);
    let hb = heartbeat_env(app, env, &claim.id, &claim.token, "NO_HEARTBEAT").await;
    hb.expect(200);
    let last = hb.body["last_heartbeat"].as_str().unwrap().to_string();
    (claim, last)
}

#[track_caller]
fn expect_unauthenticated(r: &Reply, what: &str) {
    assert_eq!(r.status.as_u16(), 401, "{what}: body {}", r.body);
    r.expect(401);
    assert_eq!(r.error_type(), Some("authentication_error"), "{what}");
}

fn ts(v: &Value) -> Timestamp {
    time::parse(v.as_str().expect("a timestamp string")).expect("RFC 3339")
}

async fn row(app: &TestApp, env: &str, id: &str) -> work::WorkRow {
    work::find(&app.db, env, id)
        .await
        .unwrap()
        .expect("work row")
}

// ------------------------------------------------------------------ 1. many pollers

/// 16 supervisors drain 1,000 items: every item is claimed and acked exactly
/// once, tokens are distinct, and a token authorizes only its own Work.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sixteen_pollers_drain_a_thousand_items_exactly_once(db: PgPool) {
    const ITEMS: usize = 1000;
    const POLLERS: usize = 16;
    let pool = bigger_pool(&db, 24).await;
    let app = TestApp::start(pool.clone()).await;

    // Setup: insert the items directly, in one transaction.
    let base = time::now();
    let no_metadata = BTreeMap::new();
    let mut created = HashSet::new();
    let mut tx = pool.begin().await.unwrap();
    for i in 0..ITEMS {
        let at = base + chrono::Duration::microseconds(i as i64);
        let lease = Lease::new(Kind::Healthcheck, at, 120);
        let id = ids::new_id("work");
        work::insert(
            &mut *tx,
            work::NewWork {
                id: &id,
                environment_id: &app.env_id,
                session_id: None,
                metadata: &no_metadata,
                lease: &lease,
                created_at: at,
            },
        )
        .await
        .unwrap();
        created.insert(id);
    }
    tx.commit().await.unwrap();

    let started = Instant::now();
    let poller = |n: usize| {
        let app = &app;
        async move {
            let mut claims = Vec::new();
            // Bounded: one more round than there are items.
            for _ in 0..=ITEMS {
                let r = app
                    .call(
                        Method::GET,
                        &app.work_path("/poll"),
                        Some(&app.env_key),
                        None,
                    )
                    .await;
                r.expect(200);
                if r.body.is_null() {
                    return claims;
                }
                let claim = claim_of(r.body);
                assert_eq!(
                    claim.work["state"], "queued",
                    "poller {n}: a fresh claim is pending"
                );
                let ack = app.ack(&claim.id).await;
                ack.expect(200);
                assert_eq!(ack.body["state"], "starting", "poller {n}");
                claims.push((claim.id, claim.token));
            }
            panic!("poller {n} never saw an empty queue");
        }
    };
    let per_poller = within(60, "draining the queue", join_all((0..POLLERS).map(poller))).await;
    let drain_time = started.elapsed();

    let claims: Vec<(String, String)> = per_poller.iter().flatten().cloned().collect();
    assert_eq!(claims.len(), ITEMS, "exactly one successful claim per item");
    let claimed_ids: HashSet<&str> = claims.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(claimed_ids.len(), ITEMS, "no work id was claimed twice");
    assert!(
        claimed_ids.iter().all(|id| created.contains(*id)),
        "only created items were claimed"
    );
    let tokens: HashSet<&str> = claims.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(tokens.len(), ITEMS, "every claim got its own token");
    let busy = per_poller.iter().filter(|c| !c.is_empty()).count();
    assert!(
        busy >= 2,
        "the work was spread over pollers ({busy} got any)"
    );

    // The store agrees: one claim each (no re-claims), all acknowledged.
    let (epoch_one, starting): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE claim_epoch = 1), count(*) FILTER (WHERE state = 'starting')
         FROM work WHERE environment_id = $1",
    )
    .bind(&app.env_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((epoch_one, starting), (ITEMS as i64, ITEMS as i64));
    let stats = app
        .call(
            Method::GET,
            &app.work_path("/stats"),
            Some(&app.ws_key),
            None,
        )
        .await;
    stats.expect(200);
    assert_eq!(
        (stats.body["depth"].as_i64(), stats.body["pending"].as_i64()),
        (Some(0), Some(0))
    );

    // No token works for two claims: B's token on A is 403, A's own token works.
    let n = claims.len();
    let checks = futures::stream::iter(0..n)
        .map(|i| {
            let (a_id, a_token) = &claims[i];
            let (_, b_token) = &claims[(i + 1) % n];
            let app = &app;
            async move {
                let foreign = app.heartbeat(a_id, b_token, "NO_HEARTBEAT").await;
                foreign.expect(403);
                assert_eq!(foreign.error_type(), Some("permission_error"));
                let own = app.heartbeat(a_id, a_token, "NO_HEARTBEAT").await;
                own.expect(200);
                assert_eq!(own.body["state"], "active");
                assert_eq!(own.body["lease_extended"], true);
            }
        })
        .buffer_unordered(POLLERS)
        .collect::<Vec<()>>();
    within(60, "cross-token checks", checks).await;
    let active: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM work WHERE environment_id = $1 AND state = 'active'",
    )
    .bind(&app.env_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        active, ITEMS as i64,
        "the foreign-token beats changed nothing, the own ones did"
    );
    eprintln!("drained {ITEMS} items with {POLLERS} pollers in {drain_time:?}");
    finish(app, pool).await;
}

// ------------------------------------------------------------------ 2. revocation while polling

#[derive(Debug)]
enum Seen {
    Claimed { id: String, sent: Instant },
    Acked { id: String, sent: Instant },
    AckRejected { id: String },
    EmptyPoll { sent: Instant },
    PollRejected,
}

/// Long-pollers with an Environment key while items trickle in; the key is
/// revoked mid-way. Nothing is claimed or acked with it afterwards, and a
/// replacement key takes over the old key's pending claims.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn revoked_key_claims_and_acks_nothing_and_a_replacement_takes_over(db: PgPool) {
    const POLLERS: usize = 6;
    let pool = bigger_pool(&db, 20).await;
    let app = TestApp::start(pool.clone()).await;

    // A claim the old key leaves pending (polled, never acked).
    let pending_id = app.create_check().await;
    let pending = app.poll().await.expect("the first item");
    assert_eq!(pending.id, pending_id);

    let claims_seen = RefCell::new(0usize);
    let producing = RefCell::new(true);
    let revoked: RefCell<Option<(Instant, Timestamp)>> = RefCell::new(None);

    let poller = |n: usize| {
        let app = &app;
        let claims_seen = &claims_seen;
        async move {
            let mut seen = Vec::new();
            for _ in 0..10_000 {
                let sent = Instant::now();
                let r = poll_env(app, &app.env_id, &app.env_key, "?block_ms=999").await;
                if r.status.as_u16() == 401 {
                    expect_unauthenticated(&r, "poll with a revoked key");
                    seen.push(Seen::PollRejected);
                    return seen;
                }
                r.expect(200);
                if r.body.is_null() {
                    seen.push(Seen::EmptyPoll { sent });
                    continue;
                }
                let claim = claim_of(r.body);
                *claims_seen.borrow_mut() += 1;
                seen.push(Seen::Claimed {
                    id: claim.id.clone(),
                    sent,
                });
                let sent = Instant::now();
                let ack = app.ack(&claim.id).await;
                if ack.status.as_u16() == 401 {
                    expect_unauthenticated(&ack, "ack with a revoked key");
                    seen.push(Seen::AckRejected { id: claim.id });
                } else {
                    ack.expect(200);
                    seen.push(Seen::Acked { id: claim.id, sent });
                }
            }
            panic!("poller {n} was never refused");
        }
    };
    let producer = async {
        let mut made = Vec::new();
        for _ in 0..2_000 {
            if !*producing.borrow() {
                break;
            }
            made.push((app.create_check().await, Instant::now()));
            tokio::time::sleep(Duration::from_millis(12)).await;
        }
        made
    };
    let revoker = async {
        // Revoke once the pollers are busy, while most of them sit in a long poll.
        for _ in 0..2_000 {
            if *claims_seen.borrow() >= 30 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(*claims_seen.borrow() >= 30, "the pollers got going");
        let row = keys::revoke(&app.db, &app.env_key_id, time::now())
            .await
            .unwrap()
            .expect("the key exists");
        assert!(row.revoked_at.is_some());
        *revoked.borrow_mut() = Some((Instant::now(), time::now()));
        // Items keep arriving after the revoke; nobody may claim them with the old key.
        tokio::time::sleep(Duration::from_millis(400)).await;
        *producing.borrow_mut() = false;
    };
    let (per_poller, made, ()) = within(30, "pollers, producer and revoke", async {
        tokio::join!(join_all((0..POLLERS).map(poller)), producer, revoker)
    })
    .await;
    let (revoked_at, revoked_wall) = (*revoked.borrow()).expect("revoked");

    // Over HTTP: every success was a request sent before revoke returned, every
    // poll sent after it was refused, and every poller ended refused.
    let mut claimed = HashSet::new();
    let mut ack_refused = Vec::new();
    for seen in per_poller.iter() {
        assert!(
            matches!(seen.last(), Some(Seen::PollRejected)),
            "each poller ends with 401"
        );
        for s in seen {
            match s {
                Seen::Claimed { id, sent } => {
                    assert!(
                        *sent < revoked_at,
                        "{id} was claimed by a poll sent after revoke"
                    );
                    assert!(claimed.insert(id.clone()), "{id} claimed twice");
                }
                Seen::Acked { id, sent } => {
                    assert!(
                        *sent < revoked_at,
                        "{id} was acked by a request sent after revoke"
                    );
                }
                Seen::EmptyPoll { sent } => {
                    assert!(
                        *sent < revoked_at,
                        "a poll sent after revoke answered 200 null instead of 401"
                    );
                }
                Seen::AckRejected { id } => ack_refused.push(id.clone()),
                Seen::PollRejected => {}
            }
        }
    }
    let made_after: Vec<&String> = made
        .iter()
        .filter(|(_, at)| *at > revoked_at)
        .map(|(id, _)| id)
        .collect();
    assert!(
        !made_after.is_empty(),
        "items were created after the revoke"
    );

    // In the store: exactly the claims seen over HTTP (plus the pending one)
    // exist, and none was made or acknowledged after the revoke.
    let rows: Vec<(String, i64, Option<Timestamp>, Option<Timestamp>)> = sqlx::query_as(
        "SELECT id, claim_epoch, claimed_at, acknowledged_at FROM work WHERE environment_id = $1",
    )
    .bind(&app.env_id)
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut claimed_in_store = HashSet::new();
    for (id, epoch, claimed_at, acked_at) in &rows {
        assert!(*epoch <= 1, "{id} was re-claimed");
        if *epoch == 1 {
            claimed_in_store.insert(id.clone());
        }
        for t in [claimed_at, acked_at].into_iter().flatten() {
            assert!(
                *t < revoked_wall,
                "{id} changed at {t} after the revoke at {revoked_wall}"
            );
        }
    }
    let mut expected_claims = claimed.clone();
    expected_claims.insert(pending.id.clone());
    assert_eq!(claimed_in_store, expected_claims, "no claim went unseen");
    for id in &made_after {
        assert!(
            !claimed_in_store.contains(*id),
            "{id}, created after the revoke, was claimed"
        );
    }

    // The old key stays refused.
    expect_unauthenticated(
        &poll_env(&app, &app.env_id, &app.env_key, "").await,
        "poll after revoke",
    );
    expect_unauthenticated(&app.ack(&pending.id).await, "ack after revoke");

    // A replacement key for the same Environment can Ack the old key's pending claims.
    let (_, new_key) = app.environment_key(&app.env_id).await;
    let mut to_ack = vec![pending.id.clone()];
    to_ack.extend(ack_refused.iter().cloned());
    for id in &to_ack {
        let r = ack_env(&app, &app.env_id, &new_key, id).await;
        r.expect(200);
        assert_eq!(r.body["state"], "starting", "{id}");
    }
    // The old claim's token is the one that now holds the lease.
    let hb = app
        .heartbeat(&pending.id, &pending.token, "NO_HEARTBEAT")
        .await;
    hb.expect(200);
    assert_eq!(hb.body["state"], "active");
    // And the replacement key claims what arrived after the revoke.
    let r = poll_env(&app, &app.env_id, &new_key, "").await;
    r.expect(200);
    let next = claim_of(r.body);
    assert!(
        made_after.contains(&&next.id),
        "the new key claims a waiting item"
    );
    ack_env(&app, &app.env_id, &new_key, &next.id)
        .await
        .expect(200);
    eprintln!(
        "revoke: {} claims before, {} acks refused, {} items left after",
        claimed.len(),
        ack_refused.len(),
        made_after.len()
    );
    finish(app, pool).await;
}

/// Deterministic edge of the above: polls that authenticated and are blocked
/// when the key is revoked are then woken by new work; they must not claim it.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn polls_blocked_across_a_revoke_claim_nothing(db: PgPool) {
    const POLLERS: usize = 4;
    let app = TestApp::start(db).await;
    let (env, secret) = {
        let env = app.create_environment("revoked while waiting").await;
        let (key_id, secret) = app.environment_key(&env).await;
        (env, (key_id, secret))
    };
    let (key_id, key) = secret;
    let blocked = join_all((0..POLLERS).map(|_| poll_env(&app, &env, &key, "?block_ms=999")));
    let revoke_then_create = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        keys::revoke(&app.db, &key_id, time::now())
            .await
            .unwrap()
            .expect("key");
        create_check_env(&app, &env).await
    };
    let (replies, id) = within(5, "blocked polls across a revoke", async {
        tokio::join!(blocked, revoke_then_create)
    })
    .await;
    for r in &replies {
        expect_unauthenticated(r, "a poll blocked across the revoke");
    }
    let stored = row(&app, &env, &id).await;
    assert_eq!(
        stored.claim_epoch, 0,
        "the item created after the revoke was not claimed"
    );
    assert_eq!(stored.state.as_str(), "queued");
}

// ------------------------------------------------------------------ 3. expiry and reclaim

/// A lost worker's item comes back with the same id and a rotated token; the
/// old token is rejected at authentication; the new holder carries on.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn expired_lease_is_reclaimed_with_a_rotated_token(db: PgPool) {
    let settings = Settings {
        default_ttl_seconds: 2,
        ..Default::default()
    };
    let app = TestApp::start_with(db, settings).await;
    let (old, first) = app.active_check().await;
    let hb = app.heartbeat(&old.id, &old.token, &first).await;
    hb.expect(200);
    let last = hb.body["last_heartbeat"].as_str().unwrap().to_string();
    assert!(app.poll().await.is_none(), "a live lease is not available");

    // The holder stops heartbeating; the lease runs out.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let late = app.heartbeat(&old.id, &old.token, &last).await;
    late.expect(412);
    assert_eq!(late.code(), Some("heartbeat_precondition_failed"));
    let current = &late.body["error"]["details"]["current_state"];
    assert_eq!(
        current["last_heartbeat"].as_str(),
        Some(last.as_str()),
        "{current}"
    );
    assert_eq!(current["lease_extended"], false);

    let new = app
        .poll()
        .await
        .expect("the expired item is available again");
    assert_eq!(new.id, old.id, "same Work id");
    assert_ne!(new.token, old.token, "rotated token");
    assert_eq!(new.work["state"], "queued", "back to a pending claim");
    for field in ["acknowledged_at", "started_at", "latest_heartbeat_at"] {
        assert!(new.work[field].is_null(), "{field} cleared: {}", new.work);
    }

    // The old token is rejected at authentication, whatever it asks.
    for expected in [last.as_str(), "NO_HEARTBEAT"] {
        let r = app.heartbeat(&old.id, &old.token, expected).await;
        expect_unauthenticated(&r, "old token heartbeat");
    }
    for force in [false, true] {
        let r = app
            .call(
                Method::POST,
                &app.work_path(&format!("/{}/stop", old.id)),
                Some(&old.token),
                Some(json!({"force": force})),
            )
            .await;
        expect_unauthenticated(&r, "old token stop");
    }

    // The new holder acks, claims the lease with NO_HEARTBEAT and continues.
    let ack = app.ack(&new.id).await;
    ack.expect(200);
    assert_eq!(ack.body["state"], "starting");
    let hb = app.heartbeat(&new.id, &new.token, "NO_HEARTBEAT").await;
    hb.expect(200);
    assert_eq!(hb.body["state"], "active");
    assert_eq!(hb.body["lease_extended"], true);
    let mut last = hb.body["last_heartbeat"].as_str().unwrap().to_string();
    for _ in 0..3 {
        let hb = app.heartbeat(&new.id, &new.token, &last).await;
        hb.expect(200);
        last = hb.body["last_heartbeat"].as_str().unwrap().to_string();
    }
    let r = app.heartbeat(&old.id, &old.token, &last).await;
    expect_unauthenticated(&r, "old token echoing the new holder's value");
    let stored = row(&app, &app.env_id, &new.id).await;
    assert_eq!(stored.claim_epoch, 2);
    assert_eq!(stored.state.as_str(), "active");
    assert_eq!(
        stored.latest_heartbeat_at.map(|t| time::format(&t)),
        Some(last)
    );
}

/// Two pollers race for one expired item, in several Environments at once:
/// exactly one of each pair gets it.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn two_pollers_racing_for_an_expired_item_one_wins(db: PgPool) {
    const ENVS: usize = 8;
    let pool = bigger_pool(&db, 20).await;
    let settings = Settings {
        default_ttl_seconds: 1,
        ..Default::default()
    };
    let app = TestApp::start_with(pool.clone(), settings).await;
    let mut setups = Vec::new();
    for i in 0..ENVS {
        let (env, key) = new_environment(&app, &format!("race {i}")).await;
        let (claim, _) = active_in(&app, &env, &key).await;
        setups.push((env, key, claim));
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let races = setups.iter().map(|(env, key, claim)| {
        let app = &app;
        async move {
            let (a, b) = tokio::join!(poll_env(app, env, key, ""), poll_env(app, env, key, ""));
            a.expect(200);
            b.expect(200);
            let winners: Vec<Claim> = [a, b]
                .into_iter()
                .filter(|r| !r.body.is_null())
                .map(|r| claim_of(r.body))
                .collect();
            assert_eq!(
                winners.len(),
                1,
                "exactly one poller gets the expired item in {env}"
            );
            assert_eq!(winners[0].id, claim.id);
            assert_ne!(winners[0].token, claim.token);
            let stored = row(app, env, &claim.id).await;
            assert_eq!(stored.claim_epoch, 2, "claimed once more, not twice");
            let r = heartbeat_env(app, env, &claim.id, &claim.token, "NO_HEARTBEAT").await;
            expect_unauthenticated(&r, "the lost worker's token");
        }
    });
    within(20, "expired-item races", join_all(races)).await;
    finish(app, pool).await;
}

// ------------------------------------------------------------------ 4. racing heartbeats

/// The same holder sends two or three beats at once with the same expected
/// value (an SDK retry racing the original). Each is a successful beat (spec
/// §1: a replay of the previous value is not a 412), each answers with a
/// distinct value, and the newest one is what the store holds and what the
/// holder can echo next.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn concurrent_heartbeats_of_one_holder_keep_the_lease_consistent(db: PgPool) {
    let app = TestApp::start(db).await;
    let (claim, mut last) = app.active_check().await;
    for round in 0..30 {
        let n = 2 + round % 2;
        let replies = within(
            10,
            "a heartbeat burst",
            join_all((0..n).map(|_| app.heartbeat(&claim.id, &claim.token, &last))),
        )
        .await;
        let mut values = Vec::new();
        for r in &replies {
            r.expect(200);
            assert_eq!(r.body["state"], "active", "round {round}");
            assert_eq!(r.body["lease_extended"], true, "round {round}");
            values.push(ts(&r.body["last_heartbeat"]));
        }
        let distinct: HashSet<_> = values.iter().collect();
        assert_eq!(
            distinct.len(),
            n,
            "round {round}: each beat names its own value: {values:?}"
        );
        let newest = *values.iter().max().unwrap();
        assert!(
            newest > ts(&json!(last)),
            "round {round}: beats move forward"
        );
        let stored = row(&app, &app.env_id, &claim.id).await;
        assert_eq!(
            stored.latest_heartbeat_at,
            Some(newest),
            "round {round}: the newest value is stored"
        );
        assert_eq!(stored.claim_epoch, 1);
        last = time::format(&newest);
    }
    let hb = app.heartbeat(&claim.id, &claim.token, &last).await;
    hb.expect(200);
    assert_eq!(hb.body["lease_extended"], true);
}

/// A stale holder keeps heartbeating while its expired item is reclaimed: none
/// of its beats succeeds, and the new claim's lease is exactly what the new
/// holder made it. Also, at the expiry edge, a beat and a reclaim never both win.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stale_heartbeats_racing_a_reclaim_never_touch_the_new_lease(db: PgPool) {
    const EDGE_ENVS: usize = 8;
    let pool = bigger_pool(&db, 20).await;
    let settings = Settings {
        default_ttl_seconds: 1,
        ..Default::default()
    };
    let app = TestApp::start_with(pool.clone(), settings).await;

    // (a) A stale holder hammering its old value through a reclaim.
    let stale_race = async {
        let (env, key) = new_environment(&app, "stale").await;
        let (old, last) = active_in(&app, &env, &key).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let stale_beats = async {
            let mut statuses = Vec::new();
            for _ in 0..40 {
                let r = heartbeat_env(&app, &env, &old.id, &old.token, &last).await;
                statuses.push(r.status.as_u16());
                tokio::task::yield_now().await;
            }
            statuses
        };
        let new_holder = async {
            let r = poll_env(&app, &env, &key, "").await;
            r.expect(200);
            let new = claim_of(r.body);
            ack_env(&app, &env, &key, &new.id).await.expect(200);
            let hb = heartbeat_env(&app, &env, &new.id, &new.token, "NO_HEARTBEAT").await;
            hb.expect(200);
            (new, hb.body["last_heartbeat"].as_str().unwrap().to_string())
        };
        let (statuses, (new, new_last)) = tokio::join!(stale_beats, new_holder);
        assert!(
            statuses.iter().all(|s| *s == 412 || *s == 401),
            "a stale beat succeeded: {statuses:?}"
        );
        assert_eq!(new.id, old.id);
        // Once reclaimed, the stale token is refused outright, even with the new value.
        let r = heartbeat_env(&app, &env, &old.id, &old.token, &new_last).await;
        expect_unauthenticated(&r, "stale token after reclaim");
        let stored = row(&app, &env, &new.id).await;
        assert_eq!(stored.claim_epoch, 2);
        assert_eq!(stored.state.as_str(), "active");
        assert_eq!(
            stored.latest_heartbeat_at.map(|t| time::format(&t)),
            Some(new_last.clone())
        );
        assert_eq!(
            stored.previous_heartbeat_at, None,
            "the lease is the new holder's first beat"
        );
        // The new holder continues normally.
        heartbeat_env(&app, &env, &new.id, &new.token, &new_last)
            .await
            .expect(200);
    };

    // (b) At the expiry edge, one beat and one poll race; offsets straddle expiry.
    let edges = (0..EDGE_ENVS).map(|i| {
        let app = &app;
        async move {
            let (env, key) = new_environment(app, &format!("edge {i}")).await;
            let (old, last) = active_in(app, &env, &key).await;
            let beat_at = Instant::now();
            tokio::time::sleep(Duration::from_millis(880 + 30 * i as u64)).await;
            let (hb, poll) = tokio::join!(
                heartbeat_env(app, &env, &old.id, &old.token, &last),
                poll_env(app, &env, &key, "")
            );
            poll.expect(200);
            let reclaimed = !poll.body.is_null();
            let beat_won = hb.status.as_u16() == 200;
            assert!(
                !(reclaimed && beat_won),
                "edge {i}: both the stale beat and the reclaim succeeded ({:?} after the beat)",
                beat_at.elapsed()
            );
            let stored = row(app, &env, &old.id).await;
            if reclaimed {
                assert!(
                    matches!(hb.status.as_u16(), 401 | 412),
                    "edge {i}: {}",
                    hb.body
                );
                assert_eq!(stored.claim_epoch, 2);
                assert_eq!(stored.state.as_str(), "queued");
                assert_eq!(
                    stored.lease_expires_at, None,
                    "a pending claim has no lease"
                );
                let r = heartbeat_env(app, &env, &old.id, &old.token, &last).await;
                expect_unauthenticated(&r, "token after reclaim");
            } else {
                assert_eq!(stored.claim_epoch, 1);
                if beat_won {
                    assert_eq!(hb.body["lease_extended"], true);
                    assert_eq!(
                        stored
                            .latest_heartbeat_at
                            .map(|t| time::format(&t))
                            .as_deref(),
                        hb.body["last_heartbeat"].as_str()
                    );
                } else {
                    hb.expect(412);
                }
            }
            (reclaimed, beat_won)
        }
    });
    let ((), outcomes) = within(30, "stale-holder races", async {
        tokio::join!(stale_race, join_all(edges))
    })
    .await;
    eprintln!("edge outcomes (reclaimed, beat won): {outcomes:?}");
    finish(app, pool).await;
}

// ------------------------------------------------------------------ 5. long-poll wake-ups

/// A blocked Poll returns as soon as an item is created, well before its
/// deadline; a poller of another Environment is not handed it.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn long_poll_wakes_up_when_work_is_created(db: PgPool) {
    let app = TestApp::start(db).await;
    let (other_env, other_key) = new_environment(&app, "elsewhere").await;
    let started = Instant::now();
    let poller = async {
        let claim = app.poll_query("?block_ms=999").await;
        (claim, started.elapsed())
    };
    let bystander = async {
        let r = poll_env(&app, &other_env, &other_key, "?block_ms=999").await;
        (r, started.elapsed())
    };
    let creator = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let id = app.create_check().await;
        (id, started.elapsed())
    };
    let ((claim, waited), (other, other_waited), (id, created_after)) =
        within(5, "long polls", async {
            tokio::join!(poller, bystander, creator)
        })
        .await;
    let claim = claim.expect("the blocked poll returns the new item");
    assert_eq!(claim.id, id);
    assert!(
        waited >= created_after.saturating_sub(Duration::from_millis(50)),
        "it waited for the item"
    );
    assert!(
        waited < Duration::from_millis(900),
        "woken well before the deadline: {waited:?}"
    );
    other.expect(200);
    assert!(
        other.body.is_null(),
        "another Environment's poller gets nothing"
    );
    assert!(
        other_waited >= Duration::from_millis(950),
        "it waited out its deadline: {other_waited:?}"
    );
    eprintln!("woken after {waited:?} (item created after {created_after:?})");
}

/// Two api replicas over one database: a Poll blocked on one is woken by a
/// Create on the other (LISTEN/NOTIFY), both ways, and two pollers blocked on
/// different replicas share one item exactly once.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn long_poll_wake_ups_cross_replicas(db: PgPool) {
    let pool = bigger_pool(&db, 16).await;
    let app = TestApp::start(pool.clone()).await;
    let replica_b = app.second_process().await;
    let base_b = replica_b.base.clone();
    let base_a = app.base.clone();
    let poll_path = app.work_path("/poll?block_ms=999");
    let create = |base: String| {
        let app = &app;
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let r = send(
                &app.http,
                &base,
                Method::POST,
                &app.work_path(""),
                Some(&app.ws_key),
                Some(json!({"data": {"type": "healthcheck"}})),
            )
            .await;
            r.expect(201);
            r.body["id"].as_str().unwrap().to_string()
        }
    };
    let blocked_poll = |base: String| {
        let app = &app;
        let path = poll_path.clone();
        async move {
            let started = Instant::now();
            let r = send(
                &app.http,
                &base,
                Method::GET,
                &path,
                Some(&app.env_key),
                None,
            )
            .await;
            r.expect(200);
            (r.body, started.elapsed())
        }
    };

    for (poll_on, create_on) in [(&base_a, &base_b), (&base_b, &base_a)] {
        let ((work, waited), id) = within(5, "cross-replica wake-up", async {
            tokio::join!(blocked_poll(poll_on.clone()), create(create_on.clone()))
        })
        .await;
        assert_eq!(
            work["id"].as_str(),
            Some(id.as_str()),
            "poll on {poll_on} gets the item created on {create_on}"
        );
        assert!(
            waited < Duration::from_millis(900),
            "poll on {poll_on} woken by a create on {create_on} after {waited:?}"
        );
    }

    // One item, pollers blocked on both replicas: exactly one gets it.
    let ((a, _), (b, _), id) = within(5, "two replicas, one item", async {
        tokio::join!(
            blocked_poll(base_a.clone()),
            blocked_poll(base_b.clone()),
            create(base_b.clone())
        )
    })
    .await;
    let winners: Vec<&Value> = [&a, &b].into_iter().filter(|w| !w.is_null()).collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one replica's poller gets the item: {a} / {b}"
    );
    assert_eq!(winners[0]["id"].as_str(), Some(id.as_str()));

    let _ = replica_b.stop(Duration::from_secs(5)).await;
    drop(replica_b);
    finish(app, pool).await;
}

// ------------------------------------------------------------------ 6. graceful stop

#[derive(Debug)]
struct Beat {
    sent: Instant,
    received: Instant,
    status: u16,
    body: Value,
}

/// An operator's graceful Stop races holders heartbeating in a loop: each
/// holder sees `state:"stopping"` with `lease_extended:false`, never a lease
/// extension after that, and its token stops working once its last TTL ran out.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn graceful_stop_racing_heartbeats_ends_the_lease_within_its_ttl(db: PgPool) {
    const HOLDERS: usize = 4;
    const TTL: Duration = Duration::from_secs(2);
    let settings = Settings {
        default_ttl_seconds: 2,
        ..Default::default()
    };
    let app = TestApp::start_with(db, settings).await;
    let mut items = Vec::new();
    for _ in 0..HOLDERS {
        items.push(app.active_check().await);
    }

    let holder = |(claim, first): &(Claim, String)| {
        let app = &app;
        let mut last = first.clone();
        let id = claim.id.clone();
        let token = claim.token.clone();
        async move {
            let mut beats = Vec::new();
            for _ in 0..1_000 {
                let sent = Instant::now();
                let r = app.heartbeat(&id, &token, &last).await;
                let beat = Beat {
                    sent,
                    received: Instant::now(),
                    status: r.status.as_u16(),
                    body: r.body.clone(),
                };
                beats.push(beat);
                match r.status.as_u16() {
                    200 if r.body["state"] == "active" => {
                        last = r.body["last_heartbeat"].as_str().unwrap().to_string();
                    }
                    200 => {}
                    401 => {
                        expect_unauthenticated(&r, "token after the stopping lease ran out");
                        return beats;
                    }
                    _ => panic!("unexpected heartbeat reply {}: {}", r.status, r.body),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("the token of {id} never stopped working");
        }
    };
    let stopper = |i: usize| {
        let app = &app;
        let id = items[i].0.id.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(150 + 70 * i as u64)).await;
            let sent = Instant::now();
            let r = app
                .call(
                    Method::POST,
                    &app.work_path(&format!("/{id}/stop")),
                    Some(&app.ws_key),
                    Some(json!({"force": false})),
                )
                .await;
            r.expect(204);
            (sent, Instant::now())
        }
    };
    let (all_beats, stops) = within(15, "holders and stops", async {
        tokio::join!(
            join_all(items.iter().map(holder)),
            join_all((0..HOLDERS).map(stopper))
        )
    })
    .await;

    for (i, beats) in all_beats.iter().enumerate() {
        let (stop_sent, stop_done) = stops[i];
        let first_stopping = beats
            .iter()
            .position(|b| b.status == 200 && b.body["state"] == "stopping")
            .unwrap_or_else(|| panic!("holder {i} never saw stopping: {beats:?}"));
        for (n, b) in beats.iter().enumerate() {
            match b.status {
                200 if n < first_stopping => {
                    assert_eq!(b.body["state"], "active");
                    assert_eq!(b.body["lease_extended"], true);
                    assert!(
                        b.sent < stop_done,
                        "holder {i}: a beat sent after Stop returned was extended"
                    );
                }
                200 => {
                    assert_eq!(
                        b.body["state"], "stopping",
                        "holder {i}: never active again after stopping"
                    );
                    assert_eq!(
                        b.body["lease_extended"], false,
                        "holder {i}: stopping never extends"
                    );
                    assert!(b.received > stop_sent);
                }
                401 => assert_eq!(n, beats.len() - 1),
                s => panic!("holder {i}: status {s}"),
            }
        }
        let last_extended = &beats[first_stopping - 1];
        let refused = beats.last().unwrap();
        assert_eq!(refused.status, 401, "holder {i}'s token stopped working");
        let slack = Duration::from_millis(60);
        assert!(
            refused.received + slack >= last_extended.sent + TTL,
            "holder {i}: token refused before its TTL ran out"
        );
        // No beat sent after the last extension's lease must have run out was accepted.
        let expired_by = last_extended.received + TTL + slack;
        assert!(
            beats
                .iter()
                .filter(|b| b.status == 200)
                .all(|b| b.sent < expired_by),
            "holder {i}: token still worked after its stopping lease ran out"
        );
        // The worker's own final Stop after expiry is refused too; the Work reads stopped.
        let id = &items[i].0.id;
        let r = app
            .call(
                Method::POST,
                &app.work_path(&format!("/{id}/stop")),
                Some(&items[i].0.token),
                Some(json!({"force": true})),
            )
            .await;
        expect_unauthenticated(&r, "final stop after expiry");
        let work = app.get_work(id).await;
        assert_eq!(work["state"], "stopped");
        assert!(!work["stop_requested_at"].is_null());
        assert_eq!(work["result"]["status"], "cancelled");
        let stopped_at = ts(&work["stopped_at"]);
        let requested_at = ts(&work["stop_requested_at"]);
        assert!(
            stopped_at > requested_at,
            "holder {i} kept the rest of its lease"
        );
        assert!(
            stopped_at <= requested_at + chrono::Duration::seconds(2),
            "holder {i}: stopped no later than its TTL after the Stop"
        );
    }
}
