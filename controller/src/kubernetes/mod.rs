//! The Kubernetes launcher and the operator around it: a `WorkerPool`
//! custom resource per pool, one supervisor (the same core as Docker's)
//! per pool, one hardened Pod per item, a PVC per Session.

pub mod crd;
pub mod launcher;
pub mod pod;
pub mod pods;
