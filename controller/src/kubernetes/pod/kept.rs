//! The Session Pod of a pool that keeps (`keepIdle`, spec §7.1) as pure
//! functions of the pool, and the patch that rebinds a kept Pod to its
//! Session's next item. Such a Pod may serve several items, so it is made
//! as a warm Pod is: its runner waits (`--wait`) for an envelope per
//! activation on a stdin that stays open past the first attach
//! (`stdinOnce: false`), and its environment names no item (its labels
//! do, patched at each binding). Healthcheck Pods and pools that keep
//! nothing keep `stdinOnce: true` and the one-shot hand-off.
//!
//! Its `activeDeadlineSeconds` counts from the Pod's start and can only be
//! lowered, so it bounds the Pod's whole life, its keeps and later
//! activations included; a kept Pod with less than half an item's deadline
//! left is not rebound but recycled, so every activation it serves has at
//! least that long.

use super::warm::{item_deadline, ANNOTATION_BOUND_AT, RUNNER, RUNNER_WAIT_SLACK};
use super::{ANNOTATION_HANDED_OFF, CONTAINER};
use crate::core::launcher::{ItemIdentity, SandboxSpec};
use crate::kubernetes::crd::WorkerPool;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

/// The runner's option that makes it wait, after an idle end, for its
/// Session's next envelope.
pub const KEEP_FLAG: &str = "--keep-idle-seconds";

/// Whether the Pod `pool` makes now for `item` waits for envelopes and may
/// be kept. A Pod made earlier answers for itself ([`runs_kept`]): the
/// pool's `keepIdle` may have changed since.
pub fn makes_waiting(pool: &WorkerPool, item: &ItemIdentity) -> bool {
    !pool.spec.keep_idle().is_zero() && item.session_id.is_some()
}

/// Whether Pod `pod`'s runner waits, after an idle end, for a next
/// envelope: it was made with [`KEEP_FLAG`], by a pool that kept then,
/// whatever the pool says now. Read from the command the container runs,
/// which names no secret.
pub fn runs_kept(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .find(|c| c.name == CONTAINER)
        .and_then(|c| c.command.as_ref())
        .is_some_and(|command| command.iter().any(|arg| arg == KEEP_FLAG))
}

/// The runner's [`KEEP_FLAG`] option, when the pool keeps.
pub fn keep_args(pool: &WorkerPool) -> Vec<String> {
    let keep = pool.spec.keep_idle();
    if keep.is_zero() {
        return Vec::new();
    }
    vec![KEEP_FLAG.to_string(), keep.as_secs().to_string()]
}

/// The command of a cold Pod that waits: its first envelope comes right
/// after it runs, so the runner gives up on it after the start bound and
/// a slack (a Pod whose supervisor died before delivering ends itself).
pub fn command(pool: &WorkerPool) -> Vec<String> {
    let first = pool.spec.start_timeout() + RUNNER_WAIT_SLACK;
    let mut command = vec![
        RUNNER.to_string(),
        "--wait".to_string(),
        "--wait-timeout-seconds".to_string(),
        first.as_secs().to_string(),
    ];
    command.extend(keep_args(pool));
    command
}

/// Makes the built Pod of a waiting item one that takes an envelope per
/// activation.
pub fn make_waiting(pod: &mut Pod, pool: &WorkerPool) {
    let spec = pod.spec.as_mut().expect("a built Pod has a spec");
    let runner = spec
        .containers
        .iter_mut()
        .find(|c| c.name == CONTAINER)
        .expect("a built Pod has the runner");
    runner.command = Some(command(pool));
    runner.stdin_once = Some(false);
}

/// Whether Pod `pod`'s runner can take another envelope over a new
/// attach: with `stdinOnce` its stdin closed when the first detached.
pub fn takes_another_envelope(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .find(|c| c.name == CONTAINER)
        .is_some_and(|c| c.stdin == Some(true) && c.stdin_once != Some(true))
}

/// The least of its deadline a kept Pod must have left to be rebound.
pub fn least_life_left(pool: &WorkerPool) -> i64 {
    item_deadline(pool) / 2
}

/// Seconds left of `pod`'s `activeDeadlineSeconds` when it has been up
/// `age` seconds; `None` without a deadline.
pub fn life_left(pod: &Pod, age: i64) -> Option<i64> {
    let deadline = pod.spec.as_ref()?.active_deadline_seconds?;
    Some(deadline - age)
}

/// The merge patch that rebinds a kept Pod to `spec`'s item: §7's labels
/// of the new item (one Session's items share every other label), its
/// binding time, and no hand-off mark until the new envelope is
/// delivered (a supervisor restarted before that removes it rather than
/// adopting a runner that never got it). `resource_version` makes it
/// apply only to the Pod as it was read, so two binders never both win.
pub fn rebinding(spec: &SandboxSpec, resource_version: &str) -> Value {
    let labels: serde_json::Map<String, Value> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": labels,
            "annotations": {
                ANNOTATION_BOUND_AT: jiff::Timestamp::now().to_string(),
                ANNOTATION_HANDED_OFF: null,
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::pod::{sandbox_pod, validate, warm};
    use mango_protocol::WorkType;

    fn pool(keep_idle: Option<u32>) -> WorkerPool {
        let mut pool: WorkerPool = serde_json::from_value(json!({
            "apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": "builders", "namespace": "sandboxes", "uid": "uid-1"},
            "spec": {"environmentId": "env_1", "environmentKeySecret": {"name": "key"}}
        }))
        .unwrap();
        pool.spec.keep_idle = keep_idle;
        pool
    }

    fn spec(work_type: WorkType) -> SandboxSpec {
        let item = ItemIdentity {
            work_id: "work_1".into(),
            claim: 3,
            environment_id: "env_1".into(),
            session_id: (work_type == WorkType::Session).then(|| "sesn_1".to_string()),
            work_type,
        };
        SandboxSpec::for_item(&item, "builders", "http://api:8081")
    }

    #[test]
    fn keep_idle_is_zero_to_thirty_minutes() {
        for ok in [None, Some(0), Some(1), Some(1800)] {
            assert_eq!(validate(&pool(ok)), Ok(()), "{ok:?}");
        }
        let err = validate(&pool(Some(1801))).unwrap_err();
        assert_eq!(err.field, "keepIdle");
        assert_eq!(err.to_string(), "spec.keepIdle: must be 0 to 1800 seconds");
        assert!(pool(None).spec.keep_idle().is_zero(), "off unless asked");
    }

    #[test]
    fn a_keeping_pools_session_pod_waits_on_an_open_stdin_and_names_no_item_in_its_env() {
        let keeping = pool(Some(300));
        let pod = sandbox_pod(&keeping, &spec(WorkType::Session), "mango-sandbox:1");
        let runner = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(runner.stdin_once, Some(false));
        assert_eq!(
            runner.command.clone().unwrap(),
            [
                RUNNER,
                "--wait",
                "--wait-timeout-seconds",
                "180",
                "--keep-idle-seconds",
                "300"
            ]
        );
        let names: Vec<&str> = runner
            .env
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(names, ["MANGO_BASE_URL", "MANGO_WORKSPACE"]);
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[warm::ANNOTATION_TEMPLATE],
            warm::template(&keeping, "mango-sandbox:1", "http://api:8081"),
            "compared with the pool's template when its Session's next item comes"
        );
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()["mango.dev/work-id"],
            "work_1"
        );
        assert!(takes_another_envelope(&pod));
        assert!(runs_kept(&pod));
        let warm_pod = warm::warm_pod(
            &keeping,
            "mango-warm-1",
            "mango-sandbox:1",
            "http://api:8081",
        );
        let command = warm_pod.spec.unwrap().containers[0]
            .command
            .clone()
            .unwrap();
        assert!(command.ends_with(&["--keep-idle-seconds".into(), "300".into()]));
    }

    #[test]
    fn healthchecks_and_pools_that_keep_nothing_keep_stdin_once() {
        let check = sandbox_pod(&pool(Some(300)), &spec(WorkType::Healthcheck), "img");
        let session = sandbox_pod(&pool(Some(0)), &spec(WorkType::Session), "img");
        for pod in [check, session] {
            let runner = &pod.spec.as_ref().unwrap().containers[0];
            assert_eq!(runner.stdin_once, Some(true));
            assert_eq!(runner.command, None, "the image's runner, given its secret");
            assert!(!takes_another_envelope(&pod));
            assert!(!runs_kept(&pod), "its runner exits after its activation");
            assert!(pod
                .metadata
                .annotations
                .is_none_or(|a| !a.contains_key(warm::ANNOTATION_TEMPLATE)));
        }
        let warm_pod = warm::warm_pod(&pool(None), "mango-warm-1", "img", "http://api:8081");
        assert!(!runs_kept(&warm_pod), "it waits for one envelope only");
        let command = warm_pod.spec.unwrap().containers[0]
            .command
            .clone()
            .unwrap();
        assert!(!command.contains(&KEEP_FLAG.to_string()));
    }

    #[test]
    fn the_rebinding_names_the_new_item_and_clears_the_hand_off() {
        let patch = rebinding(&spec(WorkType::Session), "42");
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["metadata"]["labels"]["mango.dev/work-id"], "work_1");
        assert_eq!(patch["metadata"]["labels"]["mango.dev/claim"], "3");
        assert!(patch["metadata"]["annotations"][ANNOTATION_HANDED_OFF].is_null());
        assert!(patch["metadata"]["annotations"][ANNOTATION_BOUND_AT].is_string());
        assert!(patch.get("spec").is_none(), "its deadline is never raised");
    }
}
