//! The fake over HTTP: each kind of bad request refused with the status
//! code (and reason, and field) a real apiserver gives, and the
//! behaviours clients rely on: resourceVersions, watches, deletion,
//! protection, garbage collection, feature gates, apply.

use super::{ApiServer, Options};
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

const NS: &str = "sandboxes";

struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    fn new(fake: &ApiServer) -> Client {
        Client {
            base: fake.url.clone(),
            http: reqwest::Client::new(),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request
                .header("content-type", content_type)
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let code = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, "application/json", Some(body))
            .await
    }
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "runner", "image": "img:1", "stdin": true,
            "stdinOnce": true, "volumeMounts": [{"name": "w", "mountPath": "/w"}]}],
            "volumes": [{"name": "w", "persistentVolumeClaim": {"claimName": "claim"}}]}})
}

fn pvc(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
}

fn pool(name: &str) -> Value {
    json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool", "metadata": {"name": name},
        "spec": {"environmentId": "env_1", "environmentKeySecret": {"name": "key"}}})
}

fn event(note: &str) -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e.1"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "regarding": {"kind": "WorkerPool", "namespace": NS, "name": "p"},
        "reportingController": "mango-controller", "reportingInstance": "r", "action": "Launch",
        "reason": "LaunchFailed", "type": "Warning", "note": note})
}

fn with(mut object: Value, pointer: &str, value: Value) -> Value {
    let (parent, last) = pointer.rsplit_once('/').unwrap();
    match object.pointer_mut(parent).unwrap() {
        Value::Array(items) => items[last.parse::<usize>().unwrap()] = value,
        other => other[last] = value,
    }
    object
}

const PODS: &str = "/api/v1/namespaces/sandboxes/pods";
const PVCS: &str = "/api/v1/namespaces/sandboxes/persistentvolumeclaims";
const POOLS: &str = "/apis/mango.dev/v1alpha1/namespaces/sandboxes/workerpools";

/// One bad request: what is sent, and what a real apiserver answers
/// (code, reason, and the field its first cause names, if any).
struct Refusal {
    what: &'static str,
    method: &'static str,
    path: String,
    content_type: &'static str,
    body: Option<Value>,
    code: u16,
    reason: &'static str,
    field: Option<&'static str>,
}

fn refusal(
    what: &'static str,
    method: &'static str,
    path: &str,
    body: Option<Value>,
    code: u16,
    reason: &'static str,
    field: Option<&'static str>,
) -> Refusal {
    Refusal {
        what,
        method,
        path: path.to_string(),
        content_type: "application/json",
        body,
        code,
        reason,
        field,
    }
}

#[tokio::test]
async fn each_kind_of_bad_request_is_refused_with_the_real_status_code() {
    let fake = ApiServer::start().await;
    let client = Client::new(&fake);
    // Fixtures the refusals run against.
    assert_eq!(client.post(PODS, pod("existing")).await.0, 201);
    assert_eq!(client.post(POOLS, pool("builders")).await.0, 201);
    let stale = "1";
    let unscheduled =
        "/api/v1/namespaces/sandboxes/pods/existing/attach?stdin=true&container=runner";
    let long = "a".repeat(64);
    let mut cases = vec![
        refusal(
            "an upper-case Pod name",
            "POST",
            PODS,
            Some(pod("Runner")),
            422,
            "Invalid",
            Some("metadata.name"),
        ),
        refusal(
            "a Pod name over 253",
            "POST",
            PODS,
            Some(pod(&"a".repeat(254))),
            422,
            "Invalid",
            Some("metadata.name"),
        ),
        refusal(
            "a namespace name with a dot (a label, not a subdomain)",
            "POST",
            "/api/v1/namespaces",
            Some(json!({"metadata": {"name": "a.b"}})),
            422,
            "Invalid",
            Some("metadata.name"),
        ),
        refusal(
            "a label value of 64",
            "POST",
            PODS,
            Some(with(
                pod("p1"),
                "/metadata/labels/mango.dev~1pool",
                json!(long),
            )),
            422,
            "Invalid",
            Some("metadata.labels"),
        ),
        refusal(
            "a label value ending in '-'",
            "POST",
            PODS,
            Some(with(pod("p1"), "/metadata/labels/app", json!("web-"))),
            422,
            "Invalid",
            Some("metadata.labels"),
        ),
        refusal(
            "annotations over 256 KiB",
            "POST",
            PODS,
            Some(with(
                pod("p1"),
                "/metadata/annotations",
                json!({"k": "a".repeat(256 * 1024)}),
            )),
            422,
            "Invalid",
            Some("metadata.annotations"),
        ),
        refusal(
            "a finalizer without a domain",
            "POST",
            PODS,
            Some(with(pod("p1"), "/metadata/finalizers", json!(["mine"]))),
            422,
            "Invalid",
            Some("metadata.finalizers"),
        ),
        refusal(
            "a Pod in a namespace that does not exist",
            "POST",
            "/api/v1/namespaces/nowhere/pods",
            Some(pod("p1")),
            404,
            "NotFound",
            None,
        ),
        refusal(
            "a Pod read from another namespace",
            "GET",
            "/api/v1/namespaces/default/pods/existing",
            None,
            404,
            "NotFound",
            None,
        ),
        refusal(
            "a second create of one name",
            "POST",
            PODS,
            Some(pod("existing")),
            409,
            "AlreadyExists",
            None,
        ),
        refusal(
            "an update with a stale resourceVersion",
            "PUT",
            &format!("{PODS}/existing"),
            Some(with(
                pod("existing"),
                "/metadata/resourceVersion",
                json!(stale),
            )),
            409,
            "Conflict",
            None,
        ),
        refusal(
            "activeDeadlineSeconds 0",
            "POST",
            PODS,
            Some(with(pod("p1"), "/spec/activeDeadlineSeconds", json!(0))),
            422,
            "Invalid",
            Some("spec.activeDeadlineSeconds"),
        ),
        refusal(
            "activeDeadlineSeconds 2^31",
            "POST",
            PODS,
            Some(with(
                pod("p1"),
                "/spec/activeDeadlineSeconds",
                json!(2147483648i64),
            )),
            422,
            "Invalid",
            Some("spec.activeDeadlineSeconds"),
        ),
        refusal(
            "runAsUser 2^31",
            "POST",
            PODS,
            Some(with(
                pod("p1"),
                "/spec/securityContext",
                json!({"runAsUser": 2147483648i64}),
            )),
            422,
            "Invalid",
            Some("spec.securityContext.runAsUser"),
        ),
        refusal(
            "a mount of a volume that is not there",
            "POST",
            PODS,
            Some(with(pod("p1"), "/spec/volumes", json!([]))),
            422,
            "Invalid",
            Some("spec.containers[0].volumeMounts[0].name"),
        ),
        refusal(
            "a quantity that does not parse",
            "POST",
            PODS,
            Some(with(
                pod("p1"),
                "/spec/containers/0/resources",
                json!({"limits": {"memory": "1GB"}}),
            )),
            400,
            "BadRequest",
            None,
        ),
        refusal(
            "a Pod spec changed after creation",
            "PUT",
            &format!("{PODS}/existing"),
            Some(with(
                pod("existing"),
                "/spec/restartPolicy",
                json!("Always"),
            )),
            422,
            "Invalid",
            Some("spec"),
        ),
        refusal(
            "a PVC without access modes",
            "POST",
            PVCS,
            Some(with(pvc("c"), "/spec/accessModes", json!([]))),
            422,
            "Invalid",
            Some("spec.accessModes"),
        ),
        refusal(
            "a PVC of zero bytes",
            "POST",
            PVCS,
            Some(with(
                pvc("c"),
                "/spec/resources/requests/storage",
                json!("0"),
            )),
            422,
            "Invalid",
            Some("spec.resources[storage]"),
        ),
        refusal(
            "an Event note of 1,025 bytes",
            "POST",
            "/apis/events.k8s.io/v1/namespaces/sandboxes/events",
            Some(event(&"é".repeat(513))),
            422,
            "Invalid",
            Some("message"),
        ),
        refusal(
            "a Lease time without microseconds",
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/sandboxes/leases",
            Some(json!({"metadata": {"name": "l"}, "spec": {"renewTime": "2026-01-01T00:00:00Z"}})),
            400,
            "BadRequest",
            None,
        ),
        refusal(
            "a Lease of zero seconds",
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/sandboxes/leases",
            Some(json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0}})),
            422,
            "Invalid",
            Some("spec.leaseDurationSeconds"),
        ),
        refusal(
            "a WorkerPool past its schema's maximum",
            "POST",
            POOLS,
            Some(with(pool("p"), "/spec/maxConcurrency", json!(1001))),
            422,
            "Invalid",
            Some("spec.maxConcurrency"),
        ),
        refusal(
            "a WorkerPool name over 63 is fine, but its labels are not",
            "POST",
            PODS,
            Some(with(
                pod("p1"),
                "/metadata/labels/mango.dev~1pool",
                json!("a".repeat(200)),
            )),
            422,
            "Invalid",
            Some("metadata.labels"),
        ),
        refusal(
            "a label selector value of 64",
            "GET",
            &format!("{PODS}?labelSelector=mango.dev%2Fpool%3D{long}"),
            None,
            400,
            "BadRequest",
            None,
        ),
        refusal(
            "a label selector that does not parse",
            "GET",
            &format!("{PODS}?labelSelector=app%20in%20web"),
            None,
            400,
            "BadRequest",
            None,
        ),
        refusal(
            "a watch with a bad selector",
            "GET",
            &format!("{PODS}?watch=true&labelSelector=a%3D%3Db%3Dc"),
            None,
            400,
            "BadRequest",
            None,
        ),
        refusal(
            "an unknown field selector",
            "GET",
            &format!("{PVCS}?fieldSelector=spec.volumeName%3Dx"),
            None,
            400,
            "BadRequest",
            None,
        ),
        refusal(
            "a read at a resourceVersion not reached",
            "GET",
            &format!("{PODS}?resourceVersion=999999"),
            None,
            504,
            "Timeout",
            None,
        ),
        refusal(
            "a resource that is not served",
            "GET",
            "/api/v1/namespaces/sandboxes/configmaps",
            None,
            404,
            "NotFound",
            None,
        ),
        refusal(
            "an attach to a container the Pod does not have",
            "GET",
            "/api/v1/namespaces/sandboxes/pods/existing/attach?stdin=true&container=other",
            None,
            400,
            "BadRequest",
            None,
        ),
        refusal(
            "an attach to a Pod no node runs",
            "GET",
            unscheduled,
            None,
            400,
            "BadRequest",
            None,
        ),
        refusal(
            "an attach to no Pod",
            "GET",
            "/api/v1/namespaces/sandboxes/pods/none/attach?stdin=true",
            None,
            404,
            "NotFound",
            None,
        ),
    ];
    let mut typed = |what, path: String, content_type, body, code, reason, field| {
        cases.push(Refusal {
            what,
            method: "PATCH",
            path,
            content_type,
            body,
            code,
            reason,
            field,
        })
    };
    typed(
        "a non-apply patch with force",
        format!("{PODS}/existing?force=true"),
        "application/merge-patch+json",
        Some(json!({})),
        422,
        "Invalid",
        Some("force"),
    );
    typed(
        "a patch of an unknown content type",
        format!("{PODS}/existing"),
        "application/json",
        Some(json!({})),
        415,
        "UnsupportedMediaType",
        None,
    );
    typed(
        "a strategic merge patch of a custom resource",
        format!("{POOLS}/builders"),
        "application/strategic-merge-patch+json",
        Some(json!({})),
        415,
        "UnsupportedMediaType",
        None,
    );
    typed(
        "an apply without a field manager",
        format!("{PODS}/existing"),
        "application/apply-patch+yaml",
        Some(pod("existing")),
        422,
        "Invalid",
        Some("fieldManager"),
    );
    typed(
        "a merge patch with a stale resourceVersion",
        format!("{PODS}/existing"),
        "application/merge-patch+json",
        Some(json!({"metadata": {"resourceVersion": stale, "labels": {"a": "b"}}})),
        409,
        "Conflict",
        None,
    );
    typed(
        "a patch that makes a label invalid",
        format!("{PODS}/existing"),
        "application/merge-patch+json",
        Some(json!({"metadata": {"labels": {"a": "-"}}})),
        422,
        "Invalid",
        Some("metadata.labels"),
    );
    typed(
        "a JSON patch whose test fails",
        format!("{PODS}/existing"),
        "application/json-patch+json",
        Some(json!([{"op": "test", "path": "/metadata/name", "value": "other"}])),
        422,
        "Invalid",
        None,
    );

    for case in &cases {
        let (code, body) = client
            .call(
                case.method,
                &case.path,
                case.content_type,
                case.body.clone(),
            )
            .await;
        assert_eq!(code, case.code, "{}: {body}", case.what);
        assert_eq!(body["kind"], "Status", "{}: {body}", case.what);
        assert_eq!(body["code"], case.code, "{}", case.what);
        assert_eq!(body["reason"], case.reason, "{}: {body}", case.what);
        if let Some(field) = case.field {
            assert_eq!(
                body["details"]["causes"][0]["field"], field,
                "{}: {body}",
                case.what
            );
        }
    }
    // None of them changed what is stored.
    assert_eq!(fake.names("pods", NS), vec!["existing".to_string()]);
    assert!(fake.names("persistentvolumeclaims", NS).is_empty());
}

#[tokio::test]
async fn apply_conflicts_name_the_other_manager_and_force_takes_the_field() {
    let fake = ApiServer::start().await;
    let client = Client::new(&fake);
    let leases = "/apis/coordination.k8s.io/v1/namespaces/sandboxes/leases/leader";
    let lease = |holder: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}})
    };
    let apply = |manager: &str, force: bool| {
        format!(
            "{leases}?fieldManager={manager}{}",
            if force { "&force=true" } else { "" }
        )
    };
    let (code, first) = client
        .call(
            "PATCH",
            &apply("a", false),
            "application/apply-patch+yaml",
            Some(lease("a")),
        )
        .await;
    assert_eq!(code, 200, "an apply creates: {first}");
    assert_eq!(first["metadata"]["managedFields"][0]["manager"], "a");
    assert_eq!(first["metadata"]["managedFields"][0]["operation"], "Apply");
    let (code, conflict) = client
        .call(
            "PATCH",
            &apply("b", false),
            "application/apply-patch+yaml",
            Some(lease("b")),
        )
        .await;
    assert_eq!(code, 409, "{conflict}");
    assert_eq!(conflict["reason"], "Conflict");
    assert_eq!(
        conflict["details"]["causes"][0]["reason"],
        "FieldManagerConflict"
    );
    assert_eq!(
        conflict["details"]["causes"][0]["field"],
        ".spec.holderIdentity"
    );
    let (code, forced) = client
        .call(
            "PATCH",
            &apply("b", true),
            "application/apply-patch+yaml",
            Some(lease("b")),
        )
        .await;
    assert_eq!(code, 200, "{forced}");
    assert_eq!(forced["spec"]["holderIdentity"], "b");
    assert_ne!(
        forced["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
}

#[tokio::test]
async fn every_write_is_a_new_resource_version_and_a_no_op_is_none() {
    let fake = ApiServer::start().await;
    let client = Client::new(&fake);
    let (_, created) = client.post(PODS, pod("p")).await;
    let patch = |labels: Value| Some(json!({"metadata": {"labels": labels}}));
    let (_, changed) = client
        .call(
            "PATCH",
            &format!("{PODS}/p"),
            "application/merge-patch+json",
            patch(json!({"x": "1"})),
        )
        .await;
    let (_, same) = client
        .call(
            "PATCH",
            &format!("{PODS}/p"),
            "application/merge-patch+json",
            patch(json!({"x": "1"})),
        )
        .await;
    let rv = |o: &Value| {
        o["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&changed) > rv(&created));
    assert_eq!(
        rv(&same),
        rv(&changed),
        "an update that changes nothing writes nothing"
    );
    // A status written through the main resource is ignored (pods/status is apart).
    let (_, ignored) = client
        .call(
            "PATCH",
            &format!("{PODS}/p"),
            "application/merge-patch+json",
            Some(json!({"status": {"phase": "Running"}})),
        )
        .await;
    assert_eq!(ignored["status"]["phase"], "Pending");
    let (_, written) = client
        .call(
            "PATCH",
            &format!("{PODS}/p/status"),
            "application/merge-patch+json",
            Some(json!({"status": {"phase": "Running"}})),
        )
        .await;
    assert_eq!(written["status"]["phase"], "Running");
}

#[tokio::test]
async fn a_gated_field_is_dropped_while_its_gate_is_off() {
    let hardened = with(pod("p"), "/spec/hostUsers", json!(false));
    for (gates, kept) in [
        (vec![], false),
        (vec!["UserNamespacesSupport".to_string()], true),
    ] {
        let fake = ApiServer::start_with(Options {
            feature_gates: gates,
            ..Options::default()
        })
        .await;
        let (code, stored) = Client::new(&fake).post(PODS, hardened.clone()).await;
        assert_eq!(code, 201);
        assert_eq!(stored["spec"].get("hostUsers").is_some(), kept, "{stored}");
    }
}

async fn watch_lines(client: &Client, path: &str, until: usize, within: Duration) -> Vec<Value> {
    let response = client
        .http
        .get(format!("{}{path}", client.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let mut lines = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while lines.len() < until {
        let Ok(Some(chunk)) = tokio::time::timeout_at(deadline, stream.next()).await else {
            break;
        };
        buffer.extend_from_slice(&chunk.unwrap());
        while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=at).collect();
            lines.push(serde_json::from_slice(&line).unwrap());
        }
    }
    lines
}

#[tokio::test]
async fn watches_stream_changes_bookmarks_and_gone() {
    let fake = ApiServer::start_with(Options {
        bookmark_every: Duration::from_millis(200),
        ..Options::default()
    })
    .await;
    let client = Client::new(&fake);
    client.post(PODS, pod("before")).await;
    let from = fake.revision();
    let watching = {
        let client = Client {
            base: client.base.clone(),
            http: reqwest::Client::new(),
        };
        tokio::spawn(async move {
            watch_lines(&client, &format!("{PODS}?watch=true&labelSelector=app%3Dweb&allowWatchBookmarks=true&resourceVersion={from}"), 5, Duration::from_secs(5)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.post(PODS, pod("after")).await;
    client
        .call(
            "PATCH",
            &format!("{PODS}/after"),
            "application/merge-patch+json",
            Some(json!({"metadata": {"labels": {"app": "db"}}})),
        )
        .await;
    client
        .post(
            PODS,
            with(pod("other"), "/metadata/labels/app", json!("db")),
        )
        .await;
    let lines = watching.await.unwrap();
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        &kinds[..2],
        ["ADDED", "DELETED"],
        "leaving the selector is a DELETED: {lines:?}"
    );
    assert!(kinds[2..].iter().all(|k| *k == "BOOKMARK"), "{kinds:?}");
    assert_eq!(lines[2]["object"]["kind"], "Pod");

    // A watch with a timeout ends by itself.
    let started = tokio::time::Instant::now();
    let lines = watch_lines(
        &client,
        &format!("{PODS}?watch=true&timeoutSeconds=1"),
        100,
        Duration::from_secs(10),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        lines.len(),
        3,
        "the synthetic ADDED events of what exists: {lines:?}"
    );

    fake.compact();
    let lines = watch_lines(
        &client,
        &format!("{PODS}?watch=true&resourceVersion={from}"),
        1,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(lines[0]["type"], "ERROR");
    assert_eq!(lines[0]["object"]["code"], 410);
    assert_eq!(lines[0]["object"]["reason"], "Expired");
}

#[tokio::test]
async fn deletion_waits_for_grace_protection_and_owners() {
    let fake = ApiServer::start().await;
    let client = Client::new(&fake);
    let (_, owner) = client.post(POOLS, pool("builders")).await;
    let owned = with(
        pod("p"),
        "/metadata/ownerReferences",
        json!([{"apiVersion": "mango.dev/v1alpha1",
        "kind": "WorkerPool", "name": "builders", "uid": owner["metadata"]["uid"], "controller": true}]),
    );
    client.post(PVCS, pvc("claim")).await;
    client.post(PODS, owned).await;
    fake.set_pod_status("p", json!({"phase": "Running"}));

    // The claim is protected while the Pod uses it.
    let (code, claim) = client
        .call("DELETE", &format!("{PVCS}/claim"), "", None)
        .await;
    assert_eq!(code, 200);
    assert!(
        claim["metadata"]["deletionTimestamp"].is_string(),
        "{claim}"
    );
    assert_eq!(
        claim["metadata"]["finalizers"],
        json!(["kubernetes.io/pvc-protection"])
    );
    assert_eq!(fake.pvcs(), vec!["claim".to_string()]);

    // A graceful delete marks the Pod; the grace ends it.
    let (_, marked) = client
        .call(
            "DELETE",
            &format!("{PODS}/p"),
            "application/json",
            Some(json!({"gracePeriodSeconds": 1})),
        )
        .await;
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 1);
    assert!(fake.pod("p").is_some(), "still there during its grace");
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while (fake.pod("p").is_some() || !fake.pvcs().is_empty())
        && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(fake.pod("p").is_none(), "gone after its grace");
    assert!(fake.pvcs().is_empty(), "the claim goes once no Pod uses it");

    // Owned Pods go with their owner.
    let owned = with(
        pod("q"),
        "/metadata/ownerReferences",
        json!([{"apiVersion": "mango.dev/v1alpha1",
        "kind": "WorkerPool", "name": "builders", "uid": owner["metadata"]["uid"]}]),
    );
    client
        .post(
            PODS,
            with(
                owned.clone(),
                "/spec/volumes",
                json!([{"name": "w", "emptyDir": {}}]),
            ),
        )
        .await;
    assert!(fake.pod("q").is_some());
    client
        .call("DELETE", &format!("{POOLS}/builders"), "", None)
        .await;
    assert!(
        fake.pod("q").is_none(),
        "an unscheduled Pod goes at once with its owner"
    );
    // A Pod whose owner never existed is collected too.
    client
        .post(
            PODS,
            with(
                with(
                    pod("r"),
                    "/metadata/ownerReferences",
                    json!([{"apiVersion": "mango.dev/v1alpha1",
        "kind": "WorkerPool", "name": "ghost", "uid": "nope"}]),
                ),
                "/spec/volumes",
                json!([{"name": "w", "emptyDir": {}}]),
            ),
        )
        .await;
    assert!(fake.pod("r").is_none());
}

#[tokio::test]
async fn secrets_fold_string_data_and_lists_page() {
    let fake = ApiServer::start().await;
    let client = Client::new(&fake);
    let (code, secret) = client
        .post(
            "/api/v1/namespaces/sandboxes/secrets",
            json!({"metadata": {"name": "key"}, "stringData": {"environment-key": "mango_envk_x"}}),
        )
        .await;
    assert_eq!(code, 201);
    assert!(
        secret.get("stringData").is_none(),
        "stringData is never stored"
    );
    assert_eq!(secret["data"]["environment-key"], "bWFuZ29fZW52a194");
    for name in ["a", "b", "c"] {
        client
            .post(
                PODS,
                with(
                    pod(name),
                    "/spec/volumes",
                    json!([{"name": "w", "emptyDir": {}}]),
                ),
            )
            .await;
    }
    let (_, page) = client
        .call("GET", &format!("{PODS}?limit=2"), "", None)
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let token = page["metadata"]["continue"].as_str().unwrap();
    let (_, rest) = client
        .call(
            "GET",
            &format!("{PODS}?limit=2&continue={}", crate::urlencode(token)),
            "",
            None,
        )
        .await;
    assert_eq!(rest["items"][0]["metadata"]["name"], "c");
    assert!(rest["metadata"].get("continue").is_none());
    let (_, discovery) = client
        .call("GET", "/apis/mango.dev/v1alpha1", "", None)
        .await;
    assert!(discovery["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "workerpools/status"));
}
