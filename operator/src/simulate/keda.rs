//! How KEDA scales a Deployment on a Redis list, with its defaults or with the settings
//! its users change most.
//!
//! Two loops take turns:
//! - the KEDA operator polls the scaler every `pollingInterval` (30 s) and only moves
//!   between zero and one replica: it wakes the workload when the list is longer than
//!   `activationListLength` (0), and scales it to zero once the list has been empty for
//!   `cooldownPeriod` (300 s by default); with a `minReplicaCount` of 1 or more it never
//!   goes to zero;
//! - from one replica up, a HorizontalPodAutoscaler with the default 15 s sync period reads
//!   the list length as an external metric with an `AverageValue` target of `listLength`
//!   and applies the HPA's default behavior (scale up by max(4 pods, 100 %) per 15 s,
//!   scale down after a 300 s stabilization window, which
//!   `advanced.horizontalPodAutoscalerConfig.behavior` can shorten), between
//!   `max(1, minReplicaCount)` and `maxReplicaCount`.

use crate::scaling::{Behavior, Normalizer, Observation};

/// KEDA's `pollingInterval` default, in seconds.
const POLLING_INTERVAL: f64 = 30.0;
/// The HPA controller's `--horizontal-pod-autoscaler-sync-period` default, in seconds.
const HPA_SYNC_PERIOD: f64 = 15.0;
/// KEDA's `cooldownPeriod` default, in seconds.
pub const DEFAULT_COOLDOWN_SECONDS: u32 = 300;
/// The HPA's default scale-down stabilization window, in seconds.
pub const DEFAULT_SCALE_DOWN_WINDOW_SECONDS: u32 = 300;

/// The fields of a KEDA ScaledObject on a Redis list that the model reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KedaSettings {
    /// `listLength`: the per-replica target.
    pub list_length: u32,
    /// `minReplicaCount` (KEDA's default is 0).
    pub min_replicas: i32,
    /// `maxReplicaCount`.
    pub max_replicas: i32,
    /// `cooldownPeriod` in seconds: how long after the last poll that saw jobs KEDA
    /// scales to zero (only with `minReplicaCount: 0`).
    pub cooldown_seconds: u32,
    /// The HPA's `behavior.scaleDown.stabilizationWindowSeconds`, set through
    /// `advanced.horizontalPodAutoscalerConfig`.
    pub scale_down_window_seconds: u32,
}

impl KedaSettings {
    /// KEDA's defaults with this `listLength` and `maxReplicaCount`.
    pub fn defaults(list_length: u32, max_replicas: i32) -> Self {
        KedaSettings {
            list_length,
            min_replicas: 0,
            max_replicas,
            cooldown_seconds: DEFAULT_COOLDOWN_SECONDS,
            scale_down_window_seconds: DEFAULT_SCALE_DOWN_WINDOW_SECONDS,
        }
    }

    /// Whether these are KEDA's defaults (whatever the target and maximum).
    pub fn is_default(&self) -> bool {
        *self == Self::defaults(self.list_length, self.max_replicas)
    }

    /// A short description of what differs from KEDA's defaults: `defaults`,
    /// `min 1`, `min 0, cooldown 30s, scale-down window 30s` ...
    pub fn label(&self) -> String {
        if self.is_default() {
            return "defaults".into();
        }
        let mut parts = vec![format!("min {}", self.min_replicas)];
        if self.min_replicas == 0 {
            parts.push(format!("cooldown {}s", self.cooldown_seconds));
        }
        if self.scale_down_window_seconds != DEFAULT_SCALE_DOWN_WINDOW_SECONDS {
            parts.push(format!(
                "scale-down window {}s",
                self.scale_down_window_seconds
            ));
        }
        parts.join(", ")
    }
}

/// The state of KEDA's operator and of the HPA it creates.
#[derive(Clone, Debug)]
pub struct KedaModel {
    list_length: f64,
    min_replicas: i32,
    max_replicas: i32,
    cooldown: f64,
    behavior: Behavior,
    hpa: Normalizer,
    last_active: Option<f64>,
}

impl KedaModel {
    /// A ScaledObject on a Redis list with these settings.
    pub fn new(settings: &KedaSettings) -> Self {
        let min_replicas = settings.min_replicas.max(0);
        let mut behavior = Behavior::hpa_defaults();
        behavior.down.window = f64::from(settings.scale_down_window_seconds);
        KedaModel {
            list_length: f64::from(settings.list_length.max(1)),
            min_replicas,
            max_replicas: settings.max_replicas.max(min_replicas).max(1),
            cooldown: f64::from(settings.cooldown_seconds),
            behavior,
            hpa: Normalizer::default(),
            last_active: None,
        }
    }

    /// Seconds between the KEDA operator's polls (tick kind 0).
    pub fn polling_interval(&self) -> f64 {
        POLLING_INTERVAL
    }

    /// Seconds between HPA syncs (tick kind 1).
    pub fn hpa_sync_period(&self) -> f64 {
        HPA_SYNC_PERIOD
    }

    /// One tick of loop `kind` at `now`; the new replica count when it changes anything.
    pub fn tick(&mut self, kind: u8, now: f64, observation: &Observation) -> Option<i32> {
        let current = observation.current_replicas;
        let list_length = observation.backlog;
        if kind == 0 {
            // With minReplicaCount of 1 or more, KEDA leaves everything to the HPA.
            if self.min_replicas > 0 {
                return (current < self.min_replicas).then_some(self.min_replicas);
            }
            let active = list_length > 0;
            if active {
                self.last_active = Some(now);
            }
            if current == 0 && active {
                return Some(1);
            }
            let cooled = self.last_active.is_none_or(|t| now - t >= self.cooldown);
            if current > 0 && !active && cooled {
                return Some(0);
            }
            return None;
        }
        // The HPA does nothing at zero replicas ("ScalingDisabled").
        if current == 0 {
            return None;
        }
        if current > self.max_replicas {
            return Some(self.max_replicas);
        }
        if current < self.min_replicas {
            return Some(self.min_replicas);
        }
        // External metric, AverageValue target: usage ratio against the current count,
        // tolerance 0.1, then ceil(total / target).
        let total = list_length as f64;
        let ratio = total / (self.list_length * f64::from(current));
        let recommendation = if (1.0 - ratio).abs() <= crate::scaling::DEFAULT_TOLERANCE {
            current
        } else {
            (total / self.list_length).ceil() as i32
        };
        let desired = self
            .hpa
            .normalize(
                &self.behavior,
                now,
                current,
                recommendation,
                self.min_replicas.max(1),
                self.max_replicas,
            )
            .desired;
        if desired != current {
            self.hpa.record_scale(now, current, desired);
            Some(desired)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keda(min_replicas: i32) -> KedaModel {
        KedaModel::new(&KedaSettings {
            min_replicas,
            ..KedaSettings::defaults(5, 100)
        })
    }

    fn obs(backlog: u64, current: i32) -> Observation {
        Observation {
            backlog,
            current_replicas: current,
            ready_replicas: current,
            ..Observation::default()
        }
    }

    #[test]
    fn keda_wakes_to_one_and_the_hpa_climbs_four_pods_or_double_per_sync() {
        let mut keda = keda(0);
        assert_eq!(
            keda.tick(1, 0.0, &obs(2000, 0)),
            None,
            "the HPA is inactive at zero"
        );
        assert_eq!(keda.tick(0, 0.0, &obs(2000, 0)), Some(1));
        let mut current = 1;
        let mut steps = vec![];
        for sync in 1..=7 {
            if let Some(next) = keda.tick(1, f64::from(sync) * 15.0, &obs(2000, current)) {
                current = next;
            }
            steps.push(current);
        }
        assert_eq!(steps, [5, 10, 20, 40, 80, 100, 100]);
    }

    #[test]
    fn keda_holds_the_peak_for_the_stabilization_window_then_cools_down_to_zero() {
        let mut keda = keda(0);
        assert_eq!(keda.tick(0, 0.0, &obs(100, 0)), Some(1));
        assert_eq!(keda.tick(1, 15.0, &obs(100, 1)), Some(5));
        assert_eq!(keda.tick(1, 30.0, &obs(100, 5)), Some(10));
        // Drained at t = 45; the list stays empty.
        assert_eq!(keda.tick(0, 60.0, &obs(0, 10)), None);
        for t in (45..330).step_by(15) {
            assert_eq!(keda.tick(1, f64::from(t), &obs(0, 10)), None, "held at {t}");
        }
        assert_eq!(keda.tick(1, 330.0, &obs(0, 10)), Some(1));
        // The last poll that saw jobs was at t = 0: 330 s without any is past the cooldown.
        assert_eq!(keda.tick(0, 330.0, &obs(0, 1)), Some(0));
    }

    #[test]
    fn a_short_window_and_cooldown_release_the_pods_sooner() {
        let mut keda = KedaModel::new(&KedaSettings {
            cooldown_seconds: 30,
            scale_down_window_seconds: 30,
            ..KedaSettings::defaults(5, 100)
        });
        assert_eq!(keda.tick(0, 0.0, &obs(100, 0)), Some(1));
        assert_eq!(keda.tick(1, 15.0, &obs(100, 1)), Some(5));
        // Drained by t = 30: the window still holds the recommendation made at 15 s.
        assert_eq!(keda.tick(1, 30.0, &obs(0, 5)), None);
        assert_eq!(keda.tick(1, 45.0, &obs(0, 5)), Some(1));
        // The last poll that saw jobs was at 0: 30 s later KEDA may go to zero.
        assert_eq!(keda.tick(0, 30.0, &obs(0, 1)), Some(0));
    }

    #[test]
    fn settings_are_labelled_by_what_differs_from_the_defaults() {
        let defaults = KedaSettings::defaults(5, 100);
        assert_eq!(defaults.label(), "defaults");
        let tuned = KedaSettings {
            cooldown_seconds: 30,
            scale_down_window_seconds: 30,
            ..defaults
        };
        assert_eq!(tuned.label(), "min 0, cooldown 30s, scale-down window 30s");
        let warm = KedaSettings {
            min_replicas: 1,
            ..defaults
        };
        assert_eq!(warm.label(), "min 1");
    }

    #[test]
    fn with_a_minimum_of_one_keda_never_goes_to_zero() {
        let mut keda = keda(1);
        assert_eq!(keda.tick(0, 0.0, &obs(0, 0)), Some(1));
        for t in (30..2000).step_by(30) {
            assert_eq!(keda.tick(0, f64::from(t), &obs(0, 1)), None);
            assert_eq!(keda.tick(1, f64::from(t), &obs(0, 1)), None);
        }
    }
}
