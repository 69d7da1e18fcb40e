//! Mango control plane: Environments, Work leases and credentials on PostgreSQL.

pub mod admission;
pub mod agent_definition;
pub mod agent_loop;
pub mod auth;
pub mod context;
pub mod db;
pub mod error;
pub mod event_shapes;
pub mod extract;
pub mod feed;
pub mod ids;
pub mod lease;
pub mod metadata;
pub mod metrics;
pub mod routes;
pub mod server;
pub mod store;
pub mod turn;
pub mod wake;

pub use context::{ApiContext, Settings};

/// The embedded migrations in `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
pub mod session_rules;
