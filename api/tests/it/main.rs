//! The api's integration tests, in one binary with a module per area. Each
//! test serves a real `mango` in-process (mango-testkit's `TestApp`) over
//! the fresh database `#[sqlx::test]` creates for it, so the tests run in
//! parallel without sharing state. `DATABASE_URL` must point at a server
//! they may create databases on; `make test` provides one.

mod admission;
mod agent_loop;
mod agent_loop_durability;
mod agents_api;
mod bad_input;
mod cli;
mod concurrency;
mod connections;
mod credentials;
mod environments_api;
mod keepable;
mod lifecycle_edges;
mod memory_access;
mod memory_api;
mod memory_prompt;
mod memory_quotas;
mod metrics;
mod model_failures;
mod notifications;
mod openapi;
mod operator_cli;
mod session_events;
mod sessions_api;
mod skills_api;
mod smoke;
mod work_api;
