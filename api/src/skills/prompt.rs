//! What the model is told about a Session's Skills: after the Agent's own
//! system prompt, one section naming each pinned custom Skill with its
//! description and where its files are. The SDK describes a version's
//! `name` as "the top-level directory of the Skill's mounted files" and its
//! `description` as taken from `SKILL.md`; a self-hosted worker mounts them
//! under `skills/<name>/` of its working directory, so the paths are given
//! relative to it (the control plane never assumes where that is).

use mango_protocol::agents::{AgentSnapshot, SkillKind};

/// The Agent's system prompt with the Skills section appended (`None` when
/// there is neither).
pub fn with_skills(system: Option<&str>, agent: &AgentSnapshot) -> Option<String> {
    let system = system.filter(|s| !s.trim().is_empty());
    match (system, section(agent)) {
        (None, None) => None,
        (Some(s), None) => Some(s.to_string()),
        (None, Some(skills)) => Some(skills),
        (Some(s), Some(skills)) => Some(format!("{s}\n\n{skills}")),
    }
}

/// The Skills section, when the snapshot pins a custom Skill.
pub fn section(agent: &AgentSnapshot) -> Option<String> {
    let skills: Vec<(&str, &str)> = agent
        .definition
        .skills
        .iter()
        .filter(|s| s.kind == SkillKind::Custom)
        .filter_map(|s| Some((s.name.as_deref()?, s.description.as_deref()?)))
        .collect();
    if skills.is_empty() {
        return None;
    }
    let mut out = String::from(
        "<skills>\nYou have these Skills: folders of instructions, scripts and resources in your working directory. \
When a task matches a Skill's description, first read its SKILL.md with the read tool and follow it; \
the files it refers to are beside it.\n",
    );
    for (name, description) in skills {
        // One line per Skill: a description's line breaks would blur the list.
        let description = description.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push_str(&format!(
            "- {name}: {description} (skills/{name}/SKILL.md)\n"
        ));
    }
    out.push_str("</skills>");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent(system: Option<&str>, skills: serde_json::Value) -> AgentSnapshot {
        serde_json::from_value(json!({
            "type": "agent", "id": "agent_1", "version": 1, "name": "a", "description": null,
            "system": system,
            "model": {"id": "m", "effort": null, "inference_geo": null, "speed": "standard"},
            "tools": [], "skills": skills, "mcp_servers": [],
            "execution_identity": {"type": "service_account"}, "multiagent": null
        }))
        .unwrap()
    }

    #[test]
    fn pinned_custom_skills_follow_the_system_prompt() {
        let a = agent(
            Some("be brief"),
            json!([
                {"type": "custom", "skill_id": "skill_1", "version": "skillver_1", "name": "pdf-tools",
                 "description": "Fill PDF\nforms.", "content_size_bytes": 10, "content_sha256": "0".repeat(64)},
                {"type": "anthropic", "skill_id": "xlsx", "version": "latest"}
            ]),
        );
        let prompt = with_skills(a.definition.system.as_deref(), &a).unwrap();
        assert!(prompt.starts_with("be brief\n\n<skills>\n"), "{prompt}");
        assert!(
            prompt.contains("- pdf-tools: Fill PDF forms. (skills/pdf-tools/SKILL.md)\n"),
            "{prompt}"
        );
        assert!(!prompt.contains("xlsx"));
        assert!(prompt.ends_with("</skills>"));
    }

    #[test]
    fn without_custom_skills_the_prompt_is_the_agents() {
        let a = agent(Some("be brief"), json!([]));
        assert_eq!(
            with_skills(Some("be brief"), &a).as_deref(),
            Some("be brief")
        );
        assert_eq!(with_skills(None, &agent(None, json!([]))), None);
        let only = agent(
            None,
            json!([{"type": "custom", "skill_id": "s", "version": "v", "name": "n", "description": "d",
                    "content_size_bytes": 1, "content_sha256": "0".repeat(64)}]),
        );
        assert!(with_skills(None, &only).unwrap().starts_with("<skills>"));
    }
}
