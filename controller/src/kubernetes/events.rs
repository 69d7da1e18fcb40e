//! Kubernetes Events on the pool for what its supervisor does, so
//! `kubectl describe workerpool` and `kubectl get events` tell the story:
//! launches, failures, adoptions, removals, swept workspaces.
//!
//! kube-runtime's recorder keeps one Event per (type, action, reason,
//! reporter, regarding, related) for six minutes and only counts repeats,
//! keeping the first note. Every Event here regards the pool, so each one
//! about a Pod (or a Session's PVC) names it as `related`: one Event per
//! Pod, each with its own note.

use crate::core::naming;
use crate::core::observer::{Happening, Observer};
use crate::kubernetes::pod;
use crate::kubernetes::validation::DNS1123_SUBDOMAIN_MAX;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;

/// The API server refuses an Event whose note is longer, in bytes
/// (`NoteLengthLimit` of the core validation).
pub const NOTE_MAX_BYTES: usize = 1024;
/// The recorder names an Event `<regarding name>.<nanoseconds in hex>`.
const NAME_SUFFIX_MAX: usize = 17;

#[derive(Clone)]
pub struct PoolEvents {
    recorder: Recorder,
    client: Client,
    reporter: Reporter,
    pool: ObjectReference,
}

/// `note` cut to at most [`NOTE_MAX_BYTES`] bytes at a character boundary,
/// marked with `…` where it was cut.
pub fn truncate_note(note: &str) -> String {
    if note.len() <= NOTE_MAX_BYTES {
        return note.to_string();
    }
    let mark = "…";
    let mut end = NOTE_MAX_BYTES - mark.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{mark}", &note[..end])
}

/// A reference to Pod `name` in `namespace`.
pub fn pod_ref(namespace: Option<String>, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.to_string()),
        namespace,
        ..Default::default()
    }
}

/// A reference to Session `session_id`'s workspace PVC.
pub fn pvc_ref(namespace: Option<String>, session_id: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: Some(pod::pvc_name(session_id)),
        namespace,
        ..Default::default()
    }
}

impl PoolEvents {
    /// Events on `pool` through `recorder` (made with `client` and `reporter`).
    pub fn new(
        recorder: Recorder,
        client: Client,
        reporter: Reporter,
        pool: ObjectReference,
    ) -> PoolEvents {
        PoolEvents {
            recorder,
            client,
            reporter,
            pool,
        }
    }

    /// Publishes in the background: an Event never holds up an item.
    pub fn publish(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        let event = event(type_, reason, action, &note, related);
        let this = self.clone();
        tokio::spawn(async move {
            let published = if this.recorder_can_name() {
                this.recorder.publish(&event, &this.pool).await
            } else {
                this.create_named(&event).await
            };
            if let Err(err) = published {
                tracing::warn!(error = %err, "could not publish a Kubernetes Event");
            }
        });
    }

    /// Whether the recorder's name for an Event on this pool is one the
    /// API server takes (a pool named near 253 characters makes it longer).
    fn recorder_can_name(&self) -> bool {
        self.pool.name.as_deref().unwrap_or_default().len() + NAME_SUFFIX_MAX
            <= DNS1123_SUBDOMAIN_MAX
    }

    /// The Event the recorder would make, under a name that fits: only for
    /// pools whose name does not leave room for the recorder's suffix
    /// (such a pool is refused, and this Event says why).
    async fn create_named(&self, event: &Event) -> Result<(), kube::Error> {
        let object = event_object(&self.pool, &self.reporter, event, jiff::Timestamp::now());
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        Api::<KubeEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &object)
            .await
            .map(|_| ())
    }
}

/// What the recorder is given for one Event, its note cut to what the API
/// server takes.
pub fn event(
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
    related: Option<ObjectReference>,
) -> Event {
    Event {
        type_,
        reason: reason.into(),
        note: Some(truncate_note(note)),
        action: action.into(),
        secondary: related,
    }
}

/// The `events.k8s.io/v1` Event the recorder creates for `event` about
/// `regarding` at `now` (kube-runtime's `generate_event`), named
/// `<regarding name>.<nanoseconds in hex>` with the name cut where it
/// would not fit a DNS-1123 subdomain.
pub fn event_object(
    regarding: &ObjectReference,
    reporter: &Reporter,
    event: &Event,
    now: jiff::Timestamp,
) -> KubeEvent {
    let base = regarding.name.as_deref().unwrap_or(&reporter.controller);
    let keep = DNS1123_SUBDOMAIN_MAX - NAME_SUFFIX_MAX;
    let base = base[..keep.min(base.len())].trim_end_matches(['.', '-']);
    KubeEvent {
        metadata: ObjectMeta {
            name: Some(format!("{base}.{:x}", now.as_nanosecond())),
            namespace: Some(
                regarding
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            ..Default::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        type_: Some(match event.type_ {
            EventType::Normal => "Normal".into(),
            EventType::Warning => "Warning".into(),
        }),
        ..Default::default()
    }
}

/// The Event for one happening, if it makes one: (type, reason, action,
/// note, the Pod or PVC it is about).
pub fn describe(
    happening: Happening<'_>,
    namespace: Option<String>,
) -> Option<(
    EventType,
    &'static str,
    &'static str,
    String,
    Option<ObjectReference>,
)> {
    let pod = |name: &str| pod_ref(namespace.clone(), name);
    Some(match happening {
        Happening::Launched(sandbox) => (
            EventType::Normal,
            "SandboxStarted",
            "Launch",
            format!(
                "Pod {} runs {} (claim {})",
                sandbox.name, sandbox.item.work_id, sandbox.item.claim
            ),
            Some(pod(&sandbox.name)),
        ),
        Happening::LaunchFailed { item, error } => (
            EventType::Warning,
            "LaunchFailed",
            "Launch",
            format!(
                "{} (claim {}): {error}; the item is left to its lease",
                item.work_id, item.claim
            ),
            // The Pod it was (or would have been) made as.
            Some(pod(&naming::sandbox_name(&item.work_id, item.claim))),
        ),
        Happening::Adopted(sandbox) => (
            EventType::Normal,
            "SandboxAdopted",
            "Adopt",
            format!(
                "Pod {} of {} was left by an earlier controller and is watched again",
                sandbox.name, sandbox.item.work_id
            ),
            Some(pod(&sandbox.name)),
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
            Some(pod(&sandbox.name)),
        ),
        Happening::RemovalUnconfirmed { sandbox, error } => (
            EventType::Warning,
            "RemovalUnconfirmed",
            "Remove",
            format!("Pod {}: {error}; retrying", sandbox.name),
            Some(pod(&sandbox.name)),
        ),
        Happening::WorkspaceRemoved { session_id } => (
            EventType::Normal,
            "WorkspaceRemoved",
            "Sweep",
            format!("the PVC of deleted Session {session_id} was removed"),
            Some(pvc_ref(namespace.clone(), session_id)),
        ),
        // Its stage times are metrics, not news.
        #[cfg(feature = "bench-hooks")]
        Happening::Done { .. } => return None,
    })
}

impl Observer for PoolEvents {
    fn observe(&self, happening: Happening<'_>) {
        if let Some((type_, reason, action, note, related)) =
            describe(happening, self.pool.namespace.clone())
        {
            self.publish(type_, reason, action, note, related);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_to_the_api_servers_limit_in_bytes() {
        let ascii = "a".repeat(NOTE_MAX_BYTES);
        assert_eq!(truncate_note(&ascii), ascii, "1024 bytes fit");
        let over = "a".repeat(NOTE_MAX_BYTES + 1);
        let cut = truncate_note(&over);
        assert_eq!(cut.len(), NOTE_MAX_BYTES);
        assert!(cut.ends_with('…'));
        // 600 characters of 3 bytes each: 1800 bytes, under 1024 characters.
        let wide = "€".repeat(600);
        let cut = truncate_note(&wide);
        assert!(cut.len() <= NOTE_MAX_BYTES, "{} bytes", cut.len());
        assert!(
            cut.len() > NOTE_MAX_BYTES - 4,
            "cut at the last whole character"
        );
        assert!(cut.ends_with('…') && cut.trim_end_matches('…').chars().all(|c| c == '€'));
    }
}
