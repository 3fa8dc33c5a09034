//! Prometheus metrics of the worker.

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Registry};
use workerpool_settings::metrics::{Kind, Label, Metric, Section};

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

/// Every metric the worker exports, as data: [`Metrics::new`] builds its
/// collectors from these, and `docs/metrics.md` is rendered from them.
pub const CATALOGUE: &[Metric] = &[
    JOBS,
    DEAD_LETTERS,
    JOB_DURATION,
    IN_FLIGHT,
    FETCH_DURATION,
    REDIS_ERRORS,
    STALE_ACKS,
    RECOVERED,
    CHILD_RESTARTS,
    RATE_LIMITED,
    RATE_LIMIT_WAIT,
    REDIS_POLICY,
    REDIS_EVICTED_KEYS,
    TRACE_SPANS_EXPORTED,
    TRACE_SPANS_DROPPED,
];

/// The worker's part of `docs/metrics.md`.
pub const SECTION: Section = Section {
    title: "Worker",
    intro: "`workerpool-worker` serves these on `/metrics` (`--listen`); the chart's PodMonitor \
            scrapes them from every worker pod and adds the label `pool`.",
    metrics: CATALOGUE,
};

const QUEUE: Label = Label {
    name: "queue",
    values: "the queue's name (one worker may take from several)",
};

const JOBS: Metric = Metric {
    name: "workerpool_jobs_total",
    kind: Kind::Counter,
    help: "Job attempts by outcome",
    labels: &[
        QUEUE,
        Label {
            name: "outcome",
            values: "`done`; `retried` (failed, another attempt is scheduled); `dead` \
                     (dead-lettered); `requeued` (given back at shutdown, or not started by a \
                     handler that cannot start: its attempt not spent); `scheduled` (a fresh \
                     job whose `run_at` is in the future, moved to `<queue>:scheduled` on \
                     intake); `cancelled` (a kept job a producer cancelled after a worker took \
                     it, or that failed once asked to stop: not run again). Every queue's \
                     `done`, `retried`, `dead` and `requeued` series exist from the start, at 0",
        },
    ],
};

const DEAD_LETTERS: Metric = Metric {
    name: "workerpool_dead_letters_total",
    kind: Kind::Counter,
    help: "Jobs dead-lettered by reason",
    labels: &[
        QUEUE,
        Label {
            name: "reason",
            values: "`malformed`, `exhausted`, `permanent`, `lost`, `too_large` (see \
                     [the queue contract](queue-contract.md))",
        },
    ],
};

const JOB_DURATION: Metric = Metric {
    name: "workerpool_job_duration_seconds",
    kind: Kind::Histogram,
    help: "Handler run time",
    labels: &[QUEUE],
};

const IN_FLIGHT: Metric = Metric {
    name: "workerpool_jobs_in_flight",
    kind: Kind::Gauge,
    help: "Jobs running now",
    labels: &[QUEUE],
};

const FETCH_DURATION: Metric = Metric {
    name: "workerpool_fetch_duration_seconds",
    kind: Kind::Histogram,
    help: "Round trip of a fetch that found jobs",
    labels: &[],
};

const REDIS_ERRORS: Metric = Metric {
    name: "workerpool_redis_errors_total",
    kind: Kind::Counter,
    help: "Failed Redis operations",
    labels: &[Label {
        name: "operation",
        values: "`connect`, `fetch`, `wait`, `recheck_lost_replies`, `register`, `settle`, \
                 `settle_intake`, `give_back`, `maintenance`",
    }],
};

const STALE_ACKS: Metric = Metric {
    name: "workerpool_stale_acks_total",
    kind: Kind::Counter,
    help: "Settlements of jobs a reaper had already returned to the queue",
    labels: &[QUEUE],
};

const RECOVERED: Metric = Metric {
    name: "workerpool_recovered_jobs_total",
    kind: Kind::Counter,
    help: "Jobs returned to the queue from lost workers",
    labels: &[QUEUE],
};

const CHILD_RESTARTS: Metric = Metric {
    name: "workerpool_exec_child_restarts_total",
    kind: Kind::Counter,
    help: "Exec handler children replaced after dying or being killed",
    labels: &[],
};

const RATE_LIMITED: Metric = Metric {
    name: "workerpool_rate_limited_total",
    kind: Kind::Counter,
    help: "Takings of jobs that the queue's rate limit stopped while jobs were waiting",
    labels: &[QUEUE],
};

const RATE_LIMIT_WAIT: Metric = Metric {
    name: "workerpool_rate_limit_wait_seconds_total",
    kind: Kind::Counter,
    help: "Time the fetch loop waited for the queue's rate limit to allow the next start",
    labels: &[QUEUE],
};

const REDIS_POLICY: Metric = Metric {
    name: "workerpool_redis_maxmemory_policy",
    kind: Kind::Gauge,
    help: "1 for the maxmemory-policy of the Redis that holds the queue; anything but noeviction can delete jobs",
    labels: &[
        QUEUE,
        Label {
            name: "policy",
            values: "the Redis's `maxmemory-policy` (`noeviction`, `allkeys-lru`, …), `unknown` \
                     when INFO does not say",
        },
    ],
};

const REDIS_EVICTED_KEYS: Metric = Metric {
    name: "workerpool_redis_evicted_keys",
    kind: Kind::Gauge,
    help: "Keys the Redis that holds the queue has evicted since it started (INFO evicted_keys)",
    labels: &[QUEUE],
};

const TRACE_SPANS_EXPORTED: Metric = Metric {
    name: "workerpool_trace_spans_exported_total",
    kind: Kind::Counter,
    help: "Spans sent to the OpenTelemetry collector (OTLP)",
    labels: &[],
};

const TRACE_SPANS_DROPPED: Metric = Metric {
    name: "workerpool_trace_spans_dropped_total",
    kind: Kind::Counter,
    help: "Spans lost before the collector had them: queue_full (the export queue of 2048 spans was full), export_failed (the collector refused or did not answer), shut_down",
    labels: &[Label {
        name: "reason",
        values: "`queue_full`, `export_failed`, `shut_down`",
    }],
};

impl Metrics {
    /// Creates and registers the metrics, each from its entry in
    /// [`CATALOGUE`].
    pub fn new() -> Self {
        let m = Metrics {
            registry: Registry::new(),
            jobs: JOBS.int_counter_vec(),
            dead_letters: DEAD_LETTERS.int_counter_vec(),
            job_duration: JOB_DURATION.histogram_vec(
                prometheus::exponential_buckets(0.0005, 2.5, 16).expect("valid buckets"),
            ),
            in_flight: IN_FLIGHT.int_gauge_vec(),
            fetch_duration: FETCH_DURATION.histogram(
                prometheus::exponential_buckets(0.0001, 2.0, 14).expect("valid buckets"),
            ),
            redis_errors: REDIS_ERRORS.int_counter_vec(),
            stale_acks: STALE_ACKS.int_counter_vec(),
            recovered: RECOVERED.int_counter_vec(),
            child_restarts: CHILD_RESTARTS.int_counter(),
            rate_limited: RATE_LIMITED.int_counter_vec(),
            rate_limit_wait: RATE_LIMIT_WAIT.counter_vec(),
            redis_policy: REDIS_POLICY.int_gauge_vec(),
            redis_evicted_keys: REDIS_EVICTED_KEYS.int_gauge_vec(),
            trace_spans_exported: TRACE_SPANS_EXPORTED.int_counter(),
            trace_spans_dropped: TRACE_SPANS_DROPPED.int_counter_vec(),
        };
        for c in m.collectors() {
            m.registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// Every collector, as registered.
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.jobs.clone()),
            Box::new(self.dead_letters.clone()),
            Box::new(self.job_duration.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.fetch_duration.clone()),
            Box::new(self.redis_errors.clone()),
            Box::new(self.stale_acks.clone()),
            Box::new(self.recovered.clone()),
            Box::new(self.child_restarts.clone()),
            Box::new(self.rate_limited.clone()),
            Box::new(self.rate_limit_wait.clone()),
            Box::new(self.redis_policy.clone()),
            Box::new(self.redis_evicted_keys.clone()),
            Box::new(self.trace_spans_exported.clone()),
            Box::new(self.trace_spans_dropped.clone()),
        ]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_metric_is_its_catalogue_entry_and_every_entry_is_registered() {
        let registered: Vec<(String, String, Vec<String>)> = Metrics::new()
            .collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned().collect::<Vec<_>>())
            .map(|d| (d.fq_name, d.help, d.variable_labels))
            .collect();
        let catalogue: Vec<(String, String, Vec<String>)> = CATALOGUE
            .iter()
            .map(|m| {
                let labels = m.label_names().iter().map(|l| l.to_string()).collect();
                (m.name.to_string(), m.help.to_string(), labels)
            })
            .collect();
        assert_eq!(registered, catalogue);
    }
}
