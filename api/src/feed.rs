//! Live Session event feeds: one feed per Session per api process broadcasts
//! each committed event once to every open stream of that Session, so 50
//! readers cost one delivery per commit, not 50 queries.
//!
//! Events reach a feed two ways. The request (or agent-loop step) that
//! admitted them publishes them in-process right after its commit: no
//! notification round trip, no re-read. Commits of other replicas arrive as a
//! NOTIFY carrying the Session's new `last_seq`, and the feed's reader task
//! reads what it has not delivered yet.
//!
//! The database stays the source of truth: a publication that does not follow
//! on from what the feed delivered wakes the reader instead, the reader re-reads
//! once a second anyway, and a stream that sees a gap in the sequence numbers
//! or lags behind the broadcast reads the missing events itself. A lost
//! NOTIFY, a publication out of order or a slow reader therefore costs
//! latency, never an event.

use crate::store::events::{self, LoggedEvent};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
#[cfg(feature = "bench-hooks")]
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, Notify};

struct Feed {
    tx: broadcast::Sender<LoggedEvent>,
    wake: Notify,
    /// The last sequence number broadcast; `None` until the reader has read
    /// where the log stood when the feed started.
    delivered: Mutex<Option<i64>>,
    /// How far the reader was asked to read (0: nothing pending; `i64::MAX`:
    /// read whatever there is).
    wanted: AtomicI64,
}

/// Sees each event at the moment its feed broadcasts it: the one instant
/// every stream of the Session shares, before any of them is scheduled.
/// `mango-bench` stamps admissions here (feature `bench-hooks`).
#[cfg(feature = "bench-hooks")]
pub type PublicationObserver = Box<dyn Fn(&str, &LoggedEvent) + Send + Sync>;

impl Feed {
    /// Broadcasts the part of `events` (ascending, contiguous) that follows on
    /// from what was delivered, showing each to `observe` first; `false` when
    /// they leave a gap.
    fn deliver(
        &self,
        events: impl IntoIterator<Item = LoggedEvent>,
        observe: impl Fn(&LoggedEvent),
    ) -> bool {
        let mut delivered = self.delivered.lock().expect("feed lock");
        let Some(last) = delivered.as_mut() else {
            return false;
        };
        for event in events {
            if event.seq <= *last {
                continue;
            }
            if event.seq != *last + 1 {
                return false;
            }
            *last = event.seq;
            observe(&event);
            let _ = self.tx.send(event);
        }
        true
    }

    /// Asks the reader to read up to `seq`.
    fn want(&self, seq: i64) {
        self.wanted.fetch_max(seq, Ordering::Relaxed);
        self.wake.notify_one();
    }

    fn has_delivered(&self, seq: i64) -> bool {
        self.delivered
            .lock()
            .expect("feed lock")
            .is_some_and(|last| last >= seq)
    }
}

pub struct SessionFeeds {
    db: PgPool,
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    #[cfg(feature = "bench-hooks")]
    observer: OnceLock<PublicationObserver>,
}

/// Events per read, and the broadcast buffer (a stream further behind re-reads the database).
const BATCH: i64 = 500;
const BUFFER: usize = 1024;
/// A feed's reader re-reads at least this often even without a notification.
const IDLE_READ: Duration = Duration::from_secs(1);

impl SessionFeeds {
    pub fn new(db: PgPool) -> Self {
        SessionFeeds {
            db,
            feeds: Mutex::default(),
            #[cfg(feature = "bench-hooks")]
            observer: OnceLock::new(),
        }
    }

    /// Installs the one [`PublicationObserver`]; `false` if there is one already.
    #[cfg(feature = "bench-hooks")]
    pub fn observe_publications(&self, observer: PublicationObserver) -> bool {
        self.observer.set(observer).is_ok()
    }

    #[cfg(feature = "bench-hooks")]
    fn observed<'a>(&'a self, id: &'a str) -> impl Fn(&LoggedEvent) + 'a {
        move |event| {
            if let Some(observe) = self.observer.get() {
                observe(id, event)
            }
        }
    }

    #[cfg(not(feature = "bench-hooks"))]
    fn observed(&self, _id: &str) -> impl Fn(&LoggedEvent) {
        |_| {}
    }

    /// Subscribes to Session `id`'s feed, starting it when this is the first
    /// stream. Subscribe before reading the starting sequence number, so
    /// nothing committed in between is missed.
    pub fn subscribe(self: &Arc<Self>, id: &str) -> broadcast::Receiver<LoggedEvent> {
        let mut feeds = self.feeds.lock().expect("feeds lock");
        if let Some(feed) = feeds.get(id) {
            return feed.tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(BUFFER);
        let feed = Arc::new(Feed {
            tx,
            wake: Notify::new(),
            delivered: Mutex::new(None),
            wanted: AtomicI64::new(0),
        });
        feeds.insert(id.to_string(), feed.clone());
        tokio::spawn(self.clone().read(id.to_string(), feed));
        rx
    }

    fn feed(&self, id: &str) -> Option<Arc<Feed>> {
        self.feeds.lock().expect("feeds lock").get(id).cloned()
    }

    /// Events this process just committed to Session `id` (ascending,
    /// contiguous, as `sessions::append` returns them). Call after the commit:
    /// a stream must never see an event that could still roll back.
    pub fn publish(&self, id: &str, events: &[LoggedEvent]) {
        if events.is_empty() {
            return;
        }
        if let Some(feed) = self.feed(id) {
            if !feed.deliver(events.iter().cloned(), self.observed(id)) {
                feed.want(i64::MAX);
            }
        }
    }

    /// A commit somewhere made Session `id`'s log reach `last_seq` (from
    /// LISTEN; `None` when the payload did not say).
    pub fn wake(&self, id: &str, last_seq: Option<i64>) {
        if let Some(feed) = self.feed(id) {
            match last_seq {
                Some(seq) if feed.has_delivered(seq) => {}
                Some(seq) => feed.want(seq),
                None => feed.want(i64::MAX),
            }
        }
    }

    /// Notifications may have been lost (listener reconnect): every feed re-reads.
    pub fn wake_all(&self) {
        for feed in self.feeds.lock().expect("feeds lock").values() {
            feed.want(i64::MAX);
        }
    }

    /// The feed's reader: starts at the log's current end, then delivers what
    /// publications did not, until the last stream has gone.
    async fn read(self: Arc<Self>, id: String, feed: Arc<Feed>) {
        let start = loop {
            match events::last_seq(&self.db, &id).await {
                Ok(seq) => break seq.unwrap_or(0),
                Err(err) => {
                    tracing::warn!(error = %err, session_id = %id, "event feed cannot start");
                    tokio::time::sleep(IDLE_READ).await;
                }
            }
        };
        *feed.delivered.lock().expect("feed lock") = Some(start);
        loop {
            let woken = tokio::time::timeout(IDLE_READ, feed.wake.notified())
                .await
                .is_ok();
            // Stop when the last stream has gone; checked under the map lock so
            // a stream subscribing right now either sees this feed or a new one.
            {
                let mut feeds = self.feeds.lock().expect("feeds lock");
                if feed.tx.receiver_count() == 0 {
                    feeds.remove(&id);
                    return;
                }
            }
            // A notification of a commit this process has published meanwhile
            // (its own admission, usually) needs no read.
            let wanted = feed.wanted.swap(0, Ordering::Relaxed);
            if woken && wanted != i64::MAX && feed.has_delivered(wanted) {
                continue;
            }
            loop {
                let from = feed.delivered.lock().expect("feed lock").unwrap_or(start);
                match events::after(&self.db, &id, from, BATCH).await {
                    Ok(rows) => {
                        let full = rows.len() as i64 == BATCH;
                        feed.deliver(rows.into_iter().map(LoggedEvent::from), self.observed(&id));
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

/// The `mango_events` payload: `"<session id> <last_seq>"` (a bare id from an
/// older trigger is still understood).
pub fn parse_notification(payload: &str) -> (&str, Option<i64>) {
    match payload.rsplit_once(' ') {
        Some((id, seq)) => (id, seq.parse().ok()),
        None => (payload, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn feed_at(last: Option<i64>) -> (Feed, broadcast::Receiver<LoggedEvent>) {
        let (tx, rx) = broadcast::channel(16);
        let feed = Feed {
            tx,
            wake: Notify::new(),
            delivered: Mutex::new(last),
            wanted: AtomicI64::new(0),
        };
        (feed, rx)
    }

    fn events(seqs: std::ops::RangeInclusive<i64>) -> Vec<LoggedEvent> {
        seqs.map(|seq| LoggedEvent {
            seq,
            body: Arc::new(json!({"seq": seq})),
        })
        .collect()
    }

    fn received(rx: &mut broadcast::Receiver<LoggedEvent>) -> Vec<i64> {
        std::iter::from_fn(|| rx.try_recv().ok().map(|e| e.seq)).collect()
    }

    #[test]
    fn a_publication_that_follows_on_is_broadcast() {
        let (feed, mut rx) = feed_at(Some(4));
        assert!(feed.deliver(events(5..=7), |_| {}));
        assert_eq!(received(&mut rx), vec![5, 6, 7]);
        assert!(feed.has_delivered(7));
        assert!(!feed.has_delivered(8));
    }

    #[test]
    fn what_was_delivered_already_is_skipped() {
        let (feed, mut rx) = feed_at(Some(6));
        assert!(feed.deliver(events(5..=8), |_| {}));
        assert_eq!(received(&mut rx), vec![7, 8]);
        assert!(feed.deliver(events(3..=4), |_| {}));
        assert!(received(&mut rx).is_empty());
    }

    #[test]
    fn the_observer_sees_exactly_what_is_broadcast_before_any_stream_does() {
        let (feed, mut rx) = feed_at(Some(4));
        let seen = std::cell::RefCell::new(Vec::new());
        let observe = |e: &LoggedEvent| {
            assert_eq!(rx.len() as i64, e.seq - 5, "observed before it is sent");
            seen.borrow_mut().push(e.seq)
        };
        assert!(feed.deliver(events(3..=6), observe));
        assert!(!feed.deliver(events(8..=9), |e| seen.borrow_mut().push(e.seq)));
        assert_eq!(
            *seen.borrow(),
            vec![5, 6],
            "skipped and gapped events are not observed"
        );
        assert_eq!(received(&mut rx), vec![5, 6]);
    }

    #[test]
    fn a_gap_is_not_broadcast_and_asks_for_a_read() {
        let (feed, mut rx) = feed_at(Some(4));
        assert!(!feed.deliver(events(6..=7), |_| {}));
        assert!(received(&mut rx).is_empty());
        assert!(!feed.has_delivered(5));
    }

    #[test]
    fn nothing_is_broadcast_before_the_feed_knows_where_the_log_stood() {
        let (feed, mut rx) = feed_at(None);
        assert!(!feed.deliver(events(1..=2), |_| {}));
        assert!(received(&mut rx).is_empty());
        assert!(!feed.has_delivered(0));
    }

    #[test]
    fn notification_payloads() {
        assert_eq!(parse_notification("sesn_1 42"), ("sesn_1", Some(42)));
        assert_eq!(parse_notification("sesn_1"), ("sesn_1", None));
        assert_eq!(parse_notification("sesn_1 x"), ("sesn_1", None));
    }
}
