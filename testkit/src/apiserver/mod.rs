//! A strict fake Kubernetes API server over real HTTP: no cluster can be
//! had here, so this double refuses what a real apiserver refuses and
//! fails where a real kubelet fails, with the status codes and `Status`
//! bodies a real one gives. Each rule cites the upstream file it follows
//! (our own code throughout).
//!
//! What it serves: Namespaces, Pods (and `attach`), PVCs, Secrets,
//! events.k8s.io/v1 Events, coordination.k8s.io/v1 Leases and
//! mango.dev/v1alpha1 WorkerPools (with `/status` where the kind has one),
//! discovery, lists and streaming watches. What it enforces:
//! * names per kind, label keys and values, annotation size, finalizer
//!   names, owner references ([`objectmeta`], [`names`]);
//! * namespaces in every read and list, and NamespaceLifecycle: nothing
//!   is made in a namespace that does not exist or is going;
//! * label selectors as apimachinery parses them, 400 otherwise ([`selector`]);
//! * Pods and PVCs as core validation checks the fields the controller
//!   sets, defaults, and fields of feature gates that are off dropped
//!   ([`pods`], [`kinds`]), Events, Leases and Secrets likewise;
//! * a new `resourceVersion` on every write, 409 on a stale one, 410 on a
//!   watch from a compacted one, watches that stream ([`store`], [`watch`]);
//! * merge, strategic-merge, JSON and apply patches by content type, 415
//!   otherwise; server-side apply with field managers ([`patch`], [`fields`]);
//! * graceful deletion, finalizers, PVC protection, owner garbage
//!   collection and namespace deletion ([`lifecycle`]);
//! * attach refused as the apiserver and kubelet refuse it, v4 and v5
//!   channel protocols, and a Failure status on the error channel on
//!   demand ([`attach`]).
//!
//! It runs no container: a test plays the kubelet (`set_pod_status`,
//! [`ApiServer::attached`]). Every request is recorded.

mod attach;
pub mod container;
mod discovery;
pub mod errors;
pub mod fields;
mod http;
pub mod kinds;
mod lifecycle;
pub mod names;
pub mod objectmeta;
pub mod patch;
pub mod pods;
pub mod quantity;
pub mod resources;
pub mod schema;
pub mod selector;
pub mod store;
mod watch;

#[cfg(test)]
mod tests;

pub use attach::AttachFailure;
pub use errors::ApiError;

use axum::http::Method;
use resources::ResourceType;
use serde_json::Value;
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch as signal};

/// The v5 channel protocol (with the close-stdin frame) and v4.
pub const V5: &str = "v5.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";

/// One attach, as the fake kubelet sees it.
#[derive(Debug, Clone)]
pub struct Attached {
    pub pod: String,
    pub namespace: String,
    /// The attach's query string (`stdin=true&container=…`).
    pub query: String,
    /// Everything written to stdin before it was closed that reached the
    /// container's stdin.
    pub stdin: Vec<u8>,
    /// Whether what was written reached the container: not when the attach
    /// failed first, nor after an earlier attach closed a `stdinOnce`
    /// stdin (the kubelet still reports Success then; see [`attach`]).
    pub reached: bool,
    /// The Pod as stored when the attach ended.
    pub manifest: Value,
    /// The channel protocol the attach spoke.
    pub protocol: String,
    /// What the error channel carried (`Success`, or the Failure sent);
    /// `None` on v4, where closing stdin closes the connection first.
    pub status: Option<Value>,
}

/// How a fake behaves where clusters differ.
#[derive(Debug, Clone)]
pub struct Options {
    /// Feature gates that are on; the rest are off, as 1.30–1.32 default
    /// the ones that matter here (`UserNamespacesSupport`, `PodLevelResources`,
    /// `SupplementalGroupsPolicy`).
    pub feature_gates: Vec<String>,
    /// Namespaces that exist at the start.
    pub namespaces: Vec<String>,
    /// How many changes watches can replay; older resourceVersions are Gone.
    pub watch_history: usize,
    /// How often a watch that asked for bookmarks gets one.
    pub bookmark_every: Duration,
    /// The longest a watch stays open whatever its `timeoutSeconds`
    /// (a real server ends watches too; clients must resume).
    pub watch_cap: Option<Duration>,
    /// The channel protocols attach accepts, preferred first.
    pub attach_protocols: Vec<&'static str>,
    /// Delete dependents whose owners are gone (kube-controller-manager's GC).
    pub garbage_collector: bool,
    /// The minor version `/version` reports.
    pub minor: u32,
    /// CustomResourceDefinitions stored at the start: the WorkerPool CRD of
    /// `crds/` by default; a test may install an older one, or none.
    pub crds: Vec<Value>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            feature_gates: Vec::new(),
            namespaces: vec![
                "default".into(),
                "kube-system".into(),
                "kube-public".into(),
                "kube-node-lease".into(),
                // The namespace this workspace's Kubernetes tests use.
                "sandboxes".into(),
            ],
            watch_history: 10_000,
            bookmark_every: Duration::from_secs(1),
            watch_cap: None,
            attach_protocols: vec![V5, V4],
            garbage_collector: true,
            minor: 31,
            crds: vec![
                serde_yaml::from_str(schema::WORKER_POOL_CRD).expect("crds/workerpool.yaml parses")
            ],
        }
    }
}

pub(crate) struct State {
    pub store: store::Store,
    pub options: Options,
    pub gates: pods::Gates,
    pub schemas: schema::Schemas,
    pub requests: Vec<(Method, String)>,
    /// Failures the next attaches' error channels carry, in order.
    pub attach_failures: VecDeque<AttachFailure>,
    /// Requests to fail once each, as an overloaded server does.
    pub outages: Vec<Outage>,
    /// (namespace, pod, container) whose `stdinOnce` stdin was spent.
    pub stdin_spent: HashSet<(String, String, String)>,
}

/// How a loaded API server fails a request it does not serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overload {
    /// API Priority and Fairness sheds it: 429 with `Retry-After`.
    Throttled,
    /// etcd did not answer in time: 500 `etcdserver: request timed out`.
    EtcdTimeout,
}

impl Overload {
    pub fn error(self) -> ApiError {
        match self {
            Overload::Throttled => ApiError::too_many_requests(),
            Overload::EtcdTimeout => ApiError::internal("etcdserver: request timed out"),
        }
    }
}

/// Requests to fail (`fail_next`).
pub(crate) struct Outage {
    method: Method,
    path_contains: String,
    how: Overload,
    left: usize,
}

impl State {
    /// The failure due to the request, if one is: each outage fails its
    /// next `left` matching requests.
    pub(crate) fn outage_for(&mut self, method: &Method, path: &str) -> Option<Overload> {
        let at = self
            .outages
            .iter()
            .position(|o| o.left > 0 && o.method == *method && path.contains(&o.path_contains))?;
        let outage = &mut self.outages[at];
        outage.left -= 1;
        let how = outage.how;
        if outage.left == 0 {
            self.outages.remove(at);
        }
        Some(how)
    }
}

#[derive(Clone)]
pub(crate) struct Shared {
    pub state: Arc<Mutex<State>>,
    pub revision: Arc<signal::Sender<u64>>,
    pub attached: mpsc::UnboundedSender<Attached>,
}

impl Shared {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake apiserver state")
    }

    /// Wakes the watches after a write.
    pub fn notify(&self) {
        let revision = self.lock().store.revision();
        self.revision.send_replace(revision);
    }
}

/// The fake API server; it stops when dropped.
pub struct ApiServer {
    pub url: String,
    shared: Shared,
    attached: tokio::sync::Mutex<mpsc::UnboundedReceiver<Attached>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// RFC 3339 in whole seconds, as `metav1.Time` is written.
pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .expect("a time")
        .to_string()
}

impl ApiServer {
    pub async fn start() -> ApiServer {
        ApiServer::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> ApiServer {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut store = store::Store::new(options.watch_history);
        let gates = pods::Gates {
            enabled: options
                .feature_gates
                .iter()
                .cloned()
                .collect::<BTreeSet<_>>(),
        };
        for namespace in &options.namespaces {
            let uid = store.new_uid();
            store.put(
                store::table(&resources::NAMESPACES),
                "",
                namespace,
                serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": namespace, "uid": uid, "creationTimestamp": now_rfc3339(),
                                 "labels": {"kubernetes.io/metadata.name": namespace}},
                    "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
            );
        }
        for crd in &options.crds {
            let mut crd = crd.clone();
            let name = crd["metadata"]["name"]
                .as_str()
                .expect("a CRD has a name")
                .to_string();
            crd["metadata"]["uid"] = serde_json::json!(store.new_uid());
            crd["metadata"]["creationTimestamp"] = serde_json::json!(now_rfc3339());
            store.put(
                store::table(&resources::CUSTOM_RESOURCE_DEFINITIONS),
                "",
                &name,
                crd,
            );
        }
        let revision = store.revision();
        let shared = Shared {
            state: Arc::new(Mutex::new(State {
                store,
                options,
                gates,
                schemas: schema::Schemas::builtin(),
                requests: Vec::new(),
                attach_failures: VecDeque::new(),
                outages: Vec::new(),
                stdin_spent: HashSet::new(),
            })),
            revision: Arc::new(signal::channel(revision).0),
            attached: tx,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let app = http::router(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        // Time-driven lifecycle: graceful deletions that end.
        let ticker = tokio::spawn({
            let shared = shared.clone();
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    let changed = lifecycle::settle(&mut shared.lock());
                    if changed {
                        shared.notify();
                    }
                }
            }
        });
        ApiServer {
            url,
            shared,
            attached: tokio::sync::Mutex::new(rx),
            tasks: vec![server, ticker],
        }
    }

    /// The next attach, if one ends within `within`.
    pub async fn attached(&self, within: Duration) -> Option<Attached> {
        let mut attached = self.attached.lock().await;
        tokio::time::timeout(within, attached.recv())
            .await
            .ok()
            .flatten()
    }

    /// Every request so far: method and path with query.
    pub fn requests(&self) -> Vec<(Method, String)> {
        self.shared.lock().requests.clone()
    }

    /// The stored object of `resource` (its plural, e.g. `pods`,
    /// `workerpools`) in `namespace` (`""` for cluster-scoped ones).
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let rt = resource_named(resource)?;
        self.shared
            .lock()
            .store
            .get(store::table(&rt), namespace, name)
            .cloned()
    }

    /// Names of `resource`'s objects in `namespace`.
    pub fn names(&self, resource: &str, namespace: &str) -> Vec<String> {
        let Some(rt) = resource_named(resource) else {
            return Vec::new();
        };
        self.shared
            .lock()
            .store
            .list(store::table(&rt), Some(namespace))
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    }

    fn find_pod(&self, name: &str) -> Option<Value> {
        let state = self.shared.lock();
        state
            .store
            .list(store::table(&resources::PODS), None)
            .into_iter()
            .find(|p| p["metadata"]["name"] == name)
    }

    /// Pod `name` in whichever namespace holds it.
    pub fn pod(&self, name: &str) -> Option<Value> {
        self.find_pod(name)
    }

    /// Every Pod's name, in every namespace.
    pub fn pods(&self) -> Vec<String> {
        self.all_names(&resources::PODS)
    }

    /// Every PVC's name, in every namespace.
    pub fn pvcs(&self) -> Vec<String> {
        self.all_names(&resources::PVCS)
    }

    fn all_names(&self, rt: &ResourceType) -> Vec<String> {
        let mut names: Vec<String> = self
            .shared
            .lock()
            .store
            .list(store::table(rt), None)
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        names.sort();
        names
    }

    /// Sets a stored Pod's status as its kubelet would (a write: a new
    /// resourceVersion and a watch event); a Pod not yet bound is bound
    /// to `fake-node` first, as the scheduler would have.
    pub fn set_pod_status(&self, name: &str, status: Value) -> Option<Value> {
        let pod = self.find_pod(name)?;
        let namespace = pod["metadata"]["namespace"].as_str()?.to_string();
        let stored = {
            let mut state = self.shared.lock();
            let mut pod = pod;
            if pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty) {
                pod["spec"]["nodeName"] = Value::String("fake-node".into());
            }
            pod["status"] = status;
            let stored = state
                .store
                .put(store::table(&resources::PODS), &namespace, name, pod);
            lifecycle::settle(&mut state);
            stored
        };
        self.shared.notify();
        Some(stored)
    }

    /// Creates `object` (its apiVersion and kind say where) through the
    /// same admission as a POST, for a test's fixtures.
    pub fn create(&self, object: Value) -> Result<Value, ApiError> {
        let api_version = object["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let rt = resources::by_kind(&api_version, &kind)
            .ok_or_else(|| ApiError::bad_request(format!("no kind {kind} in {api_version}")))?;
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or(if rt.namespaced { "default" } else { "" })
            .to_string();
        let created = http::create_object(&self.shared, &rt, &namespace, object, "testkit", false)?;
        self.shared.notify();
        Ok(created)
    }

    /// The kubelet's final word on a terminating Pod: its containers are
    /// stopped, so it goes now (a delete with zero grace).
    pub fn pod_terminated(&self, name: &str) -> bool {
        let Some(pod) = self.find_pod(name) else {
            return false;
        };
        let namespace = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let removed = {
            let mut state = self.shared.lock();
            let removed = state
                .store
                .remove(store::table(&resources::PODS), &namespace, name)
                .is_some();
            lifecycle::settle(&mut state);
            removed
        };
        self.shared.notify();
        removed
    }

    /// The next attaches' error channels carry these, in order, instead
    /// of Success (the kubelet failing behind an accepted WebSocket).
    pub fn fail_next_attach(&self, failure: AttachFailure) {
        self.shared.lock().attach_failures.push_back(failure);
    }

    /// The next `times` requests with `method` whose path contains
    /// `path_contains` fail as `how`, before the server looks at them.
    pub fn fail_next(&self, method: Method, path_contains: &str, how: Overload, times: usize) {
        self.shared.lock().outages.push(Outage {
            method,
            path_contains: path_contains.to_string(),
            how,
            left: times,
        });
    }

    /// Forgets the change history: watches from earlier resourceVersions
    /// get 410 Gone (as after an etcd compaction).
    pub fn compact(&self) {
        self.shared.lock().store.compact();
    }

    /// The current resourceVersion (etcd's revision).
    pub fn revision(&self) -> u64 {
        self.shared.lock().store.revision()
    }
}

fn resource_named(plural: &str) -> Option<ResourceType> {
    resources::ALL.iter().copied().find(|r| r.plural == plural)
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
