//! `mango-worker` against a real api on PostgreSQL.

mod docker;
mod docker_memory;
mod engine;
mod faults;
mod item;
mod k8s_launcher;
mod kube_mock;
mod local;
mod proxy;
mod support;
mod worker;
