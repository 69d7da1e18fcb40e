//! What an Agent definition may contain, beyond its shape
//! ([`mango_protocol::agents`]): lengths and counts, uniqueness, the
//! toolset's per-tool options, web tools only with always_allow, MCP
//! servers and toolsets naming each other. Pure: a body in, the normalised
//! version the store keeps out, or a 400 naming the field.

use crate::error::{ApiError, ApiResult};
use crate::extract::check_len;
use crate::metadata;
use crate::store::agents::Version;
use mango_protocol::agents::{
    AgentDefinition, AgentTool, AgentToolParam, CreateAgent, CustomTool, Effort, ExecutionIdentity,
    McpServer, McpToolConfig, McpToolset, McpToolsetParam, ModelConfig, ModelParam,
    PermissionPolicy, SkillParam, SkillPin, Speed, ToolDefaults, ToolDefaultsParam, Toolset,
    ToolsetConfig, ToolsetParam, ToolsetTool, UpdateAgent,
};
use mango_protocol::patch::Patch;
use mango_protocol::strict::FieldError;
use mango_protocol::ErrorCode;
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};

pub const MAX_NAME_CHARS: usize = 256;
pub const MAX_DESCRIPTION_CHARS: usize = 2048;
pub const MAX_SYSTEM_CHARS: usize = 100_000;
pub const MAX_MODEL_CHARS: usize = 256;
pub const MAX_TOOLS: usize = 256;
pub const MAX_MCP_SERVERS: usize = 20;
pub const MAX_SKILLS: usize = 64;
pub const MAX_DOMAINS: usize = 64;

/// The code of a shape error in an Agent body: anything wrong inside a tool
/// is `invalid_tools`, except a field no tool has.
pub fn shape_error_code(err: &FieldError) -> ErrorCode {
    if err.path.starts_with("tools[") && err.message != "unknown field" {
        ErrorCode::InvalidTools
    } else if err.path == "metadata" || err.path.starts_with("metadata.") {
        ErrorCode::InvalidMetadata
    } else {
        ErrorCode::InvalidParameter
    }
}

fn invalid_tools(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message).code(ErrorCode::InvalidTools)
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid_parameter(message)
}

/// A new Agent's version 1.
pub fn create(body: CreateAgent) -> ApiResult<Version> {
    no_multiagent(body.multiagent.as_ref())?;
    let definition = AgentDefinition {
        name: name(&body.name)?,
        description: text("description", body.description, MAX_DESCRIPTION_CHARS)?,
        system: text("system", body.system, MAX_SYSTEM_CHARS)?,
        model: model(body.model)?,
        tools: tools(body.tools.unwrap_or_default())?,
        skills: skills(body.skills.unwrap_or_default())?,
        mcp_servers: mcp_servers(body.mcp_servers.unwrap_or_default())?,
        execution_identity: execution_identity(body.execution_identity.unwrap_or_default())?,
    };
    check_mcp_references(&definition)?;
    Ok(Version {
        definition,
        metadata: metadata::to_json(&metadata::validate(body.metadata.as_ref())?),
    })
}

/// The next version: `body` applied to `current` (absent fields are kept).
pub fn update(current: &Version, body: UpdateAgent) -> ApiResult<Version> {
    no_multiagent(body.multiagent.as_ref())?;
    let mut def = current.definition.clone();
    match body.name {
        Patch::Absent => {}
        Patch::Null => {
            return Err(invalid(
                "name must be a non-empty string; it cannot be cleared",
            ))
        }
        Patch::Set(n) => def.name = name(&n)?,
    }
    if let Some(d) = body.description.into_option() {
        def.description = text("description", d, MAX_DESCRIPTION_CHARS)?;
    }
    if let Some(s) = body.system.into_option() {
        def.system = text("system", s, MAX_SYSTEM_CHARS)?;
    }
    match body.model {
        Patch::Absent => {}
        Patch::Null => return Err(invalid("model cannot be cleared")),
        Patch::Set(m) => def.model = model(m)?,
    }
    if let Some(t) = body.tools.into_option() {
        def.tools = tools(t.unwrap_or_default())?;
    }
    if let Some(s) = body.skills.into_option() {
        def.skills = skills(s.unwrap_or_default())?;
    }
    if let Some(m) = body.mcp_servers.into_option() {
        def.mcp_servers = mcp_servers(m.unwrap_or_default())?;
    }
    if let Some(e) = body.execution_identity.into_option() {
        def.execution_identity = execution_identity(e.unwrap_or_default())?;
    }
    let metadata = match &body.metadata {
        None => current.metadata.clone(),
        Some(patch) => metadata::to_json(&metadata::merge(
            &metadata::from_json(&current.metadata),
            patch,
            false,
        )?),
    };
    check_mcp_references(&def)?;
    Ok(Version {
        definition: def,
        metadata,
    })
}

fn no_multiagent(value: Option<&Value>) -> ApiResult<()> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(invalid(
            "multiagent is not supported by Mango; omit it or send null",
        )),
    }
}

fn name(value: &str) -> ApiResult<String> {
    if value.trim().is_empty() {
        return Err(invalid("name must not be empty"));
    }
    check_len("name", value, MAX_NAME_CHARS)?;
    Ok(value.to_string())
}

/// Optional text; null and "" both mean none.
fn text(field: &str, value: Option<String>, max: usize) -> ApiResult<Option<String>> {
    match value {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => {
            check_len(field, &s, max)?;
            Ok(Some(s))
        }
    }
}

/// `model`, stored as the object the SDK returns.
fn model(value: ModelParam) -> ApiResult<ModelConfig> {
    let check_id = |id: &str| -> ApiResult<()> {
        if id.trim().is_empty() {
            return Err(invalid("model id must not be empty"));
        }
        check_len("model id", id, MAX_MODEL_CHARS)
    };
    match value {
        ModelParam::Id(id) => {
            check_id(&id)?;
            Ok(ModelConfig {
                id,
                effort: None,
                inference_geo: None,
                speed: Speed::Standard,
            })
        }
        ModelParam::Config(m) => {
            check_id(&m.id)?;
            if let Some(geo) = &m.inference_geo {
                if geo.is_empty() {
                    return Err(invalid(
                        "model.inference_geo must be a non-empty string or null",
                    ));
                }
                check_len("model.inference_geo", geo, 64)?;
            }
            Ok(ModelConfig {
                id: m.id,
                effort: m.effort.map(|e| Effort { level: e.level() }),
                inference_geo: m.inference_geo,
                speed: m.speed.unwrap_or_default(),
            })
        }
    }
}

/// `default_config` resolved against the toolset's default policy.
fn defaults(value: Option<ToolDefaultsParam>, policy: PermissionPolicy) -> ToolDefaults {
    let value = value.unwrap_or_default();
    ToolDefaults {
        enabled: value.enabled.unwrap_or(true),
        permission_policy: value.permission_policy.unwrap_or(policy),
    }
}

fn domains(what: &str, list: &[String]) -> ApiResult<()> {
    if list.is_empty() || list.len() > MAX_DOMAINS {
        return Err(invalid_tools(format!(
            "{what} must list 1 to {MAX_DOMAINS} domains (omit it instead of sending an empty list)"
        )));
    }
    if list
        .iter()
        .any(|d| d.is_empty() || d.contains(['/', ':', ' ']))
    {
        return Err(invalid_tools(format!(
            "{what} entries must be plain hostnames like \"docs.example.com\""
        )));
    }
    Ok(())
}

fn toolset(what: &str, param: ToolsetParam) -> ApiResult<Toolset> {
    let default_config = defaults(param.default_config, PermissionPolicy::AlwaysAllow);
    let mut configs: Vec<ToolsetConfig> = Vec::new();
    let mut seen = HashSet::new();
    for (j, c) in param.configs.unwrap_or_default().into_iter().enumerate() {
        let cw = format!("{what}.configs[{j}]");
        let tool = c.name;
        if c.kind.is_some_and(|k| k != tool) {
            return Err(invalid_tools(format!(
                "{cw}.type must equal its name {:?}",
                tool.as_str()
            )));
        }
        if !seen.insert(tool) {
            return Err(invalid_tools(format!(
                "{what}.configs names {:?} more than once",
                tool.as_str()
            )));
        }
        let has_domains = c.allowed_domains.is_some() || c.blocked_domains.is_some();
        if has_domains && !tool.is_web() {
            return Err(invalid(format!(
                "unknown field {cw}.{}: only web tools take domains",
                if c.allowed_domains.is_some() {
                    "allowed_domains"
                } else {
                    "blocked_domains"
                }
            )));
        }
        if c.max_content_tokens.is_some() && tool != ToolsetTool::WebFetch {
            return Err(invalid(format!(
                "unknown field {cw}.max_content_tokens: only web_fetch takes it"
            )));
        }
        if c.allowed_domains.is_some() && c.blocked_domains.is_some() {
            return Err(invalid_tools(format!(
                "{cw}: allowed_domains cannot be combined with blocked_domains"
            )));
        }
        for (key, list) in [
            ("allowed_domains", &c.allowed_domains),
            ("blocked_domains", &c.blocked_domains),
        ] {
            if let Some(list) = list {
                domains(&format!("{cw}.{key}"), list)?;
            }
        }
        if c.max_content_tokens.is_some_and(|n| n < 1) {
            return Err(invalid_tools(format!(
                "{cw}.max_content_tokens must be a positive integer"
            )));
        }
        configs.push(ToolsetConfig {
            name: tool,
            kind: tool,
            enabled: c.enabled.unwrap_or(default_config.enabled),
            permission_policy: c
                .permission_policy
                .unwrap_or(default_config.permission_policy),
            allowed_domains: c.allowed_domains,
            blocked_domains: c.blocked_domains,
            max_content_tokens: c.max_content_tokens,
        });
    }
    // Web tools run without a confirmation round trip: always_allow only.
    for web in [ToolsetTool::WebFetch, ToolsetTool::WebSearch] {
        let (enabled, policy, source) = match configs.iter().find(|c| c.name == web) {
            Some(c) => (c.enabled, c.permission_policy, "its config"),
            None => (
                default_config.enabled,
                default_config.permission_policy,
                "default_config",
            ),
        };
        if enabled && policy == PermissionPolicy::AlwaysAsk {
            let web = web.as_str();
            return Err(invalid_tools(format!(
                "{what}: {web} would be enabled with always_ask (from {source}); web tools \
                 require always_allow, so configure {web} with always_allow or disable it"
            )));
        }
    }
    Ok(Toolset {
        default_config,
        configs,
    })
}

fn mcp_toolset(what: &str, param: McpToolsetParam) -> ApiResult<McpToolset> {
    let server = param.mcp_server_name;
    if server.is_empty() || server.chars().count() > 255 {
        return Err(invalid_tools(format!(
            "{what}.mcp_server_name must be 1-255 characters"
        )));
    }
    let default_config = defaults(param.default_config, PermissionPolicy::AlwaysAsk);
    let mut configs = Vec::new();
    let mut seen = BTreeSet::new();
    for (j, c) in param.configs.unwrap_or_default().into_iter().enumerate() {
        if c.name.is_empty() || !seen.insert(c.name.clone()) {
            return Err(invalid_tools(format!(
                "{what}.configs[{j}].name must be non-empty and unique within the toolset"
            )));
        }
        configs.push(McpToolConfig {
            name: c.name,
            enabled: c.enabled.unwrap_or(default_config.enabled),
            permission_policy: c
                .permission_policy
                .unwrap_or(default_config.permission_policy),
        });
    }
    Ok(McpToolset {
        mcp_server_name: server,
        default_config,
        configs,
    })
}

fn custom_tool(what: &str, tool: CustomTool) -> ApiResult<CustomTool> {
    let valid_name = !tool.name.is_empty()
        && tool.name.chars().count() <= 128
        && tool
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(invalid_tools(format!(
            "{what}.name {:?} must be 1-128 letters, digits, underscores or hyphens",
            tool.name
        )));
    }
    if tool.description.trim().is_empty() {
        return Err(invalid_tools(format!(
            "{what}.description must not be empty"
        )));
    }
    check_len(&format!("{what}.description"), &tool.description, 8192)?;
    let sw = format!("{what}.input_schema");
    let schema = &tool.input_schema;
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(invalid_tools(format!("{sw}.type must be \"object\"")));
    }
    match schema.get("properties") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(_) => return Err(invalid_tools(format!("{sw}.properties must be an object"))),
    }
    match schema.get("required") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {}
        Some(_) => {
            return Err(invalid_tools(format!(
                "{sw}.required must be an array of strings"
            )))
        }
    }
    Ok(tool)
}

fn tools(list: Vec<AgentToolParam>) -> ApiResult<Vec<AgentTool>> {
    if list.len() > MAX_TOOLS {
        return Err(invalid_tools(format!(
            "tools has {} entries; at most {MAX_TOOLS} are allowed",
            list.len()
        )));
    }
    let mut out = Vec::with_capacity(list.len());
    let mut has_toolset = false;
    let mut names = BTreeSet::new();
    let mut servers = BTreeSet::new();
    for (i, t) in list.into_iter().enumerate() {
        let what = format!("tools[{i}]");
        out.push(match t {
            AgentToolParam::Toolset(param) => {
                if std::mem::replace(&mut has_toolset, true) {
                    return Err(invalid_tools(
                        "tools lists agent_toolset_20260401 more than once",
                    ));
                }
                AgentTool::Toolset(toolset(&what, param)?)
            }
            AgentToolParam::McpToolset(param) => {
                let t = mcp_toolset(&what, param)?;
                if !servers.insert(t.mcp_server_name.clone()) {
                    return Err(invalid_tools(format!(
                        "tools lists the mcp_toolset for {:?} more than once",
                        t.mcp_server_name
                    )));
                }
                AgentTool::McpToolset(t)
            }
            AgentToolParam::Custom(tool) => {
                let t = custom_tool(&what, tool)?;
                if !names.insert(t.name.clone()) {
                    return Err(invalid_tools(format!(
                        "tools has more than one custom tool named {:?}",
                        t.name
                    )));
                }
                AgentTool::Custom(t)
            }
        });
    }
    Ok(out)
}

/// An unpinned skill is stored as version `latest`.
fn skills(list: Vec<SkillParam>) -> ApiResult<Vec<SkillPin>> {
    if list.len() > MAX_SKILLS {
        return Err(invalid(format!(
            "skills has {} entries; at most {MAX_SKILLS} are allowed",
            list.len()
        )));
    }
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, s) in list.into_iter().enumerate() {
        let what = format!("skills[{i}]");
        if s.skill_id.trim().is_empty() {
            return Err(invalid(format!("{what}.skill_id must not be empty")));
        }
        check_len(&format!("{what}.skill_id"), &s.skill_id, 256)?;
        let version = match s.version {
            None => "latest".to_string(),
            Some(v) if !v.trim().is_empty() => {
                check_len(&format!("{what}.version"), &v, 64)?;
                v
            }
            Some(_) => {
                return Err(invalid(format!(
                    "{what}.version must be a non-empty string or null"
                )))
            }
        };
        if !seen.insert((s.kind, s.skill_id.clone())) {
            return Err(invalid(format!(
                "skills lists skill {:?} more than once",
                s.skill_id
            )));
        }
        out.push(SkillPin {
            kind: s.kind,
            skill_id: s.skill_id,
            version,
            name: None,
            description: None,
            content_size_bytes: None,
            content_sha256: None,
        });
    }
    Ok(out)
}

/// MCP servers, names unique.
fn mcp_servers(list: Vec<McpServer>) -> ApiResult<Vec<McpServer>> {
    if list.len() > MAX_MCP_SERVERS {
        return Err(invalid(format!(
            "mcp_servers has {} entries; at most {MAX_MCP_SERVERS} are allowed",
            list.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for (i, s) in list.iter().enumerate() {
        let what = format!("mcp_servers[{i}]");
        if s.name.is_empty() || s.name.chars().count() > 255 {
            return Err(invalid(format!("{what}.name must be 1-255 characters")));
        }
        if !(s.url.starts_with("https://") || s.url.starts_with("http://")) {
            return Err(invalid(format!("{what}.url must be an http(s) URL")));
        }
        check_len(&format!("{what}.url"), &s.url, 2048)?;
        if !seen.insert(s.name.as_str()) {
            return Err(invalid(format!(
                "mcp_servers names {:?} more than once",
                s.name
            )));
        }
    }
    Ok(list)
}

/// Every mcp_toolset names a server in `mcp_servers`, and every server is used.
fn check_mcp_references(def: &AgentDefinition) -> ApiResult<()> {
    let declared: BTreeSet<&str> = def.mcp_servers.iter().map(|s| s.name.as_str()).collect();
    let used: BTreeSet<&str> = def
        .tools
        .iter()
        .filter_map(|t| match t {
            AgentTool::McpToolset(m) => Some(m.mcp_server_name.as_str()),
            _ => None,
        })
        .collect();
    if let Some(missing) = used.difference(&declared).next() {
        return Err(invalid_tools(format!(
            "an mcp_toolset names MCP server {missing:?}, which is not in mcp_servers"
        )));
    }
    if let Some(unused) = declared.difference(&used).next() {
        return Err(invalid(format!(
            "MCP server {unused:?} is not referenced by any mcp_toolset in tools"
        )));
    }
    Ok(())
}

fn execution_identity(value: ExecutionIdentity) -> ApiResult<ExecutionIdentity> {
    if let ExecutionIdentity::AwsRole { role_arn } = &value {
        if !role_arn.starts_with("arn:") {
            return Err(invalid("execution_identity.role_arn must be an ARN"));
        }
        check_len("execution_identity.role_arn", role_arn, 2048)?;
    }
    Ok(value)
}
