//! The objects, as etcd behind an apiserver keeps them: one revision
//! counter for every write (each object's `resourceVersion` is the
//! revision that wrote it), and a bounded history of changes that watches
//! replay from; a watch from before the oldest kept change is Gone.

use super::resources::ResourceType;
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};

/// (group, plural): which table an object lives in.
pub type Table = (&'static str, &'static str);

pub fn table(rt: &ResourceType) -> Table {
    (rt.group, rt.plural)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added,
    Modified,
    Deleted,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "ADDED",
            Change::Modified => "MODIFIED",
            Change::Deleted => "DELETED",
        }
    }
}

/// One write, as watches see it.
#[derive(Debug, Clone)]
pub struct Record {
    pub revision: u64,
    pub table: Table,
    pub namespace: String,
    pub change: Change,
    /// The object after the write (before, for a deletion).
    pub object: Value,
    /// The object before the write, if there was one.
    pub previous: Option<Value>,
}

pub struct Store {
    objects: BTreeMap<(Table, String, String), Value>,
    revision: u64,
    history: VecDeque<Record>,
    history_limit: usize,
    /// Changes after this revision are all in `history`.
    compacted: u64,
    next_uid: u64,
}

impl Store {
    pub fn new(history_limit: usize) -> Store {
        Store {
            objects: BTreeMap::new(),
            revision: 1,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: 1,
            next_uid: 0,
        }
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The oldest revision a watch may start from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Forgets every change so far: a watch from an earlier revision is Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.revision;
    }

    pub fn new_uid(&mut self) -> String {
        self.next_uid += 1;
        // The shape of a UUID, so clients that parse one accept it.
        format!("00000000-0000-4000-8000-{:012x}", self.next_uid)
    }

    pub fn get(&self, table: Table, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(table, namespace.to_string(), name.to_string()))
    }

    /// Objects of `table`, in `namespace` (every namespace when `None`), by name.
    pub fn list(&self, table: Table, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((t, ns, _), _)| *t == table && namespace.is_none_or(|n| n == ns))
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// Every object's key, for the lifecycle controllers' passes.
    pub fn keys(&self) -> Vec<(Table, String, String)> {
        self.objects.keys().cloned().collect()
    }

    /// Stores `object` at a new revision (its `resourceVersion`) and
    /// records the change; returns the stored object.
    pub fn put(&mut self, table: Table, namespace: &str, name: &str, mut object: Value) -> Value {
        self.revision += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.revision.to_string());
        let key = (table, namespace.to_string(), name.to_string());
        let previous = self.objects.insert(key, object.clone());
        let change = if previous.is_some() {
            Change::Modified
        } else {
            Change::Added
        };
        self.record(table, namespace, change, object.clone(), previous);
        object
    }

    /// Removes an object at a new revision.
    pub fn remove(&mut self, table: Table, namespace: &str, name: &str) -> Option<Value> {
        let key = (table, namespace.to_string(), name.to_string());
        let mut object = self.objects.remove(&key)?;
        self.revision += 1;
        // A deletion event carries the object at the deleting revision.
        object["metadata"]["resourceVersion"] = Value::String(self.revision.to_string());
        self.record(
            table,
            namespace,
            Change::Deleted,
            object.clone(),
            Some(object.clone()),
        );
        Some(object)
    }

    fn record(
        &mut self,
        table: Table,
        namespace: &str,
        change: Change,
        object: Value,
        previous: Option<Value>,
    ) {
        self.history.push_back(Record {
            revision: self.revision,
            table,
            namespace: namespace.to_string(),
            change,
            object,
            previous,
        });
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.revision;
            }
        }
    }

    /// Changes after `revision`, oldest first; `None` when some were
    /// compacted away (the caller answers 410 Gone).
    pub fn since(&self, revision: u64) -> Option<Vec<Record>> {
        if revision < self.compacted {
            return None;
        }
        // Revisions only grow along the history: every watch reads this
        // at every change, so a scan of the whole history made each write
        // slower the longer the fake ran.
        let first = self.history.partition_point(|r| r.revision <= revision);
        Some(self.history.range(first..).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T: Table = ("", "pods");

    #[test]
    fn every_write_has_a_new_revision_and_old_ones_are_forgotten() {
        let mut store = Store::new(2);
        let a = store.put(T, "ns", "a", json!({"metadata": {"name": "a"}}));
        let b = store.put(T, "ns", "a", json!({"metadata": {"name": "a"}}));
        assert_ne!(
            a["metadata"]["resourceVersion"],
            b["metadata"]["resourceVersion"]
        );
        store.put(T, "other", "a", json!({"metadata": {"name": "a"}}));
        assert_eq!(store.list(T, Some("ns")).len(), 1, "namespaces apart");
        assert_eq!(store.list(T, None).len(), 2);
        assert!(store.since(1).is_none(), "the first change was compacted");
        assert_eq!(store.since(store.revision() - 1).unwrap().len(), 1);
        store.compact();
        assert!(store.since(store.revision() - 1).is_none());
        assert_eq!(store.since(store.revision()).unwrap().len(), 0);
    }
}
