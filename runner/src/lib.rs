//! The item runner (`mango-runner`): runs one acknowledged Work item in its
//! sandbox. [`item`] is the process; [`heartbeat`] keeps the Work's lease,
//! [`session`] follows the Session and [`calls`] decides which tool calls
//! to run, [`tools`] are the six workspace tools, [`healthcheck`] the
//! fixed probe, [`prepare`] checks pinned inputs, [`skills`] materializes
//! the pinned Skills, [`memory`] mounts and syncs the Session's Memory
//! Stores, [`init`] the runner as its sandbox's PID 1, [`secret`] the hand-off, [`signal`] SIGTERM and SIGINT,
//! [`threads`] the threads made at start, [`envelope`] waiting mode's read
//! of the activation envelope, [`kept`] a kept sandbox swept between
//! activations, [`tool_result`] a result sized
//! for the api.

pub mod calls;
pub mod envelope;
pub mod exit;
#[doc(hidden)]
pub mod fuzzing;
pub mod healthcheck;
pub mod heartbeat;
pub mod init;
pub mod item;
pub mod kept;
pub mod memory;
pub mod prepare;
pub mod secret;
pub mod session;
pub mod signal;
pub mod skills;
pub mod threads;
pub mod tool_result;
pub mod tools;
