//! The warm Pod and its PVC (spec §7.1) as pure functions of the pool, and
//! the patches that bind them. A warm Pod is the cold Pod of
//! [`super::sandbox_pod_on`] with no identity: its runner waits
//! (`--wait`) for one envelope on a stdin that stays open past the first
//! attach (`stdinOnce: false`), its environment holds only the api's URL,
//! the workspace path and the pool's egress proxy (with no Work id in its
//! URL), its labels only the pool's and
//! `mango.dev/warm=true`. Its workspace is a fresh PVC of the same name,
//! owned by the Pod so that it goes with it, unless binding gives it to a
//! Session (the binding patch drops the owner and adds the Session's label).

use super::{build, Workspace, DEFAULT_DEADLINE_SECONDS};
use crate::core::launcher::SandboxSpec;
use crate::core::naming;
use crate::kubernetes::crd::WorkerPool;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::Duration;

/// `true` on a warm Pod and its PVC until binding removes it.
pub const LABEL_WARM: &str = "mango.dev/warm";
/// The first part of a warm Pod's name and of its PVC's.
pub const WARM_PREFIX: &str = "mango-warm-";
/// The digest of what the Pod and PVC were made from ([`template`]): a
/// pool whose spec or image changed recycles warm Pods of another.
pub const ANNOTATION_TEMPLATE: &str = "mango.dev/warm-template";
/// When a warm Pod was bound to its item: its hand-off bound counts from
/// here, not from its creation.
pub const ANNOTATION_BOUND_AT: &str = "mango.dev/bound-at";
/// The runner in the sandbox image (its `CMD`).
pub const RUNNER: &str = "/usr/local/bin/mango-runner";
/// The runner waits this much longer than the pool's `warm.maxAge` before
/// it gives up by itself: the controller recycles a warm Pod at its
/// maxAge, and the runner's own limit only ends one no controller watches.
pub const RUNNER_WAIT_SLACK: Duration = Duration::from_secs(60);

/// The labels of a warm Pod and of its PVC: the pool's, and no item's.
pub fn labels(pool: &WorkerPool) -> BTreeMap<String, String> {
    BTreeMap::from([
        (naming::LABEL_POOL.to_string(), pool.name_any()),
        (
            naming::LABEL_MANAGED_BY.to_string(),
            naming::MANAGED_BY.to_string(),
        ),
        (LABEL_WARM.to_string(), "true".to_string()),
    ])
}

/// An item's deadline (`activeDeadlineSeconds`), counted from its binding.
pub fn item_deadline(pool: &WorkerPool) -> i64 {
    pool.spec
        .active_deadline_seconds
        .unwrap_or(DEFAULT_DEADLINE_SECONDS)
}

/// The longest a warm Pod's runner waits for its envelope.
pub fn runner_wait(pool: &WorkerPool) -> Duration {
    pool.spec.warm_max_age() + RUNNER_WAIT_SLACK
}

/// The warm Pod `name` of `pool`, whose runner reaches the api at
/// `base_url`, with its [`ANNOTATION_TEMPLATE`].
pub fn warm_pod(pool: &WorkerPool, name: &str, image: &str, base_url: &str) -> Pod {
    let mut pod = unannotated(pool, name, image, base_url);
    let digest = template(pool, image, base_url);
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_TEMPLATE.to_string(), digest);
    pod
}

fn unannotated(pool: &WorkerPool, name: &str, image: &str, base_url: &str) -> Pod {
    let mut env = vec![("MANGO_BASE_URL".to_string(), base_url.to_string())];
    env.extend(super::egress_env(pool, base_url, ""));
    let mut pod = build(
        pool,
        name,
        &labels(pool),
        &env,
        image,
        Workspace::Claim(name),
    );
    let spec = pod.spec.as_mut().expect("a built Pod has a spec");
    // It may wait this long, then serve a whole item: binding lowers it to
    // the wait so far plus the item's deadline.
    spec.active_deadline_seconds = Some(item_deadline(pool) + runner_wait(pool).as_secs() as i64);
    let runner = &mut spec.containers[0];
    let mut command = vec![
        RUNNER.to_string(),
        "--wait".to_string(),
        "--wait-timeout-seconds".to_string(),
        runner_wait(pool).as_secs().to_string(),
    ];
    // Bound to a Session of a pool that keeps, it may be kept.
    command.extend(super::kept::keep_args(pool));
    runner.command = Some(command);
    // The envelope comes by an attach once the Pod runs; a kept one takes
    // its Session's next by a second attach.
    runner.stdin_once = Some(false);
    pod
}

/// The first 16 hex digits of the SHA-256 of the warm Pod and PVC the pool
/// makes now, under one fixed name: equal for every warm Pod its spec, its
/// image and the api's URL make, different when any of them changes.
pub fn template(pool: &WorkerPool, image: &str, base_url: &str) -> String {
    const NAME: &str = "mango-warm-template";
    let pod = unannotated(pool, NAME, image, base_url);
    let pvc = warm_pvc(pool, NAME, None);
    let bytes = serde_json::to_vec(&(pod, pvc)).expect("a Pod serializes");
    hex::encode(&Sha256::digest(&bytes)[..8])
}

/// The warm Pod `name`'s PVC: sized as a Session's, owned by the Pod
/// (`pod_uid`) so that it goes with it.
pub fn warm_pvc(pool: &WorkerPool, name: &str, pod_uid: Option<&str>) -> PersistentVolumeClaim {
    let mut claim = super::session_pvc(pool, "");
    claim.metadata.name = Some(name.to_string());
    claim.metadata.labels = Some(labels(pool));
    claim.metadata.owner_references = pod_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: name.to_string(),
            uid: uid.to_string(),
            controller: Some(false),
            block_owner_deletion: Some(false),
        }]
    });
    claim
}

/// Whether the Pod or PVC with these labels is warm and unbound.
pub fn is_unbound(labels: &BTreeMap<String, String>) -> bool {
    labels.get(LABEL_WARM).map(String::as_str) == Some("true")
        && !labels.contains_key(naming::LABEL_WORK_ID)
}

/// The merge patch that binds a warm Pod to `spec`'s item: §7's labels in
/// place of `mango.dev/warm`, the binding time, and a deadline of
/// `deadline` seconds from the Pod's start. `resource_version` makes it
/// apply only to the Pod as it was read, so two binders never both win.
pub fn pod_binding(spec: &SandboxSpec, resource_version: &str, deadline: i64) -> Value {
    let mut labels: serde_json::Map<String, Value> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    labels.insert(LABEL_WARM.to_string(), Value::Null);
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": labels,
            "annotations": {ANNOTATION_BOUND_AT: jiff::Timestamp::now().to_string()},
        },
        "spec": {"activeDeadlineSeconds": deadline},
    })
}

/// The merge patch that makes a bound warm Pod's PVC Session
/// `session_id`'s: its labels, and no owner (it outlives the Pod).
pub fn pvc_binding(session_id: &str, environment_id: &str, resource_version: &str) -> Value {
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {
                LABEL_WARM: null,
                // A Session outlives pools, as a cold Session's PVC does.
                naming::LABEL_POOL: null,
                naming::LABEL_SESSION_ID: session_id,
                naming::LABEL_ENVIRONMENT_ID: environment_id,
            },
            "ownerReferences": null,
        },
    })
}
