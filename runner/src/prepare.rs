//! Before any tool runs (spec §9): the inputs the frozen Session snapshot pins
//! must exist. The snapshot is immutable, so a pinned custom Skill version or
//! an attached Memory Store that the server says does not exist never will:
//! that is a permanent input error, and the runner Fails the Work (which
//! terminates the Session with `session_input_failed_error`) instead of
//! running the agent without them. A retrieval that fails for a transient
//! reason leaves the lease to expire, so the item is reclaimed and tried again.
//!
//! Custom Skills are materialized by [`crate::skills`], and attached Memory
//! Stores are downloaded by [`crate::memory`]; here a store is only checked
//! to exist, so a missing one ends the Work this way, loudly, rather than
//! silently missing.

use mango_client::{Client, ClientError};
use mango_protocol::agents::SkillKind;
use mango_protocol::sessions::{Session, SessionResource};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrepareError {
    /// The pinned input cannot exist: Fail the Work with this message.
    Permanent(String),
    /// Not now (transport, 5xx, 429 …): leave the lease to expire.
    Transient(String),
    /// The server refused this runner's credential: nothing to report to.
    Rejected(String),
}

/// One input the snapshot pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned {
    Skill { skill_id: String, version: String },
    MemoryStore { memory_store_id: String },
}

impl std::fmt::Display for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pinned::Skill { skill_id, version } => {
                write!(f, "custom Skill {skill_id} version {version}")
            }
            Pinned::MemoryStore { memory_store_id } => {
                write!(f, "Memory Store {memory_store_id}")
            }
        }
    }
}

/// What the snapshot (`GET /v1/sessions/{id}`) pins that the runner must stage:
/// custom Skills (Anthropic Skills live with the model) and Memory Stores.
pub fn pinned_inputs(session: &Session) -> Vec<Pinned> {
    let skills = session
        .agent
        .definition
        .skills
        .iter()
        .filter(|s| s.kind == SkillKind::Custom)
        .map(|s| Pinned::Skill {
            skill_id: s.skill_id.clone(),
            version: s.version.clone(),
        });
    let stores = session.resources.iter().filter_map(|r| match r {
        SessionResource::MemoryStore(m) => Some(Pinned::MemoryStore {
            memory_store_id: m.memory_store_id.clone(),
        }),
        _ => None,
    });
    skills.chain(stores).collect()
}

/// How a failed retrieval of `what` counts.
pub fn classify(what: &Pinned, err: &ClientError) -> PrepareError {
    match err.status().map(|s| s.as_u16()) {
        Some(401 | 403) => PrepareError::Rejected(format!("retrieving the {what}: {err}")),
        // 404, 400, 410, 422 …: the server says the pin itself is wrong.
        Some(s) if (400..500).contains(&s) && !matches!(s, 408 | 409 | 429) => {
            PrepareError::Permanent(format!(
                "the Session pins {what}, which cannot be retrieved: {}",
                api_message(err)
            ))
        }
        // Transport, 408/409/429 and every 5xx: the server's trouble, not the pin's.
        _ => PrepareError::Transient(format!("retrieving the {what}: {err}")),
    }
}

fn api_message(err: &ClientError) -> String {
    match err {
        ClientError::Api {
            status, message, ..
        } => format!("{} {message}", status.as_u16()),
        other => other.to_string(),
    }
}

/// The most a Fail message may hold (spec §3: ≤ 1024 characters).
pub const FAIL_MESSAGE_LIMIT: usize = 1024;

/// `why`, cut to what Fail accepts.
pub fn fail_message(why: &str) -> String {
    if why.chars().count() <= FAIL_MESSAGE_LIMIT {
        return why.to_string();
    }
    let mut cut: String = why.chars().take(FAIL_MESSAGE_LIMIT - 1).collect();
    cut.push('…');
    cut
}

/// Reads the snapshot and checks every pinned input exists (custom Skills
/// are downloaded and verified by [`crate::skills::materialize`] instead);
/// returns the snapshot.
pub async fn check_pinned_inputs(
    client: &Client,
    session_id: &str,
) -> Result<Session, PrepareError> {
    let session = client.session(session_id).await.map_err(|err| {
        if err.is_transient() {
            PrepareError::Transient(format!("reading the Session snapshot: {err}"))
        } else {
            PrepareError::Rejected(format!("reading the Session snapshot: {err}"))
        }
    })?;
    let checked = pinned_inputs(&session)
        .into_iter()
        .filter(|p| !matches!(p, Pinned::Skill { .. }));
    for pin in checked {
        let found = match &pin {
            Pinned::Skill { skill_id, version } => client.skill_version(skill_id, version).await,
            Pinned::MemoryStore { memory_store_id } => client.memory_store(memory_store_id).await,
        };
        match found {
            // Memory Stores are then downloaded by `crate::memory`.
            Ok(_) => {}
            Err(err) => return Err(classify(&pin, &err)),
        }
    }
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;
    use serde_json::json;

    fn api(status: u16, final_answer: bool) -> ClientError {
        ClientError::Api {
            status: StatusCode::from_u16(status).unwrap(),
            message: "no such thing".into(),
            kind: "not_found_error".into(),
            error_code: None,
            details: None,
            request_id: None,
            final_answer,
        }
    }

    #[test]
    fn fail_messages_fit_the_limit() {
        assert_eq!(fail_message("short"), "short");
        let exact = "é".repeat(FAIL_MESSAGE_LIMIT);
        assert_eq!(fail_message(&exact), exact);
        let long = fail_message(&"é".repeat(FAIL_MESSAGE_LIMIT + 1));
        assert_eq!(long.chars().count(), FAIL_MESSAGE_LIMIT);
        assert!(long.ends_with('…'));
    }

    fn session(skills: serde_json::Value, resources: serde_json::Value) -> Session {
        serde_json::from_value(json!({
            "id": "sesn_1", "type": "session", "status": "idle", "environment_id": "env_1",
            "agent": {"type": "agent", "id": "agent_1", "version": 1, "name": "a",
                      "description": null, "system": null,
                      "model": {"id": "m", "effort": null, "inference_geo": null, "speed": "standard"},
                      "tools": [], "skills": skills, "mcp_servers": [],
                      "execution_identity": {"type": "service_account"}, "multiagent": null},
            "resources": resources, "metadata": {}, "title": null, "outcome_evaluations": [],
            "stats": {"active_seconds": null, "duration_seconds": null}, "usage": {},
            "vault_ids": [], "budget": null, "deployment_id": null,
            "created_at": "2026-12-01T00:00:00.000000Z", "updated_at": "2026-12-01T00:00:00.000000Z",
            "archived_at": null
        }))
        .expect("a Session")
    }

    #[test]
    fn custom_skills_and_memory_stores_are_what_gets_staged() {
        let session = session(
            json!([
                {"type": "anthropic", "skill_id": "pdf", "version": "latest"},
                {"type": "custom", "skill_id": "skill_1", "version": "3"},
                {"type": "custom", "skill_id": "skill_2", "version": "latest"}
            ]),
            json!([
                {"type": "file", "file_id": "file_1"},
                {"type": "memory_store", "memory_store_id": "memstore_1", "access": "read_only"}
            ]),
        );
        assert_eq!(
            pinned_inputs(&session),
            vec![
                Pinned::Skill {
                    skill_id: "skill_1".into(),
                    version: "3".into()
                },
                Pinned::Skill {
                    skill_id: "skill_2".into(),
                    version: "latest".into()
                },
                Pinned::MemoryStore {
                    memory_store_id: "memstore_1".into()
                },
            ]
        );
        assert!(pinned_inputs(&self::session(json!([]), json!([]))).is_empty());
    }

    #[test]
    fn a_pin_the_server_says_is_wrong_is_permanent_and_names_it() {
        let pin = Pinned::Skill {
            skill_id: "skill_1".into(),
            version: "3".into(),
        };
        for status in [400, 404, 410, 422] {
            match classify(&pin, &api(status, false)) {
                PrepareError::Permanent(m) => {
                    assert!(m.contains("custom Skill skill_1 version 3"), "{m}");
                    assert!(m.contains(&status.to_string()), "{m}");
                }
                other => panic!("{status}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_outage_is_transient_and_a_refused_credential_is_not_the_inputs_fault() {
        let pin = Pinned::MemoryStore {
            memory_store_id: "memstore_1".into(),
        };
        for (status, final_answer) in [
            (408, false),
            (409, false),
            (429, false),
            (500, false),
            (503, true),
        ] {
            assert!(
                matches!(
                    classify(&pin, &api(status, final_answer)),
                    PrepareError::Transient(_)
                ),
                "{status}"
            );
        }
        for status in [401, 403] {
            assert!(
                matches!(
                    classify(&pin, &api(status, false)),
                    PrepareError::Rejected(_)
                ),
                "{status}"
            );
        }
    }
}
