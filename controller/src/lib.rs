//! The Mango supervisor (`mango-worker`): [`core`] polls and acks Work with
//! an Environment key and runs one sandbox per item through a launcher;
//! [`local`] runs each item as a subprocess (development only), [`docker`]
//! as a hardened container, [`kubernetes`] as a hardened Pod under a
//! `WorkerPool`.

pub mod core;
pub mod docker;
pub mod egress;
pub mod kubernetes;
pub mod local;
pub mod worker_id;
