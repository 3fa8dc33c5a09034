//! The controller: one reconcile per WorkerPool every `pollIntervalSeconds`
//! (Redis cannot be watched, so the periodic requeue is the trigger; edits
//! to the pool or its Deployment trigger one too).
//!
//! A reconcile reads the queue in one round trip, asks the scaling engine
//! for a size, marks idle pods cheap to delete before a scale-down, applies
//! the Deployment server-side, and writes status and events.

mod apply;
mod endpoint;
mod error;
mod fires;
mod memory;
mod observe;
mod plan;
mod pods;
mod status;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;

use apply::apply;
pub use error::{Error, QueueProblem};
pub use memory::Context;
use observe::observe;
use plan::plan;
pub use pods::DELETION_COST;

use crate::crd::WorkerPool;
use crate::scaling::{self, Observation};

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
        lock(&ctx.failures).remove(&pool_key(&pool));
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
    let observed = observe(pool, ctx).await?;
    let decided_at = ctx.now();
    let verdict = scaling::decide(
        lock(&ctx.engines)
            .entry(key.clone())
            .or_default()
            .with_workers(scaling::Workers::new(
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
                Observation::from_snapshot(snap, observed.counts.current, observed.counts.ready)
            })
            .as_ref(),
        observed.counts.current,
        decided_at,
    );
    let announced = lock(&ctx.announced).get(&key).cloned();
    let plan = plan(pool, &observed, &verdict, announced.as_deref())?;
    apply(pool, ctx, observed, plan, decided_at).await
}

/// What to do after a failed reconcile: log, count, retry soon.
pub fn error_policy(pool: Arc<WorkerPool>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(pool = %pool.name_any(), error = %error, "reconcile failed");
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[error.label()])
        .inc();
    let failures = {
        let mut all = lock(&ctx.failures);
        let n = all.entry(pool_key(&pool)).or_default();
        *n = n.saturating_add(1);
        *n
    };
    Action::requeue(retry_delay(failures))
}

#[cfg(test)]
mod tests;
