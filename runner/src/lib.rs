//! The item runner (`mango-runner`): runs one acknowledged Work item in its
//! sandbox. [`item`] is the process; [`heartbeat`] keeps the Work's lease,
//! [`session`] follows the Session and [`calls`] decides which tool calls
//! to run, [`tools`] are the six workspace tools, [`healthcheck`] the
//! fixed probe, [`prepare`] checks pinned inputs, [`skills`] materializes
//! the pinned Skills, [`memory`] mounts and syncs the Session's Memory
//! Stores, [`secret`] the hand-off, [`waiting`] the
//! envelope of a warm sandbox, [`signal`] SIGTERM and SIGINT,
//! [`threads`] the threads made at start, [`tool_result`] a result sized
//! for the api.

pub mod calls;
pub mod exit;
pub mod healthcheck;
pub mod heartbeat;
pub mod item;
pub mod memory;
pub mod prepare;
pub mod secret;
pub mod session;
pub mod signal;
pub mod skills;
pub mod threads;
pub mod tool_result;
pub mod tools;
pub mod waiting;
