//! The `workerpool` command line: enqueue jobs and inspect or operate a
//! queue. Human tables by default, `--json` for scripts.

use std::io::{BufRead, Write as _};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{Map, Value, json};

use workerpool_queue::admin::{self, WorkerInfo};
use workerpool_queue::connection::{Connection, describe};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::outcome;
use workerpool_queue::snapshot::{self, Counts};
use workerpool_queue::text::{self, CELL_CHARS, LINE_CHARS};

/// Characters of a long dead letter's job that `dead list --json` shows
/// (as `job`, with `"cut":true` and the entry's size in `entry_bytes`).
const DEAD_JSON_PREVIEW_CHARS: usize = 1_000;

/// The Redis of every command when neither --redis-url nor
/// WORKERPOOL_REDIS_URL names one.
const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// Characters of a dead letter's error in the `dead list` table.
const ERROR_CHARS: usize = 80;

/// Enqueue jobs and inspect workerpool queues.
///
/// Every command reads the Redis URL from --redis-url or WORKERPOOL_REDIS_URL
/// and the queue from --queue or WORKERPOOL_QUEUE.
#[derive(Debug, Parser)]
#[command(name = "workerpool", version, verbatim_doc_comment)]
#[command(after_help = "Examples:\n  \
    workerpool enqueue --queue emails '{\"task\":\"send_email\",\"data\":{\"to\":\"a@example.com\"}}'\n  \
    seq 100 | jq -c '{data:{n:.}}' | workerpool enqueue --queue numbers\n  \
    workerpool stats --queue emails\n  \
    workerpool dead list --queue emails --json\n  \
    workerpool dead retry --queue emails --id 3f2a…\n  \
    workerpool dashboard --queue emails --queue reports   # http://127.0.0.1:9090")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Push jobs: each JSON argument is one job; without any, one job per
    /// line of stdin. Prints the job ids, one per line. A job with a
    /// `unique_key` (string) goes in only while no job with that key waits,
    /// is scheduled, retries or runs in the queue (for `unique_for` seconds
    /// at most, default 3600); a refused one prints `duplicate`.
    Enqueue {
        #[command(flatten)]
        target: Target,
        /// Run the jobs this long from now instead of at once (30s, 5m, 1h).
        #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration)]
        delay: Option<Duration>,
        /// Continue this W3C trace in the workers: every job gets this
        /// `traceparent` (00-<32 hex>-<16 hex>-<2 hex>), for example the
        /// TRACEPARENT of the script that enqueues.
        #[arg(long, value_name = "TRACEPARENT", value_parser = parse_traceparent)]
        traceparent: Option<String>,
        /// Jobs as JSON objects, for example '{"task":"t","data":{}}'.
        #[arg(value_name = "JSON")]
        jobs: Vec<String>,
    },
    /// Backlog, in-flight, retries, dead letters, workers, totals and rates.
    Stats {
        #[command(flatten)]
        target: Target,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The counters are read twice this far apart to compute rates.
        #[arg(long, value_name = "DUR", default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Skip the rates (and the wait for the second reading).
        #[arg(long)]
        no_rate: bool,
    },
    /// List, retry or purge dead letters.
    Dead {
        /// What to do with them.
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Each registered worker: alive or lost, the age of its last
    /// heartbeat and the jobs it holds.
    Workers {
        #[command(flatten)]
        target: Target,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A kept job's outcome: where it is (running, retrying, done, dead)
    /// and its result or error, by id. Kept for jobs enqueued with `keep`
    /// (seconds) or run by workers with --keep-outcomes.
    Job {
        /// What to do.
        #[command(subcommand)]
        action: JobAction,
    },
    /// Serve a web UI of the queues (counts, a live chart of the last hour,
    /// workers, waiting, scheduled and retrying jobs, dead letters with
    /// retry and purge) and the JSON it is drawn from, until Ctrl-C.
    Dashboard(DashboardFlags),
}

/// `dashboard` settings.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("redis_url", |a| a.default_value(DEFAULT_REDIS_URL)))]
pub struct DashboardFlags {
    /// Where Redis is (the page shows the URL with the password hidden) and
    /// how to connect.
    #[command(flatten)]
    pub redis: workerpool_settings::RedisArgs,
    /// A queue to show; repeat for several (the environment variable takes
    /// a comma-separated list).
    #[arg(
        long = "queue",
        env = workerpool_settings::QUEUE,
        value_name = "NAME",
        value_delimiter = ',',
        required = true,
        value_parser = queue_name
    )]
    pub queues: Vec<String>,
    /// Address to serve on. Loopback by default: anything else lets the
    /// network see the jobs (and act on dead letters unless --read-only),
    /// so give it a --token-file too.
    #[arg(
        long,
        env = "WORKERPOOL_DASHBOARD_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:9090"
    )]
    pub listen: std::net::SocketAddr,
    /// No actions: the retry, delete and purge buttons are not shown and
    /// their requests are refused.
    #[arg(long, env = "WORKERPOOL_DASHBOARD_READ_ONLY")]
    pub read_only: bool,
    /// File holding a token every request must carry: `Authorization:
    /// Bearer TOKEN`, or a browser opens the page once with ?token=TOKEN
    /// and keeps a cookie.
    #[arg(long, env = "WORKERPOOL_DASHBOARD_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

/// `job` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobAction {
    /// Print the job's outcome as it is now.
    Show {
        #[command(flatten)]
        target: Target,
        /// The job's id.
        #[arg(value_name = "ID")]
        id: String,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Wait until the job ends (done, dead or cancelled) and print its
    /// outcome; exits 1 when it did not end done or the time runs out.
    Wait {
        #[command(flatten)]
        target: Target,
        /// The job's id.
        #[arg(value_name = "ID")]
        id: String,
        /// How long to wait.
        #[arg(long, value_name = "DUR", default_value = "60s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Cancel the job: one still waiting, scheduled or retrying is removed
    /// and marked cancelled (its unique key freed); a running one is asked
    /// to stop (its handler is told; one that finishes anyway ends as it
    /// would have). Prints what was done. Finding a waiting job scans the
    /// queue.
    Cancel {
        #[command(flatten)]
        target: Target,
        /// The job's id.
        #[arg(value_name = "ID")]
        id: String,
        /// Print JSON instead of a line.
        #[arg(long)]
        json: bool,
    },
}

/// `dead` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeadAction {
    /// Show dead letters, newest first.
    List {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        select: Select,
        /// Show at most the N newest (all without it).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Print JSON (the stored envelopes) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Put dead jobs back on the queue for a fresh start (attempt and
    /// error removed, enqueued now).
    Retry {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        select: Select,
        /// Print JSON instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Delete dead letters.
    Purge {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        select: Select,
        /// Print JSON instead of a sentence.
        #[arg(long)]
        json: bool,
    },
}

/// Which Redis and which queue.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("redis_url", |a| a.default_value(DEFAULT_REDIS_URL)))]
pub struct Target {
    /// Where Redis is and how to connect.
    #[command(flatten)]
    pub redis: workerpool_settings::RedisArgs,
    /// The queue.
    #[arg(long, env = workerpool_settings::QUEUE, value_name = "NAME", value_parser = queue_name)]
    pub queue: String,
}

/// The URL of --redis-url, which always has a value (its default).
fn redis_url(redis: &workerpool_settings::RedisArgs) -> String {
    redis
        .redis_url
        .clone()
        .unwrap_or_else(|| DEFAULT_REDIS_URL.into())
}

/// A queue name that cannot be another queue's key
/// ([`workerpool_queue::keys::check_name`]).
fn queue_name(name: &str) -> Result<String, String> {
    workerpool_queue::keys::check_name(name).map(|()| name.to_string())
}

/// Which dead letters.
#[derive(Debug, Clone, Args)]
pub struct Select {
    /// Only the dead letters of the job with this id (all without it).
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
}

/// Why a command failed; each says what to check.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The URL or the TLS options cannot be used.
    #[error(transparent)]
    BadEndpoint(#[from] workerpool_queue::connection::EndpointError),
    /// Redis could not be reached.
    #[error("cannot reach Redis at {url}: {reason}")]
    Connect {
        /// The URL, password hidden.
        url: String,
        /// Why, certificate problems named.
        reason: String,
    },
    /// No key of the queue exists.
    #[error(
        "queue {queue:?} not found at {url}: it has no waiting jobs, workers, dead letters or counters (check --queue and the database number in --redis-url)"
    )]
    UnknownQueue {
        /// The queue.
        queue: String,
        /// The URL, password hidden.
        url: String,
    },
    /// The queue's name cannot work on a Redis Cluster.
    #[error("{0}")]
    ClusterNaming(String),
    /// A Redis command failed; an ACL refusal names the command to grant.
    #[error("redis: {}", describe(.0))]
    Redis(#[from] redis::RedisError),
    /// A job given to `enqueue` is not a JSON object.
    #[error("{0}")]
    BadJob(String),
    /// Reading stdin failed.
    #[error("reading stdin: {0}")]
    Stdin(#[source] std::io::Error),
    /// The dashboard cannot be served as asked (token file, address).
    #[error(transparent)]
    DashboardStart(#[from] workerpool_dashboard::StartError),
    /// Serving the dashboard failed.
    #[error(transparent)]
    Dashboard(#[from] workerpool_dashboard::Error),
    /// No outcome is kept for the job.
    #[error(
        "job {id:?} of queue {queue:?}: no outcome is kept (the job was not enqueued with keep and its workers have no --keep-outcomes, no worker has taken it yet, or its outcome expired)"
    )]
    NoOutcome {
        /// The queue.
        queue: String,
        /// The job's id.
        id: String,
    },
    /// `job wait` ended without the job done: the outcome so far, printed.
    #[error("{0}")]
    NotDone(String),
}

/// Runs a command; returns what to print on stdout.
pub async fn execute(cli: Cli) -> Result<String, CliError> {
    match cli.command {
        Command::Enqueue {
            target,
            delay,
            traceparent,
            jobs,
        } => {
            let mut jobs = if jobs.is_empty() {
                read_jobs(std::io::stdin().lock())?
            } else {
                parse_jobs(jobs.iter().map(String::as_str), "argument")?
            };
            if let Some(tp) = traceparent {
                for job in &mut jobs {
                    job.insert(
                        workerpool_queue::job::field::TRACEPARENT.into(),
                        Value::from(tp.clone()),
                    );
                }
            }
            let (mut c, q) = connect(&target, false).await?;
            let done = admin::enqueue(&mut c, &q, jobs, delay).await?;
            // A job refused for its unique key prints `duplicate` in its place.
            Ok(lines(
                done.into_iter()
                    .map(|e| {
                        if e.accepted {
                            text::safe_line(&e.id, LINE_CHARS)
                        } else {
                            "duplicate".into()
                        }
                    })
                    .collect(),
            ))
        }
        Command::Stats {
            target,
            json,
            interval,
            no_rate,
        } => {
            let (mut c, q) = connect(&target, true).await?;
            let first = snapshot::counts(&mut c, &q).await?;
            if no_rate {
                return Ok(render_stats(&q, &first, None, json));
            }
            tokio::time::sleep(interval).await;
            let second = snapshot::counts(&mut c, &q).await?;
            let rates = Rates::between(&first, &second);
            Ok(render_stats(&q, &second, Some(rates), json))
        }
        Command::Workers { target, json } => {
            let (mut c, q) = connect(&target, true).await?;
            let now = admin::server_time_ms(&mut c).await?;
            let workers = admin::workers(&mut c, &q, now).await?;
            Ok(render_workers(&workers, json))
        }
        Command::Dashboard(args) => dashboard(args).await,
        Command::Job { action } => match action {
            JobAction::Show { target, id, json } => {
                let (mut c, q) = connect(&target, false).await?;
                match outcome::read(&mut c, &q, &id).await? {
                    Some(o) => Ok(render_outcome(&o, json)),
                    None => Err(CliError::NoOutcome {
                        queue: target.queue,
                        id,
                    }),
                }
            }
            JobAction::Wait {
                target,
                id,
                timeout,
                json,
            } => {
                let (mut c, q) = connect(&target, false).await?;
                match outcome::wait(&mut c, &q, &id, timeout).await? {
                    outcome::Waited::Final(o) if o.state == outcome::State::Done => {
                        Ok(render_outcome(&o, json))
                    }
                    outcome::Waited::Final(o) => Err(CliError::NotDone(format!(
                        "job {id:?} is {}:\n{}",
                        o.state.as_str(),
                        render_outcome(&o, json).trim_end()
                    ))),
                    outcome::Waited::TimedOut(Some(o)) => Err(CliError::NotDone(format!(
                        "job {id:?} did not end within {}:\n{}",
                        humantime::format_duration(timeout),
                        render_outcome(&o, json).trim_end()
                    ))),
                    outcome::Waited::TimedOut(None) => Err(CliError::NotDone(format!(
                        "job {id:?} did not end within {}, and no outcome is kept for it yet",
                        humantime::format_duration(timeout)
                    ))),
                }
            }
            JobAction::Cancel { target, id, json } => {
                // A queue with no keys at all holds no such job: `unknown`.
                let (mut c, q) = connect(&target, false).await?;
                let did = outcome::cancel(&mut c, &q, &id).await?;
                if json {
                    return Ok(json!(did).to_string() + "\n");
                }
                let shown = text::safe_line(&id, LINE_CHARS);
                match did {
                    outcome::Cancel::Removed { from } => Ok(format!(
                        "cancelled job {shown:?}: removed from {}\n",
                        match from {
                            outcome::State::Scheduled => "the scheduled jobs",
                            outcome::State::Retrying => "the retries",
                            _ => "the queue",
                        }
                    )),
                    outcome::Cancel::Requested { state } => Ok(format!(
                        "asked job {shown:?} ({}) to stop: its worker tells the handler; one that finishes anyway ends as it would have\n",
                        state.as_str()
                    )),
                    outcome::Cancel::Final { state } => Err(CliError::NotDone(format!(
                        "job {shown:?} already ended: {}",
                        state.as_str()
                    ))),
                    outcome::Cancel::Unknown => Err(CliError::NotDone(format!(
                        "job {shown:?} of queue {:?}: not waiting, scheduled or retrying, and no outcome is kept for it (a running job is cancelled through its kept outcome: enqueue it with keep, or run its workers with --keep-outcomes; or it ended and its outcome expired)",
                        target.queue
                    ))),
                }
            }
        },
        Command::Dead { action } => match action {
            DeadAction::List {
                target,
                select,
                limit,
                json,
            } => {
                let (mut c, q) = connect(&target, true).await?;
                let now = admin::server_time_ms(&mut c).await?;
                let entries = admin::dead_letters(&mut c, &q, select.id.as_deref(), limit).await?;
                let mut out = render_dead(&entries, now, json);
                if !json && select.id.is_none() && Some(entries.len()) == limit {
                    let total = admin::dead_count(&mut c, &q).await?;
                    if total > entries.len() as u64 {
                        out.push_str(&format!(
                            "the {} newest of {total} dead letters (--limit)\n",
                            entries.len()
                        ));
                    }
                }
                Ok(out)
            }
            DeadAction::Retry {
                target,
                select,
                json,
            } => {
                let (mut c, q) = connect(&target, true).await?;
                let done = admin::retry_dead(&mut c, &q, select.id.as_deref()).await?;
                if json {
                    return Ok(json!(done).to_string() + "\n");
                }
                let mut out = format!(
                    "retried {} dead job{} onto {}\n",
                    done.retried,
                    plural(done.retried),
                    q.name()
                );
                if done.skipped_malformed > 0 {
                    out.push_str(&format!(
                        "left {} malformed payload{} in the dead list (they are not jobs)\n",
                        done.skipped_malformed,
                        plural(done.skipped_malformed)
                    ));
                }
                Ok(out)
            }
            DeadAction::Purge {
                target,
                select,
                json,
            } => {
                let (mut c, q) = connect(&target, true).await?;
                let purged = admin::purge_dead(&mut c, &q, select.id.as_deref()).await?;
                if json {
                    return Ok(json!({ "purged": purged }).to_string() + "\n");
                }
                Ok(format!("purged {purged} dead letter{}\n", plural(purged)))
            }
        },
    }
}

/// An outcome as lines (`state: done`, …) or as one JSON object.
fn render_outcome(o: &outcome::Outcome, json: bool) -> String {
    if json {
        return format!(
            "{}\n",
            serde_json::to_string(o).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    }
    let mut out = format!(
        "id: {}\nstate: {}\n",
        text::safe_line(&o.id, LINE_CHARS),
        o.state.as_str()
    );
    let mut line = |name: &str, value: String| {
        out.push_str(&format!("{name}: {}\n", text::safe_line(&value, 4000)));
    };
    if let Some(a) = o.attempt {
        line("attempt", a.to_string());
    }
    if let Some(w) = &o.worker {
        line("worker", w.clone());
    }
    if let Some(r) = &o.result {
        line("result", r.to_string());
    }
    if let Some(e) = &o.result_error {
        line("result_error", e.clone());
    }
    if let Some(e) = &o.error {
        line("error", e.clone());
    }
    if let Some(t) = o.next_at_ms {
        line("next_at_ms", t.to_string());
    }
    if let Some(p) = &o.progress {
        line("progress", p.to_string());
    }
    if let Some(t) = o.progress_at_ms {
        line("progress_at_ms", t.to_string());
    }
    if let Some(t) = o.cancel_requested_at_ms {
        line("cancel_requested_at_ms", t.to_string());
    }
    if let Some(t) = o.ended_at_ms {
        line("ended_at_ms", t.to_string());
    }
    out
}

/// Connects to the Redis of `redis` (a line on stderr when its certificate
/// is not checked); the connection and the URL with its password hidden.
async fn open(redis: &workerpool_settings::RedisArgs) -> Result<(Connection, String), CliError> {
    let endpoint = redis.endpoint(redis_url(redis))?;
    let url = endpoint.redacted();
    if endpoint.tls().insecure_skip_verify {
        let _ = writeln!(
            workerpool_worker::log::Stderr,
            "warning: --redis-tls-insecure-skip-verify: the certificate of {url} is not checked"
        );
    }
    let conn = endpoint
        .connect(Duration::from_secs(3), Duration::from_secs(10))
        .await
        .map_err(|e| CliError::Connect {
            url: url.clone(),
            reason: endpoint.describe(&e),
        })?;
    Ok((conn, url))
}

/// Connects, and with `must_exist` refuses a queue without any key.
async fn connect(target: &Target, must_exist: bool) -> Result<(Connection, QueueKeys), CliError> {
    let (mut c, url) = open(&target.redis).await?;
    let q = QueueKeys::new(target.queue.clone());
    if c.is_cluster()
        && let Some(problem) = workerpool_queue::keys::cluster_problem(std::slice::from_ref(&q))
    {
        return Err(CliError::ClusterNaming(problem));
    }
    if must_exist && !admin::exists(&mut c, &q).await? {
        return Err(CliError::UnknownQueue {
            queue: target.queue.clone(),
            url,
        });
    }
    // A Redis that may delete jobs is worth a line on every use; stdout
    // (tables, JSON) stays as it is.
    let memory = workerpool_queue::memory::read(&mut c, &q)
        .await
        .unwrap_or_default();
    if let Some(warning) = memory.warning() {
        let _ = writeln!(workerpool_worker::log::Stderr, "warning: {url}: {warning}");
    }
    Ok((c, q))
}

/// Serves the dashboard until SIGINT or SIGTERM; notes go to stderr.
async fn dashboard(args: DashboardFlags) -> Result<String, CliError> {
    workerpool_worker::log::init();
    let (mut conn, url) = open(&args.redis).await?;
    let queues: Vec<QueueKeys> = args.queues.iter().map(QueueKeys::new).collect();
    if conn.is_cluster() {
        // Each queue is read on its own, so only its own keys must share a slot.
        for q in &queues {
            if let Some(problem) = workerpool_queue::keys::cluster_problem(std::slice::from_ref(q))
            {
                return Err(CliError::ClusterNaming(problem));
            }
        }
    }
    for q in &queues {
        if !admin::exists(&mut conn, q).await? {
            let _ = writeln!(
                workerpool_worker::log::Stderr,
                "note: queue {:?} has no keys at {url} yet (nothing pushed, served or counted)",
                q.name()
            );
        }
    }
    let options = workerpool_dashboard::ServeOptions {
        listen: args.listen,
        listen_flag: "--listen",
        token_file: args.token_file.clone(),
        token_file_flag: "--token-file",
        read_only: args.read_only,
        redis_label: url.clone(),
    };
    let bound = workerpool_dashboard::bind(options, conn, queues).await?;
    let _ = writeln!(
        workerpool_worker::log::Stderr,
        "dashboard of {} on http://{}/ (Redis {url}{}{}); Ctrl-C stops it",
        args.queues.join(", "),
        bound.addr(),
        if args.read_only { ", read-only" } else { "" },
        if args.token_file.is_some() {
            ", token required"
        } else {
            ""
        },
    );
    let stop = workerpool_settings::stop_signal();
    bound
        .serve(async move {
            let signal = stop.await;
            eprintln!("{signal}: stopping the dashboard");
        })
        .await?;
    Ok(String::new())
}

/// A `--traceparent` as the W3C Trace Context spec reads it.
fn parse_traceparent(text: &str) -> Result<String, String> {
    workerpool_queue::job::TraceParent::parse(text).map(|tp| tp.to_string())
}

fn read_jobs(input: impl BufRead) -> Result<Vec<Map<String, Value>>, CliError> {
    let mut lines = Vec::new();
    for line in input.lines() {
        lines.push(line.map_err(CliError::Stdin)?);
    }
    parse_jobs(
        lines
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .map(|l| l as &str),
        "line",
    )
}

/// Parses every job before any is pushed, so a bad one pushes nothing.
fn parse_jobs<'a>(
    texts: impl Iterator<Item = &'a str>,
    what: &str,
) -> Result<Vec<Map<String, Value>>, CliError> {
    let mut jobs = Vec::new();
    for (i, text) in texts.enumerate() {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(fields)) => {
                if let Err(e) = workerpool_queue::job::unique_of(&fields) {
                    return Err(CliError::BadJob(format!(
                        "{what} {}: {e}; nothing was enqueued",
                        i + 1
                    )));
                }
                jobs.push(fields)
            }
            Ok(_) => {
                return Err(CliError::BadJob(format!(
                    "{what} {}: a job must be a JSON object, got {text:?}; nothing was enqueued",
                    i + 1
                )));
            }
            Err(e) => {
                return Err(CliError::BadJob(format!(
                    "{what} {}: not JSON ({e}); nothing was enqueued",
                    i + 1
                )));
            }
        }
    }
    if jobs.is_empty() {
        return Err(CliError::BadJob(
            "no jobs: give JSON objects as arguments or one per line on stdin".into(),
        ));
    }
    Ok(jobs)
}

/// Completions and failures per second between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Jobs completed per second.
    pub processed: f64,
    /// Failed attempts per second.
    pub failed: f64,
}

impl Rates {
    fn between(a: &Counts, b: &Counts) -> Self {
        let secs = (b.taken_at_ms.saturating_sub(a.taken_at_ms) as f64 / 1000.0).max(0.001);
        let per_sec = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
        Self {
            processed: per_sec(a.processed_total, b.processed_total),
            failed: per_sec(a.failed_total, b.failed_total),
        }
    }
}

fn render_stats(q: &QueueKeys, s: &Counts, rates: Option<Rates>, json: bool) -> String {
    if json {
        let mut v = serde_json::to_value(s).expect("counts always serialize");
        if let Value::Object(fields) = &mut v {
            fields.insert("queue".into(), Value::from(q.name()));
            fields.insert("backlog".into(), Value::from(s.backlog()));
            let (p, f) = rates.map_or((Value::Null, Value::Null), |r| {
                (Value::from(r.processed), Value::from(r.failed))
            });
            fields.insert("processed_per_second".into(), p);
            fields.insert("failed_per_second".into(), f);
        }
        return v.to_string() + "\n";
    }
    let rate = |r: Option<f64>| r.map_or_else(|| "n/a".to_string(), |r| format!("{r:.1}/s"));
    let rows = vec![
        vec!["waiting".into(), s.waiting.to_string()],
        vec!["backlog".into(), s.backlog().to_string()],
        vec!["in flight".into(), s.in_flight.to_string()],
        vec![
            "held by lost workers".into(),
            s.held_by_lost_workers.to_string(),
        ],
        vec!["retries due".into(), s.retries_due.to_string()],
        vec!["retries scheduled".into(), s.retries_scheduled.to_string()],
        vec!["delayed".into(), s.scheduled.to_string()],
        vec!["delayed due".into(), s.scheduled_due.to_string()],
        vec!["dead".into(), s.dead.to_string()],
        vec!["workers live".into(), s.workers_live.to_string()],
        vec!["workers lost".into(), s.workers_lost.to_string()],
        vec!["processed total".into(), s.processed_total.to_string()],
        vec!["failed total".into(), s.failed_total.to_string()],
        vec!["dead total".into(), s.dead_total.to_string()],
        vec!["recovered total".into(), s.recovered_total.to_string()],
        vec!["processed rate".into(), rate(rates.map(|r| r.processed))],
        vec!["failed rate".into(), rate(rates.map(|r| r.failed))],
    ];
    let mut rows = rows;
    if let Some(limit) = &s.rate_limit {
        rows.push(vec!["rate limit".into(), cell(limit)]);
    }
    format!("queue {}\n{}", cell(q.name()), table(&[], rows))
}

fn render_workers(workers: &[WorkerInfo], json: bool) -> String {
    if json {
        return serde_json::to_string(workers).expect("workers always serialize") + "\n";
    }
    if workers.is_empty() {
        return "no workers registered\n".into();
    }
    let rows = workers
        .iter()
        .map(|w| {
            let mut jobs = cell(&w.jobs.iter().take(3).cloned().collect::<Vec<_>>().join(","));
            if w.jobs.len() > 3 {
                jobs.push_str(",…");
            }
            vec![
                cell(&w.instance),
                if w.alive { "alive" } else { "lost" }.into(),
                format!("{} ago", age(w.last_beat_age_ms)),
                w.jobs.len().to_string(),
                w.concurrency.map_or("?".into(), |c| c.to_string()),
                w.pid.map_or("?".into(), |p| p.to_string()),
                jobs,
            ]
        })
        .collect();
    table(
        &[
            "INSTANCE",
            "STATUS",
            "LAST BEAT",
            "IN FLIGHT",
            "CONCURRENCY",
            "PID",
            "JOBS",
        ],
        rows,
    )
}

fn render_dead(entries: &[admin::DeadEntry], now_ms: u64, json: bool) -> String {
    if json {
        let values: Vec<Value> = entries
            .iter()
            .map(|e| match (&e.cut, &e.letter) {
                // Too long to print whole: the envelope, the job's start
                // and the entry's size.
                (Some(_), letter) => {
                    let mut v = letter
                        .as_ref()
                        .and_then(|l| serde_json::to_value(l).ok())
                        .unwrap_or_else(|| Value::Object(Default::default()));
                    v["job"] = Value::from(text::escaped(
                        e.job_start().unwrap_or(&e.raw),
                        DEAD_JSON_PREVIEW_CHARS,
                    ));
                    v["entry_bytes"] = Value::from(e.size);
                    v["cut"] = Value::from(true);
                    v
                }
                (None, _) => serde_json::from_slice(&e.raw)
                    .unwrap_or_else(|_| Value::from(text::escaped(&e.raw, usize::MAX))),
            })
            .collect();
        return Value::Array(values).to_string() + "\n";
    }
    if entries.is_empty() {
        return "no dead letters\n".into();
    }
    let rows = entries
        .iter()
        .map(|e| match &e.letter {
            Some(l) => vec![
                cell(e.job_id().unwrap_or("-")),
                cell(l.job.get("task").and_then(Value::as_str).unwrap_or("-")),
                l.reason.as_str().to_string(),
                l.attempts.to_string(),
                format!("{} ago", age(now_ms.saturating_sub(l.died_at))),
                text::safe_line(&l.error, ERROR_CHARS),
            ],
            None => vec![
                "-".into(),
                "-".into(),
                "unreadable".into(),
                "-".into(),
                "-".into(),
                text::safe_bytes(&e.raw, ERROR_CHARS),
            ],
        })
        .collect();
    table(&["ID", "TASK", "REASON", "ATTEMPTS", "DIED", "ERROR"], rows)
}

/// Text from outside as a table cell: control and bidi characters escaped,
/// at most [`CELL_CHARS`] characters (`--json` has the whole value).
fn cell(s: &str) -> String {
    text::safe_line(s, CELL_CHARS)
}

/// Columns padded to their widest cell; no header row when `headers` is
/// empty. Cells are padded by hand: a width given to `format!` must fit in
/// 16 bits.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut all: Vec<Vec<String>> = Vec::new();
    if !headers.is_empty() {
        all.push(headers.iter().map(|h| h.to_string()).collect());
    }
    all.extend(rows);
    let columns = all.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            all.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in all {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = widths[i].saturating_sub(c.chars().count());
                format!("{c}{}", " ".repeat(pad))
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// An age as people read it: tenths of a second below 10 s (`1.9s`),
/// then whole units (`1m23s`, `2h5m`, `3d4h`).
fn age(ms: u64) -> String {
    if ms < 10_000 {
        return format!("{}.{}s", ms / 1000, ms % 1000 / 100).replace(".0s", "s");
    }
    let secs = ms / 1000;
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

fn lines(items: Vec<String>) -> String {
    let mut out = items.join("\n");
    out.push('\n');
    out
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_job_is_reported_by_position_and_nothing_is_enqueued() {
        let err = read_jobs("{\"a\":1}\n\n[1,2]\n".as_bytes()).expect_err("refused");
        assert!(err.to_string().contains("line 2"), "{err}");
        let err = parse_jobs(["{}", "nope"].into_iter(), "argument").expect_err("refused");
        assert!(err.to_string().contains("argument 2: not JSON"), "{err}");
        assert_eq!(
            read_jobs("{}\n{\"b\":2}\n".as_bytes()).expect("ok").len(),
            2
        );
    }

    #[test]
    fn tables_align_columns_and_ages_read_like_durations() {
        let t = table(
            &["A", "LONGER"],
            vec![
                vec!["xyz".into(), "1".into()],
                vec!["q".into(), "22".into()],
            ],
        );
        assert_eq!(t, "A    LONGER\nxyz  1\nq    22\n");
        assert_eq!(age(1234), "1.2s");
        assert_eq!(age(1900), "1.9s");
        assert_eq!(age(2000), "2s");
        assert_eq!(age(83_400), "1m23s");
        assert_eq!(age(7_500_000), "2h5m");
        assert_eq!(age(273_600_000), "3d4h");
        assert_eq!(age(0), "0s");
    }

    #[test]
    fn stats_show_the_rate_limit_only_when_the_workers_have_one() {
        let q = QueueKeys::new("calls");
        let limited = Counts {
            rate_limit: Some("20/s".into()),
            ..Counts::default()
        };
        let text = render_stats(&q, &limited, None, false);
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().eq(["rate", "limit", "20/s"])),
            "{text}"
        );
        let json = render_stats(&q, &limited, None, true);
        assert!(json.contains(r#""rate_limit":"20/s""#), "{json}");
        let plain = render_stats(&q, &Counts::default(), None, false);
        assert!(!plain.contains("rate limit"), "{plain}");
    }
}
