//! Every container of the suite's Docker pool, its output followed into
//! `logs/container-<name>.log` for the secret check. Docker's event stream
//! names each container as it is created and started: a poll of the
//! container list missed those created, run and removed between two polls,
//! as a healthcheck's often is. Each one's logs are read from their first
//! line once it has started (before that a follow ends at once, empty), and
//! a container whose logs could not be read is counted and fails the run:
//! the check cannot vouch for lines it never saw.

use bollard::models::EventMessage;
use bollard::query_parameters::{EventsOptions, ListContainersOptions, LogsOptions};
use bollard::Docker;
use futures::StreamExt;
use mango_controller::core::naming::LABEL_POOL;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where one container's logs stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Created, not started: nothing to read yet.
    Created,
    /// Started: its logs are being followed.
    Following,
    /// Followed to their end.
    Read,
    /// Removed without ever starting: it wrote nothing.
    NeverStarted,
    /// Started, and its logs could not be read (to the end).
    Unreadable(String),
}

/// What Docker said of a container of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Created,
    Started,
    Destroyed,
}

impl Seen {
    fn of(action: &str) -> Option<Seen> {
        match action {
            "create" => Some(Seen::Created),
            "start" => Some(Seen::Started),
            "destroy" => Some(Seen::Destroyed),
            _ => None,
        }
    }
}

/// The pool's containers in the order they were seen, and their states.
#[derive(Default)]
pub struct Tally {
    order: Vec<(String, String)>,
    states: HashMap<String, State>,
    reported: HashSet<String>,
}

/// The containers seen since a mark.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub seen: usize,
    pub read: usize,
    pub never_started: usize,
    /// Still running (or not yet started) when counted.
    pub following: usize,
    pub unreadable: usize,
}

impl Counts {
    pub fn line(&self) -> String {
        format!(
            "containers={} logs_read={} never_started={} still_followed={} logs_unreadable={}",
            self.seen, self.read, self.never_started, self.following, self.unreadable
        )
    }
}

impl Tally {
    /// Records what Docker said of container `id` (`name`); true when its
    /// logs are to be followed now (its first start).
    pub fn saw(&mut self, id: &str, name: &str, what: Seen) -> bool {
        let state = self.states.get(id).cloned();
        if state.is_none() {
            self.order.push((id.to_string(), name.to_string()));
        }
        let (next, follow) = match (state, what) {
            (None | Some(State::Created), Seen::Created) => (State::Created, false),
            (None | Some(State::Created), Seen::Started) => (State::Following, true),
            (Some(State::Created), Seen::Destroyed) => (State::NeverStarted, false),
            // A container met first at its removal: it ran unseen (the
            // stream was down), or never did; either way nothing was read.
            (None, Seen::Destroyed) => (
                State::Unreadable("met only at its removal".to_string()),
                false,
            ),
            // Events replayed after a reconnect, and a follow's own end,
            // change nothing here.
            (Some(known), _) => (known, false),
        };
        self.states.insert(id.to_string(), next);
        follow
    }

    /// A follow of container `id`'s logs ended: read to their end, or not.
    pub fn ended(&mut self, id: &str, outcome: Result<(), String>) {
        let next = match outcome {
            Ok(()) => State::Read,
            Err(why) => State::Unreadable(why),
        };
        self.states.insert(id.to_string(), next);
    }

    pub fn mark(&self) -> usize {
        self.order.len()
    }

    pub fn counts_since(&self, mark: usize) -> Counts {
        let mut counts = Counts::default();
        for (id, _) in self.order.iter().skip(mark) {
            counts.seen += 1;
            match self.states.get(id) {
                Some(State::Read) => counts.read += 1,
                Some(State::NeverStarted) => counts.never_started += 1,
                Some(State::Created | State::Following) | None => counts.following += 1,
                Some(State::Unreadable(_)) => counts.unreadable += 1,
            }
        }
        counts
    }

    /// The containers whose logs could not be read, each said once.
    pub fn take_unreadable(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (id, name) in &self.order {
            if let Some(State::Unreadable(why)) = self.states.get(id) {
                if self.reported.insert(id.clone()) {
                    out.push(format!("the logs of container {name} were not read: {why}"));
                }
            }
        }
        out
    }

    /// The containers still running or not yet started.
    pub fn unfinished(&self) -> Vec<String> {
        self.order
            .iter()
            .filter(|(id, _)| {
                matches!(
                    self.states.get(id),
                    Some(State::Created | State::Following) | None
                )
            })
            .map(|(_, name)| name.clone())
            .collect()
    }
}

/// The follower of the pool's containers, until [`ContainerLogs::finish`].
pub struct ContainerLogs {
    tally: Arc<Mutex<Tally>>,
    task: tokio::task::JoinHandle<()>,
}

impl ContainerLogs {
    /// Follows every container of `pool` that starts from now on (and those
    /// there already) into `logs`.
    pub fn follow(docker: Docker, pool: String, logs: PathBuf) -> ContainerLogs {
        let tally: Arc<Mutex<Tally>> = Arc::default();
        let task = tokio::spawn(watch(docker, pool, logs, tally.clone(), now_nanos()));
        ContainerLogs { tally, task }
    }

    pub fn mark(&self) -> usize {
        self.tally.lock().unwrap().mark()
    }

    pub fn counts_since(&self, mark: usize) -> Counts {
        self.tally.lock().unwrap().counts_since(mark)
    }

    pub fn take_unreadable(&self) -> Vec<String> {
        self.tally.lock().unwrap().take_unreadable()
    }

    /// Once every container is gone (the teardown removed them): waits up
    /// to `within` for their follows to end, then stops. The counts of the
    /// whole run, and what failed: logs not read, and follows still open.
    pub async fn finish(self, within: Duration) -> (Counts, Vec<String>) {
        let deadline = Instant::now() + within;
        while !self.tally.lock().unwrap().unfinished().is_empty() && Instant::now() < deadline {
            // Poll interval of this deadline loop.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.task.abort();
        let mut tally = self.tally.lock().unwrap();
        let mut failures = tally.take_unreadable();
        failures.extend(tally.unfinished().into_iter().map(|name| {
            format!("the logs of container {name} were still being read as the run ended")
        }));
        (tally.counts_since(0), failures)
    }
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Docker's `since`: seconds and nanoseconds.
fn since(nanos: i64) -> String {
    format!("{}.{:09}", nanos / 1_000_000_000, nanos % 1_000_000_000)
}

/// The events of the pool's containers from `from` on (Docker replays those
/// past), again from the last one seen whenever the stream breaks; and the
/// containers there already.
async fn watch(docker: Docker, pool: String, logs: PathBuf, tally: Arc<Mutex<Tally>>, from: i64) {
    let label = format!("{LABEL_POOL}={pool}");
    let mut from = from;
    let mut listed = false;
    loop {
        let mut events = docker.events(Some(EventsOptions {
            since: Some(since(from)),
            until: None,
            filters: Some(HashMap::from([
                ("type".to_string(), vec!["container".to_string()]),
                ("label".to_string(), vec![label.clone()]),
                (
                    "event".to_string(),
                    ["create", "start", "destroy"].map(String::from).to_vec(),
                ),
            ])),
        }));
        if !listed {
            // After the subscription (whose `since` covers the time between),
            // so that no container falls between the list and the events.
            listed = true;
            list_present(&docker, &label, &logs, &tally).await;
        }
        while let Some(Ok(event)) = events.next().await {
            from = from.max(event.time_nano.unwrap_or(from));
            on_event(&docker, &logs, &tally, &event);
        }
        // The stream broke (the daemon restarted?): subscribe again.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn list_present(docker: &Docker, label: &str, logs: &Path, tally: &Arc<Mutex<Tally>>) {
    let present = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![label.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap_or_default();
    for c in present {
        let Some(id) = c.id else { continue };
        let name = c
            .names
            .unwrap_or_default()
            .first()
            .map(|n| n.trim_start_matches('/').to_string())
            .unwrap_or_else(|| id.clone());
        let started = c
            .state
            .is_some_and(|s| !matches!(s, bollard::models::ContainerSummaryStateEnum::CREATED));
        let what = if started {
            Seen::Started
        } else {
            Seen::Created
        };
        if tally.lock().unwrap().saw(&id, &name, what) {
            spawn_follow(
                docker.clone(),
                id,
                logs.join(format!("container-{name}.log")),
                tally.clone(),
            );
        }
    }
}

fn on_event(docker: &Docker, logs: &Path, tally: &Arc<Mutex<Tally>>, event: &EventMessage) {
    let Some(what) = event.action.as_deref().and_then(Seen::of) else {
        return;
    };
    let Some(actor) = &event.actor else { return };
    let Some(id) = actor.id.clone() else { return };
    let name = actor
        .attributes
        .as_ref()
        .and_then(|a| a.get("name").cloned())
        .unwrap_or_else(|| id.clone());
    if tally.lock().unwrap().saw(&id, &name, what) {
        spawn_follow(
            docker.clone(),
            id,
            logs.join(format!("container-{name}.log")),
            tally.clone(),
        );
    }
}

fn spawn_follow(docker: Docker, id: String, path: PathBuf, tally: Arc<Mutex<Tally>>) {
    tokio::spawn(async move {
        let outcome = read_to_end(&docker, &id, &path).await;
        tally.lock().unwrap().ended(&id, outcome);
    });
}

/// Container `id`'s output from its first line to its exit, into `path`.
async fn read_to_end(docker: &Docker, id: &str, path: &Path) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut stream = docker.logs(
        id,
        Some(LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        }),
    );
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|err| match err {
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            } => "removed before its logs were read".to_string(),
            other => format!("reading its logs failed: {other}"),
        })?;
        file.write_all(&chunk.into_bytes())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_is_followed_once_from_its_first_start() {
        let mut t = Tally::default();
        assert!(!t.saw("a", "warm-a", Seen::Created));
        assert!(t.saw("a", "warm-a", Seen::Started));
        // Replayed after a reconnect: not followed twice.
        assert!(!t.saw("a", "warm-a", Seen::Created));
        assert!(!t.saw("a", "warm-a", Seen::Started));
        // Met first at its start (the stream came up after its create).
        assert!(t.saw("b", "b", Seen::Started));
        assert_eq!(
            t.counts_since(0),
            Counts {
                seen: 2,
                following: 2,
                ..Counts::default()
            }
        );
    }

    #[test]
    fn every_container_seen_is_read_never_started_or_counted_unreadable() {
        let mut t = Tally::default();
        for id in ["read", "gone", "never", "running"] {
            t.saw(id, id, Seen::Created);
        }
        for id in ["read", "gone", "running"] {
            t.saw(id, id, Seen::Started);
        }
        t.ended("read", Ok(()));
        t.saw("read", "read", Seen::Destroyed);
        t.ended("gone", Err("removed before its logs were read".into()));
        t.saw("never", "never", Seen::Destroyed);
        // Removed while its events were missed: not silently skipped.
        t.saw("unseen", "unseen", Seen::Destroyed);
        let mark = 1;
        assert_eq!(
            t.counts_since(mark),
            Counts {
                seen: 4,
                read: 0,
                never_started: 1,
                following: 1,
                unreadable: 2,
            }
        );
        assert_eq!(t.counts_since(0).read, 1);
        assert_eq!(t.unfinished(), ["running"]);
        let unreadable = t.take_unreadable();
        assert_eq!(unreadable.len(), 2, "{unreadable:?}");
        assert!(unreadable[0].contains("gone") && unreadable[0].contains("removed before"));
        assert!(unreadable[1].contains("unseen"));
        // Each is said once.
        assert!(t.take_unreadable().is_empty());
    }

    /// A container created, run and removed at once (as a healthcheck's can
    /// be, between two polls of the list): its line is read all the same.
    #[tokio::test]
    async fn a_container_removed_as_soon_as_it_exits_has_its_logs_read() {
        use bollard::models::ContainerCreateBody;
        use bollard::query_parameters::{CreateContainerOptions, RemoveContainerOptions};
        let Ok(image) = std::env::var("MANGO_TEST_SANDBOX_IMAGE") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set and MANGO_TEST_SANDBOX_IMAGE is not: this Docker test cannot run"
            );
            return;
        };
        let docker = Docker::connect_with_local_defaults().expect("a Docker engine");
        let pool = format!("container-logs-test-{}", std::process::id());
        let logs = std::env::temp_dir().join(&pool);
        std::fs::create_dir_all(&logs).unwrap();
        let followers = ContainerLogs::follow(docker.clone(), pool.clone(), logs.clone());
        let mut names = Vec::new();
        for n in 0..3 {
            let name = format!("{pool}-{n}");
            let created = docker
                .create_container(
                    Some(CreateContainerOptions {
                        name: Some(name.clone()),
                        ..Default::default()
                    }),
                    ContainerCreateBody {
                        image: Some(image.clone()),
                        entrypoint: Some(vec!["bash".into()]),
                        cmd: Some(vec!["-c".into(), format!("echo line of {name}")]),
                        labels: Some(HashMap::from([(LABEL_POOL.to_string(), pool.clone())])),
                        ..Default::default()
                    },
                )
                .await
                .expect("the container is created");
            docker
                .start_container(
                    &created.id,
                    None::<bollard::query_parameters::StartContainerOptions>,
                )
                .await
                .expect("the container starts");
            let mut waited = docker.wait_container(
                &created.id,
                None::<bollard::query_parameters::WaitContainerOptions>,
            );
            while waited.next().await.is_some() {}
            docker
                .remove_container(
                    &created.id,
                    Some(RemoveContainerOptions {
                        force: true,
                        ..Default::default()
                    }),
                )
                .await
                .expect("the container is removed");
            names.push(name);
        }
        // One that never starts.
        let never = docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(format!("{pool}-never")),
                    ..Default::default()
                }),
                ContainerCreateBody {
                    image: Some(image.clone()),
                    labels: Some(HashMap::from([(LABEL_POOL.to_string(), pool.clone())])),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        docker
            .remove_container(&never.id, None::<RemoveContainerOptions>)
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while followers.counts_since(0).never_started < 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (counts, failures) = followers.finish(Duration::from_secs(30)).await;
        assert_eq!(
            counts,
            Counts {
                seen: 4,
                read: 3,
                never_started: 1,
                ..Counts::default()
            },
            "{failures:?}"
        );
        assert!(failures.is_empty(), "{failures:?}");
        for name in names {
            let text = std::fs::read_to_string(logs.join(format!("container-{name}.log")))
                .unwrap_or_default();
            assert!(
                text.contains(&format!("line of {name}")),
                "{name}: {text:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&logs);
    }

    #[test]
    fn since_is_seconds_and_nanoseconds() {
        assert_eq!(since(1_700_000_000_000_000_007), "1700000000.000000007");
    }
}
