//! What the tests against the strict fake API server (testkit's
//! `apiserver`) share: the fake with the pool's namespace, Secret and
//! WorkerPool made through its admission (so owner references resolve
//! and the garbage collector keeps the Pods), a kube client over HTTP,
//! and this test as the kubelet: it runs each created Pod, runs the real
//! runner with the stdin its attach delivered, reports its exit, and
//! stops it when the Pod is deleted (its grace counted by the fake).

use mango_controller::kubernetes::crd::WorkerPool;
use mango_testkit::apiserver::{container, ApiServer, Attached, Options};
use mango_testkit::TestApp;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const NS: &str = "sandboxes";

pub async fn fake_with(options: Options) -> Arc<ApiServer> {
    Arc::new(ApiServer::start_with(options).await)
}

pub async fn client(fake: &ApiServer) -> kube::Client {
    let mut config = kube::Config::new(fake.url.parse().unwrap());
    config.default_namespace = NS.into();
    kube::Client::try_from(config).unwrap()
}

/// The pool's Secret holding `key`, and the WorkerPool `name`, stored.
pub fn make_pool(fake: &ApiServer, api: &TestApp, name: &str, key: &str) -> Arc<WorkerPool> {
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "pool-key", "namespace": NS},
        "stringData": {"environment-key": key}}))
        .expect("the Secret is admitted");
    let stored = fake
        .create(
            json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"environmentId": api.env_id, "environmentKeySecret": {"name": "pool-key"},
                     "maxConcurrency": 2}}),
        )
        .expect("the WorkerPool is admitted");
    Arc::new(serde_json::from_value(stored).expect("a WorkerPool"))
}

pub type Attaches = Arc<Mutex<Vec<Attached>>>;

/// What later attaches write to a running container's open stdin.
type Stdin = tokio::sync::mpsc::UnboundedSender<Vec<u8>>;

pub fn running(pod: &Value) -> Value {
    let statuses: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}})
        })
        .collect();
    json!({"phase": "Running", "containerStatuses": statuses})
}

/// Whether Pod `pod` is gone or going (its deletion asked for).
pub fn terminating(fake: &ApiServer, pod: &str) -> bool {
    fake.pod(pod)
        .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
}

/// Whether every PVC the Pod mounts exists: the scheduler places no Pod
/// whose claim is missing (it stays Pending, `persistentvolumeclaim "…"
/// not found`), so a warm Pod, made before its PVC, runs only after it.
pub fn claims_exist(fake: &ApiServer, pod: &Value) -> bool {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
        .all(|claim| fake.object("persistentvolumeclaims", NS, claim).is_some())
}

/// Plays the kubelet of every Pod (each once its PVCs exist) until aborted.
pub fn kubelet(
    fake: Arc<ApiServer>,
    volumes: PathBuf,
    attaches: Attaches,
) -> tokio::task::JoinHandle<()> {
    kubelet_with(fake, volumes, attaches, Vec::new())
}

/// [`kubelet`] with `extra` in every runner's environment (the runner's
/// hidden test knobs, which no pool may set).
pub fn kubelet_with(
    fake: Arc<ApiServer>,
    volumes: PathBuf,
    attaches: Attaches,
    extra: Vec<(String, String)>,
) -> tokio::task::JoinHandle<()> {
    let extra = Arc::new(extra);
    tokio::spawn(async move {
        let mut started: HashSet<String> = HashSet::new();
        let running_now: Arc<Mutex<HashSet<String>>> = Arc::default();
        let stdins: Arc<Mutex<HashMap<String, Stdin>>> = Arc::default();
        loop {
            for name in fake.pods() {
                let Some(pod) = fake.pod(&name) else { continue };
                let deleting = !pod["metadata"]["deletionTimestamp"].is_null();
                if deleting {
                    // Nothing runs in it (or its runner was stopped): it goes.
                    if !running_now.lock().unwrap().contains(&name) {
                        fake.pod_terminated(&name);
                    }
                } else if claims_exist(&fake, &pod) && started.insert(name.clone()) {
                    fake.set_pod_status(&name, running(&pod));
                }
            }
            if let Some(attached) = fake.attached(Duration::from_millis(20)).await {
                attaches.lock().unwrap().push(attached.clone());
                if attached.stdin.is_empty() {
                    continue;
                }
                // A later attach writes to the runner already reading an
                // open stdin (`stdinOnce: false`): a kept Pod's next envelope.
                let open = stdins.lock().unwrap().get(&attached.pod).cloned();
                if let Some(open) = open {
                    if open.send(attached.stdin.clone()).is_ok() {
                        continue;
                    }
                }
                running_now.lock().unwrap().insert(attached.pod.clone());
                let stdin_once = attached.manifest["spec"]["containers"][0]["stdinOnce"] == true;
                let later = (!stdin_once).then(|| {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    stdins.lock().unwrap().insert(attached.pod.clone(), tx);
                    rx
                });
                tokio::spawn(run_container(
                    fake.clone(),
                    volumes.clone(),
                    attached,
                    extra.clone(),
                    later,
                    running_now.clone(),
                ));
            }
        }
    })
}

/// The container: the real runner (`mango-worker item`, the runner built
/// into it) with the Pod's env and the attach's stdin, stopped when its
/// Pod is deleted; then its terminated state (testkit's
/// [`container::run_container`]).
pub async fn run_container(
    fake: Arc<ApiServer>,
    volumes: PathBuf,
    attached: Attached,
    extra: Arc<Vec<(String, String)>>,
    later: Option<tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>>,
    running_now: Arc<Mutex<HashSet<String>>>,
) {
    let runner = Arc::new(container::Runner {
        program: env!("CARGO_BIN_EXE_mango-worker").into(),
        args: vec!["item".into()],
    });
    container::run_container(fake, runner, volumes, attached, extra, later, running_now).await
}

/// The Pod requests (no watches, no lists), in order, `{pod}` for its name.
pub fn pod_calls(fake: &ApiServer, pod: &str) -> Vec<String> {
    fake.requests()
        .into_iter()
        .map(|(method, uri)| format!("{method} {}", uri.replace(pod, "{pod}")))
        .filter(|line| line.contains("{pod}"))
        .collect()
}
