//! The LISTEN connection of an api process: one per process, fanning the
//! database's notifications out to long polls ([`crate::wake`]), Session
//! streams ([`crate::feed`]) and the agent loop. A reconnect wakes them all,
//! because notifications may have been lost meanwhile.

use crate::context::ApiContext;
use crate::store::listeners;
use sqlx::postgres::PgListener;
use std::time::Duration;

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
                            Ok(Some(n)) if n.channel() == listeners::EVENTS_CHANNEL => {
                                let (session, last_seq) =
                                    crate::feed::parse_notification(n.payload());
                                events.wake(session, last_seq)
                            }
                            Ok(Some(n)) if n.channel() == listeners::OUTBOX_CHANNEL => {
                                agent.notify_waiters()
                            }
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
    listener.listen_all(listeners::CHANNELS).await?;
    listeners::register(&mut *listener, process).await
}
