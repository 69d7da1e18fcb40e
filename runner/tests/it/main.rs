//! The item runner's integration tests, in one binary with a module per
//! area: the tools in-process, and the real `mango-runner` started as a
//! supervisor starts it against an api served in-process (mango-testkit's
//! `TestApp`) over the fresh database `#[sqlx::test]` creates for each test.

mod behaviour;
mod e2e;
mod exhaustion;
mod item;
mod kept;
mod memory;
mod memory_fit;
mod relative;
mod results;
mod session;
mod skills;
mod support;
mod tools;
mod wait;
