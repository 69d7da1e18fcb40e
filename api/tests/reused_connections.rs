//! The hot paths' connections (`db::ReusedConnections`) against a real
//! PostgreSQL: a finished connection comes back for the next request without
//! the pool's release ping; anything else goes back to the pool as before;
//! and kept connections never hold up the pool's close.

use mango_api::db::{api_pool, ReusedConnections};
use sqlx::{PgConnection, PgPool};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn backend(conn: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// When a backend last answered anything, as another connection sees it: a
/// statement, or the bare Sync that is sqlx's release ping.
async fn last_answered(observer: &PgPool, pid: i32) -> f64 {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM state_change)::float8 FROM pg_stat_activity WHERE pid = $1",
    )
    .bind(pid)
    .fetch_one(observer)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_finished_connection_is_kept_unpinged_and_anything_else_goes_back(db: PgPool) {
    let pool = api_pool(&db, 4).await.unwrap();
    let reused = Arc::new(ReusedConnections::default());

    let mut conn = reused.take(&pool).await.unwrap();
    let pid = backend(&mut conn).await;
    conn.finish();
    // Kept, not handed back: the pool never sees it again, so never pings it.
    assert_eq!(reused.kept(), 1);
    assert_eq!((pool.size(), pool.num_idle()), (1, 0));

    let mut conn = reused.take(&pool).await.unwrap();
    assert_eq!(reused.kept(), 0);
    assert_eq!(
        backend(&mut conn).await,
        pid,
        "the next request gets it back"
    );
    // Not finished (an error or a cancelled request): the pool's own
    // release takes it, ping included.
    let answered = last_answered(&db, pid).await;
    drop(conn);
    assert_eq!(reused.kept(), 0);
    // That release runs as a task of its own: wait for it, bounded.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.num_idle() == 0 {
        assert!(Instant::now() < deadline, "the pool takes it back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        last_answered(&db, pid).await > answered,
        "the pool pings what it takes back"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn kept_connections_do_not_hold_up_closing_the_pool(db: PgPool) {
    let pool = api_pool(&db, 8).await.unwrap();
    let reused = Arc::new(ReusedConnections::default());
    let mut first = reused.take(&pool).await.unwrap();
    let mut second = reused.take(&pool).await.unwrap();
    backend(&mut first).await;
    backend(&mut second).await;
    first.finish();
    second.finish();
    assert_eq!(reused.kept(), 2);

    tokio::time::timeout(Duration::from_secs(5), pool.close())
        .await
        .expect("the pool closes while connections are kept");
    assert_eq!(reused.kept(), 0);
    assert_eq!(pool.size(), 0);
}

/// Kept connections are out of every other request's reach: at most a
/// quarter of the pool is kept, and none when the pool is at its limit with
/// nothing idle (someone may be waiting for exactly that connection).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn at_most_a_quarter_of_the_pool_is_kept_and_none_when_it_is_exhausted(db: PgPool) {
    for (max, kept) in [(3, 0), (4, 1), (8, 2), (40, 4)] {
        let pool = api_pool(&db, max).await.unwrap();
        let reused = Arc::new(ReusedConnections::default());
        let mut taken = Vec::new();
        // One short of the limit, so the pool is never exhausted here.
        for _ in 0..(max - 1).min(5) {
            let mut conn = reused.take(&pool).await.unwrap();
            backend(&mut conn).await;
            taken.push(conn);
        }
        taken.into_iter().for_each(|c| c.finish());
        assert_eq!(reused.kept(), kept, "pool of {max}");
        drop(reused);
        pool.close().await;
    }

    let pool = api_pool(&db, 8).await.unwrap();
    let reused = Arc::new(ReusedConnections::default());
    let mut all = Vec::new();
    for _ in 0..8 {
        let mut conn = reused.take(&pool).await.unwrap();
        backend(&mut conn).await;
        all.push(conn);
    }
    assert_eq!((pool.size(), pool.num_idle()), (8, 0));
    all.pop().unwrap().finish();
    assert_eq!(
        reused.kept(),
        0,
        "an exhausted pool gets its connection back"
    );
}
