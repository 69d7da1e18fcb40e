//! Field management and server-side apply, after the apiserver's
//! managedfields (apimachinery/pkg/util/managedfields, structured-merge-
//! diff): every write records which manager owns which fields in
//! `metadata.managedFields` (`FieldsV1`); an apply sets the fields of its
//! configuration, removes the fields it applied before and no longer
//! does, and fails with 409 when another manager owns a field it would
//! set to another value, unless forced. Lists with a patch merge key are
//! keyed by it (`k:{…}`), `finalizers` are a set (`v:…`), other lists are
//! atomic (one field).

use super::patch::merge_key;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Element {
    Field(String),
    /// A keyed list item: the merge key's JSON (`{"name":"runner"}`).
    Key(String),
    /// A set item: the value's JSON.
    Item(String),
}

pub type Path = Vec<Element>;
pub type FieldSet = BTreeSet<Path>;

/// Which part of an object a write may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource: everything but `status` when `status` is a
    /// subresource of the kind.
    Main { status_apart: bool },
    /// The `/status` subresource.
    Status,
}

/// Metadata the server owns: never a manager's.
const SERVER_METADATA: [&str; 9] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// The fields `object` sets, within `scope`.
pub fn field_set(object: &Value, scope: Scope) -> FieldSet {
    let mut set = FieldSet::new();
    let Some(map) = object.as_object() else {
        return set;
    };
    for (key, value) in map {
        let tracked = match (scope, key.as_str()) {
            (_, "apiVersion" | "kind") => false,
            (Scope::Status, k) => k == "status",
            (Scope::Main { status_apart }, "status") => !status_apart,
            _ => true,
        };
        if !tracked {
            continue;
        }
        let path = vec![Element::Field(key.clone())];
        if key == "metadata" {
            if let Some(meta) = value.as_object() {
                for (k, v) in meta {
                    if !SERVER_METADATA.contains(&k.as_str()) {
                        walk(
                            &mut set,
                            vec![Element::Field(key.clone()), Element::Field(k.clone())],
                            k,
                            v,
                        );
                    }
                }
            }
            continue;
        }
        walk(&mut set, path, key, value);
    }
    set
}

fn walk(set: &mut FieldSet, path: Path, name: &str, value: &Value) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let mut child = path.clone();
                child.push(Element::Field(k.clone()));
                walk(set, child, k, v);
            }
        }
        Value::Array(items) if merge_key(name).is_some() => {
            let key = merge_key(name).expect("a merge key");
            for item in items {
                let Some(id) = item.get(key) else {
                    set.insert(path.clone());
                    continue;
                };
                let mut at = path.clone();
                at.push(Element::Key(json!({ key: id }).to_string()));
                set.insert(at.clone());
                if let Some(fields) = item.as_object() {
                    for (k, v) in fields {
                        let mut child = at.clone();
                        child.push(Element::Field(k.clone()));
                        walk(set, child, k, v);
                    }
                }
            }
        }
        Value::Array(items) if name == "finalizers" => {
            for item in items {
                let mut at = path.clone();
                at.push(Element::Item(item.to_string()));
                set.insert(at);
            }
        }
        _ => {
            set.insert(path);
        }
    }
}

/// The value at `path` in `object`, if any.
pub fn value_at<'a>(object: &'a Value, path: &[Element]) -> Option<&'a Value> {
    let mut at = object;
    for element in path {
        at = match element {
            Element::Field(name) => at.get(name)?,
            Element::Key(id) => {
                let id: Map<String, Value> = serde_json::from_str(id).ok()?;
                at.as_array()?
                    .iter()
                    .find(|item| id.iter().all(|(k, v)| item.get(k) == Some(v)))?
            }
            Element::Item(item) => {
                let item: Value = serde_json::from_str(item).ok()?;
                at.as_array()?.iter().find(|v| **v == item)?
            }
        };
    }
    Some(at)
}

/// Removes the field at `path` from `object`.
pub fn remove_at(object: &mut Value, path: &[Element]) {
    let Some((last, init)) = path.split_last() else {
        return;
    };
    let mut at = object;
    for element in init {
        let next = match element {
            Element::Field(name) => at.get_mut(name),
            Element::Key(id) => {
                let Ok(id) = serde_json::from_str::<Map<String, Value>>(id) else {
                    return;
                };
                at.as_array_mut().and_then(|items| {
                    items
                        .iter_mut()
                        .find(|item| id.iter().all(|(k, v)| item.get(k) == Some(v)))
                })
            }
            Element::Item(_) => None,
        };
        match next {
            Some(next) => at = next,
            None => return,
        }
    }
    match last {
        Element::Field(name) => {
            if let Some(map) = at.as_object_mut() {
                map.remove(name);
            }
        }
        Element::Key(id) => {
            if let (Ok(id), Some(items)) = (
                serde_json::from_str::<Map<String, Value>>(id),
                at.as_array_mut(),
            ) {
                items.retain(|item| !id.iter().all(|(k, v)| item.get(k) == Some(v)));
            }
        }
        Element::Item(item) => {
            if let (Ok(item), Some(items)) =
                (serde_json::from_str::<Value>(item), at.as_array_mut())
            {
                items.retain(|v| *v != item);
            }
        }
    }
}

/// Merges an applied configuration into `target`: maps by key, keyed
/// lists by their key, `finalizers` as a set, anything else replaced.
pub fn merge_applied(target: &mut Value, applied: &Value, name: &str) {
    match applied {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let map = target.as_object_mut().expect("an object");
            for (k, v) in fields {
                merge_applied(map.entry(k.clone()).or_insert(Value::Null), v, k);
            }
        }
        Value::Array(items) if merge_key(name).is_some() => {
            let key = merge_key(name).expect("a merge key");
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let list = target.as_array_mut().expect("an array");
            for item in items {
                match list
                    .iter_mut()
                    .find(|e| e.get(key).is_some() && e.get(key) == item.get(key))
                {
                    Some(existing) => merge_applied(existing, item, ""),
                    None => list.push(item.clone()),
                }
            }
        }
        Value::Array(items) if name == "finalizers" => {
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let list = target.as_array_mut().expect("an array");
            for item in items {
                if !list.contains(item) {
                    list.push(item.clone());
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone)]
pub struct Manager {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl Manager {
    fn same_entry(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }
}

fn element_key(element: &Element) -> String {
    match element {
        Element::Field(name) => format!("f:{name}"),
        Element::Key(id) => format!("k:{id}"),
        Element::Item(item) => format!("v:{item}"),
    }
}

fn element_of(key: &str) -> Option<Element> {
    let (kind, rest) = key.split_at_checked(2)?;
    match kind {
        "f:" => Some(Element::Field(rest.into())),
        "k:" => Some(Element::Key(rest.into())),
        "v:" => Some(Element::Item(rest.into())),
        _ => None,
    }
}

/// A field set as the `FieldsV1` tree.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut at = &mut root;
        for (i, element) in path.iter().enumerate() {
            let node = at
                .entry(element_key(element))
                .or_insert_with(|| Value::Object(Map::new()));
            let node = node.as_object_mut().expect("a node");
            let is_last = i + 1 == path.len();
            if is_last && matches!(element, Element::Key(_)) {
                node.insert(".".into(), json!({}));
            }
            at = node;
        }
    }
    Value::Object(root)
}

/// The field set of a `FieldsV1` tree.
pub fn from_fields_v1(tree: &Value) -> FieldSet {
    fn go(node: &Map<String, Value>, prefix: &Path, set: &mut FieldSet) {
        for (key, child) in node {
            if key == "." {
                set.insert(prefix.clone());
                continue;
            }
            let Some(element) = element_of(key) else {
                continue;
            };
            let mut path = prefix.clone();
            path.push(element);
            match child.as_object() {
                Some(map) if !map.is_empty() => go(map, &path, set),
                _ => {
                    set.insert(path);
                }
            }
        }
    }
    let mut set = FieldSet::new();
    if let Some(map) = tree.as_object() {
        go(map, &Vec::new(), &mut set);
    }
    set
}

pub fn managers_of(object: &Value) -> Vec<Manager> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            Some(Manager {
                manager: entry["manager"].as_str()?.to_string(),
                operation: entry["operation"].as_str().unwrap_or("Update").to_string(),
                api_version: entry["apiVersion"].as_str().unwrap_or_default().to_string(),
                time: entry["time"].as_str().unwrap_or_default().to_string(),
                subresource: entry["subresource"].as_str().map(str::to_string),
                fields: from_fields_v1(&entry["fieldsV1"]),
            })
        })
        .collect()
}

pub fn set_managers(object: &mut Value, managers: &[Manager]) {
    let entries: Vec<Value> = managers
        .iter()
        .filter(|m| !m.fields.is_empty())
        .map(|m| {
            let mut entry = json!({"manager": m.manager, "operation": m.operation,
                "apiVersion": m.api_version, "time": m.time, "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&m.fields)});
            if let Some(sub) = &m.subresource {
                entry["subresource"] = json!(sub);
            }
            entry
        })
        .collect();
    if entries.is_empty() {
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
    } else {
        object["metadata"]["managedFields"] = Value::Array(entries);
    }
}

/// Who writes, and how.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub subresource: Option<&'a str>,
    pub scope: Scope,
    pub now: &'a str,
}

/// Records an update (create, replace, non-apply patch) from `old` to
/// `new`: the writer owns what it changed, others lose it, and a field
/// that is gone is no one's.
pub fn record_update(old: Option<&Value>, new: &mut Value, writer: &Writer) {
    let mut managers = old.map(managers_of).unwrap_or_default();
    let before = old.map(|o| field_set(o, writer.scope)).unwrap_or_default();
    let after = field_set(new, writer.scope);
    let changed: FieldSet = after
        .iter()
        .filter(|p| old.and_then(|o| value_at(o, p)) != value_at(new, p) || !before.contains(*p))
        .cloned()
        .collect();
    let gone: FieldSet = before.difference(&after).cloned().collect();
    for m in &mut managers {
        let own = m.same_entry(writer.manager, "Update", writer.subresource);
        m.fields
            .retain(|p| !gone.contains(p) && (own || !changed.contains(p)));
    }
    if !changed.is_empty() {
        match managers
            .iter_mut()
            .find(|m| m.same_entry(writer.manager, "Update", writer.subresource))
        {
            Some(m) => {
                m.fields.extend(changed);
                m.time = writer.now.into();
                m.api_version = writer.api_version.into();
            }
            None => managers.push(Manager {
                manager: writer.manager.into(),
                operation: "Update".into(),
                api_version: writer.api_version.into(),
                time: writer.now.into(),
                subresource: writer.subresource.map(str::to_string),
                fields: changed,
            }),
        }
    }
    set_managers(new, &managers);
}

/// A server-side apply of `applied` onto `old` (`None`: it creates).
/// Returns the new object, or the conflicts as (manager, apiVersion, field).
pub fn apply(
    old: Option<&Value>,
    applied: &Value,
    writer: &Writer,
    force: bool,
) -> Result<Value, Vec<(String, String, String)>> {
    let current = old.cloned().unwrap_or_else(|| json!({}));
    let mut managers = managers_of(&current);
    let applied_set = field_set(applied, writer.scope);
    let is_self = |m: &Manager| m.same_entry(writer.manager, "Apply", writer.subresource);

    let mut conflicts = Vec::new();
    for m in managers.iter().filter(|m| !is_self(m)) {
        for path in applied_set.intersection(&m.fields) {
            if value_at(&current, path) != value_at(applied, path) {
                conflicts.push((m.manager.clone(), m.api_version.clone(), dotted(path)));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }

    let mut new = current.clone();
    // What this manager applied before and no longer does goes, unless
    // another manager owns it too.
    let previous: FieldSet = managers
        .iter()
        .find(|m| is_self(m))
        .map(|m| m.fields.clone())
        .unwrap_or_default();
    for path in previous.difference(&applied_set) {
        let shared = managers
            .iter()
            .any(|m| !is_self(m) && m.fields.contains(path));
        if !shared {
            remove_at(&mut new, path);
        }
    }
    let mut body = applied.clone();
    if let Some(map) = body.as_object_mut() {
        match writer.scope {
            Scope::Status => map.retain(|k, _| k == "status"),
            Scope::Main { status_apart: true } => {
                map.remove("status");
            }
            Scope::Main { .. } => {}
        }
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in SERVER_METADATA {
                meta.remove(field);
            }
        }
    }
    merge_applied(&mut new, &body, "");

    for m in managers.iter_mut().filter(|m| !is_self(m)) {
        // Forced: the conflicting fields change hands.
        m.fields.retain(|p| {
            !(applied_set.contains(p) && value_at(&current, p) != value_at(applied, p))
        });
    }
    match managers.iter_mut().find(|m| is_self(m)) {
        Some(m) => {
            m.fields = applied_set;
            m.time = writer.now.into();
            m.api_version = writer.api_version.into();
        }
        None => managers.push(Manager {
            manager: writer.manager.into(),
            operation: "Apply".into(),
            api_version: writer.api_version.into(),
            time: writer.now.into(),
            subresource: writer.subresource.map(str::to_string),
            fields: applied_set,
        }),
    }
    set_managers(&mut new, &managers);
    Ok(new)
}

/// `.spec.holderIdentity`, as conflicts name fields.
fn dotted(path: &[Element]) -> String {
    path.iter()
        .map(|e| match e {
            Element::Field(name) => format!(".{name}"),
            Element::Key(id) => format!(
                "[{}]",
                id.trim_start_matches('{')
                    .trim_end_matches('}')
                    .replace(':', "=")
            ),
            Element::Item(item) => format!("[{item}]"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer<'a>(manager: &'a str) -> Writer<'a> {
        Writer {
            manager,
            api_version: "coordination.k8s.io/v1",
            subresource: None,
            scope: Scope::Main {
                status_apart: false,
            },
            now: "2026-01-01T00:00:00Z",
        }
    }

    #[test]
    fn a_second_manager_setting_an_owned_field_conflicts_unless_forced() {
        let lease = json!({"metadata": {"name": "l"}, "spec": {}});
        let a = apply(
            Some(&lease),
            &json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}),
            &writer("a"),
            false,
        )
        .unwrap();
        assert_eq!(a["spec"]["holderIdentity"], "a");
        let conflicts = apply(
            Some(&a),
            &json!({"spec": {"holderIdentity": "b", "leaseDurationSeconds": 15}}),
            &writer("b"),
            false,
        )
        .unwrap_err();
        assert_eq!(
            conflicts,
            vec![(
                "a".into(),
                "coordination.k8s.io/v1".into(),
                ".spec.holderIdentity".into()
            )],
            "the same value is shared, a different one conflicts"
        );
        let b = apply(
            Some(&a),
            &json!({"spec": {"holderIdentity": "b"}}),
            &writer("b"),
            true,
        )
        .unwrap();
        assert_eq!(b["spec"]["holderIdentity"], "b");
        let owners = managers_of(&b);
        let a_fields = &owners.iter().find(|m| m.manager == "a").unwrap().fields;
        assert!(!a_fields.contains(&vec![
            Element::Field("spec".into()),
            Element::Field("holderIdentity".into())
        ]));
    }

    #[test]
    fn an_apply_removes_what_its_manager_no_longer_applies() {
        let first = apply(
            None,
            &json!({"metadata": {"labels": {"x": "1", "y": "2"}}}),
            &writer("a"),
            false,
        )
        .unwrap();
        let second = apply(
            Some(&first),
            &json!({"metadata": {"labels": {"x": "1"}}}),
            &writer("a"),
            false,
        )
        .unwrap();
        assert_eq!(second["metadata"]["labels"], json!({"x": "1"}));
    }

    #[test]
    fn updates_take_fields_over_and_removed_fields_are_no_ones() {
        let applied = apply(
            None,
            &json!({"spec": {"a": 1, "b": 2}}),
            &writer("a"),
            false,
        )
        .unwrap();
        let mut updated = applied.clone();
        updated["spec"]["a"] = json!(5);
        updated["spec"].as_object_mut().unwrap().remove("b");
        record_update(Some(&applied), &mut updated, &writer("u"));
        let owners = managers_of(&updated);
        assert_eq!(owners.len(), 1, "a owns nothing any more: {owners:?}");
        assert_eq!(owners[0].manager, "u");
        // Now a re-applies b without a: no conflict on b (no one owns it).
        assert!(apply(
            Some(&updated),
            &json!({"spec": {"b": 3}}),
            &writer("a"),
            false
        )
        .is_ok());
    }

    #[test]
    fn fields_v1_round_trips() {
        let object = json!({"metadata": {"finalizers": ["f"], "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "runner", "image": "x"}], "tolerations": [{"key": "k"}]}});
        let set = field_set(&object, Scope::Main { status_apart: true });
        let tree = to_fields_v1(&set);
        assert!(tree["f:spec"]["f:containers"]["k:{\"name\":\"runner\"}"]["."].is_object());
        assert!(tree["f:metadata"]["f:finalizers"]["v:\"f\""].is_object());
        assert_eq!(from_fields_v1(&tree), set);
    }
}
