//! The HPA v2 `behavior` semantics: stabilization windows, rate policies, `selectPolicy`.
//!
//! This follows the algorithm the Kubernetes documentation describes in
//! <https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#configurable-scaling-behavior>
//! and that the HPA controller implements (`normalizeDesiredReplicasWithBehaviors` in
//! `pkg/controller/podautoscaler/horizontal.go`): first the recommendation is stabilized
//! against the recent recommendations, then the scaling policies cap how far it may move
//! from the current count given the scale events of their periods, then min/max apply.

use k8s_openapi::api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior};

use super::Limit;

/// The HPA's cluster-wide default tolerance (`--horizontal-pod-autoscaler-tolerance`).
pub const DEFAULT_TOLERANCE: f64 = 0.1;

/// The longest `periodSeconds` the HPA API accepts; scale events older than this never count.
const MAX_PERIOD_SECONDS: f64 = 1800.0;

/// How the policies of one direction combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Select {
    /// The policy allowing the largest change wins (the HPA default).
    Max,
    /// The policy allowing the smallest change wins.
    Min,
    /// No scaling in this direction.
    Disabled,
}

/// One `HPAScalingPolicy`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// At most `value` pods added or removed within `period` seconds.
    Pods { value: i32, period: f64 },
    /// At most `value` percent of the pods at the start of the period, within `period` seconds.
    Percent { value: i32, period: f64 },
}

impl Policy {
    fn period(&self) -> f64 {
        match *self {
            Policy::Pods { period, .. } | Policy::Percent { period, .. } => period,
        }
    }
}

/// The resolved `HPAScalingRules` of one direction.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// `stabilizationWindowSeconds`.
    pub window: f64,
    /// `selectPolicy`.
    pub select: Select,
    /// `policies`; empty means no rate limit in this direction.
    pub policies: Vec<Policy>,
    /// `tolerance`.
    pub tolerance: f64,
}

/// Both directions, with every field resolved against a set of defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Behavior {
    /// `scaleUp`.
    pub up: Rules,
    /// `scaleDown`.
    pub down: Rules,
}

impl Behavior {
    /// The defaults of the Kubernetes HPA (`autoscaling/v2`): scale up by at most
    /// max(4 pods, 100 %) per 15 s without stabilization; scale down by up to 100 % per 15 s
    /// after a 300 s stabilization window.
    pub fn hpa_defaults() -> Self {
        Behavior {
            up: Rules {
                window: 0.0,
                select: Select::Max,
                policies: vec![
                    Policy::Percent {
                        value: 100,
                        period: 15.0,
                    },
                    Policy::Pods {
                        value: 4,
                        period: 15.0,
                    },
                ],
                tolerance: DEFAULT_TOLERANCE,
            },
            down: Rules {
                window: 300.0,
                select: Select::Max,
                policies: vec![Policy::Percent {
                    value: 100,
                    period: 15.0,
                }],
                tolerance: DEFAULT_TOLERANCE,
            },
        }
    }

    /// The engine's defaults, which depart from the HPA's where those hurt a queue:
    /// no scale-up rate limit (the backlog says exactly how many workers are needed, and
    /// climbing +4 pods per 15 s only makes jobs wait) and a 60 s scale-down window
    /// instead of 300 s (a drained queue does not need five minutes of idle workers;
    /// scale-down drains pods gracefully, so a wrong guess costs one pod start-up).
    pub fn engine_defaults() -> Self {
        let mut behavior = Self::hpa_defaults();
        behavior.up.policies.clear();
        behavior.down.window = DEFAULT_SCALE_DOWN_WINDOW_SECONDS as f64;
        behavior
    }

    /// Resolves what a user wrote on top of `defaults`: every field left out takes the
    /// default, as the API server's defaulting does for an HPA. Unknown policy types and
    /// `selectPolicy` values are ignored here and reported by [`problems`].
    pub fn resolve(written: Option<&HorizontalPodAutoscalerBehavior>, defaults: &Behavior) -> Self {
        let Some(written) = written else {
            return defaults.clone();
        };
        Behavior {
            up: resolve_rules(written.scale_up.as_ref(), &defaults.up),
            down: resolve_rules(written.scale_down.as_ref(), &defaults.down),
        }
    }
}

/// The engine's default scale-down stabilization window, in seconds.
pub const DEFAULT_SCALE_DOWN_WINDOW_SECONDS: i32 = 60;

fn resolve_rules(written: Option<&HPAScalingRules>, defaults: &Rules) -> Rules {
    let Some(written) = written else {
        return defaults.clone();
    };
    let policies = match &written.policies {
        Some(policies) => policies
            .iter()
            .filter_map(|p| {
                let period = f64::from(p.period_seconds.max(1));
                match p.type_.as_str() {
                    "Pods" => Some(Policy::Pods {
                        value: p.value.max(0),
                        period,
                    }),
                    "Percent" => Some(Policy::Percent {
                        value: p.value.max(0),
                        period,
                    }),
                    _ => None,
                }
            })
            .collect(),
        None => defaults.policies.clone(),
    };
    let select = match written.select_policy.as_deref() {
        Some("Min") => Select::Min,
        Some("Disabled") => Select::Disabled,
        Some("Max") => Select::Max,
        _ => defaults.select,
    };
    let window = written
        .stabilization_window_seconds
        .map_or(defaults.window, |w| f64::from(w.clamp(0, 3600)));
    let tolerance = written
        .tolerance
        .as_ref()
        .and_then(|q| parse_quantity(&q.0))
        .filter(|t| *t >= 0.0)
        .unwrap_or(defaults.tolerance);
    Rules {
        window,
        select,
        policies,
        tolerance,
    }
}

/// Parses the plain decimal forms of a Kubernetes quantity that a tolerance uses
/// (`0.05`, `50m`, `5e-2`).
pub fn parse_quantity(text: &str) -> Option<f64> {
    let text = text.trim();
    let value = match text.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().ok()? / 1000.0,
        None => text.parse::<f64>().ok()?,
    };
    value.is_finite().then_some(value)
}

/// What a user wrote that the HPA API would refuse, in words that say what to fix.
pub fn problems(written: &HorizontalPodAutoscalerBehavior) -> Vec<String> {
    let mut found = Vec::new();
    for (name, rules) in [
        ("scaleUp", &written.scale_up),
        ("scaleDown", &written.scale_down),
    ] {
        let Some(rules) = rules else { continue };
        if let Some(select) = &rules.select_policy
            && !matches!(select.as_str(), "Max" | "Min" | "Disabled")
        {
            found.push(format!(
                "behavior.{name}.selectPolicy must be Max, Min or Disabled, not {select:?}"
            ));
        }
        if let Some(window) = rules.stabilization_window_seconds
            && !(0..=3600).contains(&window)
        {
            found.push(format!(
                "behavior.{name}.stabilizationWindowSeconds must be within 0..=3600, not {window}"
            ));
        }
        for policy in rules.policies.iter().flatten() {
            if !matches!(policy.type_.as_str(), "Pods" | "Percent") {
                found.push(format!(
                    "behavior.{name}.policies[].type must be Pods or Percent, not {:?}",
                    policy.type_
                ));
            }
            if policy.value <= 0 {
                found.push(format!(
                    "behavior.{name}.policies[].value must be positive, not {}",
                    policy.value
                ));
            }
            if !(1..=1800).contains(&policy.period_seconds) {
                found.push(format!(
                    "behavior.{name}.policies[].periodSeconds must be within 1..=1800, not {}",
                    policy.period_seconds
                ));
            }
        }
        if let Some(tolerance) = &rules.tolerance
            && parse_quantity(&tolerance.0).is_none_or(|t| t < 0.0)
        {
            found.push(format!(
                "behavior.{name}.tolerance must be a non-negative quantity, not {:?}",
                tolerance.0
            ));
        }
    }
    found
}

/// The state the HPA keeps per target between syncs: past recommendations (for the
/// stabilization windows) and past scale events (for the policies' periods).
#[derive(Clone, Debug, Default)]
pub struct Normalizer {
    recommendations: Vec<(f64, i32)>,
    scale_up_events: Vec<(f64, i32)>,
    scale_down_events: Vec<(f64, i32)>,
}

/// The result of one normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Normalized {
    /// The replica count to apply.
    pub desired: i32,
    /// What held the recommendation back, if anything did.
    pub limit: Option<Limit>,
}

impl Normalizer {
    /// Applies stabilization, rate policies and `[min, max]` to `recommendation` at time
    /// `now` (seconds), with `current` replicas running, and records the recommendation.
    /// Call [`Normalizer::record_scale`] when the result is applied.
    pub fn normalize(
        &mut self,
        behavior: &Behavior,
        now: f64,
        current: i32,
        recommendation: i32,
        min: i32,
        max: i32,
    ) -> Normalized {
        self.normalize_under(behavior, now, current, recommendation, min, max, None)
    }

    /// [`Normalizer::normalize`], with a `ceiling` that the scale-down window
    /// does not hold the count above: earlier, higher recommendations keep
    /// the pool up against a noisy signal, but not above a count that is
    /// known to be idle (the workers a rate limit keeps busy). The rate
    /// policies still pace the way down.
    #[allow(clippy::too_many_arguments)]
    pub fn normalize_under(
        &mut self,
        behavior: &Behavior,
        now: f64,
        current: i32,
        recommendation: i32,
        min: i32,
        max: i32,
        ceiling: Option<i32>,
    ) -> Normalized {
        // A freshly started autoscaler must not scale down at once: it behaves as if the
        // current count had been recommended just now (HPA's
        // maybeInitScaleDownStabilizationWindow).
        if self.recommendations.is_empty() && behavior.down.window > 0.0 {
            self.recommendations.push((now, current));
        }
        let mut stabilized = self.stabilize(behavior, now, current, recommendation);
        if let Some(ceiling) = ceiling {
            stabilized = stabilized.min(ceiling.max(recommendation));
        }
        let mut limit = None;
        if stabilized != recommendation {
            limit = Some(if recommendation >= current {
                Limit::ScaleUpStabilized
            } else {
                Limit::ScaleDownStabilized
            });
        }
        let (desired, rate_limit) = self.apply_rate(behavior, now, current, stabilized, min, max);
        Normalized {
            desired,
            limit: rate_limit.or(limit),
        }
    }

    /// Records that the count moved from `from` to `to` at `now`, for the policies.
    pub fn record_scale(&mut self, now: f64, from: i32, to: i32) {
        if to > from {
            self.scale_up_events.push((now, to - from));
        } else if to < from {
            self.scale_down_events.push((now, from - to));
        }
    }

    /// The largest recommendation made after `now - window` (None when there is none).
    pub fn highest_recommendation_since(&self, cutoff: f64) -> Option<i32> {
        self.recommendations
            .iter()
            .filter(|(t, _)| *t > cutoff)
            .map(|(_, r)| *r)
            .max()
    }

    fn stabilize(
        &mut self,
        behavior: &Behavior,
        now: f64,
        current: i32,
        recommendation: i32,
    ) -> i32 {
        let up_cutoff = now - behavior.up.window;
        let down_cutoff = now - behavior.down.window;
        let mut up = recommendation;
        let mut down = recommendation;
        for &(t, rec) in &self.recommendations {
            // The HPA compares with `After(cutoff)`: a recommendation exactly one window
            // old no longer counts.
            if t > up_cutoff {
                up = up.min(rec);
            }
            if t > down_cutoff {
                down = down.max(rec);
            }
        }
        let oldest_needed = now - behavior.up.window.max(behavior.down.window);
        self.recommendations.retain(|(t, _)| *t > oldest_needed);
        self.recommendations.push((now, recommendation));
        current.max(up).min(down)
    }

    fn apply_rate(
        &mut self,
        behavior: &Behavior,
        now: f64,
        current: i32,
        desired: i32,
        min: i32,
        max: i32,
    ) -> (i32, Option<Limit>) {
        self.scale_up_events
            .retain(|(t, _)| *t > now - MAX_PERIOD_SECONDS);
        self.scale_down_events
            .retain(|(t, _)| *t > now - MAX_PERIOD_SECONDS);
        if desired > current {
            let rate_cap = self.scale_up_limit(&behavior.up, now, current).max(current);
            let (cap, limit) = if rate_cap < max {
                (rate_cap, Limit::ScaleUpLimit)
            } else {
                (max, Limit::MaxReplicas)
            };
            if desired > cap {
                return (cap, Some(limit));
            }
        } else if desired < current {
            let rate_floor = self
                .scale_down_limit(&behavior.down, now, current)
                .min(current);
            let (floor, limit) = if rate_floor > min {
                (rate_floor, Limit::ScaleDownLimit)
            } else {
                (min, Limit::MinReplicas)
            };
            if desired < floor {
                return (floor, Some(limit));
            }
        }
        (desired, None)
    }

    /// The replicas at the start of `period`: undo the changes made within it.
    fn period_start(&self, now: f64, current: i32, period: f64) -> i32 {
        let within = |events: &[(f64, i32)]| -> i32 {
            events
                .iter()
                .filter(|(t, _)| *t > now - period)
                .map(|(_, n)| *n)
                .sum()
        };
        current - within(&self.scale_up_events) + within(&self.scale_down_events)
    }

    fn scale_up_limit(&self, rules: &Rules, now: f64, current: i32) -> i32 {
        if rules.select == Select::Disabled {
            return current;
        }
        let proposals = rules.policies.iter().map(|policy| {
            let start = self.period_start(now, current, policy.period());
            match *policy {
                Policy::Pods { value, .. } => start.saturating_add(value),
                // Rounded up: a small pool must be able to grow at all.
                Policy::Percent { value, .. } => {
                    to_i32((f64::from(start) * (1.0 + f64::from(value) / 100.0)).ceil())
                }
            }
        });
        let chosen = match rules.select {
            Select::Min => proposals.min(),
            _ => proposals.max(),
        };
        chosen.unwrap_or(i32::MAX)
    }

    fn scale_down_limit(&self, rules: &Rules, now: f64, current: i32) -> i32 {
        if rules.select == Select::Disabled {
            return current;
        }
        let proposals = rules.policies.iter().map(|policy| {
            let start = self.period_start(now, current, policy.period());
            match *policy {
                Policy::Pods { value, .. } => start.saturating_sub(value),
                // Truncated, as the HPA does: 10 % of 72 removes 8, not 7.
                Policy::Percent { value, .. } => {
                    to_i32(f64::from(start) * (1.0 - f64::from(value) / 100.0))
                }
            }
        });
        // For scale-down the smallest change is the highest floor.
        let chosen = match rules.select {
            Select::Min => proposals.max(),
            _ => proposals.min(),
        };
        chosen.unwrap_or(i32::MIN)
    }
}

/// Converts a finite replica computation to i32, saturating.
pub(crate) fn to_i32(value: f64) -> i32 {
    if value.is_nan() {
        0
    } else {
        // `as` saturates at the bounds for floats.
        value as i32
    }
}
