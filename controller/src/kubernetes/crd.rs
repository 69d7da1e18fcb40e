//! The `WorkerPool` custom resource (`mango.dev/v1alpha1`, namespaced): one
//! supervisor per pool, polling one Environment with the Environment key
//! in the referenced Secret, and one hardened Pod per acknowledged item.
//! `crds/workerpool.yaml` is generated from these types (`crdgen`).

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A pool of sandboxes for one Environment.
// Each printer column repeats `type_ = …`; clippy reads them as one attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "mango.dev",
    version = "v1alpha1",
    kind = "WorkerPool",
    namespaced,
    status = "WorkerPoolStatus",
    shortname = "wp",
    category = "mango",
    // The revision of this schema (`SCHEMA_REVISION`), which the controller
    // compares with the CRD the cluster serves.
    annotation("mango.dev/schema", "5"),
    // The name is the `mango.dev/pool` label of every sandbox Pod.
    validation = Rule::new("self.metadata.name.size() <= 63").message("a WorkerPool's name is its sandbox Pods' mango.dev/pool label value: at most 63 characters"),
    doc = "A pool of hardened sandbox Pods serving one Mango Environment: one Pod per acknowledged Work item.",
    printcolumn(
        name = "Environment",
        type_ = "string",
        json_path = ".spec.environmentId"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Polling",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Polling\")].status"
    ),
    printcolumn(
        name = "Live",
        type_ = "integer",
        json_path = ".status.liveItems",
        description = "Sandbox Pods live now"
    ),
    printcolumn(name = "Max", type_ = "integer", json_path = ".spec.maxConcurrency"),
    printcolumn(
        name = "Queued",
        type_ = "integer",
        json_path = ".status.queue.depth",
        description = "Items waiting in the Environment's queue"
    ),
    printcolumn(
        name = "Last Poll",
        type_ = "date",
        json_path = ".status.lastSuccessfulPoll"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolSpec {
    /// The Mango api as the controller reaches it. Default: the
    /// controller's `--default-api-url` (the chart's in-cluster Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// The api as sandbox Pods reach it. Default: `apiUrl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_api_url: Option<String>,
    /// The Environment this pool serves (`env_…`). It is a label value of
    /// every sandbox Pod: at most 63 characters.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    )]
    pub environment_id: String,
    /// The Secret (in the pool's namespace) holding the Environment key.
    pub environment_key_secret: SecretKeyRef,
    /// The sandbox image (the runner only). Default: the controller's
    /// `--default-sandbox-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// The sandbox container's resources. Limits left out get the defaults
    /// (1 CPU, 512Mi): a sandbox always has limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// A RuntimeClass for stronger isolation (gVisor, Kata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Where Session workspaces live: one PVC per Session.
    #[serde(default)]
    pub workspace: WorkspaceStorage,
    /// Live sandbox Pods at most.
    #[serde(default = "default_max_concurrency")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_concurrency: u32,
    /// The longest a sandbox Pod may live (its `activeDeadlineSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 2147483647))]
    pub active_deadline_seconds: Option<i64>,
    /// How long a Pod may take to be Running (scheduling, image pull)
    /// before its item is released. Default 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 5, max = 3600))]
    pub start_timeout_seconds: Option<u32>,
    /// Additions to the sandbox Pod. None of them can weaken its hardening.
    #[serde(default)]
    pub pod: PodOverrides,
    /// Seconds a Session's Pod stays up after an activation that ended
    /// idle, waiting for that Session's next Work (spec §7.1 kept
    /// sandboxes), 0 to 1800. Default 0: every Pod goes after its
    /// activation (a kept Pod's stdin stays open past its first attach;
    /// see docs/kubernetes.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1800))]
    pub keep_idle: Option<u32>,
    /// Warm Pods: started ahead, identity-less, bound to an item on Ack
    /// (spec §7.1). Absent: every item starts cold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmPods>,
    /// What the sandboxes may reach besides the api: named hosts, through
    /// the pool's egress proxy. Absent, or no `allow`: nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,
}

fn default_max_concurrency() -> u32 {
    4
}

/// The pool's warm (PVC, Pod) pairs.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmPods {
    /// How many warm Pods to keep Running; 0: none.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: u32,
    /// Seconds a warm Pod may wait for an item before it is replaced by a
    /// new one. Default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 86400))]
    pub max_age: Option<u32>,
}

/// The pool's egress allowlist and the proxy that applies it. The proxy
/// reads `allow`, `allowAny` and `allowPrivate` from the pool itself, so an
/// edit takes effect without new Pods; the Pods carry only `proxy`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressSpec {
    /// Names the sandboxes may reach through the proxy: `host[:port]` or
    /// `*.domain[:port]` (port 443 unless given), as the Docker
    /// supervisor's `--egress-allow`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Admit wildcards over a whole top-level domain or everything (`*.com`, `*`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_any: bool,
    /// Let allowed names resolve to loopback, private and link-local addresses.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private: bool,
    /// `host:port` of the pool's egress proxy Service, as sandboxes reach
    /// it (`mango-egress.mango.svc:3128`). Required with `allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
}

impl EgressSpec {
    /// The allowlist `allow` and `allowAny` make, or the first refused entry.
    pub fn allowlist(
        &self,
    ) -> Result<crate::egress::allow::Allowlist, crate::egress::allow::EntryError> {
        crate::egress::allow::Allowlist::parse(&self.allow, self.allow_any)
    }
}

/// The most warm Pods a pool may keep.
pub const MAX_WARM_REPLICAS: u32 = 100;
/// `warm.maxAge`'s bounds and default, in seconds.
pub const WARM_MAX_AGE_SECONDS: std::ops::RangeInclusive<u32> = 60..=86400;
pub const DEFAULT_WARM_MAX_AGE_SECONDS: u32 = 3600;

/// `keepIdle`'s bounds, in seconds (spec §7.1: at most 30 minutes).
pub const KEEP_IDLE_SECONDS: std::ops::RangeInclusive<u32> = 0..=1800;
/// No Pod is kept unless the pool asks: a kept Pod's stdin stays open past
/// its first attach, and a pool whose `image` predates the runner's
/// `--keep-idle-seconds` would fail every Session item (docs/kubernetes.md).
pub const DEFAULT_KEEP_IDLE_SECONDS: u32 = 0;

/// How long a Pod may take to be Running when the pool does not say.
pub const DEFAULT_START_TIMEOUT_SECONDS: u32 = 120;

impl WorkerPoolSpec {
    /// How long a Pod may take to be Running (`startTimeoutSeconds`).
    pub fn start_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(
            self.start_timeout_seconds
                .unwrap_or(DEFAULT_START_TIMEOUT_SECONDS),
        ))
    }

    /// How long a Session's Pod is kept after an idle end (`keepIdle`);
    /// zero: none is kept.
    pub fn keep_idle(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(
            self.keep_idle.unwrap_or(DEFAULT_KEEP_IDLE_SECONDS),
        ))
    }

    /// How many warm Pods the pool keeps.
    pub fn warm_replicas(&self) -> usize {
        self.warm.as_ref().map_or(0, |w| w.replicas as usize)
    }

    /// How long a warm Pod may wait.
    pub fn warm_max_age(&self) -> std::time::Duration {
        let seconds = self
            .warm
            .as_ref()
            .and_then(|w| w.max_age)
            .unwrap_or(DEFAULT_WARM_MAX_AGE_SECONDS);
        std::time::Duration::from_secs(u64::from(seconds))
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    pub name: String,
    /// Default `environment-key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl SecretKeyRef {
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or("environment-key")
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStorage {
    /// Default: the cluster's default StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Default `1Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
    /// Default `ReadWriteOnce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessMode>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AccessMode {
    ReadWriteOnce,
    ReadWriteOncePod,
    ReadWriteMany,
}

impl AccessMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteOncePod => "ReadWriteOncePod",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        }
    }
}

/// What a pool may add to its sandbox Pods. Fields that could weaken the
/// hardening (privilege, host namespaces, capabilities, a writable root,
/// a service account token, root) are not here at all; the ones here are
/// checked (`kubernetes::pod::validate`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Extra labels (not `mango.dev/…` nor `app.kubernetes.io/managed-by`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Its token is never mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// A non-root UID (default 65534).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub run_as_user: Option<i64>,
    /// A non-root GID (default 65534).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub run_as_group: Option<i64>,
    /// The group owning the workspace volume (default 65534).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub fs_group: Option<i64>,
    /// `false` runs the Pod in a user namespace; `true` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_users: Option<bool>,
    /// Extra plain environment variables of the runner's process (its
    /// tools get only the runner's allow-list); names starting with
    /// `MANGO_` are refused, and so is `valueFrom`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Size of the `/tmp` emptyDir (default 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tmp_size_limit: Option<Quantity>,
}

/// Where the pool stands.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolStatus {
    /// `Ready` (the supervisor runs with an accepted key), `Polling` (a
    /// Poll succeeded lately) and `Degraded` (something needs attention).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions")]
    pub conditions: Vec<Condition>,
    /// Sandbox Pods live now.
    #[serde(default)]
    pub live_items: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_poll: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The Environment's queue, from the api's Stats.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// Items available to a Poll now.
    pub depth: i64,
    /// Claimed, not yet acknowledged.
    pub pending: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_queued_at: Option<String>,
}

fn conditions(_: &mut schemars::generate::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "properties": {
                "lastTransitionTime": { "format": "date-time", "type": "string" },
                "message": { "type": "string" },
                "observedGeneration": { "type": "integer", "format": "int64" },
                "reason": { "type": "string" },
                "status": { "type": "string", "enum": ["True", "False", "Unknown"] },
                "type": { "type": "string" }
            },
            "required": ["lastTransitionTime", "message", "reason", "status", "type"]
        }
    })
}

/// The revision of the schema this controller was built with, stamped into
/// the CRD as the annotation [`SCHEMA_ANNOTATION`]. A cluster that serves
/// an older revision (Helm never upgrades `crds/`) would prune fields this
/// controller relies on, or admit pools it refuses: the controller then
/// runs no pool until the CRD is applied.
pub const SCHEMA_REVISION: u32 = 5;
pub const SCHEMA_ANNOTATION: &str = "mango.dev/schema";
/// The CRD's name.
pub const CRD_NAME: &str = "workerpools.mango.dev";

/// The schema revision a served CRD declares: the CRDs from before the
/// annotation are revision 1.
pub fn served_revision(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Result<u32, String> {
    match crd
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SCHEMA_ANNOTATION))
    {
        None => Ok(1),
        Some(value) => value.parse().map_err(|_| {
            format!("the CRD's {SCHEMA_ANNOTATION} annotation is {value:?}, not a revision number")
        }),
    }
}

/// The CRD as YAML, as `crds/workerpool.yaml` holds it.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = WorkerPool::crd();
    format!(
        "# Generated by `cargo run -p mango-controller --bin crdgen`; do not edit.\n{}",
        serde_yaml::to_string(&crd).expect("the CRD serializes")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crds/` is what `crdgen` prints: regenerate it with
    /// `cargo run -q -p mango-controller --bin crdgen > crds/workerpool.yaml`.
    #[test]
    fn the_checked_in_crd_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/workerpool.yaml");
        let checked_in = std::fs::read_to_string(path).expect("crds/workerpool.yaml");
        assert!(
            checked_in == crd_yaml(),
            "crds/workerpool.yaml is stale: run `cargo run -q -p mango-controller --bin crdgen > crds/workerpool.yaml`"
        );
    }

    /// Each revision's schema by the SHA-256 of its `openAPIV3Schema` (the
    /// first 16 hex digits), oldest first. Revision 1 had no annotation.
    const SCHEMA_HISTORY: &[(u32, &str)] = &[
        (2, "9e41fb4737ceac50"),
        (3, "33e1a1c2d34adfeb"),
        (4, "9db887acefbf4951"),
        (5, "5c76f72fee504936"),
    ];

    /// A schema change fails here until the revision is raised, so a
    /// controller always knows a CRD older than its own.
    #[test]
    fn a_schema_change_raises_the_revision() {
        use kube::CustomResourceExt;
        use sha2::{Digest, Sha256};
        let crd = WorkerPool::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some(CRD_NAME));
        assert_eq!(served_revision(&crd), Ok(SCHEMA_REVISION));
        let schema = serde_json::to_vec(&crd.spec.versions[0].schema).unwrap();
        let digest = hex::encode(&Sha256::digest(&schema)[..8]);
        assert_eq!(
            SCHEMA_HISTORY.last(),
            Some(&(SCHEMA_REVISION, digest.as_str())),
            "the WorkerPool schema changed: raise SCHEMA_REVISION and the CRD's {SCHEMA_ANNOTATION} annotation to {}, and append ({}, \"{digest}\") here",
            SCHEMA_REVISION + 1,
            SCHEMA_REVISION + 1
        );
    }

    #[test]
    fn a_crd_without_the_annotation_is_revision_one() {
        use kube::CustomResourceExt;
        let mut crd = WorkerPool::crd();
        crd.metadata.annotations = None;
        assert_eq!(served_revision(&crd), Ok(1));
        crd.metadata.annotations = Some([(SCHEMA_ANNOTATION.to_string(), "x".to_string())].into());
        assert!(served_revision(&crd)
            .unwrap_err()
            .contains("not a revision number"));
    }

    #[test]
    fn a_minimal_pool_parses_with_its_defaults() {
        let pool: WorkerPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "mango.dev/v1alpha1",
            "kind": "WorkerPool",
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {"environmentId": "env_1", "environmentKeySecret": {"name": "k"}}
        }))
        .unwrap();
        assert_eq!(pool.spec.max_concurrency, 4);
        assert_eq!(pool.spec.environment_key_secret.key(), "environment-key");
        assert_eq!(pool.spec.workspace, WorkspaceStorage::default());
        assert_eq!(pool.spec.pod, PodOverrides::default());
        assert_eq!(pool.spec.egress, None);
    }

    #[test]
    fn an_egress_spec_parses_with_its_defaults_and_names_a_bad_entry() {
        let egress: EgressSpec =
            serde_json::from_value(serde_json::json!({"allow": ["api.example.com"]})).unwrap();
        assert!(!egress.allow_any && !egress.allow_private && egress.proxy.is_none());
        assert_eq!(egress.allowlist().unwrap().entries().len(), 1);
        let broad = EgressSpec {
            allow: vec!["*.com".into()],
            ..egress.clone()
        };
        assert_eq!(broad.allowlist().unwrap_err().entry, "*.com");
        let any = EgressSpec {
            allow_any: true,
            ..broad
        };
        assert_eq!(any.allowlist().unwrap().broad(), ["*.com:443"]);
    }
}
