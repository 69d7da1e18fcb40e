//! What the suite watches of kept sandboxes (spec §7.1), four times a
//! second while a kept scenario runs: each running container of the Docker
//! pool, the Session it serves and the item it is bound to now (Docker
//! cannot relabel a container, so a rebound one's current item is on its
//! newest binding record), judged against the Work rows by a pure function:
//! no container bound to two Sessions in its life, none bound to an item
//! while the item before it still runs, none left waiting past its keep.

use super::sandboxes;
use super::system::{names, System};
use bollard::query_parameters::ListVolumesOptions;
use mango_controller::core::naming::{LABEL_POOL, LABEL_SESSION_ID, LABEL_WORK_ID};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// On a binding record: its container's id, and which of the container's
/// bindings it is (the Docker launcher's labels; the highest is current).
const LABEL_CONTAINER: &str = "mango.dev/container";
const LABEL_GENERATION: &str = "mango.dev/binding-generation";

/// A running container of the pool and what it is bound to now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub container: String,
    pub session: Option<String>,
    pub work_id: String,
}

/// The pool's running containers, each with its current binding.
pub async fn bindings(docker: &bollard::Docker) -> Vec<Binding> {
    let records = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![
                    format!("{LABEL_POOL}={}", names().docker_pool),
                    LABEL_CONTAINER.to_string(),
                ],
            )])),
        }))
        .await
        .map(|v| v.volumes.unwrap_or_default())
        .unwrap_or_default();
    let mut current: HashMap<String, (u64, HashMap<String, String>)> = HashMap::new();
    for record in records {
        let Some(container) = record.labels.get(LABEL_CONTAINER).cloned() else {
            continue;
        };
        let generation = record
            .labels
            .get(LABEL_GENERATION)
            .and_then(|g| g.parse().ok())
            .unwrap_or(0);
        if current.get(&container).is_none_or(|(g, _)| *g < generation) {
            current.insert(container, (generation, record.labels));
        }
    }
    let mut out = Vec::new();
    for c in sandboxes::pool_containers(docker, false).await {
        let Some(id) = c.id else { continue };
        let own: BTreeMap<String, String> = c.labels.unwrap_or_default().into_iter().collect();
        let labels: BTreeMap<String, String> = match current.get(&id) {
            Some((_, record)) => record.clone().into_iter().collect(),
            None => own.clone(),
        };
        let Some(work_id) = labels.get(LABEL_WORK_ID).filter(|w| !w.is_empty()) else {
            // A warm container bound to nothing yet.
            continue;
        };
        out.push(Binding {
            container: id,
            // The current binding's Session: a container's own labels
            // keep its first forever.
            session: labels
                .get(LABEL_SESSION_ID)
                .or(own.get(LABEL_SESSION_ID))
                .cloned(),
            work_id: work_id.clone(),
        });
    }
    out
}

/// What the kept watch remembers between samples.
pub struct KeptJudge {
    /// How long a sandbox may wait after its item ended: the keep, plus the
    /// time its supervisor takes to notice (its sweep, or a restart).
    bound: Duration,
    session_of: HashMap<String, String>,
    item_of: HashMap<String, String>,
    waiting_since: HashMap<String, Instant>,
    reported: HashSet<String>,
    /// The most containers seen waiting at once.
    pub most_waiting: usize,
}

impl KeptJudge {
    pub fn new(keep: Duration, sweep_bound: Duration) -> KeptJudge {
        KeptJudge {
            bound: keep + sweep_bound,
            session_of: HashMap::new(),
            item_of: HashMap::new(),
            waiting_since: HashMap::new(),
            reported: HashSet::new(),
            most_waiting: 0,
        }
    }

    /// One sample: the pool's `bindings`, then each Work's state (read
    /// after them), at `now`; what broke is pushed to `out`, once each.
    pub fn sample(
        &mut self,
        bindings: &[Binding],
        states: &HashMap<String, String>,
        now: Instant,
        out: &mut Vec<String>,
    ) {
        let running: HashSet<&str> = bindings.iter().map(|b| b.container.as_str()).collect();
        self.waiting_since
            .retain(|c, _| running.contains(c.as_str()));
        for b in bindings {
            let c = &b.container;
            if let Some(session) = &b.session {
                match self.session_of.get(c) {
                    Some(had) if had != session => {
                        if self.reported.insert(format!("sessions {c}")) {
                            out.push(format!(
                                "kept: container {c} was bound to Session {had}, then to {session}"
                            ));
                        }
                    }
                    Some(_) => {}
                    None => {
                        self.session_of.insert(c.clone(), session.clone());
                    }
                }
            }
            if let Some(before) = self.item_of.get(c) {
                let state = states.get(before).map(String::as_str).unwrap_or("unknown");
                if *before != b.work_id
                    && state != "stopped"
                    && self.reported.insert(format!("items {c} {}", b.work_id))
                {
                    out.push(format!(
                        "kept: container {c} was bound to {} while it still served {before} ({state})",
                        b.work_id
                    ));
                }
            }
            self.item_of.insert(c.clone(), b.work_id.clone());
            if states.get(&b.work_id).map(String::as_str) == Some("stopped") {
                let since = *self.waiting_since.entry(c.clone()).or_insert(now);
                let waited = now.duration_since(since);
                if waited > self.bound && self.reported.insert(format!("left {c}")) {
                    out.push(format!(
                        "kept: container {c} still runs {:.1} s after its item {} ended (keep + sweep: {} s)",
                        waited.as_secs_f64(),
                        b.work_id,
                        self.bound.as_secs()
                    ));
                }
            } else {
                self.waiting_since.remove(c);
            }
        }
        self.most_waiting = self.most_waiting.max(self.waiting_since.len());
    }
}

/// The kept watch over a scenario.
pub struct KeptWatch {
    judge: Arc<Mutex<(KeptJudge, Vec<String>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl KeptWatch {
    pub fn start(system: Arc<System>, keep: Duration, sweep_bound: Duration) -> KeptWatch {
        let judge = Arc::new(Mutex::new((KeptJudge::new(keep, sweep_bound), Vec::new())));
        let shared = judge.clone();
        let task = tokio::spawn(async move {
            loop {
                let bound = bindings(&system.docker).await;
                let states: Result<Vec<(String, String)>, _> =
                    sqlx::query_as("SELECT id, state FROM work WHERE environment_id = $1")
                        .bind(&system.env_id)
                        .fetch_all(&system.db)
                        .await;
                if let Ok(states) = states {
                    let states: HashMap<String, String> = states.into_iter().collect();
                    let mut guard = shared.lock().unwrap();
                    let (judge, out) = &mut *guard;
                    judge.sample(&bound, &states, Instant::now(), out);
                }
                // Poll interval: four samples a second.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        KeptWatch { judge, task }
    }

    /// What broke, and the most containers seen waiting at once.
    pub fn finish(self) -> (Vec<String>, usize) {
        self.task.abort();
        let mut guard = self.judge.lock().unwrap();
        let (judge, out) = &mut *guard;
        (std::mem::take(out), judge.most_waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(container: &str, session: &str, work: &str) -> Binding {
        Binding {
            container: container.into(),
            session: Some(session.into()),
            work_id: work.into(),
        }
    }

    fn states(of: &[(&str, &str)]) -> HashMap<String, String> {
        of.iter()
            .map(|(w, s)| (w.to_string(), s.to_string()))
            .collect()
    }

    fn judge() -> KeptJudge {
        KeptJudge::new(Duration::from_secs(15), Duration::from_secs(10))
    }

    #[test]
    fn a_kept_container_rebound_to_its_sessions_next_item_breaks_nothing() {
        let (mut j, mut out, t) = (judge(), Vec::new(), Instant::now());
        j.sample(
            &[bound("c1", "s1", "w1")],
            &states(&[("w1", "active")]),
            t,
            &mut out,
        );
        let ended = states(&[("w1", "stopped"), ("w2", "starting")]);
        j.sample(
            &[bound("c1", "s1", "w1")],
            &ended,
            t + Duration::from_secs(5),
            &mut out,
        );
        j.sample(
            &[bound("c1", "s1", "w2")],
            &ended,
            t + Duration::from_secs(6),
            &mut out,
        );
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(j.most_waiting, 1);
    }

    #[test]
    fn a_container_bound_to_two_sessions_breaks_it() {
        let (mut j, mut out, t) = (judge(), Vec::new(), Instant::now());
        let s = states(&[("w1", "stopped"), ("w2", "active")]);
        j.sample(&[bound("c1", "s1", "w1")], &s, t, &mut out);
        j.sample(&[bound("c1", "s2", "w2")], &s, t, &mut out);
        j.sample(&[bound("c1", "s2", "w2")], &s, t, &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].contains("Session s1, then to s2"), "{out:?}");
    }

    #[test]
    fn a_container_rebound_while_its_item_runs_served_two_at_once() {
        let (mut j, mut out, t) = (judge(), Vec::new(), Instant::now());
        let s = states(&[("w1", "active"), ("w2", "starting")]);
        j.sample(&[bound("c1", "s1", "w1")], &s, t, &mut out);
        j.sample(&[bound("c1", "s1", "w2")], &s, t, &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].contains("still served w1"), "{out:?}");
    }

    #[test]
    fn a_container_waiting_past_its_keep_and_sweep_is_left() {
        let (mut j, mut out, t) = (judge(), Vec::new(), Instant::now());
        let s = states(&[("w1", "stopped")]);
        j.sample(&[bound("c1", "s1", "w1")], &s, t, &mut out);
        j.sample(
            &[bound("c1", "s1", "w1")],
            &s,
            t + Duration::from_secs(25),
            &mut out,
        );
        assert!(out.is_empty(), "at the bound: {out:?}");
        j.sample(
            &[bound("c1", "s1", "w1")],
            &s,
            t + Duration::from_secs(26),
            &mut out,
        );
        j.sample(
            &[bound("c1", "s1", "w1")],
            &s,
            t + Duration::from_secs(27),
            &mut out,
        );
        assert_eq!(out.len(), 1, "{out:?}");
        // Gone, its wait forgotten; a live item's container never waits.
        let (mut j, mut out) = (judge(), Vec::new());
        j.sample(&[bound("c1", "s1", "w1")], &s, t, &mut out);
        j.sample(&[], &s, t + Duration::from_secs(1), &mut out);
        let live = states(&[("w1", "active")]);
        j.sample(
            &[bound("c1", "s1", "w1")],
            &live,
            t + Duration::from_secs(60),
            &mut out,
        );
        assert!(out.is_empty(), "{out:?}");
    }
}
