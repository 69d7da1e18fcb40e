//! Wire types of the Mango Environment Work API: one definition shared by the
//! control plane, the supervisor, the item runner and the tests.
//!
//! Shapes follow the official SDK's models (see `shared/reference/sdk-wire-contract.md`).

pub mod agents;
pub mod content;
pub mod envelope;
pub mod environment;
pub mod error;
pub mod events;
#[doc(hidden)]
pub mod fuzzing;
pub mod memory;
pub mod page;
pub mod patch;
#[cfg(feature = "openapi")]
mod schema;
pub mod sessions;
pub mod skills;
pub mod strict;
pub mod time;
pub mod tools;
pub mod work;

pub use environment::*;
pub use error::*;
pub use page::*;
pub use work::*;
