//! Discovery enough for kube-rs and kubectl: `/version`, `/api`, `/apis`
//! and each group version's resource list (the legacy, unaggregated
//! documents of apiserver/pkg/endpoints/discovery).

use super::errors::ApiError;
use super::resources::{ResourceType, ALL};
use super::Shared;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

fn verbs(_rt: &ResourceType) -> Value {
    json!([
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch"
    ])
}

fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served: Vec<&ResourceType> = ALL
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for rt in &served {
        resources.push(
            json!({"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
            "kind": rt.kind, "verbs": verbs(rt), "shortNames": rt.short_names}),
        );
        if rt.status {
            resources.push(
                json!({"name": format!("{}/status", rt.plural), "singularName": "",
                "namespaced": rt.namespaced, "kind": rt.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if rt.plural == "pods" {
            resources.push(
                json!({"name": "pods/attach", "singularName": "", "namespaced": true,
                "kind": "PodAttachOptions", "verbs": ["create", "get"]}),
            );
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                "resources": resources}),
    )
}

fn group(name: &str) -> Option<Value> {
    let versions: Vec<&str> = ALL
        .iter()
        .filter(|r| r.group == name)
        .map(|r| r.version)
        .collect();
    let first = versions.first()?;
    let gv = |v: &str| json!({"groupVersion": format!("{name}/{v}"), "version": v});
    let mut unique: Vec<&str> = versions.clone();
    unique.dedup();
    Some(
        json!({"name": name, "versions": unique.iter().map(|v| gv(v)).collect::<Vec<_>>(),
                "preferredVersion": gv(first)}),
    )
}

pub fn answer(shared: &Shared, path: &[String]) -> Response {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let body = match p.as_slice() {
        ["version"] => {
            let minor = shared.lock().options.minor;
            Some(json!({"major": "1", "minor": minor.to_string(),
                "gitVersion": format!("v1.{minor}.0"), "platform": "linux/amd64"}))
        }
        ["api"] => Some(json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})),
        ["api", version] => resource_list("", version),
        ["apis"] => {
            let mut names: Vec<&str> = ALL
                .iter()
                .map(|r| r.group)
                .filter(|g| !g.is_empty())
                .collect();
            names.sort();
            names.dedup();
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1",
                "groups": names.iter().filter_map(|n| group(n)).collect::<Vec<_>>()}))
        }
        ["apis", name] => group(name).map(|mut g| {
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            g
        }),
        ["apis", name, version] => resource_list(name, version),
        _ => None,
    };
    match body {
        Some(body) => Json(body).into_response(),
        None => ApiError::no_route().into_response(),
    }
}
