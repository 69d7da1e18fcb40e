//! One agent turn, pure (spec §6): what the model is told (tool
//! declarations from the Agent snapshot, the transcript rebuilt from the
//! Session's events), what its reply becomes (`agent.*` events, each tool
//! call carrying the `evaluated_permission` the Agent's policy gives it),
//! and what the loop should do next. The agent loop wraps this with the
//! model call and the store.

mod memory;
mod next;
mod tools;
mod transcript;

pub use memory::{memory_section, with_memory};
pub use next::{next, pending_calls, runnable_worker_calls, since_request, Next, SinceRequest};
pub use tools::{AgentTools, CallClass};
pub use transcript::{model_usage, reply_events, request, transcript};

#[cfg(test)]
pub(crate) fn events(list: Vec<serde_json::Value>) -> Vec<mango_protocol::events::Event> {
    list.into_iter()
        .map(|e| serde_json::from_value(e).expect("a test event"))
        .collect()
}
