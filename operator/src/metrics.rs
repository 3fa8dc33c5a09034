//! Prometheus metrics of the operator.

use std::time::Duration;

use prometheus::{GaugeVec, HistogramVec, IntCounterVec, IntGaugeVec, Registry};
use workerpool_queue::snapshot::Snapshot;
use workerpool_settings::metrics::{Kind, Label, Metric, Section};

/// Every metric the operator exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Reconciles by result (`ok` or the failed operation).
    pub reconciles: IntCounterVec,
    /// Failed reconciles by operation.
    pub reconcile_errors: IntCounterVec,
    /// Reconcile duration.
    pub reconcile_duration: HistogramVec,
    /// Backlog per pool.
    pub backlog: IntGaugeVec,
    /// Jobs in flight per pool.
    pub in_flight: IntGaugeVec,
    /// Desired replicas per pool.
    pub desired: IntGaugeVec,
    /// Ready replicas per pool (the Deployment's status).
    pub ready: IntGaugeVec,
    /// The most replicas the pool may scale to (scaled pools only).
    pub max: IntGaugeVec,
    /// Age of the oldest waiting job per pool.
    pub oldest_job_age: GaugeVec,
    /// Dead letters kept per pool (the dead lists' length).
    pub dead_letters: IntGaugeVec,
    /// Replica changes applied, per pool and direction.
    pub scale_events: IntCounterVec,
    /// Whether the pool's last queue read succeeded.
    pub queue_up: IntGaugeVec,
    /// 1 when the pool's Redis does not evict keys (`noeviction`), 0 when
    /// it may delete them or its policy cannot be read.
    pub queue_safe: IntGaugeVec,
    /// Keys the pool's Redis has evicted since it started.
    pub evicted_keys: IntGaugeVec,
    /// Pods marked as not to be disrupted while their workers hold long jobs.
    pub protected_pods: IntGaugeVec,
    /// Patches of those marks, per pool and change (protect or release).
    pub protection_patches: IntCounterVec,
    /// 1 while the pool's object does not read as a WorkerPool, so that it
    /// is skipped; no series for a pool that reads.
    pub unreadable: IntGaugeVec,
    /// 1 while the engine holds the pool at its knee.
    pub saturated: IntGaugeVec,
    /// The knee's workers, while saturated.
    pub knee_replicas: IntGaugeVec,
    /// Completions a second at the knee, while saturated.
    pub knee_rate: GaugeVec,
}

/// A pool's replica counts as one reconcile saw and decided them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    /// What the pool should run.
    pub desired: i32,
    /// Pods ready.
    pub ready: i32,
    /// The upper bound of a scaled pool; `None` for a fixed size.
    pub max: Option<i32>,
}

/// Every metric the operator exports, as data: [`Metrics::new`] builds its
/// collectors from these, and `docs/metrics.md` is rendered from them.
pub const CATALOGUE: &[Metric] = &[
    RECONCILES,
    RECONCILE_ERRORS,
    RECONCILE_DURATION,
    BACKLOG,
    IN_FLIGHT,
    DESIRED,
    READY,
    MAX,
    OLDEST_JOB_AGE,
    DEAD_LETTERS,
    SCALE_EVENTS,
    PROTECTED_PODS,
    PROTECTION_PATCHES,
    QUEUE_UP,
    QUEUE_SAFE,
    EVICTED_KEYS,
    UNREADABLE,
    SATURATED,
    KNEE_REPLICAS,
    KNEE_RATE,
];

/// The operator's part of `docs/metrics.md`.
pub const SECTION: Section = Section {
    title: "Operator",
    intro: "`workerpool-operator run` serves these on `/metrics` (`--listen`); the chart's \
            ServiceMonitor scrapes them. A pool's series go when the pool is deleted.",
    metrics: CATALOGUE,
};

const NAMESPACE: Label = Label {
    name: "namespace",
    values: "the WorkerPool's namespace",
};
const POOL: Label = Label {
    name: "pool",
    values: "the WorkerPool's name",
};

const RECONCILES: Metric = Metric {
    name: "workerpool_operator_reconciles_total",
    kind: Kind::Counter,
    help: "Reconciles by result",
    labels: &[Label {
        name: "result",
        values: "`ok`, or the operation that failed (as in `operation` below)",
    }],
};

const RECONCILE_ERRORS: Metric = Metric {
    name: "workerpool_operator_reconcile_errors_total",
    kind: Kind::Counter,
    help: "Failed reconciles by operation",
    labels: &[Label {
        name: "operation",
        values: "`get_deployment`, `apply_deployment`, `patch_status`, `list_pods`, \
                 `patch_pod`, `get_budget`, `write_budget`, `invalid_spec`",
    }],
};

const RECONCILE_DURATION: Metric = Metric {
    name: "workerpool_operator_reconcile_duration_seconds",
    kind: Kind::Histogram,
    help: "Reconcile duration",
    labels: &[],
};

const BACKLOG: Metric = Metric {
    name: "workerpool_pool_backlog",
    kind: Kind::Gauge,
    help: "Jobs waiting per pool",
    labels: &[NAMESPACE, POOL],
};

const IN_FLIGHT: Metric = Metric {
    name: "workerpool_pool_in_flight",
    kind: Kind::Gauge,
    help: "Jobs running per pool",
    labels: &[NAMESPACE, POOL],
};

const DESIRED: Metric = Metric {
    name: "workerpool_pool_desired_replicas",
    kind: Kind::Gauge,
    help: "Desired workers per pool",
    labels: &[NAMESPACE, POOL],
};

const READY: Metric = Metric {
    name: "workerpool_pool_ready_replicas",
    kind: Kind::Gauge,
    help: "Ready workers per pool",
    labels: &[NAMESPACE, POOL],
};

const MAX: Metric = Metric {
    name: "workerpool_pool_max_replicas",
    kind: Kind::Gauge,
    help: "The most workers a scaled pool may run (spec.scaling.maxReplicas)",
    labels: &[NAMESPACE, POOL],
};

const SATURATED: Metric = Metric {
    name: "workerpool_pool_saturated",
    kind: Kind::Gauge,
    help: "1 while the scaling engine holds a pool at its knee: more workers stopped raising its completions",
    labels: &[NAMESPACE, POOL],
};

const KNEE_REPLICAS: Metric = Metric {
    name: "workerpool_pool_knee_replicas",
    kind: Kind::Gauge,
    help: "Workers past which one more stopped raising a saturated pool's completions (absent unless saturated)",
    labels: &[NAMESPACE, POOL],
};

const KNEE_RATE: Metric = Metric {
    name: "workerpool_pool_knee_completions_per_second",
    kind: Kind::Gauge,
    help: "Jobs a second a saturated pool completes at its knee (absent unless saturated)",
    labels: &[NAMESPACE, POOL],
};

const OLDEST_JOB_AGE: Metric = Metric {
    name: "workerpool_pool_oldest_job_age_seconds",
    kind: Kind::Gauge,
    help: "Age of the oldest waiting job per pool (0 when none waits)",
    labels: &[NAMESPACE, POOL],
};

const DEAD_LETTERS: Metric = Metric {
    name: "workerpool_pool_dead_letters",
    kind: Kind::Gauge,
    help: "Dead letters kept per pool",
    labels: &[NAMESPACE, POOL],
};

const SCALE_EVENTS: Metric = Metric {
    name: "workerpool_pool_scale_events_total",
    kind: Kind::Counter,
    help: "Replica changes applied per pool, by direction (up or down)",
    labels: &[
        NAMESPACE,
        POOL,
        Label {
            name: "direction",
            values: "`up`, `down`",
        },
    ],
};

const PROTECTED_PODS: Metric = Metric {
    name: "workerpool_pool_protected_pods",
    kind: Kind::Gauge,
    help: "Pods marked as not to be disrupted by node autoscalers while their workers hold long jobs (spec.disruption.protectBusyPods)",
    labels: &[NAMESPACE, POOL],
};

const PROTECTION_PATCHES: Metric = Metric {
    name: "workerpool_pool_protection_patches_total",
    kind: Kind::Counter,
    help: "Patches of the pods' disruption marks per pool, by change (protect or release)",
    labels: &[
        NAMESPACE,
        POOL,
        Label {
            name: "change",
            values: "`protect`, `release`",
        },
    ],
};

const QUEUE_UP: Metric = Metric {
    name: "workerpool_pool_queue_up",
    kind: Kind::Gauge,
    help: "1 when the pool's last queue read succeeded, 0 when it failed",
    labels: &[NAMESPACE, POOL],
};

const QUEUE_SAFE: Metric = Metric {
    name: "workerpool_pool_queue_safe",
    kind: Kind::Gauge,
    help: "1 when the pool's Redis does not evict keys (maxmemory-policy noeviction), 0 when it may delete jobs or its policy cannot be read",
    labels: &[NAMESPACE, POOL],
};

const EVICTED_KEYS: Metric = Metric {
    name: "workerpool_pool_redis_evicted_keys",
    kind: Kind::Gauge,
    help: "Keys the pool's Redis has evicted since it started (INFO evicted_keys)",
    labels: &[NAMESPACE, POOL],
};

const UNREADABLE: Metric = Metric {
    name: "workerpool_pool_unreadable",
    kind: Kind::Gauge,
    help: "1 while the pool's object does not read as a WorkerPool (a field past what it holds): the operator skips it, and its Ready condition names the field",
    labels: &[NAMESPACE, POOL],
};

impl Metrics {
    /// Creates and registers the metrics, each from its entry in
    /// [`CATALOGUE`].
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::new(),
            reconciles: RECONCILES.int_counter_vec(),
            reconcile_errors: RECONCILE_ERRORS.int_counter_vec(),
            reconcile_duration: RECONCILE_DURATION.histogram_vec(
                prometheus::exponential_buckets(0.001, 2.0, 14).expect("valid buckets"),
            ),
            backlog: BACKLOG.int_gauge_vec(),
            in_flight: IN_FLIGHT.int_gauge_vec(),
            desired: DESIRED.int_gauge_vec(),
            ready: READY.int_gauge_vec(),
            max: MAX.int_gauge_vec(),
            oldest_job_age: OLDEST_JOB_AGE.gauge_vec(),
            dead_letters: DEAD_LETTERS.int_gauge_vec(),
            scale_events: SCALE_EVENTS.int_counter_vec(),
            protected_pods: PROTECTED_PODS.int_gauge_vec(),
            protection_patches: PROTECTION_PATCHES.int_counter_vec(),
            queue_up: QUEUE_UP.int_gauge_vec(),
            queue_safe: QUEUE_SAFE.int_gauge_vec(),
            evicted_keys: EVICTED_KEYS.int_gauge_vec(),
            unreadable: UNREADABLE.int_gauge_vec(),
            saturated: SATURATED.int_gauge_vec(),
            knee_replicas: KNEE_REPLICAS.int_gauge_vec(),
            knee_rate: KNEE_RATE.gauge_vec(),
        };
        for c in m.collectors() {
            m.registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// Every collector, as registered.
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.reconciles.clone()),
            Box::new(self.reconcile_errors.clone()),
            Box::new(self.reconcile_duration.clone()),
            Box::new(self.backlog.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.desired.clone()),
            Box::new(self.ready.clone()),
            Box::new(self.max.clone()),
            Box::new(self.oldest_job_age.clone()),
            Box::new(self.dead_letters.clone()),
            Box::new(self.scale_events.clone()),
            Box::new(self.protected_pods.clone()),
            Box::new(self.protection_patches.clone()),
            Box::new(self.queue_up.clone()),
            Box::new(self.queue_safe.clone()),
            Box::new(self.evicted_keys.clone()),
            Box::new(self.unreadable.clone()),
            Box::new(self.saturated.clone()),
            Box::new(self.knee_replicas.clone()),
            Box::new(self.knee_rate.clone()),
        ]
    }

    /// Records one reconcile.
    pub fn observe_reconcile(&self, took: Duration, failed: Option<&'static str>) {
        self.reconciles
            .with_label_values(&[failed.unwrap_or("ok")])
            .inc();
        self.reconcile_duration
            .with_label_values(&[] as &[&str])
            .observe(took.as_secs_f64());
    }

    /// Records what one reconcile saw of a pool: its replica counts, and
    /// the queue as read (`None`: the read failed, and the queue's figures
    /// keep their last values, as the pool's status does).
    pub fn observe_pool(
        &self,
        namespace: &str,
        pool: &str,
        queue: Option<&Snapshot>,
        replicas: Replicas,
    ) {
        let labels = [namespace, pool];
        self.desired
            .with_label_values(&labels)
            .set(i64::from(replicas.desired));
        self.ready
            .with_label_values(&labels)
            .set(i64::from(replicas.ready));
        match replicas.max {
            Some(max) => self.max.with_label_values(&labels).set(i64::from(max)),
            None => {
                let _ = self.max.remove_label_values(&labels);
            }
        }
        self.queue_up
            .with_label_values(&labels)
            .set(i64::from(queue.is_some()));
        let Some(snap) = queue else {
            return;
        };
        let counts = snap.counts();
        self.backlog
            .with_label_values(&labels)
            .set(saturating(counts.backlog()));
        self.in_flight
            .with_label_values(&labels)
            .set(saturating(counts.held()));
        self.dead_letters
            .with_label_values(&labels)
            .set(saturating(counts.dead));
        // An empty queue's oldest job is 0 s old; jobs waiting without an
        // `enqueued_at` have no known age, and the series goes.
        match counts.oldest_job_age_seconds() {
            Some(age) => self.oldest_job_age.with_label_values(&labels).set(age),
            None if counts.waiting == 0 => self.oldest_job_age.with_label_values(&labels).set(0.0),
            None => {
                let _ = self.oldest_job_age.remove_label_values(&labels);
            }
        }
    }

    /// Records the eviction policy and evictions of a pool's Redis.
    pub fn observe_memory(
        &self,
        namespace: &str,
        pool: &str,
        memory: &workerpool_queue::memory::Memory,
    ) {
        let labels = [namespace, pool];
        self.queue_safe
            .with_label_values(&labels)
            .set(i64::from(memory.warning().is_none()));
        self.evicted_keys
            .with_label_values(&labels)
            .set(saturating(memory.evicted_keys));
    }

    /// Records an applied change of a pool's replicas from `from` to `to`.
    pub fn observe_scale(&self, namespace: &str, pool: &str, from: i32, to: i32) {
        if from == to {
            return;
        }
        let direction = if to > from { "up" } else { "down" };
        self.scale_events
            .with_label_values(&[namespace, pool, direction])
            .inc();
    }

    /// Whether the engine holds a pool at its knee, and the knee: 0 and no
    /// knee series when it does not.
    pub fn observe_saturation(
        &self,
        namespace: &str,
        pool: &str,
        saturation: Option<&crate::scaling::Saturation>,
    ) {
        let labels = [namespace, pool];
        self.saturated
            .with_label_values(&labels)
            .set(i64::from(saturation.is_some()));
        match saturation {
            Some(s) => {
                self.knee_replicas
                    .with_label_values(&labels)
                    .set(i64::from(s.knee));
                self.knee_rate.with_label_values(&labels).set(s.rate);
            }
            None => {
                let _ = self.knee_replicas.remove_label_values(&labels);
                let _ = self.knee_rate.remove_label_values(&labels);
            }
        }
    }

    /// Records that a pool reads (again): its `unreadable` series goes.
    pub fn readable(&self, namespace: &str, pool: &str) {
        let _ = self.unreadable.remove_label_values(&[namespace, pool]);
    }

    /// Drops a deleted pool's series.
    pub fn forget_pool(&self, namespace: &str, pool: &str) {
        let labels = [namespace, pool];
        for gauge in [
            &self.backlog,
            &self.in_flight,
            &self.desired,
            &self.ready,
            &self.max,
            &self.dead_letters,
            &self.queue_up,
            &self.queue_safe,
            &self.evicted_keys,
            &self.protected_pods,
            &self.unreadable,
            &self.saturated,
            &self.knee_replicas,
        ] {
            let _ = gauge.remove_label_values(&labels);
        }
        for change in ["protect", "release"] {
            let _ = self
                .protection_patches
                .remove_label_values(&[namespace, pool, change]);
        }
        let _ = self.oldest_job_age.remove_label_values(&labels);
        let _ = self.knee_rate.remove_label_values(&labels);
        for direction in ["up", "down"] {
            let _ = self
                .scale_events
                .remove_label_values(&[namespace, pool, direction]);
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# error encoding metrics: {e}\n"))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn saturating(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use workerpool_queue::snapshot::{QueueFigures, Snapshot};

    #[test]
    fn every_registered_metric_is_its_catalogue_entry_and_every_entry_is_registered() {
        let registered: Vec<(String, String, Vec<String>)> = super::Metrics::new()
            .collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned().collect::<Vec<_>>())
            .map(|d| (d.fq_name, d.help, d.variable_labels))
            .collect();
        let catalogue: Vec<(String, String, Vec<String>)> = super::CATALOGUE
            .iter()
            .map(|m| {
                let labels = m.label_names().iter().map(|l| l.to_string()).collect();
                (m.name.to_string(), m.help.to_string(), labels)
            })
            .collect();
        assert_eq!(registered, catalogue);
    }

    use super::{Metrics, Replicas};

    fn snapshot(waiting: u64, oldest_enqueued_at_ms: Option<u64>, dead: u64) -> Snapshot {
        Snapshot {
            server_time_ms: 100_000,
            queues: vec![
                QueueFigures {
                    name: "mail".into(),
                    waiting,
                    oldest_enqueued_at_ms,
                    dead,
                    ..QueueFigures::default()
                },
                QueueFigures {
                    name: "mail:low".into(),
                    dead: 1,
                    ..QueueFigures::default()
                },
            ],
        }
    }

    const SCALED: Replicas = Replicas {
        desired: 4,
        ready: 3,
        max: Some(10),
    };

    fn has(m: &Metrics, line: &str) -> bool {
        m.render().lines().any(|l| l == line)
    }

    #[test]
    fn a_read_pool_exports_its_replicas_queue_figures_and_reachability() {
        let m = Metrics::new();
        m.observe_pool("jobs", "mail", Some(&snapshot(7, Some(58_000), 2)), SCALED);
        for line in [
            r#"workerpool_pool_backlog{namespace="jobs",pool="mail"} 7"#,
            r#"workerpool_pool_desired_replicas{namespace="jobs",pool="mail"} 4"#,
            r#"workerpool_pool_ready_replicas{namespace="jobs",pool="mail"} 3"#,
            r#"workerpool_pool_max_replicas{namespace="jobs",pool="mail"} 10"#,
            r#"workerpool_pool_oldest_job_age_seconds{namespace="jobs",pool="mail"} 42"#,
            r#"workerpool_pool_dead_letters{namespace="jobs",pool="mail"} 3"#,
            r#"workerpool_pool_queue_up{namespace="jobs",pool="mail"} 1"#,
        ] {
            assert!(has(&m, line), "no {line} in\n{}", m.render());
        }
    }

    #[test]
    fn an_unreadable_queue_is_down_and_keeps_the_last_figures() {
        let m = Metrics::new();
        m.observe_pool("jobs", "mail", Some(&snapshot(7, Some(58_000), 2)), SCALED);
        let held = Replicas {
            desired: 2,
            ..SCALED
        };
        m.observe_pool("jobs", "mail", None, held);
        for line in [
            r#"workerpool_pool_queue_up{namespace="jobs",pool="mail"} 0"#,
            r#"workerpool_pool_backlog{namespace="jobs",pool="mail"} 7"#,
            r#"workerpool_pool_desired_replicas{namespace="jobs",pool="mail"} 2"#,
        ] {
            assert!(has(&m, line), "no {line} in\n{}", m.render());
        }
    }

    #[test]
    fn a_saturated_pool_shows_its_knee_and_a_pool_that_is_not_shows_none() {
        let m = Metrics::new();
        let knee = crate::scaling::Saturation {
            knee: 12,
            rate: 180.5,
            measured_at: 16,
            marginal: 0.004,
            confirmed_at: 0.0,
            climbing: false,
        };
        m.observe_saturation("jobs", "mail", Some(&knee));
        for line in [
            r#"workerpool_pool_saturated{namespace="jobs",pool="mail"} 1"#,
            r#"workerpool_pool_knee_replicas{namespace="jobs",pool="mail"} 12"#,
            r#"workerpool_pool_knee_completions_per_second{namespace="jobs",pool="mail"} 180.5"#,
        ] {
            assert!(has(&m, line), "no {line} in\n{}", m.render());
        }
        m.observe_saturation("jobs", "mail", None);
        assert!(has(
            &m,
            r#"workerpool_pool_saturated{namespace="jobs",pool="mail"} 0"#
        ));
        assert!(
            !m.render().contains("workerpool_pool_knee_"),
            "{}",
            m.render()
        );
        m.observe_saturation("jobs", "mail", Some(&knee));
        m.forget_pool("jobs", "mail");
        assert!(!m.render().contains("pool=\"mail\""), "{}", m.render());
    }

    #[test]
    fn the_oldest_job_is_0_s_old_in_an_empty_queue_and_unknown_without_a_stamp() {
        let m = Metrics::new();
        m.observe_pool("jobs", "mail", Some(&snapshot(0, None, 0)), SCALED);
        assert!(has(
            &m,
            r#"workerpool_pool_oldest_job_age_seconds{namespace="jobs",pool="mail"} 0"#
        ));
        m.observe_pool("jobs", "mail", Some(&snapshot(5, None, 0)), SCALED);
        assert!(
            !m.render()
                .contains("workerpool_pool_oldest_job_age_seconds{"),
            "{}",
            m.render()
        );
    }

    #[test]
    fn a_fixed_size_pool_has_no_max() {
        let m = Metrics::new();
        m.observe_pool("jobs", "mail", None, SCALED);
        let fixed = Replicas {
            max: None,
            ..SCALED
        };
        m.observe_pool("jobs", "mail", None, fixed);
        assert!(!m.render().contains("workerpool_pool_max_replicas{"));
    }

    #[test]
    fn scale_events_count_by_direction() {
        let m = Metrics::new();
        m.observe_scale("jobs", "mail", 1, 3);
        m.observe_scale("jobs", "mail", 3, 5);
        m.observe_scale("jobs", "mail", 5, 2);
        m.observe_scale("jobs", "mail", 2, 2);
        for line in [
            r#"workerpool_pool_scale_events_total{direction="up",namespace="jobs",pool="mail"} 2"#,
            r#"workerpool_pool_scale_events_total{direction="down",namespace="jobs",pool="mail"} 1"#,
        ] {
            assert!(has(&m, line), "no {line} in\n{}", m.render());
        }
    }

    #[test]
    fn a_forgotten_pool_leaves_no_series_and_others_stay() {
        let m = Metrics::new();
        for pool in ["mail", "video"] {
            m.observe_pool("jobs", pool, Some(&snapshot(7, Some(58_000), 2)), SCALED);
            m.observe_scale("jobs", pool, 1, 3);
            m.observe_scale("jobs", pool, 3, 1);
        }
        m.forget_pool("jobs", "mail");
        let text = m.render();
        assert!(!text.contains(r#"pool="mail""#), "{text}");
        assert!(
            has(
                &m,
                r#"workerpool_pool_queue_up{namespace="jobs",pool="video"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn metric_names_follow_the_prometheus_conventions() {
        let m = Metrics::new();
        m.observe_pool("jobs", "mail", Some(&snapshot(1, Some(1), 1)), SCALED);
        m.observe_scale("jobs", "mail", 1, 2);
        m.observe_reconcile(std::time::Duration::from_millis(3), None);
        m.reconcile_errors
            .with_label_values(&["patch_status"])
            .inc();
        for family in m.registry.gather() {
            let name = family.name();
            assert!(name.starts_with("workerpool_"), "{name}");
            let counter = family.get_field_type() == prometheus::proto::MetricType::COUNTER;
            assert_eq!(counter, name.ends_with("_total"), "{name}");
            for metric in family.get_metric() {
                for label in metric.get_label() {
                    assert!(
                        ["namespace", "pool", "direction", "result", "operation"]
                            .contains(&label.name()),
                        "{name} has label {}",
                        label.name()
                    );
                }
            }
        }
    }
}
