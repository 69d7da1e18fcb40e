//! The Kubernetes launcher and the operator around it: a `WorkerPool`
//! custom resource per pool, one supervisor (the same core as Docker's)
//! per pool, one hardened Pod per item, a PVC per Session.

pub mod cli;
pub mod crd;
pub mod events;
pub mod launcher;
pub mod leader;
pub mod operator;
pub mod pod;
pub mod pods;
pub mod render;
pub mod status;
pub mod sweep;
pub mod validation;
