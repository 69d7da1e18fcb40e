//! The Kubernetes launcher: one hardened Pod per item, in the pool's
//! namespace, owned by the pool; the Session's PVC created when missing;
//! the secret over a one-shot attach of stdin once the container runs; a
//! graceful delete to ask the runner to stop, a delete with zero grace to
//! remove it. Create-only calls throughout, so one claim never gets two Pods.

use crate::core::launcher::{
    Found, HandOff, LaunchError, Launcher, Sandbox, SandboxExit, SandboxSpec, Warm,
};
use crate::core::naming;
use crate::core::secret::Secret;
use crate::kubernetes::crd::WorkerPool;
use crate::kubernetes::events::{self, PoolEvents};
use crate::kubernetes::pod::{
    self, kept as kept_pod, warm as warm_pod, ANNOTATION_HANDED_OFF, CONTAINER,
};
use crate::kubernetes::pods::PodStore;
use crate::kubernetes::validation::{self, InvalidLabel};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Client, ResourceExt};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

mod kept;
mod warm;

const ENGINE: &str = "Kubernetes API";
/// How long the attach may take, once stdin is closed, to report on its
/// error channel how it ended. The kubelet's attach ends when stdin does
/// (`stdinOnce`, no tty, no stdout), so this is a round trip, not a wait.
pub const ATTACH_STATUS_BOUND: Duration = Duration::from_secs(10);
/// Waiting reasons that mean the container will not start by itself: the
/// kubelet's image errors (`pkg/kubelet/images`, and the CRI's
/// `RegistryUnavailable` and `SignatureValidationFailed`) and its container
/// start errors (`pkg/kubelet/kuberuntime`, `pkg/kubelet/container`). A
/// sandbox Pod has `restartPolicy: Never` and is made for one item, so none
/// of them is worth the rest of the start bound.
const CANNOT_START: [&str; 12] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "ImageInspectError",
    "RegistryUnavailable",
    "SignatureValidationFailed",
    "CreateContainerConfigError",
    "PreCreateHookError",
    "CreateContainerError",
    "PreStartHookError",
    "RunContainerError",
];

pub struct PodLauncher {
    pods: Api<Pod>,
    pvcs: Api<PersistentVolumeClaim>,
    /// The pool as this supervisor was started for (its generation).
    pool: Arc<WorkerPool>,
    /// The sandbox image when the pool names none.
    default_image: String,
    store: PodStore,
    hardening: HardeningReport,
    events: Option<PoolEvents>,
    /// The api as warm Pods reach it; `None`: this launcher makes none.
    warm_base_url: Option<String>,
    /// The Pods whose runner waits for a next envelope after an idle end,
    /// as each was made ([`kept_pod::runs_kept`]), not as the pool is now:
    /// an adopted Pod may predate an edit of `keepIdle`.
    waiting: Mutex<HashSet<String>>,
}

/// The latest sandbox Pod's hardening as the API server stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HardeningChecked {
    pub pod: String,
    /// The hardening fields it did not store as sent (`spec.hostUsers`).
    pub not_stored: Vec<String>,
}

/// What the API server made of the hardening of the pool's Pods, for the
/// pool's status; shared by the launcher and the operator.
#[derive(Debug, Clone, Default)]
pub struct HardeningReport(Arc<Mutex<Option<HardeningChecked>>>);

impl HardeningReport {
    /// The latest Pod's; `None` before the first.
    pub fn latest(&self) -> Option<HardeningChecked> {
        self.0.lock().expect("hardening lock").clone()
    }

    /// Records the latest Pod's; whether what is missing changed.
    fn record(&self, checked: HardeningChecked) -> bool {
        let mut latest = self.0.lock().expect("hardening lock");
        let changed = latest.as_ref().map(|l| &l.not_stored) != Some(&checked.not_stored);
        *latest = Some(checked);
        changed
    }
}

/// A Kubernetes error as a launch error: the API server answering is a
/// refusal; anything else, an unavailable engine.
fn launch_error(what: &str, err: kube::Error) -> LaunchError {
    match err {
        kube::Error::Api(status) => LaunchError::Failed(format!(
            "{what}: the Kubernetes API answered {}: {}",
            status.code, status.message
        )),
        other => LaunchError::Unavailable {
            engine: ENGINE,
            message: format!("{what}: {other}"),
        },
    }
}

fn status_of(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The label selector of `pool`'s sandbox Pods (refused where the API
/// server would refuse it: a pool name that is no label value).
pub fn pool_selector(pool: &str) -> Result<String, InvalidLabel> {
    validation::selector(&[
        (naming::LABEL_MANAGED_BY, naming::MANAGED_BY),
        (naming::LABEL_POOL, pool),
    ])
}

/// A label the API server would refuse, as a launch error (no request made).
fn invalid_label(what: &str, err: InvalidLabel) -> LaunchError {
    LaunchError::Failed(format!(
        "{what}: {err}; the Kubernetes API would refuse it, so nothing was sent"
    ))
}

/// The Pod `create` sends for `spec` (`default_image` when the pool names
/// none), refused before any request when the API server would refuse its
/// labels.
pub fn pod_manifest(
    pool: &WorkerPool,
    spec: &SandboxSpec,
    default_image: &str,
) -> Result<Pod, LaunchError> {
    checked(pod::sandbox_pod(pool, spec, default_image))
}

/// [`pod_manifest`] on `workspace` (a Session's PVC of any name).
pub fn pod_manifest_on(
    pool: &WorkerPool,
    spec: &SandboxSpec,
    default_image: &str,
    workspace: pod::Workspace<'_>,
) -> Result<Pod, LaunchError> {
    checked(pod::sandbox_pod_on(pool, spec, default_image, workspace))
}

/// `manifest`, unless the API server would refuse its labels.
fn checked(manifest: Pod) -> Result<Pod, LaunchError> {
    if let Some(labels) = &manifest.metadata.labels {
        validation::labels(labels)
            .map_err(|e| invalid_label(&format!("Pod {}", manifest.name_any()), e))?;
    }
    Ok(manifest)
}

/// The PVC made for Session `session_id` when it has none, refused as
/// [`pod_manifest`] is.
pub fn pvc_manifest(
    pool: &WorkerPool,
    session_id: &str,
) -> Result<PersistentVolumeClaim, LaunchError> {
    let claim = pod::session_pvc(pool, session_id);
    if let Some(labels) = &claim.metadata.labels {
        validation::labels(labels)
            .map_err(|e| invalid_label(&format!("PVC {}", pod::pvc_name(session_id)), e))?;
    }
    Ok(claim)
}

/// How an attach's error channel said it ended, for people.
fn describe(status: &Status) -> String {
    let mut out = status
        .reason
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| status.status.clone().unwrap_or_else(|| "no status".into()));
    if let Some(message) = status.message.as_deref().filter(|m| !m.is_empty()) {
        out.push_str(": ");
        out.push_str(message);
    }
    if let Some(code) = status.code {
        out.push_str(&format!(" (code {code})"));
    }
    out
}

impl PodLauncher {
    pub fn new(
        client: Client,
        pool: Arc<WorkerPool>,
        default_image: &str,
        store: PodStore,
    ) -> PodLauncher {
        let namespace = pool.namespace().unwrap_or_else(|| "default".into());
        PodLauncher {
            pods: Api::namespaced(client.clone(), &namespace),
            pvcs: Api::namespaced(client, &namespace),
            pool,
            default_image: default_image.to_string(),
            store,
            hardening: HardeningReport::default(),
            events: None,
            warm_base_url: None,
            waiting: Mutex::default(),
        }
    }

    /// Notes whether Pod `pod`'s runner waits after an idle end.
    pub(super) fn note_waiting(&self, pod: &Pod) {
        let mut waiting = self.waiting.lock().expect("waiting lock");
        if kept_pod::runs_kept(pod) {
            waiting.insert(pod.name_any());
        } else {
            waiting.remove(&pod.name_any());
        }
    }

    pub(super) fn forget_waiting(&self, name: &str) {
        self.waiting.lock().expect("waiting lock").remove(name);
    }

    /// Makes warm Pods (the pool's `warm`, spec §7.1) whose runners reach
    /// the api at `base_url`.
    pub fn with_warm(mut self, base_url: &str) -> PodLauncher {
        self.warm_base_url = Some(base_url.to_string());
        self
    }

    /// Publishes on the pool, as Events, what the API server did not store
    /// of a Pod's hardening.
    pub fn with_events(mut self, events: PoolEvents) -> PodLauncher {
        self.events = Some(events);
        self
    }

    /// What the API server stored of the latest Pod's hardening.
    pub fn hardening(&self) -> HardeningReport {
        self.hardening.clone()
    }

    /// Records how the API server stored Pod `name`'s hardening, with an
    /// Event each time what is missing changes.
    fn check_hardening(&self, name: &str, sent: &Pod, stored: &Pod) {
        let not_stored = pod::hardening_not_stored(sent, stored);
        if not_stored.is_empty() {
            self.hardening.record(HardeningChecked {
                pod: name.to_string(),
                not_stored,
            });
            return;
        }
        let note = format!(
            "the Kubernetes API did not store {} of Pod {name} as sent (a feature gate that is off, such as UserNamespacesSupport for spec.hostUsers, or a mutating webhook): the sandbox runs without it",
            not_stored.join(", ")
        );
        tracing::warn!(pod = %name, fields = ?not_stored, "the Kubernetes API did not store the sandbox's hardening as sent");
        let changed = self.hardening.record(HardeningChecked {
            pod: name.to_string(),
            not_stored,
        });
        if let (true, Some(events)) = (changed, &self.events) {
            events.publish(
                EventType::Warning,
                "HardeningNotStored",
                "Launch",
                note,
                Some(events::pod_ref(self.pool.namespace(), name)),
            );
        }
    }

    /// The Session's PVC: the one labelled with it (a warm Pod's PVC bound
    /// to it has any name), else the one named for it, else a new one named
    /// for it. One that exists is kept as it is, whoever made it.
    async fn session_claim(&self, session_id: &str) -> Result<String, LaunchError> {
        if let Some(found) = self.find_session_claim(session_id).await? {
            return Ok(found);
        }
        let name = pod::pvc_name(session_id);
        let claim = pvc_manifest(&self.pool, session_id)?;
        match self.pvcs.create(&PostParams::default(), &claim).await {
            Ok(_) => Ok(name),
            // Made meanwhile (another activation of the Session): the same claim.
            Err(err) if status_of(&err) == Some(409) => Ok(name),
            Err(kube::Error::Api(status)) => Err(LaunchError::Workspace(format!(
                "PVC {name}: the Kubernetes API answered {}: {}",
                status.code, status.message
            ))),
            Err(err) => Err(launch_error(&format!("creating PVC {name}"), err)),
        }
    }

    /// The names of the PVCs labelled as Session `session_id`'s.
    async fn labelled_claims(&self, session_id: &str) -> Result<Vec<String>, LaunchError> {
        let selector = validation::selector(&[
            (naming::LABEL_MANAGED_BY, naming::MANAGED_BY),
            (naming::LABEL_SESSION_ID, session_id),
        ])
        .map_err(|e| invalid_label("listing the Session's PVC", e))?;
        let listed = self
            .pvcs
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| launch_error("listing the Session's PVC", e))?;
        let mut names: Vec<String> = listed
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        names.sort();
        Ok(names)
    }

    /// The Session's PVC if it has one: by label first, then by its name.
    async fn find_session_claim(&self, session_id: &str) -> Result<Option<String>, LaunchError> {
        if let Some(first) = self.labelled_claims(session_id).await?.into_iter().next() {
            return Ok(Some(first));
        }
        let name = pod::pvc_name(session_id);
        let existing = self
            .pvcs
            .get_opt(&name)
            .await
            .map_err(|e| launch_error(&format!("reading PVC {name}"), e))?;
        Ok(existing.map(|_| name))
    }

    /// Attaches to Pod `pod`'s stdin only, writes `parts`, closes stdin, and
    /// waits for the attach's own report of how it ended: only `Success`
    /// counts. From 1.30 the API server accepts the WebSocket before it
    /// reaches the kubelet, so a kubelet that cannot attach (the container
    /// gone, the node unreachable, TLS) shows only as a `Failure` status on
    /// the error channel: written bytes prove nothing. Any other end cannot
    /// be retried (a `stdinOnce` stdin is spent; a waiting runner may hold
    /// part of a line): the supervisor deletes the Pod. `what` names the
    /// line in errors (`secret`, `envelope`), never its content.
    async fn write_stdin(&self, pod: &str, parts: &[&[u8]], what: &str) -> Result<(), LaunchError> {
        let params = AttachParams {
            container: Some(CONTAINER.into()),
            stdin: true,
            stdout: false,
            stderr: false,
            tty: false,
            ..AttachParams::default()
        };
        let mut attached = self
            .pods
            .attach(pod, &params)
            .await
            .map_err(|e| launch_error(&format!("attaching to Pod {pod}"), e))?;
        let ended = attached
            .take_status()
            .ok_or_else(|| LaunchError::Failed("the attach gave no error channel".into()))?;
        let mut stdin = attached
            .stdin()
            .ok_or_else(|| LaunchError::Failed("the attach gave no stdin".into()))?;
        let written = async {
            for part in parts {
                stdin.write_all(part).await?;
            }
            stdin.flush().await?;
            stdin.shutdown().await
        }
        .await;
        drop(stdin);
        let ended = tokio::time::timeout(ATTACH_STATUS_BOUND, ended).await;
        // Whatever it said, the attach is over.
        attached.abort();
        match ended {
            Ok(Some(status)) if status.status.as_deref() == Some("Success") => {}
            Ok(Some(status)) => {
                return Err(LaunchError::Failed(format!(
                    "the attach to Pod {pod} failed: {}; the {what} was not delivered",
                    describe(&status)
                )))
            }
            Ok(None) => {
                return Err(LaunchError::Failed(format!(
                    "the attach to Pod {pod} closed without reporting how it ended, so the {what}'s delivery is unconfirmed (Kubernetes before 1.30 cannot close stdin alone)"
                )))
            }
            Err(_) => {
                return Err(LaunchError::Failed(format!(
                    "the attach to Pod {pod} did not report how it ended within {} s of closing stdin, so the {what}'s delivery is unconfirmed",
                    ATTACH_STATUS_BOUND.as_secs()
                )))
            }
        }
        written.map_err(|e| LaunchError::Failed(format!("writing the {what} to the Pod: {e}")))
    }

    /// Marks Pod `pod` handed off: a new leader adopts it.
    async fn mark_handed_off(&self, pod: &str) -> Result<(), LaunchError> {
        let mark = serde_json::json!({"metadata": {"annotations": {
            ANNOTATION_HANDED_OFF: jiff::Timestamp::now().to_string()
        }}});
        self.pods
            .patch(pod, &PatchParams::default(), &Patch::Merge(&mark))
            .await
            .map_err(|e| launch_error(&format!("marking Pod {pod} handed off"), e))?;
        Ok(())
    }
}

/// What a Pod's state says of its runner, before the hand-off.
enum Start {
    Running(Instant),
    Cannot(String),
}

/// `seen`: the watch showed the Pod before (a Pod just created may not be
/// in it yet; one that was and is not any more was deleted).
fn start_state(pod: Option<&Pod>, seen: &mut bool) -> Option<Start> {
    let Some(pod) = pod else {
        return (*seen).then(|| Start::Cannot("the Pod was deleted before its hand-off".into()));
    };
    *seen = true;
    let status = pod.status.as_ref()?;
    match status.phase.as_deref() {
        Some("Running") => return Some(Start::Running(Instant::now())),
        Some(phase @ ("Succeeded" | "Failed")) => {
            return Some(Start::Cannot(format!(
                "the Pod ended ({phase}) before its hand-off{}",
                status
                    .message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )))
        }
        _ => {}
    }
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| {
            w.reason
                .as_deref()
                .is_some_and(|r| CANNOT_START.contains(&r))
        })?;
    Some(Start::Cannot(format!(
        "the sandbox container cannot start: {}{}",
        waiting.reason.as_deref().unwrap_or_default(),
        waiting
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    )))
}

/// The runner's exit status, once its Pod finished.
fn exit_state(pod: Option<&Pod>) -> Option<SandboxExit> {
    let Some(pod) = pod else {
        return Some(SandboxExit::Gone);
    };
    let status = pod.status.as_ref()?;
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == CONTAINER)
        .and_then(|c| c.state.as_ref()?.terminated.as_ref());
    match (status.phase.as_deref(), terminated) {
        (_, Some(t)) => Some(SandboxExit::Exited(i64::from(t.exit_code))),
        // Ended without a container status (the deadline, an eviction).
        (Some("Succeeded"), None) => Some(SandboxExit::Exited(0)),
        (Some("Failed"), None) => Some(SandboxExit::Exited(137)),
        _ => None,
    }
}

impl Launcher for PodLauncher {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    /// Running Pods whose secret was delivered are adoptable; the rest
    /// (finished, or never handed their secret) are to be removed.
    async fn existing(&self) -> Result<Vec<Found>, LaunchError> {
        let selector = pool_selector(&self.pool.name_any())
            .map_err(|e| invalid_label("listing sandbox Pods", e))?;
        let listed = self
            .pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| launch_error("listing sandbox Pods", e))?;
        Ok(listed
            .items
            .into_iter()
            .filter_map(|p| {
                let labels = p.labels().clone();
                let item = naming::item_of(&labels)?;
                self.note_waiting(&p);
                let running = p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.annotations().contains_key(ANNOTATION_HANDED_OFF);
                Some(Found {
                    running,
                    sandbox: Sandbox {
                        name: p.name_any(),
                        handle: p.name_any(),
                        item,
                    },
                })
            })
            .collect())
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        // Refused before any request when the API server would refuse it.
        let named = pod_manifest(&self.pool, spec, &self.default_image)?;
        let manifest = match &spec.item.session_id {
            Some(session) => {
                let claim = self.session_claim(session).await?;
                pod_manifest_on(
                    &self.pool,
                    spec,
                    &self.default_image,
                    pod::Workspace::Claim(&claim),
                )?
            }
            None => named,
        };
        match self.pods.create(&PostParams::default(), &manifest).await {
            Ok(stored) => {
                // The answer is the Pod as stored, after defaulting and
                // admission: what of its hardening survived.
                self.check_hardening(&spec.name, &manifest, &stored);
                self.note_waiting(&stored);
                Ok(Sandbox {
                    name: spec.name.clone(),
                    handle: spec.name.clone(),
                    item: spec.item.clone(),
                })
            }
            Err(err) if status_of(&err) == Some(409) => {
                Err(LaunchError::AlreadyExists(spec.name.clone()))
            }
            Err(err) => Err(launch_error(&format!("creating Pod {}", spec.name), err)),
        }
    }

    /// Once the container runs: the secret and a newline over a stdin-only
    /// attach ([`PodLauncher::write_stdin`]; `stdinOnce` turns the
    /// disconnect into EOF), and the Pod marked handed off only when the
    /// attach reported `Success`. A failure leaves the lease to expire.
    async fn hand_off(&self, sandbox: &Sandbox, secret: Secret) -> Result<HandOff, LaunchError> {
        let started = self.until_running(sandbox).await?;
        let written = self
            .write_stdin(
                &sandbox.name,
                &[secret.expose().as_bytes(), b"\n"],
                "secret",
            )
            .await;
        drop(secret);
        written?;
        let delivered = Instant::now();
        self.mark_handed_off(&sandbox.name).await?;
        Ok(HandOff { started, delivered })
    }

    async fn wait(&self, sandbox: &Sandbox) -> Result<SandboxExit, LaunchError> {
        Ok(self.store.until(&sandbox.name, exit_state).await)
    }

    /// Deletes the Pod with `grace`: the kubelet sends the runner SIGTERM,
    /// and SIGKILL once the grace is over. (The removal that may follow is
    /// a delete with zero grace, which cuts a grace still running short.)
    async fn signal_stop(&self, sandbox: &Sandbox, grace: Duration) -> Result<(), LaunchError> {
        let params = DeleteParams {
            grace_period_seconds: Some(grace.as_secs_f64().ceil() as u32),
            ..DeleteParams::default()
        };
        match self.pods.delete(&sandbox.name, &params).await {
            Ok(_) => Ok(()),
            Err(err) if status_of(&err) == Some(404) => Ok(()),
            Err(err) => Err(launch_error(
                &format!("deleting Pod {} gracefully", sandbox.name),
                err,
            )),
        }
    }

    async fn remove(&self, sandbox: &Sandbox) -> Result<(), LaunchError> {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match self.pods.delete(&sandbox.name, &params).await {
            Ok(_) => {}
            Err(err) if status_of(&err) == Some(404) => {}
            Err(err) => return Err(launch_error(&format!("deleting Pod {}", sandbox.name), err)),
        }
        self.forget_waiting(&sandbox.name);
        // A warm Pod that served a healthcheck: its PVC was never a
        // Session's, and goes with it (its owner reference would take it
        // too, once the garbage collector gets to it).
        if sandbox.item.session_id.is_none() && sandbox.name.starts_with(warm_pod::WARM_PREFIX) {
            self.delete_if_unbound(&self.pvcs, &sandbox.name).await?;
        }
        Ok(())
    }

    async fn workspaces(&self, environment_id: &str) -> Result<Vec<String>, LaunchError> {
        let selector = validation::selector(&[
            (naming::LABEL_MANAGED_BY, naming::MANAGED_BY),
            (naming::LABEL_ENVIRONMENT_ID, environment_id),
        ])
        .map_err(|e| invalid_label("listing Session PVCs", e))?;
        let listed = self
            .pvcs
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| launch_error("listing Session PVCs", e))?;
        Ok(listed
            .items
            .iter()
            .filter_map(|p| p.labels().get(naming::LABEL_SESSION_ID).cloned())
            .collect())
    }

    /// Every PVC labelled as the Session's, and the one named for it.
    async fn remove_workspace(&self, session_id: &str) -> Result<(), LaunchError> {
        let mut names = self.labelled_claims(session_id).await?;
        names.push(pod::pvc_name(session_id));
        for name in names {
            match self.pvcs.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(err) if status_of(&err) == Some(404) => {}
                Err(err) => return Err(launch_error(&format!("deleting PVC {name}"), err)),
            }
        }
        Ok(())
    }

    async fn warm_image(&self) -> Result<Option<String>, LaunchError> {
        Ok(self.warm_template())
    }

    async fn create_warm(&self, _owner: &str) -> Result<Warm, LaunchError> {
        self.make_warm().await
    }

    async fn existing_warm(&self, _owner: &str) -> Result<Vec<Warm>, LaunchError> {
        self.list_warm().await
    }

    async fn has_workspace(&self, session_id: &str) -> Result<bool, LaunchError> {
        Ok(self.find_session_claim(session_id).await?.is_some())
    }

    async fn bind(&self, warm: &Warm, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        self.bind_warm(warm, spec).await
    }

    /// The envelope over a stdin-only attach, checked as the cold hand-off
    /// is ([`PodLauncher::write_stdin`]), then the Pod marked handed off.
    async fn deliver(&self, sandbox: &Sandbox, envelope: Secret) -> Result<Instant, LaunchError> {
        let written = self
            .write_stdin(&sandbox.name, &[envelope.expose().as_bytes()], "envelope")
            .await;
        drop(envelope);
        written?;
        let delivered = Instant::now();
        self.mark_handed_off(&sandbox.name).await?;
        Ok(delivered)
    }

    async fn wait_warm(&self, handle: &str) -> Result<SandboxExit, LaunchError> {
        self.wait_for_warm(handle).await
    }

    async fn remove_warm(&self, warm: &Warm) -> Result<(), LaunchError> {
        self.remove_unbound(&warm.name).await
    }

    /// As the Pod was made: a Pod made before the pool's `keepIdle` changed
    /// keeps the runner it was made with.
    fn waits(&self, sandbox: &Sandbox) -> bool {
        sandbox.item.session_id.is_some()
            && self
                .waiting
                .lock()
                .expect("waiting lock")
                .contains(&sandbox.handle)
    }

    /// The Pod starts by itself once created: this waits until it runs.
    async fn start_waiting(&self, sandbox: &Sandbox) -> Result<Instant, LaunchError> {
        self.until_running(sandbox).await
    }

    /// Not the image's name but the digest of the template the Pod was
    /// made from, which [`Launcher::warm_image`] gives for the pool now: a
    /// changed image, pool spec or api URL recycles a kept Pod.
    async fn image_of(&self, sandbox: &Sandbox) -> Result<Option<String>, LaunchError> {
        self.template_of(sandbox).await
    }

    async fn rebind(&self, sandbox: &Sandbox, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        self.rebind_kept(sandbox, spec).await
    }
}
