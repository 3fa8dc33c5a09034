//! The scaling engine: from what the queue looks like to how many workers it needs.
//!
//! Pure code: no I/O, no clock. The Kubernetes controller and local mode both call
//! [`Engine::tick`] once per poll with an [`Observation`] and the current time, and apply
//! the [`Decision`]; [`Engine::tick_failed`] stands in when the queue could not be read.
//!
//! Each tick:
//! 1. every configured target proposes a replica count (the backlog target always, on the
//!    work that will still be there when a pod started now is ready; the drain target once
//!    per-replica throughput is known; the wait target when set), each with the HPA's
//!    tolerance; the largest proposal wins;
//! 2. zero is special: a pool at zero wakes only at `activationBacklog` and then goes
//!    straight to the proposed size; a pool goes to zero only after its idle hold
//!    ([`Engine::idle_hold`]: `idleSecondsBeforeZero`, or when that is left out, 300 s
//!    while work lately came back within 300 s of going idle, else one pod start-up)
//!    with nothing queued, due or running, and otherwise keeps at least one replica;
//! 3. a queue with a rate limit (`spec.worker.rateLimit`) caps the proposal at the
//!    workers the limit keeps busy: with `J = rate × job seconds`,
//!    `ceil((J + √(J·s)) / concurrency) + 1`, where `s` (at most 1) grows with the
//!    spread of the job durations ([`Workers::busy_at_limit`]), at a wake as at any
//!    size, and the scale-down window does not hold the pool above it; the job
//!    duration and its spread are the workers' own, kept in Redis, so the cap holds
//!    from the first decision after a restart or an idle spell;
//!    a pool whose completions stopped rising with its size (a downstream the jobs
//!    share is saturated: [`Knee`]) is capped at the knee the same way, but for a
//!    probe above it now and then while work waits, and the decision carries the
//!    [`Saturation`] measured; a queue with a rate limit has no knee;
//! 4. the HPA `behavior` (stabilization windows, rate policies, `selectPolicy`) and
//!    `minReplicas`/`maxReplicas` shape the result, with the HPA's meaning.
//!
//! The actuator reports each change it applied with [`Engine::applied`]: a scale event
//! counts for the rate policies, and times the pods' start-up, only once it happened.

mod behavior;
mod engine;
mod estimate;
mod knee;
mod reason;
mod spec;

pub use behavior::{
    Behavior, DEFAULT_SCALE_DOWN_WINDOW_SECONDS, DEFAULT_TOLERANCE, Normalized, Normalizer, Policy,
    Rules, Select,
};
pub use engine::{Decision, Engine, MANUAL_REPLICAS, Proposals, Verdict, Workers, decide};
pub use estimate::{RateEstimator, StartupEstimator};
pub use knee::Knee;
pub use reason::{HoldBasis, IdleHold, Limit, RateCap, Reason, Rule, Saturation};
pub use spec::{DEFAULT_IDLE_SECONDS_BEFORE_ZERO, FallbackSpec, ScalingSpec};

use serde::{Deserialize, Serialize};

/// What the queue and the workers look like at one tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// Jobs ready to run: waiting in the list, plus due retries and due
    /// delayed jobs (the CRD's and the queue contract's "backlog").
    pub backlog: u64,
    /// Jobs being processed by workers.
    pub in_flight: u64,
    /// Of the backlog, the due retries and due delayed jobs not yet moved
    /// back to the list (a part of `backlog`, never added to it).
    pub due: u64,
    /// Age in seconds of the oldest waiting job, when producers stamp `enqueued_at`.
    pub oldest_job_age_seconds: Option<f64>,
    /// Monotonic counter of jobs completed (done or dead-lettered). Arrivals are derived
    /// from it and the queue depths; a counter that goes backwards is read as a reset.
    pub processed_total: u64,
    /// Replicas the workload has (desired replicas of the Deployment, or local processes).
    pub current_replicas: i32,
    /// Replicas that are ready to take jobs.
    pub ready_replicas: i32,
    /// The mean job duration in seconds as the workers measured it, kept in
    /// Redis (`<q>:stats:duration`) once a job has finished.
    #[serde(default)]
    pub job_seconds: Option<f64>,
    /// The standard deviation of the job durations as the workers measured
    /// it, kept in Redis beside the mean (`<q>:stats:duration_sq`).
    #[serde(default)]
    pub job_seconds_deviation: Option<f64>,
}

impl Observation {
    /// What the queue's counts say, with the workload's current and ready
    /// replicas: the one translation the controller and local mode share.
    /// Jobs held by lost workers count as in flight: they come back to the
    /// list only when a live worker reaps them.
    pub fn from_counts(
        counts: &workerpool_queue::snapshot::Counts,
        current_replicas: i32,
        ready_replicas: i32,
    ) -> Self {
        Observation {
            backlog: counts.backlog(),
            in_flight: counts.held(),
            due: counts.due(),
            oldest_job_age_seconds: counts.oldest_job_age_seconds(),
            processed_total: counts.processed_total,
            current_replicas,
            ready_replicas,
            job_seconds: counts.job_seconds(),
            job_seconds_deviation: counts.job_seconds_deviation(),
        }
    }

    pub(super) fn pending(&self) -> bool {
        self.backlog > 0 || self.in_flight > 0
    }
}

#[cfg(test)]
mod tests;
