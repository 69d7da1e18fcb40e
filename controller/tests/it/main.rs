//! `mango-worker` against a real api on PostgreSQL.

mod chart;
mod docker;
mod docker_memory;
mod docker_warm;
mod engine;
mod faults;
mod item;
mod k8s_kubelet;
mod k8s_launcher;
mod k8s_leader;
mod k8s_strict;
mod k8s_strict_launcher;
mod k8s_strict_leader;
mod k8s_strict_operator;
mod kube_mock;
mod local;
mod operator;
mod process;
mod proxy;
mod restart;
mod startup;
mod support;
mod worker;
