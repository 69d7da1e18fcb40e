//! SQL, next to the code that needs it. Runtime-checked queries (`sqlx::query_as`)
//! keep the build free of a database; every statement runs in the PostgreSQL tests.

pub mod agents;
pub mod cursor;
pub mod environments;
pub mod keys;
pub mod sessions;
pub mod work;
