//! Fail (spec §3): the terminal path for a permanent, immutable-input error.
//! In one transaction the Work stops and its Session (and all its Threads)
//! terminate with `session_input_failed_error`. The holder calls it with its
//! token; Poll calls it for an item reclaimed past the limit.

use crate::context::ApiContext;
use crate::error::ApiResult;
use crate::lease::Lease;
use crate::service::work::{self, Fence};
use crate::store::events;
use crate::store::sessions;
use crate::store::work::WorkRow;
use mango_protocol::events::{
    EventBody, RetryStatus, SessionError, SessionErrorDetail, SessionErrorType,
};
use mango_protocol::time;

pub async fn fail(
    ctx: &ApiContext,
    row: WorkRow,
    fence: Fence<'_>,
    message: &str,
) -> ApiResult<(WorkRow, Lease)> {
    let mut tx = ctx.db.begin().await?;
    // The Session first: Fail, admission and the agent loop lock it before Work.
    let mut session = match &row.session_id {
        Some(session_id) => sessions::lock(&mut tx, session_id).await?,
        None => None,
    };
    let (row, lease) = match work::fail(ctx, &mut tx, row, fence, message).await {
        Ok(failed) => failed,
        Err(refusal) if refusal.status.is_client_error() => {
            // A refused Fail still keeps what reconciling moved (a timed-out
            // check, a run-out stopping lease), as every other transition does.
            tx.commit().await?;
            ctx.agent_wake.notify_waiters();
            return Err(refusal);
        }
        Err(err) => return Err(err),
    };
    let appended = match session.as_mut() {
        Some(session) => {
            let error = EventBody::SessionError(SessionError {
                error: SessionErrorDetail {
                    kind: SessionErrorType::SessionInputFailedError,
                    message: message.to_string(),
                    retry_status: RetryStatus::Terminal,
                },
            });
            let terminated = EventBody::SessionStatusTerminated;
            events::append(
                &mut tx,
                session,
                vec![error, terminated],
                false,
                time::now(),
            )
            .await?
        }
        None => Vec::new(),
    };
    tx.commit().await?;
    if let Some(session) = &session {
        ctx.committed(&session.id, &appended, false);
    }
    // The stop's wake-up row committed with the transaction.
    ctx.agent_wake.notify_waiters();
    crate::metrics::Metrics::count(&ctx.metrics.fails);
    Ok((row, lease))
}
