//! The orphan sweep: sandbox Pods no supervisor will remove. Pods carry no
//! finalizers, so nothing blocks their deletion; this sweep (and each
//! Pod's `activeDeadlineSeconds`, the kubelet's backstop) makes sure none
//! is left behind:
//! * a Pod that finished (its supervisor removes it at once; one left for
//!   a minute lost its supervisor);
//! * a Pod whose pool is gone (the owner reference lets Kubernetes collect
//!   it too; the sweep does not wait for that);
//! * a Pod whose hand-off never completed, once its start bound is over
//!   (its secret can never arrive: `stdinOnce` is spent or never used),
//!   counted from its binding for a warm Pod that was bound;
//! * a warm Pod past the longest its runner waits (its pool's `warm.maxAge`
//!   and the slack): its supervisor would have replaced it long before.

use crate::core::naming;
use crate::kubernetes::pod::warm::{self as warm_pod, ANNOTATION_BOUND_AT};
use crate::kubernetes::pod::ANNOTATION_HANDED_OFF;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use std::collections::HashMap;
use std::time::Duration;

/// A finished Pod is left to its supervisor this long.
pub const FINISHED_GRACE: Duration = Duration::from_secs(60);

/// Why a Pod is an orphan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orphan {
    Finished,
    PoolGone,
    NeverHandedOff,
    WarmExpired,
}

impl Orphan {
    pub fn as_str(self) -> &'static str {
        match self {
            Orphan::Finished => "finished",
            Orphan::PoolGone => "pool_gone",
            Orphan::NeverHandedOff => "never_handed_off",
            Orphan::WarmExpired => "warm_expired",
        }
    }
}

/// What the sweep needs of a pool that exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolBounds {
    pub uid: String,
    /// From a Pod's creation (or binding) to its hand-off.
    pub start_bound: Duration,
    /// The longest a warm Pod's runner waits ([`warm_pod::runner_wait`]).
    pub warm_wait: Duration,
}

/// The pools that exist, by name.
pub type Pools = HashMap<String, PoolBounds>;

/// Whether `pod` is an orphan at `now` (a Unix time).
pub fn verdict(pod: &Pod, pools: &Pools, now: jiff::Timestamp) -> Option<Orphan> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let age = |since: &jiff::Timestamp| -> Duration {
        now.duration_since(*since)
            .try_into()
            .unwrap_or(Duration::ZERO)
    };
    let pool = pod.labels().get(naming::LABEL_POOL)?;
    let owner_uid = pod
        .owner_references()
        .iter()
        .find(|o| o.kind == "WorkerPool")
        .map(|o| o.uid.as_str());
    let Some(bounds) = pools.get(pool) else {
        return Some(Orphan::PoolGone);
    };
    if owner_uid.is_some_and(|o| o != bounds.uid) {
        // A pool of the same name made again: not this Pod's owner.
        return Some(Orphan::PoolGone);
    }
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        let finished = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
            .map(|t| t.0)
            .max();
        let created = pod.creation_timestamp().map(|t| t.0);
        let since = finished.or(created)?;
        return (age(&since) >= FINISHED_GRACE).then_some(Orphan::Finished);
    }
    let created = pod.creation_timestamp()?.0;
    if warm_pod::is_unbound(pod.labels()) {
        // It waits for an envelope by design, until its runner gives up.
        return (age(&created) >= bounds.warm_wait + FINISHED_GRACE).then_some(Orphan::WarmExpired);
    }
    if !pod.annotations().contains_key(ANNOTATION_HANDED_OFF) {
        let bound_at = pod
            .annotations()
            .get(ANNOTATION_BOUND_AT)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok());
        // The supervisor gives up (and deletes it) at its bound; a minute more.
        if age(&bound_at.unwrap_or(created)) >= bounds.start_bound + FINISHED_GRACE {
            return Some(Orphan::NeverHandedOff);
        }
    }
    None
}

/// Deletes every orphan among the sandbox Pods of `pods`' namespace; how
/// many it deleted.
pub async fn sweep(pods: &Api<Pod>, pools: &Pools) -> Result<usize, kube::Error> {
    let selector = format!("{}={}", naming::LABEL_MANAGED_BY, naming::MANAGED_BY);
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    let now = jiff::Timestamp::now();
    let mut deleted = 0;
    for pod in &listed.items {
        let Some(why) = verdict(pod, pools, now) else {
            continue;
        };
        let name = pod.name_any();
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match pods.delete(&name, &params).await {
            Ok(_) => {
                deleted += 1;
                tracing::info!(pod = %name, why = why.as_str(), "deleted an orphaned sandbox Pod");
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                tracing::warn!(pod = %name, error = %err, "could not delete an orphaned sandbox Pod; next sweep retries")
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(pool: &str, owner: &str, phase: &str, extra: serde_json::Value) -> Pod {
        let mut pod = json!({
            "metadata": {
                "name": "mango-work-a-1",
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"mango.dev/pool": pool, "app.kubernetes.io/managed-by": "mango-worker"},
                "ownerReferences": [{"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
                                     "name": pool, "uid": owner}]
            },
            "status": {"phase": phase}
        });
        merge(&mut pod, extra);
        serde_json::from_value(pod).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn pools() -> Pools {
        Pools::from([(
            "p".into(),
            PoolBounds {
                uid: "uid-p".into(),
                start_bound: Duration::from_secs(120),
                warm_wait: Duration::from_secs(3660),
            },
        )])
    }

    const HANDED: &str =
        r#"{"metadata": {"annotations": {"mango.dev/handed-off": "2026-12-01T10:00:05Z"}}}"#;

    #[test]
    fn a_running_handed_off_pod_of_a_live_pool_stays() {
        let p = pod(
            "p",
            "uid-p",
            "Running",
            serde_json::from_str(HANDED).unwrap(),
        );
        assert_eq!(verdict(&p, &pools(), at("2026-12-02T00:00:00Z")), None);
    }

    #[test]
    fn a_finished_pod_is_an_orphan_a_minute_after_it_finished() {
        let finished = json!({"status": {"containerStatuses": [{"name": "runner", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-12-01T10:05:00Z"}}}]}});
        let p = pod("p", "uid-p", "Succeeded", finished);
        assert_eq!(verdict(&p, &pools(), at("2026-12-01T10:05:59Z")), None);
        assert_eq!(
            verdict(&p, &pools(), at("2026-12-01T10:06:00Z")),
            Some(Orphan::Finished)
        );
        let failed = pod("p", "uid-p", "Failed", json!({}));
        assert_eq!(
            verdict(&failed, &pools(), at("2026-12-01T10:01:00Z")),
            Some(Orphan::Finished),
            "no container status: counted from creation"
        );
    }

    #[test]
    fn a_pod_whose_pool_is_gone_or_remade_is_an_orphan_at_once() {
        let handed = serde_json::from_str(HANDED).unwrap();
        let gone = pod("q", "uid-q", "Running", handed);
        assert_eq!(
            verdict(&gone, &pools(), at("2026-12-01T10:00:10Z")),
            Some(Orphan::PoolGone)
        );
        let remade = pod(
            "p",
            "uid-old",
            "Running",
            serde_json::from_str(HANDED).unwrap(),
        );
        assert_eq!(
            verdict(&remade, &pools(), at("2026-12-01T10:00:10Z")),
            Some(Orphan::PoolGone)
        );
    }

    #[test]
    fn a_pod_never_handed_its_secret_is_an_orphan_after_its_bound() {
        for phase in ["Pending", "Running"] {
            let p = pod("p", "uid-p", phase, json!({}));
            assert_eq!(
                verdict(&p, &pools(), at("2026-12-01T10:02:59Z")),
                None,
                "{phase}"
            );
            assert_eq!(
                verdict(&p, &pools(), at("2026-12-01T10:03:00Z")),
                Some(Orphan::NeverHandedOff),
                "{phase}"
            );
        }
    }

    #[test]
    fn a_warm_pod_waits_until_its_runner_would_give_up() {
        let warm = pod(
            "p",
            "uid-p",
            "Running",
            json!({"metadata": {"labels": {"mango.dev/warm": "true"}}}),
        );
        // Created 10:00:00; its runner waits 3660 s, the sweep a minute more.
        assert_eq!(verdict(&warm, &pools(), at("2026-12-01T11:01:59Z")), None);
        assert_eq!(
            verdict(&warm, &pools(), at("2026-12-01T11:02:00Z")),
            Some(Orphan::WarmExpired)
        );
        let gone = pod(
            "q",
            "uid-q",
            "Running",
            json!({"metadata": {"labels": {"mango.dev/warm": "true"}}}),
        );
        assert_eq!(
            verdict(&gone, &pools(), at("2026-12-01T10:00:01Z")),
            Some(Orphan::PoolGone)
        );
    }

    #[test]
    fn a_bound_warm_pods_hand_off_bound_counts_from_its_binding() {
        let bound = pod(
            "p",
            "uid-p",
            "Running",
            json!({"metadata": {"labels": {"mango.dev/work-id": "work_1"},
                "annotations": {"mango.dev/bound-at": "2026-12-01T10:30:00Z"}}}),
        );
        assert_eq!(verdict(&bound, &pools(), at("2026-12-01T10:32:59Z")), None);
        assert_eq!(
            verdict(&bound, &pools(), at("2026-12-01T10:33:00Z")),
            Some(Orphan::NeverHandedOff)
        );
    }

    #[test]
    fn a_pod_being_deleted_is_left_alone() {
        let p = pod(
            "q",
            "uid-q",
            "Running",
            json!({"metadata": {"deletionTimestamp": "2026-12-01T10:00:01Z"}}),
        );
        assert_eq!(verdict(&p, &pools(), at("2026-12-02T00:00:00Z")), None);
    }
}
