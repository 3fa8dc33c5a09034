//! Prometheus metrics of the worker.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Every metric the worker exports, registered in one registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Attempts by queue and outcome: `done`, `retried`, `dead`, `requeued`.
    pub jobs: IntCounterVec,
    /// Jobs dead-lettered by queue and reason.
    pub dead_letters: IntCounterVec,
    /// Handler run time by queue.
    pub job_duration: HistogramVec,
    /// Jobs running now by queue.
    pub in_flight: IntGaugeVec,
    /// Round-trip time of a fetch that found jobs waiting.
    pub fetch_duration: Histogram,
    /// Failed Redis operations by operation.
    pub redis_errors: IntCounterVec,
    /// Settlements that found their job already returned to the queue by a
    /// reaper (the worker had been taken for lost); not counted twice.
    pub stale_acks: IntCounterVec,
    /// Jobs this worker returned to the queue from lost workers.
    pub recovered: IntCounterVec,
    /// Exec handler children replaced after dying or being killed.
    pub child_restarts: IntCounter,
    /// Takings (a fetch, or the taking half of a settle) that a queue's
    /// rate limit stopped while it had jobs left, by queue.
    pub rate_limited: IntCounterVec,
    /// Time the fetch loop waited for a queue's rate limit, by queue.
    pub rate_limit_wait: prometheus::CounterVec,
    /// 1 for the `maxmemory-policy` of the Redis that holds each queue
    /// (`unknown` when INFO does not say), by queue and policy.
    pub redis_policy: IntGaugeVec,
    /// The `evicted_keys` count of the Redis that holds each queue.
    pub redis_evicted_keys: IntGaugeVec,
    /// Spans sent to the OpenTelemetry collector.
    pub trace_spans_exported: prometheus::IntCounter,
    /// Spans lost before the collector had them, by reason.
    pub trace_spans_dropped: IntCounterVec,
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let registry = Registry::new();
        let m = Metrics {
            jobs: IntCounterVec::new(
                Opts::new("workerpool_jobs_total", "Job attempts by outcome"),
                &["queue", "outcome"],
            )
            .expect("valid metric"),
            dead_letters: IntCounterVec::new(
                Opts::new(
                    "workerpool_dead_letters_total",
                    "Jobs dead-lettered by reason",
                ),
                &["queue", "reason"],
            )
            .expect("valid metric"),
            job_duration: HistogramVec::new(
                HistogramOpts::new("workerpool_job_duration_seconds", "Handler run time").buckets(
                    prometheus::exponential_buckets(0.0005, 2.5, 16).expect("valid buckets"),
                ),
                &["queue"],
            )
            .expect("valid metric"),
            in_flight: IntGaugeVec::new(
                Opts::new("workerpool_jobs_in_flight", "Jobs running now"),
                &["queue"],
            )
            .expect("valid metric"),
            fetch_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "workerpool_fetch_duration_seconds",
                    "Round trip of a fetch that found jobs",
                )
                .buckets(prometheus::exponential_buckets(0.0001, 2.0, 14).expect("valid buckets")),
            )
            .expect("valid metric"),
            redis_errors: IntCounterVec::new(
                Opts::new("workerpool_redis_errors_total", "Failed Redis operations"),
                &["operation"],
            )
            .expect("valid metric"),
            stale_acks: IntCounterVec::new(
                Opts::new(
                    "workerpool_stale_acks_total",
                    "Settlements of jobs a reaper had already returned to the queue",
                ),
                &["queue"],
            )
            .expect("valid metric"),
            recovered: IntCounterVec::new(
                Opts::new(
                    "workerpool_recovered_jobs_total",
                    "Jobs returned to the queue from lost workers",
                ),
                &["queue"],
            )
            .expect("valid metric"),
            child_restarts: IntCounter::new(
                "workerpool_exec_child_restarts_total",
                "Exec handler children replaced after dying or being killed",
            )
            .expect("valid metric"),
            rate_limited: IntCounterVec::new(
                Opts::new(
                    "workerpool_rate_limited_total",
                    "Takings of jobs that the queue's rate limit stopped while jobs were waiting",
                ),
                &["queue"],
            )
            .expect("valid metric"),
            rate_limit_wait: prometheus::CounterVec::new(
                Opts::new(
                    "workerpool_rate_limit_wait_seconds_total",
                    "Time the fetch loop waited for the queue's rate limit to allow the next start",
                ),
                &["queue"],
            )
            .expect("valid metric"),
            redis_policy: IntGaugeVec::new(
                Opts::new(
                    "workerpool_redis_maxmemory_policy",
                    "1 for the maxmemory-policy of the Redis that holds the queue; anything but noeviction can delete jobs",
                ),
                &["queue", "policy"],
            )
            .expect("valid metric"),
            redis_evicted_keys: IntGaugeVec::new(
                Opts::new(
                    "workerpool_redis_evicted_keys",
                    "Keys the Redis that holds the queue has evicted since it started (INFO evicted_keys)",
                ),
                &["queue"],
            )
            .expect("valid metric"),
            trace_spans_exported: prometheus::IntCounter::new(
                "workerpool_trace_spans_exported_total",
                "Spans sent to the OpenTelemetry collector (OTLP)",
            )
            .expect("valid metric"),
            trace_spans_dropped: IntCounterVec::new(
                Opts::new(
                    "workerpool_trace_spans_dropped_total",
                    "Spans lost before the collector had them: queue_full (the export queue of 2048 spans was full), export_failed (the collector refused or did not answer), shut_down",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            registry,
        };
        for c in [
            Box::new(m.jobs.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.dead_letters.clone()),
            Box::new(m.job_duration.clone()),
            Box::new(m.in_flight.clone()),
            Box::new(m.fetch_duration.clone()),
            Box::new(m.redis_errors.clone()),
            Box::new(m.stale_acks.clone()),
            Box::new(m.recovered.clone()),
            Box::new(m.child_restarts.clone()),
            Box::new(m.rate_limited.clone()),
            Box::new(m.rate_limit_wait.clone()),
            Box::new(m.redis_policy.clone()),
            Box::new(m.redis_evicted_keys.clone()),
            Box::new(m.trace_spans_exported.clone()),
            Box::new(m.trace_spans_dropped.clone()),
        ] {
            m.registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        encoder
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# error encoding metrics: {e}\n"))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
