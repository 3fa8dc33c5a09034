//! `workerpool-operator local`: a WorkerPool manifest run on this machine.
//!
//! The same manifest as in a cluster, the same validation, the same scaling
//! engine; the actuator is worker processes instead of a Deployment. Each
//! refresh reads the queue in one round trip; every `pollIntervalSeconds`
//! the engine decides and the actuator starts or stops workers. SIGINT,
//! SIGTERM, SIGHUP (the terminal closed) or SIGQUIT stops every worker
//! gracefully and prints a summary.

pub mod actuator;
pub mod dashboard;
pub mod manifest;
pub mod schedules;
pub mod view;

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;
use workerpool_queue::connection::{Connection, Endpoint, Tls, redact};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::snapshot::{self, Snapshot};

use crate::scaling::{self, Engine, Observation};
use actuator::{Actuator, WorkerCommand};
use view::{Frame, QueueLine, Summary, View};

/// How often the view and the actuator refresh (the engine decides every
/// `pollIntervalSeconds`, on the refresh that comes closest).
const REFRESH: Duration = Duration::from_secs(1);
/// How long one queue read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(3);
/// The name of the worker binary.
pub const WORKER_BIN: &str = "workerpool-worker";

/// Settings of `workerpool-operator local`.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalArgs {
    /// The WorkerPool manifest (YAML), the one you would `kubectl apply -f`.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// Redis URL to use instead of spec.queue.redis.url (needed when the
    /// manifest uses urlSecretRef). Unlike the worker's, not read from
    /// WORKERPOOL_REDIS_URL: the manifest's URL wins over the environment.
    /// Local mode reads no Secrets: --redis-ca-file, --redis-client-cert
    /// and --redis-client-key stand in for those of spec.queue.redis.tls.
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
    /// The workerpool-worker executable (default: the one next to this
    /// program, else the one on PATH).
    #[arg(long, value_name = "PATH")]
    pub worker_bin: Option<PathBuf>,
    /// The WorkerPool to run when the file holds several.
    #[arg(long, value_name = "NAME")]
    pub pool: Option<String>,
    /// Print log lines even when stdout is a terminal.
    #[arg(long)]
    pub plain: bool,
    /// The TLS files, in place of the Secrets of spec.queue.redis.tls.
    #[command(flatten)]
    pub tls_files: workerpool_settings::TlsFiles,
    /// The web dashboard of the pool and its queues.
    #[command(flatten)]
    pub dashboard: dashboard::DashboardArgs,
}

/// Why local mode could not run, named after what failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The manifest cannot be read.
    #[error("reading {path}: {source}")]
    ReadManifest {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is not a valid WorkerPool.
    #[error("{path}: {message}")]
    InvalidManifest {
        /// The file.
        path: String,
        /// One line naming the field.
        message: String,
    },
    /// The manifest takes the URL from a Secret and none was given.
    #[error(
        "spec.queue.redis.urlSecretRef names a Secret, which local mode cannot read: pass --redis-url URL"
    )]
    NoRedisUrl,
    /// The Redis URL or the TLS settings cannot be used.
    #[error(transparent)]
    InvalidRedis(#[from] workerpool_queue::connection::EndpointError),
    /// The manifest takes TLS material from a Secret and no file was given.
    #[error("{field} names a Secret, which local mode cannot read: pass {flag} FILE")]
    TlsFileNeeded {
        /// The field of the manifest.
        field: &'static str,
        /// The flag that stands in for it.
        flag: &'static str,
    },
    /// Redis is a cluster and the pool's queue names cannot share a slot.
    #[error("spec.queue.redis: {0}")]
    ClusterNaming(String),
    /// Redis did not answer at start.
    #[error("cannot reach Redis at {url}: {source}")]
    RedisUnreachable {
        /// The URL, password hidden.
        url: String,
        /// Why.
        #[source]
        source: redis::RedisError,
    },
    /// No worker executable.
    #[error(
        "cannot find {WORKER_BIN}: pass --worker-bin PATH, or put it next to this program or on PATH (cargo build -p workerpool-worker)"
    )]
    WorkerBinaryNotFound,
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// The dashboard cannot be served as asked.
    #[error("{0}")]
    Dashboard(String),
}

/// Runs the manifest at `args.file` until SIGINT, SIGTERM, SIGHUP or
/// SIGQUIT, then stops the workers and prints the summary.
pub async fn run(args: LocalArgs) -> Result<Summary, Error> {
    let started = Instant::now();
    let path = args.file.display().to_string();
    let text = std::fs::read_to_string(&args.file).map_err(|source| Error::ReadManifest {
        path: path.clone(),
        source,
    })?;
    let pool =
        manifest::parse(&text, args.pool.as_deref()).map_err(|message| Error::InvalidManifest {
            path: path.clone(),
            message,
        })?;
    let schedules =
        crate::schedule::parse_all(&pool).map_err(|problems| Error::InvalidManifest {
            path: path.clone(),
            message: problems.join("; "),
        })?;
    let container = manifest::worker_container(&pool).ok_or_else(|| Error::InvalidManifest {
        path: path.clone(),
        message: crate::deployment::BuildError::NoWorkerContainer.to_string(),
    })?;
    let url = match (&args.redis_url, &pool.spec.queue.redis.url) {
        (Some(url), _) | (None, Some(url)) => url.clone(),
        (None, None) => return Err(Error::NoRedisUrl),
    };
    let shown_url = redact(&url);
    let tls = local_tls(&pool, &args)?;
    let endpoint = Endpoint::new(url.clone(), tls.clone())?
        .with_mode(pool.spec.queue.redis.mode.unwrap_or_default().into())?;
    let program = worker_binary(args.worker_bin.as_deref())?;
    let queues = pool.spec.queue.redis.queue_keys();

    let mut redis = Redis::open(endpoint.clone());
    let unreachable = |source| Error::RedisUnreachable {
        url: shown_url.clone(),
        source,
    };
    if redis.is_cluster().await.map_err(unreachable)?
        && let Some(problem) = workerpool_queue::keys::cluster_problem(&queues)
    {
        return Err(Error::ClusterNaming(problem));
    }
    let first = redis
        .read(&queues)
        .await
        .map_err(|source| Error::RedisUnreachable {
            url: shown_url.clone(),
            source,
        })?;
    let baseline = first.counts();
    let evicting = match queues.first() {
        Some(q) => redis.eviction_warning(q).await,
        None => None,
    };
    let mut schedules = schedules::Schedules::start(&pool, schedules, endpoint.clone()).await;

    let mut stop = StopSignals::install().map_err(Error::Signals)?;

    let name = pool.metadata.name.clone().unwrap_or_default();
    let (command, mut notes) = WorkerCommand::for_pool(&pool, container, program, &url, &tls);
    notes.extend(evicting.map(|w| format!("warning: {w}")));
    let grace = Duration::from_secs(pool.spec.shutdown.grace_period_seconds.max(1) as u64);
    let (log_tx, mut log_rx) = mpsc::unbounded_channel();
    let mut actuator = Actuator::new(command, grace, log_tx);
    let terminal = !args.plain && std::io::stdout().is_terminal();
    let queue_names = pool.spec.queue.redis.queue_names().join(", ");
    let mut view = View::new(
        terminal,
        format!("workerpool local: pool {name}, queue {queue_names} on {shown_url} (Ctrl-C stops)"),
    );
    let elapsed = || started.elapsed();
    for note in &notes {
        view.note(elapsed(), note);
    }
    let shown_pool = std::sync::Arc::new(dashboard::LocalPool::new(&pool));
    if args.dashboard.dashboard.is_some() {
        let conn = endpoint
            .connect(READ_TIMEOUT, READ_TIMEOUT)
            .await
            .map_err(unreachable)?;
        let served = args
            .dashboard
            .start(conn, queues.clone(), shown_url.clone(), shown_pool.clone())
            .await
            .map_err(Error::Dashboard)?;
        if let Some(addr) = served {
            view.note(elapsed(), &format!("dashboard on http://{addr}/"));
        }
    }

    let poll = pool.spec.scaling.as_ref().map_or(REFRESH, |s| {
        Duration::from_secs(s.poll_interval_seconds.max(1) as u64)
    });
    let mut engine = Engine::new();
    let mut rate = Rate::default();
    let mut cadence = Cadence::new(poll);
    let mut decided = (
        0i32,
        String::from("Starting"),
        String::from("no decision yet"),
    );
    let mut peak = 0usize;
    let mut reading: Result<Snapshot, String> = Ok(first);
    let mut was_reachable = true;
    let mut refresh = tokio::time::interval(REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The next look at the schedules: one at once, then at each fire.
    let fire = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(fire);

    loop {
        tokio::select! {
            _ = refresh.tick() => {}
            _ = stop.recv() => break,
            Some(line) = log_rx.recv() => {
                view.worker_output(&line.id, &line.line);
                continue;
            }
            // A fire is enqueued at its time; the next refresh reads it.
            _ = &mut fire, if !schedules.is_empty() => {
                let now = jiff::Timestamp::now();
                for note in schedules.run(now).await {
                    view.note(elapsed(), &note);
                }
                let wait = schedules.wait(jiff::Timestamp::now());
                fire.as_mut().reset(tokio::time::Instant::now() + wait);
                continue;
            }
        }
        let now = Instant::now();
        for event in actuator.poll(now) {
            view.note(elapsed(), &event.to_string());
        }
        reading = redis.read(&queues).await.map_err(|e| e.to_string());
        match (&reading, was_reachable) {
            (Err(e), true) => view.note(
                elapsed(),
                &format!("cannot read the queue: {e}; holding the pool and retrying"),
            ),
            (Ok(_), false) => view.note(elapsed(), "queue readable again"),
            _ => {}
        }
        was_reachable = reading.is_ok();
        // The live workers' jobs in hand, by worker id: who is ready, and
        // who stops last.
        let activity = reading
            .as_ref()
            .map(Snapshot::activity_by_worker_id)
            .unwrap_or_default();
        // Ready: a running worker whose heartbeat the queue holds.
        let ready = |actuator: &Actuator| {
            let ready = actuator
                .running_ids()
                .iter()
                .filter(|id| activity.contains_key(*id))
                .count();
            i32::try_from(ready).unwrap_or(i32::MAX)
        };

        if cadence.due(now) {
            let current = i32::try_from(actuator.replicas()).unwrap_or(i32::MAX);
            let observed = reading
                .as_ref()
                .ok()
                .map(|snap| Observation::from_counts(&snap.counts(), current, ready(&actuator)));
            let decided_at = started.elapsed();
            let verdict = scaling::decide(
                engine.with_workers(scaling::Workers::new(
                    pool.spec.worker.rate_limit.as_deref(),
                    pool.spec.worker.concurrency,
                )),
                pool.spec.scaling.as_ref(),
                pool.spec.replicas,
                observed.as_ref(),
                current,
                decided_at,
            );
            let message = verdict.message();
            if verdict.desired != current {
                view.note(
                    elapsed(),
                    &format!("scaling from {current} to {}: {message}", verdict.desired),
                );
            }
            for event in actuator.scale_to(verdict.desired.max(0) as usize, &activity, now) {
                view.note(elapsed(), &event.to_string());
            }
            let applied = i32::try_from(actuator.replicas()).unwrap_or(i32::MAX);
            if applied != current {
                engine.applied(decided_at, current, applied);
            }
            decided = (verdict.desired, verdict.code().to_string(), message);
        }
        peak = peak.max(actuator.running());
        shown_pool.update(
            decided.0,
            ready(&actuator),
            format!("{}: {}", decided.1, decided.2),
        );
        let queue = reading.as_ref().map(|snap| {
            let counts = snap.counts();
            QueueLine {
                done: counts
                    .processed_total
                    .saturating_sub(baseline.processed_total),
                jobs_per_second: rate.update(started.elapsed(), counts.processed_total),
                counts,
            }
        });
        view.frame(Frame {
            elapsed: elapsed(),
            queue: queue.map_err(Clone::clone),
            running: actuator.running(),
            draining: actuator.draining(),
            desired: decided.0,
            reason: decided.1.clone(),
            reason_message: decided.2.clone(),
        });
    }

    // Stop every worker as a pod deletion would: SIGTERM, SIGKILL after the
    // grace period. A second signal makes the workers return their
    // unfinished jobs to the queue at once.
    let busy = reading
        .as_ref()
        .map(Snapshot::activity_by_worker_id)
        .unwrap_or_default();
    view.note(
        elapsed(),
        &format!(
            "stopping the pool: {} workers (grace period {}s; Ctrl-C again to return their jobs to the queue now)",
            actuator.running() + actuator.draining(),
            grace.as_secs()
        ),
    );
    for event in actuator.stop_all(&busy, Instant::now()) {
        view.note(elapsed(), &event.to_string());
    }
    let mut hurried = false;
    while !actuator.is_empty() {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stop.recv(), if !hurried => { hurried = true; actuator.hurry(); }
            Some(line) = log_rx.recv() => view.worker_output(&line.id, &line.line),
        }
        for event in actuator.poll(Instant::now()) {
            view.note(elapsed(), &event.to_string());
        }
    }
    while let Ok(line) = log_rx.try_recv() {
        view.worker_output(&line.id, &line.line);
    }
    let end = redis.read(&queues).await.ok().map(|s| s.counts());
    let summary = Summary {
        done: end
            .as_ref()
            .map(|c| c.processed_total.saturating_sub(baseline.processed_total)),
        dead: end.as_ref().map(|c| c.dead.saturating_sub(baseline.dead)),
        left: end.as_ref().map(|c| c.backlog() + c.held()),
        peak_workers: peak,
        wall: started.elapsed(),
    };
    view.summary(&summary);
    Ok(summary)
}

/// The signals that stop local mode, each as SIGTERM does: Ctrl-C
/// (SIGINT), a process manager (SIGTERM), the terminal closing (SIGHUP) and
/// `kill -QUIT`. Left to their default action, SIGHUP and SIGQUIT would end
/// local mode at once and leave its workers running, in their own process
/// groups, with nobody to stop them.
struct StopSignals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
}

impl StopSignals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// Waits for the next of them.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
            _ = self.quit.recv() => {}
        }
    }
}

/// Finds the worker executable: `explicit`, else next to this program, else on PATH.
pub fn worker_binary(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    if let Some(path) = explicit {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(Error::WorkerBinaryNotFound)
        };
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(WORKER_BIN)))
        .filter(|p| p.is_file());
    let on_path = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(WORKER_BIN))
                .find(|p| p.is_file())
        })
    };
    beside.or_else(on_path).ok_or(Error::WorkerBinaryNotFound)
}

/// The TLS settings of local mode: the manifest's, with files from the
/// command line where the cluster would mount Secrets (made absolute, since
/// workers may run elsewhere).
fn local_tls(pool: &crate::crd::WorkerPool, args: &LocalArgs) -> Result<Tls, Error> {
    let files = &args.tls_files;
    let spec = pool.spec.queue.redis.tls.clone().unwrap_or_default();
    if spec.ca_secret_ref.is_some() && files.redis_ca_file.is_none() {
        return Err(Error::TlsFileNeeded {
            field: "spec.queue.redis.tls.caSecretRef",
            flag: "--redis-ca-file",
        });
    }
    if spec.client_certificate_secret_ref.is_some()
        && (files.redis_client_cert.is_none() || files.redis_client_key.is_none())
    {
        return Err(Error::TlsFileNeeded {
            field: "spec.queue.redis.tls.clientCertificateSecretRef",
            flag: "--redis-client-cert and --redis-client-key",
        });
    }
    let absolute = |p: &Option<PathBuf>| {
        p.as_ref()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
    };
    Ok(Tls {
        ca_file: absolute(&files.redis_ca_file),
        client_cert: absolute(&files.redis_client_cert),
        client_key: absolute(&files.redis_client_key),
        insecure_skip_verify: spec.insecure_skip_verify,
    })
}

/// One Redis connection, opened again after a failed read.
struct Redis {
    endpoint: Endpoint,
    conn: Option<Connection>,
}

impl Redis {
    fn open(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            conn: None,
        }
    }

    /// Whether Redis is a cluster (connecting to ask).
    async fn is_cluster(&mut self) -> redis::RedisResult<bool> {
        let conn = self.endpoint.connect(READ_TIMEOUT, READ_TIMEOUT).await?;
        let cluster = conn.is_cluster();
        self.conn = Some(conn);
        Ok(cluster)
    }

    async fn read(&mut self, queues: &[QueueKeys]) -> redis::RedisResult<Snapshot> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.endpoint.connect(READ_TIMEOUT, READ_TIMEOUT).await?,
        };
        let snap = snapshot::read(&mut conn, queues).await?;
        self.conn = Some(conn);
        Ok(snap)
    }

    /// Why the Redis that holds `queue` may delete jobs, if it may.
    async fn eviction_warning(&mut self, queue: &QueueKeys) -> Option<String> {
        let conn = self.conn.as_mut()?;
        workerpool_queue::memory::read(conn, queue)
            .await
            .unwrap_or_default()
            .warning()
    }
}

/// When the engine decides: every `poll`, on the refresh closest to it.
///
/// Refreshes come every [`REFRESH`], each a little late by however long the
/// task took to wake. Comparing that instant with "the last decision plus
/// `poll`" would skip a refresh whenever it woke up earlier than the one
/// before, so a pool polled every second would decide on only about half of
/// them, and a pool at zero would wake one poll after the first reading that
/// saw its backlog. A decision is due half a refresh early instead.
#[derive(Debug)]
struct Cadence {
    poll: Duration,
    next: Option<Instant>,
}

impl Cadence {
    fn new(poll: Duration) -> Self {
        Cadence { poll, next: None }
    }

    /// Whether the refresh at `now` decides; if so, schedules the next one.
    fn due(&mut self, now: Instant) -> bool {
        if self.next.is_some_and(|next| now + REFRESH / 2 < next) {
            return false;
        }
        self.next = Some(now + self.poll);
        true
    }
}

/// Jobs completed per second over the last few seconds.
#[derive(Debug, Default)]
struct Rate {
    samples: VecDeque<(Duration, u64)>,
}

impl Rate {
    const WINDOW: Duration = Duration::from_secs(5);

    fn update(&mut self, at: Duration, processed: u64) -> Option<f64> {
        if self
            .samples
            .back()
            .is_some_and(|(_, last)| processed < *last)
        {
            self.samples.clear();
        }
        self.samples.push_back((at, processed));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.saturating_sub(*t) > Self::WINDOW)
        {
            self.samples.pop_front();
        }
        let (t0, p0) = *self.samples.front()?;
        let span = at.saturating_sub(t0).as_secs_f64();
        (span > 0.0).then(|| (processed - p0) as f64 / span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refreshes one second apart, each woken a few milliseconds late.
    fn refreshes(start: Instant, lateness_ms: &[u64]) -> Vec<Instant> {
        lateness_ms
            .iter()
            .zip(0u64..)
            .map(|(late, i)| start + Duration::from_secs(i) + Duration::from_millis(*late))
            .collect()
    }

    #[test]
    fn a_pool_polled_every_second_decides_on_every_refresh_however_late_each_wakes() {
        let mut cadence = Cadence::new(Duration::from_secs(1));
        // The second refresh wakes earlier after its tick than the first did:
        // "last decision + 1 s" would not have come yet, and the reading that
        // sees a backlog would wait a poll for its decision.
        let decided: Vec<bool> = refreshes(Instant::now(), &[7, 2, 2, 9, 1])
            .into_iter()
            .map(|at| cadence.due(at))
            .collect();
        assert_eq!(decided, [true; 5]);
    }

    #[test]
    fn a_longer_poll_decides_on_every_nth_refresh() {
        let mut cadence = Cadence::new(Duration::from_secs(5));
        let lateness = [3, 1, 4, 1, 5, 0, 2, 6, 5, 3, 0];
        let decided: Vec<usize> = refreshes(Instant::now(), &lateness)
            .into_iter()
            .enumerate()
            .filter_map(|(i, at)| cadence.due(at).then_some(i))
            .collect();
        assert_eq!(decided, [0, 5, 10]);
    }

    #[test]
    fn the_rate_is_completions_over_the_last_seconds() {
        let mut rate = Rate::default();
        assert_eq!(rate.update(Duration::from_secs(0), 0), None);
        assert_eq!(rate.update(Duration::from_secs(1), 10), Some(10.0));
        assert_eq!(rate.update(Duration::from_secs(2), 30), Some(15.0));
        for t in 3..=10 {
            rate.update(Duration::from_secs(t), 30);
        }
        assert_eq!(rate.update(Duration::from_secs(11), 30), Some(0.0));
        assert_eq!(
            rate.update(Duration::from_secs(12), 5),
            None,
            "a reset starts over"
        );
    }

    #[test]
    fn an_explicit_worker_binary_must_exist() {
        assert!(matches!(
            worker_binary(Some(Path::new("/nonexistent/workerpool-worker"))),
            Err(Error::WorkerBinaryNotFound)
        ));
    }
}
