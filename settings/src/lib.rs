//! The worker's settings, written down once: the `WORKERPOOL_*`
//! environment variable of each (the worker's flags read them, the operator
//! and local mode set them) and the Redis connection flags that the worker
//! and the `workerpool` command share.

pub mod metrics;
pub mod signals;
pub use signals::stop_signal;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use workerpool_queue::connection::{Endpoint, EndpointError, Mode, Tls};

/// The prefix of every worker setting's environment variable. Handler
/// processes get none of them but [`WORKER_ID`].
pub const PREFIX: &str = "WORKERPOOL_";

/// `--redis-url`: the Redis URL (`redis://`, `rediss://`,
/// `redis+sentinel://`, `rediss+sentinel://`).
pub const REDIS_URL: &str = "WORKERPOOL_REDIS_URL";
/// `--redis-mode`: `auto`, `standalone` or `cluster`.
pub const REDIS_MODE: &str = "WORKERPOOL_REDIS_MODE";
/// `--redis-ca-file`: PEM file of the CA that signed Redis's certificate.
pub const REDIS_CA_FILE: &str = "WORKERPOOL_REDIS_CA_FILE";
/// `--redis-client-cert`: PEM file of a client certificate (mutual TLS).
pub const REDIS_CLIENT_CERT: &str = "WORKERPOOL_REDIS_CLIENT_CERT";
/// `--redis-client-key`: PEM file of the client certificate's key.
pub const REDIS_CLIENT_KEY: &str = "WORKERPOOL_REDIS_CLIENT_KEY";
/// `--redis-tls-insecure-skip-verify`: `true` accepts any certificate.
pub const REDIS_TLS_INSECURE_SKIP_VERIFY: &str = "WORKERPOOL_REDIS_TLS_INSECURE_SKIP_VERIFY";
/// `--queue`: the queues in priority order, comma-separated.
pub const QUEUE: &str = "WORKERPOOL_QUEUE";
/// `--concurrency`: jobs run at once in one worker process.
pub const CONCURRENCY: &str = "WORKERPOOL_CONCURRENCY";
/// `--handler`: `exec`, `exec-per-job`, `http`, `noop` or `sleep`.
pub const HANDLER: &str = "WORKERPOOL_HANDLER";
/// `--http-url`: where the http handler POSTs each job.
pub const HTTP_URL: &str = "WORKERPOOL_HTTP_URL";
/// `--max-attempts`: attempts before a job is dead-lettered.
pub const MAX_ATTEMPTS: &str = "WORKERPOOL_MAX_ATTEMPTS";
/// `--max-payload-bytes`: the longest payload a job may have, in bytes.
pub const MAX_PAYLOAD_BYTES: &str = "WORKERPOOL_MAX_PAYLOAD_BYTES";
/// `--backoff-base`: the delay before the second attempt (a duration).
pub const BACKOFF_BASE: &str = "WORKERPOOL_BACKOFF_BASE";
/// `--backoff-max`: the longest retry delay (a duration).
pub const BACKOFF_MAX: &str = "WORKERPOOL_BACKOFF_MAX";
/// `--job-timeout`: the time one attempt may take (a duration).
pub const JOB_TIMEOUT: &str = "WORKERPOOL_JOB_TIMEOUT";
/// `--shutdown-timeout`: the time in-flight jobs get once the drain starts
/// (a duration).
pub const SHUTDOWN_TIMEOUT: &str = "WORKERPOOL_SHUTDOWN_TIMEOUT";
/// `--heartbeat-interval`: the time between heartbeats (a duration).
pub const HEARTBEAT_INTERVAL: &str = "WORKERPOOL_HEARTBEAT_INTERVAL";
/// `--dead-after`: the silence after which a worker counts as lost (a
/// duration).
pub const DEAD_AFTER: &str = "WORKERPOOL_DEAD_AFTER";
/// `--listen`: the address of `/healthz`, `/readyz` and `/metrics`.
pub const LISTEN: &str = "WORKERPOOL_LISTEN";
/// `--worker-id`: the worker's stable id (the pod name in Kubernetes); the
/// one setting handler processes keep.
pub const WORKER_ID: &str = "WORKERPOOL_WORKER_ID";
/// `--rate-limit`: at most N job starts per period on each queue
/// (`N/PERIOD`).
pub const RATE_LIMIT: &str = "WORKERPOOL_RATE_LIMIT";
/// `--require-noeviction`: `true` refuses a Redis that may evict keys.
pub const REQUIRE_NOEVICTION: &str = "WORKERPOOL_REQUIRE_NOEVICTION";
/// `--instance-file`: a file private to this worker's container (a pod's
/// own `emptyDir`) where each process leaves its instance for the next, so
/// a restarted container takes back its previous run's jobs at once.
pub const INSTANCE_FILE: &str = "WORKERPOOL_INSTANCE_FILE";
/// How many exec handler processes share the concurrency's slots (unset:
/// one per slot).
pub const CHILDREN: &str = "WORKERPOOL_CHILDREN";
/// How long the outcome of every job the worker settles is kept, for jobs
/// that do not say (`keep`); unset: only jobs that ask are kept.
pub const KEEP_OUTCOMES: &str = "WORKERPOOL_KEEP_OUTCOMES";
/// Set by the worker in each exec handler process's environment: how many
/// jobs that process holds at once (its share of the slots). Above 1, the
/// process speaks the multiplexed protocol (docs/worker.md).
pub const JOBS_PER_CHILD: &str = "WORKERPOOL_JOBS_PER_CHILD";

/// What the operator sets for each worker of a pool, in a Deployment and in
/// local mode alike; the worker's defaults stand for everything else.
/// [`WorkerSettings::to_env`] writes each in the format the worker's flag
/// reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSettings {
    /// The Redis URL; `None` when the worker gets it another way (a
    /// Deployment takes it from a Secret).
    pub redis_url: Option<String>,
    /// One node or a cluster; `None` leaves the worker asking the server.
    pub redis_mode: Option<Mode>,
    /// The TLS files and the opt-out of verification.
    pub tls: Tls,
    /// The queues in priority order, the first served first.
    pub queues: Vec<String>,
    /// Jobs run at once in each worker.
    pub concurrency: u32,
    /// How many exec handler processes share those slots; `None`: one per
    /// slot, the worker's default.
    pub children: Option<u32>,
    /// How long every settled job's outcome is kept when the job does not
    /// say (`keep`); `None`: only jobs that ask are kept, the worker's
    /// default. Written in whole seconds when it is a whole number of them.
    pub keep_outcomes: Option<Duration>,
    /// Attempts before a job is dead-lettered.
    pub max_attempts: u32,
    /// The longest payload in bytes; `None`: the worker's default.
    pub max_payload_bytes: Option<u64>,
    /// The time one attempt may take (written in whole seconds when it is
    /// a whole number of them).
    pub job_timeout: Duration,
    /// The time in-flight jobs get once the drain starts (written in
    /// milliseconds: it is a share of the pod's grace period).
    pub shutdown_timeout: Duration,
    /// The address of the worker's HTTP endpoints.
    pub listen: SocketAddr,
    /// At most N job starts per period on each queue, as `N/PERIOD`
    /// (`600/1m`); `None`: no limit.
    pub rate_limit: Option<String>,
    /// Where each process of the worker's container leaves its instance
    /// for the next; `None` (local mode, where two processes may share a
    /// worker id) leaves an earlier process's jobs until its heartbeat is
    /// stale.
    pub instance_file: Option<PathBuf>,
}

impl WorkerSettings {
    /// The environment variables of these settings, in a fixed order; an
    /// unset optional setting has none.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(url) = &self.redis_url {
            env.push((REDIS_URL, url.clone()));
        }
        env.extend([
            (QUEUE, self.queues.join(",")),
            (CONCURRENCY, self.concurrency.to_string()),
            (MAX_ATTEMPTS, self.max_attempts.to_string()),
            (JOB_TIMEOUT, duration(self.job_timeout)),
            (
                SHUTDOWN_TIMEOUT,
                format!("{}ms", self.shutdown_timeout.as_millis()),
            ),
            (LISTEN, self.listen.to_string()),
        ]);
        if let Some(mode) = self.redis_mode {
            env.push((REDIS_MODE, mode.to_string()));
        }
        if let Some(children) = self.children {
            env.push((CHILDREN, children.to_string()));
        }
        if let Some(keep) = self.keep_outcomes {
            env.push((KEEP_OUTCOMES, duration(keep)));
        }
        if let Some(rate) = &self.rate_limit {
            env.push((RATE_LIMIT, rate.clone()));
        }
        if let Some(bytes) = self.max_payload_bytes {
            env.push((MAX_PAYLOAD_BYTES, bytes.to_string()));
        }
        let files = [
            (REDIS_CA_FILE, &self.tls.ca_file),
            (REDIS_CLIENT_CERT, &self.tls.client_cert),
            (REDIS_CLIENT_KEY, &self.tls.client_key),
        ];
        for (name, file) in files {
            if let Some(path) = file.as_deref().map(Path::display) {
                env.push((name, path.to_string()));
            }
        }
        if self.tls.insecure_skip_verify {
            env.push((REDIS_TLS_INSECURE_SKIP_VERIFY, "true".into()));
        }
        if let Some(path) = &self.instance_file {
            env.push((INSTANCE_FILE, path.display().to_string()));
        }
        env
    }
}

/// A duration as the worker's flags read it: `120s`, or `1500ms` when it
/// is not a whole number of seconds.
fn duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Where Redis is and how to reach it: the URL, one node or a cluster, and
/// TLS for a `rediss://` URL. Declared once for the worker and every
/// `workerpool` subcommand; a command whose URL has a default sets it with
/// `mut_arg("redis_url", ...)`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RedisArgs {
    /// Redis URL, redis://[user:password@]host[:port][/db], or rediss://
    /// for TLS; through Redis Sentinel,
    /// redis+sentinel://[[user]:password@]host1:26379[,host2:26379]/<primary name>[/<db>]
    /// (rediss+sentinel:// for TLS; docs/redis.md).
    #[arg(long, env = REDIS_URL, value_name = "URL")]
    pub redis_url: Option<String>,
    /// One Redis node or a Redis Cluster; `auto` asks the server (INFO
    /// cluster) at each connection. On a cluster the URL names any node,
    /// and queue names need a hash tag: {mail}, or {mail}:high and
    /// {mail}:low for several queues of one worker.
    #[arg(long, env = REDIS_MODE, value_name = "MODE", default_value = "auto")]
    pub redis_mode: RedisMode,
    /// The TLS files.
    #[command(flatten)]
    pub files: TlsFiles,
    /// Accept any certificate from Redis. Dangerous: anyone on the path can
    /// read and change the jobs; logs a warning at start.
    #[arg(long, env = REDIS_TLS_INSECURE_SKIP_VERIFY)]
    pub redis_tls_insecure_skip_verify: bool,
}

/// The PEM files of TLS to Redis (also local mode's stand-ins for the
/// Secrets a cluster would mount).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsFiles {
    /// PEM file of the CA that signed Redis's certificate, instead of the
    /// system's roots (rediss:// and rediss+sentinel:// only; for the
    /// sentinels and the primary alike).
    #[arg(long, env = REDIS_CA_FILE, value_name = "FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM file of a client certificate for mutual TLS (with
    /// --redis-client-key).
    #[arg(long, env = REDIS_CLIENT_CERT, value_name = "FILE")]
    pub redis_client_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[arg(long, env = REDIS_CLIENT_KEY, value_name = "FILE")]
    pub redis_client_key: Option<PathBuf>,
}

impl RedisArgs {
    /// The TLS options.
    pub fn tls(&self) -> Tls {
        Tls {
            ca_file: self.files.redis_ca_file.clone(),
            client_cert: self.files.redis_client_cert.clone(),
            client_key: self.files.redis_client_key.clone(),
            insecure_skip_verify: self.redis_tls_insecure_skip_verify,
        }
    }

    /// The endpoint for `url` with these options, checked (no I/O).
    pub fn endpoint(&self, url: impl Into<String>) -> Result<Endpoint, EndpointError> {
        Endpoint::new(url, self.tls()).and_then(|e| e.with_mode(self.redis_mode.into()))
    }
}

/// `--redis-mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum RedisMode {
    /// Ask the server.
    #[default]
    Auto,
    /// One node.
    Standalone,
    /// A Redis Cluster.
    Cluster,
}

impl From<RedisMode> for Mode {
    fn from(m: RedisMode) -> Self {
        match m {
            RedisMode::Auto => Mode::Auto,
            RedisMode::Standalone => Mode::Standalone,
            RedisMode::Cluster => Mode::Cluster,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> WorkerSettings {
        WorkerSettings {
            redis_url: None,
            redis_mode: None,
            tls: Tls::default(),
            queues: vec!["high".into(), "low".into()],
            concurrency: 4,
            max_attempts: 3,
            max_payload_bytes: None,
            job_timeout: Duration::from_secs(120),
            shutdown_timeout: Duration::from_millis(55_000),
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            rate_limit: None,
            instance_file: None,
            children: None,
            keep_outcomes: None,
        }
    }

    #[test]
    fn unset_settings_write_no_variable_and_the_rest_keep_their_formats() {
        assert_eq!(
            settings().to_env(),
            [
                (QUEUE, "high,low".to_string()),
                (CONCURRENCY, "4".into()),
                (MAX_ATTEMPTS, "3".into()),
                (JOB_TIMEOUT, "120s".into()),
                (SHUTDOWN_TIMEOUT, "55000ms".into()),
                (LISTEN, "0.0.0.0:8080".into()),
            ]
        );
        let mut s = settings();
        s.job_timeout = Duration::from_millis(1500);
        s.tls.insecure_skip_verify = true;
        s.tls.client_key = Some("/k/tls.key".into());
        s.instance_file = Some("/run/workerpool/instance".into());
        s.children = Some(1);
        s.keep_outcomes = Some(Duration::from_secs(86_400));
        let env = s.to_env();
        assert!(env.contains(&(JOB_TIMEOUT, "1500ms".into())), "{env:?}");
        assert!(env.contains(&(CHILDREN, "1".into())), "{env:?}");
        assert!(env.contains(&(KEEP_OUTCOMES, "86400s".into())), "{env:?}");
        assert_eq!(
            env[env.len() - 3..],
            [
                (REDIS_CLIENT_KEY, "/k/tls.key".to_string()),
                (REDIS_TLS_INSECURE_SKIP_VERIFY, "true".into()),
                (INSTANCE_FILE, "/run/workerpool/instance".into()),
            ]
        );
    }

    /// The worker reads `--keep-outcomes` with `humantime::parse_duration`:
    /// what is written reads back as the same duration, up to the week the
    /// worker allows.
    #[test]
    fn keep_outcomes_reads_back_as_the_same_duration() {
        for keep in [
            Duration::from_secs(1),
            Duration::from_secs(86_400),
            Duration::from_secs(604_800),
            Duration::from_millis(1_500),
        ] {
            let mut s = settings();
            s.keep_outcomes = Some(keep);
            let env = s.to_env();
            let written = env
                .iter()
                .find(|(name, _)| *name == KEEP_OUTCOMES)
                .map(|(_, value)| value.as_str())
                .unwrap_or_else(|| panic!("{KEEP_OUTCOMES} in {env:?}"));
            assert_eq!(humantime::parse_duration(written), Ok(keep), "{written}");
        }
        assert!(
            settings()
                .to_env()
                .iter()
                .all(|(name, _)| *name != KEEP_OUTCOMES),
            "unset writes none"
        );
    }

    #[test]
    fn every_name_is_a_distinct_prefixed_name() {
        let names = [
            REDIS_URL,
            REDIS_MODE,
            REDIS_CA_FILE,
            REDIS_CLIENT_CERT,
            REDIS_CLIENT_KEY,
            REDIS_TLS_INSECURE_SKIP_VERIFY,
            QUEUE,
            CONCURRENCY,
            HANDLER,
            HTTP_URL,
            MAX_ATTEMPTS,
            MAX_PAYLOAD_BYTES,
            BACKOFF_BASE,
            BACKOFF_MAX,
            JOB_TIMEOUT,
            SHUTDOWN_TIMEOUT,
            HEARTBEAT_INTERVAL,
            DEAD_AFTER,
            LISTEN,
            WORKER_ID,
            RATE_LIMIT,
            REQUIRE_NOEVICTION,
            INSTANCE_FILE,
            CHILDREN,
            JOBS_PER_CHILD,
            KEEP_OUTCOMES,
        ];
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
        assert!(names.iter().all(|n| n.starts_with(PREFIX)));
    }
}
