//! The Pod launcher's warm half (spec §7.1): warm (PVC, Pod) pairs made
//! ahead ([`crate::kubernetes::pod::warm`]), bound to an item by a patch of
//! the Pod's labels that names the `resourceVersion` it read, then, for
//! Session Work, the PVC bound to the Session by label. A pool's warm Pods
//! are whichever supervisor's runs the pool (a new leader adopts its
//! predecessor's): the binding patch is the one write that can win only
//! once, and a warm Pod or PVC is deleted only while it is still unbound.

use super::{checked, invalid_label, launch_error, start_state, status_of, PodLauncher, Start};
use crate::core::launcher::{LaunchError, Sandbox, SandboxExit, SandboxSpec, Warm};
use crate::core::naming;
use crate::kubernetes::pod::warm::{self as warm_pod, ANNOTATION_TEMPLATE, LABEL_WARM};
use crate::kubernetes::validation;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, ResourceExt};
use std::time::Duration;

/// Reads and patches of one binding before it gives up: a Pod's status
/// changes (a new `resourceVersion`) fail the patch without binding it.
pub(super) const BIND_ATTEMPTS: usize = 5;

/// How long ago the Pod started (its creation when it has no start time),
/// in whole seconds rounded up.
pub(super) fn waited(pod: &Pod) -> i64 {
    let since = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    let Some(since) = since else { return 0 };
    let elapsed = jiff::Timestamp::now().duration_since(since);
    let millis = elapsed.as_millis().max(0);
    (millis as i64 + 999) / 1000
}

pub(super) fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

impl PodLauncher {
    /// The template digest of the warm Pods this launcher makes now;
    /// `None` when it makes none.
    pub(super) fn warm_template(&self) -> Option<String> {
        let base = self.warm_base_url.as_deref()?;
        Some(warm_pod::template(&self.pool, &self.default_image, base))
    }

    /// A new warm Pod and its PVC (owned by the Pod), once the Pod runs;
    /// what it made is deleted again if it does not run within the pool's
    /// start timeout.
    pub(super) async fn make_warm(&self) -> Result<Warm, LaunchError> {
        use rand::Rng;
        let Some(base) = self.warm_base_url.as_deref() else {
            return Err(LaunchError::Failed(
                "this launcher makes no warm Pods".into(),
            ));
        };
        let name = format!(
            "{}{:016x}",
            warm_pod::WARM_PREFIX,
            rand::thread_rng().gen::<u64>()
        );
        let manifest = checked(warm_pod::warm_pod(
            &self.pool,
            &name,
            &self.default_image,
            base,
        ))?;
        let template = manifest
            .annotations()
            .get(ANNOTATION_TEMPLATE)
            .cloned()
            .unwrap_or_default();
        let stored = self
            .pods
            .create(&PostParams::default(), &manifest)
            .await
            .map_err(|e| launch_error(&format!("creating warm Pod {name}"), e))?;
        self.check_hardening(&name, &manifest, &stored);
        let claim = warm_pod::warm_pvc(&self.pool, &name, stored.uid().as_deref());
        if let Err(err) = self.pvcs.create(&PostParams::default(), &claim).await {
            let _ = self.remove_unbound(&name).await;
            return Err(match err {
                kube::Error::Api(status) => LaunchError::Workspace(format!(
                    "PVC {name}: the Kubernetes API answered {}: {}",
                    status.code, status.message
                )),
                other => launch_error(&format!("creating PVC {name}"), other),
            });
        }
        let mut seen = false;
        let bound = self.pool.spec.start_timeout();
        let started = tokio::time::timeout(
            bound,
            self.store.until(&name, |pod| start_state(pod, &mut seen)),
        )
        .await;
        let why = match started {
            Ok(Start::Running(_)) => {
                return Ok(Warm {
                    name: name.clone(),
                    handle: name,
                    image: template,
                })
            }
            Ok(Start::Cannot(why)) => why,
            Err(_) => format!("it was not Running within {} s", bound.as_secs()),
        };
        let _ = self.remove_unbound(&name).await;
        Err(LaunchError::Failed(format!("warm Pod {name}: {why}")))
    }

    /// The pool's unbound warm Pods, whoever made them.
    pub(super) async fn list_warm(&self) -> Result<Vec<Warm>, LaunchError> {
        let pool = self.pool.name_any();
        let selector = validation::selector(&[
            (naming::LABEL_MANAGED_BY, naming::MANAGED_BY),
            (naming::LABEL_POOL, pool.as_str()),
            (LABEL_WARM, "true"),
        ])
        .map_err(|e| invalid_label("listing warm Pods", e))?;
        let listed = self
            .pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| launch_error("listing warm Pods", e))?;
        Ok(listed
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| warm_pod::is_unbound(p.labels()))
            .map(|p| Warm {
                name: p.name_any(),
                handle: p.name_any(),
                image: p
                    .annotations()
                    .get(ANNOTATION_TEMPLATE)
                    .cloned()
                    .unwrap_or_default(),
            })
            .collect())
    }

    /// Binds `warm` to `spec`'s item: the Pod's labels patched to §7's with
    /// the `resourceVersion` just read as the precondition (a Pod another
    /// binder won is [`LaunchError::Taken`]), then, for Session Work, its
    /// PVC labelled as the Session's. A failure after the Pod was bound
    /// deletes the pair: no one else would, for it is no longer warm.
    pub(super) async fn bind_warm(
        &self,
        warm: &Warm,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, LaunchError> {
        let name = &warm.name;
        validation::labels(&spec.labels)
            .map_err(|e| invalid_label(&format!("binding Pod {name}"), e))?;
        self.bind_pod(name, spec).await?;
        if let Some(session_id) = &spec.item.session_id {
            if let Err(err) = self
                .bind_claim(name, session_id, &spec.item.environment_id)
                .await
            {
                let _ = self.delete_now(name).await;
                let _ = self.delete_if_unbound(&self.pvcs, name).await;
                self.forget_waiting(name);
                return Err(err);
            }
        }
        Ok(Sandbox {
            name: name.clone(),
            handle: name.clone(),
            item: spec.item.clone(),
        })
    }

    async fn bind_pod(&self, name: &str, spec: &SandboxSpec) -> Result<(), LaunchError> {
        for _ in 0..BIND_ATTEMPTS {
            let pod = self
                .pods
                .get_opt(name)
                .await
                .map_err(|e| launch_error(&format!("reading warm Pod {name}"), e))?
                .ok_or_else(|| LaunchError::NotFound(name.to_string()))?;
            if !warm_pod::is_unbound(pod.labels()) {
                return Err(LaunchError::Taken(name.to_string()));
            }
            if !running(&pod) {
                return Err(LaunchError::Failed(format!(
                    "warm Pod {name} is not Running"
                )));
            }
            let version = pod.resource_version().unwrap_or_default();
            let deadline = waited(&pod) + warm_pod::item_deadline(&self.pool);
            let patch = warm_pod::pod_binding(spec, &version, deadline);
            match self
                .pods
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(bound) => {
                    self.note_waiting(&bound);
                    return Ok(());
                }
                // Changed since it was read: read it again.
                Err(err) if status_of(&err) == Some(409) => continue,
                Err(err) => return Err(launch_error(&format!("binding warm Pod {name}"), err)),
            }
        }
        Err(LaunchError::Failed(format!(
            "warm Pod {name} changed under each of {BIND_ATTEMPTS} bindings"
        )))
    }

    async fn bind_claim(
        &self,
        name: &str,
        session_id: &str,
        environment_id: &str,
    ) -> Result<(), LaunchError> {
        for _ in 0..BIND_ATTEMPTS {
            let claim = self
                .pvcs
                .get_opt(name)
                .await
                .map_err(|e| launch_error(&format!("reading PVC {name}"), e))?
                .ok_or_else(|| {
                    LaunchError::Workspace(format!("the warm Pod's PVC {name} is gone"))
                })?;
            if !warm_pod::is_unbound(claim.labels()) {
                return Err(LaunchError::Workspace(format!(
                    "the warm Pod's PVC {name} is bound already"
                )));
            }
            let version = claim.resource_version().unwrap_or_default();
            let patch = warm_pod::pvc_binding(session_id, environment_id, &version);
            match self
                .pvcs
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(err) if status_of(&err) == Some(409) => continue,
                Err(err) => return Err(launch_error(&format!("binding PVC {name}"), err)),
            }
        }
        Err(LaunchError::Workspace(format!(
            "PVC {name} changed under each of {BIND_ATTEMPTS} bindings"
        )))
    }

    /// Until the warm Pod `name`'s runner exits, or the Pod reaches the
    /// pool's `warm.maxAge` (then it is as good as gone: the supervisor
    /// replaces it).
    pub(super) async fn wait_for_warm(&self, name: &str) -> Result<SandboxExit, LaunchError> {
        let Some(pod) = self
            .pods
            .get_opt(name)
            .await
            .map_err(|e| launch_error(&format!("reading warm Pod {name}"), e))?
        else {
            return Ok(SandboxExit::Gone);
        };
        let age = Duration::from_secs(waited(&pod).max(0) as u64);
        let read_at = tokio::time::Instant::now();
        if !running(&pod) && !self.runs_within_start_bound(name, age).await {
            return Ok(SandboxExit::Gone);
        }
        // Its age now: a Pod that started late has waited that much longer.
        let age = age + read_at.elapsed();
        let left = self.pool.spec.warm_max_age().saturating_sub(age);
        // The watch may not show it yet (one adopted at a start).
        let mut seen = false;
        let ended = self.store.until(name, |pod| match pod {
            None if !seen => None,
            None => Some(SandboxExit::Gone),
            Some(pod) => {
                seen = true;
                super::exit_state(Some(pod))
            }
        });
        tokio::select! {
            ended = ended => Ok(ended),
            _ = tokio::time::sleep(left) => {
                tracing::info!(pod = %name, max_age = ?self.pool.spec.warm_max_age(), "a warm Pod reached the pool's warm.maxAge; replacing it");
                Ok(SandboxExit::Gone)
            }
        }
    }

    /// Whether the warm Pod `name`, `age` old and not Running yet, runs
    /// within what is left of the pool's start bound. Only an adopted one
    /// can be in that state (this launcher admits its own once Running): a
    /// supervisor stopped while making it, maybe before its PVC was made,
    /// and then it is Pending for good. Counted ready meanwhile, it would
    /// hold a place in the pool until its `warm.maxAge`.
    async fn runs_within_start_bound(&self, name: &str, age: Duration) -> bool {
        let left = self.pool.spec.start_timeout().saturating_sub(age);
        let mut seen = false;
        let started = tokio::time::timeout(
            left,
            self.store.until(name, |pod| start_state(pod, &mut seen)),
        )
        .await;
        if !matches!(started, Ok(Start::Running(_))) {
            tracing::info!(pod = %name, "a warm Pod of an earlier run did not run within the pool's start bound; replacing it");
            return false;
        }
        true
    }

    /// The warm Pod `name` and its PVC, each only while unbound: one an
    /// item holds now is not the pool's to remove, nor is its PVC.
    pub(super) async fn remove_unbound(&self, name: &str) -> Result<(), LaunchError> {
        if !self.delete_if_unbound(&self.pods, name).await? {
            return Ok(());
        }
        self.delete_if_unbound(&self.pvcs, name).await?;
        Ok(())
    }

    async fn delete_now(&self, name: &str) -> Result<(), LaunchError> {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match self.pods.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(err) if status_of(&err) == Some(404) => Ok(()),
            Err(err) => Err(launch_error(&format!("deleting Pod {name}"), err)),
        }
    }

    /// Deletes `name` if it is an unbound warm object, with the
    /// `resourceVersion` it was read at as the precondition, so a binding
    /// that wins meanwhile keeps it. `false`: it is bound, and stays.
    pub(super) async fn delete_if_unbound<K>(
        &self,
        api: &Api<K>,
        name: &str,
    ) -> Result<bool, LaunchError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        for _ in 0..BIND_ATTEMPTS {
            let Some(found) = api
                .get_opt(name)
                .await
                .map_err(|e| launch_error(&format!("reading {name}"), e))?
            else {
                return Ok(true);
            };
            if !warm_pod::is_unbound(found.labels()) {
                return Ok(false);
            }
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    resource_version: found.resource_version(),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &params).await {
                Ok(_) => return Ok(true),
                Err(err) if status_of(&err) == Some(404) => return Ok(true),
                Err(err) if status_of(&err) == Some(409) => continue,
                Err(err) => return Err(launch_error(&format!("deleting {name}"), err)),
            }
        }
        Err(LaunchError::Failed(format!(
            "{name} changed under each of {BIND_ATTEMPTS} deletions"
        )))
    }
}
