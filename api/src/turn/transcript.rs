//! The Messages API side of a turn: the request the model gets (the
//! conversation rebuilt from the Session's events) and the events its reply
//! becomes. The Messages API's own JSON is the model endpoint's protocol,
//! so it stays JSON here.

use super::tools::{AgentTools, CallClass};
use mango_protocol::agents::AgentSnapshot;
use mango_protocol::content::ContentBlock;
use mango_protocol::events::{
    AgentCustomToolUse, AgentMessage, AgentToolUse, Confirmation, Evaluation, Event, EventBody,
    ModelUsage, Permission,
};
use mango_protocol::sessions::SessionResource;
use serde_json::{json, Value};
use std::collections::HashMap;

/// Appends a block to the conversation, joining the last message when it
/// has the same role. In a user message the Messages API wants every
/// `tool_result` before any other block, so a result goes in front of text
/// that was sent before it arrived (a message sent while calls ran).
fn push(messages: &mut Vec<Value>, role: &str, block: Value) {
    if let Some(last) = messages.last_mut() {
        if last["role"] == role {
            let blocks = last["content"].as_array_mut().expect("content is an array");
            let at = if block["type"] == "tool_result" {
                blocks
                    .iter()
                    .position(|b| b["type"] != "tool_result")
                    .unwrap_or(blocks.len())
            } else {
                blocks.len()
            };
            blocks.insert(at, block);
            return;
        }
    }
    messages.push(json!({"role": role, "content": [block]}));
}

fn error_result(call: &str, why: &str) -> Value {
    json!({"type": "tool_result", "tool_use_id": call, "is_error": true,
           "content": [{"type": "text", "text": why}]})
}

/// Input the user side sent: it joins the next user turn.
fn is_user_side(body: &EventBody) -> bool {
    matches!(
        body,
        EventBody::UserMessage(_)
            | EventBody::SystemMessage(_)
            | EventBody::UserToolResult(_)
            | EventBody::UserCustomToolResult(_)
    )
}

/// The conversation so far as Messages API `messages`, from the Session's
/// events in order. Every tool call gets a result: a denied call (by policy
/// or by confirmation) is answered with an error the model can read. A
/// reply stands where its request began: input stored while the model was
/// asked (between a `span.model_request_start` and its end) was not in that
/// request, so it follows the reply.
pub fn transcript(events: &[Event]) -> Vec<Value> {
    let mut conversation = Conversation::new(events);
    let mut sent_while_asked: Vec<&Event> = Vec::new();
    let mut asking = false;
    for e in events {
        match e.body {
            EventBody::ModelRequestStart | EventBody::ModelRequestEnd(_) => {
                // A start with no end was abandoned: the next start closes it.
                asking = matches!(e.body, EventBody::ModelRequestStart);
                for late in sent_while_asked.drain(..) {
                    conversation.take(late);
                }
            }
            _ if asking && is_user_side(&e.body) => sent_while_asked.push(e),
            _ => conversation.take(e),
        }
    }
    for late in sent_while_asked {
        conversation.take(late);
    }
    conversation.finish()
}

/// The transcript as it is built, one event at a time.
struct Conversation<'a> {
    messages: Vec<Value>,
    /// Why a confirmation denied a call, by call.
    denied: HashMap<&'a str, &'a str>,
    /// Results for refused calls join the next user turn, after the assistant's calls.
    refusals: Vec<Value>,
    /// Calls without a result yet; an interrupt answers them, and a late result is dropped.
    open: Vec<&'a str>,
}

impl<'a> Conversation<'a> {
    fn new(events: &'a [Event]) -> Self {
        let mut denied = HashMap::new();
        for e in events {
            if let EventBody::UserToolConfirmation(c) = &e.body {
                if c.result == Confirmation::Deny {
                    let why = c
                        .deny_message
                        .as_deref()
                        .unwrap_or("the user denied this tool call");
                    denied.insert(c.tool_use_id.as_str(), why);
                }
            }
        }
        Conversation {
            messages: Vec::new(),
            denied,
            refusals: Vec::new(),
            open: Vec::new(),
        }
    }

    fn finish(mut self) -> Vec<Value> {
        for r in self.refusals {
            push(&mut self.messages, "user", r);
        }
        self.messages
    }

    fn take(&mut self, e: &'a Event) {
        let id = e.id.as_str();
        let messages = &mut self.messages;
        if is_user_side(&e.body) || matches!(e.body, EventBody::AgentMessage(_)) {
            for r in self.refusals.drain(..) {
                push(messages, "user", r);
            }
        }
        match &e.body {
            EventBody::UserMessage(m) => {
                for block in &m.content {
                    if !matches!(block, ContentBlock::Redacted) {
                        push(messages, "user", json!(block));
                    }
                }
            }
            EventBody::SystemMessage(m) => {
                for block in &m.content {
                    let text = format!("[system] {}", block.as_text().unwrap_or_default());
                    push(messages, "user", json!({"type": "text", "text": text}));
                }
            }
            EventBody::AgentMessage(m) => {
                for block in m.content.iter().filter(|b| b.as_text().is_some()) {
                    push(messages, "assistant", json!(block));
                }
            }
            EventBody::UserInterrupt(_) => {
                for call in self.open.drain(..) {
                    self.refusals
                        .push(error_result(call, "the user interrupted this tool call"));
                }
            }
            EventBody::AgentToolUse(call) => {
                push(
                    messages,
                    "assistant",
                    json!({"type": "tool_use", "id": id, "name": call.name, "input": call.input}),
                );
                let refusal = if call.evaluated_permission == Some(Permission::Deny) {
                    Some(
                        call.deny_reason
                            .as_deref()
                            .unwrap_or("this tool call is not permitted"),
                    )
                } else {
                    self.denied.get(id).copied()
                };
                match refusal {
                    Some(why) => self.refusals.push(error_result(id, why)),
                    None => self.open.push(id),
                }
            }
            EventBody::AgentCustomToolUse(call) => {
                push(
                    messages,
                    "assistant",
                    json!({"type": "tool_use", "id": id, "name": call.name, "input": call.input}),
                );
                match self.denied.get(id) {
                    Some(why) => self.refusals.push(error_result(id, why)),
                    None => self.open.push(id),
                }
            }
            EventBody::UserToolResult(_) | EventBody::UserCustomToolResult(_) => {
                let (call, content, is_error) = match &e.body {
                    EventBody::UserToolResult(r) => (&r.tool_use_id, &r.content, r.is_error),
                    EventBody::UserCustomToolResult(r) => {
                        (&r.custom_tool_use_id, &r.content, r.is_error)
                    }
                    _ => unreachable!("matched above"),
                };
                let Some(at) = self.open.iter().position(|c| c == call) else {
                    return; // interrupted earlier, or not a call of this transcript
                };
                self.open.remove(at);
                let content = match content {
                    Some(blocks) if !blocks.is_empty() => json!(blocks),
                    _ => json!([{"type": "text", "text": "(no output)"}]),
                };
                push(
                    messages,
                    "user",
                    json!({"type": "tool_result", "tool_use_id": call,
                           "is_error": is_error.unwrap_or(false), "content": content}),
                );
            }
            _ => {}
        }
    }
}

/// A prompt-cache breakpoint: the Messages API caches the request's prefix
/// up to the block that carries it.
fn cache_breakpoint() -> Value {
    json!({"type": "ephemeral"})
}

/// The Messages API request for the next model call of a Session: the
/// Agent snapshot's model, its system prompt (with the Skills and Memory
/// sections) and tools, and the transcript. Three prompt-cache breakpoints
/// let the turns of a long Session reuse what the last one cached: the
/// system prompt, the last tool declaration (both the same for the whole
/// Session), and the transcript's last stable block, the last one before
/// the newest turn's input (which may still grow: results that arrive
/// together, a message sent after a failed call).
pub fn request(
    agent: &AgentSnapshot,
    resources: &[SessionResource],
    events: &[Event],
    max_tokens: u32,
) -> Value {
    let tools = AgentTools::from_snapshot(agent);
    let mut messages = transcript(events);
    if messages.len() >= 2 {
        let stable = messages.len() - 2;
        if let Some(last) = messages[stable]["content"]
            .as_array_mut()
            .and_then(|blocks| blocks.last_mut())
        {
            last["cache_control"] = cache_breakpoint();
        }
    }
    let mut body = json!({
        "model": agent.definition.model.id,
        "max_tokens": max_tokens,
        "messages": messages,
    });
    let system = crate::skills::prompt::with_skills(agent.definition.system.as_deref(), agent);
    if let Some(system) = super::memory::with_memory(system, resources) {
        body["system"] =
            json!([{"type": "text", "text": system, "cache_control": cache_breakpoint()}]);
    }
    let mut declarations = tools.declarations();
    if let Some(last) = declarations.last_mut() {
        last["cache_control"] = cache_breakpoint();
    }
    if !declarations.is_empty() {
        body["tools"] = Value::Array(declarations);
    }
    body
}

/// The `agent.*` events a model reply becomes (without ids: the store assigns them).
pub fn reply_events(reply: &Value, tools: &AgentTools) -> Vec<EventBody> {
    let mut out = Vec::new();
    let mut text: Vec<ContentBlock> = Vec::new();
    let flush = |text: &mut Vec<ContentBlock>, out: &mut Vec<EventBody>| {
        if !text.is_empty() {
            out.push(EventBody::AgentMessage(AgentMessage {
                content: std::mem::take(text),
            }));
        }
    };
    for block in reply["content"].as_array().into_iter().flatten() {
        match block["type"].as_str().unwrap_or("") {
            "text" => text.push(ContentBlock::text(
                block["text"].as_str().unwrap_or_default(),
            )),
            "thinking" | "redacted_thinking" => {
                flush(&mut text, &mut out);
                out.push(EventBody::AgentThinking);
            }
            "tool_use" => {
                flush(&mut text, &mut out);
                let name = block["name"].as_str().unwrap_or_default().to_string();
                let input = if block["input"].is_object() {
                    block["input"].clone()
                } else {
                    json!({})
                };
                out.push(match tools.classify(&name) {
                    CallClass::Worker { ask } => EventBody::AgentToolUse(AgentToolUse {
                        name,
                        input,
                        evaluated_permission: Some(if ask {
                            Permission::Ask
                        } else {
                            Permission::Allow
                        }),
                        evaluation: Some(if ask {
                            Evaluation::AlwaysAsk
                        } else {
                            Evaluation::AlwaysAllow
                        }),
                        deny_reason: None,
                        session_thread_id: None,
                    }),
                    CallClass::Custom => EventBody::AgentCustomToolUse(AgentCustomToolUse {
                        name,
                        input,
                        session_thread_id: None,
                    }),
                    CallClass::Unknown => EventBody::AgentToolUse(AgentToolUse {
                        deny_reason: Some(format!("tool {name:?} is not available to this agent")),
                        name,
                        input,
                        evaluated_permission: Some(Permission::Deny),
                        evaluation: None,
                        session_thread_id: None,
                    }),
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
pub fn model_usage(reply: &Value) -> ModelUsage {
    let u = &reply["usage"];
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    ModelUsage {
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        cache_creation_input_tokens: n("cache_creation_input_tokens"),
        cache_read_input_tokens: n("cache_read_input_tokens"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::events;
    use super::super::tools::test_agent;
    use super::*;

    #[test]
    fn transcript_pairs_every_call_with_a_result_and_merges_roles() {
        let events = events(vec![
            json!({"id": "e1", "type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
            json!({"id": "e2", "type": "agent.message", "content": [{"type": "text", "text": "ok"}]}),
            json!({"id": "e3", "type": "agent.tool_use", "name": "bash", "input": {"command": "ls"}, "evaluated_permission": "allow"}),
            json!({"id": "e4", "type": "agent.tool_use", "name": "nope", "input": {}, "evaluated_permission": "deny", "deny_reason": "no such tool"}),
            json!({"id": "e5", "type": "agent.tool_use", "name": "bash", "input": {}, "evaluated_permission": "ask"}),
            json!({"id": "e6", "type": "user.tool_result", "tool_use_id": "e3", "content": [{"type": "text", "text": "a.txt"}], "is_error": false}),
            json!({"id": "e7", "type": "user.tool_confirmation", "tool_use_id": "e5", "result": "deny", "deny_message": "not now"}),
            json!({"id": "e8", "type": "session.status_idle", "stop_reason": {"type": "requires_action", "event_ids": ["e5"]}}),
        ]);
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
            &test_agent(),
            &[],
            &events(vec![
                json!({"id": "e1", "type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
            ]),
            1024,
        );
        assert_eq!(body["model"], "claude-test");
        assert_eq!(
            body["system"],
            json!([{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}])
        );
        assert_eq!(body["max_tokens"], 1024);
        assert_eq!(body["messages"][0]["content"][0]["text"], "hi");
        assert!(body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "bash" && t["input_schema"]["type"] == "object"));
    }

    /// The Messages API allows this many breakpoints in one request.
    const MAX_CACHE_BREAKPOINTS: usize = 4;

    /// Where the request's `cache_control` marks are, as JSON pointers.
    fn breakpoints(body: &Value) -> Vec<String> {
        fn walk(v: &Value, at: String, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if m.get("cache_control") == Some(&json!({"type": "ephemeral"})) {
                        out.push(at.clone());
                    }
                    for (k, v) in m {
                        walk(v, format!("{at}/{k}"), out);
                    }
                }
                Value::Array(a) => {
                    for (i, v) in a.iter().enumerate() {
                        walk(v, format!("{at}/{i}"), out);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(body, String::new(), &mut out);
        out.sort();
        out
    }

    #[test]
    fn cache_breakpoints_mark_the_system_prompt_the_last_tool_and_the_stable_prefix() {
        let first = events(vec![
            json!({"id": "e1", "type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
        ]);
        let body = request(&test_agent(), &[], &first, 1024);
        let last_tool = body["tools"].as_array().unwrap().len() - 1;
        assert_eq!(
            breakpoints(&body),
            ["/system/0".to_string(), format!("/tools/{last_tool}")],
            "the first turn has no stable transcript yet"
        );
        assert!(body["tools"][0].get("cache_control").is_none());

        // A later turn: the newest input (the results) is not marked; the
        // last block before it (the second call) is.
        let later = events(vec![
            json!({"id": "e1", "type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
            json!({"id": "e2", "type": "agent.message", "content": [{"type": "text", "text": "ok"}]}),
            json!({"id": "e3", "type": "agent.tool_use", "name": "read", "input": {}, "evaluated_permission": "allow"}),
            json!({"id": "e4", "type": "agent.tool_use", "name": "read", "input": {}, "evaluated_permission": "allow"}),
            json!({"id": "e5", "type": "user.tool_result", "tool_use_id": "e3", "content": [{"type": "text", "text": "a"}]}),
            json!({"id": "e6", "type": "user.tool_result", "tool_use_id": "e4", "content": [{"type": "text", "text": "b"}]}),
        ]);
        let body = request(&test_agent(), &[], &later, 1024);
        assert_eq!(
            breakpoints(&body),
            [
                "/messages/1/content/2".to_string(),
                "/system/0".to_string(),
                format!("/tools/{last_tool}")
            ]
        );
        assert_eq!(body["messages"][1]["content"][2]["id"], "e4");
        assert!(breakpoints(&body).len() <= MAX_CACHE_BREAKPOINTS);

        // No system prompt and no tools: only the transcript is marked.
        let mut bare = test_agent();
        bare.definition.system = None;
        bare.definition.tools.clear();
        let body = request(&bare, &[], &later, 1024);
        assert!(body.get("system").is_none() && body.get("tools").is_none());
        assert_eq!(breakpoints(&body), ["/messages/1/content/2"]);
    }

    #[test]
    fn a_reply_becomes_events_with_permissions_from_the_policy() {
        let tools = AgentTools::from_snapshot(&test_agent());
        let reply = json!({"content": [
            {"type": "text", "text": "let me look"},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
            {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"file_path": "a"}},
            {"type": "tool_use", "id": "toolu_3", "name": "lookup", "input": {"q": 1}},
            {"type": "tool_use", "id": "toolu_4", "name": "rm_rf", "input": "not an object"},
            {"type": "text", "text": "done"}
        ], "usage": {"input_tokens": 10, "output_tokens": 5}});
        let events: Vec<Value> = reply_events(&reply, &tools)
            .iter()
            .map(|e| json!(e))
            .collect();
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
        assert_eq!(model_usage(&reply).input_tokens, 10);
        assert_eq!(model_usage(&reply).cache_read_input_tokens, 0);
    }
}
