//! Events as tests write them: JSON in, JSON out, over the typed paths.

use mango_api::error::ApiResult;
use mango_protocol::events::{Event, EventBody, SentEvent};
use serde_json::Value;

/// Appends agent-loop events to a Session from outside any api process (as
/// another replica's agent loop would): the events reach streams through the
/// database's notification. Panics on an event that is not an agent-loop
/// event body.
pub async fn append_agent_events(
    db: &sqlx::PgPool,
    session_id: &str,
    events: Vec<Value>,
) -> ApiResult<Vec<Value>> {
    let bodies = events.into_iter().map(body).collect();
    let stored = mango_api::service::admission::append_agent_events(db, session_id, bodies).await?;
    Ok(json_events(stored))
}

/// A typed event body from its JSON.
pub fn body(event: Value) -> EventBody {
    serde_json::from_value(event).expect("an event body")
}

/// A sent event from its JSON, parsed as the api parses it.
pub fn sent(event: Value) -> SentEvent {
    SentEvent::parse(event).expect("a sendable event")
}

/// Typed events as the JSON the api stores.
pub fn json_events(events: Vec<Event>) -> Vec<Value> {
    events
        .into_iter()
        .map(|e| serde_json::to_value(e).expect("an event serializes"))
        .collect()
}
