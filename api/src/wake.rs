//! In-process wake-ups for long polls. One LISTEN connection per api process
//! fans `mango_work` notifications out to the pollers of each Environment.
//! A notification is only a hint: a woken poller always re-queries, and a
//! listener reconnect wakes everyone because notifications may have been lost.

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

pub const CHANNEL: &str = "mango_work";
/// Payload: `"<session id> <last_seq>"`, the Session whose event log grew and how far.
pub const EVENTS_CHANNEL: &str = "mango_events";
/// Payload: the Session id with new input for the agent loop.
pub const OUTBOX_CHANNEL: &str = "mango_outbox";

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

/// Runs until the process exits, reconnecting with back-off.
pub async fn listen(
    pool: PgPool,
    hub: Arc<WakeHub>,
    events: Arc<crate::feed::SessionFeeds>,
    agent: Arc<Notify>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => match listener
                .listen_all([CHANNEL, EVENTS_CHANNEL, OUTBOX_CHANNEL])
                .await
            {
                Ok(()) => {
                    backoff = Duration::from_millis(100);
                    hub.wake_all();
                    events.wake_all();
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
                                // Connection dropped and was re-established; anything may have been missed.
                                tracing::warn!("work listener reconnected");
                                hub.wake_all();
                                events.wake_all();
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
        hub.wake_all();
        events.wake_all();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
