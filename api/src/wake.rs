//! In-process wake-ups for long polls. One LISTEN connection per api process
//! fans `mango_work` notifications out to the pollers of each Environment.
//! A notification is only a hint: a woken poller always re-queries, and a
//! listener reconnect wakes everyone because notifications may have been lost.

use crate::ApiContext;
use sqlx::postgres::PgListener;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

pub const CHANNEL: &str = "mango_work";
/// Payload: `"<session id> <last_seq>"`, the Session whose event log grew and how far.
pub const EVENTS_CHANNEL: &str = "mango_events";
/// Payload: the Session id with new input for the agent loop.
pub const OUTBOX_CHANNEL: &str = "mango_outbox";

/// `notification_wanted()` (migration 6) restated for a statement to inline:
/// false only when the committing connection's process is registered in
/// `listeners` and no other process is. The api's log statements notify for
/// themselves with it (migration 9), as subplans instead of two trigger calls.
pub const NOTIFICATION_WANTED_SQL: &str =
    "(NOT EXISTS (SELECT 1 FROM listeners WHERE process = current_setting('application_name'))
      OR EXISTS (SELECT 1 FROM listeners WHERE process <> current_setting('application_name')))";

/// A CTE named `notify` for a statement whose CTE `fence` returns the moved
/// Session row (`id`, `last_seq`): when notifications are wanted, what the
/// triggers would have sent for it, `mango_events` and, if the statement
/// wrote a wake-up row, `mango_outbox`. A statement using it marks its writes
/// (`sessions.notified_seq`, `outbox.notified`) so the triggers skip them, and
/// must reference `notify` (an unreferenced CTE without writes never runs).
pub fn notify_cte(outbox: bool) -> String {
    let outbox = if outbox {
        format!(", pg_notify('{OUTBOX_CHANNEL}', fence.id)")
    } else {
        String::new()
    };
    format!(
        "notify AS (
             SELECT pg_notify('{EVENTS_CHANNEL}', fence.id || ' ' || fence.last_seq){outbox}
             FROM fence WHERE {NOTIFICATION_WANTED_SQL}
         )"
    )
}

#[derive(Default)]
pub struct WakeHub {
    environments: Mutex<HashMap<String, Arc<Notify>>>,
}

impl WakeHub {
    /// The notifier for one Environment. Create and `enable()` its `notified()`
    /// future before querying, so a wake-up between query and wait is not lost.
    pub fn notifier(&self, environment_id: &str) -> Arc<Notify> {
        let mut map = self.environments.lock().expect("wake hub lock");
        map.entry(environment_id.to_string()).or_default().clone()
    }

    pub fn wake(&self, environment_id: &str) {
        let notify = self
            .environments
            .lock()
            .expect("wake hub lock")
            .get(environment_id)
            .cloned();
        if let Some(n) = notify {
            n.notify_waiters();
        }
    }

    pub fn wake_all(&self) {
        let all: Vec<_> = self
            .environments
            .lock()
            .expect("wake hub lock")
            .values()
            .cloned()
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }
}

/// Runs until the process exits, reconnecting with back-off. Once it
/// listens, it registers the process so that other processes notify it; a
/// process whose pool has no api-process name registers under a name none of
/// its writes carry, so every process keeps notifying it.
pub async fn listen(ctx: ApiContext) {
    let (hub, events, agent) = (&ctx.wake, &ctx.events, &ctx.agent_wake);
    let process = match &ctx.process {
        Some(name) => name.to_string(),
        None => crate::ids::new_id("unnamed"),
    };
    // Whatever may have been missed (not yet listening, or the connection
    // dropped): every long poll, stream and the agent loop look again.
    let look_again = || {
        hub.wake_all();
        events.wake_all();
        agent.notify_waiters();
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        match PgListener::connect_with(&ctx.db).await {
            Ok(mut listener) => match subscribe(&mut listener, &process).await {
                Ok(()) => {
                    backoff = Duration::from_millis(100);
                    ctx.listening.send_replace(true);
                    look_again();
                    loop {
                        match listener.try_recv().await {
                            Ok(Some(n)) if n.channel() == EVENTS_CHANNEL => {
                                let (session, last_seq) =
                                    crate::feed::parse_notification(n.payload());
                                events.wake(session, last_seq)
                            }
                            Ok(Some(n)) if n.channel() == OUTBOX_CHANNEL => agent.notify_waiters(),
                            Ok(Some(n)) => hub.wake(n.payload()),
                            Ok(None) => {
                                // The connection dropped and sqlx re-established
                                // it; until it registers again, a peer may have
                                // cleared its row and skipped notifying.
                                tracing::warn!("work listener reconnected");
                                if let Err(err) = subscribe(&mut listener, &process).await {
                                    tracing::warn!(error = %err, "listener could not register again");
                                    break;
                                }
                                look_again();
                            }
                            Err(err) => {
                                tracing::warn!(error = %err, "work listener failed");
                                break;
                            }
                        }
                    }
                }
                Err(err) => tracing::warn!(error = %err, "LISTEN failed"),
            },
            Err(err) => tracing::warn!(error = %err, "work listener could not connect"),
        }
        ctx.listening.send_replace(false);
        look_again();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// LISTENs, then registers `process` under this connection's backend,
/// clearing registrations whose backend is gone.
async fn subscribe(listener: &mut PgListener, process: &str) -> sqlx::Result<()> {
    listener
        .listen_all([CHANNEL, EVENTS_CHANNEL, OUTBOX_CHANNEL])
        .await?;
    sqlx::query(
            "WITH gone AS (
                 DELETE FROM listeners
                 WHERE process <> $1
                   AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
             )
             INSERT INTO listeners (process, backend_pid) VALUES ($1, pg_backend_pid())
             ON CONFLICT (process) DO UPDATE SET backend_pid = EXCLUDED.backend_pid, registered_at = now()",
        )
        .bind(process)
        .execute(&mut *listener)
        .await?;
    Ok(())
}
