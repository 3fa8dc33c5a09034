//! The engine: one tick turns an observation into a decision.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use workerpool_queue::rate::RateLimit;

use super::behavior::to_i32;
use super::spec::DEFAULT_IDLE_SECONDS_BEFORE_ZERO;
use super::{
    Behavior, HoldBasis, IdleHold, Limit, Normalized, Normalizer, Observation, RateCap,
    RateEstimator, Reason, Rule, ScalingSpec, StartupEstimator,
};

/// The idle spells [`Engine::idle_hold`] weighs: the last five that outlasted the short
/// hold.
const IDLE_SPELLS_REMEMBERED: usize = 5;

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
    /// `job_seconds` on average, with this standard `deviation` when the
    /// workers measured it: by Little's law `J = rate × job_seconds` jobs
    /// run at once at the limit, on average, and the count in flight varies
    /// around `J`. A pool sized for the mean alone would often have no free
    /// slot when the limit allows a start, and a start missed is lost; so
    /// the cap is `ceil((J + √(J·s)) / concurrency) + 1`, plus one for the
    /// estimate's error and the moment between a slot freeing and the next
    /// start. `None` without a limit.
    ///
    /// `s` is how much the count in flight varies, per job in flight. At
    /// the limit the bucket spaces the starts evenly (GCRA), so with
    /// durations `D` the count's variance is `rate × E|D₁ − D₂| / 2`
    /// (over the phase of the starts: `∫ P(D > t)·P(D ≤ t) dt` per start
    /// interval), that is `J` times the durations' Gini coefficient: 0 for
    /// jobs of a fixed length, ½ for exponential ones, never above 1. The
    /// workers keep the mean and the spread, not the Gini coefficient, so
    /// the bound `E|D₁ − D₂| ≤ σ√2` (Cauchy–Schwarz) gives
    /// `s = min(1, σ / (√2 · mean))`. Without a measured spread `s = 1`,
    /// the most any duration has (and Poisson starts' `√J`: the
    /// square-root staffing rule).
    pub fn busy_at_limit(&self, job_seconds: f64, deviation: Option<f64>) -> Option<i32> {
        let rate = self.rate_limit?.per_second();
        let seconds = job_seconds.max(0.0);
        let spread = match deviation {
            Some(d) if d.is_finite() && d >= 0.0 && seconds > 0.0 => {
                (d / (std::f64::consts::SQRT_2 * seconds)).min(1.0)
            }
            _ => 1.0,
        };
        let jobs = rate * seconds;
        let busy = (jobs + (jobs * spread).sqrt()) / f64::from(self.concurrency.max(1));
        Some(ceil(busy).saturating_add(1))
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
    /// Jobs per second one busy replica completes, once measured: the smoothed
    /// measure, or `concurrency / job seconds` when that is more.
    pub per_replica_throughput: Option<f64>,
    /// Seconds from a scale-up to its pods being ready, once measured (or seeded with
    /// [`Engine::seed_startup`]).
    pub pod_startup_seconds: Option<f64>,
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
        }
    }

    fn decide(&mut self, spec: &ScalingSpec, obs: &Observation, now: f64) -> Decision {
        let mut behavior = spec.resolved_behavior();
        let (min, max) = spec.bounds();
        let current = obs.current_replicas.max(0);
        // Work since the last poll: jobs waiting or running now, or completed since.
        let completed = self
            .last_processed
            .is_some_and(|last| last != obs.processed_total);
        self.last_processed = Some(obs.processed_total);
        let worked = obs.pending() || completed;
        let (proposals, mut largest, rule) = self.propose(spec, &behavior, obs, worked);
        if let Some(window) = self.idle_release_window(spec, obs, largest) {
            behavior.down.window = behavior.down.window.min(window);
        }
        if current == 0 || obs.ready_replicas <= 0 {
            self.ready_since = None;
        } else if self.ready_since.is_none() {
            self.ready_since = Some(now);
        }
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
        // More workers than the rate limit keeps busy would only wait for it. The cap
        // is sized on the longer of the two job durations the engine has: the workers'
        // measure kept in Redis, there from the first decision on (after a restart, a
        // leader change or an idle spell), and the engine's own Little's-law estimate
        // smoothed over a minute. A cap too low loses starts the limit allows, one too
        // high only keeps a worker waiting. Until either is known there is nothing to
        // size the cap on.
        let busy_at_limit = self
            .cap_job_seconds(obs)
            .and_then(|seconds| self.workers.busy_at_limit(seconds, self.job_deviation(obs)));
        let cap = busy_at_limit
            .filter(|cap| largest > *cap)
            .zip(self.workers.rate_limit)
            .map(|(workers, limit)| RateCap { limit, workers });
        let largest = cap.map_or(largest, |cap| cap.workers);
        let (arrival_rate, per_replica_throughput, pod_startup_seconds) = (
            self.rates.arrival_rate(),
            self.throughput(obs),
            self.startup.seconds(),
        );
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
                arrival_rate,
                per_replica_throughput,
                pod_startup_seconds,
            }
        };

        if worked {
            if let Some(since) = self.idle_since.take() {
                self.remember_idle_spell(spec, now - since);
            }
        } else if self.idle_since.is_none() {
            self.idle_since = Some(now);
        }
        let hold = self.idle_hold(spec);

        if current == 0 {
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
                let _ =
                    self.normalizer
                        .normalize(&behavior, now, desired, recommendation, min, max);
                return decision(
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
                return decision(min, reason, 0);
            }
            return decision(0, Reason::of(Rule::BelowActivation), 0);
        }

        if min == 0
            && let Some(since) = self.idle_since
            && now - since >= f64::from(hold.seconds)
        {
            return decision(
                0,
                Reason {
                    idle_hold: Some(hold),
                    ..Reason::of(Rule::IdleToZero)
                },
                0,
            );
        }

        // The HPA's own guard: a count outside [min, max] goes to the bound directly.
        if current > max {
            return decision(
                max,
                Reason {
                    limit: Some(Limit::MaxReplicas),
                    ..Reason::of(rule)
                },
                largest,
            );
        }
        if current < min {
            return decision(
                min,
                Reason {
                    limit: Some(Limit::MinReplicas),
                    ..Reason::of(rule)
                },
                largest,
            );
        }

        // Below one replica only through the idle rule above.
        let (recommendation, rule, idle_hold) = if largest < 1 {
            (1, Rule::AwaitingIdle, (min == 0).then_some(hold))
        } else {
            (largest, rule, None)
        };
        // The scale-down window does not hold the pool above what the rate limit keeps
        // busy: those workers are known to be idle, not a noisy reading.
        let Normalized { desired, limit } = self.normalizer.normalize_under(
            &behavior,
            now,
            current,
            recommendation,
            min.max(1),
            max,
            busy_at_limit,
        );
        decision(
            desired,
            Reason {
                limit,
                idle_hold,
                ..Reason::of(rule)
            },
            recommendation,
        )
    }

    /// How long the pool keeps its last worker with nothing queued, due or running
    /// before it goes to zero.
    ///
    /// `idleSecondsBeforeZero` as written, when it is. Left out, keeping the worker is a
    /// bet that work comes back before serving it would cost a new pod's start-up:
    /// - the engine remembers the last idle spells that outlasted one start-up time (the
    ///   short hold below) and how long they lasted. When at least two of them, and at
    ///   least half, ended with new work within [`DEFAULT_IDLE_SECONDS_BEFORE_ZERO`]
    ///   (300 s, the default `cooldownPeriod` of KEDA), the worker is kept that long: the
    ///   next job then finds it warm instead of waiting for a pod to start. One return
    ///   is not yet a pattern: a lone spike soon after a stray job would otherwise keep
    ///   its last pod 300 s;
    /// - otherwise (no such spell yet, or work lately came back later than that) the
    ///   worker is kept one measured start-up time, at least one poll. Whatever comes
    ///   next, that costs at most twice what the best choice made knowing the future
    ///   costs (the ski-rental rule, as for the scale-down window): work back within the
    ///   hold finds the worker, and later work pays one start-up, no more than the hold;
    /// - until the start-up time is measured, the full 300 s.
    pub fn idle_hold(&self, spec: &ScalingSpec) -> IdleHold {
        if let Some(written) = spec.idle_seconds_before_zero {
            return IdleHold {
                seconds: written.max(0),
                basis: HoldBasis::Written,
            };
        }
        let cap = DEFAULT_IDLE_SECONDS_BEFORE_ZERO;
        let Some(short) = self.one_start_up(spec) else {
            return IdleHold {
                seconds: cap,
                basis: HoldBasis::StartupUnknown,
            };
        };
        let returned = self
            .idle_spells
            .iter()
            .filter(|spell| **spell <= f64::from(cap))
            .count();
        if returned >= 2 && 2 * returned >= self.idle_spells.len() {
            IdleHold {
                seconds: cap,
                basis: HoldBasis::WorkReturns,
            }
        } else {
            IdleHold {
                seconds: ceil(short).min(cap),
                basis: HoldBasis::Startup,
            }
        }
    }

    /// One measured start-up time, at least one poll; `None` until measured: the
    /// ski-rental hold of idle pods, surplus or last.
    fn one_start_up(&self, spec: &ScalingSpec) -> Option<f64> {
        let startup = self.startup.seconds()?;
        Some(startup.max(f64::from(spec.poll_interval_seconds.max(1))))
    }

    /// Remembers an idle spell that ended with new work after `length` seconds, when it
    /// outlasted the short hold: shorter spells are served by either hold and say
    /// nothing about whether the longer one pays.
    fn remember_idle_spell(&mut self, spec: &ScalingSpec, length: f64) {
        let Some(short) = self.one_start_up(spec) else {
            return;
        };
        if length > short {
            self.idle_spells.push_back(length);
            while self.idle_spells.len() > IDLE_SPELLS_REMEMBERED {
                self.idle_spells.pop_front();
            }
        }
    }

    /// Every target's proposal, the largest, and which rule it belongs to.
    fn propose(
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
    fn work_left_at_readiness(&self, obs: &Observation) -> f64 {
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

    /// How long surplus pods are kept once nothing is waiting, when the engine's default
    /// scale-down window is in force (a window the user wrote is kept as written).
    ///
    /// The window guards against flapping on a noisy signal. With nothing waiting and the
    /// running jobs well within the recommended pods' slots, the pods above the
    /// recommendation are idle, not noise. "Well within" allows for the running count's
    /// own noise: with `r` jobs running, `r + √r` slots (the count in flight varies by
    /// about `√r`, as in the rate cap). While more run than that, the surplus pods are
    /// busy, or soon will be, and the full window stands; keeping one costs a replica per
    /// second, and letting it go costs, if work comes back, one start-up (the measured
    /// start-up time, during which a pod is paid for and does nothing). Keeping surplus
    /// pods exactly as long as one start-up takes (the ski-rental rule) never costs more
    /// than twice the best choice made knowing the future: if work returns within that
    /// time the pods were kept, and otherwise at most one start-up's worth was spent
    /// waiting for it. So the window shrinks to the measured start-up time (at least one
    /// poll), until the start-up time is measured it stays as it is.
    fn idle_release_window(
        &self,
        spec: &ScalingSpec,
        obs: &Observation,
        recommendation: i32,
    ) -> Option<f64> {
        let written = spec
            .behavior
            .as_ref()
            .and_then(|b| b.scale_down.as_ref())
            .and_then(|rules| rules.stabilization_window_seconds);
        let slots = u64::from(self.workers.concurrency.max(1).unsigned_abs());
        let kept = u64::from(recommendation.max(1).unsigned_abs());
        if written.is_some()
            || obs.backlog > 0
            || with_noise(obs.in_flight as f64) > kept.saturating_mul(slots) as f64
        {
            return None;
        }
        self.one_start_up(spec)
    }

    /// The most replicas worth running for `work` jobs left when a pod started now is
    /// ready: the ready ones, plus one new pod per start-up time of work. A pod is paid
    /// for from its creation; one that gets less work than its own start-up time spends
    /// most of what it costs starting. With `W` the work left in slot-seconds (jobs ×
    /// job seconds), `c` slots per pod and `s` the measured start-up time, that is
    /// `ready + W / (c × s)`. Known once the job duration and the start-up time are.
    fn replicas_worth_starting(&self, obs: &Observation, work: f64) -> Option<f64> {
        self.new_replicas_worth(obs, work)
            .map(|new| f64::from(obs.ready_replicas.max(0)) + new)
    }

    /// The new pods worth starting for `work` jobs left at readiness: `W / (c × s)`
    /// ([`Engine::replicas_worth_starting`]).
    fn new_replicas_worth(&self, obs: &Observation, work: f64) -> Option<f64> {
        let startup = self.startup.seconds().filter(|s| *s > 0.0)?;
        let seconds = self.job_seconds(obs)?;
        let slots = f64::from(self.workers.concurrency.max(1));
        Some(work * seconds / (slots * startup))
    }

    /// Jobs per second one busy replica completes: the measured throughput, or what
    /// its slots complete at the job duration (`concurrency / jobSeconds`) when that
    /// is more. The measure is taken over intervals that looked saturated (jobs waiting
    /// at both ends), which on a lightly loaded pool are mostly spells where the
    /// workers waited for jobs: it then reads the arrival rate, not the capacity, and
    /// a pool sized on it runs twice the pods it needs.
    fn throughput(&self, obs: &Observation) -> Option<f64> {
        let measured = self.rates.per_replica_throughput();
        let slots = f64::from(self.workers.concurrency.max(1));
        let physical = self.job_seconds(obs).map(|seconds| slots / seconds);
        match (measured, physical) {
            (Some(measured), Some(physical)) => Some(measured.max(physical)),
            (measured, _) => measured,
        }
    }

    /// Whether the engine cannot yet tell how much work the backlog holds: no job has
    /// been timed, by the engine or by the workers (the duration kept in Redis).
    fn blind(&self, obs: &Observation) -> bool {
        self.job_seconds(obs).is_none()
    }

    /// Seconds one job takes: the workers' own measure kept in Redis (every job timed),
    /// else the engine's estimate (Little's law on the polls' in-flight counts, smoothed
    /// over a minute), which a few polls' samples of a light load make coarse.
    fn job_seconds(&self, obs: &Observation) -> Option<f64> {
        obs.job_seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .or(self.rates.job_seconds())
            .filter(|s| s.is_finite() && *s > 0.0)
    }

    /// The standard deviation of the job durations, as the workers measured it, scaled
    /// to the duration the rate cap is sized on (the spread is the workers' measure's,
    /// and a longer estimate stretches it in proportion).
    fn job_deviation(&self, obs: &Observation) -> Option<f64> {
        let kept = obs.job_seconds.filter(|s| s.is_finite() && *s > 0.0)?;
        let deviation = obs
            .job_seconds_deviation
            .filter(|d| d.is_finite() && *d >= 0.0)?;
        let sized_on = self.cap_job_seconds(obs)?;
        Some(deviation * sized_on / kept)
    }

    /// The job duration the rate cap is sized on: the longer of the workers' measure
    /// and the engine's estimate.
    fn cap_job_seconds(&self, obs: &Observation) -> Option<f64> {
        let valid = |s: &f64| s.is_finite() && *s > 0.0;
        match (
            obs.job_seconds.filter(valid),
            self.rates.job_seconds().filter(valid),
        ) {
            (Some(kept), Some(estimated)) => Some(kept.max(estimated)),
            (kept, estimated) => kept.or(estimated),
        }
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

fn ratio(raw: f64, current: i32) -> f64 {
    if current > 0 {
        raw / f64::from(current)
    } else {
        f64::INFINITY
    }
}

/// Slots for `jobs` in flight on average, with room for their noise: the count in
/// flight varies by about `√jobs` around its mean (as in an M/G/∞ queue), so
/// `jobs + √jobs` (the square-root staffing rule).
fn with_noise(jobs: f64) -> f64 {
    let jobs = jobs.max(0.0);
    jobs + jobs.sqrt()
}

/// Rounds up, forgiving floating-point dust (5.000000001 is 5).
fn ceil(value: f64) -> i32 {
    to_i32((value - 1e-9).ceil()).max(0)
}

fn secs(at: Duration) -> f64 {
    at.as_secs_f64()
}
