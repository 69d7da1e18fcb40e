//! Pods as the apiserver admits them: fields behind feature gates that are
//! off dropped (pkg/api/pod/util.go `dropDisabledFields`), defaults set
//! (pkg/apis/core/v1/defaults.go and the ServiceAccount, Priority and
//! DefaultTolerationSeconds admission plugins), status reset
//! (pkg/registry/core/pod/strategy.go), then validated for the fields the
//! controller sets (pkg/apis/core/validation/validation.go:
//! `ValidatePodCreate`, `ValidatePodSpec`, `validateContainers`,
//! `ValidateVolumes`, `validatePodSecurityContext`, `ValidateResourceRequirements`),
//! and on update only images and the deadline may change
//! (`ValidatePodUpdate`).

use super::errors::FieldError;
use super::names;
use super::quantity;
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashSet};

/// Feature gates whose off state changes what the apiserver stores.
#[derive(Debug, Clone, Default)]
pub struct Gates {
    pub enabled: BTreeSet<String>,
}

/// Gate → the Pod fields `dropDisabledFields` clears while it is off
/// (defaults for 1.30–1.32: all three off).
const GATED_FIELDS: [(&str, &[&str]); 3] = [
    ("UserNamespacesSupport", &["spec", "hostUsers"]),
    ("PodLevelResources", &["spec", "resources"]),
    (
        "SupplementalGroupsPolicy",
        &["spec", "securityContext", "supplementalGroupsPolicy"],
    ),
];

impl Gates {
    pub fn on(&self, gate: &str) -> bool {
        self.enabled.contains(gate)
    }
}

/// Clears fields of gates that are off, unless the old Pod already used them.
pub fn drop_disabled_fields(pod: &mut Value, old: Option<&Value>, gates: &Gates) {
    for (gate, path) in GATED_FIELDS {
        if gates.on(gate) {
            continue;
        }
        let in_use = old.is_some_and(|o| lookup(o, path).is_some());
        if in_use {
            continue;
        }
        let (last, init) = path.split_last().expect("a path");
        let parent: String = init.iter().map(|p| format!("/{p}")).collect();
        if let Some(map) = pod.pointer_mut(&parent).and_then(Value::as_object_mut) {
            map.remove(*last);
        }
    }
}

fn lookup<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut at = value;
    for part in path {
        at = at.get(*part)?;
    }
    (!at.is_null()).then_some(at)
}

fn set_default(map: &mut Map<String, Value>, key: &str, value: Value) {
    if map.get(key).is_none_or(Value::is_null) {
        map.insert(key.into(), value);
    }
}

/// `:latest` or no tag pulls Always, anything else IfNotPresent.
fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        _ => "IfNotPresent",
    }
}

fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let limits = &c["resources"]["limits"];
        let requests = &c["resources"]["requests"];
        if limits.as_object().is_some_and(|m| !m.is_empty())
            || requests.as_object().is_some_and(|m| !m.is_empty())
        {
            any = true;
        }
        for resource in ["cpu", "memory"] {
            let limit = limits.get(resource).and_then(|q| quantity::of_json(q).ok());
            let request = requests
                .get(resource)
                .and_then(|q| quantity::of_json(q).ok());
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        _ => "Burstable",
    }
}

/// Defaults and admission on create, and the status a new Pod has.
pub fn prepare_create(pod: &mut Value, gates: &Gates) {
    drop_disabled_fields(pod, None, gates);
    if let Some(spec) = pod["spec"].as_object_mut() {
        set_default(spec, "restartPolicy", json!("Always"));
        set_default(spec, "dnsPolicy", json!("ClusterFirst"));
        set_default(spec, "schedulerName", json!("default-scheduler"));
        set_default(spec, "terminationGracePeriodSeconds", json!(30));
        set_default(spec, "securityContext", json!({}));
        set_default(spec, "enableServiceLinks", json!(true));
        set_default(spec, "serviceAccountName", json!("default"));
        let account = spec["serviceAccountName"].clone();
        spec.insert("serviceAccount".into(), account);
        set_default(spec, "priority", json!(0));
        set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
        let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
        if let Some(list) = tolerations.as_array_mut() {
            for key in [
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
            ] {
                if !list.iter().any(|t| t["key"] == key) {
                    list.push(
                        json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                                     "tolerationSeconds": 300}),
                    );
                }
            }
        }
        for list in ["containers", "initContainers"] {
            for c in spec
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let Some(c) = c.as_object_mut() else { continue };
                let image = c["image"].as_str().unwrap_or_default().to_string();
                set_default(c, "imagePullPolicy", json!(default_pull_policy(&image)));
                set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
                set_default(c, "terminationMessagePolicy", json!("File"));
                // Requests default to limits (SetDefaults_Pod).
                if let Some(limits) = c
                    .get("resources")
                    .and_then(|r| r.get("limits"))
                    .and_then(Value::as_object)
                    .cloned()
                {
                    let resources = c.entry("resources").or_insert_with(|| json!({}));
                    let requests = resources
                        .as_object_mut()
                        .expect("resources")
                        .entry("requests")
                        .or_insert_with(|| json!({}));
                    if let Some(requests) = requests.as_object_mut() {
                        for (k, v) in limits {
                            requests.entry(k).or_insert(v);
                        }
                    }
                }
                for port in c
                    .get_mut("ports")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    if let Some(port) = port.as_object_mut() {
                        set_default(port, "protocol", json!("TCP"));
                    }
                }
            }
        }
    }
    let qos = qos_class(&pod["spec"]);
    pod["status"] = json!({"phase": "Pending", "qosClass": qos});
}

/// Quantities that do not parse fail decoding (400), before validation.
pub fn decode_error(pod: &Value) -> Option<String> {
    let mut all: Vec<&Value> = Vec::new();
    for list in ["containers", "initContainers"] {
        for c in pod["spec"][list].as_array().into_iter().flatten() {
            for part in ["limits", "requests"] {
                all.extend(
                    c["resources"][part]
                        .as_object()
                        .into_iter()
                        .flat_map(|m| m.values()),
                );
            }
        }
    }
    for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        if let Some(q) = v["emptyDir"].get("sizeLimit") {
            all.push(q);
        }
    }
    all.into_iter()
        .find_map(|q| quantity::of_json(q).err())
        .map(|e| format!("Pod in version \"v1\" cannot be handled as a Pod: {e}"))
}

const RESTART_POLICIES: [&str; 3] = ["Always", "OnFailure", "Never"];
const PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];
const DNS_POLICIES: [&str; 4] = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const VOLUME_SOURCES: [&str; 12] = [
    "emptyDir",
    "persistentVolumeClaim",
    "secret",
    "configMap",
    "projected",
    "hostPath",
    "downwardAPI",
    "ephemeral",
    "csi",
    "nfs",
    "image",
    "iscsi",
];

fn check_id(errs: &mut Vec<FieldError>, path: &str, value: &Value) {
    if let Some(id) = value.as_i64() {
        if let Some(msg) = names::id_range(id) {
            errs.push(FieldError::invalid(path, value.clone(), msg));
        }
    }
}

fn security_context(errs: &mut Vec<FieldError>, path: &str, sc: &Value, pod_level: bool) {
    check_id(errs, &format!("{path}.runAsUser"), &sc["runAsUser"]);
    check_id(errs, &format!("{path}.runAsGroup"), &sc["runAsGroup"]);
    if pod_level {
        check_id(errs, &format!("{path}.fsGroup"), &sc["fsGroup"]);
        for (i, g) in sc["supplementalGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            check_id(errs, &format!("{path}.supplementalGroups[{i}]"), g);
        }
        if let Some(policy) = sc["fsGroupChangePolicy"].as_str() {
            if !["OnRootMismatch", "Always"].contains(&policy) {
                errs.push(FieldError::not_supported(
                    &format!("{path}.fsGroupChangePolicy"),
                    json!(policy),
                    &["OnRootMismatch", "Always"],
                ));
            }
        }
    } else if sc["privileged"] == json!(true) && sc["allowPrivilegeEscalation"] == json!(false) {
        errs.push(FieldError::invalid(
            path,
            sc.clone(),
            "cannot set `allowPrivilegeEscalation` to false and `privileged` to true".into(),
        ));
    }
    if let Some(profile) = sc["seccompProfile"].as_object() {
        let kind = profile.get("type").and_then(Value::as_str).unwrap_or("");
        let field = format!("{path}.seccompProfile.type");
        match kind {
            "RuntimeDefault" | "Unconfined" => {
                if profile
                    .get("localhostProfile")
                    .is_some_and(|v| !v.is_null())
                {
                    errs.push(FieldError::invalid(
                        &format!("{path}.seccompProfile.localhostProfile"),
                        profile["localhostProfile"].clone(),
                        "can only be set if `type` is \"Localhost\"".into(),
                    ));
                }
            }
            "Localhost" => {
                if profile
                    .get("localhostProfile")
                    .and_then(Value::as_str)
                    .is_none()
                {
                    errs.push(FieldError::required(
                        &format!("{path}.seccompProfile.localhostProfile"),
                        "must be set when seccomp type is Localhost",
                    ));
                }
            }
            "" => errs.push(FieldError::required(&field, "")),
            other => errs.push(FieldError::not_supported(
                &field,
                json!(other),
                &["Localhost", "RuntimeDefault", "Unconfined"],
            )),
        }
    }
}

fn standard_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "ephemeral-storage" | "storage")
        || name.starts_with("hugepages-")
        || name.contains('/')
}

fn resources(errs: &mut Vec<FieldError>, path: &str, resources: &Value) {
    let mut values: [Map<String, Value>; 2] = Default::default();
    for (slot, part) in ["limits", "requests"].iter().enumerate() {
        for (name, q) in resources[*part].as_object().into_iter().flatten() {
            let field = format!("{path}.{part}[{name}]");
            if !standard_resource(name) {
                errs.push(FieldError::invalid(
                    &field,
                    json!(name),
                    "must be a standard resource type or fully qualified".into(),
                ));
            }
            if let Ok(v) = quantity::of_json(q) {
                if v < 0.0 {
                    errs.push(FieldError::invalid(
                        &field,
                        q.clone(),
                        "must be greater than or equal to 0".into(),
                    ));
                }
                values[slot].insert(name.clone(), json!(v));
            }
        }
    }
    let [limits, requests] = &values;
    for (name, request) in requests {
        if let Some(limit) = limits.get(name) {
            if request.as_f64() > limit.as_f64() {
                errs.push(FieldError::invalid(
                    &format!("{path}.requests"),
                    resources["requests"][name].clone(),
                    format!(
                        "must be less than or equal to {name} limit of {}",
                        resources["limits"][name].as_str().unwrap_or_default()
                    ),
                ));
            }
        }
    }
}

fn volumes(errs: &mut Vec<FieldError>, spec: &Value) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (i, v) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        let path = format!("spec.volumes[{i}]");
        let name = v["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            errs.push(FieldError::required(&format!("{path}.name"), ""));
        } else {
            for msg in names::dns1123_label(name) {
                errs.push(FieldError::invalid(
                    &format!("{path}.name"),
                    json!(name),
                    msg,
                ));
            }
            if !seen.insert(name.to_string()) {
                errs.push(FieldError::duplicate(&format!("{path}.name"), json!(name)));
            }
        }
        let sources: Vec<&str> = VOLUME_SOURCES
            .iter()
            .copied()
            .filter(|s| v.get(*s).is_some_and(|x| !x.is_null()))
            .collect();
        match sources.len() {
            0 => errs.push(FieldError::required(&path, "must specify a volume type")),
            1 => {}
            _ => errs.push(FieldError::forbidden(
                &format!("{path}.{}", sources[1]),
                "may not specify more than 1 volume type",
            )),
        }
        if let Some(claim) = v.get("persistentVolumeClaim") {
            if claim["claimName"].as_str().is_none_or(str::is_empty) {
                errs.push(FieldError::required(
                    &format!("{path}.persistentVolumeClaim.claimName"),
                    "",
                ));
            }
        }
        if let Some(medium) = v["emptyDir"]["medium"].as_str() {
            if !["", "Memory", "HugePages"].contains(&medium) && !medium.starts_with("HugePages-") {
                errs.push(FieldError::not_supported(
                    &format!("{path}.emptyDir.medium"),
                    json!(medium),
                    &["", "Memory", "HugePages"],
                ));
            }
        }
    }
    seen
}

fn containers(errs: &mut Vec<FieldError>, spec: &Value, volumes: &HashSet<String>) {
    let mut names_seen = HashSet::new();
    let list = spec["containers"].as_array();
    if list.is_none_or(Vec::is_empty) {
        errs.push(FieldError::required("spec.containers", ""));
    }
    for (kind, list) in [
        ("containers", list),
        ("initContainers", spec["initContainers"].as_array()),
    ] {
        for (i, c) in list.into_iter().flatten().enumerate() {
            let path = format!("spec.{kind}[{i}]");
            let name = c["name"].as_str().unwrap_or_default();
            if name.is_empty() {
                errs.push(FieldError::required(&format!("{path}.name"), ""));
            } else {
                for msg in names::dns1123_label(name) {
                    errs.push(FieldError::invalid(
                        &format!("{path}.name"),
                        json!(name),
                        msg,
                    ));
                }
                if !names_seen.insert(name.to_string()) {
                    errs.push(FieldError::duplicate(&format!("{path}.name"), json!(name)));
                }
            }
            match c["image"].as_str() {
                None | Some("") => errs.push(FieldError::required(&format!("{path}.image"), "")),
                Some(image) if image.trim() != image => errs.push(FieldError::invalid(
                    &format!("{path}.image"),
                    json!(image),
                    "must not have leading or trailing whitespace".into(),
                )),
                Some(_) => {}
            }
            if let Some(policy) = c["imagePullPolicy"].as_str() {
                if !PULL_POLICIES.contains(&policy) {
                    errs.push(FieldError::not_supported(
                        &format!("{path}.imagePullPolicy"),
                        json!(policy),
                        &PULL_POLICIES,
                    ));
                }
            }
            for (j, var) in c["env"].as_array().into_iter().flatten().enumerate() {
                let var_path = format!("{path}.env[{j}]");
                let var_name = var["name"].as_str().unwrap_or_default();
                if var_name.is_empty() {
                    errs.push(FieldError::required(&format!("{var_path}.name"), ""));
                }
                for msg in names::env_var_name(var_name) {
                    errs.push(FieldError::invalid(
                        &format!("{var_path}.name"),
                        json!(var_name),
                        msg,
                    ));
                }
                if var.get("value").is_some_and(|v| !v.is_null())
                    && var.get("valueFrom").is_some_and(|v| !v.is_null())
                {
                    errs.push(FieldError::invalid(
                        &format!("{var_path}.valueFrom"),
                        json!(""),
                        "may not be specified when `value` is not empty".into(),
                    ));
                }
            }
            resources(errs, &format!("{path}.resources"), &c["resources"]);
            let mut mount_paths = HashSet::new();
            for (j, m) in c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let mount = format!("{path}.volumeMounts[{j}]");
                let volume = m["name"].as_str().unwrap_or_default();
                if volume.is_empty() {
                    errs.push(FieldError::required(&format!("{mount}.name"), ""));
                } else if !volumes.contains(volume) {
                    errs.push(FieldError::not_found(
                        &format!("{mount}.name"),
                        json!(volume),
                    ));
                }
                let at = m["mountPath"].as_str().unwrap_or_default();
                if at.is_empty() {
                    errs.push(FieldError::required(&format!("{mount}.mountPath"), ""));
                } else if !mount_paths.insert(at.to_string()) {
                    errs.push(FieldError::invalid(
                        &format!("{mount}.mountPath"),
                        json!(at),
                        "must be unique".into(),
                    ));
                }
            }
            if let Some(sc) = c.get("securityContext").filter(|v| v.is_object()) {
                security_context(errs, &format!("{path}.securityContext"), sc, false);
            }
        }
    }
}

pub fn validate(pod: &Value) -> Vec<FieldError> {
    let spec = &pod["spec"];
    let mut errs = Vec::new();
    if !spec.is_object() {
        errs.push(FieldError::required("spec", ""));
        return errs;
    }
    let volumes = volumes(&mut errs, spec);
    containers(&mut errs, spec, &volumes);
    if let Some(policy) = spec["restartPolicy"].as_str() {
        if !RESTART_POLICIES.contains(&policy) {
            errs.push(FieldError::not_supported(
                "spec.restartPolicy",
                json!(policy),
                &RESTART_POLICIES,
            ));
        }
    }
    if let Some(policy) = spec["dnsPolicy"].as_str() {
        if !DNS_POLICIES.contains(&policy) {
            errs.push(FieldError::not_supported(
                "spec.dnsPolicy",
                json!(policy),
                &DNS_POLICIES,
            ));
        }
    }
    if let Some(deadline) = spec["activeDeadlineSeconds"].as_i64() {
        if !(1..=i64::from(i32::MAX)).contains(&deadline) {
            errs.push(FieldError::invalid(
                "spec.activeDeadlineSeconds",
                json!(deadline),
                names::inclusive_range(1, i64::from(i32::MAX)),
            ));
        }
    }
    if let Some(grace) = spec["terminationGracePeriodSeconds"].as_i64() {
        if grace < 0 {
            errs.push(FieldError::invalid(
                "spec.terminationGracePeriodSeconds",
                json!(grace),
                "must be greater than or equal to 0".into(),
            ));
        }
    }
    if let Some(sc) = spec.get("securityContext").filter(|v| v.is_object()) {
        security_context(&mut errs, "spec.securityContext", sc, true);
    }
    if spec["hostUsers"] == json!(false) {
        for host in ["hostNetwork", "hostPID", "hostIPC"] {
            if spec[host] == json!(true) {
                errs.push(FieldError::forbidden(
                    &format!("spec.{host}"),
                    "when `hostUsers` is false, `hostNetwork`, `hostPID` and `hostIPC` must be false",
                ));
            }
        }
    }
    if let Some(selector) = spec["nodeSelector"].as_object() {
        errs.extend(names::validate_labels(selector, "spec.nodeSelector"));
    }
    for (i, t) in spec["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("spec.tolerations[{i}]");
        if let Some(op) = t["operator"].as_str() {
            if !["Exists", "Equal"].contains(&op) {
                errs.push(FieldError::not_supported(
                    &format!("{path}.operator"),
                    json!(op),
                    &["Equal", "Exists"],
                ));
            }
        }
        if let Some(effect) = t["effect"].as_str() {
            if !["NoSchedule", "PreferNoSchedule", "NoExecute", ""].contains(&effect) {
                errs.push(FieldError::not_supported(
                    &format!("{path}.effect"),
                    json!(effect),
                    &["NoExecute", "NoSchedule", "PreferNoSchedule"],
                ));
            }
        }
        if let Some(key) = t["key"].as_str().filter(|k| !k.is_empty()) {
            for msg in names::qualified_name(key) {
                errs.push(FieldError::invalid(&format!("{path}.key"), json!(key), msg));
            }
        }
    }
    errs
}

/// `ValidatePodUpdate`: a Pod's spec is fixed once made, but for its
/// containers' images, a deadline that may only shrink (or be added), and
/// added tolerations.
pub fn validate_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut before = old["spec"].clone();
    let mut after = new["spec"].clone();
    for spec in [&mut before, &mut after] {
        for list in ["containers", "initContainers"] {
            for c in spec
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(c) = c.as_object_mut() {
                    c.remove("image");
                }
            }
        }
        if let Some(map) = spec.as_object_mut() {
            map.remove("activeDeadlineSeconds");
            map.remove("tolerations");
        }
    }
    let mut errs = Vec::new();
    let old_deadline = old["spec"]["activeDeadlineSeconds"].as_i64();
    let new_deadline = new["spec"]["activeDeadlineSeconds"].as_i64();
    let deadline_ok = match (old_deadline, new_deadline) {
        (Some(o), Some(n)) => n <= o,
        (Some(_), None) => false,
        _ => true,
    };
    if before != after || !deadline_ok {
        errs.push(FieldError::forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {
            "containers": [{"name": "runner", "image": "img:1",
                "resources": {"limits": {"cpu": "1", "memory": "512Mi"}},
                "volumeMounts": [{"name": "w", "mountPath": "/w"}]}],
            "volumes": [{"name": "w", "emptyDir": {}}]}})
    }

    #[test]
    fn a_hardened_pod_passes_and_is_defaulted() {
        let mut p = pod();
        p["spec"]["hostUsers"] = json!(false);
        prepare_create(&mut p, &Gates::default());
        assert!(validate(&p).is_empty(), "{:?}", validate(&p));
        assert!(
            p["spec"].get("hostUsers").is_none(),
            "dropped with the gate off"
        );
        assert_eq!(
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "1"
        );
        assert_eq!(p["status"]["qosClass"], "Guaranteed");
        assert_eq!(
            p["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        let mut kept = pod();
        kept["spec"]["hostUsers"] = json!(false);
        prepare_create(
            &mut kept,
            &Gates {
                enabled: ["UserNamespacesSupport".to_string()].into(),
            },
        );
        assert_eq!(kept["spec"]["hostUsers"], false);
    }

    #[test]
    fn each_bound_is_refused_past_its_edge() {
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "/spec/activeDeadlineSeconds",
                json!(0),
                "spec.activeDeadlineSeconds",
            ),
            (
                "/spec/activeDeadlineSeconds",
                json!(2147483648i64),
                "spec.activeDeadlineSeconds",
            ),
            (
                "/spec/securityContext",
                json!({"runAsUser": 2147483648i64}),
                "spec.securityContext.runAsUser",
            ),
            (
                "/spec/securityContext",
                json!({"fsGroup": -1}),
                "spec.securityContext.fsGroup",
            ),
            (
                "/spec/containers/0/name",
                json!("Runner"),
                "spec.containers[0].name",
            ),
            (
                "/spec/containers/0/volumeMounts/0/name",
                json!("nope"),
                "spec.containers[0].volumeMounts[0].name",
            ),
            (
                "/spec/restartPolicy",
                json!("Sometimes"),
                "spec.restartPolicy",
            ),
            (
                "/spec/containers/0/resources",
                json!({"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}),
                "spec.containers[0].resources.requests",
            ),
        ];
        for (pointer, value, field) in cases {
            let mut p = pod();
            let (parent, last) = pointer.rsplit_once('/').unwrap();
            let slot = p.pointer_mut(parent).unwrap_or_else(|| panic!("{pointer}"));
            match slot {
                Value::Array(items) => items[last.parse::<usize>().unwrap()] = value.clone(),
                other => other[last] = value.clone(),
            }
            let errs = validate(&p);
            assert!(
                errs.iter().any(|e| e.field == field),
                "{pointer}={value}: {errs:?}"
            );
        }
        let mut edge = pod();
        edge["spec"]["activeDeadlineSeconds"] = json!(2147483647i64);
        edge["spec"]["securityContext"] = json!({"runAsUser": 2147483647i64, "fsGroup": 0});
        assert!(validate(&edge).is_empty(), "{:?}", validate(&edge));
    }
}
