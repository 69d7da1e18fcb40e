//! Kubernetes Events on the pool for what its supervisor does, so
//! `kubectl describe workerpool` and `kubectl get events` tell the story:
//! launches, failures, adoptions, removals, swept workspaces.

use crate::core::observer::{Happening, Observer};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

pub struct PoolEvents {
    recorder: Recorder,
    pool: ObjectReference,
}

impl PoolEvents {
    pub fn new(recorder: Recorder, pool: ObjectReference) -> PoolEvents {
        PoolEvents { recorder, pool }
    }

    /// Publishes in the background: an Event never holds up an item.
    pub fn publish(&self, type_: EventType, reason: &str, action: &str, note: String) {
        let (recorder, pool) = (self.recorder.clone(), self.pool.clone());
        let event = Event {
            type_,
            reason: reason.into(),
            // The API server refuses notes over 1 kB.
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(err) = recorder.publish(&event, &pool).await {
                tracing::warn!(error = %err, "could not publish a Kubernetes Event");
            }
        });
    }
}

/// The Event for one happening, if it makes one: (type, reason, action, note).
pub fn describe(
    happening: Happening<'_>,
) -> Option<(EventType, &'static str, &'static str, String)> {
    Some(match happening {
        Happening::Launched(sandbox) => (
            EventType::Normal,
            "SandboxStarted",
            "Launch",
            format!(
                "Pod {} runs {} (claim {})",
                sandbox.name, sandbox.item.work_id, sandbox.item.claim
            ),
        ),
        Happening::LaunchFailed { item, error } => (
            EventType::Warning,
            "LaunchFailed",
            "Launch",
            format!(
                "{} (claim {}): {error}; the item is left to its lease",
                item.work_id, item.claim
            ),
        ),
        Happening::Adopted(sandbox) => (
            EventType::Normal,
            "SandboxAdopted",
            "Adopt",
            format!(
                "Pod {} of {} was left by an earlier controller and is watched again",
                sandbox.name, sandbox.item.work_id
            ),
        ),
        Happening::Removed { sandbox, outcome } => (
            EventType::Normal,
            "SandboxRemoved",
            "Remove",
            format!(
                "Pod {} of {} removed ({})",
                sandbox.name,
                sandbox.item.work_id,
                outcome.as_str()
            ),
        ),
        Happening::RemovalUnconfirmed { sandbox, error } => (
            EventType::Warning,
            "RemovalUnconfirmed",
            "Remove",
            format!("Pod {}: {error}; retrying", sandbox.name),
        ),
        Happening::WorkspaceRemoved { session_id } => (
            EventType::Normal,
            "WorkspaceRemoved",
            "Sweep",
            format!("the PVC of deleted Session {session_id} was removed"),
        ),
        // Its stage times are metrics, not news.
        #[cfg(feature = "bench-hooks")]
        Happening::Done { .. } => return None,
    })
}

impl Observer for PoolEvents {
    fn observe(&self, happening: Happening<'_>) {
        if let Some((type_, reason, action, note)) = describe(happening) {
            self.publish(type_, reason, action, note);
        }
    }
}
