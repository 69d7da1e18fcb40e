pub mod calls;
pub mod healthcheck;
pub mod lease;
pub mod prepare;
pub mod secret;
pub mod session;
pub mod tools;
