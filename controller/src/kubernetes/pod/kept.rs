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

/// Whether `item`'s Pod in `pool` waits for envelopes and may be kept.
pub fn waits(pool: &WorkerPool, item: &ItemIdentity) -> bool {
    !pool.spec.keep_idle().is_zero() && item.session_id.is_some()
}

/// The runner's `--keep-idle-seconds` option, when the pool keeps.
pub fn keep_args(pool: &WorkerPool) -> Vec<String> {
    let keep = pool.spec.keep_idle();
    if keep.is_zero() {
        return Vec::new();
    }
    vec![
        "--keep-idle-seconds".to_string(),
        keep.as_secs().to_string(),
    ]
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
