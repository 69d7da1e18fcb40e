pub mod healthcheck;
pub mod lease;
pub mod secret;
pub mod tools;
