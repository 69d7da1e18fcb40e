//! Creating a Session: its row, its frozen Agent snapshot and its initial
//! input (and so its first Work) commit together.

use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::service::{admission, skills};
use crate::session_rules::Sender;
use crate::store::agents::AgentRow;
use crate::store::sessions::{self, SessionRow};
use crate::{ids, metadata};
use mango_protocol::agents::AgentSnapshot;
use mango_protocol::events::SentEvent;
use mango_protocol::sessions::{SessionResource, SessionStatus};
use mango_protocol::time;
use sqlx::types::Json;
use std::collections::BTreeMap;

/// A Session about to be created, checked.
pub struct NewSession {
    pub workspace_id: String,
    pub environment_id: String,
    pub agent: AgentRow,
    pub title: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub resources: Vec<SessionResource>,
    pub initial_events: Vec<SentEvent>,
}

pub async fn create(ctx: &ApiContext, new: NewSession) -> ApiResult<SessionRow> {
    let now = time::now();
    let snapshot = AgentSnapshot::from(new.agent.render());
    let mut row = SessionRow {
        id: ids::new_id("sesn"),
        workspace_id: new.workspace_id,
        environment_id: new.environment_id,
        agent_id: new.agent.id.clone(),
        agent_version: new.agent.version,
        agent: Json(snapshot),
        status: SessionStatus::Idle,
        title: new.title,
        metadata: metadata::to_json(&new.metadata),
        resources: Json(new.resources),
        last_seq: 0,
        created_at: now,
        updated_at: now,
        archived_at: None,
    };
    let mut tx = ctx.db.begin().await?;
    // Custom Skills are pinned to exact versions (`latest` resolved) now.
    let pins = skills::freeze_pins(&mut tx, &row.workspace_id, &mut row.agent.0).await?;
    let mut session = sessions::insert(&mut *tx, &row).await?;
    skills::record_pins(&mut tx, &session.id, &pins).await?;
    let admitted = if new.initial_events.is_empty() {
        None
    } else {
        let admission = admission::admit(
            &mut tx,
            &mut session,
            false,
            Sender::Operator,
            new.initial_events,
            &ctx.settings,
        )
        .await?;
        Some(admission)
    };
    tx.commit().await?;
    if let Some(admitted) = admitted {
        ctx.committed(&session.id, &admitted.appended, admitted.wrote_outbox());
    }
    Ok(session)
}

/// `resources`, as stored: a repository's credential is used once to clone
/// and never kept; the ids each kind needs are there.
pub fn stored_resources(resources: Vec<SessionResource>) -> ApiResult<Vec<SessionResource>> {
    resources
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let required = |name: &str, value: &str| {
                if value.is_empty() {
                    Err(ApiError::invalid_parameter(format!(
                        "resources[{i}].{name} is required"
                    )))
                } else {
                    Ok(())
                }
            };
            Ok(match r {
                SessionResource::MemoryStore(m) => {
                    required("memory_store_id", &m.memory_store_id)?;
                    SessionResource::MemoryStore(m)
                }
                SessionResource::File(f) => {
                    required("file_id", &f.file_id)?;
                    SessionResource::File(f)
                }
                SessionResource::GithubRepository(mut repo) => {
                    required("url", &repo.url)?;
                    repo.authorization_token = None;
                    SessionResource::GithubRepository(repo)
                }
            })
        })
        .collect()
}
