//! `mango-worker` against a real api on PostgreSQL.

mod item;
mod local;
mod support;
