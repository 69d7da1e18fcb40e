//! The client's integration tests, in one binary: the client against a real
//! api served in-process (mango-testkit's `TestApp`) over the fresh database
//! `#[sqlx::test]` creates for each test.

mod against_api;
