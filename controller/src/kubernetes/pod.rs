//! The sandbox Pod and the Session PVC, as pure functions of the pool and
//! the item: hardened by default (the Pod Security Standard `restricted`,
//! a read-only root, no service account token, limits, a deadline), with
//! the pool's overrides added where they cannot weaken that.

use crate::core::launcher::SandboxSpec;
use crate::core::naming;
use crate::egress::{url_host, Routing};
use crate::kubernetes::crd::{
    AccessMode, PodOverrides, WorkerPool, KEEP_IDLE_SECONDS, MAX_WARM_REPLICAS,
    WARM_MAX_AGE_SECONDS,
};
use crate::kubernetes::validation;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// The runner's container.
pub const CONTAINER: &str = "runner";
pub const WORKSPACE: &str = "/workspace";
/// Where Session Work mounts its Memory Stores (an emptyDir).
pub const MEMORY_ROOT: &str = mango_protocol::memory::DEFAULT_MOUNT_ROOT;
/// The runner's user and group when the pool names none (the image's `nobody`).
pub const SANDBOX_UID: i64 = 65534;
/// Set once the secret was delivered: a running Pod without it never got
/// its secret, and is not adopted.
pub const ANNOTATION_HANDED_OFF: &str = "mango.dev/handed-off";
pub const DEFAULT_DEADLINE_SECONDS: i64 = 24 * 3600;
/// The Pod's `terminationGracePeriodSeconds`: the supervisor's stopping
/// grace, so the kubelet's SIGTERM leaves the runner the time a graceful
/// Stop does, whoever deletes or evicts the Pod.
pub const TERMINATION_GRACE_SECONDS: i64 = crate::core::config::STOPPING_GRACE.as_secs() as i64;
const DEFAULT_TMP: &str = "64Mi";
const DEFAULT_WORKSPACE_SIZE: &str = "1Gi";

/// A pool spec that would weaken the sandbox, or cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidPool {
    /// Under `spec` (`pod.runAsUser`), or a `metadata.` path.
    pub field: String,
    pub problem: String,
}

impl std::fmt::Display for InvalidPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.starts_with("metadata.") {
            write!(f, "{}: {}", self.field, self.problem)
        } else {
            write!(f, "spec.{}: {}", self.field, self.problem)
        }
    }
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> InvalidPool {
    InvalidPool {
        field: field.into(),
        problem: problem.into(),
    }
}

/// The largest `activeDeadlineSeconds`, user and group id a Pod may have
/// on Kubernetes 1.30–1.34 (the core validation's `math.MaxInt32`).
pub const MAX_POD_INT: i64 = i32::MAX as i64;

/// Refuses overrides that would weaken the hardening or spoof the labels
/// the supervisor relies on, and anything the API server would refuse in
/// each of the pool's Pods (labels, names, numbers out of range), so a bad
/// pool is refused once, not with a 422 on every item.
pub fn validate(pool: &WorkerPool) -> Result<(), InvalidPool> {
    let spec = &pool.spec;
    if spec.environment_id.trim().is_empty() {
        return Err(invalid("environmentId", "must name the Environment"));
    }
    // Both are label values of every sandbox Pod and in the selectors the
    // controller lists and watches them with.
    validation::label_value(&spec.environment_id).map_err(|e| {
        invalid(
            "environmentId",
            format!("is the label {}'s value: {e}", naming::LABEL_ENVIRONMENT_ID),
        )
    })?;
    let name = pool.name_any();
    if let Err(e) = validation::label_value(&name) {
        return Err(InvalidPool {
            field: "metadata.name".into(),
            problem: format!("is the label {}'s value: {e}", naming::LABEL_POOL),
        });
    }
    if spec.environment_key_secret.name.is_empty() {
        return Err(invalid(
            "environmentKeySecret.name",
            "must name the Secret holding the Environment key",
        ));
    }
    if !(1..=1000).contains(&spec.max_concurrency) {
        return Err(invalid("maxConcurrency", "must be 1 to 1000"));
    }
    if let Some(deadline) = spec.active_deadline_seconds {
        if !(30..=MAX_POD_INT).contains(&deadline) {
            return Err(invalid(
                "activeDeadlineSeconds",
                format!("must be 30 to {MAX_POD_INT}"),
            ));
        }
    }
    if let Some(keep) = spec.keep_idle {
        if !KEEP_IDLE_SECONDS.contains(&keep) {
            return Err(invalid(
                "keepIdle",
                format!(
                    "must be {} to {} seconds",
                    KEEP_IDLE_SECONDS.start(),
                    KEEP_IDLE_SECONDS.end()
                ),
            ));
        }
    }
    if let Some(class) = &spec.runtime_class_name {
        validation::dns1123_subdomain(class)
            .map_err(|e| invalid("runtimeClassName", format!("names a RuntimeClass: {e}")))?;
    }
    if let Some(warm) = &spec.warm {
        if warm.replicas > MAX_WARM_REPLICAS {
            return Err(invalid(
                "warm.replicas",
                format!("must be 0 to {MAX_WARM_REPLICAS}"),
            ));
        }
        if let Some(age) = warm.max_age {
            if !WARM_MAX_AGE_SECONDS.contains(&age) {
                return Err(invalid(
                    "warm.maxAge",
                    format!(
                        "must be {} to {} seconds",
                        WARM_MAX_AGE_SECONDS.start(),
                        WARM_MAX_AGE_SECONDS.end()
                    ),
                ));
            }
        }
        // A warm Pod's deadline is the item's plus the longest wait.
        if warm::item_deadline(pool) + warm::runner_wait(pool).as_secs() as i64 > MAX_POD_INT {
            return Err(invalid(
                "warm.maxAge",
                format!(
                    "plus {} s plus activeDeadlineSeconds must be at most {MAX_POD_INT}",
                    warm::RUNNER_WAIT_SLACK.as_secs()
                ),
            ));
        }
    }
    check_egress(pool)?;
    check_overrides(&spec.pod)
}

/// The variables [`Routing::env`] sets, which the pool's own `pod.env`
/// may not set too when the pool has a proxy: a second `HTTPS_PROXY`
/// would decide where the sandbox's traffic goes.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// Every allow entry parses (the first bad one named by its index and
/// text), a pool that allows any names its proxy, and that proxy is a
/// `host:port` a sandbox can dial.
fn check_egress(pool: &WorkerPool) -> Result<(), InvalidPool> {
    let Some(egress) = &pool.spec.egress else {
        return Ok(());
    };
    for (i, entry) in egress.allow.iter().enumerate() {
        crate::egress::allow::Entry::parse(entry, egress.allow_any)
            .map_err(|e| invalid(format!("egress.allow[{i}]"), e.to_string()))?;
    }
    if let Some(proxy) = egress.proxy.as_deref().filter(|p| !p.is_empty()) {
        check_proxy(proxy).map_err(|why| invalid("egress.proxy", why))?;
    } else if !egress.allow.is_empty() {
        return Err(invalid(
            "egress.proxy",
            "is required when spec.egress.allow is set",
        ));
    }
    if !egress.allow.is_empty() {
        if let Some(var) = pool
            .spec
            .pod
            .env
            .iter()
            .find(|v| PROXY_VARIABLES.contains(&v.name.as_str()))
        {
            return Err(invalid(
                format!("pod.env[{}]", var.name),
                "is set from spec.egress.proxy when spec.egress.allow is set",
            ));
        }
    }
    Ok(())
}

/// `host:port`: a DNS name or an IP address (IPv6 in brackets), and a
/// port 1..=65535.
fn check_proxy(proxy: &str) -> Result<(), String> {
    let shape = || format!("{proxy:?} is not host:port (`mango-egress.mango.svc:3128`)");
    let (host, port) = proxy.rsplit_once(':').ok_or_else(shape)?;
    if !port.bytes().all(|b| b.is_ascii_digit()) || !matches!(port.parse::<u16>(), Ok(1..)) {
        return Err(format!("{proxy:?}: the port must be 1 to 65535"));
    }
    let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host.parse::<std::net::Ipv4Addr>().is_ok(),
    };
    if ip {
        return Ok(());
    }
    validation::dns1123_subdomain(host).map_err(|e| format!("{proxy:?}: the host {e}"))
}

/// Where the sandboxes of `pool`, whose runners reach the api at
/// `base_url`, send what they fetch: the pool's egress proxy, and the
/// api's host directly. `None` when the pool allows no egress.
pub fn egress_routing(pool: &WorkerPool, base_url: &str) -> Result<Option<Routing>, InvalidPool> {
    let Some(egress) = pool.spec.egress.as_ref().filter(|e| !e.allow.is_empty()) else {
        return Ok(None);
    };
    let proxy = egress
        .proxy
        .clone()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| invalid("egress.proxy", "is required when spec.egress.allow is set"))?;
    let no_proxy = url_host(base_url).ok_or_else(|| {
        invalid(
            "sandboxApiUrl",
            format!("the sandboxes' api URL {base_url:?} has no host, which their NO_PROXY names"),
        )
    })?;
    Ok(Some(Routing { proxy, no_proxy }))
}

/// The proxy variables of the sandbox of Work `work_id` (`""`: a warm
/// Pod, which has none yet). A pool the operator refused
/// ([`egress_routing`] failing) runs no Pods; were one built, it would
/// get no proxy, and so no egress at all.
fn egress_env(pool: &WorkerPool, base_url: &str, work_id: &str) -> Vec<(String, String)> {
    match egress_routing(pool, base_url) {
        Ok(Some(routing)) => routing.env(work_id),
        _ => Vec::new(),
    }
}

fn check_overrides(pod: &PodOverrides) -> Result<(), InvalidPool> {
    for (key, value) in &pod.labels {
        if key.starts_with("mango.dev/") || key == naming::LABEL_MANAGED_BY {
            return Err(invalid(
                format!("pod.labels[{key}]"),
                "is the supervisor's own label and cannot be set",
            ));
        }
        validation::label(key, value)
            .map_err(|e| invalid(format!("pod.labels[{key}]"), e.problem))?;
    }
    if pod.annotations.contains_key(ANNOTATION_HANDED_OFF) {
        return Err(invalid(
            format!("pod.annotations[{ANNOTATION_HANDED_OFF}]"),
            "is the supervisor's own annotation and cannot be set",
        ));
    }
    validation::annotations(&pod.annotations).map_err(|e| invalid("pod.annotations", e))?;
    for (field, id) in [
        ("runAsUser", pod.run_as_user),
        ("runAsGroup", pod.run_as_group),
        ("fsGroup", pod.fs_group),
    ] {
        match id {
            Some(id) if id < 1 => {
                return Err(invalid(format!("pod.{field}"), "must not be root (0)"))
            }
            Some(id) if id > MAX_POD_INT => {
                return Err(invalid(
                    format!("pod.{field}"),
                    format!("must be at most {MAX_POD_INT}"),
                ))
            }
            _ => {}
        }
    }
    for (field, name) in [
        ("priorityClassName", &pod.priority_class_name),
        ("serviceAccountName", &pod.service_account_name),
    ] {
        if let Some(name) = name {
            validation::dns1123_subdomain(name).map_err(|e| invalid(format!("pod.{field}"), e))?;
        }
    }
    if pod.host_users == Some(true) {
        return Err(invalid(
            "pod.hostUsers",
            "may only be false (a user namespace); the host's users are the default",
        ));
    }
    for var in &pod.env {
        if var.name.starts_with("MANGO_") {
            return Err(invalid(
                format!("pod.env[{}]", var.name),
                "MANGO_ variables are the supervisor's",
            ));
        }
        if var.value_from.is_some() {
            return Err(invalid(
                format!("pod.env[{}].valueFrom", var.name),
                "only plain values are allowed (no Secret or field references)",
            ));
        }
    }
    Ok(())
}

/// The PVC holding Session `session_id`'s workspace.
pub fn pvc_name(session_id: &str) -> String {
    let id: String = session_id
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    format!("mango-session-{id}")
}

/// Labels of a Session's PVC: no pool, since a Session outlives pools.
fn pvc_labels(session_id: &str, environment_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (naming::LABEL_SESSION_ID.to_string(), session_id.to_string()),
        (
            naming::LABEL_ENVIRONMENT_ID.to_string(),
            environment_id.to_string(),
        ),
        (
            naming::LABEL_MANAGED_BY.to_string(),
            naming::MANAGED_BY.to_string(),
        ),
    ])
}

/// Session `session_id`'s workspace PVC, as the pool's storage says.
pub fn session_pvc(pool: &WorkerPool, session_id: &str) -> PersistentVolumeClaim {
    let storage = &pool.spec.workspace;
    let size = storage
        .size
        .clone()
        .unwrap_or_else(|| Quantity(DEFAULT_WORKSPACE_SIZE.into()));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(pvc_name(session_id)),
            namespace: pool.namespace(),
            labels: Some(pvc_labels(session_id, &pool.spec.environment_id)),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![storage
                .access_mode
                .unwrap_or(AccessMode::ReadWriteOnce)
                .as_str()
                .to_string()]),
            storage_class_name: storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), size)])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pool as the owner of its Pods: they go with it.
pub fn owner(pool: &WorkerPool) -> OwnerReference {
    OwnerReference {
        api_version: WorkerPool::api_version(&()).to_string(),
        kind: WorkerPool::kind(&()).to_string(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    }
}

/// Limits a sandbox always has: the pool's, or these.
fn resources(pool: &WorkerPool) -> ResourceRequirements {
    let mut resources = pool.spec.resources.clone().unwrap_or_default();
    let limits = resources.limits.get_or_insert_with(BTreeMap::new);
    limits
        .entry("cpu".into())
        .or_insert_with(|| Quantity("1".into()));
    limits
        .entry("memory".into())
        .or_insert_with(|| Quantity("512Mi".into()));
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    requests
        .entry("cpu".into())
        .or_insert_with(|| Quantity("100m".into()));
    requests
        .entry("memory".into())
        .or_insert_with(|| Quantity("128Mi".into()));
    resources
}

/// The hardened container security context (PSS `restricted` and a
/// read-only root).
fn container_security(uid: i64, gid: i64) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(gid),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        proc_mount: None,
        ..Default::default()
    }
}

/// What a sandbox Pod mounts at `/workspace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workspace<'a> {
    /// A PVC: a Session's, or a warm Pod's own.
    Claim(&'a str),
    /// A healthcheck's: memory-backed, gone with the Pod.
    Ephemeral,
}

/// The Pod for one item of `pool`: `image` when the pool names none, the
/// Session's PVC under its name from [`pvc_name`].
pub fn sandbox_pod(pool: &WorkerPool, sandbox: &SandboxSpec, image: &str) -> Pod {
    let claim = sandbox.item.session_id.as_deref().map(pvc_name);
    let workspace = match &claim {
        Some(claim) => Workspace::Claim(claim),
        None => Workspace::Ephemeral,
    };
    sandbox_pod_on(pool, sandbox, image, workspace)
}

/// The Pod for one item of `pool` on `workspace` (a Session's PVC found
/// by label may have any name).
pub fn sandbox_pod_on(
    pool: &WorkerPool,
    sandbox: &SandboxSpec,
    image: &str,
    workspace: Workspace<'_>,
) -> Pod {
    let base_url = sandbox
        .env
        .iter()
        .find(|(name, _)| name == "MANGO_BASE_URL")
        .map_or("", |(_, url)| url.as_str());
    if !kept::makes_waiting(pool, &sandbox.item) {
        let mut env = sandbox.env.clone();
        env.extend(egress_env(pool, base_url, &sandbox.item.work_id));
        return build(pool, &sandbox.name, &sandbox.labels, &env, image, workspace);
    }
    // It may serve later items of its Session: its environment names none
    // (the envelope does), and its egress is the pool's, as a warm Pod's.
    let mut env = vec![("MANGO_BASE_URL".to_string(), base_url.to_string())];
    env.extend(egress_env(pool, base_url, ""));
    let mut pod = build(pool, &sandbox.name, &sandbox.labels, &env, image, workspace);
    kept::make_waiting(&mut pod, pool);
    // What a kept Pod is compared with when its Session's next item comes
    // (`Launcher::image_of`): a pool whose spec or image changed recycles it.
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            warm::ANNOTATION_TEMPLATE.to_string(),
            warm::template(pool, image, base_url),
        );
    pod
}

/// The hardened Pod named `name` with these labels and runner env.
fn build(
    pool: &WorkerPool,
    name: &str,
    labels: &BTreeMap<String, String>,
    env: &[(String, String)],
    image: &str,
    workspace: Workspace<'_>,
) -> Pod {
    let sandbox_labels = labels;
    let sandbox_env = env;
    let spec = &pool.spec;
    let overrides = &spec.pod;
    let uid = overrides.run_as_user.unwrap_or(SANDBOX_UID);
    let gid = overrides.run_as_group.unwrap_or(SANDBOX_UID);
    let fs_group = overrides.fs_group.unwrap_or(gid);

    let mut labels: BTreeMap<String, String> = overrides.labels.clone();
    labels.extend(sandbox_labels.clone());
    let annotations = (!overrides.annotations.is_empty()).then(|| overrides.annotations.clone());

    let mut env: Vec<EnvVar> = overrides.env.clone();
    env.extend(sandbox_env.iter().map(|(name, value)| EnvVar {
        name: name.clone(),
        value: Some(value.clone()),
        value_from: None,
    }));
    env.push(EnvVar {
        name: "MANGO_WORKSPACE".into(),
        value: Some(WORKSPACE.into()),
        value_from: None,
    });

    let tmp_size = overrides
        .tmp_size_limit
        .clone()
        .unwrap_or_else(|| Quantity(DEFAULT_TMP.into()));
    let persistent = matches!(workspace, Workspace::Claim(_));
    let workspace = match workspace {
        Workspace::Claim(claim) => Volume {
            name: "workspace".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.to_string(),
                read_only: Some(false),
            }),
            ..Default::default()
        },
        Workspace::Ephemeral => Volume {
            name: "workspace".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(tmp_size.clone()),
            }),
            ..Default::default()
        },
    };
    let tmp = Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(tmp_size.clone()),
        }),
        ..Default::default()
    };
    // Session Work mounts its Memory Stores here: empty at every activation
    // (they are downloaded afresh), gone with the Pod. A warm Pod may serve
    // a Session, so it has one too.
    let memory = persistent.then(|| Volume {
        name: "memory".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(tmp_size),
        }),
        ..Default::default()
    });
    let mut mounts = vec![
        VolumeMount {
            name: "workspace".into(),
            mount_path: WORKSPACE.into(),
            ..Default::default()
        },
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
    ];
    let mut volumes = vec![workspace, tmp];
    if let Some(memory) = memory {
        mounts.push(VolumeMount {
            name: memory.name.clone(),
            mount_path: MEMORY_ROOT.into(),
            ..Default::default()
        });
        volumes.push(memory);
    }

    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: pool.namespace(),
            labels: Some(labels),
            annotations,
            owner_references: Some(vec![owner(pool)]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            share_process_namespace: Some(false),
            host_users: overrides.host_users,
            active_deadline_seconds: Some(
                spec.active_deadline_seconds
                    .unwrap_or(DEFAULT_DEADLINE_SECONDS),
            ),
            // A runner asked to stop (a Stop, an eviction, the deadline)
            // ends its item and flushes its Memory Stores in this time.
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            runtime_class_name: spec.runtime_class_name.clone(),
            node_selector: spec.node_selector.clone(),
            tolerations: spec.tolerations.clone(),
            priority_class_name: overrides.priority_class_name.clone(),
            service_account_name: overrides.service_account_name.clone(),
            image_pull_secrets: (!overrides.image_pull_secrets.is_empty())
                .then(|| overrides.image_pull_secrets.clone()),
            affinity: overrides.affinity.clone(),
            topology_spread_constraints: (!overrides.topology_spread_constraints.is_empty())
                .then(|| overrides.topology_spread_constraints.clone()),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(uid),
                run_as_group: Some(gid),
                fs_group: Some(fs_group),
                fs_group_change_policy: Some("OnRootMismatch".into()),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: CONTAINER.into(),
                image: Some(spec.image.clone().unwrap_or_else(|| image.to_string())),
                image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
                stdin: Some(true),
                stdin_once: Some(true),
                tty: Some(false),
                working_dir: Some(WORKSPACE.into()),
                env: Some(env),
                resources: Some(resources(pool)),
                security_context: Some(container_security(uid, gid)),
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                volume_mounts: Some(mounts),
                ..Default::default()
            }],
            volumes: Some(volumes),
            ..Default::default()
        }),
        status: None,
    }
}

/// The hardening fields the controller sets, as JSON pointers: into the
/// Pod (`/spec/…`) or into its runner container (`/container/…`).
const HARDENING: [&str; 25] = [
    "/spec/hostUsers",
    "/spec/automountServiceAccountToken",
    "/spec/enableServiceLinks",
    "/spec/hostNetwork",
    "/spec/hostPID",
    "/spec/hostIPC",
    "/spec/shareProcessNamespace",
    "/spec/restartPolicy",
    "/spec/activeDeadlineSeconds",
    "/spec/runtimeClassName",
    "/spec/securityContext/runAsNonRoot",
    "/spec/securityContext/runAsUser",
    "/spec/securityContext/runAsGroup",
    "/spec/securityContext/seccompProfile/type",
    "/container/stdin",
    "/container/stdinOnce",
    "/container/securityContext/allowPrivilegeEscalation",
    "/container/securityContext/privileged",
    "/container/securityContext/readOnlyRootFilesystem",
    "/container/securityContext/runAsNonRoot",
    "/container/securityContext/runAsUser",
    "/container/securityContext/capabilities/drop",
    "/container/securityContext/seccompProfile/type",
    // Quantities come back canonical ("0.5" as "500m"): their presence counts.
    "/container/resources/limits/cpu",
    "/container/resources/limits/memory",
];

/// The hardening fields of `sent` that `stored` (the API server's answer to
/// the create: the object as stored) does not hold as sent, as paths
/// (`spec.hostUsers`). An API server drops a field whose feature gate is
/// off (`hostUsers` without `UserNamespacesSupport`, off by default before
/// 1.33) without an error; a mutating webhook may change one.
pub fn hardening_not_stored(sent: &Pod, stored: &Pod) -> Vec<String> {
    let as_json = |pod: &Pod| serde_json::to_value(pod).unwrap_or_default();
    let (sent, stored) = (as_json(sent), as_json(stored));
    let runner = |pod: &serde_json::Value| {
        pod["spec"]["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == CONTAINER))
            .cloned()
            .unwrap_or_default()
    };
    let (sent_runner, stored_runner) = (runner(&sent), runner(&stored));
    HARDENING
        .iter()
        .filter_map(|path| {
            let (want, got, shown) = match path.strip_prefix("/container") {
                Some(rest) => (
                    sent_runner.pointer(rest),
                    stored_runner.pointer(rest),
                    format!("spec.containers[{CONTAINER}]{}", rest.replace('/', ".")),
                ),
                None => (
                    sent.pointer(path),
                    stored.pointer(path),
                    path[1..].replace('/', "."),
                ),
            };
            let want = want.filter(|v| !v.is_null())?;
            let kept = if path.contains("/resources/limits/") {
                got.is_some_and(|v| !v.is_null())
            } else {
                got == Some(want)
            };
            (!kept).then_some(shown)
        })
        .collect()
}

pub mod kept;
pub mod warm;

#[cfg(test)]
mod tests;
