//! The resources this fake serves, with what differs between them: group,
//! version, scope, the name rule each kind's validation applies, and
//! whether writes to the main resource leave `status` alone.

/// How a kind's `metadata.name` is checked (`ValidateObjectMeta`'s
/// `ValidateNameFunc`, per kind in k8s.io/kubernetes pkg/apis/*/validation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// `NameIsDNSSubdomain`: Pods, PVCs, Secrets, Events, Leases, custom resources.
    Subdomain,
    /// `ValidateNamespaceName` (`NameIsDNSLabel`).
    Label,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub name_rule: NameRule,
    /// A `/status` subresource: the main resource ignores `status` writes
    /// and `/status` ignores everything else.
    pub status: bool,
    /// Strategic merge patch is served for built-in kinds only.
    pub builtin: bool,
    pub short_names: &'static [&'static str],
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The path prefix of this resource's group and version.
    pub fn group_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

pub const NAMESPACES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "namespaces",
    singular: "namespace",
    kind: "Namespace",
    namespaced: false,
    name_rule: NameRule::Label,
    status: true,
    builtin: true,
    short_names: &["ns"],
};

pub const PODS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "pods",
    singular: "pod",
    kind: "Pod",
    namespaced: true,
    name_rule: NameRule::Subdomain,
    status: true,
    builtin: true,
    short_names: &["po"],
};

pub const PVCS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "persistentvolumeclaims",
    singular: "persistentvolumeclaim",
    kind: "PersistentVolumeClaim",
    namespaced: true,
    name_rule: NameRule::Subdomain,
    status: true,
    builtin: true,
    short_names: &["pvc"],
};

pub const SECRETS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "secrets",
    singular: "secret",
    kind: "Secret",
    namespaced: true,
    name_rule: NameRule::Subdomain,
    status: false,
    builtin: true,
    short_names: &[],
};

pub const EVENTS: ResourceType = ResourceType {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    singular: "event",
    kind: "Event",
    namespaced: true,
    name_rule: NameRule::Subdomain,
    status: false,
    builtin: true,
    short_names: &["ev"],
};

pub const LEASES: ResourceType = ResourceType {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    singular: "lease",
    kind: "Lease",
    namespaced: true,
    name_rule: NameRule::Subdomain,
    status: false,
    builtin: true,
    short_names: &[],
};

/// The CRD in `crds/workerpool.yaml` (served with its schema, see `schema`).
pub const WORKER_POOLS: ResourceType = ResourceType {
    group: "mango.dev",
    version: "v1alpha1",
    plural: "workerpools",
    singular: "workerpool",
    kind: "WorkerPool",
    namespaced: true,
    name_rule: NameRule::Subdomain,
    status: true,
    builtin: false,
    short_names: &["wp"],
};

/// Cluster-scoped; the fake starts with the CRDs of `crds/` stored, as
/// `helm install` leaves them (`Options::crds`).
pub const CUSTOM_RESOURCE_DEFINITIONS: ResourceType = ResourceType {
    group: "apiextensions.k8s.io",
    version: "v1",
    plural: "customresourcedefinitions",
    singular: "customresourcedefinition",
    kind: "CustomResourceDefinition",
    namespaced: false,
    name_rule: NameRule::Subdomain,
    status: true,
    builtin: true,
    short_names: &["crd", "crds"],
};

pub const ALL: [ResourceType; 8] = [
    NAMESPACES,
    CUSTOM_RESOURCE_DEFINITIONS,
    PODS,
    PVCS,
    SECRETS,
    EVENTS,
    LEASES,
    WORKER_POOLS,
];

/// The resource at `group`/`version`/`plural`, if served.
pub fn find(group: &str, version: &str, plural: &str) -> Option<ResourceType> {
    ALL.iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource whose kind is `kind` in `api_version` (owner references).
pub fn by_kind(api_version: &str, kind: &str) -> Option<ResourceType> {
    ALL.iter()
        .copied()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}
