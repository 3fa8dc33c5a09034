//! The controller: one reconcile per WorkerPool every `pollIntervalSeconds`
//! (Redis cannot be watched, so the periodic requeue is the trigger; edits
//! to the pool or its Deployment trigger one too).
//!
//! A reconcile runs its steps in order:
//! - `observe` reads the Deployment, the pods while workers are missing,
//!   the queue in one round trip, and the Redis's memory settings and dead
//!   letters; it writes nothing to Redis or the cluster;
//! - `fires` enqueues the schedules' due fires, before the queue is read
//!   so that a pool at zero wakes for its job in the same reconcile;
//! - `plan` is pure: from what was observed, the engine's verdict, the
//!   pool's `PoolMemory` and the clocks passed in, it decides the
//!   Deployment, the events, the status, and which writes to skip;
//! - `apply` carries the plan out (deletion costs, the Deployment applied
//!   server-side, events, status) and decides nothing.
//!
//! The controller watches [`Watched`] objects: a WorkerPool that does not
//! read as one is skipped and reported (`unreadable`), and never keeps the
//! others from being reconciled.

mod apply;
mod endpoint;
mod error;
mod fires;
mod memory;
mod observe;
mod plan;
mod pods;
mod status;
mod unreadable;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;

use apply::apply;
use endpoint::redis_endpoint;
pub use error::{Error, QueueProblem};
pub use memory::Context;
use plan::{Clock, plan};
pub use pods::DELETION_COST;
pub use unreadable::POOL_UNREADABLE;

use crate::crd::WorkerPool;
use crate::scaling::{self, Observation};
use crate::watched::Watched;

/// The field manager of everything the operator applies.
pub const MANAGER: &str = "workerpool-operator";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reconciles one WorkerPool.
pub async fn reconcile(pool: Arc<WorkerPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&pool, &ctx).await;
    ctx.metrics
        .observe_reconcile(started.elapsed(), result.as_ref().err().map(Error::label));
    if result.is_ok() {
        ctx.pool(&pool_key(&pool), |m| m.failures = 0);
    }
    result
}

fn pool_key(pool: &WorkerPool) -> String {
    format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    )
}

/// Delay before retrying a pool whose reconcile failed `failures` times in
/// a row: 5 s doubling to 5 minutes.
pub fn retry_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(6);
    Duration::from_secs(5 << doublings).min(Duration::from_secs(300))
}

async fn reconcile_inner(pool: &WorkerPool, ctx: &Context) -> Result<Action, Error> {
    let key = pool_key(pool);
    let workload = observe::workload(pool, ctx).await?;
    let endpoint = redis_endpoint(pool, &ctx.client).await;
    // Fires before the queue is read, so that a pool at zero wakes for its
    // job now.
    let fires = fires::fire(pool, ctx, endpoint.as_ref().ok()).await;
    let observed = observe::queue(pool, ctx, workload, endpoint.as_ref()).await;
    let clock = Clock {
        now: ctx.now(),
        wall: jiff::Timestamp::now(),
    };
    let plan = ctx.pool(&key, |memory| {
        // What an earlier engine measured (before a restart or a leader change).
        if let Some(seconds) = pool.status.as_ref().and_then(|s| s.pod_startup_seconds) {
            memory.engine.seed_startup(seconds);
        }
        let verdict = scaling::decide(
            memory.engine.with_workers(scaling::Workers::new(
                pool.spec.worker.rate_limit.as_deref(),
                pool.spec.worker.concurrency,
            )),
            pool.spec.scaling.as_ref(),
            pool.spec.replicas,
            observed
                .reading
                .as_ref()
                .ok()
                .map(|snap| {
                    Observation::from_counts(
                        &snap.counts(),
                        observed.replicas.current,
                        observed.replicas.ready,
                    )
                })
                .as_ref(),
            observed.replicas.current,
            clock.now,
        );
        plan(pool, &observed, &fires, &verdict, memory, clock)
    })?;
    apply(pool, ctx, observed, plan).await
}

/// What to do after a failed reconcile: log, count, retry soon.
pub fn error_policy(pool: Arc<WorkerPool>, error: &Error, ctx: Arc<Context>) -> Action {
    retry(&pool_key(&pool), error, &ctx)
}

fn retry(key: &str, error: &Error, ctx: &Context) -> Action {
    tracing::warn!(pool = %key, error = %error, "reconcile failed");
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[error.label()])
        .inc();
    let failures = ctx.pool(key, |m| {
        m.failures = m.failures.saturating_add(1);
        m.failures
    });
    Action::requeue(retry_delay(failures))
}

/// Reconciles one object of the watch: a pool, or, for an object that
/// does not read as one, says so on it and waits for it to change.
pub async fn reconcile_watched(object: Arc<Watched>, ctx: Arc<Context>) -> Result<Action, Error> {
    match object.as_ref() {
        Watched::Pool(pool) => {
            ctx.metrics.readable(
                pool.namespace().as_deref().unwrap_or_default(),
                &pool.name_any(),
            );
            reconcile(pool.clone(), ctx).await
        }
        Watched::Unreadable(unreadable) => {
            unreadable::report(unreadable, &ctx)
                .await
                .map_err(Error::PatchStatus)?;
            ctx.pool(&object.key(), |m| m.failures = 0);
            Ok(Action::await_change())
        }
    }
}

/// [`error_policy`] for an object of the watch.
pub fn error_policy_watched(object: Arc<Watched>, error: &Error, ctx: Arc<Context>) -> Action {
    match object.as_ref() {
        Watched::Pool(pool) => error_policy(pool.clone(), error, ctx),
        Watched::Unreadable(_) => retry(&object.key(), error, &ctx),
    }
}

#[cfg(test)]
mod tests;
