//! The engine: one tick turns an observation into a decision.
//!
//! [`Engine::tick`] reads the queue's state into the estimators and calls the engine's
//! `decide`, which takes the decisions in one fixed order, each held by a file of its own
//! beside this one:
//! 1. [`observed`]: what the engine reads from an observation: whether the pool worked
//!    since the last poll, how long a job takes, the oldest job's age;
//! 2. [`targets`]: every target's proposal, sized on the work left when a pod started
//!    now is ready; the largest wins;
//! 3. [`release`]: surplus pods with nothing waiting go after one start-up, not the
//!    default scale-down window;
//! 4. [`wake`]: before any job was timed, a pool adds only the pods worth starting;
//! 5. [`rate_cap`]: no more workers than the queue's rate limit keeps busy;
//!    [`knee`]: no more than the knee, where completions stopped rising with the size
//!    (but for a probe above it now and then while work waits);
//! 6. [`release`]: the idle spell is timed and weighed into the idle hold;
//! 7. [`wake`]: a pool at zero wakes at `activationBacklog`, straight to its size;
//! 8. [`release`]: an idle pool goes to zero once its idle hold has passed;
//! 9. the HPA's bounds guard and its `behavior` ([`Normalizer`]) shape the rest.
//!
//! [`verdict`] holds what a tick answers, and the one way both actuators ask.

mod knee;
mod observed;
mod rate_cap;
mod release;
mod targets;
mod verdict;
mod wake;

use std::collections::VecDeque;
use std::time::Duration;

use crate::scaling::behavior::to_i32;
use crate::scaling::{
    Knee, Limit, Normalized, Normalizer, Observation, RateEstimator, Reason, Rule, ScalingSpec,
    StartupEstimator,
};

pub use rate_cap::Workers;
pub use targets::Proposals;
pub use verdict::{Decision, MANUAL_REPLICAS, Verdict, decide};

use verdict::Answer;

/// The scaling engine's state between ticks. One per pool.
#[derive(Clone, Debug, Default)]
pub struct Engine {
    normalizer: Normalizer,
    rates: RateEstimator,
    startup: StartupEstimator,
    consecutive_failures: u32,
    idle_since: Option<f64>,
    /// The lengths of the last idle spells that outlasted the short hold (see
    /// [`Engine::idle_hold`]), oldest first.
    idle_spells: VecDeque<f64>,
    /// `processed_total` at the last tick: jobs completed between two polls are work
    /// even when no poll saw them waiting or running.
    last_processed: Option<u64>,
    /// Since when the pool has had a ready pod (none at zero): before any job was
    /// timed, its jobs are known to take at least that long.
    ready_since: Option<f64>,
    workers: Workers,
    /// Where one more pod stops raising completions, once measured.
    knee: Knee,
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

    /// Takes `seconds` as the pool's pod start-up time until one is measured: what an
    /// earlier engine measured for the pool (the controller keeps it in the pool's
    /// status), so that an operator that restarted or took over the lead sizes new pods
    /// and the idle hold right from its first decision.
    pub fn seed_startup(&mut self, seconds: f64) {
        self.startup.seed(seconds);
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
        // The start-up time first: pods that are ready at this poll have told it, and it
        // depends on the replica counts only, not on the backlog.
        self.startup.observe(
            now_s,
            observation.current_replicas,
            observation.ready_replicas,
        );
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
        self.measure_knee(observation, now_s);
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
                idle_hold: None,
            },
            recommendation: proposed,
            proposals: Proposals::default(),
            arrival_rate: self.rates.arrival_rate(),
            per_replica_throughput: self.rates.per_replica_throughput(),
            pod_startup_seconds: self.startup.seconds(),
            saturation: self.saturation(),
        }
    }

    /// The decisions of one tick, in the order the module's header lists them.
    fn decide(&mut self, spec: &ScalingSpec, obs: &Observation, now: f64) -> Decision {
        let mut behavior = spec.resolved_behavior();
        let (min, max) = spec.bounds();
        let current = obs.current_replicas.max(0);
        let worked = self.worked(obs);
        let (proposals, largest, rule) = self.propose(spec, &behavior, obs, worked);
        if let Some(window) = self.idle_release_window(spec, obs, largest) {
            behavior.down.window = behavior.down.window.min(window);
        }
        self.note_readiness(obs, now);
        let largest = self.hold_while_blind(obs, now, largest);
        let busy_at_limit = self.busy_at_limit(obs);
        let cap = self.rate_cap(busy_at_limit, largest);
        let largest = cap.map_or(largest, |cap| cap.workers);
        let knee = self.knee_ceiling(obs, largest, now);
        let knee_capped = knee.is_some_and(|knee| largest > knee);
        let largest = knee.map_or(largest, |knee| largest.min(knee));
        let ceiling = match (busy_at_limit, knee) {
            (Some(limit), Some(knee)) => Some(limit.min(knee)),
            (limit, knee) => limit.or(knee),
        };
        let answer = Answer {
            proposals,
            cap,
            knee_capped,
            saturation: self.saturation(),
            arrival_rate: self.rates.arrival_rate(),
            per_replica_throughput: self.throughput(obs),
            pod_startup_seconds: self.startup.seconds(),
        };

        self.note_idleness(spec, worked, now);
        let hold = self.idle_hold(spec);

        if current == 0 {
            return self.wake(spec, &behavior, obs, now, largest, &answer);
        }

        if let Some(reason) = self.idle_to_zero(min, hold, now) {
            return answer.decision(0, reason, 0);
        }

        // The HPA's own guard: a count outside [min, max] goes to the bound directly.
        if current > max {
            return answer.decision(
                max,
                Reason {
                    limit: Some(Limit::MaxReplicas),
                    ..Reason::of(rule)
                },
                largest,
            );
        }
        if current < min {
            return answer.decision(
                min,
                Reason {
                    limit: Some(Limit::MinReplicas),
                    ..Reason::of(rule)
                },
                largest,
            );
        }

        let (recommendation, rule, idle_hold) = release::await_idle(largest, rule, min, hold);
        // The scale-down window does not hold the pool above what the rate limit keeps
        // busy, nor above the knee: those workers are known to be idle or only to
        // spread the waiting, not a noisy reading.
        let Normalized { desired, limit } = self.normalizer.normalize_under(
            &behavior,
            now,
            current,
            recommendation,
            min.max(1),
            max,
            ceiling,
        );
        answer.decision(
            desired,
            Reason {
                limit,
                idle_hold,
                ..Reason::of(rule)
            },
            recommendation,
        )
    }
}

/// Rounds up, forgiving floating-point dust (5.000000001 is 5).
fn ceil(value: f64) -> i32 {
    to_i32((value - 1e-9).ceil()).max(0)
}

fn secs(at: Duration) -> f64 {
    at.as_secs_f64()
}
