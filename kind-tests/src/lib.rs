//! The end-to-end test on a real Kubernetes cluster lives in
//! `tests/it/kind.rs`, which runs `kind-tests/run.sh`. This crate has no code
//! of its own.
