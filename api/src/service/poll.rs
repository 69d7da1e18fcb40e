//! Poll (spec §3): claim the oldest available item of an Environment, or
//! wait for one. An item claimed more often than the reclaim limit allows
//! is failed instead of handed out again, so no input that kills its worker
//! can loop for ever.

use crate::context::ApiContext;
use crate::error::ApiResult;
use crate::ids;
use crate::metrics::Metrics;
use crate::service::fail;
use crate::service::work::{revoked, Fence};
use crate::store::keys;
use crate::store::work::{self, WorkRow};
use chrono::Duration;

/// What Poll waits for and how it claims.
pub struct PollRequest<'a> {
    pub environment_id: &'a str,
    pub key_id: &'a str,
    /// How long to wait for work; `None` answers at once.
    pub block: Option<std::time::Duration>,
    pub reclaim_after: Duration,
    /// The poller's worker id, recorded on the item it claims.
    pub worker_id: Option<&'a str>,
}

/// Claims the oldest available item, waiting up to `block` for one; the
/// claimed row and its new Work secret. Holds a connection only while
/// querying.
pub async fn poll(
    ctx: &ApiContext,
    request: PollRequest<'_>,
    mut held: Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
) -> ApiResult<Option<(WorkRow, String)>> {
    let deadline = request
        .block
        .map(|block| tokio::time::Instant::now() + block);
    let notifier = ctx.wake.notifier(request.environment_id);
    loop {
        // Registered before the query, so a commit between query and wait still wakes us.
        let woken = notifier.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();

        let mut conn = match held.take() {
            Some(conn) => conn,
            None => ctx.db.acquire().await?,
        };
        let token = ids::new_secret(ids::SESSIONS_TOKEN_PREFIX);
        let now = ctx.now();
        let claimed = work::claim(
            &mut *conn,
            request.environment_id,
            request.key_id,
            now,
            request.reclaim_after,
            &ids::sha256(&token),
            request.worker_id,
        )
        .await?;
        if let Some(row) = claimed {
            Metrics::count(&ctx.metrics.claims);
            if row.claim_epoch > 1 {
                Metrics::count(&ctx.metrics.reclaims);
            }
            let reclaims = row.claim_epoch - 1;
            if reclaims > i64::from(ctx.settings.max_reclaims) {
                drop(conn);
                give_up(ctx, row, reclaims).await?;
                continue;
            }
            return Ok(Some((row, ids::encode_work_secret(&token))));
        }
        if !keys::is_live(&mut *conn, request.key_id).await? {
            return Err(revoked());
        }
        drop(conn);
        let Some(deadline) = deadline else { break };
        tokio::select! {
            _ = &mut woken => continue,
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    Metrics::count(&ctx.metrics.empty_polls);
    Ok(None)
}

/// Why an item reclaimed past the limit was failed (its Session's
/// `session.error`, a healthcheck's result).
pub fn reclaim_limit_message(work_id: &str, reclaims: i64, max_reclaims: u32) -> String {
    format!(
        "Work {work_id} was reclaimed {reclaims} times without finishing (the limit is {max_reclaims}): \
         every worker that took it lost its lease, so it was failed rather than handed out again"
    )
}

/// Fails an item its workers never finished: the reason goes where Fail
/// puts one (the Session's `session.error`, a healthcheck's result).
async fn give_up(ctx: &ApiContext, row: WorkRow, reclaims: i64) -> ApiResult<()> {
    let message = reclaim_limit_message(&row.id, reclaims, ctx.settings.max_reclaims);
    tracing::warn!(work_id = %row.id, reclaims, "reclaim limit reached; failing the Work");
    Metrics::count(&ctx.metrics.reclaim_limit_failures);
    match fail::fail(ctx, row, Fence::Operator, &message).await {
        // Someone else (a Stop, a racing poller) moved it first: nothing to do.
        Ok(_) => Ok(()),
        Err(err) if err.status.is_client_error() => Ok(()),
        Err(err) => Err(err),
    }
}
