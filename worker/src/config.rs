//! Worker configuration: command-line flags, each also read from a
//! `WORKERPOOL_*` environment variable, validated into a [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use workerpool_queue::connection::{Endpoint, Mode, Tls};
use workerpool_queue::rate::RateLimit;
use workerpool_settings::{self as settings, RedisArgs};

use crate::handlers::exec_pool::ExecCommand;

/// Settings of the worker runtime.
#[derive(Debug, Clone)]
pub struct Config {
    /// Redis connection URL (`redis://`, or `rediss://` for TLS;
    /// `redis+sentinel://` through Redis Sentinel).
    pub redis_url: String,
    /// TLS options for a `rediss://` URL.
    pub tls: Tls,
    /// One node, a cluster, or ask the server.
    pub redis_mode: Mode,
    /// Queues in priority order, the first served first.
    pub queues: Vec<String>,
    /// Jobs run at once.
    pub concurrency: usize,
    /// How many exec children share the slots; `None`: one per slot.
    pub children: Option<usize>,
    /// How long every settled job's outcome is kept when the job does not
    /// say (`keep`); `None`: only jobs that ask are kept.
    pub keep_outcomes: Option<Duration>,
    /// Attempts before a job is dead-lettered.
    pub max_attempts: u32,
    /// Payloads longer than this many bytes are dead-lettered as
    /// `too_large` by the taking script and never reach this process.
    pub max_payload_bytes: u64,
    /// Backoff before the second attempt; doubles per attempt.
    pub backoff_base: Duration,
    /// Upper bound of the backoff.
    pub backoff_max: Duration,
    /// Time one attempt may take.
    pub job_timeout: Duration,
    /// Time in-flight jobs get to finish once the drain starts.
    pub shutdown_timeout: Duration,
    /// Time between heartbeats (and maintenance rounds).
    pub heartbeat_interval: Duration,
    /// Silence after which a worker counts as lost and its jobs are returned.
    pub dead_after: Duration,
    /// Address of the HTTP endpoints; `None` serves none.
    pub listen: Option<SocketAddr>,
    /// Stable worker id (the pod name in Kubernetes).
    pub worker_id: String,
    /// At most this many job starts per period on each queue, across every
    /// worker of the queue; `None`: no limit.
    pub rate_limit: Option<RateLimit>,
    /// Refuse to run against a Redis whose `maxmemory-policy` is not
    /// `noeviction` (by default such a Redis gets a loud warning).
    pub require_noeviction: bool,
    /// A file private to this worker's container where each process
    /// leaves its instance for the next: the instance it names, once its
    /// lock is free, has exited, and its jobs are returned at start without
    /// waiting for its heartbeat to go stale. `None`: an earlier process's
    /// jobs wait for its heartbeat to go stale, since it may be a live
    /// process given the same worker id.
    pub instance_file: Option<PathBuf>,
}

/// The largest `--max-payload-bytes`: Redis keeps no value longer than
/// 512 MiB (`proto-max-bulk-len`).
pub const MAX_PAYLOAD_BYTES_CEILING: u64 = 512 * 1024 * 1024;

impl Config {
    /// Defaults for everything but the URL and the queues.
    pub fn new(redis_url: impl Into<String>, queues: Vec<String>) -> Self {
        Self {
            redis_url: redis_url.into(),
            tls: Tls::default(),
            redis_mode: Mode::Auto,
            queues,
            concurrency: 1,
            children: None,
            keep_outcomes: None,
            max_attempts: 5,
            max_payload_bytes: workerpool_queue::ops::DEFAULT_MAX_PAYLOAD_BYTES,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            job_timeout: Duration::from_secs(600),
            shutdown_timeout: Duration::from_secs(25),
            heartbeat_interval: Duration::from_secs(5),
            dead_after: Duration::from_secs(30),
            listen: None,
            worker_id: default_worker_id(),
            rate_limit: None,
            require_noeviction: false,
            instance_file: None,
        }
    }

    /// Checks the settings together; the error names the flag to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |msg: String| Err(ConfigError(msg));
        if self.queues.is_empty() {
            return fail(
                "--queue is required (or WORKERPOOL_QUEUE): the Redis list to take jobs from"
                    .into(),
            );
        }
        for q in &self.queues {
            if let Err(problem) = workerpool_queue::keys::check_name(q) {
                return fail(format!("--queue: {problem}"));
            }
        }
        self.endpoint()?;
        if self.concurrency == 0 {
            return fail("--concurrency must be at least 1".into());
        }
        if let Some(keep) = self.keep_outcomes
            && (keep.is_zero() || keep > workerpool_queue::ops::MAX_KEEP)
        {
            return fail(format!(
                "--keep-outcomes must be above 0 and at most {} (a week), got {}",
                humantime::format_duration(workerpool_queue::ops::MAX_KEEP),
                humantime::format_duration(keep)
            ));
        }
        if self.max_attempts == 0 {
            return fail("--max-attempts must be at least 1".into());
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_PAYLOAD_BYTES_CEILING {
            return fail(format!(
                "--max-payload-bytes must be between 1 and {MAX_PAYLOAD_BYTES_CEILING} (Redis's own limit on a value, 512 MiB), got {}",
                self.max_payload_bytes
            ));
        }
        if self.backoff_base.is_zero() || self.backoff_max < self.backoff_base {
            return fail("--backoff-base must be positive and no larger than --backoff-max".into());
        }
        if self.job_timeout.is_zero() || self.heartbeat_interval.is_zero() {
            return fail("--job-timeout and --heartbeat-interval must be positive".into());
        }
        if self.dead_after < self.heartbeat_interval * 3 {
            return fail(format!(
                "--dead-after ({}) must be at least 3 x --heartbeat-interval ({}), or live workers would be taken for lost",
                humantime::format_duration(self.dead_after),
                humantime::format_duration(self.heartbeat_interval)
            ));
        }
        if self.worker_id.is_empty()
            || self
                .worker_id
                .contains(workerpool_queue::keys::Instance::SEPARATOR)
        {
            return fail(format!(
                "--worker-id {:?} must be non-empty and must not contain '{}'",
                self.worker_id,
                workerpool_queue::keys::Instance::SEPARATOR
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Where Redis is, checked (no I/O).
    pub fn endpoint(&self) -> Result<Endpoint, ConfigError> {
        Endpoint::new(self.redis_url.clone(), self.tls.clone())
            .and_then(|e| e.with_mode(self.redis_mode))
            .map_err(|e| ConfigError(e.to_string()))
    }
}

/// A configuration that cannot run, with what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The host name, which is the pod name in Kubernetes.
pub fn default_worker_id() -> String {
    workerpool_queue::keys::host_name()
}

/// Which handler runs the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HandlerKind {
    /// A supervised pool of long-lived processes running the command after
    /// `--`, one JSON job per line on stdin, one JSON reply per line on stdout.
    Exec,
    /// Completes every job at once.
    Noop,
    /// Sleeps `data.ms` milliseconds per job.
    Sleep,
    /// POSTs each job to `--http-url`: 2xx done, 4xx (but 408, 429)
    /// permanent, anything else retried.
    Http,
    /// Starts the command after `--` once per job, the job on stdin: exit 0
    /// done, anything else a failure with the end of stderr as the error.
    ExecPerJob,
}

/// The handler chosen on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerChoice {
    /// See [`HandlerKind::Exec`].
    Exec(ExecCommand),
    /// See [`HandlerKind::Noop`].
    Noop,
    /// See [`HandlerKind::Sleep`].
    Sleep,
    /// See [`HandlerKind::Http`]: the URL to post to.
    Http(hyper::Uri),
    /// See [`HandlerKind::ExecPerJob`].
    ExecPerJob(ExecCommand),
}

/// Runs background jobs from Redis queues: reliable fetch, retries with
/// backoff, dead-lettering, heartbeats and recovery of lost workers'
/// jobs, graceful drain on SIGTERM.
///
/// Signals: SIGTERM, SIGINT, SIGHUP and SIGQUIT drain (fetching stops,
/// in-flight jobs get --shutdown-timeout, the rest go back to the head of
/// their queue, exit 0); a second one of them skips the wait. SIGUSR1 logs
/// one line of state (draining or not, the jobs in flight per queue with
/// their ids and how long they have run) and changes nothing.
///
/// Every flag can also be set in the environment as WORKERPOOL_<FLAG>,
/// for example WORKERPOOL_REDIS_URL. Durations take units: 500ms, 30s, 5m.
#[derive(Debug, Parser)]
#[command(name = "workerpool-worker", version, verbatim_doc_comment)]
#[command(after_help = "Examples:\n  \
    workerpool-worker --redis-url redis://localhost:6379 --queue emails -- python3 handler.py\n  \
    workerpool-worker --redis-url redis://localhost:6379 --queue high --queue low --handler sleep --concurrency 10")]
pub struct Args {
    /// Where Redis is and how to connect.
    #[command(flatten)]
    pub redis: RedisArgs,

    /// Queue to take jobs from; repeat for several, served in strict
    /// priority order (the first named first). The environment variable
    /// takes a comma-separated list.
    #[arg(
        long = "queue",
        env = settings::QUEUE,
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub queues: Vec<String>,

    /// Jobs run at once in this process.
    #[arg(
        long,
        env = settings::CONCURRENCY,
        value_name = "N",
        default_value_t = 1
    )]
    pub concurrency: usize,

    /// Exec handler processes sharing the --concurrency slots (the
    /// default: one per slot). Fewer children each hold several jobs at
    /// once, each told its share in WORKERPOOL_JOBS_PER_CHILD, and answer
    /// by job id: --concurrency 50 --children 1 for I/O-bound async
    /// handlers (docs/worker.md, "Many jobs in one child").
    #[arg(long, env = settings::CHILDREN, value_name = "N")]
    pub children: Option<usize>,

    /// Keep the outcome of every job this worker settles for DUR after it
    /// ends (state, result or error, readable by id: `workerpool job
    /// show`), for jobs that do not say themselves (`keep`). Unset: only
    /// jobs that ask are kept. At most 7d.
    #[arg(long, env = settings::KEEP_OUTCOMES, value_name = "DUR", value_parser = humantime::parse_duration)]
    pub keep_outcomes: Option<Duration>,

    /// Handler: exec (the default when a command follows `--`),
    /// exec-per-job, http, noop or sleep.
    #[arg(long, env = settings::HANDLER, value_enum)]
    pub handler: Option<HandlerKind>,

    /// URL the http handler POSTs each job to (http:// only), for example
    /// a sidecar: http://127.0.0.1:9000/jobs.
    #[arg(long, env = settings::HTTP_URL, value_name = "URL")]
    pub http_url: Option<String>,

    /// Attempts per job before it is dead-lettered.
    #[arg(
        long,
        env = settings::MAX_ATTEMPTS,
        value_name = "N",
        default_value_t = 5
    )]
    pub max_attempts: u32,

    /// Longest payload, in bytes, a job may have (as it is taken, with the
    /// worker's own fields of earlier attempts). A longer one is
    /// dead-lettered with the reason too_large, whole, with its size and
    /// start in the error, by the script that takes it: it never reaches
    /// this process or its handler. The default, 16 MiB (16777216), keeps
    /// the largest job within some 60 MB of this process (a job costs
    /// about 3 times its size at the peak) and is far below
    /// Redis's 512 MiB; put large data elsewhere and a reference in the
    /// job, and keep it within what an http handler's server accepts. Up
    /// to 536870912.
    #[arg(
        long,
        env = settings::MAX_PAYLOAD_BYTES,
        value_name = "BYTES",
        default_value_t = workerpool_queue::ops::DEFAULT_MAX_PAYLOAD_BYTES
    )]
    pub max_payload_bytes: u64,

    /// Backoff before the second attempt; doubles with each attempt, with
    /// full jitter.
    #[arg(long, env = settings::BACKOFF_BASE, value_name = "DUR", default_value = "1s", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,

    /// Upper bound of the retry backoff.
    #[arg(long, env = settings::BACKOFF_MAX, value_name = "DUR", default_value = "5m", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,

    /// Time one attempt may take; past it the attempt fails (an exec child
    /// is killed and replaced).
    #[arg(long, env = settings::JOB_TIMEOUT, value_name = "DUR", default_value = "10m", value_parser = humantime::parse_duration)]
    pub job_timeout: Duration,

    /// Time in-flight jobs get to finish after SIGTERM (or SIGINT, SIGHUP,
    /// SIGQUIT); the rest
    /// then go back to the head of their queue. Keep it below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = settings::SHUTDOWN_TIMEOUT, value_name = "DUR", default_value = "25s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// Time between heartbeats; also how often due retries are promoted
    /// and lost workers are looked for.
    #[arg(long, env = settings::HEARTBEAT_INTERVAL, value_name = "DUR", default_value = "5s", value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Duration,

    /// Silence after which a worker counts as lost and its jobs go back to
    /// the queue.
    #[arg(long, env = settings::DEAD_AFTER, value_name = "DUR", default_value = "30s", value_parser = humantime::parse_duration)]
    pub dead_after: Duration,

    /// Address for /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = settings::LISTEN,
        value_name = "ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub listen: SocketAddr,

    /// Stable worker id; the host name (the pod name in Kubernetes) by default.
    #[arg(long, env = settings::WORKER_ID, value_name = "ID")]
    pub worker_id: Option<String>,

    /// At most N jobs of each queue start per PERIOD, across every worker
    /// of the queue (20/s, 600/1m, 5/30s, 1000/h); jobs over the limit
    /// wait in the queue. A burst of N/10 (at least 1) may start at once.
    #[arg(long, env = settings::RATE_LIMIT, value_name = "N/PERIOD", value_parser = parse_rate_limit)]
    pub rate_limit: Option<RateLimit>,

    /// Refuse to start (exit 1) when the Redis that holds a queue may evict
    /// keys under memory pressure (maxmemory-policy other than
    /// noeviction), instead of warning. An evicting Redis can delete jobs
    /// without an error.
    #[arg(long, env = settings::REQUIRE_NOEVICTION)]
    pub require_noeviction: bool,

    /// A file private to this worker's container, kept across its
    /// restarts (the operator sets a Pod's own emptyDir): each process
    /// writes its instance there at start, holding a lock on FILE.lock
    /// while it runs. A restarted process whose predecessor's lock is free
    /// knows it has exited and returns its jobs at once, instead of after
    /// --dead-after. Never share one between machines or pods.
    #[arg(long, env = settings::INSTANCE_FILE, value_name = "FILE")]
    pub instance_file: Option<PathBuf>,

    /// Handler command for exec, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl Args {
    /// Validates the flags into a runtime configuration and a handler choice.
    pub fn into_config(self) -> Result<(Config, HandlerChoice), ConfigError> {
        let Some(redis_url) = self.redis.redis_url.clone() else {
            return Err(ConfigError(
                "--redis-url is required (or WORKERPOOL_REDIS_URL), for example redis://localhost:6379".into(),
            ));
        };
        let kind_name = |kind: HandlerKind| {
            kind.to_possible_value()
                .map(|v| v.get_name().to_string())
                .unwrap_or_default()
        };
        if let Some(url) = &self.http_url
            && self.handler != Some(HandlerKind::Http)
        {
            return Err(ConfigError(format!(
                "--http-url {url:?} is only for --handler http; drop it or add --handler http"
            )));
        }
        let command = self
            .command
            .split_first()
            .map(|(program, args)| ExecCommand {
                program: program.clone(),
                args: args.to_vec(),
            });
        let handler = match (self.handler, command) {
            (None | Some(HandlerKind::Exec), Some(command)) => HandlerChoice::Exec(command),
            (Some(HandlerKind::ExecPerJob), Some(command)) => HandlerChoice::ExecPerJob(command),
            (None, None) => {
                return Err(ConfigError(
                    "no handler: give a command after `--` (for example `-- python3 handler.py`) or --handler http|noop|sleep".into(),
                ));
            }
            (Some(kind @ (HandlerKind::Exec | HandlerKind::ExecPerJob)), None) => {
                return Err(ConfigError(format!(
                    "--handler {} needs a command after `--`, for example `-- python3 handler.py`",
                    kind_name(kind)
                )));
            }
            (
                Some(kind @ (HandlerKind::Noop | HandlerKind::Sleep | HandlerKind::Http)),
                Some(_),
            ) => {
                return Err(ConfigError(format!(
                    "--handler {} takes no command; drop the part after `--` or use --handler exec",
                    kind_name(kind)
                )));
            }
            (Some(HandlerKind::Noop), None) => HandlerChoice::Noop,
            (Some(HandlerKind::Sleep), None) => HandlerChoice::Sleep,
            (Some(HandlerKind::Http), None) => match &self.http_url {
                Some(url) => {
                    HandlerChoice::Http(crate::handlers::http::parse_url(url).map_err(ConfigError)?)
                }
                None => {
                    return Err(ConfigError(
                        "--handler http needs --http-url (or WORKERPOOL_HTTP_URL), for example http://127.0.0.1:9000/jobs".into(),
                    ));
                }
            },
        };
        if let Some(children) = self.children {
            if !matches!(handler, HandlerChoice::Exec(_)) {
                return Err(ConfigError(
                    "--children is for --handler exec: the other handlers start no long-lived processes; drop it".into(),
                ));
            }
            if children == 0 || children > self.concurrency {
                return Err(ConfigError(format!(
                    "--children must be between 1 and --concurrency ({}): the slots are spread over the children, got {children}",
                    self.concurrency
                )));
            }
        }
        let config = Config {
            redis_url,
            tls: self.redis.tls(),
            redis_mode: self.redis.redis_mode.into(),
            queues: self.queues,
            concurrency: self.concurrency,
            children: self.children,
            keep_outcomes: self.keep_outcomes,
            max_attempts: self.max_attempts,
            max_payload_bytes: self.max_payload_bytes,
            backoff_base: self.backoff_base,
            backoff_max: self.backoff_max,
            job_timeout: self.job_timeout,
            shutdown_timeout: self.shutdown_timeout,
            heartbeat_interval: self.heartbeat_interval,
            dead_after: self.dead_after,
            listen: Some(self.listen),
            worker_id: self.worker_id.unwrap_or_else(default_worker_id),
            rate_limit: self.rate_limit,
            require_noeviction: self.require_noeviction,
            instance_file: self.instance_file,
        };
        config.validate()?;
        Ok((config, handler))
    }
}

/// `--rate-limit`: clap names the flag in front of the error.
fn parse_rate_limit(s: &str) -> Result<RateLimit, String> {
    s.parse()
        .map_err(|e: workerpool_queue::rate::RateLimitError| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(Config, HandlerChoice), ConfigError> {
        let mut argv = vec!["workerpool-worker"];
        argv.extend_from_slice(args);
        Args::try_parse_from(argv)
            .expect("flags parse")
            .into_config()
    }

    fn error(args: &[&str]) -> String {
        parse(args).expect_err("must be refused").0
    }

    /// `Config::new` (the Rust handler's start) and the command line (the
    /// binary's) give a worker the same defaults, but for the probes: the
    /// binary serves them on :8080, a library user chooses.
    #[test]
    fn the_library_and_the_command_line_share_their_defaults() {
        let (mut parsed, _) =
            parse(&["--redis-url=redis://h", "--queue=q", "--handler=noop"]).expect("defaults");
        let built = Config::new("redis://h", vec!["q".to_string()]);
        assert_eq!(parsed.listen.map(|a| a.port()), Some(8080));
        assert_eq!(built.listen, None);
        parsed.listen = built.listen;
        parsed.worker_id.clone_from(&built.worker_id);
        assert_eq!(format!("{parsed:?}"), format!("{built:?}"));
    }

    #[test]
    fn the_payload_limit_defaults_to_16_mib_and_is_refused_outside_1_to_512_mib() {
        let base = ["--redis-url=redis://h", "--queue=q", "--handler=noop"];
        let (config, _) = parse(&base).expect("defaults");
        assert_eq!(config.max_payload_bytes, 16 * 1024 * 1024);
        fn with<'a>(base: &[&'a str], v: &'a str) -> Vec<&'a str> {
            [base, &["--max-payload-bytes", v]].concat()
        }
        let (config, _) = parse(&with(&base, "1048576")).expect("a limit");
        assert_eq!(config.max_payload_bytes, 1_048_576);
        for bad in ["0", "536870913"] {
            let e = error(&with(&base, bad));
            assert!(
                e.contains("--max-payload-bytes") && e.contains("536870912"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_command_after_the_separator_means_exec_and_durations_take_units() {
        let (config, handler) = parse(&[
            "--redis-url=redis://h:1/2",
            "--queue=a",
            "--queue=b",
            "--backoff-base=500ms",
            "--job-timeout=5m",
            "--",
            "python3",
            "h.py",
        ])
        .expect("valid");
        assert_eq!(config.queues, ["a", "b"]);
        assert_eq!(config.backoff_base, Duration::from_millis(500));
        assert_eq!(config.job_timeout, Duration::from_secs(300));
        assert_eq!(
            handler,
            HandlerChoice::Exec(ExecCommand {
                program: "python3".into(),
                args: vec!["h.py".into()]
            })
        );
    }

    #[test]
    fn http_takes_a_url_and_exec_per_job_takes_a_command() {
        let url = "--redis-url=redis://localhost";
        let (_, handler) = parse(&[
            url,
            "--queue=q",
            "--handler=http",
            "--http-url=http://127.0.0.1:9000/jobs",
        ])
        .expect("valid");
        assert_eq!(
            handler,
            HandlerChoice::Http("http://127.0.0.1:9000/jobs".parse().expect("uri"))
        );
        let (_, handler) = parse(&[
            url,
            "--queue=q",
            "--handler=exec-per-job",
            "--",
            "./job.sh",
            "-v",
        ])
        .expect("valid");
        assert_eq!(
            handler,
            HandlerChoice::ExecPerJob(ExecCommand {
                program: "./job.sh".into(),
                args: vec!["-v".into()]
            })
        );
    }

    #[test]
    fn a_rate_limit_is_read_from_the_flag_and_a_bad_one_names_the_flag_and_the_forms() {
        let url = "--redis-url=redis://localhost";
        let (config, _) =
            parse(&[url, "--queue=q", "--handler=noop", "--rate-limit=600/1m"]).expect("valid");
        assert_eq!(
            config.rate_limit.map(|r| r.to_string()),
            Some("600/1m".into())
        );
        let (config, _) = parse(&[url, "--queue=q", "--handler=noop"]).expect("valid");
        assert_eq!(config.rate_limit, None);
        let refused = Args::try_parse_from([
            "workerpool-worker",
            url,
            "--queue=q",
            "--handler=noop",
            "--rate-limit=20/sec",
        ])
        .expect_err("refused")
        .to_string();
        assert!(refused.contains("--rate-limit"), "{refused}");
        assert!(refused.contains("20/s, 600/1m"), "{refused}");
    }

    #[test]
    fn each_bad_setting_is_refused_naming_its_flag() {
        let url = "--redis-url=redis://localhost";
        for (args, flag) in [
            (vec!["--queue=q", "--handler=noop"], "--redis-url"),
            (vec![url, "--handler=noop"], "--queue"),
            (
                vec!["--redis-url=http://x", "--queue=q", "--handler=noop"],
                "--redis-url",
            ),
            (vec![url, "--queue=q"], "--handler"),
            (vec![url, "--queue=q", "--handler=exec"], "--handler exec"),
            (
                vec![url, "--queue=q", "--handler=noop", "--", "x"],
                "--handler noop",
            ),
            (
                vec![url, "--queue=q", "--handler=noop", "--concurrency=0"],
                "--concurrency",
            ),
            (
                vec![url, "--queue=q", "--handler=noop", "--children=1"],
                "--children is for --handler exec",
            ),
            (
                vec![
                    url,
                    "--queue=q",
                    "--concurrency=4",
                    "--children=5",
                    "--",
                    "x",
                ],
                "--children must be between 1 and --concurrency (4)",
            ),
            (
                vec![url, "--queue=q", "--children=0", "--", "x"],
                "--children must be between 1",
            ),
            (
                vec![url, "--queue=q", "--handler=noop", "--max-attempts=0"],
                "--max-attempts",
            ),
            (
                vec![url, "--queue=q", "--handler=noop", "--dead-after=5s"],
                "--dead-after",
            ),
            (vec![url, "--queue= ", "--handler=noop"], "--queue"),
            (vec![url, "--queue=q", "--handler=http"], "--http-url"),
            (
                vec![url, "--queue=q", "--handler=http", "--http-url=https://x/"],
                "--http-url",
            ),
            (
                vec![url, "--queue=q", "--handler=noop", "--http-url=http://x/"],
                "--http-url",
            ),
            (
                vec![url, "--queue=q", "--http-url=http://x/", "--", "x"],
                "--http-url",
            ),
            (
                vec![url, "--queue=q", "--handler=exec-per-job"],
                "--handler exec-per-job",
            ),
            (
                vec![
                    url,
                    "--queue=q",
                    "--handler=http",
                    "--http-url=http://x/",
                    "--",
                    "x",
                ],
                "--handler http",
            ),
        ] {
            let message = error(&args);
            assert!(message.contains(flag), "{args:?}: {message}");
            assert!(!message.contains('\n'), "one line: {message}");
        }
    }

    /// Every variable the operator and local mode set is read by the flag
    /// that declares its name, into the value that was meant: a mistyped
    /// name or a format the worker reads differently fails here.
    #[test]
    fn every_variable_of_the_workers_settings_is_read_back_by_the_worker_as_written() {
        use clap::CommandFactory;
        use std::net::SocketAddr;
        let settings = settings::WorkerSettings {
            redis_url: Some("rediss://user:pw@redis.example:6380/2".into()),
            redis_mode: Some(Mode::Cluster),
            tls: Tls {
                ca_file: Some("/etc/redis-ca/ca.crt".into()),
                client_cert: Some("/etc/redis-client/tls.crt".into()),
                client_key: Some("/etc/redis-client/tls.key".into()),
                insecure_skip_verify: true,
            },
            queues: vec!["{mail}:high".into(), "{mail}:low".into()],
            concurrency: 7,
            children: Some(3),
            keep_outcomes: Some(Duration::from_secs(86_400)),
            max_attempts: 3,
            max_payload_bytes: Some(1_048_576),
            job_timeout: Duration::from_secs(120),
            shutdown_timeout: Duration::from_millis(7_500),
            listen: SocketAddr::from(([127, 0, 0, 1], 9181)),
            rate_limit: Some("600/1m".into()),
            instance_file: Some("/run/workerpool/instance".into()),
        };
        let command = Args::command();
        let mut argv = vec!["workerpool-worker".to_string()];
        for (name, value) in settings.to_env() {
            let arg = command
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == name))
                .unwrap_or_else(|| panic!("{name} is no flag's environment variable"));
            let long = arg.get_long().expect("a long flag");
            if arg.get_action().takes_values() {
                argv.push(format!("--{long}={value}"));
            } else {
                // A switch: its variable reads true or false.
                let on: bool = value.parse().expect("true or false");
                assert!(on, "{name}={value}: an unset switch is left out");
                argv.push(format!("--{long}"));
            }
        }
        argv.extend(["--".into(), "handler".into()]);
        let (config, _) = Args::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
            .into_config()
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert_eq!(Some(config.redis_url), settings.redis_url);
        assert_eq!(Some(config.redis_mode), settings.redis_mode);
        assert_eq!(config.tls, settings.tls);
        assert_eq!(config.queues, settings.queues);
        assert_eq!(config.concurrency, 7);
        assert_eq!(config.children, Some(3));
        assert_eq!(config.keep_outcomes, settings.keep_outcomes);
        assert_eq!(config.max_attempts, settings.max_attempts);
        assert_eq!(Some(config.max_payload_bytes), settings.max_payload_bytes);
        assert_eq!(config.job_timeout, settings.job_timeout);
        assert_eq!(config.shutdown_timeout, settings.shutdown_timeout);
        assert_eq!(config.listen, Some(settings.listen));
        assert_eq!(
            config.rate_limit.map(|r| r.to_string()),
            settings.rate_limit
        );
        assert_eq!(config.instance_file, settings.instance_file);
        // Not one of them is a default of the worker's.
        let defaults = Config::new("redis://h", vec!["q".into()]);
        assert_ne!(config.concurrency, defaults.concurrency);
        assert_ne!(config.max_attempts, defaults.max_attempts);
        assert_ne!(config.max_payload_bytes, defaults.max_payload_bytes);
        assert_ne!(config.job_timeout, defaults.job_timeout);
        assert_ne!(config.shutdown_timeout, defaults.shutdown_timeout);
        assert_ne!(config.redis_mode, defaults.redis_mode);
        assert_ne!(config.tls, defaults.tls);
        assert_ne!(config.instance_file, defaults.instance_file);
        assert_ne!(config.keep_outcomes, defaults.keep_outcomes);
    }

    /// The documented rule, WORKERPOOL_<FLAG>, holds for every flag: a
    /// mistyped name in the settings crate fails here.
    #[test]
    fn every_flag_reads_the_variable_named_after_it() {
        use clap::CommandFactory;
        let command = Args::command();
        let mut named = 0;
        for arg in command.get_arguments() {
            let Some(env) = arg.get_env() else { continue };
            let long = arg.get_long().expect("a long flag");
            let expected = format!(
                "{}{}",
                settings::PREFIX,
                long.to_uppercase().replace('-', "_")
            );
            assert_eq!(env.to_str(), Some(expected.as_str()), "--{long}");
            named += 1;
        }
        assert_eq!(named, 25, "every flag but the command has its variable");
    }
}
