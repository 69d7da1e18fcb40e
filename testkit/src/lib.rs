//! Test scaffolding of the Mango workspace, shared by the tests of `api`,
//! `client` and `runner` and by `mango-bench`; never part of the product.
//!
//! [`TestApp`] is the one live api: a real `mango` served in-process on
//! 127.0.0.1:0 over a database the caller owns (in tests the fresh one
//! `#[sqlx::test]` creates for each test), with a Workspace key, an
//! Environment and its key. `DATABASE_URL` must point at a server the tests
//! may create databases on; `make test` provides one.
//!
//! By concern:
//! * [`api`]: starting and stopping it; Environments and keys;
//! * [`http`]: raw calls and their [`Reply`];
//! * [`work`]: the Work lease calls of a supervisor and a worker;
//! * [`sessions`]: Agents, Sessions and their events over HTTP;
//! * [`sse`]: event streams, frame by frame;
//! * [`memory`]: Memory Stores and their memories;
//! * [`lossy`]: a proxy that loses chosen answers after the api acted;
//! * [`db`]: direct looks at the database (row counts, lock waits);
//! * [`events`]: typed events written and read as JSON;
//! * [`model`]: a scripted Messages API endpoint for the agent loop;
//! * [`turns`]: waiting on the agent loop's turns;
//! * [`skills`]: Skill uploads and downloads, and hand-built (hostile) zips;
//! * [`apiserver`]: a strict fake Kubernetes API server (the rules of a
//!   real one, a test as its kubelet); `kube_api` is the older, lenient one;
//! * [`runner`]: a Session's Work claimed as a supervisor would before
//!   starting an item runner.

pub mod api;
pub mod apiserver;
pub mod db;
pub mod events;
pub mod http;
pub mod kube_api;
pub mod lossy;
pub mod memory;
pub mod model;
pub mod runner;
pub mod sessions;
pub mod skills;
pub mod sse;
pub mod turns;
pub mod work;

pub use api::TestApp;
pub use events::{append_agent_events, json_events, sent};
pub use http::{urlencode, Reply};
pub use memory::sha256_hex;
pub use model::{model_reply, one_bash_call, ScriptedModel};
pub use sessions::{data_ids, user_message};
pub use sse::{Frame, SseReader};
pub use work::{claim_of, sessions_token, Claim};
