//! A Session's activation: the Work item a self-hosted Session gets when it
//! has something for a worker to do. Written in one place, for admission,
//! the agent loop's replies and its wait.

use crate::lease::Lease;
use crate::store::work::{self, NewWork};
use mango_protocol::time::Timestamp;
use mango_protocol::WorkType;
use sqlx::PgConnection;
use std::collections::BTreeMap;

/// Inserts a queued activation for the Session unless it has live Work
/// already (coalescing, decided by the `work_one_live_per_session` index,
/// so a stale read of "no live Work" cannot make a second one). Runs in the
/// caller's transaction; the insert trigger wakes pollers at commit.
pub async fn ensure(
    db: &mut PgConnection,
    default_ttl_seconds: i64,
    environment_id: &str,
    session_id: &str,
    now: Timestamp,
) -> sqlx::Result<()> {
    let lease = Lease::new(WorkType::Session, now, default_ttl_seconds);
    work::insert_activation(
        db,
        NewWork {
            id: &crate::ids::new_id("work"),
            environment_id,
            session_id: Some(session_id),
            metadata: &BTreeMap::new(),
            lease: &lease,
            created_at: now,
        },
    )
    .await?;
    Ok(())
}
