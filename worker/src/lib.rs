//! The workerpool worker runtime.
//!
//! Takes jobs from Redis lists with reliable fetch, runs them through a
//! [`Handler`] with bounded concurrency, retries failures with exponential
//! backoff and full jitter, dead-letters what never succeeds, returns the
//! jobs of lost workers to their queue, and drains gracefully on SIGTERM.
//! The queue contract (key layout, job envelope, scripts) is the
//! `workerpool-queue` crate, used by its own paths and documented in
//! `docs/queue-contract.md`.

mod backoff;
pub mod config;
pub mod handler;
pub mod handlers;
pub mod log;
pub mod metrics;
pub mod otel;
pub mod probes;
mod runtime;

pub use config::{Config, HandlerChoice};
pub use handler::{Handler, HandlerFn, Noop, Outcome, Reports, Sleep, handler_fn};
pub use metrics::Metrics;
pub use runtime::{Error, Shutdown, cancel_requested, progress, run, run_until};
/// The job a [`Handler`] is given: re-exported because the handler's
/// signature names it, so a handler author needs no second crate for it.
pub use workerpool_queue::job::Job;

use std::sync::Arc;

/// Builds the handler chosen on the command line. Starts the exec pool's
/// children (and checks an exec-per-job command exists), so a command that
/// cannot start is reported here.
pub fn build_handler(
    choice: HandlerChoice,
    config: &Config,
    metrics: &Metrics,
) -> Result<Arc<dyn Handler>, handlers::exec_pool::SpawnError> {
    Ok(match choice {
        HandlerChoice::Exec(command) => match config.children {
            Some(children) if children < config.concurrency => {
                Arc::new(handlers::exec_mux::ExecMux::start(
                    command,
                    config.concurrency,
                    children,
                    metrics.child_restarts.clone(),
                )?)
            }
            _ => Arc::new(handlers::exec_pool::ExecPool::start(
                command,
                config.concurrency,
                metrics.child_restarts.clone(),
            )?),
        },
        HandlerChoice::Noop => Arc::new(Noop),
        HandlerChoice::Sleep => Arc::new(Sleep),
        HandlerChoice::Http(url) => Arc::new(handlers::http::HttpHandler::new(url)),
        HandlerChoice::ExecPerJob(command) => {
            Arc::new(handlers::exec_per_job::ExecPerJob::new(command)?)
        }
    })
}
