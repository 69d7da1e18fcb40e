//! Mango control plane: Environments, Work leases, credentials, Agents and
//! Sessions on PostgreSQL. The layers, top down (see `docs/architecture.md`):
//! `routes` (HTTP) → `service` (transactions) → `store` (SQL), with the pure
//! rules (`lease`, `session_rules`, `turn`, `agent_definition`, `metadata`)
//! beside them and the background tasks (`listener`, `agent_loop`, the
//! sweeper in `server`) calling `service` too.

pub mod agent_definition;
pub mod agent_loop;
pub mod auth;
pub mod clock;
pub mod connection_limits;
pub mod context;
pub mod db;
pub mod error;
pub mod event_shapes;
pub mod extract;
pub mod feed;
#[doc(hidden)]
pub mod fuzzing;
pub mod ids;
pub mod lease;
pub mod listener;
pub mod memory_quota;
pub mod memory_rules;
pub mod metadata;
pub mod metrics;
pub mod model;
pub mod openapi;
pub mod routes;
pub mod server;
pub mod service;
pub mod session_rules;
pub mod skills;
pub mod store;
pub mod turn;
pub mod wake;

pub use context::{ApiContext, Settings};

/// The embedded migrations in `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
