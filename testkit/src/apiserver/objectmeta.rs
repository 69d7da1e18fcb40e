//! `metadata` as every kind validates it: `ValidateObjectMeta` and
//! `ValidateObjectMetaUpdate` (k8s.io/apimachinery/pkg/api/validation/
//! objectmeta.go), with the kind's name rule.

use super::errors::FieldError;
use super::names;
use super::resources::{NameRule, ResourceType};
use serde_json::{json, Value};

/// Finalizers every object may carry without a domain
/// (`standardFinalizers` in pkg/apis/core/validation).
const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];

pub fn name_errors(rule: NameRule, name: &str) -> Vec<String> {
    match rule {
        NameRule::Subdomain => names::dns1123_subdomain(name),
        NameRule::Label => names::dns1123_label(name),
    }
}

pub fn validate(rt: &ResourceType, object: &Value) -> Vec<FieldError> {
    let meta = &object["metadata"];
    let mut errs = Vec::new();
    match meta["name"].as_str() {
        Some(name) if !name.is_empty() => {
            for msg in name_errors(rt.name_rule, name) {
                errs.push(FieldError::invalid("metadata.name", json!(name), msg));
            }
        }
        _ => errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
    }
    let namespace = meta["namespace"].as_str().unwrap_or("");
    if rt.namespaced {
        if namespace.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else {
            for msg in names::dns1123_label(namespace) {
                errs.push(FieldError::invalid(
                    "metadata.namespace",
                    json!(namespace),
                    msg,
                ));
            }
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    if let Some(labels) = meta["labels"].as_object() {
        errs.extend(names::validate_labels(labels, "metadata.labels"));
    }
    if let Some(annotations) = meta["annotations"].as_object() {
        errs.extend(names::validate_annotations(
            annotations,
            "metadata.annotations",
        ));
    }
    errs.extend(owner_references(meta));
    for (i, finalizer) in meta["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = finalizer.as_str().unwrap_or_default();
        let path = format!("metadata.finalizers[{i}]");
        let msgs = names::qualified_name(name);
        if !msgs.is_empty() {
            for msg in msgs {
                errs.push(FieldError::invalid(&path, json!(name), msg));
            }
        } else if !name.contains('/') && !STANDARD_FINALIZERS.contains(&name) {
            errs.push(FieldError::invalid(
                "metadata.finalizers",
                json!(name),
                "name is neither a standard finalizer name nor is it fully qualified".into(),
            ));
        }
    }
    errs
}

fn owner_references(meta: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut controllers = Vec::new();
    for (i, owner) in meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("metadata.ownerReferences[{i}]");
        for field in ["apiVersion", "kind", "name", "uid"] {
            if owner[field].as_str().is_none_or(str::is_empty) {
                errs.push(FieldError::invalid(
                    &format!("{path}.{field}"),
                    owner[field].clone(),
                    format!("{field} must not be empty"),
                ));
            }
        }
        if owner["controller"] == json!(true) {
            controllers.push(owner["name"].as_str().unwrap_or_default().to_string());
        }
    }
    if controllers.len() > 1 {
        errs.push(FieldError::invalid(
            "metadata.ownerReferences",
            json!(meta["ownerReferences"]),
            format!(
                "Only one reference can have Controller set to true. Found \"true\" in references for {}",
                controllers.join(" and ")
            ),
        ));
    }
    errs
}

/// `ValidateObjectMetaUpdate`: what may not change.
pub fn validate_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        let (before, after) = (&old["metadata"][field], &new["metadata"][field]);
        if before != after {
            errs.push(FieldError::invalid(
                &format!("metadata.{field}"),
                after.clone(),
                "field is immutable".into(),
            ));
        }
    }
    if !old["metadata"]["deletionTimestamp"].is_null() {
        let before: Vec<&Value> = old["metadata"]["finalizers"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let added: Vec<String> = new["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| !before.contains(f))
            .map(|f| format!("{f}"))
            .collect();
        if !added.is_empty() {
            errs.push(FieldError::forbidden(
                "metadata.finalizers",
                &format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    added.join(", ")
                ),
            ));
        }
    }
    errs
}
