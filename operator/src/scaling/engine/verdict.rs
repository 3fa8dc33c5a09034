//! What a tick answers: the engine's [`Decision`], and the [`Verdict`] of [`decide`],
//! the one way the controller and local mode ask for a pool's size (scaled by the
//! engine, held or fallen back when the queue could not be read, or fixed by
//! `spec.replicas`).

use std::time::Duration;

use serde::Serialize;

use super::{Engine, Proposals};
use crate::scaling::{Limit, Observation, RateCap, Reason, Saturation, ScalingSpec};

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
    /// The knee, while the pool is saturated: completions stopped rising with its size
    /// (the pods past which one more adds little, the completions a second there, and
    /// what each pod above it added). What a `Saturated` condition would say.
    pub saturation: Option<Saturation>,
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

/// What every decision of one tick carries, whichever rule decides: the targets'
/// proposals, the rate cap, and the measures the tick sized on.
pub(super) struct Answer {
    pub(super) proposals: Proposals,
    pub(super) cap: Option<RateCap>,
    /// The knee lowered the proposal.
    pub(super) knee_capped: bool,
    pub(super) saturation: Option<Saturation>,
    pub(super) arrival_rate: Option<f64>,
    pub(super) per_replica_throughput: Option<f64>,
    pub(super) pod_startup_seconds: Option<f64>,
}

impl Answer {
    /// The decision for `desired` replicas, decided for `reason` on `recommendation`:
    /// a pool left at the recommendation the rate cap lowered says it was the limit.
    pub(super) fn decision(
        &self,
        desired: i32,
        mut reason: Reason,
        recommendation: i32,
    ) -> Decision {
        let cap = self.cap;
        if reason.limit.is_none() && cap.is_some() && desired == recommendation {
            reason.limit = Some(Limit::RateLimit);
        }
        if reason.limit == Some(Limit::RateLimit) {
            reason.rate_cap = cap;
        }
        if reason.limit.is_none() && self.knee_capped && desired == recommendation {
            reason.limit = Some(Limit::Saturated);
        }
        Decision {
            desired,
            reason,
            recommendation,
            proposals: self.proposals,
            arrival_rate: self.arrival_rate,
            per_replica_throughput: self.per_replica_throughput,
            pod_startup_seconds: self.pod_startup_seconds,
            saturation: self.saturation,
        }
    }
}
