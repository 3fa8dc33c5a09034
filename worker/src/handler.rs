//! The handler trait and the built-in handlers.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::job::Job;

/// How one attempt at a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job is done.
    Done,
    /// The attempt failed. With `retry`, the job runs again after a backoff
    /// until its attempts run out; without, it goes straight to the dead list.
    Failed { error: String, retry: bool },
}

impl Outcome {
    /// A failure worth retrying.
    pub fn retry(error: impl Into<String>) -> Self {
        Outcome::Failed {
            error: error.into(),
            retry: true,
        }
    }

    /// A failure that retrying cannot fix.
    pub fn permanent(error: impl Into<String>) -> Self {
        Outcome::Failed {
            error: error.into(),
            retry: false,
        }
    }
}

/// Runs jobs. The runtime calls `handle` once per attempt, up to the
/// configured concurrency at once, and drops the future when the attempt
/// times out or the worker must give the job back at shutdown: handlers
/// that hold resources release them on drop.
pub trait Handler: Send + Sync + 'static {
    /// Runs one attempt at `job`.
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome>;
}

/// Completes every job at once (for demos and benchmarks).
#[derive(Debug, Default, Clone, Copy)]
pub struct Noop;

impl Handler for Noop {
    fn handle<'a>(&'a self, _job: &'a Job) -> BoxFuture<'a, Outcome> {
        Box::pin(std::future::ready(Outcome::Done))
    }
}

/// Sleeps `data.ms` milliseconds, then completes the job (for demos and
/// benchmarks). A job without `data.ms` completes at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sleep;

impl Handler for Sleep {
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        let ms = job.data().get("ms").map(|v| v.as_u64());
        Box::pin(async move {
            match ms {
                None => Outcome::Done,
                Some(Some(ms)) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Outcome::Done
                }
                Some(None) => Outcome::permanent("sleep: `data.ms` must be a non-negative integer"),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(value: serde_json::Value) -> Job {
        match value {
            serde_json::Value::Object(fields) => Job::from_fields(fields),
            _ => unreachable!("test jobs are objects"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_waits_data_ms_then_completes() {
        let started = tokio::time::Instant::now();
        let outcome = Sleep.handle(&job(json!({"data": {"ms": 250}}))).await;
        assert_eq!(outcome, Outcome::Done);
        assert_eq!(started.elapsed(), Duration::from_millis(250));
    }

    #[tokio::test]
    async fn sleep_refuses_a_non_numeric_duration_permanently() {
        let outcome = Sleep.handle(&job(json!({"data": {"ms": "soon"}}))).await;
        assert!(matches!(outcome, Outcome::Failed { retry: false, .. }));
    }
}
