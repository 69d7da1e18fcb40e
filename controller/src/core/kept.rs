//! The kept sandboxes' bookkeeping (spec §7.1): after an activation that
//! ended at its runner's idle end, the sandbox waits, bound to no item, for
//! its Session's next envelope. Keyed by Session id (a sandbox serves one
//! Session in its life), each held by value so it is handed out once, and
//! bounded: admitting one past the bound evicts the oldest.

use crate::core::launcher::Sandbox;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;
use tokio::task::AbortHandle;

struct Entry {
    sandbox: Sandbox,
    since: Instant,
    /// The task that notices its runner exiting, or its keep running out.
    watcher: Option<AbortHandle>,
}

pub struct KeptSandboxes {
    bound: usize,
    by_session: Mutex<HashMap<String, Entry>>,
}

impl KeptSandboxes {
    /// At most `bound` kept at once; 0 keeps none.
    pub fn new(bound: usize) -> KeptSandboxes {
        KeptSandboxes {
            bound,
            by_session: Mutex::default(),
        }
    }

    pub fn count(&self) -> usize {
        self.by_session.lock().expect("kept lock").len()
    }

    /// Whether Session `session_id` has a kept sandbox now.
    pub fn holds(&self, session_id: &str) -> bool {
        self.by_session
            .lock()
            .expect("kept lock")
            .contains_key(session_id)
    }

    /// Keeps `sandbox` for `session_id`. Returns what must be removed now:
    /// `sandbox` itself when none may be kept, else the oldest ones past the
    /// bound, and any one kept for that Session before (never two of one
    /// Session).
    pub fn admit(&self, session_id: &str, sandbox: Sandbox, now: Instant) -> Vec<Sandbox> {
        if self.bound == 0 {
            return vec![sandbox];
        }
        let mut kept = self.by_session.lock().expect("kept lock");
        let mut out: Vec<Sandbox> = kept.remove(session_id).into_iter().map(unwatched).collect();
        while kept.len() >= self.bound {
            let oldest = kept
                .iter()
                .min_by_key(|(_, e)| e.since)
                .map(|(s, _)| s.clone())
                .expect("a full registry has an oldest");
            out.extend(kept.remove(&oldest).map(unwatched));
        }
        kept.insert(
            session_id.to_string(),
            Entry {
                sandbox,
                since: now,
                watcher: None,
            },
        );
        out
    }

    /// Records the task watching the kept sandbox `handle`; if it is no
    /// longer kept the task is ended at once.
    pub fn watch(&self, handle: &str, watcher: AbortHandle) {
        let mut kept = self.by_session.lock().expect("kept lock");
        match kept.values_mut().find(|e| e.sandbox.handle == handle) {
            Some(entry) => entry.watcher = Some(watcher),
            None => watcher.abort(),
        }
    }

    /// Session `session_id`'s kept sandbox, now the caller's alone.
    pub fn take(&self, session_id: &str) -> Option<Sandbox> {
        let taken = self
            .by_session
            .lock()
            .expect("kept lock")
            .remove(session_id);
        taken.map(unwatched)
    }

    /// Takes the kept sandbox `handle` out (its runner exited, or its keep
    /// ran out); `None` when it is not kept any more (taken meanwhile: no
    /// longer the registry's to remove).
    pub fn forget(&self, handle: &str) -> Option<Sandbox> {
        let mut kept = self.by_session.lock().expect("kept lock");
        let session = kept
            .iter()
            .find(|(_, e)| e.sandbox.handle == handle)
            .map(|(s, _)| s.clone())?;
        kept.remove(&session).map(|e| e.sandbox)
    }

    /// Takes every kept sandbox out (on drain), their watchers ended.
    pub fn drain(&self) -> Vec<Sandbox> {
        let mut kept = self.by_session.lock().expect("kept lock");
        kept.drain().map(|(_, e)| unwatched(e)).collect()
    }
}

fn unwatched(entry: Entry) -> Sandbox {
    if let Some(watcher) = entry.watcher {
        watcher.abort();
    }
    entry.sandbox
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::launcher::ItemIdentity;
    use mango_protocol::WorkType;
    use std::time::Duration;

    fn sandbox(n: u32) -> Sandbox {
        Sandbox {
            name: format!("s{n}"),
            handle: format!("h{n}"),
            item: ItemIdentity {
                work_id: format!("work_{n}"),
                claim: 1,
                environment_id: "env".into(),
                work_type: WorkType::Session,
                session_id: Some(format!("sesn_{n}")),
            },
        }
    }

    #[test]
    fn each_is_taken_once_by_its_own_session() {
        let kept = KeptSandboxes::new(2);
        let now = Instant::now();
        assert!(kept.admit("sesn_1", sandbox(1), now).is_empty());
        assert_eq!(kept.take("sesn_2"), None, "another Session's is not taken");
        assert_eq!(kept.take("sesn_1"), Some(sandbox(1)));
        assert_eq!(kept.take("sesn_1"), None, "never handed out twice");
        assert_eq!(kept.count(), 0);
    }

    #[test]
    fn the_oldest_is_evicted_past_the_bound() {
        let kept = KeptSandboxes::new(2);
        let now = Instant::now();
        assert!(kept.admit("sesn_2", sandbox(2), now).is_empty());
        assert!(kept
            .admit("sesn_1", sandbox(1), now + Duration::from_secs(1))
            .is_empty());
        let evicted = kept.admit("sesn_3", sandbox(3), now + Duration::from_secs(2));
        assert_eq!(
            evicted,
            vec![sandbox(2)],
            "the oldest goes, not the first key"
        );
        assert_eq!(kept.count(), 2);
        assert_eq!(kept.take("sesn_2"), None);
        assert_eq!(kept.take("sesn_1"), Some(sandbox(1)));
    }

    #[test]
    fn a_session_never_has_two() {
        let kept = KeptSandboxes::new(3);
        let now = Instant::now();
        kept.admit("sesn_1", sandbox(1), now);
        let mut other = sandbox(9);
        other.item.session_id = Some("sesn_1".into());
        assert_eq!(kept.admit("sesn_1", other.clone(), now), vec![sandbox(1)]);
        assert_eq!(kept.take("sesn_1"), Some(other));
    }

    #[test]
    fn a_dead_or_drained_one_leaves_and_a_taken_one_is_not_forgotten() {
        let kept = KeptSandboxes::new(3);
        let now = Instant::now();
        for n in 1..=3 {
            kept.admit(&format!("sesn_{n}"), sandbox(n), now);
        }
        assert_eq!(kept.forget("h2"), Some(sandbox(2)));
        assert_eq!(kept.forget("h2"), None);
        assert_eq!(kept.take("sesn_3"), Some(sandbox(3)));
        assert_eq!(
            kept.forget("h3"),
            None,
            "a taken one is its item's: its watcher must not remove it"
        );
        assert_eq!(kept.drain(), vec![sandbox(1)]);
        assert_eq!(kept.count(), 0);
    }

    #[test]
    fn a_bound_of_zero_keeps_none() {
        let kept = KeptSandboxes::new(0);
        assert_eq!(
            kept.admit("sesn_1", sandbox(1), Instant::now()),
            vec![sandbox(1)]
        );
        assert_eq!(kept.take("sesn_1"), None);
    }
}
