//! The tools an Agent snapshot gives the model, resolved per tool.

use mango_protocol::agents::{AgentSnapshot, AgentTool, CustomTool, PermissionPolicy, ToolsetTool};
use mango_protocol::tools::ToolName;
use serde_json::{json, Value};

/// What the agent snapshot allows, resolved per tool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentTools {
    /// Enabled toolset tools the worker runs, with `true` when the policy is `always_ask`.
    pub worker: Vec<(ToolName, bool)>,
    /// Enabled web tools (always_allow by construction); the model endpoint runs them.
    pub web: Vec<ToolsetTool>,
    /// Operator custom tools.
    pub custom: Vec<CustomTool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallClass {
    Worker {
        ask: bool,
    },
    Custom,
    /// Not a tool of this agent: recorded as a denied call and answered with an error.
    Unknown,
}

impl AgentTools {
    /// Reads the frozen `agent.tools` of a Session.
    pub fn from_snapshot(agent: &AgentSnapshot) -> AgentTools {
        let mut out = AgentTools::default();
        for tool in &agent.definition.tools {
            match tool {
                AgentTool::Toolset(set) => {
                    let setting = |t: ToolsetTool| {
                        set.configs.iter().find(|c| c.name == t).map_or(
                            (
                                set.default_config.enabled,
                                set.default_config.permission_policy,
                            ),
                            |c| (c.enabled, c.permission_policy),
                        )
                    };
                    for name in ToolName::ALL {
                        let (on, policy) = setting(ToolsetTool::Worker(name));
                        if on {
                            out.worker
                                .push((name, policy == PermissionPolicy::AlwaysAsk));
                        }
                    }
                    for web in [ToolsetTool::WebSearch, ToolsetTool::WebFetch] {
                        if setting(web).0 {
                            out.web.push(web);
                        }
                    }
                }
                AgentTool::Custom(custom) => out.custom.push(custom.clone()),
                AgentTool::McpToolset(_) => {}
            }
        }
        out
    }

    /// The Messages API `tools` array.
    pub fn declarations(&self) -> Vec<Value> {
        let mut tools: Vec<Value> = self
            .worker
            .iter()
            .map(|(name, _)| name.spec().declaration())
            .collect();
        tools.extend(self.custom.iter().map(|c| {
            json!({"name": c.name, "description": c.description, "input_schema": c.input_schema})
        }));
        for web in &self.web {
            tools.push(json!({"type": web.server_tool_type(), "name": web.as_str()}));
        }
        tools
    }

    /// How a tool call the model made is handled.
    pub fn classify(&self, name: &str) -> CallClass {
        if let Some((_, ask)) = self.worker.iter().find(|(n, _)| n.as_str() == name) {
            return CallClass::Worker { ask: *ask };
        }
        if self.custom.iter().any(|c| c.name == name) {
            return CallClass::Custom;
        }
        CallClass::Unknown
    }
}

#[cfg(test)]
pub(crate) fn test_agent() -> AgentSnapshot {
    serde_json::from_value(json!({
        "type": "agent", "id": "agent_1", "version": 1, "name": "a", "description": null,
        "system": "be brief",
        "model": {"id": "claude-test", "effort": null, "inference_geo": null, "speed": "standard"},
        "tools": [
            {"type": "agent_toolset_20260401",
             "default_config": {"enabled": true, "permission_policy": {"type": "always_allow"}},
             "configs": [
                 {"name": "bash", "type": "bash", "enabled": true, "permission_policy": {"type": "always_ask"}},
                 {"name": "grep", "type": "grep", "enabled": false, "permission_policy": {"type": "always_allow"}},
                 {"name": "web_fetch", "type": "web_fetch", "enabled": false, "permission_policy": {"type": "always_allow"}}]},
            {"type": "custom", "name": "lookup", "description": "d", "input_schema": {"type": "object"}}
        ],
        "skills": [], "mcp_servers": [], "execution_identity": {"type": "service_account"},
        "multiagent": null
    }))
    .expect("a snapshot")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_resolve_per_tool_over_the_default() {
        let tools = AgentTools::from_snapshot(&test_agent());
        assert_eq!(tools.classify("bash"), CallClass::Worker { ask: true });
        assert_eq!(tools.classify("read"), CallClass::Worker { ask: false });
        assert_eq!(tools.classify("grep"), CallClass::Unknown, "disabled");
        assert_eq!(tools.classify("lookup"), CallClass::Custom);
        assert_eq!(tools.web, vec![ToolsetTool::WebSearch]);
        let declared = tools.declarations();
        let names: Vec<&str> = declared
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "bash",
                "read",
                "write",
                "edit",
                "glob",
                "lookup",
                "web_search"
            ]
        );
        assert_eq!(declared[6]["type"], "web_search_20250305");
        assert_eq!(
            declared[1]["input_schema"]["required"],
            json!(["file_path"]),
            "the runner's own parameter table"
        );
    }
}
