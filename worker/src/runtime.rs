//! The worker runtime: fetch loop, job tasks, maintenance loop (heartbeats,
//! promotion of due retries, reaping of lost workers) and graceful drain.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, RedisResult};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::{self, Reconnect};
use crate::config::Config;
use crate::handler::{Handler, Outcome};
use crate::http::Health;
use crate::job::{DeadLetter, DeadReason, Intake, Job, intake};
use crate::keys::{Instance, QueueKeys};
use crate::metrics::Metrics;
use crate::queue::{self, IntakeAction, Payload};

/// Most jobs taken in one fetch round trip.
const MAX_BATCH: usize = 100;
/// How long one blocking wait for a job lasts on the server. A killed
/// worker's blocked command can still move a job for this long, which is
/// far below any allowed `--dead-after`, so the reaper always sees it.
const BLOCK: Duration = Duration::from_secs(2);
/// Time allowed for the final give-back of unfinished jobs at shutdown.
const GIVE_BACK_WINDOW: Duration = Duration::from_secs(3);
/// How often due retries and delayed jobs are moved to their queue (at
/// most; a shorter heartbeat interval makes it more often).
const PROMOTE_EVERY: Duration = Duration::from_secs(1);

/// The two stages of shutdown: `drain` stops fetching and lets in-flight
/// jobs finish until the shutdown timeout; `now` cuts that wait short.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    drain: CancellationToken,
    now: CancellationToken,
}

impl Shutdown {
    /// A shutdown that only the caller triggers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a graceful drain.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Stops waiting for in-flight jobs: they go back to the queue at once.
    pub fn now(&self) {
        self.drain.cancel();
        self.now.cancel();
    }

    /// Whether a drain has started.
    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// A shutdown that drains when `signal` completes, for example
    /// `async { tokio::signal::ctrl_c().await.ok(); }`. Must be called
    /// inside a Tokio runtime.
    pub fn when<F>(signal: F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let shutdown = Self::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            // Stop watching once the worker has stopped for another reason.
            tokio::select! {
                _ = signal => s.drain(),
                _ = s.drain.cancelled() => {}
            }
        });
        shutdown
    }

    /// A shutdown driven by SIGTERM and SIGINT: the first drains, the second
    /// skips the wait. Must be called inside a Tokio runtime.
    pub fn on_signals() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = Self::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            for stage in 0..2 {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
                if stage == 0 {
                    tracing::info!("signal received: draining (a second signal stops waiting)");
                    s.drain();
                } else {
                    tracing::warn!("second signal: returning unfinished jobs now");
                    s.now();
                }
            }
        });
        Ok(shutdown)
    }
}

/// The worker's Redis connection, re-established after failures.
struct Redis {
    endpoint: workerpool_queue::connection::Endpoint,
    current: Mutex<Option<MultiplexedConnection>>,
    connecting: tokio::sync::Mutex<()>,
    health: Arc<Health>,
    metrics: Metrics,
    /// The last failure, for messages that say what went wrong.
    last_error: Mutex<Option<String>>,
}

impl Redis {
    fn config() -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_secs(5)))
    }

    async fn conn(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let c = self
            .endpoint
            .client()?
            .get_multiplexed_async_connection_with_config(&Self::config())
            .await?;
        *self.slot() = Some(c.clone());
        Ok(c)
    }

    /// A dedicated connection for blocking commands, and its client id
    /// (for `CLIENT UNBLOCK`).
    async fn blocking_conn(&self) -> RedisResult<(MultiplexedConnection, i64)> {
        let config = Self::config().set_response_timeout(Some(BLOCK + Duration::from_secs(3)));
        let mut c = self
            .endpoint
            .client()?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let id: i64 = redis::cmd("CLIENT").arg("ID").query_async(&mut c).await?;
        Ok((c, id))
    }

    fn cached(&self) -> Option<MultiplexedConnection> {
        self.slot().clone()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ok(&self) {
        self.health.set_redis_ok(true);
    }

    fn failed(&self, operation: &'static str, error: &RedisError) {
        self.metrics
            .redis_errors
            .with_label_values(&[operation])
            .inc();
        self.health.set_redis_ok(false);
        let unreachable = unreachable(error);
        let error = workerpool_queue::connection::describe(error);
        if unreachable {
            *self.slot() = None;
            tracing::warn!(operation, %error, "redis unreachable");
        } else {
            // The server answered: an error reply, or a reply this worker
            // could not read. Reconnecting would not change it.
            tracing::error!(operation, %error, "redis command failed");
        }
        let what = if unreachable {
            "redis unreachable"
        } else {
            "redis command failed"
        };
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(format!("{what} ({operation}): {error}"));
    }

    fn last_error(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "redis unreachable".into())
    }

    /// Runs `op` until it succeeds, reconnecting with backoff, or until
    /// `stop` fires (`None`).
    async fn persist<T, F, Fut>(
        &self,
        operation: &'static str,
        stop: &CancellationToken,
        mut op: F,
    ) -> Option<T>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut backoff = Reconnect::new();
        loop {
            let result = match self.conn().await {
                Ok(c) => op(c).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(v) => {
                    self.ok();
                    return Some(v);
                }
                Err(e) => self.failed(operation, &e),
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay()) => {}
                _ = stop.cancelled() => return None,
            }
        }
    }
}

/// Whether `error` means Redis could not be reached (connection refused,
/// dropped or timed out), as opposed to an answer that was an error.
fn unreachable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
}

/// A job this process has taken and not yet settled, as it sits in the
/// processing list.
struct Held {
    payload: Arc<str>,
    /// Set once the job is stamped and handed to the handler.
    job: Option<Arc<Job>>,
}

/// Everything this process holds, per queue, keyed by a fetch sequence
/// number (lower = taken earlier).
#[derive(Default)]
struct Ledger {
    next: u64,
    queues: Vec<HashMap<u64, Held>>,
}

struct Worker {
    config: Config,
    instance: String,
    queues: Vec<QueueKeys>,
    labels: Vec<String>,
    handler: Arc<dyn Handler>,
    redis: Redis,
    metrics: Metrics,
    health: Arc<Health>,
    ledger: Mutex<Ledger>,
    /// Unix ms of the Redis server minus this host's clock.
    clock_offset_ms: AtomicI64,
    /// Set when a reply may have been lost after Redis moved jobs for us:
    /// the processing lists are then checked against the ledger.
    reconcile: AtomicBool,
    shutdown: Shutdown,
    /// Fires at the shutdown deadline: running attempts are abandoned.
    give_up: CancellationToken,
    /// One permit per job this process may hold.
    slots: Arc<Semaphore>,
    /// The running jobs' tasks.
    tracker: TaskTracker,
}

/// Errors that stop the worker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings are invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
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
            let app = crate::http::app(health.clone(), metrics.clone());
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
    let instance = Instance::new(config.worker_id.clone());
    let queues: Vec<_> = config.queues.iter().map(QueueKeys::new).collect();
    let worker = Arc::new(Worker {
        instance: instance.name(),
        labels: config.queues.clone(),
        ledger: Mutex::new(Ledger {
            next: 0,
            queues: queues.iter().map(|_| HashMap::new()).collect(),
        }),
        queues,
        handler,
        redis: Redis {
            endpoint,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            health: health.clone(),
            metrics: metrics.clone(),
            last_error: Mutex::new(None),
        },
        metrics,
        health: health.clone(),
        clock_offset_ms: AtomicI64::new(0),
        reconcile: AtomicBool::new(false),
        shutdown: shutdown.clone(),
        give_up: CancellationToken::new(),
        slots: Arc::new(Semaphore::new(config.concurrency)),
        tracker: TaskTracker::new(),
        config,
    });
    tracing::info!(
        instance = %worker.instance,
        queues = ?worker.labels,
        concurrency = worker.config.concurrency,
        "worker starting"
    );

    let stop_maintenance = CancellationToken::new();
    if worker.start().await {
        health.set_registered();
        tracing::info!("worker ready");
        let maintenance = tokio::spawn(worker.clone().maintain(stop_maintenance.clone()));

        worker.clone().fetch_loop().await;
        health.fetch_loop_ended();
        worker.drain().await;
        stop_maintenance.cancel();
        let _ = maintenance.await;
    }
    health.set_draining();
    stop_http.cancel();
    if let Some(http) = http {
        let _ = http.await;
    }
    tracing::info!("worker stopped");
    Ok(())
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

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn beat_details(&self) -> Vec<(&'static str, String)> {
        vec![
            ("id", self.config.worker_id.clone()),
            ("pid", std::process::id().to_string()),
            ("concurrency", self.config.concurrency.to_string()),
            ("in_flight", self.metrics.in_flight.get().to_string()),
            ("queues", self.labels.join(",")),
            // Lets readers (the CLI) tell live workers from lost ones.
            (
                "dead_after_ms",
                self.config.dead_after.as_millis().to_string(),
            ),
            ("version", env!("CARGO_PKG_VERSION").to_string()),
        ]
    }

    /// Returns the jobs of this worker id's earlier incarnations (a
    /// restarted container keeps its pod name) and registers this one.
    /// Keeps trying while Redis is unreachable; `false` if shut down first.
    async fn start(&self) -> bool {
        let ttl = self.config.dead_after * 2;
        let stop = self.shutdown.drain.clone();
        let done = self
            .redis
            .persist("register", &stop, |mut c| async move {
                for q in &self.queues {
                    for (name, _) in queue::workers(&mut c, q).await? {
                        let earlier = name != self.instance
                            && Instance::id_of(&name) == Some(self.config.worker_id.as_str());
                        if earlier && let Some(n) = queue::reap(&mut c, q, &name, None).await? {
                            tracing::info!(queue = q.name(), earlier = %name, jobs = n, "returned the jobs of an earlier incarnation");
                            self.metrics.recovered.with_label_values(&[q.name()]).inc_by(n);
                        }
                    }
                    let beat = queue::heartbeat(&mut c, q, &self.instance, ttl, &self.beat_details()).await?;
                    self.note_server_time(beat.server_time_ms);
                }
                Ok(())
            })
            .await;
        done.is_some()
    }

    /// Heartbeats, promotes due retries and delayed jobs, returns the jobs
    /// of lost workers; until `stop`.
    async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let ttl = self.config.dead_after * 2;
        let tick = self.config.heartbeat_interval.min(PROMOTE_EVERY);
        let mut last_beat: Option<Instant> = None;
        loop {
            self.health.tick();
            let beat =
                last_beat.is_none_or(|t| t.elapsed() + tick / 2 >= self.config.heartbeat_interval);
            match self.maintenance_round(ttl, beat).await {
                Ok(()) if beat => last_beat = Some(Instant::now()),
                Ok(()) => {}
                Err(e) => self.redis.failed("maintenance", &e),
            }
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Promotes due jobs; with `beat`, also heartbeats and reaps.
    async fn maintenance_round(&self, ttl: Duration, beat: bool) -> RedisResult<()> {
        let mut c = self.redis.conn().await?;
        for q in &self.queues {
            let promoted = queue::promote_due(&mut c, q, 1000).await?;
            if promoted > 0 {
                tracing::debug!(queue = q.name(), promoted, "due jobs promoted");
            }
        }
        self.redis.ok();
        if !beat {
            return Ok(());
        }
        let details = self.beat_details();
        for q in &self.queues {
            let beat = queue::heartbeat(&mut c, q, &self.instance, ttl, &details).await?;
            self.note_server_time(beat.server_time_ms);
            if beat.registered_anew {
                tracing::warn!(
                    queue = q.name(),
                    "this worker was taken for lost and its jobs were returned to the queue; re-registered"
                );
                self.reconcile.store(true, Ordering::Relaxed);
            }
        }
        for q in &self.queues {
            let cutoff = self
                .now_ms()
                .saturating_sub(self.config.dead_after.as_millis() as u64);
            for lost in queue::silent_workers(&mut c, q, cutoff).await? {
                if lost == self.instance {
                    continue;
                }
                if let Some(n) = queue::reap(&mut c, q, &lost, Some(self.config.dead_after)).await?
                {
                    tracing::warn!(queue = q.name(), lost = %lost, jobs = n, "worker lost; its jobs are back at the head of the queue");
                    self.metrics
                        .recovered
                        .with_label_values(&[q.name()])
                        .inc_by(n);
                }
            }
        }
        Ok(())
    }

    /// Takes jobs while slots are free, until the drain starts.
    async fn fetch_loop(self: Arc<Self>) {
        let slots = &self.slots;
        let drain = self.shutdown.drain.clone();
        let mut blockers: Vec<Option<(MultiplexedConnection, i64)>> =
            self.queues.iter().map(|_| None).collect();
        let mut backoff = Reconnect::new();
        loop {
            let first = tokio::select! {
                biased;
                _ = drain.cancelled() => break,
                permit = slots.clone().acquire_owned() => permit.expect("the slot semaphore is never closed"),
            };
            let mut permits = vec![first];
            while permits.len() < MAX_BATCH {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let round = self.fetch_round(&mut permits, &mut blockers).await;
            match round {
                Ok(()) => backoff.reset(),
                Err((operation, e)) => {
                    self.redis.failed(operation, &e);
                    drop(permits);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                        _ = drain.cancelled() => break,
                    }
                }
            }
        }
    }

    async fn fetch_round(
        self: &Arc<Self>,
        permits: &mut Vec<OwnedSemaphorePermit>,
        blockers: &mut [Option<(MultiplexedConnection, i64)>],
    ) -> Result<(), (&'static str, RedisError)> {
        if self.reconcile.swap(false, Ordering::Relaxed)
            && let Err(e) = self.reconcile().await
        {
            self.reconcile.store(true, Ordering::Relaxed);
            return Err(("reconcile", e));
        }
        let mut c = self.redis.conn().await.map_err(|e| ("connect", e))?;
        let started = Instant::now();
        let fetched = match queue::fetch(&mut c, &self.queues, &self.instance, permits.len()).await
        {
            Ok(f) => f,
            Err(e) => {
                // The script may have moved jobs before the reply was lost.
                self.reconcile.store(true, Ordering::Relaxed);
                return Err(("fetch", e));
            }
        };
        self.redis.ok();
        if !fetched.is_empty() {
            self.metrics
                .fetch_duration
                .observe(started.elapsed().as_secs_f64());
            self.dispatch(fetched, permits).await;
            return Ok(());
        }
        permits.truncate(1);
        let arrived = self.wait_for_jobs(blockers).await?;
        self.dispatch(arrived, permits).await;
        Ok(())
    }

    /// Blocks on every queue at once (one connection each) until a job
    /// arrives or the wait times out; when one queue delivers, the others
    /// are unblocked, and everything they delivered meanwhile is returned.
    async fn wait_for_jobs(
        &self,
        blockers: &mut [Option<(MultiplexedConnection, i64)>],
    ) -> Result<Vec<(usize, Payload)>, (&'static str, RedisError)> {
        for b in blockers.iter_mut() {
            if b.is_none() {
                *b = Some(
                    self.redis
                        .blocking_conn()
                        .await
                        .map_err(|e| ("connect", e))?,
                );
            }
        }
        let ids: Vec<i64> = blockers.iter().flatten().map(|(_, id)| *id).collect();
        let drain = self.shutdown.drain.clone();
        let mut waits: FuturesUnordered<_> = blockers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, b)| b.as_mut().map(|(c, _)| (i, c)))
            .map(|(i, c)| {
                let q = &self.queues[i];
                let instance = self.instance.as_str();
                async move { (i, queue::wait_for_job(c, q, instance, BLOCK).await) }
            })
            .collect();
        let mut arrived = Vec::new();
        let mut broken = Vec::new();
        let mut unblocked = false;
        loop {
            tokio::select! {
                next = waits.next() => match next {
                    None => break,
                    Some((i, Ok(Some(job)))) => {
                        arrived.push((i, job));
                        if !unblocked && ids.len() > 1 {
                            unblocked = true;
                            self.unblock(&ids).await;
                        }
                    }
                    Some((_, Ok(None))) => {}
                    Some((i, Err(e))) => {
                        self.redis.failed("wait", &e);
                        self.reconcile.store(true, Ordering::Relaxed);
                        broken.push(i);
                    }
                },
                _ = drain.cancelled(), if !unblocked => {
                    unblocked = true;
                    self.unblock(&ids).await;
                }
            }
        }
        drop(waits);
        for i in broken {
            blockers[i] = None;
        }
        Ok(arrived)
    }

    async fn unblock(&self, ids: &[i64]) {
        let Ok(mut c) = self.redis.conn().await else {
            return;
        };
        for id in ids {
            let unblocked: RedisResult<i64> = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(id)
                .query_async(&mut c)
                .await;
            if let Err(e) = unblocked {
                // The blocked command then ends at its own timeout instead.
                tracing::debug!(error = %e, "client unblock failed");
            }
        }
    }

    /// Stamps, schedules or dead-letters freshly fetched payloads and starts
    /// a task for each job to run, one slot each.
    async fn dispatch(
        self: &Arc<Self>,
        fetched: Vec<(usize, Payload)>,
        permits: &mut Vec<OwnedSemaphorePermit>,
    ) {
        if fetched.is_empty() {
            return;
        }
        let now = self.now_ms();
        let mut by_queue: Vec<Vec<Payload>> = self.queues.iter().map(|_| Vec::new()).collect();
        for (i, raw) in fetched {
            by_queue[i].push(raw);
        }
        for (qi, raws) in by_queue.into_iter().enumerate() {
            if raws.is_empty() {
                continue;
            }
            let q = &self.queues[qi];
            let mut actions = Vec::with_capacity(raws.len());
            let mut runs = Vec::with_capacity(raws.len());
            let mut back = Vec::new();
            for raw in raws {
                match intake(&raw, now, self.config.max_attempts, &self.instance) {
                    Intake::Run { job, stamped } => {
                        let permit = permits
                            .pop()
                            .or_else(|| self.slots.clone().try_acquire_owned().ok());
                        match permit {
                            Some(permit) => {
                                runs.push(Some((
                                    Arc::new(job),
                                    Arc::<str>::from(stamped.as_str()),
                                    permit,
                                )));
                                actions.push(IntakeAction::Run { raw, stamped });
                            }
                            // More arrived at once than slots are free.
                            None => back.push(raw),
                        }
                    }
                    Intake::Schedule { run_at } => {
                        runs.push(None);
                        actions.push(IntakeAction::Schedule { raw, run_at });
                    }
                    Intake::Dead(letter) => {
                        runs.push(None);
                        self.log_dead(qi, &letter);
                        actions.push(IntakeAction::Dead {
                            raw,
                            envelope: letter.to_json(),
                        });
                    }
                }
            }
            if !back.is_empty() {
                let pairs: Vec<(&[u8], &[u8])> = back
                    .iter()
                    .rev()
                    .map(|r| (r.as_slice(), r.as_slice()))
                    .collect();
                let returned = match self.redis.conn().await {
                    Ok(mut c) => queue::give_back(&mut c, q, &self.instance, &pairs).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = returned {
                    self.redis.failed("give_back", &e);
                    self.reconcile.store(true, Ordering::Relaxed);
                }
            }
            let settled = match self.redis.conn().await {
                Ok(mut c) => queue::settle_intake(&mut c, q, &self.instance, &actions).await,
                Err(e) => Err(e),
            };
            let settled = match settled {
                Ok(s) => s,
                Err(e) => {
                    // Unknown whether the script ran: the processing list is
                    // checked against the ledger on the next round.
                    self.redis.failed("settle_intake", &e);
                    self.reconcile.store(true, Ordering::Relaxed);
                    continue;
                }
            };
            for ((action, run), kept) in actions.iter().zip(runs).zip(settled) {
                match (action, run) {
                    (IntakeAction::Run { .. }, Some((job, stamped, permit))) if kept => {
                        let seq = {
                            let mut ledger = self.ledger();
                            let seq = ledger.next;
                            ledger.next += 1;
                            ledger.queues[qi].insert(
                                seq,
                                Held {
                                    payload: stamped.clone(),
                                    job: Some(job.clone()),
                                },
                            );
                            seq
                        };
                        self.tracker
                            .spawn(self.clone().run_job(qi, seq, job, stamped, permit));
                    }
                    (IntakeAction::Schedule { .. }, _) if kept => {
                        self.metrics
                            .jobs
                            .with_label_values(&[q.name(), "scheduled"])
                            .inc();
                    }
                    (IntakeAction::Dead { .. }, _) if kept => {
                        self.metrics
                            .jobs
                            .with_label_values(&[q.name(), "dead"])
                            .inc();
                    }
                    _ => {}
                }
            }
        }
    }

    /// One attempt at one job, then its settlement. Holds its slot until
    /// the outcome is recorded in Redis.
    async fn run_job(
        self: Arc<Self>,
        qi: usize,
        seq: u64,
        job: Arc<Job>,
        stamped: Arc<str>,
        permit: OwnedSemaphorePermit,
    ) {
        let _slot = permit;
        let queue = self.labels[qi].as_str();
        self.metrics.in_flight.inc();
        let started = Instant::now();
        let outcome = tokio::select! {
            biased;
            _ = self.give_up.cancelled() => None,
            result = tokio::time::timeout(self.config.job_timeout, self.handler.handle(&job)) => Some(
                result.unwrap_or_else(|_| Outcome::retry(format!(
                    "timed out after {}",
                    humantime::format_duration(self.config.job_timeout)
                ))),
            ),
        };
        self.metrics.in_flight.dec();
        // Abandoned at the shutdown deadline: the drain gives it back.
        let Some(outcome) = outcome else { return };
        self.metrics
            .job_duration
            .with_label_values(&[queue])
            .observe(started.elapsed().as_secs_f64());
        if outcome == Outcome::Done && self.config.concurrency == 1 && !self.shutdown.is_draining()
        {
            // With one slot there is nothing to batch: complete and take the
            // next job in one round trip, so a busy queue costs two round
            // trips per job instead of three. With more slots the fetch loop
            // takes freed slots' jobs in batches, which costs Redis less.
            if let Some(next) = self.ack_and_take(qi, &job, &stamped).await {
                self.ledger().queues[qi].remove(&seq);
                if let Some(next) = next {
                    self.clone().dispatch_into(next, _slot).await;
                }
                return;
            }
        }
        self.settle(qi, &job, &stamped, outcome).await;
        self.ledger().queues[qi].remove(&seq);
    }

    /// Starts a job taken into a slot a finished job freed. Boxed as a
    /// `Send` future: it spawns `run_job`, which awaits it.
    fn dispatch_into(
        self: Arc<Self>,
        next: (usize, Payload),
        slot: OwnedSemaphorePermit,
    ) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut permits = vec![slot];
            self.dispatch(vec![next], &mut permits).await;
        })
    }

    /// Completes a job and takes the next into its slot. `None` when Redis
    /// failed: the caller settles the job the ordinary way, and the
    /// processing list is checked in case a job was moved before the reply
    /// was lost.
    async fn ack_and_take(
        &self,
        qi: usize,
        job: &Job,
        stamped: &str,
    ) -> Option<Option<(usize, Payload)>> {
        let result = match self.redis.conn().await {
            Ok(mut c) => {
                queue::ack_and_take(&mut c, &self.queues, qi, &self.instance, stamped.as_bytes())
                    .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok((kept, next)) => {
                self.redis.ok();
                self.record(qi, job, "done", Some(kept));
                Some(next)
            }
            Err(e) => {
                self.redis.failed("ack", &e);
                self.reconcile.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    async fn settle(&self, qi: usize, job: &Job, stamped: &str, outcome: Outcome) {
        let q = &self.queues[qi];
        let queue = q.name();
        let stop = self.give_up.clone();
        let (label, kept) = match outcome {
            Outcome::Done => {
                let kept = self
                    .redis
                    .persist("ack", &stop, |mut c| async move {
                        queue::ack(&mut c, q, &self.instance, stamped.as_bytes()).await
                    })
                    .await;
                ("done", kept)
            }
            Outcome::Failed { error, retry }
                if retry && job.attempt() < self.config.max_attempts =>
            {
                let delay = backoff::retry_delay(
                    job.attempt(),
                    self.config.backoff_base,
                    self.config.backoff_max,
                    &mut rand::rng(),
                );
                tracing::info!(queue, id = job.id(), attempt = job.attempt(), %error, retry_in = ?delay, "attempt failed");
                let next = job.failed(&error);
                let next = next.as_str();
                let kept = self
                    .redis
                    .persist("retry", &stop, |mut c| async move {
                        let held = stamped.as_bytes();
                        queue::retry_later(&mut c, q, &self.instance, held, next, delay).await
                    })
                    .await;
                ("retried", kept)
            }
            Outcome::Failed { error, retry } => {
                let letter = DeadLetter {
                    reason: if retry {
                        DeadReason::Exhausted
                    } else {
                        DeadReason::Permanent
                    },
                    error,
                    attempts: job.attempt(),
                    died_at: self.now_ms(),
                    worker: self.instance.clone(),
                    job: serde_json::Value::Object(job.fields().clone()),
                    encoding: None,
                };
                self.log_dead(qi, &letter);
                let envelope = letter.to_json();
                let envelope = envelope.as_str();
                let kept = self
                    .redis
                    .persist("bury", &stop, |mut c| async move {
                        queue::bury(&mut c, q, &self.instance, stamped.as_bytes(), envelope).await
                    })
                    .await;
                ("dead", kept)
            }
        };
        self.record(qi, job, label, kept);
    }

    /// Counts a settlement: `Some(false)` when a reaper had already returned
    /// the job, `None` when Redis could not be reached before the deadline.
    fn record(&self, qi: usize, job: &Job, label: &str, kept: Option<bool>) {
        let queue = self.labels[qi].as_str();
        match kept {
            Some(true) => self.metrics.jobs.with_label_values(&[queue, label]).inc(),
            Some(false) => {
                self.metrics.stale_acks.with_label_values(&[queue]).inc();
                tracing::warn!(
                    queue,
                    id = job.id(),
                    "job was already returned to the queue by a reaper; not settled twice"
                );
            }
            // Shutdown deadline while Redis was unreachable: the job stays in
            // the processing list and is recovered by the next incarnation.
            None => {}
        }
    }

    fn log_dead(&self, qi: usize, letter: &DeadLetter) {
        let queue = self.labels[qi].as_str();
        self.metrics
            .dead_letters
            .with_label_values(&[queue, letter.reason.as_str()])
            .inc();
        tracing::warn!(queue, reason = letter.reason.as_str(), error = %letter.error, attempts = letter.attempts, "job dead-lettered");
    }

    /// Gives back whatever the processing lists hold beyond the ledger: jobs
    /// Redis moved for us while the reply was lost.
    async fn reconcile(&self) -> RedisResult<()> {
        let mut c = self.redis.conn().await?;
        for (qi, q) in self.queues.iter().enumerate() {
            let listed = queue::processing(&mut c, q, &self.instance).await?;
            let held: Vec<Arc<str>> = self.ledger().queues[qi]
                .values()
                .map(|h| h.payload.clone())
                .collect();
            let mut known: HashMap<&[u8], usize> = HashMap::new();
            for payload in &held {
                *known.entry(payload.as_bytes()).or_default() += 1;
            }
            let mut extra = Vec::new();
            for payload in &listed {
                match known.get_mut(payload.as_slice()) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => extra.push(payload.as_slice()),
                }
            }
            // The list is newest first; the oldest goes back last, to the very head.
            let pairs: Vec<(&[u8], &[u8])> = extra.iter().map(|p| (*p, *p)).collect();
            let n = queue::give_back(&mut c, q, &self.instance, &pairs).await?;
            if n > 0 {
                tracing::warn!(
                    queue = q.name(),
                    jobs = n,
                    "returned jobs moved for this worker whose replies were lost"
                );
            }
        }
        Ok(())
    }

    /// Lets in-flight jobs finish until the shutdown timeout (or a second
    /// signal), then gives every unfinished job back to the head of its
    /// queue without counting the attempt, and leaves the registry.
    async fn drain(&self) {
        let tracker = &self.tracker;
        self.health.set_draining();
        let running = self.metrics.in_flight.get();
        tracing::info!(running, timeout = ?self.config.shutdown_timeout, "draining");
        tracker.close();
        tokio::select! {
            _ = tracker.wait() => {}
            _ = tokio::time::sleep(self.config.shutdown_timeout) => {
                tracing::warn!("shutdown timeout reached; returning unfinished jobs to the queue");
            }
            _ = self.shutdown.now.cancelled() => {}
        }
        self.give_up.cancel();
        tracker.wait().await;

        let window = CancellationToken::new();
        let timer = {
            let window = window.clone();
            tokio::spawn(async move {
                tokio::time::sleep(GIVE_BACK_WINDOW).await;
                window.cancel();
            })
        };
        for (qi, q) in self.queues.iter().enumerate() {
            let unfinished: HashMap<Arc<str>, Arc<Job>> = self.ledger().queues[qi]
                .values()
                .filter_map(|h| h.job.clone().map(|j| (h.payload.clone(), j)))
                .collect();
            let returned = self
                .redis
                .persist("give_back", &window, |mut c| {
                    let unfinished = &unfinished;
                    async move {
                        let listed = queue::processing(&mut c, q, &self.instance).await?;
                        // Only jobs this process started are pushed changed;
                        // anything else (even bytes that are no job) goes
                        // back exactly as it was.
                        let pushed: Vec<Payload> = listed
                            .iter()
                            .map(|p| {
                                std::str::from_utf8(p)
                                    .ok()
                                    .and_then(|p| unfinished.get(p))
                                    .map_or_else(|| p.clone(), |j| j.unstarted().into_bytes())
                            })
                            .collect();
                        let pairs: Vec<(&[u8], &[u8])> = listed
                            .iter()
                            .map(Vec::as_slice)
                            .zip(pushed.iter().map(Vec::as_slice))
                            .collect();
                        let n = queue::give_back(&mut c, q, &self.instance, &pairs).await?;
                        queue::deregister(&mut c, q, &self.instance).await?;
                        Ok(n)
                    }
                })
                .await;
            match returned {
                Some(n) => {
                    if n > 0 {
                        tracing::info!(
                            queue = q.name(),
                            jobs = n,
                            "unfinished jobs returned to the head of the queue"
                        );
                    }
                    self.metrics
                        .jobs
                        .with_label_values(&[q.name(), "requeued"])
                        .inc_by(n as u64);
                }
                None => tracing::error!(
                    queue = q.name(),
                    error = %self.redis.last_error(),
                    "could not return unfinished jobs at shutdown: they stay in this worker's processing list and are recovered when it is taken for lost or restarts"
                ),
            }
        }
        timer.abort();
    }
}
