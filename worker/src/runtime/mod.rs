//! The worker runtime, read top to bottom in [`run`]: register
//! ([`maintain`]), take jobs while slots are free ([`fetch`]), stamp and
//! start them ([`intake`]), run and settle each ([`settle`]), keep the
//! registry and the queues healthy meanwhile ([`maintain`]), and on
//! shutdown ([`shutdown`]) give back what is unfinished ([`drain`]). Every
//! Redis call goes through [`connection`]; the jobs in hand are in its
//! [`ledger`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use workerpool_queue::connection::Mode;
use workerpool_queue::keys::{Instance, QueueKeys};

use crate::config::{Config, ConfigError};
use crate::handler::Handler;
use crate::metrics::Metrics;
use crate::probes::Health;

mod connection;
mod drain;
mod fetch;
mod instance_file;
mod intake;
mod ledger;
mod maintain;
mod report;
mod settle;
mod shutdown;

use self::connection::Redis;
use self::instance_file::InstanceFile;
use self::ledger::Ledger;
pub use self::report::{cancel_requested, progress};
use self::settle::Settling;
pub use self::shutdown::Shutdown;

/// Most jobs taken or settled in one round trip.
const MAX_BATCH: usize = 100;
/// How long one blocking wait for a job lasts on the server. A killed
/// worker's blocked command can still move a job for this long, which is
/// far below any allowed `--dead-after`, so the reaper always sees it.
const BLOCK: Duration = Duration::from_secs(2);
/// With a rate limit, how long the fetch loop waits before it looks again
/// at queues it found empty (it cannot block on them: a blocking move
/// would bypass the limit).
const RATE_POLL: Duration = Duration::from_millis(100);
/// Time allowed for the final give-back of unfinished jobs at shutdown.
const GIVE_BACK_WINDOW: Duration = Duration::from_secs(3);
/// How often due retries and delayed jobs are moved to their queue (at
/// most; a shorter heartbeat interval makes it more often).
const PROMOTE_EVERY: Duration = Duration::from_secs(1);
/// How often the eviction policy and evictions of Redis are looked at
/// again after the start.
const MEMORY_EVERY: Duration = Duration::from_secs(60);

struct Worker {
    config: Config,
    instance: String,
    queues: Vec<QueueKeys>,
    handler: Arc<dyn Handler>,
    /// The kept jobs running now: where progress and cancels find them.
    running: report::Running,
    /// Where handlers send progress ([`report`]).
    reports: Arc<report::ReportSink>,
    redis: Redis,
    metrics: Metrics,
    /// Each queue's per-job series, looked up once rather than per job.
    job_metrics: Vec<JobMetrics>,
    health: Arc<Health>,
    ledger: Mutex<Ledger>,
    /// Unix ms of the Redis server minus this host's clock.
    clock_offset_ms: AtomicI64,
    /// Set when a reply may have been lost after Redis moved jobs for us:
    /// the processing lists are then checked against the ledger.
    lost_reply: AtomicBool,
    /// Set when Redis refused the blocking wait's `CLIENT REPLY`: the
    /// fetch loop then polls instead of blocking.
    poll_only: AtomicBool,
    shutdown: Shutdown,
    /// Fires at the shutdown deadline: running attempts are abandoned.
    give_up: CancellationToken,
    /// One permit per job this process may have in hand.
    slots: Arc<Semaphore>,
    /// The running jobs' tasks.
    tracker: TaskTracker,
    /// Finished jobs on their way to the settle loop.
    settler: tokio::sync::mpsc::UnboundedSender<Settling>,
    /// What the last look found of each queue's Redis memory settings.
    memory: Mutex<Vec<Option<workerpool_queue::memory::Memory>>>,
    /// The tracer, when `OTEL_*` turns tracing on.
    otel: Option<crate::otel::Otel>,
    /// `--instance-file`, its lock held while this worker runs.
    instance_file: Option<InstanceFile>,
    /// The instance that ran in this container before this process (read
    /// from the instance file), known to have exited: its jobs are
    /// returned at start, and once more a blocking wait's length later
    /// (see [`Worker::look_again_at_predecessor`]).
    predecessor: Mutex<Option<String>>,
}

/// A queue's series of the metrics every job touches.
struct JobMetrics {
    /// `workerpool_jobs_total{outcome="done"}`.
    done: prometheus::IntCounter,
    /// `workerpool_jobs_total{outcome="retried"}`.
    retried: prometheus::IntCounter,
    /// `workerpool_jobs_total{outcome="dead"}`.
    dead: prometheus::IntCounter,
    /// `workerpool_jobs_total{outcome="requeued"}`: back on the queue
    /// with the attempt not spent (a handler that could not start it).
    requeued: prometheus::IntCounter,
    /// `workerpool_job_duration_seconds`.
    duration: prometheus::Histogram,
    /// `workerpool_jobs_in_flight`.
    in_flight: prometheus::IntGauge,
    /// The jobs timed since the last heartbeat: how many, the sum of their
    /// seconds and the sum of their squares.
    untold: Mutex<(u64, f64, f64)>,
}

impl JobMetrics {
    /// Times one job: its metric, and what the next heartbeat tells.
    fn timed(&self, seconds: f64) {
        self.duration.observe(seconds);
        if seconds.is_finite() && seconds >= 0.0 {
            let mut untold = self.untold.lock().unwrap_or_else(|e| e.into_inner());
            untold.0 += 1;
            untold.1 += seconds;
            untold.2 += seconds * seconds;
        }
    }

    /// The jobs timed since the last call: what the next heartbeat folds
    /// into the queue's mean job duration and its spread.
    fn timed_since_told(&self) -> Option<workerpool_queue::ops::JobsTimed> {
        let (jobs, sum, squares) =
            std::mem::take(&mut *self.untold.lock().unwrap_or_else(|e| e.into_inner()));
        if jobs == 0 {
            return None;
        }
        let n = jobs as f64;
        let mean = sum / n;
        // Rounding can take the difference a hair below zero.
        let variance = (squares / n - mean * mean).max(0.0);
        Some(workerpool_queue::ops::JobsTimed {
            jobs,
            mean: Duration::try_from_secs_f64(mean).ok()?,
            deviation: Duration::try_from_secs_f64(variance.sqrt()).ok(),
        })
    }
}

/// Errors that stop the worker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings are invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Tracing cannot start as `OTEL_*` asks.
    #[error(transparent)]
    Otel(#[from] crate::otel::OtelError),
    /// The HTTP address could not be bound.
    #[error("cannot listen on --listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Runs a worker until `shutdown` completes its drain. Returns `Ok` after a
/// clean drain: every job finished or was given back to its queue (or, if
/// Redis was unreachable at the end, stays recorded for recovery).
pub async fn run(
    config: Config,
    handler: Arc<dyn Handler>,
    metrics: Metrics,
    shutdown: Shutdown,
) -> Result<(), Error> {
    config.validate()?;
    let health = Arc::new(Health::new(config.heartbeat_interval));
    let endpoint = config.endpoint()?;
    let queues: Vec<_> = config.queues.iter().map(QueueKeys::new).collect();
    if endpoint.mode() == Mode::Cluster
        && let Some(problem) = workerpool_queue::keys::cluster_problem(&queues)
    {
        return Err(ConfigError(problem).into());
    }
    if endpoint.tls().insecure_skip_verify {
        tracing::warn!(
            url = %endpoint.redacted(),
            "--redis-tls-insecure-skip-verify: Redis's certificate is not checked; anyone on the path can read and change jobs"
        );
    }
    let stop_http = CancellationToken::new();
    let http = match config.listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Listen { addr, source })?;
            let app = crate::probes::app(health.clone(), metrics.clone());
            let stop = stop_http.clone();
            Some(tokio::spawn(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "http server failed");
                }
            }))
        }
        None => None,
    };
    let otel = crate::otel::Otel::from_env(crate::otel::SpanCounters {
        exported: metrics.trace_spans_exported.clone(),
        dropped: metrics.trace_spans_dropped.clone(),
    })?;
    let instance = Instance::new(config.worker_id.clone());
    let (instance_file, predecessor) = match config
        .instance_file
        .as_deref()
        .and_then(|path| InstanceFile::claim(path, &config.worker_id))
    {
        Some(claimed) => (Some(claimed.file), claimed.predecessor),
        None => (None, None),
    };
    let (settler, finished) = tokio::sync::mpsc::unbounded_channel();
    let (reports, reported) = report::sink();
    handler.set_reports(reports.clone());
    let worker = Arc::new(Worker {
        instance: instance.name(),
        ledger: Mutex::new(Ledger::new(queues.len())),
        job_metrics: queues
            .iter()
            .map(|q| JobMetrics {
                done: metrics.jobs.with_label_values(&[q.name(), "done"]),
                retried: metrics.jobs.with_label_values(&[q.name(), "retried"]),
                dead: metrics.jobs.with_label_values(&[q.name(), "dead"]),
                requeued: metrics.jobs.with_label_values(&[q.name(), "requeued"]),
                duration: metrics.job_duration.with_label_values(&[q.name()]),
                in_flight: metrics.in_flight.with_label_values(&[q.name()]),
                untold: Mutex::new((0, 0.0, 0.0)),
            })
            .collect(),
        queues,
        handler,
        running: report::Running::default(),
        reports,
        redis: Redis::new(endpoint, health.clone(), metrics.clone()),
        metrics,
        health: health.clone(),
        clock_offset_ms: AtomicI64::new(0),
        lost_reply: AtomicBool::new(false),
        poll_only: AtomicBool::new(false),
        shutdown: shutdown.clone(),
        give_up: CancellationToken::new(),
        slots: Arc::new(Semaphore::new(config.concurrency)),
        tracker: TaskTracker::new(),
        settler,
        memory: Mutex::new(vec![None; config.queues.len()]),
        otel,
        instance_file,
        predecessor: Mutex::new(predecessor),
        config,
    });
    tracing::info!(
        instance = %worker.instance,
        queues = ?worker.queue_names(),
        concurrency = worker.config.concurrency,
        "worker starting"
    );

    // The state line on request (SIGUSR1), until the worker has stopped.
    let reporting = tokio::spawn({
        let worker = worker.clone();
        async move {
            loop {
                worker.shutdown.report.notified().await;
                worker.log_state();
            }
        }
    });
    let stop_maintenance = CancellationToken::new();
    let started = worker.start().await;
    if let Ok(true) = started {
        health.set_registered();
        tracing::info!("worker ready");
        let maintenance = tokio::spawn(worker.clone().maintain(stop_maintenance.clone()));
        let stop_settling = CancellationToken::new();
        let settling = tokio::spawn(worker.clone().settle_loop(finished, stop_settling.clone()));
        let stop_reporting = CancellationToken::new();
        let progressing = tokio::spawn(
            worker
                .clone()
                .progress_loop(reported, stop_reporting.clone()),
        );

        worker.clone().fetch_loop().await;
        health.fetch_loop_ended();
        worker.drain().await;
        stop_settling.cancel();
        let _ = settling.await;
        stop_reporting.cancel();
        let _ = progressing.await;
        stop_maintenance.cancel();
        let _ = maintenance.await;
    }
    reporting.abort();
    // The spans still queued go out (a few seconds at most).
    if worker.otel.is_some() {
        let w = worker.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(otel) = &w.otel {
                otel.shutdown(Duration::from_secs(3));
            }
        })
        .await;
    }
    health.set_draining();
    stop_http.cancel();
    if let Some(http) = http {
        let _ = http.await;
    }
    tracing::info!("worker stopped");
    started.map(|_| ())
}

/// Runs `handler` as a worker until `shutdown` completes, then drains
/// (in-flight jobs get `config.shutdown_timeout`, the rest go back to the
/// head of their queue). The entry point for handlers written in Rust: the
/// same runtime, and so the same guarantees, as the `workerpool-worker`
/// binary. Serves `/healthz`, `/readyz` and `/metrics` when
/// `config.listen` is set.
///
/// ```no_run
/// use workerpool_worker::{Config, Job, Outcome, handler_fn, run_until};
///
/// # async fn example() -> Result<(), workerpool_worker::Error> {
/// let config = Config::new("redis://localhost:6379", vec!["emails".into()]);
/// let handler = handler_fn(|job: Job| async move { Outcome::Done });
/// run_until(config, handler, async {
///     tokio::signal::ctrl_c().await.ok();
/// })
/// .await
/// # }
/// ```
pub async fn run_until<H, F>(config: Config, handler: H, shutdown: F) -> Result<(), Error>
where
    H: Handler,
    F: Future<Output = ()> + Send + 'static,
{
    let shutdown = Shutdown::when(shutdown);
    let result = run(config, Arc::new(handler), Metrics::new(), shutdown.clone()).await;
    // Ends the task watching `shutdown` when `run` stopped on its own.
    shutdown.drain();
    result
}

impl Worker {
    /// Notes that a reply may have been lost after Redis moved jobs for
    /// this process: the next fetch round checks the processing lists
    /// against the ledger first.
    fn suspect_lost_reply(&self) {
        self.lost_reply.store(true, Ordering::Relaxed);
    }

    /// Jobs running now, on all queues.
    fn running(&self) -> i64 {
        self.job_metrics.iter().map(|m| m.in_flight.get()).sum()
    }

    /// The queues' names, in priority order.
    fn queue_names(&self) -> Vec<&str> {
        self.queues.iter().map(QueueKeys::name).collect()
    }

    fn now_ms(&self) -> u64 {
        let local = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        (local + self.clock_offset_ms.load(Ordering::Relaxed)).max(0) as u64
    }

    fn note_server_time(&self, server_ms: u64) {
        let local = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.clock_offset_ms
            .store(server_ms as i64 - local, Ordering::Relaxed);
    }
}
