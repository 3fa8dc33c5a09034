//! The targets: every configured target proposes a replica count, each with the HPA's
//! tolerance, and the largest proposal wins. The backlog target always, on the work
//! that will still be there when a pod started now is ready (a pod helps only with
//! that); the drain target once per-replica throughput is known; the wait target when
//! set. The backlog target, and the drain target's share for the backlog, start no
//! more new pods than that work keeps busy for one start-up (the pods worth starting,
//! in `wake.rs`).

use serde::{Deserialize, Serialize};

use super::{Engine, ceil};
use crate::scaling::{Behavior, Observation, Rule, ScalingSpec};

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

impl Engine {
    /// Every target's proposal, the largest, and which rule it belongs to.
    pub(super) fn propose(
        &self,
        spec: &ScalingSpec,
        behavior: &Behavior,
        obs: &Observation,
        worked: bool,
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
        // A pod runs `concurrency` jobs at once: a target below that counts a pod's own
        // running jobs as reasons for more pods, and keeps every pod partly idle.
        let target = f64::from(
            spec.target_backlog_per_replica
                .max(self.workers.concurrency)
                .max(1),
        );
        let work = self.work_left_at_readiness(obs);
        let mut backlog_raw = work / target;
        if let Some(worth) = self.replicas_worth_starting(obs, work) {
            backlog_raw = backlog_raw.min(worth);
        }
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
            self.throughput(obs),
        ) {
            (Some(seconds), Some(arrival), Some(throughput)) if throughput > 0.0 => {
                // The smoothed arrival rate trails a burst by its time constant. A poll
                // that finds nothing waiting or running, and nothing completed since the
                // poll before, shows that no job is arriving now: no pods for arrivals
                // (else a drained burst would keep its pods busy with nothing).
                let arrival = if worked { arrival } else { 0.0 };
                // Arrivals need their pods; the backlog's share, only the new pods that
                // will find a start-up time of work when they are ready.
                let mut catch_up = obs.backlog as f64 / f64::from(seconds.max(1)) / throughput;
                if let Some(worth) = self.new_replicas_worth(obs, work) {
                    catch_up = catch_up.min(worth);
                }
                let raw = arrival / throughput + catch_up;
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
    pub(super) fn work_left_at_readiness(&self, obs: &Observation) -> f64 {
        let work = obs.backlog.saturating_add(obs.in_flight) as f64;
        let (Some(arrival), Some(throughput), Some(startup)) = (
            self.rates.sustained_arrival_rate(),
            self.throughput(obs),
            self.startup.seconds(),
        ) else {
            return work;
        };
        let capacity = throughput * f64::from(obs.ready_replicas.max(0));
        (work + (arrival - capacity) * startup).clamp(0.0, work)
    }

    /// Jobs per second one busy replica completes: the measured throughput, or what
    /// its slots complete at the job duration (`concurrency / jobSeconds`) when that
    /// is more. The measure is taken over intervals that looked saturated (jobs waiting
    /// at both ends), which on a lightly loaded pool are mostly spells where the
    /// workers waited for jobs: it then reads the arrival rate, not the capacity, and
    /// a pool sized on it runs twice the pods it needs.
    pub(super) fn throughput(&self, obs: &Observation) -> Option<f64> {
        let measured = self.rates.per_replica_throughput();
        let slots = f64::from(self.workers.concurrency.max(1));
        let physical = self.job_seconds(obs).map(|seconds| slots / seconds);
        match (measured, physical) {
            (Some(measured), Some(physical)) => Some(measured.max(physical)),
            (measured, _) => measured,
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
