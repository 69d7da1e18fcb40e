//! What an Agent definition may contain, checked field by field: model,
//! system prompt, the agent toolset and its permission policies, custom and
//! MCP tools, Skill pins. Pure: each function returns the normalised JSON the
//! store keeps, or a 400 naming the field.

use crate::error::{ApiError, ApiResult};
use crate::extract::{check_len, Body};
use mango_protocol::ErrorCode;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

pub(crate) const CREATE_FIELDS: &[&str] = &[
    "model",
    "name",
    "description",
    "execution_identity",
    "mcp_servers",
    "metadata",
    "multiagent",
    "skills",
    "system",
    "tools",
];
pub(crate) const UPDATE_FIELDS: &[&str] = &[
    "model",
    "name",
    "description",
    "execution_identity",
    "mcp_servers",
    "metadata",
    "multiagent",
    "skills",
    "system",
    "tools",
    "version",
];
pub(crate) const MAX_NAME_CHARS: usize = 256;
pub(crate) const MAX_DESCRIPTION_CHARS: usize = 2048;
pub(crate) const MAX_SYSTEM_CHARS: usize = 100_000;
pub(crate) const MAX_MODEL_CHARS: usize = 256;
pub(crate) const MAX_TOOLS: usize = 256;
pub(crate) const MAX_MCP_SERVERS: usize = 20;
pub(crate) const MAX_SKILLS: usize = 64;
pub(crate) const MAX_DOMAINS: usize = 64;
pub(crate) const AGENT_TOOLS: [&str; 8] = [
    "bash",
    "edit",
    "read",
    "write",
    "glob",
    "grep",
    "web_fetch",
    "web_search",
];
pub(crate) const WEB_TOOLS: [&str; 2] = ["web_fetch", "web_search"];
pub(crate) const EFFORTS: [&str; 5] = ["low", "medium", "high", "xhigh", "max"];

pub(crate) fn invalid_tools(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message).code(ErrorCode::InvalidTools)
}

pub(crate) fn object<'a>(what: &str, value: &'a Value) -> ApiResult<&'a Map<String, Value>> {
    value
        .as_object()
        .ok_or_else(|| ApiError::invalid_parameter(format!("{what} must be an object")))
}

pub(crate) fn array<'a>(what: &str, value: &'a Value) -> ApiResult<&'a Vec<Value>> {
    value
        .as_array()
        .ok_or_else(|| ApiError::invalid_parameter(format!("{what} must be an array")))
}

/// Refuses keys of `map` outside `allowed`, naming the full path.
pub(crate) fn only(what: &str, map: &Map<String, Value>, allowed: &[&str]) -> ApiResult<()> {
    if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::invalid_parameter(format!(
            "unknown field {what}.{k}; expected one of: {}",
            allowed.join(", ")
        )));
    }
    Ok(())
}

pub(crate) fn str_field<'a>(
    what: &str,
    map: &'a Map<String, Value>,
    key: &str,
) -> ApiResult<&'a str> {
    match map.get(key) {
        None | Some(Value::Null) => Err(ApiError::invalid_parameter(format!(
            "{what}.{key} is required"
        ))),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ApiError::invalid_parameter(format!(
            "{what}.{key} must be a string"
        ))),
    }
}

pub(crate) fn opt_bool(what: &str, map: &Map<String, Value>, key: &str) -> ApiResult<Option<bool>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid_parameter(format!(
            "{what}.{key} must be a boolean"
        ))),
    }
}

pub(crate) fn name(value: &str) -> ApiResult<String> {
    if value.trim().is_empty() {
        return Err(ApiError::invalid_parameter("name must not be empty"));
    }
    check_len("name", value, MAX_NAME_CHARS)?;
    Ok(value.to_string())
}

/// Optional text; null and "" both mean none.
pub(crate) fn text(field: &str, value: Option<&str>, max: usize) -> ApiResult<Option<String>> {
    match value {
        None | Some("") => Ok(None),
        Some(s) => {
            check_len(field, s, max)?;
            Ok(Some(s.to_string()))
        }
    }
}

/// `model`: a model id string or `{id, effort?, inference_geo?, speed?}`,
/// stored as the object the SDK returns.
pub(crate) fn model(value: &Value) -> ApiResult<Value> {
    let model_id = |s: &str| -> ApiResult<String> {
        if s.trim().is_empty() {
            return Err(ApiError::invalid_parameter("model id must not be empty"));
        }
        check_len("model id", s, MAX_MODEL_CHARS)?;
        Ok(s.to_string())
    };
    match value {
        Value::String(s) => Ok(json!({
            "id": model_id(s)?, "effort": null, "inference_geo": null, "speed": "standard"
        })),
        Value::Object(map) => {
            only("model", map, &["id", "effort", "inference_geo", "speed"])?;
            let id = model_id(str_field("model", map, "id")?)?;
            let level = |s: &str| -> ApiResult<Value> {
                if EFFORTS.contains(&s) {
                    Ok(json!({"type": s}))
                } else {
                    Err(ApiError::invalid_parameter(format!(
                        "model.effort must be one of {}, got {s:?}",
                        EFFORTS.join(", ")
                    )))
                }
            };
            let effort = match map.get("effort") {
                None | Some(Value::Null) => Value::Null,
                Some(Value::String(s)) => level(s)?,
                Some(Value::Object(e)) => {
                    only("model.effort", e, &["type"])?;
                    level(str_field("model.effort", e, "type")?)?
                }
                Some(_) => {
                    return Err(ApiError::invalid_parameter(
                        "model.effort must be a level string or {\"type\": level}",
                    ))
                }
            };
            let inference_geo = match map.get("inference_geo") {
                None | Some(Value::Null) => Value::Null,
                Some(Value::String(s)) if !s.is_empty() => {
                    check_len("model.inference_geo", s, 64)?;
                    Value::String(s.clone())
                }
                Some(_) => {
                    return Err(ApiError::invalid_parameter(
                        "model.inference_geo must be a non-empty string or null",
                    ))
                }
            };
            let speed = match map.get("speed") {
                None | Some(Value::Null) => "standard",
                Some(Value::String(s)) if s == "standard" || s == "fast" => s.as_str(),
                Some(other) => {
                    return Err(ApiError::invalid_parameter(format!(
                        "model.speed must be \"standard\" or \"fast\", got {other}"
                    )))
                }
            };
            Ok(json!({"id": id, "effort": effort, "inference_geo": inference_geo, "speed": speed}))
        }
        _ => Err(ApiError::invalid_parameter(
            "model must be a model id string or an object with an id",
        )),
    }
}

/// `{type: always_allow|always_ask}`; null or absent inherits.
pub(crate) fn permission_policy(
    what: &str,
    value: Option<&Value>,
) -> ApiResult<Option<&'static str>> {
    let policy = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(map)) => {
            only(what, map, &["type"])?;
            str_field(what, map, "type")?
        }
        Some(_) => {
            return Err(invalid_tools(format!(
                "{what} must be an object like {{\"type\": \"always_allow\"}}"
            )))
        }
    };
    match policy {
        "always_allow" => Ok(Some("always_allow")),
        "always_ask" => Ok(Some("always_ask")),
        other => Err(invalid_tools(format!(
            "{what}.type {other:?} is not supported: use \"always_allow\" or \"always_ask\""
        ))),
    }
}

/// `default_config: {enabled?, permission_policy?}` resolved against `default_policy`.
pub(crate) fn default_config(
    what: &str,
    value: Option<&Value>,
    default_policy: &'static str,
) -> ApiResult<(bool, &'static str)> {
    match value {
        None | Some(Value::Null) => Ok((true, default_policy)),
        Some(v) => {
            let map = object(what, v)?;
            only(what, map, &["enabled", "permission_policy"])?;
            let enabled = opt_bool(what, map, "enabled")?.unwrap_or(true);
            let policy = permission_policy(
                &format!("{what}.permission_policy"),
                map.get("permission_policy"),
            )?
            .unwrap_or(default_policy);
            Ok((enabled, policy))
        }
    }
}

pub(crate) fn domains(what: &str, value: &Value) -> ApiResult<Value> {
    let list = array(what, value)?;
    if list.is_empty() || list.len() > MAX_DOMAINS {
        return Err(invalid_tools(format!(
            "{what} must list 1 to {MAX_DOMAINS} domains (omit it instead of sending an empty list)"
        )));
    }
    for d in list {
        match d.as_str() {
            Some(s) if !s.is_empty() && !s.contains(['/', ':', ' ']) => {}
            _ => {
                return Err(invalid_tools(format!(
                    "{what} entries must be plain hostnames like \"docs.example.com\""
                )))
            }
        }
    }
    Ok(value.clone())
}

pub(crate) fn agent_toolset(what: &str, map: &Map<String, Value>) -> ApiResult<Value> {
    only(what, map, &["type", "default_config", "configs"])?;
    let (default_enabled, default_policy) = default_config(
        &format!("{what}.default_config"),
        map.get("default_config"),
        "always_allow",
    )?;
    let mut configs = Vec::new();
    let mut seen = BTreeSet::new();
    let empty = Vec::new();
    let given = match map.get("configs") {
        None | Some(Value::Null) => &empty,
        Some(v) => array(&format!("{what}.configs"), v)?,
    };
    for (j, c) in given.iter().enumerate() {
        let cw = format!("{what}.configs[{j}]");
        let c = object(&cw, c)?;
        let tool = str_field(&cw, c, "name")?;
        if !AGENT_TOOLS.contains(&tool) {
            return Err(invalid_tools(format!(
                "{cw}.name {tool:?} is not an agent_toolset_20260401 tool; expected one of: {}",
                AGENT_TOOLS.join(", ")
            )));
        }
        let mut allowed = vec!["name", "type", "enabled", "permission_policy"];
        if WEB_TOOLS.contains(&tool) {
            allowed.extend(["allowed_domains", "blocked_domains"]);
        }
        if tool == "web_fetch" {
            allowed.push("max_content_tokens");
        }
        only(&cw, c, &allowed)?;
        if let Some(t) = c.get("type").filter(|t| !t.is_null()) {
            if t.as_str() != Some(tool) {
                return Err(invalid_tools(format!(
                    "{cw}.type must equal its name {tool:?}"
                )));
            }
        }
        if !seen.insert(tool) {
            return Err(invalid_tools(format!(
                "{what}.configs names {tool:?} more than once"
            )));
        }
        let enabled = opt_bool(&cw, c, "enabled")?.unwrap_or(default_enabled);
        let policy = permission_policy(
            &format!("{cw}.permission_policy"),
            c.get("permission_policy"),
        )?
        .unwrap_or(default_policy);
        let mut out = json!({
            "name": tool, "type": tool, "enabled": enabled,
            "permission_policy": {"type": policy},
        });
        if c.contains_key("allowed_domains") && c.contains_key("blocked_domains") {
            return Err(invalid_tools(format!(
                "{cw}: allowed_domains cannot be combined with blocked_domains"
            )));
        }
        for key in ["allowed_domains", "blocked_domains"] {
            if let Some(v) = c.get(key) {
                out[key] = domains(&format!("{cw}.{key}"), v)?;
            }
        }
        match c.get("max_content_tokens") {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_i64() {
                Some(n) if n >= 1 => out["max_content_tokens"] = json!(n),
                _ => {
                    return Err(invalid_tools(format!(
                        "{cw}.max_content_tokens must be a positive integer"
                    )))
                }
            },
        }
        configs.push(out);
    }
    // Web tools run without a confirmation round-trip: always_allow only.
    for web in WEB_TOOLS {
        let (enabled, policy, source) = match configs.iter().find(|c| c["name"] == web) {
            Some(c) => (
                c["enabled"] == true,
                c["permission_policy"]["type"].as_str().unwrap_or_default(),
                "its config",
            ),
            None => (default_enabled, default_policy, "default_config"),
        };
        if enabled && policy == "always_ask" {
            return Err(invalid_tools(format!(
                "{what}: {web} would be enabled with always_ask (from {source}); web tools \
                 require always_allow, so configure {web} with always_allow or disable it"
            )));
        }
    }
    Ok(json!({
        "type": "agent_toolset_20260401",
        "default_config": {"enabled": default_enabled, "permission_policy": {"type": default_policy}},
        "configs": configs,
    }))
}

pub(crate) fn mcp_toolset(what: &str, map: &Map<String, Value>) -> ApiResult<Value> {
    only(
        what,
        map,
        &["type", "mcp_server_name", "default_config", "configs"],
    )?;
    let server = str_field(what, map, "mcp_server_name")?;
    if server.is_empty() || server.chars().count() > 255 {
        return Err(invalid_tools(format!(
            "{what}.mcp_server_name must be 1-255 characters"
        )));
    }
    let (default_enabled, default_policy) = default_config(
        &format!("{what}.default_config"),
        map.get("default_config"),
        "always_ask",
    )?;
    let mut configs = Vec::new();
    let mut seen = BTreeSet::new();
    if let Some(v) = map.get("configs").filter(|v| !v.is_null()) {
        for (j, c) in array(&format!("{what}.configs"), v)?.iter().enumerate() {
            let cw = format!("{what}.configs[{j}]");
            let c = object(&cw, c)?;
            only(&cw, c, &["name", "enabled", "permission_policy"])?;
            let tool = str_field(&cw, c, "name")?;
            if tool.is_empty() || !seen.insert(tool.to_string()) {
                return Err(invalid_tools(format!(
                    "{cw}.name must be non-empty and unique within the toolset"
                )));
            }
            let policy = permission_policy(
                &format!("{cw}.permission_policy"),
                c.get("permission_policy"),
            )?
            .unwrap_or(default_policy);
            configs.push(json!({
                "name": tool,
                "enabled": opt_bool(&cw, c, "enabled")?.unwrap_or(default_enabled),
                "permission_policy": {"type": policy},
            }));
        }
    }
    Ok(json!({
        "type": "mcp_toolset",
        "mcp_server_name": server,
        "default_config": {"enabled": default_enabled, "permission_policy": {"type": default_policy}},
        "configs": configs,
    }))
}

pub(crate) fn custom_tool(what: &str, map: &Map<String, Value>) -> ApiResult<Value> {
    only(what, map, &["type", "name", "description", "input_schema"])?;
    let tool = str_field(what, map, "name")?;
    let valid_name = !tool.is_empty()
        && tool.chars().count() <= 128
        && tool
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(invalid_tools(format!(
            "{what}.name {tool:?} must be 1-128 letters, digits, underscores or hyphens"
        )));
    }
    let description = str_field(what, map, "description")?;
    if description.trim().is_empty() {
        return Err(invalid_tools(format!(
            "{what}.description must not be empty"
        )));
    }
    check_len(&format!("{what}.description"), description, 8192)?;
    let sw = format!("{what}.input_schema");
    let schema = match map.get("input_schema") {
        None | Some(Value::Null) => {
            return Err(invalid_tools(format!("{sw} is required")));
        }
        Some(Value::Object(s)) => s,
        Some(_) => return Err(invalid_tools(format!("{sw} must be a JSON Schema object"))),
    };
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
    Ok(json!({
        "type": "custom",
        "name": tool,
        "description": description,
        "input_schema": schema,
    }))
}

/// `tools`: absent or null means none.
pub(crate) fn tools(value: Option<&Value>) -> ApiResult<Value> {
    let list = match value {
        None | Some(Value::Null) => return Ok(json!([])),
        Some(v) => array("tools", v)?,
    };
    if list.len() > MAX_TOOLS {
        return Err(invalid_tools(format!(
            "tools has {} entries; at most {MAX_TOOLS} are allowed",
            list.len()
        )));
    }
    let mut out = Vec::with_capacity(list.len());
    let mut toolset = false;
    let mut names = BTreeSet::new();
    let mut servers = BTreeSet::new();
    for (i, t) in list.iter().enumerate() {
        let what = format!("tools[{i}]");
        let map = object(&what, t)?;
        match map.get("type").and_then(Value::as_str) {
            Some("agent_toolset_20260401") => {
                if std::mem::replace(&mut toolset, true) {
                    return Err(invalid_tools(
                        "tools lists agent_toolset_20260401 more than once",
                    ));
                }
                out.push(agent_toolset(&what, map)?);
            }
            Some("mcp_toolset") => {
                let t = mcp_toolset(&what, map)?;
                if !servers.insert(t["mcp_server_name"].as_str().unwrap_or("").to_string()) {
                    return Err(invalid_tools(format!(
                        "tools lists the mcp_toolset for {} more than once",
                        t["mcp_server_name"]
                    )));
                }
                out.push(t);
            }
            Some("custom") => {
                let t = custom_tool(&what, map)?;
                let n = t["name"].as_str().unwrap_or("").to_string();
                if !names.insert(n.clone()) {
                    return Err(invalid_tools(format!(
                        "tools has more than one custom tool named {n:?}"
                    )));
                }
                out.push(t);
            }
            Some(other) => {
                return Err(invalid_tools(format!(
                    "{what}.type {other:?} is not supported; expected agent_toolset_20260401, mcp_toolset or custom"
                )))
            }
            None => return Err(invalid_tools(format!("{what}.type is required"))),
        }
    }
    Ok(Value::Array(out))
}

/// `skills: [{type: anthropic|custom, skill_id, version?}]`; an unpinned skill
/// is stored as version "latest".
pub(crate) fn skills(value: Option<&Value>) -> ApiResult<Value> {
    let list = match value {
        None | Some(Value::Null) => return Ok(json!([])),
        Some(v) => array("skills", v)?,
    };
    if list.len() > MAX_SKILLS {
        return Err(ApiError::invalid_parameter(format!(
            "skills has {} entries; at most {MAX_SKILLS} are allowed",
            list.len()
        )));
    }
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, s) in list.iter().enumerate() {
        let what = format!("skills[{i}]");
        let map = object(&what, s)?;
        only(&what, map, &["type", "skill_id", "version"])?;
        let kind = str_field(&what, map, "type")?;
        if kind != "anthropic" && kind != "custom" {
            return Err(ApiError::invalid_parameter(format!(
                "{what}.type must be \"anthropic\" or \"custom\", got {kind:?}"
            )));
        }
        let skill_id = str_field(&what, map, "skill_id")?;
        if skill_id.trim().is_empty() {
            return Err(ApiError::invalid_parameter(format!(
                "{what}.skill_id must not be empty"
            )));
        }
        check_len(&format!("{what}.skill_id"), skill_id, 256)?;
        let version = match map.get("version") {
            None | Some(Value::Null) => "latest".to_string(),
            Some(Value::String(v)) if !v.trim().is_empty() => {
                check_len(&format!("{what}.version"), v, 64)?;
                v.clone()
            }
            Some(_) => {
                return Err(ApiError::invalid_parameter(format!(
                    "{what}.version must be a non-empty string or null"
                )))
            }
        };
        if !seen.insert((kind, skill_id)) {
            return Err(ApiError::invalid_parameter(format!(
                "skills lists {kind} skill {skill_id:?} more than once"
            )));
        }
        out.push(json!({"type": kind, "skill_id": skill_id, "version": version}));
    }
    Ok(Value::Array(out))
}

/// `mcp_servers: [{type: "url", name, url}]`, names unique.
pub(crate) fn mcp_servers(value: Option<&Value>) -> ApiResult<Value> {
    let list = match value {
        None | Some(Value::Null) => return Ok(json!([])),
        Some(v) => array("mcp_servers", v)?,
    };
    if list.len() > MAX_MCP_SERVERS {
        return Err(ApiError::invalid_parameter(format!(
            "mcp_servers has {} entries; at most {MAX_MCP_SERVERS} are allowed",
            list.len()
        )));
    }
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, s) in list.iter().enumerate() {
        let what = format!("mcp_servers[{i}]");
        let map = object(&what, s)?;
        only(&what, map, &["type", "name", "url"])?;
        if str_field(&what, map, "type")? != "url" {
            return Err(ApiError::invalid_parameter(format!(
                "{what}.type must be \"url\""
            )));
        }
        let server = str_field(&what, map, "name")?;
        if server.is_empty() || server.chars().count() > 255 {
            return Err(ApiError::invalid_parameter(format!(
                "{what}.name must be 1-255 characters"
            )));
        }
        let url = str_field(&what, map, "url")?;
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(ApiError::invalid_parameter(format!(
                "{what}.url must be an http(s) URL"
            )));
        }
        check_len(&format!("{what}.url"), url, 2048)?;
        if !seen.insert(server) {
            return Err(ApiError::invalid_parameter(format!(
                "mcp_servers names {server:?} more than once"
            )));
        }
        out.push(json!({"type": "url", "name": server, "url": url}));
    }
    Ok(Value::Array(out))
}

/// Every mcp_toolset names a server in `mcp_servers`, and every server is used.
pub(crate) fn check_mcp_references(tools: &Value, servers: &Value) -> ApiResult<()> {
    let declared: BTreeSet<&str> = servers
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .collect();
    let used: BTreeSet<&str> = tools
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["type"] == "mcp_toolset")
        .filter_map(|t| t["mcp_server_name"].as_str())
        .collect();
    if let Some(missing) = used.difference(&declared).next() {
        return Err(invalid_tools(format!(
            "an mcp_toolset names MCP server {missing:?}, which is not in mcp_servers"
        )));
    }
    if let Some(unused) = declared.difference(&used).next() {
        return Err(ApiError::invalid_parameter(format!(
            "MCP server {unused:?} is not referenced by any mcp_toolset in tools"
        )));
    }
    Ok(())
}

pub(crate) fn execution_identity(value: Option<&Value>) -> ApiResult<Value> {
    let map = match value {
        None | Some(Value::Null) => return Ok(json!({"type": "service_account"})),
        Some(v) => object("execution_identity", v)?,
    };
    match str_field("execution_identity", map, "type")? {
        "service_account" => {
            only("execution_identity", map, &["type"])?;
            Ok(json!({"type": "service_account"}))
        }
        "aws_role" => {
            only("execution_identity", map, &["type", "role_arn"])?;
            let arn = str_field("execution_identity", map, "role_arn")?;
            if !arn.starts_with("arn:") {
                return Err(ApiError::invalid_parameter(
                    "execution_identity.role_arn must be an ARN",
                ));
            }
            check_len("execution_identity.role_arn", arn, 2048)?;
            Ok(json!({"type": "aws_role", "role_arn": arn}))
        }
        other => Err(ApiError::invalid_parameter(format!(
            "execution_identity.type must be \"service_account\" or \"aws_role\", got {other:?}"
        ))),
    }
}

pub(crate) fn no_multiagent(body: &Body) -> ApiResult<()> {
    match body.get("multiagent") {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(ApiError::invalid_parameter(
            "multiagent is not supported by Mango; omit it or send null",
        )),
    }
}
