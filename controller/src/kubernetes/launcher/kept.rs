//! The Pod launcher's kept half (spec §7.1): a Session Pod of a pool that
//! keeps ([`crate::kubernetes::pod::kept`]) is started without its secret,
//! gets one envelope per activation over its own attach, and, kept after
//! an idle end, is rebound to its Session's next item by a patch of its
//! labels that names the `resourceVersion` it read, so one kept Pod is
//! bound once. A Pod cannot be renamed: a rebound Pod keeps its first
//! item's name, and its labels name the item it serves now.

use super::warm::{running, waited, BIND_ATTEMPTS};
use super::{invalid_label, launch_error, start_state, status_of, PodLauncher, Start};
use crate::core::launcher::{LaunchError, Sandbox, SandboxSpec};
use crate::core::naming;
use crate::kubernetes::pod::kept as kept_pod;
use crate::kubernetes::pod::warm::ANNOTATION_TEMPLATE;
use crate::kubernetes::validation;
use kube::api::{Patch, PatchParams};
use kube::ResourceExt;
use std::time::Instant;

impl PodLauncher {
    /// Until the Pod runs (its runner then reads stdin), for a hand-off or
    /// a waiting Pod's start.
    pub(super) async fn until_running(&self, sandbox: &Sandbox) -> Result<Instant, LaunchError> {
        let mut seen = false;
        match self
            .store
            .until(&sandbox.name, |pod| start_state(pod, &mut seen))
            .await
        {
            Start::Running(at) => Ok(at),
            Start::Cannot(why) => Err(LaunchError::Failed(why)),
        }
    }

    /// The template digest the Pod was made from (as [`PodLauncher::warm_template`]
    /// names the pool's now); `None` for a Pod gone or made without one.
    pub(super) async fn template_of(
        &self,
        sandbox: &Sandbox,
    ) -> Result<Option<String>, LaunchError> {
        let pod = self
            .pods
            .get_opt(&sandbox.name)
            .await
            .map_err(|e| launch_error(&format!("reading Pod {}", sandbox.name), e))?;
        Ok(pod.and_then(|p| p.annotations().get(ANNOTATION_TEMPLATE).cloned()))
    }

    /// Rebinds the kept `sandbox` to `spec`'s item of the same Session:
    /// refused for a Pod that is not the kept one of `sandbox`'s item any
    /// more ([`LaunchError::Taken`]), is not running, cannot take another
    /// envelope (`stdinOnce`), or has too little of its deadline left.
    pub(super) async fn rebind_kept(
        &self,
        sandbox: &Sandbox,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, LaunchError> {
        let name = &sandbox.name;
        if sandbox.item.session_id.is_none() || sandbox.item.session_id != spec.item.session_id {
            return Err(LaunchError::Failed(format!(
                "Pod {name} serves another Session"
            )));
        }
        validation::labels(&spec.labels)
            .map_err(|e| invalid_label(&format!("rebinding Pod {name}"), e))?;
        for _ in 0..BIND_ATTEMPTS {
            let pod = self
                .pods
                .get_opt(name)
                .await
                .map_err(|e| launch_error(&format!("reading kept Pod {name}"), e))?
                .ok_or_else(|| LaunchError::NotFound(name.to_string()))?;
            if naming::item_of(pod.labels()).as_ref() != Some(&sandbox.item) {
                return Err(LaunchError::Taken(name.to_string()));
            }
            if !running(&pod) {
                return Err(LaunchError::Failed(format!(
                    "kept Pod {name} is not Running"
                )));
            }
            if !kept_pod::takes_another_envelope(&pod) {
                return Err(LaunchError::Failed(format!(
                    "kept Pod {name} has stdinOnce: its stdin closed after its first attach"
                )));
            }
            let least = kept_pod::least_life_left(&self.pool);
            if let Some(left) = kept_pod::life_left(&pod, waited(&pod)) {
                if left < least {
                    return Err(LaunchError::Failed(format!(
                        "kept Pod {name} has {left} s of its activeDeadlineSeconds left, under the {least} s an item gets at least"
                    )));
                }
            }
            let version = pod.resource_version().unwrap_or_default();
            let patch = kept_pod::rebinding(spec, &version);
            match self
                .pods
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    return Ok(Sandbox {
                        name: name.clone(),
                        handle: name.clone(),
                        item: spec.item.clone(),
                    })
                }
                // Changed since it was read (its status, or another binder).
                Err(err) if status_of(&err) == Some(409) => continue,
                Err(err) if status_of(&err) == Some(404) => {
                    return Err(LaunchError::NotFound(name.to_string()))
                }
                Err(err) => return Err(launch_error(&format!("rebinding Pod {name}"), err)),
            }
        }
        Err(LaunchError::Failed(format!(
            "kept Pod {name} changed under each of {BIND_ATTEMPTS} rebindings"
        )))
    }
}
