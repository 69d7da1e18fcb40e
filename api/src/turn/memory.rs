//! The memory section of the system prompt: what the model is told about
//! the Memory Stores its Session attaches (the SDK's docstrings: a store's
//! description "is included in the agent's system prompt when the store is
//! attached", an attachment's instructions are "rendered into the memory
//! section of the system prompt", and `mount_path` is where it is mounted).
//! Name and description are the snapshot taken when the Session was created.

use mango_protocol::sessions::{MemoryAccess, MemoryStoreResource, SessionResource};

/// The section for `resources`' Memory Stores; `None` when there are none.
pub fn memory_section(resources: &[SessionResource]) -> Option<String> {
    let stores: Vec<&MemoryStoreResource> = resources
        .iter()
        .filter_map(|r| match r {
            SessionResource::MemoryStore(m) => Some(m),
            _ => None,
        })
        .collect();
    if stores.is_empty() {
        return None;
    }
    let mut out = String::from(
        "# Memory\n\n\
         These memory stores are mounted as directories in your environment. \
         Their files persist after this session ends and are shared with later sessions \
         that attach the same store: check them for what earlier work learned before you \
         start, and write down what a later session should know. Use your file tools on \
         the paths below; each file is one memory of at most 100 kB of UTF-8 text.\n",
    );
    for m in stores {
        let name = m.name.as_deref().unwrap_or(&m.memory_store_id);
        out.push_str(&format!("\n## {name}\n\n"));
        if let Some(path) = &m.mount_path {
            out.push_str(&format!("- Path: {path}\n"));
        }
        let access = match m.access.unwrap_or(MemoryAccess::ReadWrite) {
            MemoryAccess::ReadWrite => "read and write",
            MemoryAccess::ReadOnly => {
                "read only (the file tools refuse writes to it, and no change to it is saved)"
            }
        };
        out.push_str(&format!("- Access: {access}\n"));
        if let Some(description) = m.description.as_deref().filter(|d| !d.is_empty()) {
            out.push_str(&format!("- Description: {description}\n"));
        }
        if let Some(instructions) = m.instructions.as_deref().filter(|i| !i.is_empty()) {
            out.push_str(&format!("- Instructions: {instructions}\n"));
        }
    }
    Some(out)
}

/// The system prompt with the memory section after the Agent's own prompt
/// (`None` when there is neither).
pub fn with_memory(system: Option<String>, resources: &[SessionResource]) -> Option<String> {
    let system = system.filter(|s| !s.is_empty());
    match (system, memory_section(resources)) {
        (Some(s), Some(section)) => Some(format!("{s}\n\n{section}")),
        (system, section) => system.or(section),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn resources(v: Value) -> Vec<SessionResource> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_attached_store_is_rendered_with_its_path_access_and_guidance() {
        let res = resources(json!([
            {"type": "memory_store", "memory_store_id": "memstore_1", "access": "read_write",
             "mount_path": "/mnt/memory/user-preferences", "name": "User Preferences",
             "description": "What the user likes", "instructions": "Read before answering"},
            {"type": "file", "file_id": "file_1"},
            {"type": "memory_store", "memory_store_id": "memstore_2", "access": "read_only",
             "mount_path": "/mnt/memory/team", "name": "Team", "description": ""}
        ]));
        let section = memory_section(&res).unwrap();
        assert!(section.starts_with("# Memory\n"));
        assert!(section.contains(
            "## User Preferences\n\n- Path: /mnt/memory/user-preferences\n- Access: read and write\n\
             - Description: What the user likes\n- Instructions: Read before answering\n"
        ), "{section}");
        assert!(section.contains(
            "## Team\n\n- Path: /mnt/memory/team\n- Access: read only (the file tools refuse writes to it, and no change to it is saved)\n"
        ), "{section}");
        assert!(!section.contains("file_1"));

        let system = with_memory(Some("be brief".into()), &res).unwrap();
        assert!(system.starts_with("be brief\n\n# Memory"), "{system}");
        let system = with_memory(None, &res).unwrap();
        assert!(system.starts_with("# Memory"));
    }

    #[test]
    fn no_stores_leave_the_prompt_alone() {
        let files = resources(json!([{"type": "file", "file_id": "f"}]));
        assert_eq!(
            with_memory(Some("be brief".into()), &files).as_deref(),
            Some("be brief")
        );
        assert_eq!(with_memory(None, &[]), None);
    }
}
