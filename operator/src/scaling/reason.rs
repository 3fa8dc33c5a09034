//! Why the engine decided what it did: the rules, the limits and the
//! reason vocabulary that status, events and logs share.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workerpool_queue::rate::RateLimit;

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
    /// for its hold (`idleSecondsBeforeZero`, or the operator's choice when it is left
    /// out), or while work is pending.
    AwaitingIdle,
    /// Idle for its hold: scaled to zero.
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
    /// The knee: completions stopped rising with the pool's size (something the jobs
    /// share is saturated), so more workers would only spread the waiting.
    Saturated,
    /// Waking before any job of the queue was timed: the square root of the computed
    /// size, until the first pods tell how long a job takes.
    UnknownJobDuration,
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

/// How long an idle pool keeps its last worker, and why that long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleHold {
    /// Seconds with nothing queued, due or running before the pool goes to zero.
    pub seconds: i32,
    /// Where the figure comes from.
    pub basis: HoldBasis,
}

/// Where an idle hold comes from (see `Engine::idle_hold`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HoldBasis {
    /// `idleSecondsBeforeZero`, as written.
    Written,
    /// Left out, and the queue's work has lately come back within 300 s of going idle.
    WorkReturns,
    /// Left out, and work has not lately come back within 300 s: one pod start-up.
    Startup,
    /// Left out, before any pod start-up was timed: 300 s.
    StartupUnknown,
}

impl IdleHold {
    /// The hold in words: "300 s (idleSecondsBeforeZero)".
    pub fn describe(&self) -> String {
        let why = match self.basis {
            HoldBasis::Written => "idleSecondsBeforeZero",
            HoldBasis::WorkReturns => "work has lately come back within 300 s of going idle",
            HoldBasis::Startup => {
                "one pod start-up: work has not lately come back within 300 s of going idle"
            }
            HoldBasis::StartupUnknown => "no pod start-up timed yet",
        };
        format!("{} s ({why})", self.seconds)
    }
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
    /// With the rules `AwaitingIdle` and `IdleToZero`: the idle hold in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub idle_hold: Option<IdleHold>,
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
            Limit::Saturated => "Saturated",
            Limit::UnknownJobDuration => "UnknownJobDuration",
        }
    }
}

impl Reason {
    pub(super) fn of(rule: Rule) -> Self {
        Reason {
            rule,
            limit: None,
            consecutive_failures: 0,
            rate_cap: None,
            idle_hold: None,
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
            Rule::AwaitingIdle => match self.idle_hold {
                Some(hold) => format!(
                    "no work to size for; keeping a replica until the pool has been idle {}",
                    hold.describe()
                ),
                None => "no work to size for; keeping a replica".to_string(),
            },
            Rule::IdleToZero => match self.idle_hold {
                Some(hold) => format!("idle for {}; scaling to zero", hold.describe()),
                None => "idle; scaling to zero".to_string(),
            },
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
            Some(Limit::Saturated) => {
                "capped at the knee: more pods than it have not been seen to raise completions (something the jobs share is saturated; the Saturated condition says whether probes above it still pay)"
            }
            Some(Limit::UnknownJobDuration) => {
                "no job of this queue has been timed yet: starting the square root of the computed size until the first pods tell how long a job takes"
            }
        };
        format!("{rule}, {limit}")
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code(), self.message())
    }
}

/// A measured knee, as the pool's status shows it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Saturation {
    /// Pods past which one more adds little.
    pub knee: i32,
    /// Completions a second measured while saturated.
    pub rate: f64,
    /// Pods the pool had when it was measured.
    pub measured_at: i32,
    /// What each pod above the knee added, as a share of the knee's rate (0.004:
    /// 0.4 % more per pod added).
    pub marginal: f64,
    /// When it was last confirmed (seconds on the engine's clock).
    pub confirmed_at: f64,
    /// The last probe above the knee paid (its pods completed more), so the pool
    /// climbs a quarter a step; false once a deficit shows the new edge.
    pub climbing: bool,
}

impl Saturation {
    /// "completions flat at ~180 jobs/s above 12 pods (0.4 % more per pod added)",
    /// or, while probes pay, "completions rose to ~240 jobs/s at 16 pods ...".
    pub fn message(&self) -> String {
        if self.climbing {
            return format!(
                "completions rose to ~{} jobs/s at {} pod{} when probed above the old knee: the downstream takes more, so the pool climbs above {} pods a quarter at a time while each step pays",
                shown_rate(self.rate),
                self.measured_at,
                if self.measured_at == 1 { "" } else { "s" },
                self.knee,
            );
        }
        format!(
            "completions flat at ~{} jobs/s above {} pod{} ({:.1} % more per pod added, measured at {} pods)",
            shown_rate(self.rate),
            self.knee,
            if self.knee == 1 { "" } else { "s" },
            100.0 * self.marginal.max(0.0),
            self.measured_at
        )
    }
}

fn shown_rate(rate: f64) -> String {
    if rate >= 10.0 {
        format!("{rate:.0}")
    } else {
        format!("{rate:.2}")
    }
}
