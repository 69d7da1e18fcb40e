//! The end-to-end test on a real Kubernetes cluster: `kind-tests/run.sh`
//! under `cargo test -p mango-kind-tests` (one test binary, `it`, like every
//! other crate's).

mod kind;
