//! The handler adapters: how a job reaches code in any language.
//!
//! - [`exec_pool`]: a supervised pool of long-lived child processes speaking
//!   JSON lines (the default);
//! - [`exec_per_job`]: one process per job, judged by its exit status;
//! - [`http`]: a POST per job, judged by the status code.
//!
//! The built-ins `noop` and `sleep` and the [`Handler`](crate::Handler)
//! trait for handlers in Rust are in [`crate::handler`].

pub mod exec_per_job;
pub mod exec_pool;
pub mod http;
