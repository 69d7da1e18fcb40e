//! The supervisor core: polling, acknowledging, one sandbox per item,
//! watching and removing it. It knows nothing of Docker or Kubernetes:
//! launchers are adapters behind [`launcher::Launcher`].

pub mod config;
pub mod kept;
pub mod launcher;
pub mod metrics;
pub mod naming;
pub mod observer;
pub mod secret;
pub mod stages;
pub mod supervisor;
pub mod warm;
