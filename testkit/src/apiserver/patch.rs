//! The three non-apply patch types, told apart by content type as the
//! apiserver's patch handler does (apiserver/pkg/endpoints/handlers/
//! patch.go): JSON merge patch (RFC 7386), JSON patch (RFC 6902), and
//! strategic merge patch, which built-in kinds only accept
//! (apimachinery/pkg/util/strategicpatch): lists with a patch merge key
//! merge by that key, `finalizers` merge as a set, `$patch`,
//! `$retainKeys` and `$deleteFromPrimitiveList` directives.

use serde_json::{Map, Value};

pub const MERGE: &str = "application/merge-patch+json";
pub const JSON_PATCH: &str = "application/json-patch+json";
pub const STRATEGIC: &str = "application/strategic-merge-patch+json";
pub const APPLY_YAML: &str = "application/apply-patch+yaml";
pub const APPLY_CBOR: &str = "application/apply-patch+cbor";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    /// The patch type of a `Content-Type` (parameters ignored).
    pub fn of(content_type: &str) -> Option<PatchType> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            MERGE => Some(PatchType::Merge),
            JSON_PATCH => Some(PatchType::Json),
            STRATEGIC => Some(PatchType::Strategic),
            APPLY_YAML => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// RFC 7386.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(patch) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let map = target.as_object_mut().expect("an object");
            for (key, value) in patch {
                if value.is_null() {
                    map.remove(key);
                } else {
                    merge(map.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The patch merge key of a built-in list field, by its name
/// (`patchMergeKey` in k8s.io/api's types).
pub fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        _ => return None,
    })
}

/// Lists of scalars merged as sets (`patchStrategy:"merge"`).
fn primitive_merge(field: &str) -> bool {
    field == "finalizers"
}

/// A strategic merge patch on a built-in object.
pub fn strategic(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => return Err(format!("Unknown patch type: {other}")),
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let map = target.as_object_mut().expect("an object");
    if let Some(retain) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        map.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (key, value) in patch {
        if key == "$retainKeys" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let drop: Vec<&Value> = value
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            if let Some(Value::Array(list)) = map.get_mut(field) {
                list.retain(|v| !drop.contains(&v));
            }
            continue;
        }
        if value.is_null() {
            map.remove(key);
            continue;
        }
        match value {
            Value::Array(items) if merge_key(key).is_some() => {
                let merge_key = merge_key(key).expect("a merge key");
                let existing = map.entry(key.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(existing, items, merge_key)?;
            }
            Value::Array(items) if primitive_merge(key) => {
                let existing = map.entry(key.clone()).or_insert(Value::Array(Vec::new()));
                if let Value::Array(list) = existing {
                    for item in items {
                        if !list.contains(item) {
                            list.push(item.clone());
                        }
                    }
                } else {
                    *existing = Value::Array(items.clone());
                }
            }
            Value::Object(_) => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                strategic(slot, value)?;
                if slot.is_null() {
                    map.remove(key);
                }
            }
            other => {
                map.insert(key.clone(), other.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(existing: &mut Value, items: &[Value], merge_key: &str) -> Result<(), String> {
    if !existing.is_array() {
        *existing = Value::Array(Vec::new());
    }
    let list = existing.as_array_mut().expect("an array");
    // `[{"$patch": "replace"}, …]` replaces the whole list.
    if items.iter().any(|i| {
        i.get("$patch").and_then(Value::as_str) == Some("replace") && i.get(merge_key).is_none()
    }) {
        *list = items
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .cloned()
            .collect();
        return Ok(());
    }
    for item in items {
        let Some(key) = item.get(merge_key) else {
            return Err(format!(
                "map: {item} does not contain declared merge key: {merge_key}"
            ));
        };
        let at = list.iter().position(|e| e.get(merge_key) == Some(key));
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(at) = at {
                list.remove(at);
            }
            continue;
        }
        match at {
            Some(at) => strategic(&mut list[at], item)?,
            None => {
                let mut fresh = Value::Object(Map::new());
                strategic(&mut fresh, item)?;
                list.push(fresh);
            }
        }
    }
    Ok(())
}

fn pointer_parts(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!("invalid JSON pointer: {pointer}"));
    };
    Ok(rest
        .split('/')
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn parent<'a>(doc: &'a mut Value, parts: &[String]) -> Result<&'a mut Value, String> {
    let mut at = doc;
    for part in parts {
        at = match at {
            Value::Object(map) => map
                .get_mut(part)
                .ok_or_else(|| format!("doc is missing path: /{}", parts.join("/")))?,
            Value::Array(list) => {
                let i: usize = part
                    .parse()
                    .map_err(|_| format!("invalid array index: {part}"))?;
                list.get_mut(i)
                    .ok_or_else(|| format!("doc is missing path: /{}", parts.join("/")))?
            }
            _ => return Err(format!("doc is missing path: /{}", parts.join("/"))),
        };
    }
    Ok(at)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let parts = pointer_parts(path)?;
    let Some((last, init)) = parts.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent(doc, init)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(list) => {
            if last == "-" {
                list.push(value);
                return Ok(());
            }
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index: {last}"))?;
            if i > list.len() {
                return Err(format!("index out of bounds: {i}"));
            }
            list.insert(i, value);
            Ok(())
        }
        _ => Err(format!("doc is missing path: {path}")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let parts = pointer_parts(path)?;
    let Some((last, init)) = parts.split_last() else {
        return Err("cannot remove the whole document".into());
    };
    match parent(doc, init)? {
        Value::Object(map) => map
            .remove(last)
            .ok_or_else(|| format!("unable to remove nonexistent key: {last}: missing value")),
        Value::Array(list) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index: {last}"))?;
            if i >= list.len() {
                return Err(format!("index out of bounds: {i}"));
            }
            Ok(list.remove(i))
        }
        _ => Err(format!("doc is missing path: {path}")),
    }
}

/// RFC 6902.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let Some(ops) = ops.as_array() else {
        return Err("json: cannot unmarshal object into Go value of type jsonpatch.Patch".into());
    };
    for op in ops {
        let path = op["path"].as_str().unwrap_or_default();
        match op["op"].as_str() {
            Some("add") => add(doc, path, op["value"].clone())?,
            Some("remove") => {
                remove(doc, path)?;
            }
            Some("replace") => {
                remove(doc, path)?;
                add(doc, path, op["value"].clone())?;
            }
            Some("move") => {
                let from = op["from"].as_str().unwrap_or_default();
                let value = remove(doc, from)?;
                add(doc, path, value)?;
            }
            Some("copy") => {
                let from = op["from"].as_str().unwrap_or_default();
                let value = doc
                    .pointer(from)
                    .cloned()
                    .ok_or_else(|| format!("doc is missing from path: {from}"))?;
                add(doc, path, value)?;
            }
            Some("test") => {
                if doc.pointer(path) != Some(&op["value"]) {
                    return Err(format!("testing value {path} failed: test failed"));
                }
            }
            other => return Err(format!("Unexpected kind: {}", other.unwrap_or("null"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types_name_the_patch() {
        assert_eq!(PatchType::of(MERGE), Some(PatchType::Merge));
        assert_eq!(
            PatchType::of("application/apply-patch+yaml; charset=utf-8"),
            Some(PatchType::Apply)
        );
        assert_eq!(PatchType::of("application/json"), None);
    }

    #[test]
    fn strategic_merges_lists_by_key_where_merge_replaces_them() {
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
                         "metadata": {"finalizers": ["f1"]}});
        let patch = json!({"spec": {"containers": [{"name": "b", "image": "z"}]},
                           "metadata": {"finalizers": ["f2"]}});
        let mut by_strategy = pod.clone();
        strategic(&mut by_strategy, &patch).unwrap();
        assert_eq!(
            by_strategy["spec"]["containers"].as_array().unwrap().len(),
            2
        );
        assert_eq!(by_strategy["spec"]["containers"][1]["image"], "z");
        assert_eq!(by_strategy["metadata"]["finalizers"], json!(["f1", "f2"]));
        let mut by_merge = pod.clone();
        merge(&mut by_merge, &patch);
        assert_eq!(
            by_merge["spec"]["containers"],
            json!([{"name": "b", "image": "z"}])
        );

        let mut deleted = pod.clone();
        strategic(
            &mut deleted,
            &json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]},
                    "$deleteFromPrimitiveList/finalizers": ["f1"]}),
        )
        .unwrap();
        assert_eq!(
            deleted["spec"]["containers"],
            json!([{"name": "b", "image": "y"}])
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut doc = json!({"a": [1, 2], "b": {"c": 1}});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/a/-", "value": 3},
                {"op": "replace", "path": "/b/c", "value": 2},
                {"op": "test", "path": "/b/c", "value": 2},
                {"op": "remove", "path": "/a/0"},
                {"op": "copy", "from": "/b", "path": "/d"}
            ]),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": [2, 3], "b": {"c": 2}, "d": {"c": 2}}));
        assert!(json_patch(
            &mut doc,
            &json!([{"op": "test", "path": "/b/c", "value": 9}])
        )
        .is_err());
        assert!(json_patch(&mut doc, &json!([{"op": "remove", "path": "/zz"}])).is_err());
    }
}
