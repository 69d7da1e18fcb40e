//! `charts/mango` as Kubernetes would take it: rendered by real Helm (the
//! venv's helm-python-sdk, through `compat/python/chart_render.py`), every
//! document parsed as its k8s-openapi type (the WorkerPool as the
//! controller's own type) and serialized back, so that a misspelt or
//! misplaced field, which serde would ignore, fails; then what users rely
//! on: the sandboxes' default-deny NetworkPolicy, the controller's exact
//! Role, no credential in any manifest, hardened Pods, the binary contract
//! of `mango-worker kubernetes`, migrations before the api serves.
//!
//! Without the venv (`scripts/venv.sh`; or `MANGO_PYTHON`) these skip with
//! a message, and fail instead when `CI` is set. The CRD copy's check needs
//! no Helm and always runs.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, PodSpec, PodTemplateSpec, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResourceExt;
use mango_controller::core::launcher::{ItemIdentity, SandboxSpec};
use mango_controller::core::naming;
use mango_controller::kubernetes::crd::WorkerPool;
use mango_controller::kubernetes::pod;
use mango_protocol::WorkType;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const RELEASE: &str = "mango";
const NAMESPACE: &str = "agents";
const API_URL: &str = "http://mango-api.agents.svc:8080";
const KEY_PREFIXES: [&str; 3] = ["mango_wsk_", "mango_envk_", "mango_st_"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// One rendered document, typed.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
enum Object {
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    ConfigMap(ConfigMap),
    Crd(CustomResourceDefinition),
    Deployment(Deployment),
    Job(Job),
    NetworkPolicy(NetworkPolicy),
    Role(Role),
    RoleBinding(RoleBinding),
    Secret(Secret),
    Service(Service),
    ServiceAccount(ServiceAccount),
    StatefulSet(StatefulSet),
    WorkerPool(WorkerPool),
}

#[derive(Debug, Clone)]
struct Doc {
    source: String,
    yaml: String,
    object: Object,
}

/// A release as rendered with one set of values.
struct Release {
    docs: Vec<Doc>,
}

/// The values sets every check runs on.
struct Renders {
    default: Release,
    production: Release,
    /// Every optional branch of the templates on.
    full: Release,
    /// DNS as OpenShift serves it: its own namespace and Pods, port 5353.
    openshift_dns: Release,
    /// DNS from NodeLocal DNSCache, on a node-local address.
    node_local_dns: Release,
    /// A pool with an egress allowlist, every egress value at its default.
    egress: Release,
}

fn openshift_dns() -> Value {
    json!({"sandbox": {"networkPolicy": {"dns": {
        "peers": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-dns"}},
            "podSelector": {"matchLabels": {"dns.operator.openshift.io/daemonset-dns": "default"}},
        }],
        "ports": [{"port": 5353, "protocol": "UDP"}, {"port": 5353, "protocol": "TCP"}],
    }}}})
}

fn node_local_dns() -> Value {
    json!({"sandbox": {"networkPolicy": {"dns": {
        "peers": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
    }}}})
}

/// The values of [`Renders::full`]: each optional value set, none a credential.
fn full_values() -> Value {
    json!({
        "commonLabels": {"team": "agents"},
        "imagePullSecrets": [{"name": "registry"}],
        "api": {
            "replicas": 3,
            "model": {"baseUrl": "https://model.example.com", "existingSecret": "model-key"},
            "extraEnv": [
                {"name": "MANGO_DB_MAX_CONNECTIONS", "value": "30"},
                {"name": "EXTRA_TOKEN", "valueFrom": {"secretKeyRef": {"name": "extra", "key": "token"}}},
            ],
            "podAnnotations": {"prometheus.io/scrape": "true"},
            "podLabels": {"tier": "control"},
            "nodeSelector": {"pool": "system"},
            "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
            "service": {"annotations": {"a": "b"}},
        },
        "postgresql": {"storage": {"storageClassName": "fast"}},
        "controller": {
            "secretNames": ["pool-key"],
            "extraEnv": [{"name": "RUST_BACKTRACE", "value": "1"}],
            "podAnnotations": {"prometheus.io/scrape": "true"},
            "leaderElection": {"enabled": false, "leaseName": "other"},
            "checkCrd": false,
        },
        "sandbox": {"image": {"repository": "registry.example.com/sandbox", "tag": "7"}},
        "pool": {
            "enabled": true,
            "name": "builders",
            "environmentId": "env_1",
            "environmentKeySecret": {"name": "pool-key"},
            "sandboxApiUrl": "http://sandbox-api.agents.svc:8080",
            "image": "registry.example.com/sandbox:8",
            "imagePullPolicy": "Always",
            "maxConcurrency": 9,
            "runtimeClassName": "kata",
            "resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
            "nodeSelector": {"sandbox": "yes"},
            "tolerations": [{"key": "sandbox", "operator": "Exists"}],
            "workspace": {"storageClassName": "fast", "size": "5Gi", "accessMode": "ReadWriteOncePod"},
            "activeDeadlineSeconds": 600,
            "startTimeoutSeconds": 60,
            "keepIdle": 900,
            "warm": {"replicas": 3, "maxAge": 600},
            "pod": {
                "labels": {"team": "a"},
                "annotations": {"note": "x"},
                "runAsUser": 1000,
                "env": [{"name": "LANG", "value": "C.UTF-8"}],
                "imagePullSecrets": [{"name": "registry"}],
                "tmpSizeLimit": "128Mi",
            },
            "egress": {
                "allow": ["example.com", "*.example.org:8443", "pypi.org:443"],
                "allowPrivate": true,
            },
        },
        "egressProxy": {
            "replicas": 3,
            "podAnnotations": {"note": "x"},
            "nodeSelector": {"pool": "system"},
            "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
            "networkPolicy": {
                "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                "apiServer": {
                    "peers": [{"ipBlock": {"cidr": "172.18.0.2/32"}}],
                    "ports": [{"port": 6443, "protocol": "TCP"}],
                },
            },
        },
    })
}

/// The venv's Python, if it has helm-python-sdk.
fn python() -> Result<PathBuf, String> {
    let python = std::env::var_os("MANGO_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    if !python.exists() {
        return Err(format!(
            "no Python venv at {} (run scripts/venv.sh, or set MANGO_PYTHON)",
            python.display()
        ));
    }
    let probe = Command::new(&python)
        .args(["-c", "import helm_python"])
        .output()
        .map_err(|e| format!("{} does not run: {e}", python.display()))?;
    if !probe.status.success() {
        return Err(format!(
            "{} has no helm-python-sdk (scripts/venv.sh installs compat/python/requirements.txt): {}",
            python.display(),
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    Ok(python)
}

fn render(python: &Path, files: &[&str], set: &Value) -> Release {
    let mut cmd = Command::new(python);
    cmd.arg(root().join("compat/python/chart_render.py"));
    for file in files {
        cmd.arg("-f").arg(root().join(file));
    }
    cmd.args(["--set-json", &set.to_string()])
        .args(["--name", RELEASE, "--namespace", NAMESPACE]);
    let out = cmd.output().expect("chart_render.py runs");
    assert!(
        out.status.success(),
        "rendering {files:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw: Vec<BTreeMap<String, String>> =
        serde_json::from_slice(&out.stdout).expect("chart_render.py prints JSON");
    let docs = raw
        .into_iter()
        .map(|d| {
            let (source, yaml) = (d["source"].clone(), d["yaml"].clone());
            let value: Value = serde_yaml::from_str(&yaml)
                .unwrap_or_else(|e| panic!("{source}: not YAML: {e}\n{yaml}"));
            let object = typed_object(&source, &value);
            Doc {
                source,
                yaml,
                object,
            }
        })
        .collect();
    Release { docs }
}

/// The renderings, made once per test binary; `None` (after saying why)
/// where Helm cannot be had outside CI.
fn renders() -> Option<&'static Renders> {
    static RENDERS: OnceLock<Result<Renders, String>> = OnceLock::new();
    let renders = RENDERS.get_or_init(|| {
        let python = python()?;
        Ok(Renders {
            default: render(&python, &[], &json!({})),
            production: render(
                &python,
                &["charts/mango/values-production.yaml"],
                &json!({}),
            ),
            full: render(&python, &[], &full_values()),
            openshift_dns: render(&python, &[], &openshift_dns()),
            node_local_dns: render(&python, &[], &node_local_dns()),
            egress: render(&python, &[], &egress::values()),
        })
    });
    match renders {
        Ok(renders) => Some(renders),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("CI is set, and the chart cannot be rendered: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: {why}; the chart's tests run wherever the venv has helm-python-sdk (and fail under CI)");
            None
        }
    }
}

// ---------------------------------------------------------------- strict parsing

/// `value` without nulls, empty maps and empty lists, at any depth: what
/// an absent optional field and an empty one both mean.
fn pruned(value: &Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Object(map) => {
            let kept: serde_json::Map<String, Value> = map
                .iter()
                .filter_map(|(k, v)| pruned(v).map(|v| (k.clone(), v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(items) => {
            let kept: Vec<Value> = items
                .iter()
                .map(|v| pruned(v).unwrap_or(json!({})))
                .collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        other => Some(other.clone()),
    }
}

/// The paths where `a` and `b` differ (at most a few).
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    if out.len() >= 8 {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => differences(u, v, &format!("{path}.{k}"), out),
                    (Some(_), None) => out.push(format!(
                        "{path}.{k}: in the manifest, unknown to the type (misspelt or misplaced)"
                    )),
                    (None, Some(_)) => out.push(format!(
                        "{path}.{k}: added by the type (a default the manifest should spell out)"
                    )),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(u, v, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{path}: {a} in the manifest, {b} typed")),
        _ => {}
    }
}

/// `value` as a `T`, refusing whatever `T` does not hold.
fn strict<T: DeserializeOwned + Serialize>(source: &str, value: &Value) -> T {
    let typed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{source}: does not parse as its type: {e}\n{value:#}"));
    let back = serde_json::to_value(&typed).expect("serializes");
    let (want, got) = (pruned(value), pruned(&back));
    if want != got {
        let mut diff = Vec::new();
        differences(
            want.as_ref().unwrap_or(&Value::Null),
            got.as_ref().unwrap_or(&Value::Null),
            "",
            &mut diff,
        );
        panic!(
            "{source}: the manifest is not what its type holds:\n  {}",
            diff.join("\n  ")
        );
    }
    typed
}

fn typed_object(source: &str, value: &Value) -> Object {
    let kind = value["kind"].as_str().unwrap_or_default();
    let api_version = value["apiVersion"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "ConfigMap") => Object::ConfigMap(strict(source, value)),
        ("v1", "Secret") => Object::Secret(strict(source, value)),
        ("v1", "Service") => Object::Service(strict(source, value)),
        ("v1", "ServiceAccount") => Object::ServiceAccount(strict(source, value)),
        ("apps/v1", "Deployment") => Object::Deployment(strict(source, value)),
        ("apps/v1", "StatefulSet") => Object::StatefulSet(strict(source, value)),
        ("batch/v1", "Job") => Object::Job(strict(source, value)),
        ("networking.k8s.io/v1", "NetworkPolicy") => Object::NetworkPolicy(strict(source, value)),
        ("rbac.authorization.k8s.io/v1", "Role") => Object::Role(strict(source, value)),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
            Object::RoleBinding(strict(source, value))
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            Object::ClusterRole(strict(source, value))
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            Object::ClusterRoleBinding(strict(source, value))
        }
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            Object::Crd(strict(source, value))
        }
        ("mango.dev/v1alpha1", "WorkerPool") => Object::WorkerPool(strict(source, value)),
        other => panic!(
            "{source}: {other:?} is a kind this test does not know: parse it here as its type"
        ),
    }
}

// ---------------------------------------------------------------- lookups

macro_rules! all_of {
    ($release:expr, $variant:ident) => {
        $release
            .docs
            .iter()
            .filter_map(|d| match &d.object {
                Object::$variant(o) => Some(o),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
}

macro_rules! named {
    ($release:expr, $variant:ident, $name:expr) => {{
        let found = all_of!($release, $variant)
            .into_iter()
            .filter(|o| o.metadata.name.as_deref() == Some($name))
            .collect::<Vec<_>>();
        assert_eq!(found.len(), 1, "one {} {}", stringify!($variant), $name);
        found[0]
    }};
}

fn releases(r: &Renders) -> [(&'static str, &Release); 3] {
    [
        ("default", &r.default),
        ("production", &r.production),
        ("full", &r.full),
    ]
}

fn template(d: &Deployment) -> &PodTemplateSpec {
    &d.spec.as_ref().unwrap().template
}

fn pod_spec(t: &PodTemplateSpec) -> &PodSpec {
    t.spec.as_ref().unwrap()
}

fn labels_of(t: &PodTemplateSpec) -> BTreeMap<String, String> {
    t.metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

fn env<'a>(c: &'a Container, name: &str) -> &'a EnvVar {
    c.env
        .as_ref()
        .and_then(|env| env.iter().find(|e| e.name == name))
        .unwrap_or_else(|| panic!("container {} has no {name}", c.name))
}

fn env_value(c: &Container, name: &str) -> String {
    env(c, name)
        .value
        .clone()
        .unwrap_or_else(|| panic!("{name} of {} is not a plain value", c.name))
}

fn secret_ref(c: &Container, name: &str) -> (String, String) {
    let var = env(c, name);
    assert!(var.value.is_none(), "{name} of {} is a literal", c.name);
    let r = var
        .value_from
        .as_ref()
        .and_then(|f| f.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{name} of {} is not from a Secret", c.name));
    (r.name.clone(), r.key.clone())
}

fn field_ref(c: &Container, name: &str) -> String {
    env(c, name)
        .value_from
        .as_ref()
        .and_then(|f| f.field_ref.as_ref())
        .map(|f| f.field_path.clone())
        .unwrap_or_else(|| panic!("{name} of {} is not from the downward API", c.name))
}

/// Kubernetes' label selector semantics (matchLabels and matchExpressions).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            other => panic!("no selector operator {other}"),
        }
    });
    by_labels && by_expressions
}

/// The Pod templates of the chart's own workloads, by name.
fn workload_pods(release: &Release) -> Vec<(String, PodTemplateSpec)> {
    let mut pods: Vec<(String, PodTemplateSpec)> = all_of!(release, Deployment)
        .into_iter()
        .map(|d| (d.metadata.name.clone().unwrap(), template(d).clone()))
        .collect();
    pods.extend(all_of!(release, StatefulSet).into_iter().map(|s| {
        (
            s.metadata.name.clone().unwrap(),
            s.spec.as_ref().unwrap().template.clone(),
        )
    }));
    pods
}

/// The sandbox Pods the controller would make for `pool`: a Session's and
/// a healthcheck's, from its own pure function.
fn sandbox_pods(pool: &WorkerPool) -> Vec<k8s_openapi::api::core::v1::Pod> {
    [Some("sesn_1"), None]
        .into_iter()
        .map(|session| {
            let item = ItemIdentity {
                work_id: "work_1".into(),
                claim: 1,
                environment_id: pool.spec.environment_id.clone(),
                work_type: if session.is_some() {
                    WorkType::Session
                } else {
                    WorkType::Healthcheck
                },
                session_id: session.map(str::to_string),
            };
            let spec = SandboxSpec {
                name: naming::sandbox_name(&item.work_id, item.claim),
                labels: naming::labels(&item, pool.metadata.name.as_deref().unwrap()),
                env: naming::runner_env(&item, pool.spec.api_url.as_deref().unwrap_or(API_URL)),
                item,
            };
            pod::sandbox_pod(pool, &spec, "mango-sandbox:0.1.0")
        })
        // A warm Pod, identity-less while it waits for its envelope.
        .chain([pod::warm::warm_pod(
            pool,
            "mango-warm-1",
            "mango-sandbox:0.1.0",
            pool.spec.api_url.as_deref().unwrap_or(API_URL),
        )])
        .collect()
}

fn port(p: &NetworkPolicyPort) -> (String, i32) {
    let number = match p.port.as_ref().expect("a port") {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => panic!("a named port {s}: give the number"),
    };
    (p.protocol.clone().unwrap_or_else(|| "TCP".into()), number)
}

// ---------------------------------------------------------------- the tests

// After the lookups: `all_of!` and `named!` are in scope from here on.
mod egress;

/// `charts/mango/crds/` ships what `crdgen` generates (`crds/`). No Helm
/// needed: this one always runs.
#[test]
fn the_charts_crd_is_the_generated_one() {
    let generated = std::fs::read_to_string(root().join("crds/workerpool.yaml")).unwrap();
    let shipped = std::fs::read_to_string(root().join("charts/mango/crds/workerpool.yaml"))
        .expect("charts/mango/crds/workerpool.yaml");
    assert!(
        shipped == generated,
        "charts/mango/crds/workerpool.yaml is stale: cp crds/workerpool.yaml charts/mango/crds/"
    );
    let entries: Vec<_> = std::fs::read_dir(root().join("charts/mango/crds"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(entries, ["workerpool.yaml"], "one CRD, the generated one");
}

#[test]
fn every_manifest_parses_strictly_as_its_type() {
    let Some(r) = renders() else { return };
    for (name, release) in releases(r) {
        assert!(
            release.docs.len() >= 10,
            "{name}: {} documents",
            release.docs.len()
        );
        // What helm install sends for the CRD is the controller's own.
        let crds = all_of!(release, Crd);
        assert_eq!(crds.len(), 1, "{name}");
        assert_eq!(
            *crds[0],
            WorkerPool::crd(),
            "{name}: the CRD is WorkerPool's"
        );
        // Hooks would run outside the ordering this chart relies on.
        assert!(all_of!(release, Job).is_empty(), "{name}: no Job");
        for doc in &release.docs {
            if !matches!(
                doc.object,
                Object::Crd(_) | Object::ClusterRole(_) | Object::ClusterRoleBinding(_)
            ) {
                let meta = match &doc.object {
                    Object::WorkerPool(p) => p.metadata.namespace.clone(),
                    _ => serde_yaml::from_str::<Value>(&doc.yaml).unwrap()["metadata"]["namespace"]
                        .as_str()
                        .map(str::to_string),
                };
                assert_eq!(
                    meta.as_deref(),
                    Some(NAMESPACE),
                    "{name}: {} is in the release's namespace",
                    doc.source
                );
            }
        }
    }
}

/// The sandboxes: nothing reaches them, and they reach only the api Pods
/// (on the api's sandbox port) and DNS; with an allowlist, the egress
/// proxy's Pods too (`egress::`), and without one no proxy exists.
#[test]
fn sandboxes_are_default_deny_with_only_api_and_dns_egress() {
    let Some(r) = renders() else { return };
    for (name, release) in [("default", &r.default), ("production", &r.production)] {
        egress::assert_no_proxy(name, release);
        let policy = named!(release, NetworkPolicy, "mango-sandbox");
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&["Ingress".to_string(), "Egress".to_string()][..]),
            "{name}: both directions are governed"
        );
        assert!(
            spec.ingress.as_ref().is_none_or(|i| i.is_empty()),
            "{name}: no ingress at all"
        );
        let selector = spec.pod_selector.as_ref().expect("a pod selector");

        // It selects every sandbox Pod the controller makes, and none of
        // the chart's own Pods.
        let pool = all_of!(r.full, WorkerPool)[0];
        for sandbox in sandbox_pods(pool) {
            let labels = sandbox.metadata.labels.clone().unwrap();
            assert!(selects(selector, &labels), "{name}: selects {labels:?}");
        }
        let pods = workload_pods(release);
        for (pod_name, t) in &pods {
            assert!(
                !selects(selector, &labels_of(t)),
                "{name}: the sandbox policy must not select {pod_name}"
            );
        }

        let egress = spec.egress.as_ref().expect("egress rules");
        assert_eq!(egress.len(), 2, "{name}: the api and DNS, nothing more");
        let peers_of = |i: usize| -> &Vec<NetworkPolicyPeer> { egress[i].to.as_ref().unwrap() };

        // To the api: same namespace, the api Pods only, on its sandbox
        // port (not the operators' port, not /metrics).
        let api = named!(release, Deployment, "mango-api");
        let api_ports = pod_spec(template(api)).containers[0]
            .ports
            .as_ref()
            .unwrap();
        let api_port = api_ports
            .iter()
            .find(|p| p.name.as_deref() == Some("sandbox"))
            .expect("the api's sandbox port")
            .container_port;
        for other in api_ports
            .iter()
            .filter(|p| p.name.as_deref() != Some("sandbox"))
        {
            assert_ne!(
                other.container_port, api_port,
                "{name}: the sandbox port is the api's alone"
            );
        }
        let to_api = peers_of(0);
        assert_eq!(to_api.len(), 1);
        assert!(to_api[0].namespace_selector.is_none() && to_api[0].ip_block.is_none());
        let api_selector = to_api[0].pod_selector.as_ref().unwrap();
        for (pod_name, t) in &pods {
            assert_eq!(
                selects(api_selector, &labels_of(t)),
                pod_name == "mango-api",
                "{name}: the api peer selects the api Pods only ({pod_name})"
            );
        }
        let ports: Vec<_> = egress[0].ports.iter().flatten().map(port).collect();
        assert_eq!(ports, [("TCP".to_string(), api_port)], "{name}");

        // To DNS: kube-system's kube-dns, port 53 over UDP and TCP.
        let (peers, ports) = dns_rule(policy);
        assert_eq!(peers.len(), 1);
        assert!(peers[0].ip_block.is_none());
        let ns = peers[0].namespace_selector.as_ref().unwrap();
        assert!(selects(
            ns,
            &BTreeMap::from([("kubernetes.io/metadata.name".into(), "kube-system".into())])
        ));
        assert!(selects(
            peers[0].pod_selector.as_ref().unwrap(),
            &BTreeMap::from([("k8s-app".into(), "kube-dns".into())])
        ));
        assert_eq!(
            ports,
            BTreeSet::from([("TCP".to_string(), 53), ("UDP".to_string(), 53)]),
            "{name}"
        );
    }
}

/// The sandbox policy's DNS rule: its peers and (protocol, port)s.
fn dns_rule(policy: &NetworkPolicy) -> (Vec<NetworkPolicyPeer>, BTreeSet<(String, i32)>) {
    let egress = policy.spec.as_ref().unwrap().egress.as_ref().unwrap();
    assert_eq!(egress.len(), 2, "the api and DNS, nothing more");
    let rule = &egress[1];
    (
        rule.to.clone().unwrap_or_default(),
        rule.ports.iter().flatten().map(port).collect(),
    )
}

/// DNS is not kube-dns on port 53 everywhere: OpenShift answers from its
/// own namespace on 5353, NodeLocal DNSCache on a node-local address. The
/// peers and ports are values; the rule allows exactly them.
#[test]
fn the_sandboxes_dns_egress_follows_the_clusters_dns() {
    let Some(r) = renders() else { return };
    let policy = named!(r.openshift_dns, NetworkPolicy, "mango-sandbox");
    let (peers, ports) = dns_rule(policy);
    assert_eq!(peers.len(), 1);
    assert!(selects(
        peers[0].namespace_selector.as_ref().unwrap(),
        &BTreeMap::from([("kubernetes.io/metadata.name".into(), "openshift-dns".into())])
    ));
    assert!(!selects(
        peers[0].namespace_selector.as_ref().unwrap(),
        &BTreeMap::from([("kubernetes.io/metadata.name".into(), "kube-system".into())])
    ));
    assert!(selects(
        peers[0].pod_selector.as_ref().unwrap(),
        &BTreeMap::from([(
            "dns.operator.openshift.io/daemonset-dns".into(),
            "default".into()
        )])
    ));
    assert_eq!(
        ports,
        BTreeSet::from([("TCP".to_string(), 5353), ("UDP".to_string(), 5353)])
    );

    let policy = named!(r.node_local_dns, NetworkPolicy, "mango-sandbox");
    let (peers, ports) = dns_rule(policy);
    assert_eq!(peers.len(), 1);
    assert_eq!(
        peers[0].ip_block.as_ref().map(|b| b.cidr.as_str()),
        Some("169.254.20.10/32")
    );
    assert!(peers[0].pod_selector.is_none() && peers[0].namespace_selector.is_none());
    assert_eq!(
        ports,
        BTreeSet::from([("TCP".to_string(), 53), ("UDP".to_string(), 53)]),
        "the default ports stay"
    );
}

/// The controller's Role: exactly what `mango-worker kubernetes` needs, in
/// its namespace only.
#[test]
fn the_controller_role_grants_exactly_what_it_needs() {
    let Some(r) = renders() else { return };
    let expected = |secret_names: &[&str]| -> BTreeSet<(String, String, Vec<String>, Vec<String>)> {
        let rule = |group: &str, resource: &str, verbs: &[&str], names: &[&str]| {
            let mut verbs: Vec<String> = verbs.iter().map(|v| v.to_string()).collect();
            verbs.sort();
            (
                group.to_string(),
                resource.to_string(),
                verbs,
                names.iter().map(|n| n.to_string()).collect(),
            )
        };
        BTreeSet::from([
            rule(
                "",
                "pods",
                &["get", "list", "watch", "create", "delete", "patch"],
                &[],
            ),
            rule("", "pods/attach", &["get", "create"], &[]),
            rule(
                "",
                "persistentvolumeclaims",
                &["get", "list", "watch", "create", "delete"],
                &[],
            ),
            rule("", "events", &["create", "patch"], &[]),
            rule("events.k8s.io", "events", &["create", "patch"], &[]),
            rule(
                "coordination.k8s.io",
                "leases",
                &["get", "create", "update"],
                &[],
            ),
            rule("", "secrets", &["get"], secret_names),
            rule("mango.dev", "workerpools", &["get", "list", "watch"], &[]),
            rule(
                "mango.dev",
                "workerpools/status",
                &["get", "patch", "update"],
                &[],
            ),
        ])
    };
    for (name, release, secret_names) in [
        ("default", &r.default, &[][..]),
        ("production", &r.production, &["mango-pool-key"][..]),
        ("full", &r.full, &["pool-key"][..]),
    ] {
        let role = named!(release, Role, "mango-controller");
        let mut granted = BTreeSet::new();
        for rule in role.rules.iter().flatten() {
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    let mut verbs = rule.verbs.clone();
                    verbs.sort();
                    let fresh = granted.insert((
                        group.clone(),
                        resource.clone(),
                        verbs,
                        rule.resource_names.clone().unwrap_or_default(),
                    ));
                    assert!(fresh, "{name}: {group}/{resource} twice");
                    assert!(!resource.contains('*') && !rule.verbs.iter().any(|v| v == "*"));
                }
            }
        }
        assert_eq!(granted, expected(secret_names), "{name}");

        let binding = named!(release, RoleBinding, "mango-controller");
        assert_eq!(binding.role_ref.kind, "Role");
        assert_eq!(binding.role_ref.name, "mango-controller");
        let subjects = binding.subjects.as_ref().unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (
                subjects[0].kind.as_str(),
                subjects[0].name.as_str(),
                subjects[0].namespace.as_deref()
            ),
            ("ServiceAccount", "mango-controller", Some(NAMESPACE))
        );
        named!(release, ServiceAccount, "mango-controller");
        let controller = named!(release, Deployment, "mango-controller");
        assert_eq!(
            pod_spec(template(controller))
                .service_account_name
                .as_deref(),
            Some("mango-controller")
        );
    }
}

/// The controller's one cluster-scoped grant: `get` on the WorkerPool
/// CRD, that object only, to refuse pools on an outdated CRD; none with
/// `controller.checkCrd: false`, which also turns the check off.
#[test]
fn the_controller_may_read_the_workerpool_crd_and_nothing_else_cluster_wide() {
    let Some(r) = renders() else { return };
    for (name, release) in [("default", &r.default), ("production", &r.production)] {
        let roles = all_of!(release, ClusterRole);
        assert_eq!(roles.len(), 1, "{name}");
        let role = roles[0];
        let role_name = role.metadata.name.clone().unwrap();
        assert_eq!(
            role_name,
            format!("mango-{NAMESPACE}-crd-reader"),
            "{name}: unique per release"
        );
        let rules = role.rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1, "{name}");
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&["apiextensions.k8s.io".to_string()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["customresourcedefinitions".to_string()][..])
        );
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["workerpools.mango.dev".to_string()][..])
        );
        assert_eq!(rules[0].verbs, ["get"]);
        let bindings = all_of!(release, ClusterRoleBinding);
        assert_eq!(bindings.len(), 1, "{name}");
        let binding = bindings[0];
        assert_eq!(
            (
                binding.role_ref.kind.as_str(),
                binding.role_ref.name.as_str()
            ),
            ("ClusterRole", role_name.as_str())
        );
        let subjects = binding.subjects.as_ref().unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (
                subjects[0].kind.as_str(),
                subjects[0].name.as_str(),
                subjects[0].namespace.as_deref()
            ),
            ("ServiceAccount", "mango-controller", Some(NAMESPACE))
        );
        let c = &pod_spec(template(named!(release, Deployment, "mango-controller"))).containers[0];
        assert_eq!(env_value(c, "MANGO_CHECK_CRD"), "true", "{name}");
    }
    assert!(
        all_of!(r.full, ClusterRole).is_empty() && all_of!(r.full, ClusterRoleBinding).is_empty()
    );
    let c = &pod_spec(template(named!(r.full, Deployment, "mango-controller"))).containers[0];
    assert_eq!(env_value(c, "MANGO_CHECK_CRD"), "false");
}

/// No key, token or password is a value of any manifest: credentials are
/// Secret references, and the only Secret the chart writes is the trial
/// PostgreSQL's generated password.
#[test]
fn no_credential_is_in_any_manifest() {
    let Some(r) = renders() else { return };
    let sounds_secret = |n: &str| {
        let n = n.to_ascii_uppercase();
        ["KEY", "PASSWORD", "TOKEN", "SECRET", "DATABASE_URL"]
            .iter()
            .any(|w| n.contains(w))
    };
    for (name, release) in releases(r) {
        for doc in &release.docs {
            for prefix in KEY_PREFIXES {
                assert!(
                    !doc.yaml.contains(prefix),
                    "{name}: {} holds a {prefix}…",
                    doc.source
                );
            }
        }
        for (_, t) in workload_pods(release) {
            let spec = pod_spec(&t);
            for c in spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
            {
                for var in c.env.iter().flatten() {
                    if !sounds_secret(&var.name) {
                        continue;
                    }
                    if var.name.ends_with("_FILE") {
                        // A path, into a mounted Secret: never the value itself.
                        let path = env_value(c, &var.name);
                        let from_secret = c.volume_mounts.iter().flatten().any(|m| {
                            path.starts_with(&format!("{}/", m.mount_path))
                                && spec
                                    .volumes
                                    .iter()
                                    .flatten()
                                    .any(|v| v.name == m.name && v.secret.is_some())
                        });
                        assert!(
                            from_secret,
                            "{name}: {} is no file of a mounted Secret",
                            var.name
                        );
                    } else {
                        secret_ref(c, &var.name);
                    }
                }
            }
        }
        for cm in all_of!(release, ConfigMap) {
            for key in cm.data.iter().flatten().map(|(k, _)| k) {
                assert!(!sounds_secret(key), "{name}: ConfigMap key {key}");
            }
        }
        let secrets = all_of!(release, Secret);
        let trial = name != "production";
        assert_eq!(
            secrets
                .iter()
                .map(|s| s.metadata.name.clone().unwrap())
                .collect::<Vec<_>>(),
            if trial {
                vec!["mango-postgresql".to_string()]
            } else {
                vec![]
            },
            "{name}: the trial PostgreSQL's is the only Secret"
        );
        if let Some(secret) = secrets.first() {
            let data = secret.data.as_ref().unwrap();
            let password = String::from_utf8(data["password"].0.clone()).unwrap();
            let url = String::from_utf8(data["database-url"].0.clone()).unwrap();
            assert_eq!(password.len(), 32, "a generated password");
            assert_eq!(
                url,
                format!("postgres://mango:{password}@mango-postgresql.{NAMESPACE}.svc:5432/mango")
            );
            for doc in release
                .docs
                .iter()
                .filter(|d| !d.source.ends_with("postgresql/secret.yaml"))
            {
                assert!(!doc.yaml.contains(&password), "{name}: {}", doc.source);
            }
            let service = named!(release, Service, "mango-postgresql");
            assert_eq!(
                service.spec.as_ref().unwrap().cluster_ip.as_deref(),
                Some("None")
            );
        }
        for pool in all_of!(release, WorkerPool) {
            assert!(!pool.spec.environment_key_secret.name.is_empty());
        }
    }
}

/// PSS `restricted` and a read-only root for every Pod of the chart.
#[test]
fn every_pod_of_the_chart_runs_hardened() {
    let Some(r) = renders() else { return };
    for (name, release) in releases(r) {
        for (pod_name, t) in workload_pods(release) {
            let spec = pod_spec(&t);
            let at = format!("{name}: {pod_name}");
            let psc = spec
                .security_context
                .as_ref()
                .expect("a pod security context");
            assert_eq!(psc.run_as_non_root, Some(true), "{at}");
            assert!(psc.run_as_user.is_some_and(|u| u > 0), "{at}");
            assert_eq!(
                psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
                Some("RuntimeDefault"),
                "{at}"
            );
            assert!(spec.host_network != Some(true) && spec.host_pid != Some(true));
            assert_eq!(spec.enable_service_links, Some(false), "{at}");
            assert_eq!(
                spec.automount_service_account_token,
                Some(pod_name == "mango-controller" || pod_name == "mango-egress"),
                "{at}: only the controller and the egress proxy hold a Kubernetes token"
            );
            for c in spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
            {
                let sc = c
                    .security_context
                    .as_ref()
                    .expect("a container security context");
                let at = format!("{at}/{}", c.name);
                assert_eq!(sc.read_only_root_filesystem, Some(true), "{at}");
                assert_eq!(sc.allow_privilege_escalation, Some(false), "{at}");
                assert_eq!(sc.privileged, Some(false), "{at}");
                assert_eq!(sc.run_as_non_root, Some(true), "{at}");
                let caps = sc.capabilities.as_ref().unwrap();
                assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]), "{at}");
                assert!(caps.add.is_none(), "{at}");
                assert_eq!(
                    sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
                    Some("RuntimeDefault"),
                    "{at}"
                );
                let resources = c.resources.as_ref().expect("resources");
                assert!(
                    resources
                        .limits
                        .as_ref()
                        .is_some_and(|l| l.contains_key("memory")),
                    "{at}: a memory limit"
                );
            }
        }
    }
}

/// The controller runs `mango-worker kubernetes` configured as the binary
/// expects: its namespace and Pod name from the downward API, the chart's
/// Service as the default api, the sandbox image, metrics and probes on
/// one port, leader election through a Lease.
#[test]
fn the_controller_gets_the_binary_contract() {
    let Some(r) = renders() else { return };
    for (name, release, election, lease, image) in [
        (
            "default",
            &r.default,
            "true",
            "mango-controller",
            "mango-sandbox:0.1.0",
        ),
        (
            "production",
            &r.production,
            "true",
            "mango-controller",
            "registry.example.com/mango/sandbox:0.1.0",
        ),
        (
            "full",
            &r.full,
            "false",
            "other",
            "registry.example.com/sandbox:7",
        ),
    ] {
        let d = named!(release, Deployment, "mango-controller");
        let spec = pod_spec(template(d));
        assert_eq!(spec.containers.len(), 1);
        let c = &spec.containers[0];
        assert_eq!(
            c.args.as_deref(),
            Some(&["kubernetes".to_string()][..]),
            "{name}"
        );
        assert!(
            c.command.is_none(),
            "{name}: the image's entrypoint is mango-worker"
        );
        assert_eq!(field_ref(c, "MANGO_NAMESPACE"), "metadata.namespace");
        assert_eq!(field_ref(c, "POD_NAME"), "metadata.name");

        let service = named!(release, Service, "mango-api");
        let service_port = service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port;
        assert_eq!(
            env_value(c, "MANGO_DEFAULT_API_URL"),
            format!("http://mango-api.{NAMESPACE}.svc:{service_port}"),
            "{name}: the api Service's in-cluster URL"
        );
        assert_eq!(env_value(c, "MANGO_DEFAULT_API_URL"), API_URL);
        assert_eq!(env_value(c, "MANGO_DEFAULT_SANDBOX_IMAGE"), image, "{name}");
        assert_eq!(env_value(c, "MANGO_LEADER_ELECTION"), election, "{name}");
        assert_eq!(env_value(c, "MANGO_LEASE_NAME"), lease, "{name}");
        assert_eq!(env_value(c, "MANGO_METRICS_ADDR"), "0.0.0.0:9464");
        let ports = c.ports.as_ref().unwrap();
        assert_eq!(
            (ports[0].name.as_deref(), ports[0].container_port),
            (Some("metrics"), 9464)
        );
        for (probe, path) in [
            (c.liveness_probe.as_ref(), "/healthz"),
            (c.readiness_probe.as_ref(), "/readyz"),
        ] {
            let http = probe
                .and_then(|p| p.http_get.as_ref())
                .expect("an HTTP probe");
            assert_eq!(http.path.as_deref(), Some(path));
            assert_eq!(http.port, IntOrString::String("metrics".into()));
        }
    }
    let replicas = |release: &Release, n: &str| {
        named!(release, Deployment, n)
            .spec
            .as_ref()
            .unwrap()
            .replicas
    };
    assert_eq!(replicas(&r.production, "mango-controller"), Some(2));
    assert_eq!(replicas(&r.production, "mango-api"), Some(2));
}

/// `mango migrate` runs before `mango serve`, against the same database.
#[test]
fn the_api_migrates_before_it_serves() {
    let Some(r) = renders() else { return };
    for (name, release, db) in [
        ("default", &r.default, ("mango-postgresql", "database-url")),
        (
            "production",
            &r.production,
            ("mango-database", "database-url"),
        ),
        ("full", &r.full, ("mango-postgresql", "database-url")),
    ] {
        let d = named!(release, Deployment, "mango-api");
        let t = template(d);
        let spec = pod_spec(t);
        let init = spec.init_containers.as_ref().expect("an init container");
        assert_eq!(init.len(), 1);
        let (migrate, serve) = (&init[0], &spec.containers[0]);
        assert_eq!(
            migrate.args.as_deref(),
            Some(&["migrate".to_string()][..]),
            "{name}"
        );
        assert_eq!(
            serve.args.as_deref(),
            Some(&["serve".to_string(), "--no-migrate".to_string()][..]),
            "{name}"
        );
        assert_eq!(migrate.image, serve.image);
        let want = (db.0.to_string(), db.1.to_string());
        assert_eq!(secret_ref(migrate, "MANGO_DATABASE_URL"), want, "{name}");
        assert_eq!(secret_ref(serve, "MANGO_DATABASE_URL"), want, "{name}");

        // Its settings, and the Service in front of it.
        let config = named!(release, ConfigMap, "mango-api");
        let data = config.data.as_ref().unwrap();
        assert_eq!(data["MANGO_LISTEN_ADDR"], "0.0.0.0:8080");
        for c in [migrate, serve] {
            let from = c.env_from.as_ref().unwrap();
            assert_eq!(
                from[0].config_map_ref.as_ref().map(|c| c.name.as_str()),
                Some("mango-api")
            );
        }
        let service = named!(release, Service, "mango-api");
        let sspec = service.spec.as_ref().unwrap();
        let selector = LabelSelector {
            match_labels: sspec.selector.clone(),
            match_expressions: None,
        };
        for (pod_name, t) in workload_pods(release) {
            assert_eq!(
                selects(&selector, &labels_of(&t)),
                pod_name == "mango-api",
                "{name}: {pod_name}"
            );
        }
        let sport = &sspec.ports.as_ref().unwrap()[0];
        assert_eq!(sport.target_port, Some(IntOrString::String("http".into())));
        assert_eq!(
            serve.ports.as_ref().unwrap()[0].name.as_deref(),
            Some("http")
        );
        let ready = serve
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap();
        assert_eq!(ready.path.as_deref(), Some("/readyz"));
    }
    // The model endpoint's key, when given, is a Secret reference too.
    let serve = &pod_spec(template(named!(r.full, Deployment, "mango-api"))).containers[0];
    assert_eq!(
        secret_ref(serve, "MANGO_MODEL_API_KEY"),
        ("model-key".to_string(), "api-key".to_string())
    );
    assert_eq!(
        named!(r.full, ConfigMap, "mango-api")
            .data
            .as_ref()
            .unwrap()["MANGO_MODEL_BASE_URL"],
        "https://model.example.com"
    );
}

/// The chart's WorkerPool: the in-cluster api by default, every value
/// carried into its spec, and valid as the controller checks pools.
#[test]
fn the_pool_defaults_to_the_in_cluster_api_and_is_valid() {
    let Some(r) = renders() else { return };
    assert!(
        all_of!(r.default, WorkerPool).is_empty(),
        "no pool unless enabled"
    );
    let production = all_of!(r.production, WorkerPool);
    assert_eq!(production.len(), 1);
    let pool = production[0];
    assert_eq!(pool.spec.api_url.as_deref(), Some(API_URL));
    assert_eq!(pool.spec.runtime_class_name.as_deref(), Some("gvisor"));
    pod::validate(pool).expect("the production pool is valid");

    let pool = all_of!(r.full, WorkerPool)[0];
    pod::validate(pool).expect("the full pool is valid");
    assert_eq!(pool.spec.api_url.as_deref(), Some(API_URL));
    assert_eq!(
        pool.spec.sandbox_api_url.as_deref(),
        Some("http://sandbox-api.agents.svc:8080")
    );
    assert_eq!(pool.spec.environment_key_secret.name, "pool-key");
    assert_eq!(pool.spec.environment_key_secret.key(), "environment-key");
    assert_eq!(pool.spec.max_concurrency, 9);
    assert_eq!(pool.spec.runtime_class_name.as_deref(), Some("kata"));
    assert_eq!(pool.spec.active_deadline_seconds, Some(600));
    assert_eq!(pool.spec.start_timeout_seconds, Some(60));
    assert_eq!(pool.spec.keep_idle, Some(900), "pool.keepIdle");
    assert_eq!(pool.spec.warm_replicas(), 3, "pool.warm.replicas");
    assert_eq!(
        pool.spec.warm_max_age(),
        std::time::Duration::from_secs(600),
        "pool.warm.maxAge"
    );
    assert_eq!(production[0].spec.warm, None, "no warm Pods by default");
    assert_eq!(
        production[0].spec.keep_idle,
        Some(0),
        "nothing kept by default"
    );
    assert_eq!(pool.spec.pod.run_as_user, Some(1000));
    assert_eq!(
        pool.spec.workspace.size.as_ref().map(|q| q.0.as_str()),
        Some("5Gi")
    );
}

/// The trial PostgreSQL: one replica, its password from the generated
/// Secret, reachable from the api Pods only.
#[test]
fn the_trial_postgresql_is_single_and_guarded() {
    let Some(r) = renders() else { return };
    assert!(
        all_of!(r.production, StatefulSet).is_empty(),
        "production brings its own"
    );
    let release = &r.default;
    let set = named!(release, StatefulSet, "mango-postgresql");
    let spec = set.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.service_name.as_deref(), Some("mango-postgresql"));
    let pod = spec.template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    // The password is a file of the mounted Secret, not an environment variable.
    assert!(c
        .env
        .iter()
        .flatten()
        .all(|e| e.name != "POSTGRES_PASSWORD"));
    assert_eq!(
        env_value(c, "POSTGRES_PASSWORD_FILE"),
        "/run/secrets/postgresql/password"
    );
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/run/secrets/postgresql")
        .expect("the password's mount");
    assert_eq!(mount.read_only, Some(true));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .and_then(|v| v.secret.as_ref())
        .expect("a Secret volume");
    assert_eq!(volume.secret_name.as_deref(), Some("mango-postgresql"));
    assert_eq!(volume.default_mode, Some(0o440));
    let items = volume.items.as_ref().unwrap();
    assert_eq!(
        (items[0].key.as_str(), items[0].path.as_str()),
        ("password", "password")
    );
    let claims = spec.volume_claim_templates.as_ref().unwrap();
    assert_eq!(claims[0].metadata.name.as_deref(), Some("data"));

    let policy = named!(release, NetworkPolicy, "mango-postgresql");
    let pspec = policy.spec.as_ref().unwrap();
    assert!(selects(
        pspec.pod_selector.as_ref().unwrap(),
        &labels_of(&spec.template)
    ));
    let ingress = pspec.ingress.as_ref().unwrap();
    assert_eq!(ingress.len(), 1);
    let from = ingress[0].from.as_ref().unwrap();
    for (pod_name, t) in workload_pods(release) {
        assert_eq!(
            selects(from[0].pod_selector.as_ref().unwrap(), &labels_of(&t)),
            pod_name == "mango-api",
            "only the api reaches PostgreSQL ({pod_name})"
        );
    }
    let ports: Vec<_> = ingress[0].ports.iter().flatten().map(port).collect();
    assert_eq!(ports, [("TCP".to_string(), 5432)]);
}
