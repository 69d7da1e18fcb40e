//! Live Session event feeds: one reader task per Session per api process
//! fetches newly committed events once and broadcasts them to every open
//! stream of that Session, so 50 readers cost one query per commit, not 50.
//!
//! The database stays the source of truth: a stream that sees a gap in the
//! sequence numbers, lags behind the broadcast, or simply ticks (once a second)
//! reads the missing events itself. A lost NOTIFY or a slow reader therefore
//! costs latency, never an event.

use crate::store::sessions::{self, EventRow};
use serde_json::Value;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, Notify};

/// One committed event, shared by every stream that forwards it.
#[derive(Clone, Debug)]
pub struct FedEvent {
    pub seq: i64,
    pub body: Arc<Value>,
}

impl From<EventRow> for FedEvent {
    fn from(row: EventRow) -> Self {
        FedEvent {
            seq: row.seq,
            body: Arc::new(row.body),
        }
    }
}

struct Feed {
    tx: broadcast::Sender<FedEvent>,
    wake: Arc<Notify>,
}

pub struct SessionFeeds {
    db: PgPool,
    feeds: Mutex<HashMap<String, Feed>>,
}

/// Events per read, and the broadcast buffer (a reader further behind re-reads the database).
const BATCH: i64 = 500;
const BUFFER: usize = 1024;
/// A feeder re-reads at least this often even without a notification.
const IDLE_READ: Duration = Duration::from_secs(1);

impl SessionFeeds {
    pub fn new(db: PgPool) -> Self {
        SessionFeeds {
            db,
            feeds: Mutex::default(),
        }
    }

    /// Subscribes to Session `id`'s feed, starting its reader when it is the first.
    /// Subscribe before reading the starting sequence number, so nothing
    /// committed in between is missed.
    pub fn subscribe(self: &Arc<Self>, id: &str) -> broadcast::Receiver<FedEvent> {
        let mut feeds = self.feeds.lock().expect("feeds lock");
        if let Some(feed) = feeds.get(id) {
            return feed.tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(BUFFER);
        let wake = Arc::new(Notify::new());
        feeds.insert(
            id.to_string(),
            Feed {
                tx: tx.clone(),
                wake: wake.clone(),
            },
        );
        tokio::spawn(self.clone().feed(id.to_string(), tx, wake));
        rx
    }

    /// A commit touched Session `id` (from LISTEN).
    pub fn wake(&self, id: &str) {
        if let Some(feed) = self.feeds.lock().expect("feeds lock").get(id) {
            feed.wake.notify_one();
        }
    }

    /// Notifications may have been lost (listener reconnect): everyone re-reads.
    pub fn wake_all(&self) {
        for feed in self.feeds.lock().expect("feeds lock").values() {
            feed.wake.notify_one();
        }
    }

    async fn feed(self: Arc<Self>, id: String, tx: broadcast::Sender<FedEvent>, wake: Arc<Notify>) {
        let mut last = match sessions::last_seq(&self.db, &id).await {
            Ok(Some(seq)) => seq,
            _ => 0,
        };
        loop {
            let _ = tokio::time::timeout(IDLE_READ, wake.notified()).await;
            // Stop when the last stream has gone; checked under the map lock so
            // a stream subscribing right now either sees this feed or a new one.
            {
                let mut feeds = self.feeds.lock().expect("feeds lock");
                if tx.receiver_count() == 0 {
                    feeds.remove(&id);
                    return;
                }
            }
            loop {
                match sessions::events_after(&self.db, &id, last, BATCH).await {
                    Ok(rows) => {
                        let full = rows.len() as i64 == BATCH;
                        for row in rows {
                            last = row.seq;
                            let _ = tx.send(row.into());
                        }
                        if !full {
                            break;
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, session_id = %id, "event feed read failed");
                        break;
                    }
                }
            }
        }
    }
}
