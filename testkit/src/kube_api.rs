//! A fake Kubernetes API server over real HTTP, for the Kubernetes
//! launcher's end-to-end tests and its benchmark: it stores Pods and PVCs
//! as JSON (create-only, 409 on a second create), answers lists by label
//! selector, merge-patches, deletes, and serves `pods/attach` as the v5
//! WebSocket protocol (`v5.channel.k8s.io`), handing each attach's stdin
//! to the test. It runs no container: the test plays the kubelet, and
//! chooses how attaches end ([`AttachEnd`]).
//! Every request is recorded, so a test can assert the exact traffic.

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// One attach, as the fake kubelet sees it.
#[derive(Debug, Clone)]
pub struct Attached {
    pub pod: String,
    /// The attach's query string (`stdin=true&container=…`).
    pub query: String,
    /// Everything written to stdin before it was closed.
    pub stdin: Vec<u8>,
    /// The Pod as stored when the attach ended.
    pub manifest: Value,
}

/// How the fake's attaches end, on the error channel (channel 3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AttachEnd {
    /// Once the client closes stdin: a `Success` status (the kubelet attached).
    #[default]
    Success,
    /// At once, before any stdin is read: a `Failure` status with this
    /// reason, message and code. From 1.30 the API server accepts the
    /// WebSocket before it dials the kubelet, and reports a kubelet that
    /// cannot attach (the container gone, the node unreachable) so.
    Failure {
        reason: String,
        message: String,
        code: u16,
    },
    /// Once stdin is closed, the connection closes without a status.
    NoStatus,
    /// Never: the connection stays open and no status comes.
    Silent,
}

#[derive(Default)]
struct Stored {
    pods: BTreeMap<String, Value>,
    pvcs: BTreeMap<String, Value>,
    requests: Vec<(Method, String)>,
    next_uid: u64,
    attach_end: AttachEnd,
    leases: BTreeMap<String, Value>,
    /// The last `resourceVersion` given (Leases: one per write).
    version: u64,
    /// Lease writes naming this holder fail (503), as if it were cut off.
    cut_off: Option<String>,
}

#[derive(Clone)]
struct Shared {
    stored: Arc<Mutex<Stored>>,
    attached: mpsc::UnboundedSender<Attached>,
}

/// The fake API server; it stops when dropped.
pub struct FakeKubeApi {
    pub url: String,
    stored: Arc<Mutex<Stored>>,
    attached: tokio::sync::Mutex<mpsc::UnboundedReceiver<Attached>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeKubeApi {
    pub async fn start() -> FakeKubeApi {
        let (tx, rx) = mpsc::unbounded_channel();
        let stored = Arc::new(Mutex::new(Stored::default()));
        let shared = Shared {
            stored: stored.clone(),
            attached: tx,
        };
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/{kind}", get(list).post(create))
            .route(
                "/api/v1/namespaces/{ns}/{kind}/{name}",
                get(read).patch(merge_patch).delete(delete),
            )
            .route("/api/v1/namespaces/{ns}/pods/{name}/attach", get(attach))
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                axum::routing::post(create_lease),
            )
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
                get(read_lease).put(replace_lease),
            )
            .layer(axum::middleware::from_fn_with_state(shared.clone(), record))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeKubeApi {
            url,
            stored,
            attached: tokio::sync::Mutex::new(rx),
            task,
        }
    }

    /// The next attach, if one comes within `within`.
    pub async fn attached(&self, within: std::time::Duration) -> Option<Attached> {
        let mut attached = self.attached.lock().await;
        tokio::time::timeout(within, attached.recv())
            .await
            .ok()
            .flatten()
    }

    /// Every request so far: method and path with query.
    pub fn requests(&self) -> Vec<(Method, String)> {
        self.stored.lock().unwrap().requests.clone()
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.stored.lock().unwrap().pods.get(name).cloned()
    }

    pub fn pods(&self) -> Vec<String> {
        self.stored.lock().unwrap().pods.keys().cloned().collect()
    }

    pub fn pvcs(&self) -> Vec<String> {
        self.stored.lock().unwrap().pvcs.keys().cloned().collect()
    }

    /// How the attaches from now on end ([`AttachEnd::Success`] unless set).
    /// Only an attach that ends in `Success` is reported by [`Self::attached`].
    pub fn end_attaches(&self, end: AttachEnd) {
        self.stored.lock().unwrap().attach_end = end;
    }

    /// The stored Lease `name`.
    pub fn lease(&self, name: &str) -> Option<Value> {
        self.stored.lock().unwrap().leases.get(name).cloned()
    }

    /// From now on, Lease writes that name `holder` fail with 503 (the
    /// replica is cut off from the API server); `None` heals it.
    pub fn cut_off(&self, holder: Option<&str>) {
        self.stored.lock().unwrap().cut_off = holder.map(str::to_string);
    }

    /// Sets a stored Pod's status, as the kubelet would.
    pub fn set_pod_status(&self, name: &str, status: Value) -> Option<Value> {
        let mut stored = self.stored.lock().unwrap();
        let pod = stored.pods.get_mut(name)?;
        pod["status"] = status;
        Some(pod.clone())
    }
}

impl Drop for FakeKubeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn record(
    State(shared): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let uri: &Uri = request.uri();
    let line = (request.method().clone(), uri.to_string());
    shared.stored.lock().unwrap().requests.push(line);
    next.run(request).await
}

fn status(code: u16, reason: &str, message: String) -> Response {
    (
        StatusCode::from_u16(code).unwrap(),
        Json(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": message, "reason": reason, "code": code}),
        ),
    )
        .into_response()
}

fn table<'a>(stored: &'a mut Stored, kind: &str) -> Option<&'a mut BTreeMap<String, Value>> {
    match kind {
        "pods" => Some(&mut stored.pods),
        "persistentvolumeclaims" => Some(&mut stored.pvcs),
        _ => None,
    }
}

fn list_kind(kind: &str) -> &'static str {
    if kind == "pods" {
        "PodList"
    } else {
        "PersistentVolumeClaimList"
    }
}

/// `k=v,k2=v2` selectors, the only kind the controller sends.
fn selected(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (key, value) = term.split_once('=').unwrap_or((term, ""));
        object["metadata"]["labels"][key].as_str() == Some(value)
    })
}

async fn list(
    State(shared): State<Shared>,
    Path((_ns, kind)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if query.get("watch").is_some_and(|w| w == "true") {
        return status(
            405,
            "MethodNotAllowed",
            "this fake serves no watches".into(),
        );
    }
    let mut stored = shared.stored.lock().unwrap();
    let Some(table) = table(&mut stored, &kind) else {
        return status(404, "NotFound", format!("no resource {kind}"));
    };
    let items: Vec<Value> = table
        .values()
        .filter(|o| selected(o, query.get("labelSelector")))
        .cloned()
        .collect();
    Json(json!({"apiVersion": "v1", "kind": list_kind(&kind), "metadata": {"resourceVersion": "1"}, "items": items}))
        .into_response()
}

async fn create(
    State(shared): State<Shared>,
    Path((ns, kind)): Path<(String, String)>,
    Json(mut object): Json<Value>,
) -> Response {
    let mut stored = shared.stored.lock().unwrap();
    stored.next_uid += 1;
    let uid = format!("uid-{}", stored.next_uid);
    let Some(table) = table(&mut stored, &kind) else {
        return status(404, "NotFound", format!("no resource {kind}"));
    };
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_string) else {
        return status(422, "Invalid", "metadata.name is required".into());
    };
    if table.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            format!("{kind} \"{name}\" already exists"),
        );
    }
    object["metadata"]["namespace"] = json!(ns);
    object["metadata"]["uid"] = json!(uid);
    object["metadata"]["resourceVersion"] = json!("1");
    object["metadata"]["creationTimestamp"] = json!(jiff_now());
    if kind == "pods" {
        object["status"] = json!({"phase": "Pending"});
    }
    table.insert(name, object.clone());
    (StatusCode::CREATED, Json(object)).into_response()
}

/// RFC 3339 in whole seconds, as the API server writes it.
fn jiff_now() -> String {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .unwrap()
        .to_string()
}

async fn read(
    State(shared): State<Shared>,
    Path((_ns, kind, name)): Path<(String, String, String)>,
) -> Response {
    let mut stored = shared.stored.lock().unwrap();
    match table(&mut stored, &kind).and_then(|t| t.get(&name)) {
        Some(object) => Json(object.clone()).into_response(),
        None => status(404, "NotFound", format!("{kind} \"{name}\" not found")),
    }
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

async fn merge_patch(
    State(shared): State<Shared>,
    Path((_ns, kind, name)): Path<(String, String, String)>,
    Json(patch): Json<Value>,
) -> Response {
    let mut stored = shared.stored.lock().unwrap();
    match table(&mut stored, &kind).and_then(|t| t.get_mut(&name)) {
        Some(object) => {
            merge(object, &patch);
            Json(object.clone()).into_response()
        }
        None => status(404, "NotFound", format!("{kind} \"{name}\" not found")),
    }
}

async fn delete(
    State(shared): State<Shared>,
    Path((_ns, kind, name)): Path<(String, String, String)>,
) -> Response {
    let mut stored = shared.stored.lock().unwrap();
    match table(&mut stored, &kind).and_then(|t| t.remove(&name)) {
        Some(object) => Json(object).into_response(),
        None => status(404, "NotFound", format!("{kind} \"{name}\" not found")),
    }
}

/// Leases: create-only POST, and PUT guarded by `resourceVersion` as the
/// API server guards it (a stale one is 409; none is an unconditional
/// write); every write gets a new `resourceVersion`.
async fn create_lease(
    State(shared): State<Shared>,
    Path(ns): Path<String>,
    Json(mut lease): Json<Value>,
) -> Response {
    let mut stored = shared.stored.lock().unwrap();
    let Some(name) = lease["metadata"]["name"].as_str().map(str::to_string) else {
        return status(422, "Invalid", "metadata.name is required".into());
    };
    if stored.leases.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            format!("leases.coordination.k8s.io \"{name}\" already exists"),
        );
    }
    stored.version += 1;
    lease["metadata"]["namespace"] = json!(ns);
    lease["metadata"]["resourceVersion"] = json!(stored.version.to_string());
    stored.leases.insert(name, lease.clone());
    (StatusCode::CREATED, Json(lease)).into_response()
}

async fn read_lease(
    State(shared): State<Shared>,
    Path((_ns, name)): Path<(String, String)>,
) -> Response {
    match shared.stored.lock().unwrap().leases.get(&name) {
        Some(lease) => Json(lease.clone()).into_response(),
        None => status(
            404,
            "NotFound",
            format!("leases.coordination.k8s.io \"{name}\" not found"),
        ),
    }
}

async fn replace_lease(
    State(shared): State<Shared>,
    Path((_ns, name)): Path<(String, String)>,
    Json(mut lease): Json<Value>,
) -> Response {
    let mut stored = shared.stored.lock().unwrap();
    let holder = lease["spec"]["holderIdentity"].as_str().map(str::to_string);
    if holder.is_some() && holder == stored.cut_off {
        return status(503, "ServiceUnavailable", "the replica is cut off".into());
    }
    let Some(current) = stored.leases.get(&name) else {
        return status(
            404,
            "NotFound",
            format!("leases.coordination.k8s.io \"{name}\" not found"),
        );
    };
    let expected = lease["metadata"]["resourceVersion"].as_str();
    if expected.is_some_and(|v| Some(v) != current["metadata"]["resourceVersion"].as_str()) {
        return status(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
        );
    }
    stored.version += 1;
    lease["metadata"]["resourceVersion"] = json!(stored.version.to_string());
    stored.leases.insert(name, lease.clone());
    Json(lease).into_response()
}

async fn attach(
    State(shared): State<Shared>,
    Path((_ns, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Response {
    if !shared.stored.lock().unwrap().pods.contains_key(&name) {
        return status(404, "NotFound", format!("pods \"{name}\" not found"));
    }
    let query = query.unwrap_or_default();
    upgrade
        .protocols(["v5.channel.k8s.io"])
        .on_upgrade(move |socket| serve_attach(socket, shared, name, query))
}

fn status_frame(status: &Value) -> Message {
    let mut frame = vec![3u8];
    frame.extend_from_slice(status.to_string().as_bytes());
    Message::Binary(frame.into())
}

/// The v5 channel protocol: stdin frames on channel 0 until the client
/// closes channel 0 (`[255, 0]`), then a Success status on channel 3 (or
/// what [`AttachEnd`] says).
async fn serve_attach(mut socket: WebSocket, shared: Shared, pod: String, query: String) {
    let end = shared.stored.lock().unwrap().attach_end.clone();
    if let AttachEnd::Failure {
        reason,
        message,
        code,
    } = &end
    {
        let status = json!({"metadata": {}, "status": "Failure", "reason": reason,
                            "message": message, "code": code});
        let _ = socket.send(status_frame(&status)).await;
        let _ = socket.send(Message::Close(None)).await;
        return;
    }
    let mut stdin = Vec::new();
    while let Some(Ok(message)) = socket.recv().await {
        match message {
            Message::Binary(frame) if frame.first() == Some(&0) => {
                stdin.extend_from_slice(&frame[1..])
            }
            Message::Binary(frame) if frame.as_ref() == [255, 0] => break,
            Message::Close(_) => break,
            _ => {}
        }
    }
    match end {
        AttachEnd::Silent => {
            // Hold the connection open until the client goes.
            while let Some(Ok(_)) = socket.recv().await {}
            return;
        }
        AttachEnd::NoStatus => {
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
        _ => {}
    }
    let _ = socket
        .send(status_frame(&json!({"metadata": {}, "status": "Success"})))
        .await;
    let _ = socket.send(Message::Close(None)).await;
    let manifest = shared
        .stored
        .lock()
        .unwrap()
        .pods
        .get(&pod)
        .cloned()
        .unwrap_or(Value::Null);
    let _ = shared.attached.send(Attached {
        pod,
        query,
        stdin,
        manifest,
    });
}
