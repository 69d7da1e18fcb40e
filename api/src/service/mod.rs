//! Transactions that more than one caller needs, each written once: the
//! handlers and the background tasks (sweeper, agent loop) call these.

pub mod activation;
pub mod admission;
pub mod agent_steps;
pub mod agents;
pub mod environments;
pub mod fail;
pub mod memory;
pub mod poll;
pub mod sessions;
pub mod skills;
pub mod work;
