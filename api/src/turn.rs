//! One agent turn, pure (spec §6): what the model is told (tool declarations
//! from the agent snapshot, the transcript rebuilt from the Session's events)
//! and what its reply becomes (`agent.*` events, each tool call carrying the
//! `evaluated_permission` the agent's policy gives it). The agent loop wraps
//! this with the model call and the store.

use serde_json::{json, Map, Value};

/// The six toolset tools the worker runs, with their input schemas.
pub fn toolset_schema(name: &str) -> Option<(&'static str, Value)> {
    let path = json!({"type": "string", "description": "Path relative to the workspace, or absolute inside it"});
    Some(match name {
        "bash" => (
            "Run a command in a persistent bash shell in the workspace.",
            json!({"type": "object", "properties": {
                "command": {"type": "string"},
                "restart": {"type": "boolean"},
                "timeout_ms": {"type": "integer", "minimum": 1}}}),
        ),
        "read" => (
            "Read a file; view_range is 1-based and inclusive.",
            json!({"type": "object", "required": ["file_path"], "properties": {
                "file_path": path,
                "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}}}),
        ),
        "write" => (
            "Write a file, creating parent directories.",
            json!({"type": "object", "required": ["file_path", "content"], "properties": {
                "file_path": path, "content": {"type": "string"}}}),
        ),
        "edit" => (
            "Replace old_string with new_string in a file.",
            json!({"type": "object", "required": ["file_path", "old_string", "new_string"], "properties": {
                "file_path": path, "old_string": {"type": "string"}, "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"}}}),
        ),
        "glob" => (
            "Find files by glob pattern, newest first.",
            json!({"type": "object", "required": ["pattern"], "properties": {
                "pattern": {"type": "string"}, "path": {"type": "string"}}}),
        ),
        "grep" => (
            "Search file contents with a regular expression.",
            json!({"type": "object", "required": ["pattern"], "properties": {
                "pattern": {"type": "string"}, "path": {"type": "string"}}}),
        ),
        _ => return None,
    })
}

const WORKER_TOOLS: [&str; 6] = ["bash", "read", "write", "edit", "glob", "grep"];
const WEB_TOOLS: [&str; 2] = ["web_search", "web_fetch"];

/// What the agent snapshot allows, resolved per tool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentTools {
    /// Enabled toolset tools the worker runs, with `true` when the policy is `always_ask`.
    pub worker: Vec<(String, bool)>,
    /// Enabled web tools (always_allow by construction); the model endpoint runs them.
    pub web: Vec<String>,
    /// Operator custom tools: `{name, description, input_schema}`.
    pub custom: Vec<Value>,
}

impl AgentTools {
    /// Reads the frozen `agent.tools` of a Session.
    pub fn from_snapshot(agent: &Value) -> AgentTools {
        let mut out = AgentTools::default();
        for tool in agent
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match tool.get("type").and_then(Value::as_str) {
                Some("agent_toolset_20260401") => {
                    let default = tool.get("default_config");
                    let default_on = default.and_then(|d| d.get("enabled")).and_then(Value::as_bool).unwrap_or(true);
                    let default_ask = default.and_then(|d| d.pointer("/permission_policy/type")).and_then(Value::as_str) == Some("always_ask");
                    let configs = tool.get("configs").and_then(Value::as_array).cloned().unwrap_or_default();
                    let setting = |name: &str| {
                        configs.iter().find(|c| c.get("name").and_then(Value::as_str) == Some(name)).map_or((default_on, default_ask), |c| {
                            (
                                c.get("enabled").and_then(Value::as_bool).unwrap_or(default_on),
                                c.pointer("/permission_policy/type").and_then(Value::as_str).map_or(default_ask, |p| p == "always_ask"),
                            )
                        })
                    };
                    for name in WORKER_TOOLS {
                        let (on, ask) = setting(name);
                        if on {
                            out.worker.push((name.to_string(), ask));
                        }
                    }
                    for name in WEB_TOOLS {
                        if setting(name).0 {
                            out.web.push(name.to_string());
                        }
                    }
                }
                Some("custom") => out.custom.push(json!({
                    "name": tool.get("name").cloned().unwrap_or(Value::Null),
                    "description": tool.get("description").cloned().unwrap_or(Value::Null),
                    "input_schema": tool.get("input_schema").cloned().unwrap_or(json!({"type": "object"})),
                })),
                _ => {}
            }
        }
        out
    }

    /// The Messages API `tools` array.
    pub fn declarations(&self) -> Vec<Value> {
        let mut tools: Vec<Value> = self
            .worker
            .iter()
            .filter_map(|(name, _)| {
                toolset_schema(name).map(|(description, schema)| json!({"name": name, "description": description, "input_schema": schema}))
            })
            .collect();
        tools.extend(self.custom.iter().cloned());
        for web in &self.web {
            let kind = if web == "web_search" {
                "web_search_20250305"
            } else {
                "web_fetch_20250910"
            };
            tools.push(json!({"type": kind, "name": web}));
        }
        tools
    }

    /// How a tool call the model made is handled.
    pub fn classify(&self, name: &str) -> CallClass {
        if let Some((_, ask)) = self.worker.iter().find(|(n, _)| n == name) {
            return CallClass::Worker { ask: *ask };
        }
        if self
            .custom
            .iter()
            .any(|c| c.get("name").and_then(Value::as_str) == Some(name))
        {
            return CallClass::Custom;
        }
        CallClass::Unknown
    }
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

fn push(messages: &mut Vec<Value>, role: &str, block: Value) {
    if let Some(last) = messages.last_mut() {
        if last["role"] == role {
            last["content"]
                .as_array_mut()
                .expect("content is an array")
                .push(block);
            return;
        }
    }
    messages.push(json!({"role": role, "content": [block]}));
}

/// The conversation so far as Messages API `messages`, from the Session's
/// events in order. Every tool call gets a result: a denied call (by policy or
/// by confirmation) is answered with an error the model can read.
pub fn transcript(events: &[Value]) -> Vec<Value> {
    let mut messages = Vec::new();
    let mut denied: Map<String, Value> = Map::new();
    for e in events {
        if e["type"] == "user.tool_confirmation" && e["result"] == "deny" {
            if let Some(id) = e["tool_use_id"].as_str() {
                let why = e["deny_message"]
                    .as_str()
                    .unwrap_or("the user denied this tool call");
                denied.insert(id.to_string(), Value::String(why.to_string()));
            }
        }
    }
    // Results for refused calls join the next user turn, after the assistant's calls.
    let mut refusals: Vec<Value> = Vec::new();
    // Calls without a result yet; an interrupt answers them, and a late result is dropped.
    let mut open: Vec<String> = Vec::new();
    for e in events {
        let id = e["id"].as_str().unwrap_or_default();
        let kind = e["type"].as_str().unwrap_or("");
        let user_side = matches!(
            kind,
            "user.message" | "system.message" | "user.tool_result" | "user.custom_tool_result"
        );
        if user_side || kind == "agent.message" {
            for r in refusals.drain(..) {
                push(&mut messages, "user", r);
            }
        }
        match kind {
            "user.message" => {
                for block in e["content"].as_array().into_iter().flatten() {
                    if block["type"] != "redacted" {
                        push(&mut messages, "user", block.clone());
                    }
                }
            }
            "system.message" => {
                for block in e["content"].as_array().into_iter().flatten() {
                    let text = format!("[system] {}", block["text"].as_str().unwrap_or_default());
                    push(&mut messages, "user", json!({"type": "text", "text": text}));
                }
            }
            "agent.message" => {
                for block in e["content"].as_array().into_iter().flatten() {
                    if block["type"] == "text" {
                        push(&mut messages, "assistant", block.clone());
                    }
                }
            }
            "user.interrupt" => {
                for call in open.drain(..) {
                    refusals.push(json!({"type": "tool_result", "tool_use_id": call, "is_error": true,
                        "content": [{"type": "text", "text": "the user interrupted this tool call"}]}));
                }
            }
            "agent.tool_use" | "agent.custom_tool_use" => {
                push(
                    &mut messages,
                    "assistant",
                    json!({"type": "tool_use", "id": id, "name": e["name"], "input": e["input"]}),
                );
                let refusal = if e["evaluated_permission"] == "deny" {
                    Some(
                        e["deny_reason"]
                            .as_str()
                            .unwrap_or("this tool call is not permitted")
                            .to_string(),
                    )
                } else {
                    denied.get(id).and_then(Value::as_str).map(str::to_string)
                };
                match refusal {
                    Some(why) => refusals.push(
                        json!({"type": "tool_result", "tool_use_id": id, "is_error": true,
                        "content": [{"type": "text", "text": why}]}),
                    ),
                    None => open.push(id.to_string()),
                }
            }
            "user.tool_result" | "user.custom_tool_result" => {
                let call = e["tool_use_id"]
                    .as_str()
                    .or_else(|| e["custom_tool_use_id"].as_str())
                    .unwrap_or_default();
                let Some(at) = open.iter().position(|c| c == call) else {
                    continue; // interrupted earlier, or not a call of this transcript
                };
                open.remove(at);
                let content = match e.get("content") {
                    Some(Value::Array(blocks)) if !blocks.is_empty() => {
                        Value::Array(blocks.clone())
                    }
                    _ => json!([{"type": "text", "text": "(no output)"}]),
                };
                push(
                    &mut messages,
                    "user",
                    json!({"type": "tool_result", "tool_use_id": call,
                    "is_error": e["is_error"].as_bool().unwrap_or(false), "content": content}),
                );
            }
            _ => {}
        }
    }
    for r in refusals {
        push(&mut messages, "user", r);
    }
    messages
}

/// The Messages API request for the next model call of a Session.
pub fn request(agent: &Value, events: &[Value], max_tokens: u32) -> Value {
    let tools = AgentTools::from_snapshot(agent);
    let mut body = json!({
        "model": agent.pointer("/model/id").cloned().unwrap_or(Value::Null),
        "max_tokens": max_tokens,
        "messages": transcript(events),
    });
    if let Some(system) = agent
        .get("system")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        body["system"] = json!(system);
    }
    let declarations = tools.declarations();
    if !declarations.is_empty() {
        body["tools"] = Value::Array(declarations);
    }
    body
}

/// The `agent.*` events a model reply becomes (without ids: the store assigns them).
pub fn reply_events(reply: &Value, tools: &AgentTools) -> Vec<Value> {
    let mut out = Vec::new();
    let mut text: Vec<Value> = Vec::new();
    let flush = |text: &mut Vec<Value>, out: &mut Vec<Value>| {
        if !text.is_empty() {
            out.push(json!({"type": "agent.message", "content": std::mem::take(text)}));
        }
    };
    for block in reply["content"].as_array().into_iter().flatten() {
        match block["type"].as_str().unwrap_or("") {
            "text" => text.push(json!({"type": "text", "text": block["text"]})),
            "thinking" | "redacted_thinking" => {
                flush(&mut text, &mut out);
                out.push(json!({"type": "agent.thinking"}));
            }
            "tool_use" => {
                flush(&mut text, &mut out);
                let name = block["name"].as_str().unwrap_or_default();
                let input = if block["input"].is_object() {
                    block["input"].clone()
                } else {
                    json!({})
                };
                out.push(match tools.classify(name) {
                    CallClass::Worker { ask } => {
                        let (permission, evaluation) = if ask { ("ask", "always_ask") } else { ("allow", "always_allow") };
                        json!({"type": "agent.tool_use", "name": name, "input": input,
                               "evaluated_permission": permission, "evaluation": {"type": evaluation}})
                    }
                    CallClass::Custom => json!({"type": "agent.custom_tool_use", "name": name, "input": input}),
                    CallClass::Unknown => json!({"type": "agent.tool_use", "name": name, "input": input,
                        "evaluated_permission": "deny",
                        "deny_reason": format!("tool {name:?} is not available to this agent")}),
                });
            }
            // Server tools (web search/fetch) run on the model endpoint; their
            // text reaches the Session through the model's own text blocks.
            _ => {}
        }
    }
    flush(&mut text, &mut out);
    out
}

/// `span.model_request_end.model_usage` from a reply's `usage`.
pub fn model_usage(reply: &Value) -> Value {
    let u = &reply["usage"];
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    json!({
        "input_tokens": n("input_tokens"),
        "output_tokens": n("output_tokens"),
        "cache_creation_input_tokens": n("cache_creation_input_tokens"),
        "cache_read_input_tokens": n("cache_read_input_tokens"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> Value {
        json!({
            "model": {"id": "claude-test"},
            "system": "be brief",
            "tools": [
                {"type": "agent_toolset_20260401",
                 "default_config": {"enabled": true, "permission_policy": {"type": "always_allow"}},
                 "configs": [
                     {"name": "bash", "enabled": true, "permission_policy": {"type": "always_ask"}},
                     {"name": "grep", "enabled": false, "permission_policy": {"type": "always_allow"}},
                     {"name": "web_fetch", "enabled": false, "permission_policy": {"type": "always_allow"}}]},
                {"type": "custom", "name": "lookup", "description": "d", "input_schema": {"type": "object"}}
            ]
        })
    }

    #[test]
    fn tools_resolve_per_tool_over_the_default() {
        let tools = AgentTools::from_snapshot(&agent());
        assert_eq!(tools.classify("bash"), CallClass::Worker { ask: true });
        assert_eq!(tools.classify("read"), CallClass::Worker { ask: false });
        assert_eq!(tools.classify("grep"), CallClass::Unknown, "disabled");
        assert_eq!(tools.classify("lookup"), CallClass::Custom);
        assert_eq!(tools.web, vec!["web_search".to_string()]);
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
    }

    #[test]
    fn transcript_pairs_every_call_with_a_result_and_merges_roles() {
        let events = vec![
            json!({"id": "e1", "type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
            json!({"id": "e2", "type": "agent.message", "content": [{"type": "text", "text": "ok"}]}),
            json!({"id": "e3", "type": "agent.tool_use", "name": "bash", "input": {"command": "ls"}, "evaluated_permission": "allow"}),
            json!({"id": "e4", "type": "agent.tool_use", "name": "nope", "input": {}, "evaluated_permission": "deny", "deny_reason": "no such tool"}),
            json!({"id": "e5", "type": "agent.tool_use", "name": "bash", "input": {}, "evaluated_permission": "ask"}),
            json!({"id": "e6", "type": "user.tool_result", "tool_use_id": "e3", "content": [{"type": "text", "text": "a.txt"}], "is_error": false}),
            json!({"id": "e7", "type": "user.tool_confirmation", "tool_use_id": "e5", "result": "deny", "deny_message": "not now"}),
            json!({"id": "e8", "type": "session.status_idle"}),
        ];
        let m = transcript(&events);
        assert_eq!(
            m.len(),
            3,
            "user, assistant (text + 3 calls), user (3 results): {m:#?}"
        );
        assert_eq!(m[1]["role"], "assistant");
        assert_eq!(m[1]["content"].as_array().unwrap().len(), 4);
        let results = m[2]["content"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        assert!(results.iter().any(|r| r["tool_use_id"] == "e4"
            && r["is_error"] == true
            && r["content"][0]["text"] == "no such tool"));
        assert!(results
            .iter()
            .any(|r| r["tool_use_id"] == "e5" && r["content"][0]["text"] == "not now"));
        assert!(results
            .iter()
            .any(|r| r["tool_use_id"] == "e3" && r["content"][0]["text"] == "a.txt"));
    }

    #[test]
    fn request_carries_model_system_and_tools() {
        let body = request(
            &agent(),
            &[
                json!({"id": "e1", "type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
            ],
            1024,
        );
        assert_eq!(body["model"], "claude-test");
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["max_tokens"], 1024);
        assert_eq!(body["messages"][0]["content"][0]["text"], "hi");
        assert!(body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "bash" && t["input_schema"]["type"] == "object"));
    }

    #[test]
    fn a_reply_becomes_events_with_permissions_from_the_policy() {
        let tools = AgentTools::from_snapshot(&agent());
        let reply = json!({"content": [
            {"type": "text", "text": "let me look"},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
            {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"file_path": "a"}},
            {"type": "tool_use", "id": "toolu_3", "name": "lookup", "input": {"q": 1}},
            {"type": "tool_use", "id": "toolu_4", "name": "rm_rf", "input": "not an object"},
            {"type": "text", "text": "done"}
        ], "usage": {"input_tokens": 10, "output_tokens": 5}});
        let events = reply_events(&reply, &tools);
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "agent.message",
                "agent.tool_use",
                "agent.tool_use",
                "agent.custom_tool_use",
                "agent.tool_use",
                "agent.message"
            ]
        );
        assert_eq!(events[1]["evaluated_permission"], "ask");
        assert_eq!(events[1]["evaluation"]["type"], "always_ask");
        assert_eq!(events[2]["evaluated_permission"], "allow");
        assert_eq!(events[4]["evaluated_permission"], "deny");
        assert_eq!(
            events[4]["input"],
            json!({}),
            "malformed input never reaches a worker"
        );
        assert_eq!(model_usage(&reply)["input_tokens"], 10);
        assert_eq!(model_usage(&reply)["cache_read_input_tokens"], 0);
    }
}

/// What the agent loop should do next for a Session, from its events alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Call the model; `open_request` is a `span.model_request_start` whose
    /// call never stored a result (resume it rather than start another).
    CallModel { open_request: Option<String> },
    /// The last input was an interrupt: end the turn.
    EndTurn,
    /// Waiting for tool results or confirmations, or nothing to answer.
    Wait,
}

/// Tool calls still holding the turn: not answered, not denied.
pub fn pending_calls(events: &[Value]) -> Vec<String> {
    let mut open: Vec<String> = Vec::new();
    for e in events {
        match e["type"].as_str().unwrap_or("") {
            "agent.tool_use" if e["evaluated_permission"] != "deny" => {
                open.extend(e["id"].as_str().map(str::to_string))
            }
            "agent.custom_tool_use" => open.extend(e["id"].as_str().map(str::to_string)),
            "user.tool_result" | "user.custom_tool_result" => {
                let call = e["tool_use_id"]
                    .as_str()
                    .or_else(|| e["custom_tool_use_id"].as_str());
                open.retain(|id| Some(id.as_str()) != call);
            }
            "user.tool_confirmation" if e["result"] == "deny" => {
                open.retain(|id| Some(id.as_str()) != e["tool_use_id"].as_str())
            }
            // An interrupt abandons the turn's open calls.
            "user.interrupt" => open.clear(),
            _ => {}
        }
    }
    open
}

/// Tool calls an interrupt abandoned while they were still open.
fn abandoned_calls(events: &[Value]) -> Vec<String> {
    let mut abandoned = Vec::new();
    for (at, e) in events.iter().enumerate() {
        if e["type"] == "user.interrupt" {
            abandoned.extend(pending_calls(&events[..at]));
        }
    }
    abandoned
}

pub fn next(events: &[Value]) -> Next {
    if events
        .iter()
        .any(|e| e["type"] == "session.status_terminated")
    {
        return Next::Wait;
    }
    // A late answer to a call an interrupt abandoned is kept in the history
    // but is not input: it must not start a turn of its own.
    let abandoned = abandoned_calls(events);
    let last_input = events.iter().rev().find(|e| {
        let answers_abandoned = || {
            e["tool_use_id"]
                .as_str()
                .or_else(|| e["custom_tool_use_id"].as_str())
                .is_some_and(|call| abandoned.iter().any(|a| a == call))
        };
        match e["type"].as_str().unwrap_or("") {
            "user.message" | "user.interrupt" => true,
            "user.tool_result" | "user.custom_tool_result" | "user.tool_confirmation" => {
                !answers_abandoned()
            }
            _ => false,
        }
    });
    let last_idle = events
        .iter()
        .rposition(|e| e["type"] == "session.status_idle");
    let interrupt_at = events.iter().rposition(|e| e["type"] == "user.interrupt");
    if let Some(at) = interrupt_at {
        if last_input.is_some_and(|e| e["type"] == "user.interrupt") {
            return if last_idle.is_some_and(|idle| idle > at) {
                Next::Wait
            } else {
                Next::EndTurn
            };
        }
    }
    if !pending_calls(events).is_empty() {
        return Next::Wait;
    }
    // A request that failed for good waits for new input before trying again.
    let last_end = events
        .iter()
        .rposition(|e| e["type"] == "span.model_request_end");
    if let Some(end) = last_end.filter(|at| events[*at]["is_error"] == true) {
        let input_after = events[end..].iter().any(|e| {
            matches!(
                e["type"].as_str().unwrap_or(""),
                "user.message"
                    | "user.tool_result"
                    | "user.custom_tool_result"
                    | "user.tool_confirmation"
            )
        });
        if !input_after {
            return Next::Wait;
        }
    }
    let messages = transcript(events);
    if messages.last().is_none_or(|m| m["role"] != "user") {
        return Next::Wait;
    }
    let open_request = events
        .iter()
        .rev()
        .take_while(|e| e["type"] != "span.model_request_end")
        .find(|e| e["type"] == "span.model_request_start")
        .and_then(|e| e["id"].as_str().map(str::to_string));
    Next::CallModel { open_request }
}

#[cfg(test)]
mod next_tests {
    use super::*;

    fn ev(id: &str, t: &str, extra: Value) -> Value {
        let mut e = json!({"id": id, "type": t});
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        e
    }
    fn msg(id: &str) -> Value {
        ev(
            id,
            "user.message",
            json!({"content": [{"type": "text", "text": "hi"}]}),
        )
    }

    #[test]
    fn a_new_message_calls_the_model_and_a_finished_turn_waits() {
        assert_eq!(next(&[msg("1")]), Next::CallModel { open_request: None });
        let done = vec![
            msg("1"),
            ev("2", "span.model_request_start", json!({})),
            ev(
                "3",
                "agent.message",
                json!({"content": [{"type": "text", "text": "hello"}]}),
            ),
            ev("4", "span.model_request_end", json!({})),
            ev(
                "5",
                "session.status_idle",
                json!({"stop_reason": {"type": "end_turn"}}),
            ),
        ];
        assert_eq!(next(&done), Next::Wait);
        let mut again = done.clone();
        again.push(msg("6"));
        assert_eq!(next(&again), Next::CallModel { open_request: None });
    }

    #[test]
    fn tool_calls_hold_the_turn_until_answered_or_denied() {
        let mut e = vec![
            msg("1"),
            ev("2", "span.model_request_start", json!({})),
            ev(
                "3",
                "agent.tool_use",
                json!({"name": "bash", "input": {}, "evaluated_permission": "allow"}),
            ),
            ev(
                "4",
                "agent.tool_use",
                json!({"name": "bash", "input": {}, "evaluated_permission": "ask"}),
            ),
            ev("5", "span.model_request_end", json!({})),
        ];
        assert_eq!(pending_calls(&e), vec!["3".to_string(), "4".to_string()]);
        assert_eq!(next(&e), Next::Wait);
        e.push(ev(
            "6",
            "user.tool_result",
            json!({"tool_use_id": "3", "content": []}),
        ));
        assert_eq!(next(&e), Next::Wait, "one still pending");
        e.push(ev(
            "7",
            "user.tool_confirmation",
            json!({"tool_use_id": "4", "result": "deny"}),
        ));
        assert_eq!(
            next(&e),
            Next::CallModel { open_request: None },
            "all resolved: the model sees the results"
        );
    }

    #[test]
    fn a_failed_request_waits_for_new_input() {
        let mut e = vec![
            msg("1"),
            ev("2", "span.model_request_start", json!({})),
            ev("3", "span.model_request_end", json!({"is_error": true})),
            ev(
                "4",
                "session.status_idle",
                json!({"stop_reason": {"type": "retries_exhausted"}}),
            ),
        ];
        assert_eq!(next(&e), Next::Wait);
        e.push(msg("5"));
        assert_eq!(next(&e), Next::CallModel { open_request: None });
    }

    #[test]
    fn an_unfinished_request_is_resumed_not_restarted() {
        let e = vec![msg("1"), ev("2", "span.model_request_start", json!({}))];
        assert_eq!(
            next(&e),
            Next::CallModel {
                open_request: Some("2".into())
            }
        );
    }

    #[test]
    fn after_an_interrupt_new_input_runs_and_abandoned_calls_are_answered_once() {
        let e = vec![
            msg("1"),
            ev("2", "agent.tool_use", json!({"name": "bash", "input": {}})),
            ev("3", "user.interrupt", json!({})),
            ev(
                "4",
                "session.status_idle",
                json!({"stop_reason": {"type": "end_turn"}}),
            ),
            ev(
                "5",
                "user.tool_result",
                json!({"tool_use_id": "2", "content": [{"type": "text", "text": "late"}]}),
            ),
            msg("6"),
        ];
        assert!(pending_calls(&e).is_empty());
        assert_eq!(next(&e), Next::CallModel { open_request: None });
        let m = transcript(&e);
        let results: Vec<&Value> = m
            .iter()
            .flat_map(|x| x["content"].as_array().unwrap())
            .filter(|b| b["type"] == "tool_result")
            .collect();
        assert_eq!(
            results.len(),
            1,
            "exactly one result for the interrupted call: {m:#?}"
        );
        assert_eq!(
            results[0]["content"][0]["text"],
            "the user interrupted this tool call"
        );
        assert_eq!(m.last().unwrap()["role"], "user");
    }

    #[test]
    fn interrupts_end_the_turn_once_and_termination_stops_everything() {
        let e = vec![
            msg("1"),
            ev("2", "agent.tool_use", json!({"name": "bash", "input": {}})),
            ev("3", "user.interrupt", json!({})),
        ];
        assert_eq!(next(&e), Next::EndTurn);
        let mut ended = e.clone();
        ended.push(ev(
            "4",
            "session.status_idle",
            json!({"stop_reason": {"type": "end_turn"}}),
        ));
        assert_eq!(next(&ended), Next::Wait);
        // A late result for the abandoned call is not input: no new turn.
        let late = ev(
            "5",
            "user.tool_result",
            json!({"tool_use_id": "2", "content": [{"type": "text", "text": "late"}]}),
        );
        let mut with_late = ended.clone();
        with_late.push(late.clone());
        assert_eq!(next(&with_late), Next::Wait);
        let mut late_before_the_idle = e.clone();
        late_before_the_idle.push(late);
        assert_eq!(next(&late_before_the_idle), Next::EndTurn);
        with_late.push(msg("6"));
        assert_eq!(next(&with_late), Next::CallModel { open_request: None });
        assert_eq!(
            next(&[msg("1"), ev("2", "session.status_terminated", json!({}))]),
            Next::Wait
        );
    }
}

/// Pending calls a worker may run now (allowed, or asked and confirmed):
/// while any exist the Session needs live Work.
pub fn runnable_worker_calls(events: &[Value]) -> Vec<String> {
    if events
        .iter()
        .any(|e| e["type"] == "session.status_terminated")
    {
        return Vec::new();
    }
    let pending = pending_calls(events);
    let confirmed: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "user.tool_confirmation" && e["result"] == "allow")
        .filter_map(|e| e["tool_use_id"].as_str())
        .collect();
    events
        .iter()
        .filter(|e| e["type"] == "agent.tool_use")
        .filter_map(|e| {
            let id = e["id"].as_str()?;
            let allowed = match e["evaluated_permission"].as_str() {
                None | Some("allow") => true,
                Some("deny") => false,
                Some(_) => confirmed.contains(&id),
            };
            (allowed && pending.iter().any(|p| p == id)).then(|| id.to_string())
        })
        .collect()
}

#[cfg(test)]
mod runnable_tests {
    use super::*;

    #[test]
    fn only_allowed_or_confirmed_unanswered_calls_need_a_worker() {
        let e = vec![
            json!({"id": "a", "type": "agent.tool_use", "name": "bash", "evaluated_permission": "allow"}),
            json!({"id": "b", "type": "agent.tool_use", "name": "bash", "evaluated_permission": "ask"}),
            json!({"id": "c", "type": "agent.tool_use", "name": "bash", "evaluated_permission": "ask"}),
            json!({"id": "d", "type": "agent.custom_tool_use", "name": "lookup"}),
            json!({"id": "e", "type": "agent.tool_use", "name": "bash"}),
            json!({"id": "x", "type": "user.tool_confirmation", "tool_use_id": "c", "result": "allow"}),
            json!({"id": "y", "type": "user.tool_result", "tool_use_id": "e"}),
        ];
        assert_eq!(
            runnable_worker_calls(&e),
            vec!["a".to_string(), "c".to_string()]
        );
        let mut over = e.clone();
        over.push(json!({"id": "z", "type": "session.status_terminated"}));
        assert!(
            runnable_worker_calls(&over).is_empty(),
            "a terminated Session needs no worker"
        );
    }
}
