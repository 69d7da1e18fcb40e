//! What happens to objects after they are written, as the apiserver and
//! kube-controller-manager do it: a terminating Pod goes when its grace
//! ends or its kubelet reports it stopped (the kubelet's final delete);
//! an object whose finalizers are gone goes; the PVC-protection
//! controller (pkg/controller/volume/pvcprotection) lets a deleted claim
//! go once no running Pod uses it; the garbage collector
//! (pkg/controller/garbagecollector) deletes dependents whose owners are
//! gone (background), orphans them (`orphan`) or deletes them first
//! (`foregroundDeletion`); a deleted namespace is emptied, then goes.

use super::kinds::PVC_PROTECTION;
use super::resources::{self, ResourceType};
use super::store::{self, Table};
use super::State;
use serde_json::{json, Value};

fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

fn terminating(object: &Value) -> bool {
    !object["metadata"]["deletionTimestamp"].is_null()
}

fn terminal_phase(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

fn expired(object: &Value, now: jiff::Timestamp) -> bool {
    object["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .is_some_and(|at| at <= now)
}

fn rt_of(table: Table) -> Option<ResourceType> {
    resources::ALL
        .iter()
        .copied()
        .find(|r| store::table(r) == table)
}

/// Marks `object` deleted as a DELETE with default options would:
/// a Pod gets its grace, anything else goes now unless finalizers hold it.
/// Returns whether the store changed.
pub fn delete(
    state: &mut State,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    grace: Option<i64>,
    add_finalizer: Option<&str>,
) -> bool {
    let table = store::table(rt);
    let Some(mut object) = state.store.get(table, namespace, name).cloned() else {
        return false;
    };
    let grace = if rt.plural == "pods" {
        let unscheduled = object["spec"]["nodeName"]
            .as_str()
            .is_none_or(str::is_empty);
        if unscheduled || terminal_phase(&object) {
            0
        } else {
            grace
                .or_else(|| object["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(30)
                .max(0)
        }
    } else {
        0
    };
    if let Some(finalizer) = add_finalizer {
        let list = object["metadata"]
            .as_object_mut()
            .expect("metadata")
            .entry("finalizers")
            .or_insert_with(|| json!([]));
        if let Some(list) = list.as_array_mut() {
            if !list.iter().any(|f| f == finalizer) {
                list.push(json!(finalizer));
            }
        }
    }
    if grace == 0 && finalizers(&object).is_empty() {
        state.store.remove(table, namespace, name);
        return true;
    }
    let now = jiff::Timestamp::now();
    let until = now + jiff::SignedDuration::from_secs(grace);
    if terminating(&object) {
        // A second delete may only shorten the grace.
        let current = object["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0);
        if grace >= current && add_finalizer.is_none() {
            return false;
        }
        if grace < current {
            object["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            object["metadata"]["deletionTimestamp"] = json!(whole_seconds(until));
        }
    } else {
        object["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        object["metadata"]["deletionTimestamp"] = json!(whole_seconds(until));
    }
    state.store.put(table, namespace, name, object);
    true
}

fn whole_seconds(at: jiff::Timestamp) -> String {
    jiff::Timestamp::from_second(at.as_second())
        .expect("a time")
        .to_string()
}

/// Whether an owner reference resolves to a live object of that uid.
fn owner_present(state: &State, namespace: &str, owner: &Value) -> Option<bool> {
    let rt = resources::by_kind(
        owner["apiVersion"].as_str().unwrap_or_default(),
        owner["kind"].as_str().unwrap_or_default(),
    )?;
    let ns = if rt.namespaced { namespace } else { "" };
    let found = state.store.get(
        store::table(&rt),
        ns,
        owner["name"].as_str().unwrap_or_default(),
    );
    Some(found.is_some_and(|o| o["metadata"]["uid"] == owner["uid"]))
}

/// Objects whose owner references name `uid`.
fn dependents(state: &State, uid: &Value) -> Vec<(Table, String, String)> {
    state
        .store
        .keys()
        .into_iter()
        .filter(|(table, ns, name)| {
            state.store.get(*table, ns, name).is_some_and(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["uid"] == *uid)
            })
        })
        .collect()
}

/// One pass of every controller; repeats until nothing changes.
/// Returns whether anything changed.
pub fn settle(state: &mut State) -> bool {
    let mut any = false;
    for _ in 0..100 {
        if !pass(state) {
            break;
        }
        any = true;
    }
    any
}

fn pass(state: &mut State) -> bool {
    let now = jiff::Timestamp::now();
    for (table, namespace, name) in state.store.keys() {
        let Some(object) = state.store.get(table, &namespace, &name) else {
            continue;
        };
        // Every write settles: most objects need nothing, and copying each
        // of them every time made writes slower as objects piled up.
        let owned = object["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|refs| !refs.is_empty());
        let acted_on = terminating(object) || (owned && state.options.garbage_collector);
        if !acted_on {
            continue;
        }
        let object = object.clone();
        let Some(rt) = rt_of(table) else { continue };
        let held = finalizers(&object);
        if terminating(&object) {
            let is_pod = rt.plural == "pods";
            // The kubelet's final delete once its containers stopped or
            // the grace is over.
            if held.is_empty() && (!is_pod || expired(&object, now) || terminal_phase(&object)) {
                state.store.remove(table, &namespace, &name);
                return true;
            }
            if held.iter().any(|f| f == PVC_PROTECTION) && !claim_in_use(state, &namespace, &name) {
                return drop_finalizer(state, table, &namespace, &name, object, PVC_PROTECTION);
            }
            let uid = object["metadata"]["uid"].clone();
            if held.iter().any(|f| f == "orphan") {
                for (t, ns, n) in dependents(state, &uid) {
                    if let Some(mut d) = state.store.get(t, &ns, &n).cloned() {
                        if let Some(refs) = d["metadata"]["ownerReferences"].as_array_mut() {
                            refs.retain(|r| r["uid"] != uid);
                        }
                        state.store.put(t, &ns, &n, d);
                    }
                }
                return drop_finalizer(state, table, &namespace, &name, object, "orphan");
            }
            if held.iter().any(|f| f == "foregroundDeletion") {
                let deps = dependents(state, &uid);
                if deps.is_empty() {
                    return drop_finalizer(
                        state,
                        table,
                        &namespace,
                        &name,
                        object,
                        "foregroundDeletion",
                    );
                }
                let mut changed = false;
                for (t, ns, n) in deps {
                    if let Some(drt) = rt_of(t) {
                        let live = state.store.get(t, &ns, &n).is_some_and(|d| !terminating(d));
                        if live {
                            changed |= delete(state, &drt, &ns, &n, None, None);
                        }
                    }
                }
                if changed {
                    return true;
                }
            }
            if rt.plural == "namespaces" {
                let contents: Vec<(Table, String, String)> = state
                    .store
                    .keys()
                    .into_iter()
                    .filter(|(_, ns, _)| *ns == name)
                    .collect();
                if contents.is_empty() {
                    state.store.remove(table, &namespace, &name);
                    return true;
                }
                let mut changed = false;
                for (t, ns, n) in contents {
                    if let Some(crt) = rt_of(t) {
                        let live = state.store.get(t, &ns, &n).is_some_and(|d| !terminating(d));
                        if live {
                            changed |= delete(state, &crt, &ns, &n, None, None);
                        }
                    }
                }
                if changed {
                    return true;
                }
            }
            continue;
        }
        if !state.options.garbage_collector {
            continue;
        }
        let owners: Vec<Value> = object["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if owners.is_empty() {
            continue;
        }
        let present: Vec<Option<bool>> = owners
            .iter()
            .map(|o| owner_present(state, &namespace, o))
            .collect();
        // An owner of a kind this server does not know is never resolved.
        if present.iter().any(Option::is_none) {
            continue;
        }
        if present.iter().all(|p| *p == Some(false)) {
            if delete(state, &rt, &namespace, &name, None, None) {
                return true;
            }
        } else if present.contains(&Some(false)) {
            let mut kept = object.clone();
            let live: Vec<Value> = owners
                .iter()
                .zip(&present)
                .filter(|(_, p)| **p == Some(true))
                .map(|(o, _)| o.clone())
                .collect();
            kept["metadata"]["ownerReferences"] = Value::Array(live);
            state.store.put(table, &namespace, &name, kept);
            return true;
        }
    }
    false
}

fn drop_finalizer(
    state: &mut State,
    table: Table,
    namespace: &str,
    name: &str,
    mut object: Value,
    finalizer: &str,
) -> bool {
    if let Some(list) = object["metadata"]["finalizers"].as_array_mut() {
        list.retain(|f| f != finalizer);
    }
    state.store.put(table, namespace, name, object);
    true
}

/// A Pod not yet finished mounts the claim.
fn claim_in_use(state: &State, namespace: &str, claim: &str) -> bool {
    state
        .store
        .list(store::table(&resources::PODS), Some(namespace))
        .iter()
        .filter(|pod| !terminal_phase(pod))
        .any(|pod| {
            pod["spec"]["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["persistentVolumeClaim"]["claimName"] == claim)
        })
}
