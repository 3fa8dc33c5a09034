//! Prometheus metrics of the operator.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

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
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let pool = &["namespace", "pool"];
        let m = Self {
            registry: Registry::new(),
            reconciles: IntCounterVec::new(
                Opts::new(
                    "workerpool_operator_reconciles_total",
                    "Reconciles by result",
                ),
                &["result"],
            )
            .expect("valid metric"),
            reconcile_errors: IntCounterVec::new(
                Opts::new(
                    "workerpool_operator_reconcile_errors_total",
                    "Failed reconciles by operation",
                ),
                &["operation"],
            )
            .expect("valid metric"),
            reconcile_duration: HistogramVec::new(
                HistogramOpts::new(
                    "workerpool_operator_reconcile_duration_seconds",
                    "Reconcile duration",
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 14).expect("valid buckets")),
                &[],
            )
            .expect("valid metric"),
            backlog: IntGaugeVec::new(
                Opts::new("workerpool_pool_backlog", "Jobs waiting per pool"),
                pool,
            )
            .expect("valid metric"),
            in_flight: IntGaugeVec::new(
                Opts::new("workerpool_pool_in_flight", "Jobs running per pool"),
                pool,
            )
            .expect("valid metric"),
            desired: IntGaugeVec::new(
                Opts::new(
                    "workerpool_pool_desired_replicas",
                    "Desired workers per pool",
                ),
                pool,
            )
            .expect("valid metric"),
        };
        for c in [
            Box::new(m.reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.reconcile_errors.clone()),
            Box::new(m.reconcile_duration.clone()),
            Box::new(m.backlog.clone()),
            Box::new(m.in_flight.clone()),
            Box::new(m.desired.clone()),
        ] {
            m.registry.register(c).expect("metric names are unique");
        }
        m
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

    /// Records a pool's latest reading.
    pub fn observe_pool(
        &self,
        namespace: &str,
        pool: &str,
        backlog: u64,
        in_flight: u64,
        desired: i32,
    ) {
        let labels = [namespace, pool];
        self.backlog.with_label_values(&labels).set(backlog as i64);
        self.in_flight
            .with_label_values(&labels)
            .set(in_flight as i64);
        self.desired
            .with_label_values(&labels)
            .set(i64::from(desired));
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
