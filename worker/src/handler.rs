//! The handler trait and the built-in handlers.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;

use workerpool_queue::job::Job;

/// How one attempt at a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job is done.
    Done,
    /// The job is done and returned this result: JSON text, kept as the
    /// job's outcome when it asked for one (see [`Outcome::returning`]).
    Returned(String),
    /// The job is done and returned a result that is not kept, for this
    /// reason (it is over the limit): a kept outcome says so.
    ResultNotKept(String),
    /// The attempt failed. With `retry`, the job runs again after a backoff
    /// until its attempts run out; without, it goes straight to the dead list.
    Failed { error: String, retry: bool },
    /// The handler could not run the job at all, through no fault of the
    /// job (its process cannot start, or dies before answering anything):
    /// the job goes back to the queue after `delay` without counting the
    /// attempt, as at a shutdown.
    NotRun {
        error: String,
        delay: std::time::Duration,
    },
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

    /// Done, returning `value` as the job's result. A value that cannot be
    /// written as JSON (a map with keys that are not strings, a float that
    /// is not finite in some serializers) leaves the job done without a
    /// result, and the handler's log says why.
    pub fn returning(value: &impl serde::Serialize) -> Self {
        let limit = workerpool_queue::outcome::MAX_RESULT_BYTES;
        match serde_json::to_string(value) {
            Ok(json) if json.len() > limit => Outcome::ResultNotKept(format!(
                "the result was not kept: {} bytes of JSON, over the limit of {limit}",
                json.len()
            )),
            Ok(json) => Outcome::Returned(json),
            Err(e) => {
                tracing::error!(error = %e, "the job's result cannot be written as JSON; the job is done without one");
                Outcome::Done
            }
        }
    }

    /// Whether the job is done (with a result or without).
    pub fn is_done(&self) -> bool {
        matches!(
            self,
            Outcome::Done | Outcome::Returned(_) | Outcome::ResultNotKept(_)
        )
    }
}

/// `Ok` is done; `Err` is a failure worth retrying, with the error's
/// message. Lets a handler end with `result.into()` or `?`-style code.
impl<E: std::fmt::Display> From<Result<(), E>> for Outcome {
    fn from(result: Result<(), E>) -> Self {
        match result {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::retry(e.to_string()),
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

    /// Why the handler cannot run jobs now, if it cannot (the worker then
    /// reports not ready with this reason). `None` by default.
    fn problem(&self) -> Option<String> {
        None
    }

    /// A producer asked to cancel job `id`, which this handler is running
    /// (`workerpool job cancel`, a client's `cancel`). This only tells the
    /// handler: the attempt still ends with the outcome `handle` returns,
    /// and a job that fails once asked ends cancelled rather than retried.
    /// An exec child that takes many jobs gets a cancel line, and so does a
    /// one-job child that said it reads them (`{"accepts": ["cancel"]}`);
    /// other handlers are told nothing by default. Called at most once per
    /// attempt, from the worker's maintenance, and must not block.
    fn cancel(&self, _id: &str) {}

    /// Where to send what running jobs report before they end (progress),
    /// given once, before the first job. Ignored by default: only handlers
    /// that hear reports from their jobs (exec children) keep it.
    fn set_reports(&self, _reports: std::sync::Arc<dyn Reports>) {}
}

/// Where a handler sends what a running job reports before it ends. The
/// worker writes it to the job's kept outcome, at most once per
/// [`workerpool_queue::outcome::PROGRESS_INTERVAL`] per job (reports in
/// between are folded into the latest), and drops it for a job that keeps
/// no outcome. Must not block: it only hands the report on.
pub trait Reports: Send + Sync + 'static {
    /// Running job `id` reports its progress: JSON text.
    fn progress(&self, id: &str, value: String);
}

/// A [`Handler`] made from an async function of the job; see [`handler_fn`].
#[derive(Clone, Copy)]
pub struct HandlerFn<F>(F);

impl<F> std::fmt::Debug for HandlerFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandlerFn")
    }
}

/// Turns an async function of the job into a [`Handler`]:
///
/// ```
/// use workerpool_worker::{Job, Outcome, handler_fn};
///
/// let handler = handler_fn(|job: Job| async move {
///     match job.data().get("to").and_then(|to| to.as_str()) {
///         Some(_to) => Outcome::Done,
///         None => Outcome::permanent("data.to is missing"),
///     }
/// });
/// # let _ = handler;
/// ```
///
/// The function gets its own copy of the job, so the future it returns
/// can hold it across awaits. As with any handler, the future is dropped
/// when the attempt times out or is abandoned at shutdown.
pub fn handler_fn<F, Fut>(f: F) -> HandlerFn<F>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    HandlerFn(f)
}

impl<F, Fut> Handler for HandlerFn<F>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        Box::pin((self.0)(job.clone()))
    }
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
    async fn an_async_fn_is_a_handler_and_results_convert_to_outcomes() {
        let h = handler_fn(|job: Job| async move {
            let to = job.data().get("to").and_then(serde_json::Value::as_str);
            to.map(|_| ()).ok_or("data.to is missing").into()
        });
        assert_eq!(
            h.handle(&job(json!({"data": {"to": "a"}}))).await,
            Outcome::Done
        );
        assert_eq!(
            h.handle(&job(json!({"data": {}}))).await,
            Outcome::retry("data.to is missing")
        );
    }

    #[test]
    fn a_result_is_kept_as_json_up_to_the_limit_and_over_it_the_outcome_says_why() {
        assert_eq!(
            Outcome::returning(&json!({"path": "/out/1.mp4"})),
            Outcome::Returned(r#"{"path":"/out/1.mp4"}"#.into())
        );
        let big = "x".repeat(workerpool_queue::outcome::MAX_RESULT_BYTES);
        match Outcome::returning(&big) {
            Outcome::ResultNotKept(why) => {
                assert!(why.contains("over the limit of 1048576"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        // Keys that are not strings cannot be JSON: done, without a result.
        let map: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert_eq!(Outcome::returning(&map), Outcome::Done);
    }

    #[tokio::test]
    async fn sleep_refuses_a_non_numeric_duration_permanently() {
        let outcome = Sleep.handle(&job(json!({"data": {"ms": "soon"}}))).await;
        assert!(matches!(outcome, Outcome::Failed { retry: false, .. }));
    }
}
