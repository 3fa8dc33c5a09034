//! Waking: how a pool that cannot yet size itself from work grows. A pool at zero wakes
//! only at `activationBacklog` and then goes straight to the proposed size (capped by
//! the rate limit, as at any size); the HPA has no say at zero. Before any job of the
//! queue was timed the backlog says how many jobs there are, not how much work: a
//! blind wake starts `⌈√n⌉` of the `n` pods the backlog asks for, and a blind pool adds
//! only the pods worth starting for jobs as long as its pods have been ready. Once the
//! job duration and the start-up time are known, a pod is started only for a start-up
//! time of work.

use super::verdict::Answer;
use super::{Decision, Engine, ceil};
use crate::scaling::{Behavior, Limit, Observation, Reason, Rule, ScalingSpec};

impl Engine {
    /// Notes since when the pool has had a ready pod (none at zero).
    pub(super) fn note_readiness(&mut self, obs: &Observation, now: f64) {
        let current = obs.current_replicas.max(0);
        if current == 0 || obs.ready_replicas <= 0 {
            self.ready_since = None;
        } else if self.ready_since.is_none() {
            self.ready_since = Some(now);
        }
    }

    /// The proposal of `largest` replicas, held while no job has been timed.
    pub(super) fn hold_while_blind(&self, obs: &Observation, now: f64, mut largest: i32) -> i32 {
        let current = obs.current_replicas.max(0);
        // Before any job of the queue was timed, the backlog says how many jobs there
        // are, not how much work. While the pool's pods are still starting, pods added
        // now would be ready after them, when the job duration will be known: wait for
        // it rather than add pods sized on a backlog that only grows because nothing is
        // ready yet. Once pods are ready and no job has finished, the jobs take at least
        // as long as those pods have been ready: add only the pods worth starting for
        // jobs that long, a bound that grows at every poll until the first job ends.
        if self.blind(obs) && current > 0 {
            let at_least = self.ready_since.map_or(0.0, |since| now - since);
            let worth = self
                .startup
                .seconds()
                .filter(|s| *s > 0.0 && obs.ready_replicas > 0)
                .map(|startup| {
                    let slots = f64::from(self.workers.concurrency.max(1));
                    let work = self.work_left_at_readiness(obs);
                    f64::from(obs.ready_replicas) + work * at_least / (slots * startup)
                });
            let hold = match worth {
                Some(worth) => current.max(ceil(worth)),
                None if obs.ready_replicas <= 0 => current,
                None => largest,
            };
            largest = largest.min(hold);
        }
        largest
    }

    /// The decision for a pool at zero: it wakes at `activationBacklog`, and otherwise
    /// stays at zero (or goes to `minReplicas`).
    pub(super) fn wake(
        &mut self,
        spec: &ScalingSpec,
        behavior: &Behavior,
        obs: &Observation,
        now: f64,
        largest: i32,
        answer: &Answer,
    ) -> Decision {
        let (min, max) = spec.bounds();
        // The backlog already holds the due retries and delayed jobs.
        if obs.backlog >= u64::from(spec.activation_backlog.max(1).unsigned_abs()) {
            // Waking: straight to the computed size (capped by the rate limit, as
            // at any size). The HPA has no say at zero (it is inactive there).
            let computed = largest.max(1);
            let recommendation = if self.blind(obs) {
                blind_wake(computed)
            } else {
                computed
            };
            let desired = recommendation.clamp(min.max(1), max.max(1));
            let limit = if desired < recommendation {
                Some(Limit::MaxReplicas)
            } else if recommendation < computed && desired < computed {
                Some(Limit::UnknownJobDuration)
            } else {
                None
            };
            // Remember the wake for the scale-down window.
            let _ = self
                .normalizer
                .normalize(behavior, now, desired, recommendation, min, max);
            return answer.decision(
                desired,
                Reason {
                    limit,
                    ..Reason::of(Rule::Activation)
                },
                recommendation,
            );
        }
        if min > 0 {
            let reason = Reason {
                limit: Some(Limit::MinReplicas),
                ..Reason::of(Rule::BelowActivation)
            };
            return answer.decision(min, reason, 0);
        }
        answer.decision(0, Reason::of(Rule::BelowActivation), 0)
    }

    /// The most replicas worth running for `work` jobs left when a pod started now is
    /// ready: the ready ones, plus one new pod per start-up time of work. A pod is paid
    /// for from its creation; one that gets less work than its own start-up time spends
    /// most of what it costs starting. With `W` the work left in slot-seconds (jobs ×
    /// job seconds), `c` slots per pod and `s` the measured start-up time, that is
    /// `ready + W / (c × s)`. Known once the job duration and the start-up time are.
    pub(super) fn replicas_worth_starting(&self, obs: &Observation, work: f64) -> Option<f64> {
        self.new_replicas_worth(obs, work)
            .map(|new| f64::from(obs.ready_replicas.max(0)) + new)
    }

    /// The new pods worth starting for `work` jobs left at readiness: `W / (c × s)`
    /// ([`Engine::replicas_worth_starting`]).
    pub(super) fn new_replicas_worth(&self, obs: &Observation, work: f64) -> Option<f64> {
        let startup = self.startup.seconds().filter(|s| *s > 0.0)?;
        let seconds = self.job_seconds(obs)?;
        let slots = f64::from(self.workers.concurrency.max(1));
        Some(work * seconds / (slots * startup))
    }
}

/// The size of a wake that cannot be sized from work, for a computed size of `n`.
///
/// Without the job duration, the pods the backlog needs are anywhere between one
/// (short jobs: one pod clears it soon after it is ready) and `n` (jobs as long as
/// `targetBacklogPerReplica` assumes). Starting `w` pods is off by a factor of `w`
/// in the first case and `n / w` in the second; `w = ⌈√n⌉` keeps the worse of the
/// two at `√n`, the least any one choice can promise. Once the first pods are ready
/// the engine knows both the job duration and the start-up time, and starts the
/// rest that are worth starting.
fn blind_wake(n: i32) -> i32 {
    ceil(f64::from(n.max(1)).sqrt())
}
