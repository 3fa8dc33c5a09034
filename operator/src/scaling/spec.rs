//! The `scaling` section of a WorkerPool: its schema, its defaults and
//! its validation.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerBehavior;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Behavior, behavior};

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
    /// ceil((backlog + inFlight) / targetBacklogPerReplica), counting at least the
    /// worker's `concurrency` per worker. Defaults to 5, like KEDA's `listLength`.
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
    /// `minReplicas` is 0), kept exactly as written. Left out, the operator decides within
    /// 300 s (KEDA's `cooldownPeriod`): it keeps the last worker 300 s while this queue's
    /// work has lately come back within that time, and otherwise for one measured pod
    /// start-up time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub idle_seconds_before_zero: Option<i32>,

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
/// The longest the operator keeps an idle pool's last worker when
/// `idleSecondsBeforeZero` is left out: KEDA's `cooldownPeriod` default.
pub const DEFAULT_IDLE_SECONDS_BEFORE_ZERO: i32 = 300;
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
            idle_seconds_before_zero: None,
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
        if let Some(idle) = self.idle_seconds_before_zero
            && idle < 0
        {
            found.push(format!(
                "idleSecondsBeforeZero must be 0 or more, not {idle}"
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
    pub(super) fn bounds(&self) -> (i32, i32) {
        let min = self.min_replicas.max(0);
        (min, self.max_replicas.max(min))
    }
}
