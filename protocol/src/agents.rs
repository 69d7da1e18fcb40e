//! Agents (the SDK's `BetaManagedAgentsAgent`): the stored definition, and
//! the bodies that create and update one. The rules a definition must
//! follow (lengths, uniqueness, web tools only with always_allow) are the
//! api's; these are the shapes.

use crate::patch::Patch;
use crate::time::{serde_ts, Timestamp};
use crate::tools::ToolName;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// An Agent version, as the api answers with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Agent {
    #[serde(rename = "type")]
    pub kind: AgentObject,
    pub id: String,
    pub version: i32,
    #[serde(flatten)]
    pub definition: AgentDefinition,
    /// Always null: Mango runs no multi-agent coordinators.
    pub multiagent: Option<Value>,
    pub metadata: BTreeMap<String, String>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub updated_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub archived_at: Option<Timestamp>,
}

/// The literal `"agent"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AgentObject {
    #[default]
    #[serde(rename = "agent")]
    Agent,
}

/// What one version of an Agent is: immutable once written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentDefinition {
    pub name: String,
    pub description: Option<String>,
    pub system: Option<String>,
    pub model: ModelConfig,
    pub tools: Vec<AgentTool>,
    pub skills: Vec<SkillPin>,
    pub mcp_servers: Vec<McpServer>,
    pub execution_identity: ExecutionIdentity,
}

/// The Agent a Session froze at creation (`session.agent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentSnapshot {
    #[serde(rename = "type")]
    pub kind: AgentObject,
    pub id: String,
    pub version: i32,
    #[serde(flatten)]
    pub definition: AgentDefinition,
    pub multiagent: Option<Value>,
}

impl From<Agent> for AgentSnapshot {
    fn from(agent: Agent) -> AgentSnapshot {
        AgentSnapshot {
            kind: AgentObject::Agent,
            id: agent.id,
            version: agent.version,
            definition: agent.definition,
            multiagent: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelConfig {
    pub id: String,
    pub effort: Option<Effort>,
    pub inference_geo: Option<String>,
    pub speed: Speed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Effort {
    #[serde(rename = "type")]
    pub level: EffortLevel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EffortLevel {
    Low,
    Medium,
    High,
    Xhigh,
    Max,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Speed {
    #[default]
    Standard,
    Fast,
}

/// `{type: always_allow}` or `{type: always_ask}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PermissionPolicy {
    AlwaysAllow,
    AlwaysAsk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolDefaults {
    pub enabled: bool,
    pub permission_policy: PermissionPolicy,
}

/// A tool of an Agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type")]
pub enum AgentTool {
    #[serde(rename = "agent_toolset_20260401")]
    Toolset(Toolset),
    #[serde(rename = "mcp_toolset")]
    McpToolset(McpToolset),
    #[serde(rename = "custom")]
    Custom(CustomTool),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Toolset {
    pub default_config: ToolDefaults,
    pub configs: Vec<ToolsetConfig>,
}

/// One tool of `agent_toolset_20260401`, resolved against the defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolsetConfig {
    pub name: ToolsetTool,
    #[serde(rename = "type")]
    pub kind: ToolsetTool,
    pub enabled: bool,
    pub permission_policy: PermissionPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_domains: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_domains: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_content_tokens: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct McpToolset {
    pub mcp_server_name: String,
    pub default_config: ToolDefaults,
    pub configs: Vec<McpToolConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct McpToolConfig {
    pub name: String,
    pub enabled: bool,
    pub permission_policy: PermissionPolicy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CustomTool {
    pub name: String,
    pub description: String,
    pub input_schema: Map<String, Value>,
}

/// A tool of `agent_toolset_20260401`: the six the worker runs, and the two
/// web tools the model endpoint runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolsetTool {
    Worker(ToolName),
    WebFetch,
    WebSearch,
}

impl ToolsetTool {
    /// In the SDK's order.
    pub const ALL: [ToolsetTool; 8] = [
        ToolsetTool::Worker(ToolName::Bash),
        ToolsetTool::Worker(ToolName::Edit),
        ToolsetTool::Worker(ToolName::Read),
        ToolsetTool::Worker(ToolName::Write),
        ToolsetTool::Worker(ToolName::Glob),
        ToolsetTool::Worker(ToolName::Grep),
        ToolsetTool::WebFetch,
        ToolsetTool::WebSearch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolsetTool::Worker(t) => t.as_str(),
            ToolsetTool::WebFetch => "web_fetch",
            ToolsetTool::WebSearch => "web_search",
        }
    }

    pub fn parse(s: &str) -> Option<ToolsetTool> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn is_web(self) -> bool {
        !matches!(self, ToolsetTool::Worker(_))
    }

    /// The server-tool type the Messages API declares a web tool with.
    pub fn server_tool_type(self) -> Option<&'static str> {
        match self {
            ToolsetTool::Worker(_) => None,
            ToolsetTool::WebFetch => Some("web_fetch_20250910"),
            ToolsetTool::WebSearch => Some("web_search_20250305"),
        }
    }
}

impl Serialize for ToolsetTool {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ToolsetTool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        ToolsetTool::parse(&name).ok_or_else(|| {
            let all: Vec<&str> = ToolsetTool::ALL.iter().map(|t| t.as_str()).collect();
            serde::de::Error::custom(format!(
                "{name:?} is not an agent_toolset_20260401 tool; expected one of: {}",
                all.join(", ")
            ))
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SkillKind {
    Anthropic,
    Custom,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkillPin {
    #[serde(rename = "type")]
    pub kind: SkillKind,
    pub skill_id: String,
    /// A version id, or `latest` in an Agent; always a version id of a
    /// custom Skill in a Session's snapshot (frozen at its creation).
    pub version: String,
    /// In a Session's snapshot, for a custom Skill: its slug (its directory
    /// under `skills/`). Absent in an Agent. See [`FrozenSkill`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// In a Session's snapshot, for a custom Skill: its description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// In a Session's snapshot, for a custom Skill: its archive's length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_size_bytes: Option<i64>,
    /// In a Session's snapshot, for a custom Skill: its archive's lowercase hex SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_sha256: Option<String>,
}

impl SkillPin {
    /// What a Session's snapshot froze of this pin, when it has all of it.
    pub fn frozen(&self) -> Option<FrozenSkill> {
        Some(FrozenSkill {
            name: self.name.clone()?,
            description: self.description.clone()?,
            content_size_bytes: self.content_size_bytes?,
            content_sha256: self.content_sha256.clone()?,
        })
    }

    /// Records what a Session froze.
    pub fn freeze(&mut self, frozen: FrozenSkill) {
        self.name = Some(frozen.name);
        self.description = Some(frozen.description);
        self.content_size_bytes = Some(frozen.content_size_bytes);
        self.content_sha256 = Some(frozen.content_sha256);
    }
}

/// The pinned version of a custom Skill as a Session's snapshot records it
/// (Mango's extension of the SDK's skill reference, as optional fields of
/// [`SkillPin`]): enough to render it to the model and to verify its archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenSkill {
    /// The Skill's kebab-case slug: its directory under `skills/`.
    pub name: String,
    pub description: String,
    /// Length in bytes of the version's archive.
    pub content_size_bytes: i64,
    /// Lowercase hex SHA-256 of the version's archive.
    pub content_sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct McpServer {
    #[serde(rename = "type")]
    pub kind: McpServerKind,
    pub name: String,
    pub url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum McpServerKind {
    Url,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecutionIdentity {
    #[default]
    ServiceAccount,
    AwsRole {
        role_arn: String,
    },
}

// ------------------------------------------------------------------ request bodies

/// `POST /v1/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateAgent {
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub name: String,
    pub model: ModelParam,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<AgentToolParam>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<Vec<SkillParam>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Vec<McpServer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_identity: Option<ExecutionIdentity>,
    /// Checked as metadata (string values, limits) by the api.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Refused unless null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiagent: Option<Value>,
}

/// `POST /v1/agents/{id}`: every field optional; a new version is written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateAgent {
    /// The version the caller read; a different current version is 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, min_length = 1))]
    pub name: Patch<String>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<ModelParam>))]
    pub model: Patch<ModelParam>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub description: Patch<String>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub system: Patch<String>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<AgentToolParam>>))]
    pub tools: Patch<Vec<AgentToolParam>>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<SkillParam>>))]
    pub skills: Patch<Vec<SkillParam>>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<McpServer>>))]
    pub mcp_servers: Patch<Vec<McpServer>>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<ExecutionIdentity>))]
    pub execution_identity: Patch<ExecutionIdentity>,
    /// A patch: a string sets, null deletes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiagent: Option<Value>,
}

/// `model`: a model id, or `{id, effort?, inference_geo?, speed?}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum ModelParam {
    Id(String),
    Config(ModelConfigParam),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelConfigParam {
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<EffortParam>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_geo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<Speed>,
}

/// `effort`: a level, or `{type: level}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum EffortParam {
    Level(EffortLevel),
    Object(Effort),
}

impl<'de> Deserialize<'de> for ModelParam {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::strict::string_or_object(
            d,
            "a model id string or an object with an id",
            ModelParam::Id,
            ModelParam::Config,
        )
    }
}

impl<'de> Deserialize<'de> for EffortParam {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::strict::string_or_object(
            d,
            "a level string or {\"type\": level}",
            EffortParam::Level,
            EffortParam::Object,
        )
    }
}

impl EffortParam {
    pub fn level(self) -> EffortLevel {
        match self {
            EffortParam::Level(l) => l,
            EffortParam::Object(e) => e.level,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type")]
pub enum AgentToolParam {
    #[serde(rename = "agent_toolset_20260401")]
    Toolset(ToolsetParam),
    #[serde(rename = "mcp_toolset")]
    McpToolset(McpToolsetParam),
    #[serde(rename = "custom")]
    Custom(CustomTool),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolDefaultsParam {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_policy: Option<PermissionPolicy>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolsetParam {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_config: Option<ToolDefaultsParam>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configs: Option<Vec<ToolsetConfigParam>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolsetConfigParam {
    pub name: ToolsetTool,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolsetTool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_policy: Option<PermissionPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_domains: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_domains: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_content_tokens: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct McpToolsetParam {
    pub mcp_server_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_config: Option<ToolDefaultsParam>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configs: Option<Vec<McpToolConfigParam>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct McpToolConfigParam {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_policy: Option<PermissionPolicy>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkillParam {
    #[serde(rename = "type")]
    pub kind: SkillKind,
    pub skill_id: String,
    /// Absent or null: `latest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strict;
    use serde_json::json;

    #[test]
    fn a_stored_agent_reads_and_writes_the_sdk_shape() {
        let v = json!({
            "type": "agent", "id": "agent_1", "version": 2, "name": "n", "description": null, "system": "s",
            "model": {"id": "m", "effort": {"type": "high"}, "inference_geo": null, "speed": "standard"},
            "tools": [
                {"type": "agent_toolset_20260401",
                 "default_config": {"enabled": true, "permission_policy": {"type": "always_allow"}},
                 "configs": [{"name": "bash", "type": "bash", "enabled": true, "permission_policy": {"type": "always_ask"}},
                             {"name": "web_fetch", "type": "web_fetch", "enabled": false,
                              "permission_policy": {"type": "always_allow"}, "max_content_tokens": 5}]},
                {"type": "mcp_toolset", "mcp_server_name": "s1",
                 "default_config": {"enabled": true, "permission_policy": {"type": "always_ask"}}, "configs": []},
                {"type": "custom", "name": "lookup", "description": "d", "input_schema": {"type": "object"}}
            ],
            "skills": [{"type": "custom", "skill_id": "skill_1", "version": "latest"}],
            "mcp_servers": [{"type": "url", "name": "s1", "url": "https://x"}],
            "execution_identity": {"type": "aws_role", "role_arn": "arn:x"},
            "multiagent": null, "metadata": {"k": "v"},
            "created_at": "2026-12-01T00:00:00.000000Z", "updated_at": "2026-12-01T00:00:00.000000Z", "archived_at": null
        });
        let agent: Agent = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&agent).unwrap(), v);
    }

    #[test]
    fn bodies_take_every_shape_the_sdk_sends() {
        let body: CreateAgent = strict::from_value(json!({
            "name": "n", "model": "claude", "tools": [{"type": "agent_toolset_20260401"}]
        }))
        .unwrap();
        assert_eq!(body.model, ModelParam::Id("claude".into()));
        let body: CreateAgent = strict::from_value(json!({
            "name": "n", "model": {"id": "m", "effort": "low"},
            "skills": [{"type": "anthropic", "skill_id": "pdf", "version": null}]
        }))
        .unwrap();
        let ModelParam::Config(m) = body.model else {
            panic!("an object")
        };
        assert_eq!(m.effort.map(EffortParam::level), Some(EffortLevel::Low));
        let err = strict::from_value::<CreateAgent>(json!({
            "name": "n", "model": "m",
            "tools": [{"type": "agent_toolset_20260401", "configs": [{"name": "rm_rf"}]}]
        }))
        .unwrap_err();
        assert!(err.to_string().contains("rm_rf"), "{err}");
        let update: UpdateAgent =
            strict::from_value(json!({"description": null, "version": 3})).unwrap();
        assert_eq!(update.description, Patch::Null);
        assert!(update.name.is_absent());
    }
}
