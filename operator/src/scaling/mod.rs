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
//!    straight to the proposed size; a pool goes to zero only after `idleSecondsBeforeZero`
//!    with nothing queued, due or running, and otherwise keeps at least one replica;
//! 3. a queue with a rate limit (`spec.worker.rateLimit`) caps the proposal at the
//!    workers the limit keeps busy: with `J = rate × job seconds`,
//!    `ceil((J + √J) / concurrency) + 1` ([`Workers::busy_at_limit`]);
//! 4. the HPA `behavior` (stabilization windows, rate policies, `selectPolicy`) and
//!    `minReplicas`/`maxReplicas` shape the result, with the HPA's meaning.
//!
//! The actuator reports each change it applied with [`Engine::applied`]: a scale event
//! counts for the rate policies, and times the pods' start-up, only once it happened.

mod behavior;
mod estimate;

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerBehavior;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workerpool_queue::rate::RateLimit;

pub use behavior::{
    Behavior, DEFAULT_SCALE_DOWN_WINDOW_SECONDS, DEFAULT_TOLERANCE, Normalized, Normalizer, Policy,
    Rules, Select,
};
pub use estimate::{RateEstimator, StartupEstimator};

use behavior::to_i32;

/// How a WorkerPool scales with its queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingSpec {
    /// The fewest workers to run. 0 (the default) lets an idle pool scale to zero.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,

    /// The most workers to run. Defaults to 100, as in KEDA.
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = 1))]
    pub max_replicas: i32,

    /// How often the operator reads the queue and decides, in seconds. Defaults to 5.
    #[serde(default = "default_poll_interval_seconds")]
    #[schemars(range(min = 1))]
    pub poll_interval_seconds: i32,

    /// Jobs (waiting plus running) that one worker should have. The pool is sized to
    /// ceil((backlog + inFlight) / targetBacklogPerReplica). Defaults to 5, like KEDA's
    /// `listLength`.
    #[serde(default = "default_target_backlog_per_replica")]
    #[schemars(range(min = 1))]
    pub target_backlog_per_replica: i32,

    /// Seconds within which the current backlog should be cleared while keeping up with
    /// arrivals. Once the operator has measured how many jobs per second one worker
    /// completes, the pool is sized to
    /// ceil((arrivalRate + backlog / targetDrainSeconds) / perReplicaThroughput).
    /// This keeps a steadily loaded pool at the size its traffic needs instead of letting a
    /// backlog build up before it grows. Defaults to 60; set to null to turn it off.
    #[serde(default = "default_target_drain_seconds")]
    #[schemars(range(min = 1))]
    pub target_drain_seconds: Option<i32>,

    /// The age in seconds that the oldest waiting job should not exceed. The pool is sized
    /// as the HPA does for a `Value` metric: ceil(readyReplicas × oldestAge / target).
    /// The age comes from the jobs' `enqueued_at`; when producers do not set it, it is
    /// estimated as backlog / throughput. Off unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub target_wait_seconds: Option<i32>,

    /// Waiting jobs (including retries that are due) that wake a pool from zero. Defaults
    /// to 1.
    #[serde(default = "default_activation_backlog")]
    #[schemars(range(min = 1))]
    pub activation_backlog: i32,

    /// Seconds with nothing queued, due or running before the pool scales to zero (when
    /// `minReplicas` is 0). Defaults to 300, like KEDA's `cooldownPeriod`.
    #[serde(default = "default_idle_seconds_before_zero")]
    #[schemars(range(min = 0))]
    pub idle_seconds_before_zero: i32,

    /// How fast the pool may grow and shrink: the `behavior` field of a
    /// HorizontalPodAutoscaler (`autoscaling/v2`), with the same meaning. Fields left out
    /// take the operator's defaults: scale up with no rate limit and no stabilization
    /// window; scale down after a 60 s stabilization window by up to 100 % per 15 s;
    /// tolerance 0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<HorizontalPodAutoscalerBehavior>,

    /// What to do when the queue cannot be read. Without it, the pool keeps its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSpec>,
}

/// The replica count to use when the queue cannot be read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSpec {
    /// Consecutive failed reads before switching to `replicas`. Until then the pool keeps
    /// its size. Defaults to 3.
    #[serde(default = "default_failure_threshold")]
    #[schemars(range(min = 1))]
    pub failure_threshold: i32,

    /// Workers to run while the queue cannot be read.
    #[schemars(range(min = 0))]
    pub replicas: i32,
}

fn default_max_replicas() -> i32 {
    100
}
fn default_poll_interval_seconds() -> i32 {
    5
}
fn default_target_backlog_per_replica() -> i32 {
    5
}
fn default_target_drain_seconds() -> Option<i32> {
    Some(60)
}
fn default_activation_backlog() -> i32 {
    1
}
fn default_idle_seconds_before_zero() -> i32 {
    300
}
fn default_failure_threshold() -> i32 {
    3
}

impl Default for ScalingSpec {
    fn default() -> Self {
        ScalingSpec {
            min_replicas: 0,
            max_replicas: default_max_replicas(),
            poll_interval_seconds: default_poll_interval_seconds(),
            target_backlog_per_replica: default_target_backlog_per_replica(),
            target_drain_seconds: default_target_drain_seconds(),
            target_wait_seconds: None,
            activation_backlog: default_activation_backlog(),
            idle_seconds_before_zero: default_idle_seconds_before_zero(),
            behavior: None,
            fallback: None,
        }
    }
}

impl ScalingSpec {
    /// Everything in the spec that would make the engine guess, in words that say what to
    /// fix. Empty when the spec is valid. The CRD schema refuses most of these at apply
    /// time; this is for the rest and for specs that did not come through the API server.
    pub fn problems(&self) -> Vec<String> {
        let mut found = Vec::new();
        if self.min_replicas < 0 {
            found.push(format!(
                "minReplicas must be 0 or more, not {}",
                self.min_replicas
            ));
        }
        if self.max_replicas < 1 {
            found.push(format!(
                "maxReplicas must be 1 or more, not {}",
                self.max_replicas
            ));
        }
        if self.min_replicas > self.max_replicas {
            found.push(format!(
                "minReplicas ({}) must not exceed maxReplicas ({})",
                self.min_replicas, self.max_replicas
            ));
        }
        let positive = [
            ("pollIntervalSeconds", Some(self.poll_interval_seconds)),
            (
                "targetBacklogPerReplica",
                Some(self.target_backlog_per_replica),
            ),
            ("targetDrainSeconds", self.target_drain_seconds),
            ("targetWaitSeconds", self.target_wait_seconds),
            ("activationBacklog", Some(self.activation_backlog)),
        ];
        for (name, value) in positive {
            if let Some(value) = value
                && value < 1
            {
                found.push(format!("{name} must be 1 or more, not {value}"));
            }
        }
        if self.idle_seconds_before_zero < 0 {
            found.push(format!(
                "idleSecondsBeforeZero must be 0 or more, not {}",
                self.idle_seconds_before_zero
            ));
        }
        if let Some(fallback) = &self.fallback {
            if fallback.failure_threshold < 1 {
                found.push(format!(
                    "fallback.failureThreshold must be 1 or more, not {}",
                    fallback.failure_threshold
                ));
            }
            if fallback.replicas < 0 {
                found.push(format!(
                    "fallback.replicas must be 0 or more, not {}",
                    fallback.replicas
                ));
            }
        }
        if let Some(written) = &self.behavior {
            found.extend(behavior::problems(written));
        }
        found
    }

    /// The `behavior` in force: what the user wrote, with the engine's defaults for the rest.
    pub fn resolved_behavior(&self) -> Behavior {
        Behavior::resolve(self.behavior.as_ref(), &Behavior::engine_defaults())
    }

    /// The effective `[min, max]`: a max below min is read as min.
    fn bounds(&self) -> (i32, i32) {
        let min = self.min_replicas.max(0);
        (min, self.max_replicas.max(min))
    }
}

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
    pub due_retries: u64,
    /// Age in seconds of the oldest waiting job, when producers stamp `enqueued_at`.
    pub oldest_job_age_seconds: Option<f64>,
    /// Monotonic counter of jobs completed (done or dead-lettered). Arrivals are derived
    /// from it and the queue depths; a counter that goes backwards is read as a reset.
    pub processed_total: u64,
    /// Replicas the workload has (desired replicas of the Deployment, or local processes).
    pub current_replicas: i32,
    /// Replicas that are ready to take jobs.
    pub ready_replicas: i32,
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
            due_retries: counts.due(),
            oldest_job_age_seconds: counts.oldest_job_age_seconds(),
            processed_total: counts.processed_total,
            current_replicas,
            ready_replicas,
        }
    }

    fn pending(&self) -> bool {
        self.backlog > 0 || self.in_flight > 0
    }
}

/// Which rule decided the replica count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Rule {
    /// The backlog target asked for the most replicas.
    BacklogTarget,
    /// The drain target asked for the most replicas.
    DrainTarget,
    /// The wait target asked for the most replicas.
    WaitTarget,
    /// The largest target was within the tolerance of the current count, which is kept.
    WithinTolerance,
    /// The targets asked for zero; at least one replica stays until the pool has been idle
    /// for `idleSecondsBeforeZero` (or while work is pending).
    AwaitingIdle,
    /// Idle for `idleSecondsBeforeZero`: scaled to zero.
    IdleToZero,
    /// At zero and the backlog reached `activationBacklog`: woke straight to the computed size.
    Activation,
    /// At zero and the backlog is below `activationBacklog`.
    BelowActivation,
    /// The queue could not be read; the current count is kept.
    MetricsUnavailable,
    /// The queue could not be read `fallback.failureThreshold` times in a row: using
    /// `fallback.replicas`.
    Fallback,
}

/// What held the decided count back from the rule's proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Limit {
    /// A lower recommendation within the scale-up stabilization window.
    ScaleUpStabilized,
    /// A higher recommendation within the scale-down stabilization window.
    ScaleDownStabilized,
    /// The scale-up policies (or `selectPolicy: Disabled`).
    ScaleUpLimit,
    /// The scale-down policies (or `selectPolicy: Disabled`).
    ScaleDownLimit,
    /// `maxReplicas`.
    MaxReplicas,
    /// `minReplicas`.
    MinReplicas,
    /// The queue's rate limit: more workers would only wait for it.
    RateLimit,
}

/// What the workers' settings tell the engine: the queue's rate limit (if
/// any) and the jobs each worker runs at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    /// At most this many job starts per period across the pool.
    pub rate_limit: Option<RateLimit>,
    /// Jobs one worker runs at once.
    pub concurrency: i32,
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            rate_limit: None,
            concurrency: 1,
        }
    }
}

impl Workers {
    /// From `spec.worker`: its `rateLimit` as written (one that does not
    /// parse, which the CRD's rule refuses, counts as none) and its
    /// `concurrency`.
    pub fn new(rate_limit: Option<&str>, concurrency: i32) -> Self {
        Workers {
            rate_limit: rate_limit.and_then(|r| r.parse().ok()),
            concurrency: concurrency.max(1),
        }
    }

    /// The most workers the rate limit keeps busy when one job takes
    /// `job_seconds`: by Little's law `J = rate × job_seconds` jobs run at
    /// once at the limit, on average. Job durations vary, so the count in
    /// flight does too (about `√J` around `J`, as in an M/G/∞ queue); a
    /// pool sized for the mean alone would often have no free slot when the
    /// limit allows a start, and a start missed is lost. So the cap is
    /// `ceil((J + √J) / concurrency) + 1` (the square-root staffing rule,
    /// plus one for the burst and the estimate's error). `None` without a
    /// limit.
    pub fn busy_at_limit(&self, job_seconds: f64) -> Option<i32> {
        let rate = self.rate_limit?.per_second();
        let jobs = rate * job_seconds.max(0.0);
        let busy = (jobs + jobs.sqrt()) / f64::from(self.concurrency.max(1));
        Some(ceil(busy).saturating_add(1))
    }
}

/// The rate limit that capped a pool, and the workers it keeps busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateCap {
    /// The queue's rate limit.
    pub limit: RateLimit,
    /// The most workers it keeps busy.
    pub workers: i32,
}

/// Why the engine decided what it did: machine-readable for status and events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reason {
    /// The rule that decided.
    pub rule: Rule,
    /// The window, policy or bound that held it back, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Limit>,
    /// Consecutive failed reads of the queue (0 when the last read worked).
    #[serde(default)]
    pub consecutive_failures: u32,
    /// With the limit `RateLimit`: the rate limit and the workers it keeps busy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub rate_cap: Option<RateCap>,
}

impl Rule {
    /// A stable CamelCase code, usable as a Kubernetes condition or event reason.
    pub fn code(self) -> &'static str {
        match self {
            Rule::BacklogTarget => "BacklogTarget",
            Rule::DrainTarget => "DrainTarget",
            Rule::WaitTarget => "WaitTarget",
            Rule::WithinTolerance => "WithinTolerance",
            Rule::AwaitingIdle => "AwaitingIdle",
            Rule::IdleToZero => "IdleToZero",
            Rule::Activation => "Activation",
            Rule::BelowActivation => "BelowActivation",
            Rule::MetricsUnavailable => "MetricsUnavailable",
            Rule::Fallback => "Fallback",
        }
    }
}

impl Limit {
    /// A stable CamelCase code, usable as a Kubernetes condition or event reason.
    pub fn code(self) -> &'static str {
        match self {
            Limit::ScaleUpStabilized => "ScaleUpStabilized",
            Limit::ScaleDownStabilized => "ScaleDownStabilized",
            Limit::ScaleUpLimit => "ScaleUpLimit",
            Limit::ScaleDownLimit => "ScaleDownLimit",
            Limit::MaxReplicas => "MaxReplicas",
            Limit::MinReplicas => "MinReplicas",
            Limit::RateLimit => "RateLimit",
        }
    }
}

impl Reason {
    fn of(rule: Rule) -> Self {
        Reason {
            rule,
            limit: None,
            consecutive_failures: 0,
            rate_cap: None,
        }
    }

    /// A stable CamelCase code: the limit when one held the count back, else the rule.
    pub fn code(&self) -> &'static str {
        self.limit.map_or(self.rule.code(), Limit::code)
    }

    /// A sentence for people, for events and condition messages.
    pub fn message(&self) -> String {
        let rule = match self.rule {
            Rule::BacklogTarget => "sized by the backlog target".to_string(),
            Rule::DrainTarget => "sized by the drain target".to_string(),
            Rule::WaitTarget => "sized by the wait target".to_string(),
            Rule::WithinTolerance => {
                "the largest target is within tolerance of the current size".to_string()
            }
            Rule::AwaitingIdle => {
                "no work to size for; keeping a replica until the pool has been idle long enough"
                    .to_string()
            }
            Rule::IdleToZero => "idle for idleSecondsBeforeZero; scaling to zero".to_string(),
            Rule::Activation => {
                "backlog reached activationBacklog; waking from zero at the computed size"
                    .to_string()
            }
            Rule::BelowActivation => "at zero; backlog below activationBacklog".to_string(),
            Rule::MetricsUnavailable => {
                format!(
                    "queue unreadable ({} times in a row); keeping the current size",
                    self.consecutive_failures
                )
            }
            Rule::Fallback => {
                format!(
                    "queue unreadable ({} times in a row); using fallback.replicas",
                    self.consecutive_failures
                )
            }
        };
        let limit = match (self.limit, self.rate_cap) {
            (Some(Limit::RateLimit), Some(cap)) => {
                return format!(
                    "{rule}, capped: the queue's rate limit {} keeps at most {} workers busy",
                    cap.limit, cap.workers
                );
            }
            (limit, _) => limit,
        };
        let limit = match limit {
            None => return rule,
            Some(Limit::ScaleUpStabilized) => {
                "held by a lower recommendation within the scale-up stabilization window"
            }
            Some(Limit::ScaleDownStabilized) => {
                "held by a higher recommendation within the scale-down stabilization window"
            }
            Some(Limit::ScaleUpLimit) => "limited by the scale-up policies",
            Some(Limit::ScaleDownLimit) => "limited by the scale-down policies",
            Some(Limit::MaxReplicas) => "capped at maxReplicas",
            Some(Limit::MinReplicas) => "raised to minReplicas",
            Some(Limit::RateLimit) => "capped at the workers the queue's rate limit keeps busy",
        };
        format!("{rule}, {limit}")
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code(), self.message())
    }
}

/// What each target proposed at one tick (None when it was not in force).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Proposals {
    /// The backlog target's proposal.
    pub backlog: i32,
    /// The drain target's proposal, once throughput is known.
    pub drain: Option<i32>,
    /// The wait target's proposal, when set and the age is known.
    pub wait: Option<i32>,
}

/// The engine's answer for one tick.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Replicas to run.
    pub desired: i32,
    /// Why.
    pub reason: Reason,
    /// The recommendation before stabilization, policies and bounds (what the
    /// stabilization windows remember).
    pub recommendation: i32,
    /// Each target's proposal.
    pub proposals: Proposals,
    /// Smoothed arrivals per second, once known.
    pub arrival_rate: Option<f64>,
    /// Smoothed jobs per second one saturated replica completes, once known.
    pub per_replica_throughput: Option<f64>,
}

/// How many workers a pool runs now, and why: the one decision the
/// controller and local mode both apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Replicas to run.
    pub desired: i32,
    /// The engine's decision; `None` when `spec.replicas` fixes the size.
    pub decision: Option<Decision>,
}

/// The manual-size rule's code, beside the engine's rule codes.
pub const MANUAL_REPLICAS: &str = "ManualReplicas";

impl Verdict {
    /// The CamelCase code of the rule that decided.
    pub fn code(&self) -> &'static str {
        self.decision
            .as_ref()
            .map_or(MANUAL_REPLICAS, |d| d.reason.code())
    }

    /// The reason as a sentence.
    pub fn message(&self) -> String {
        match &self.decision {
            Some(d) => d.reason.message(),
            None => format!("spec.replicas fixes the pool at {}", self.desired),
        }
    }
}

/// Decides a pool's size the one way both actuators share: scaled on a
/// queue that was read (`observed`), scaled on a queue that could not be
/// read (`observed` is `None`: hold, then fall back), or fixed by
/// `replicas` when there is no `scaling`; the engine caps the size by the
/// workers' settings it was given ([`Engine::with_workers`]). Once the
/// actuator has applied a change, it tells the engine with
/// [`Engine::applied`].
pub fn decide(
    engine: &mut Engine,
    scaling: Option<&ScalingSpec>,
    replicas: Option<i32>,
    observed: Option<&Observation>,
    current: i32,
    now: Duration,
) -> Verdict {
    let decision = match (scaling, observed) {
        (Some(spec), Some(observation)) => Some(engine.tick(spec, observation, now)),
        (Some(spec), None) => Some(engine.tick_failed(spec, current)),
        (None, _) => None,
    };
    Verdict {
        desired: decision
            .as_ref()
            .map_or(replicas.unwrap_or(0), |d| d.desired),
        decision,
    }
}

/// The scaling engine's state between ticks. One per pool.
#[derive(Clone, Debug, Default)]
pub struct Engine {
    normalizer: Normalizer,
    rates: RateEstimator,
    startup: StartupEstimator,
    consecutive_failures: u32,
    idle_since: Option<f64>,
    workers: Workers,
}

impl Engine {
    /// A fresh engine, with no history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the engine the workers' settings (the rate limit, the
    /// concurrency) that the next ticks size for.
    pub fn set_workers(&mut self, workers: Workers) {
        self.workers = workers;
    }

    /// [`Engine::set_workers`], returning the engine (for [`decide`]).
    pub fn with_workers(&mut self, workers: Workers) -> &mut Self {
        self.set_workers(workers);
        self
    }

    /// The rates measured so far.
    pub fn rates(&self) -> &RateEstimator {
        &self.rates
    }

    /// The highest recommendation made after `now - window`, if any.
    pub fn highest_recommendation_within(&self, now: Duration, window: Duration) -> Option<i32> {
        self.normalizer
            .highest_recommendation_since(secs(now) - window.as_secs_f64())
    }

    /// How long new replicas take to become ready, once measured.
    pub fn startup(&self) -> &StartupEstimator {
        &self.startup
    }

    /// Records that the workload was scaled from `from` to `to` replicas at `now`: call it
    /// once the change is applied (the Deployment patched, the processes started), never
    /// for a change that failed. Scale events feed the rate policies' periods, as the HPA
    /// records them only after a successful update, and scale-ups time the pods' start-up.
    pub fn applied(&mut self, now: Duration, from: i32, to: i32) {
        let now = secs(now);
        self.normalizer.record_scale(now, from, to);
        self.startup.scaled(now, from, to);
    }

    /// Decides the replica count from a successful read of the queue. `now` is any
    /// monotonic time since a fixed epoch; the engine never reads a clock.
    ///
    /// Deciding records the recommendation for the stabilization windows (as the HPA
    /// does), but not a scale event: call [`Engine::applied`] once the decision is applied.
    pub fn tick(
        &mut self,
        spec: &ScalingSpec,
        observation: &Observation,
        now: Duration,
    ) -> Decision {
        let now_s = secs(now);
        self.consecutive_failures = 0;
        let decision = self.decide(spec, observation, now_s);
        // Rates are updated after deciding, so a decision depends on this tick's depths
        // only through the targets: that keeps it monotone in the backlog.
        self.rates.observe(
            now_s,
            observation.processed_total,
            observation.backlog,
            observation.in_flight,
            observation.ready_replicas,
        );
        self.startup.observe(
            now_s,
            observation.current_replicas,
            observation.ready_replicas,
        );
        decision
    }

    /// Decides the replica count when the queue could not be read: keep `current_replicas`,
    /// then after `fallback.failureThreshold` consecutive failures use `fallback.replicas`.
    /// Either way the count stays within `[minReplicas, maxReplicas]`: the bounds are the
    /// user's hard limits, and an outage is when a pool most needs its floor (a new pool
    /// with `minReplicas: 1` starts one worker even though the queue cannot be read yet).
    /// As with [`Engine::tick`], call [`Engine::applied`] once a change is applied.
    pub fn tick_failed(&mut self, spec: &ScalingSpec, current_replicas: i32) -> Decision {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        // An outage is not idleness: the countdown to zero starts again afterwards.
        self.idle_since = None;
        let (min, max) = spec.bounds();
        let (proposed, rule) = match &spec.fallback {
            Some(fallback)
                if self.consecutive_failures
                    >= fallback.failure_threshold.max(1).unsigned_abs() =>
            {
                (fallback.replicas, Rule::Fallback)
            }
            _ => (current_replicas.max(0), Rule::MetricsUnavailable),
        };
        let desired = proposed.clamp(min, max);
        let limit = match desired.cmp(&proposed) {
            std::cmp::Ordering::Greater => Some(Limit::MinReplicas),
            std::cmp::Ordering::Less => Some(Limit::MaxReplicas),
            std::cmp::Ordering::Equal => None,
        };
        Decision {
            desired,
            reason: Reason {
                rule,
                limit,
                consecutive_failures: self.consecutive_failures,
                rate_cap: None,
            },
            recommendation: proposed,
            proposals: Proposals::default(),
            arrival_rate: self.rates.arrival_rate(),
            per_replica_throughput: self.rates.per_replica_throughput(),
        }
    }

    fn decide(&mut self, spec: &ScalingSpec, obs: &Observation, now: f64) -> Decision {
        let behavior = spec.resolved_behavior();
        let (min, max) = spec.bounds();
        let current = obs.current_replicas.max(0);
        let (proposals, largest, rule) = self.propose(spec, &behavior, obs);
        // More workers than the rate limit keeps busy would only wait for it. Until a
        // job's duration is measured there is nothing to size the cap on: no cap.
        let cap = self
            .rates
            .job_seconds()
            .and_then(|seconds| self.workers.busy_at_limit(seconds))
            .filter(|cap| largest > *cap)
            .zip(self.workers.rate_limit)
            .map(|(workers, limit)| RateCap { limit, workers });
        let largest = cap.map_or(largest, |cap| cap.workers);
        let decision = |desired: i32, mut reason: Reason, recommendation: i32| {
            if reason.limit.is_none() && cap.is_some() && desired == recommendation {
                reason.limit = Some(Limit::RateLimit);
            }
            if reason.limit == Some(Limit::RateLimit) {
                reason.rate_cap = cap;
            }
            Decision {
                desired,
                reason,
                recommendation,
                proposals,
                arrival_rate: self.rates.arrival_rate(),
                per_replica_throughput: self.rates.per_replica_throughput(),
            }
        };

        if obs.pending() {
            self.idle_since = None;
        } else if self.idle_since.is_none() {
            self.idle_since = Some(now);
        }

        if current == 0 {
            // The backlog already holds the due retries and delayed jobs.
            if obs.backlog >= u64::from(spec.activation_backlog.max(1).unsigned_abs()) {
                // Waking: straight to the computed size. The HPA has no say at zero (it is
                // inactive there), and a rate limit here only makes the first jobs wait.
                let recommendation = largest.max(1);
                let desired = recommendation.clamp(min.max(1), max.max(1));
                let limit = (desired < recommendation).then_some(Limit::MaxReplicas);
                // Remember the wake for the scale-down window.
                let _ =
                    self.normalizer
                        .normalize(&behavior, now, desired, recommendation, min, max);
                return decision(
                    desired,
                    Reason {
                        rule: Rule::Activation,
                        limit,
                        consecutive_failures: 0,
                        rate_cap: None,
                    },
                    recommendation,
                );
            }
            if min > 0 {
                let reason = Reason {
                    rule: Rule::BelowActivation,
                    limit: Some(Limit::MinReplicas),
                    consecutive_failures: 0,
                    rate_cap: None,
                };
                return decision(min, reason, 0);
            }
            return decision(0, Reason::of(Rule::BelowActivation), 0);
        }

        if min == 0
            && let Some(since) = self.idle_since
            && now - since >= f64::from(spec.idle_seconds_before_zero.max(0))
        {
            return decision(0, Reason::of(Rule::IdleToZero), 0);
        }

        // The HPA's own guard: a count outside [min, max] goes to the bound directly.
        if current > max {
            return decision(
                max,
                Reason {
                    rule,
                    limit: Some(Limit::MaxReplicas),
                    consecutive_failures: 0,
                    rate_cap: None,
                },
                largest,
            );
        }
        if current < min {
            return decision(
                min,
                Reason {
                    rule,
                    limit: Some(Limit::MinReplicas),
                    consecutive_failures: 0,
                    rate_cap: None,
                },
                largest,
            );
        }

        // Below one replica only through the idle rule above.
        let (recommendation, rule) = if largest < 1 {
            (1, Rule::AwaitingIdle)
        } else {
            (largest, rule)
        };
        let Normalized { desired, limit } =
            self.normalizer
                .normalize(&behavior, now, current, recommendation, min.max(1), max);
        decision(
            desired,
            Reason {
                rule,
                limit,
                consecutive_failures: 0,
                rate_cap: None,
            },
            recommendation,
        )
    }

    /// Every target's proposal, the largest, and which rule it belongs to.
    fn propose(
        &self,
        spec: &ScalingSpec,
        behavior: &Behavior,
        obs: &Observation,
    ) -> (Proposals, i32, Rule) {
        let current = obs.current_replicas.max(0);
        let tolerate = |raw: f64, ratio: f64| -> (i32, bool) {
            if current > 0 {
                let tolerance = if ratio >= 1.0 {
                    behavior.up.tolerance
                } else {
                    behavior.down.tolerance
                };
                if (1.0 - ratio).abs() <= tolerance {
                    return (current, true);
                }
            }
            (ceil(raw), false)
        };

        // AverageValue form: ratio = total / (target × current), on the work that will
        // still be there when a pod started now is ready.
        let target = f64::from(spec.target_backlog_per_replica.max(1));
        let work = self.work_left_at_readiness(obs);
        let backlog_raw = work / target;
        let (backlog, backlog_tol) = tolerate(backlog_raw, ratio(backlog_raw, current));
        let mut best = (
            backlog,
            if backlog_tol {
                Rule::WithinTolerance
            } else {
                Rule::BacklogTarget
            },
        );

        let drain = match (
            spec.target_drain_seconds,
            self.rates.arrival_rate(),
            self.rates.per_replica_throughput(),
        ) {
            (Some(seconds), Some(arrival), Some(throughput)) if throughput > 0.0 => {
                let raw = (arrival + obs.backlog as f64 / f64::from(seconds.max(1))) / throughput;
                let (proposal, tol) = tolerate(raw, ratio(raw, current));
                if proposal > best.0 {
                    best = (
                        proposal,
                        if tol {
                            Rule::WithinTolerance
                        } else {
                            Rule::DrainTarget
                        },
                    );
                }
                Some(proposal)
            }
            _ => None,
        };

        let wait = match (spec.target_wait_seconds, self.oldest_age(obs)) {
            (Some(seconds), Some(age)) => {
                // Value form, as the HPA computes it: ceil(ratio × ready) with the ratio
                // metric / target; at zero replicas ceil(ratio).
                let ratio = age / f64::from(seconds.max(1));
                let raw = if current > 0 {
                    ratio * f64::from(obs.ready_replicas.max(0))
                } else {
                    ratio
                };
                let (mut proposal, tol) = tolerate(raw, ratio);
                // With pods still starting, ready × ratio can point the other way from the
                // ratio itself; like the HPA with unready pods ("if the new ratio reverses
                // the scale direction ... the controller doesn't take any scaling action"),
                // such a proposal keeps the current count.
                let reversed =
                    (ratio > 1.0 && proposal < current) || (ratio < 1.0 && proposal > current);
                if current > 0 && reversed {
                    proposal = current;
                }
                if proposal > best.0 {
                    let rule = if tol {
                        Rule::WithinTolerance
                    } else {
                        Rule::WaitTarget
                    };
                    best = (proposal, rule);
                }
                Some(proposal)
            }
            _ => None,
        };
        (
            Proposals {
                backlog,
                drain,
                wait,
            },
            best.0,
            best.1,
        )
    }

    /// The jobs (waiting plus running) the backlog target sizes the pool for: those that
    /// will still be waiting or running when a pod started now becomes ready.
    ///
    /// A pod helps only with the work left once it is ready. Until then the ready pods
    /// keep working at their measured throughput while jobs keep arriving at the
    /// sustained rate (the median of the last minute, so a spike whose jobs are already
    /// in the backlog is not counted a second time as arrivals). A spike that the ready
    /// pods clear within one start-up time starts no pod; a larger one starts pods for
    /// what is left. Never more than today's backlog plus in-flight jobs: growing
    /// arrivals are the drain target's business. Until the start-up time and the
    /// throughput have been measured, this is the whole backlog plus in-flight jobs.
    fn work_left_at_readiness(&self, obs: &Observation) -> f64 {
        let work = obs.backlog.saturating_add(obs.in_flight) as f64;
        let (Some(arrival), Some(throughput), Some(startup)) = (
            self.rates.sustained_arrival_rate(),
            self.rates.per_replica_throughput(),
            self.startup.seconds(),
        ) else {
            return work;
        };
        let capacity = throughput * f64::from(obs.ready_replicas.max(0));
        (work + (arrival - capacity) * startup).clamp(0.0, work)
    }

    /// The oldest waiting job's age: measured when producers stamp it, else estimated by
    /// Little's law as backlog / completions per second.
    fn oldest_age(&self, obs: &Observation) -> Option<f64> {
        if let Some(age) = obs.oldest_job_age_seconds {
            return Some(age.max(0.0));
        }
        if obs.backlog == 0 {
            return Some(0.0);
        }
        match self.rates.completion_rate() {
            Some(rate) if rate > 0.0 => Some(obs.backlog as f64 / rate),
            _ => None,
        }
    }
}

fn ratio(raw: f64, current: i32) -> f64 {
    if current > 0 {
        raw / f64::from(current)
    } else {
        f64::INFINITY
    }
}

/// Rounds up, forgiving floating-point dust (5.000000001 is 5).
fn ceil(value: f64) -> i32 {
    to_i32((value - 1e-9).ceil()).max(0)
}

fn secs(at: Duration) -> f64 {
    at.as_secs_f64()
}

#[cfg(test)]
mod tests;
