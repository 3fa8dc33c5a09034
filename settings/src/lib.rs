//! The worker's settings, written down once: the `WORKERPOOL_*`
//! environment variable of each (the worker's flags read them, the operator
//! and local mode set them) and the Redis connection flags that the worker
//! and the `workerpool` command share.

use std::path::PathBuf;

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

/// How to reach Redis beside its URL: one node or a cluster, and TLS for a
/// `rediss://` URL. Shared by the worker and every `workerpool` subcommand.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RedisArgs {
    /// One Redis node or a Redis Cluster; `auto` asks the server (INFO
    /// cluster) at each connection. On a cluster the URL names any node,
    /// and queue names need a hash tag: {mail}, or {mail}:high and
    /// {mail}:low for several queues of one worker.
    #[arg(long, env = REDIS_MODE, value_name = "MODE", default_value = "auto")]
    pub redis_mode: RedisMode,
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
    /// Accept any certificate from Redis. Dangerous: anyone on the path can
    /// read and change the jobs; logs a warning at start.
    #[arg(long, env = REDIS_TLS_INSECURE_SKIP_VERIFY)]
    pub redis_tls_insecure_skip_verify: bool,
}

impl RedisArgs {
    /// The TLS options.
    pub fn tls(&self) -> Tls {
        Tls {
            ca_file: self.redis_ca_file.clone(),
            client_cert: self.redis_client_cert.clone(),
            client_key: self.redis_client_key.clone(),
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
