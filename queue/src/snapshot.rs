//! A read of everything a queue's readers need — the list, retries,
//! delayed jobs, in-flight jobs per worker, counters, the oldest waiting
//! job — at one instant, with read commands only ([`read`], giving
//! [`QueueFigures`] per queue),
//! and the one vocabulary they are counted in ([`Counts`]). The operator
//! polls this for scaling; the CLI, the dashboard and local mode show it.

use std::collections::HashMap;

use crate::connection::Conn;
use redis::{RedisResult, Value};
use serde::Serialize;

use crate::job::field;
use crate::keys::QueueKeys;

/// One registered worker instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerFigures {
    /// `<worker-id>~<nonce>`.
    pub instance: String,
    /// Last heartbeat, unix ms (Redis clock).
    pub last_beat_ms: u64,
    /// Jobs in its processing list.
    pub in_flight: u64,
    /// Its `--dead-after`, as its heartbeat reported it (the default for
    /// workers that do not report it; absent once its details expired).
    pub dead_after_ms: Option<u64>,
    /// Its `--rate-limit` (`20/s`), when it has one.
    pub rate_limit: Option<String>,
    /// Why its handler cannot run jobs (it cannot start, or dies before
    /// it answers), as its last heartbeat said; `None` when it runs them.
    pub handler_problem: Option<String>,
    /// How long the oldest job in its hands had run at its last heartbeat;
    /// `None` when it held none (or did not say).
    pub oldest_job_ms: Option<u64>,
    /// How long it had held no job at its last heartbeat; `None` when it
    /// held one (or did not say).
    pub idle_ms: Option<u64>,
}

impl WorkerFigures {
    /// Silence after which a worker counts as lost when it did not say
    /// (the worker's `--dead-after` default).
    pub const DEFAULT_DEAD_AFTER_MS: u64 = 30_000;

    /// Whether it beat within its dead-after window at `now_ms`. A worker
    /// whose details expired (twice the window) is lost.
    pub fn alive(&self, now_ms: u64) -> bool {
        self.dead_after_ms
            .is_some_and(|window| now_ms.saturating_sub(self.last_beat_ms) <= window)
    }
}

/// Figures of one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueFigures {
    /// The queue's name.
    pub name: String,
    /// Jobs in the list.
    pub waiting: u64,
    /// Failed jobs whose next attempt is due.
    pub retries_due: u64,
    /// Failed jobs waiting for their next attempt, due or not.
    pub retries: u64,
    /// Delayed jobs whose `run_at` has come.
    pub scheduled_due: u64,
    /// Delayed jobs, due or not.
    pub scheduled: u64,
    /// Dead letters.
    pub dead: u64,
    /// Jobs completed (monotonic counter).
    pub processed_total: u64,
    /// Failed attempts (monotonic counter).
    pub failed_total: u64,
    /// Jobs dead-lettered (monotonic counter).
    pub dead_total: u64,
    /// Jobs returned from lost workers (monotonic counter).
    pub recovered_total: u64,
    /// The mean job duration the workers measured, in microseconds, once
    /// a job has finished.
    pub job_duration_us: Option<u64>,
    /// The root mean square of the job durations the workers measured, in
    /// microseconds (`<q>:stats:duration_sq`), once their workers report it.
    pub job_duration_rms_us: Option<u64>,
    /// `enqueued_at` of the job at the head of the queue, when it has one.
    pub oldest_enqueued_at_ms: Option<u64>,
    /// Registered workers.
    pub workers: Vec<WorkerFigures>,
}

impl QueueFigures {
    /// The queue's [`Counts`] at `now_ms` (Redis clock): its workers split
    /// into live and lost by their own windows, with the jobs they hold.
    pub fn counts(&self, now_ms: u64) -> Counts {
        let mut c = Counts {
            waiting: self.waiting,
            retries_due: self.retries_due,
            retries_scheduled: self.retries.saturating_sub(self.retries_due),
            scheduled_due: self.scheduled_due,
            scheduled: self.scheduled,
            dead: self.dead,
            processed_total: self.processed_total,
            failed_total: self.failed_total,
            dead_total: self.dead_total,
            recovered_total: self.recovered_total,
            job_duration_us: self.job_duration_us,
            job_duration_rms_us: self.job_duration_rms_us,
            oldest_enqueued_at_ms: self.oldest_enqueued_at_ms,
            taken_at_ms: now_ms,
            rate_limit: self.rate_limit(now_ms).map(str::to_string),
            ..Counts::default()
        };
        for w in &self.workers {
            if w.alive(now_ms) {
                c.workers_live += 1;
                c.in_flight += w.in_flight;
            } else {
                c.workers_lost += 1;
                c.held_by_lost_workers += w.in_flight;
            }
        }
        c
    }

    /// The rate limit the queue's live workers at `now_ms` run with
    /// (`20/s`), when they have one.
    pub fn rate_limit(&self, now_ms: u64) -> Option<&str> {
        self.workers
            .iter()
            .filter(|w| w.alive(now_ms))
            .find_map(|w| w.rate_limit.as_deref())
    }
}

/// What one queue (or several, added up) holds and has done at one
/// instant: the one vocabulary of the queue's figures that the CLI, the
/// dashboard, local mode, the metrics and the scaling engine all read
/// (`docs/queue-contract.md`, "Reading a queue").
///
/// - **waiting**: jobs in the list `<q>`, nothing else.
/// - **backlog** ([`Counts::backlog`]): everything that can run now, the
///   list plus the retries and delayed jobs that are due and not yet
///   moved back to it (the WorkerPool's `targetBacklogPerReplica` and
///   `status.backlog`).
/// - **in flight**: jobs in the processing lists of live workers;
///   **held by lost workers**: in those of workers silent past their
///   window, until a reaper returns them.
///
/// Serialized (`workerpool stats --json`) with these field names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Jobs in the list.
    pub waiting: u64,
    /// Jobs held by live workers.
    pub in_flight: u64,
    /// Jobs held by workers taken for lost, until a reaper returns them.
    pub held_by_lost_workers: u64,
    /// Failed jobs whose next attempt is due (moved to the list within a
    /// second).
    pub retries_due: u64,
    /// Failed jobs waiting for their backoff to pass (not due).
    pub retries_scheduled: u64,
    /// Of [`Counts::scheduled`], the delayed jobs whose `run_at` has come.
    pub scheduled_due: u64,
    /// Delayed jobs, due or not.
    pub scheduled: u64,
    /// Dead letters.
    pub dead: u64,
    /// Workers that beat within their window.
    pub workers_live: u64,
    /// Registered workers silent past their window.
    pub workers_lost: u64,
    /// Jobs completed, ever.
    pub processed_total: u64,
    /// Failed attempts, ever.
    pub failed_total: u64,
    /// Jobs dead-lettered, ever.
    pub dead_total: u64,
    /// Jobs returned from lost workers, ever.
    pub recovered_total: u64,
    /// The mean duration of a job, in microseconds, as the workers
    /// measured it (`<q>:stats:duration`), once one has finished: known
    /// before the next job runs, after an idle spell or a restart.
    pub job_duration_us: Option<u64>,
    /// The root mean square of the job durations, in microseconds
    /// (`<q>:stats:duration_sq`, kept beside the mean): with the mean, it
    /// gives their spread ([`Counts::job_seconds_deviation`]).
    pub job_duration_rms_us: Option<u64>,
    /// `enqueued_at` of the oldest job at the head of a list, when it has
    /// one.
    pub oldest_enqueued_at_ms: Option<u64>,
    /// The Redis server's clock when it was read, unix ms.
    pub taken_at_ms: u64,
    /// The rate limit the live workers run with (`20/s`), when they have one.
    pub rate_limit: Option<String>,
}

impl Counts {
    /// Jobs that can run now: waiting, plus due retries and due delayed
    /// jobs.
    pub fn backlog(&self) -> u64 {
        self.waiting + self.due()
    }

    /// Of the backlog, the due retries and due delayed jobs not yet moved
    /// to the list.
    pub fn due(&self) -> u64 {
        self.retries_due + self.scheduled_due
    }

    /// Jobs in processing lists, of live and lost workers alike.
    pub fn held(&self) -> u64 {
        self.in_flight + self.held_by_lost_workers
    }

    /// [`Counts::job_duration_us`] in seconds.
    pub fn job_seconds(&self) -> Option<f64> {
        self.job_duration_us.map(|us| us as f64 / 1e6)
    }

    /// The standard deviation of the job durations in seconds, from their
    /// mean and root mean square, when the workers reported both.
    pub fn job_seconds_deviation(&self) -> Option<f64> {
        let mean = self.job_seconds()?;
        let rms = self.job_duration_rms_us? as f64 / 1e6;
        Some((rms * rms - mean * mean).max(0.0).sqrt())
    }

    /// Age in seconds of the oldest waiting job that carries `enqueued_at`.
    pub fn oldest_job_age_seconds(&self) -> Option<f64> {
        self.oldest_enqueued_at_ms
            .map(|t| self.taken_at_ms.saturating_sub(t) as f64 / 1000.0)
    }
}

/// Two queues' counts, read at the same instant, as one: every number
/// added, the oldest job the older, the first rate limit kept, the job
/// durations averaged over the jobs each queue has processed.
impl std::ops::Add<&Counts> for Counts {
    type Output = Counts;

    fn add(mut self, other: &Counts) -> Counts {
        // Destructured whole, so that a new count cannot be left out here.
        let Counts {
            waiting,
            in_flight,
            held_by_lost_workers,
            retries_due,
            retries_scheduled,
            scheduled_due,
            scheduled,
            dead,
            workers_live,
            workers_lost,
            processed_total,
            failed_total,
            dead_total,
            recovered_total,
            job_duration_us,
            job_duration_rms_us,
            oldest_enqueued_at_ms,
            taken_at_ms,
            rate_limit,
        } = other;
        // Weighted by the jobs each queue processed: the means as they are,
        // the root mean squares through their squares (so the sum's spread
        // includes the difference between the two queues' jobs).
        let (wa, wb) = (self.processed_total as f64, *processed_total as f64);
        let weigh = |a: Option<u64>, b: Option<u64>, power: i32| match (a, b) {
            (Some(a), Some(b)) => Some(if wa + wb > 0.0 {
                let mixed = ((a as f64).powi(power) * wa + (b as f64).powi(power) * wb) / (wa + wb);
                mixed.powf(1.0 / f64::from(power)).round() as u64
            } else {
                a.max(b)
            }),
            (a, b) => a.or(b),
        };
        self.job_duration_us = weigh(self.job_duration_us, *job_duration_us, 1);
        self.job_duration_rms_us = weigh(self.job_duration_rms_us, *job_duration_rms_us, 2);
        self.waiting += waiting;
        self.in_flight += in_flight;
        self.held_by_lost_workers += held_by_lost_workers;
        self.retries_due += retries_due;
        self.retries_scheduled += retries_scheduled;
        self.scheduled_due += scheduled_due;
        self.scheduled += scheduled;
        self.dead += dead;
        self.workers_live += workers_live;
        self.workers_lost += workers_lost;
        self.processed_total += processed_total;
        self.failed_total += failed_total;
        self.dead_total += dead_total;
        self.recovered_total += recovered_total;
        self.oldest_enqueued_at_ms = match (self.oldest_enqueued_at_ms, *oldest_enqueued_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.taken_at_ms = self.taken_at_ms.max(*taken_at_ms);
        if self.rate_limit.is_none() {
            self.rate_limit.clone_from(rate_limit);
        }
        self
    }
}

/// Figures of a set of queues at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The Redis server's clock, unix ms.
    pub server_time_ms: u64,
    /// One entry per queue, in the order asked.
    pub queues: Vec<QueueFigures>,
}

impl Snapshot {
    /// The [`Counts`] of every queue read, added up.
    pub fn counts(&self) -> Counts {
        self.queues.iter().fold(
            Counts {
                taken_at_ms: self.server_time_ms,
                ..Counts::default()
            },
            |sum, q| sum + &q.counts(self.server_time_ms),
        )
    }

    /// The live workers (at the snapshot's instant) whose handler cannot
    /// run jobs, once each by worker id (the pod name), with the reason
    /// their heartbeat gave.
    pub fn handler_problems(&self) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        for w in self.queues.iter().flat_map(|q| &q.workers) {
            if let Some(p) = &w.handler_problem
                && w.alive(self.server_time_ms)
            {
                let id = crate::keys::Instance::id_of(&w.instance).unwrap_or(&w.instance);
                out.entry(id.to_string()).or_insert_with(|| p.clone());
            }
        }
        out
    }

    /// What each live worker process is doing, by worker id (a worker
    /// pod's name): the jobs it holds now, and how long its oldest had run,
    /// or how long it had held none, as of its last heartbeat. The times
    /// are not aged to the snapshot: the job a beat saw may have ended and
    /// another begun since, so aging could make a run of short jobs look
    /// like one long one; a time is at most one heartbeat interval short.
    /// A job taken after the last beat counts as just started, a worker
    /// that settled its last job after the beat as just gone idle.
    pub fn activity_by_worker_id(&self) -> std::collections::BTreeMap<String, WorkerActivity> {
        let mut out: std::collections::BTreeMap<String, WorkerActivity> =
            std::collections::BTreeMap::new();
        for w in self.queues.iter().flat_map(|q| &q.workers) {
            if !w.alive(self.server_time_ms) {
                continue;
            }
            let id = crate::keys::Instance::id_of(&w.instance).unwrap_or(&w.instance);
            let seen = if w.in_flight > 0 {
                WorkerActivity {
                    in_flight: w.in_flight,
                    busy_ms: Some(w.oldest_job_ms.unwrap_or(0)),
                    idle_ms: None,
                }
            } else {
                WorkerActivity {
                    in_flight: 0,
                    busy_ms: None,
                    idle_ms: match (w.oldest_job_ms, w.idle_ms) {
                        (_, Some(idle)) => Some(idle),
                        (Some(_), None) => Some(0),
                        (None, None) => None,
                    },
                }
            };
            out.entry(id.to_string())
                .and_modify(|a| *a = a.with(seen))
                .or_insert(seen);
        }
        out
    }
}

/// What one worker process is doing ([`Snapshot::activity_by_worker_id`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerActivity {
    /// Jobs in its processing lists.
    pub in_flight: u64,
    /// How long its oldest job in hand has run, while it holds one.
    pub busy_ms: Option<u64>,
    /// How long it has held no job, while it holds none (`None` as well
    /// when its heartbeat did not say).
    pub idle_ms: Option<u64>,
}

impl WorkerActivity {
    /// The activity of one process seen under two queues (or two
    /// instances of one id): busy if either is, for the longer time; idle
    /// for the shorter time.
    fn with(self, other: WorkerActivity) -> WorkerActivity {
        let in_flight = self.in_flight + other.in_flight;
        if in_flight > 0 {
            WorkerActivity {
                in_flight,
                busy_ms: self.busy_ms.max(other.busy_ms),
                idle_ms: None,
            }
        } else {
            WorkerActivity {
                in_flight,
                busy_ms: None,
                idle_ms: match (self.idle_ms, other.idle_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            }
        }
    }
}

/// The most times [`read`] starts over when the registry of workers
/// changed between its two round trips.
const ATTEMPTS: usize = 5;

/// The longest head of a queue whose `enqueued_at` is read as JSON; of a
/// longer one only the first [`HEAD_START_BYTES`] and last
/// [`HEAD_END_BYTES`] are searched (a producer's job is rarely that long,
/// and parsing megabytes on every poll is not worth one field). The head
/// itself comes whole: no plain command sends part of a list's entry.
const HEAD_WHOLE_BYTES: usize = 65_536;
/// Where a long head's `enqueued_at` is looked for first: producers that
/// stamp it tend to write it early…
const HEAD_START_BYTES: usize = 4_096;
/// …or last, as the contract's examples do (`…,"enqueued_at":N}`).
const HEAD_END_BYTES: usize = 256;

/// The fields of a worker's details hash that the figures read.
const DETAILS: [&str; 5] = [
    "dead_after_ms",
    "rate_limit",
    "handler_problem",
    "oldest_job_ms",
    "idle_ms",
];

/// The commands read per queue before its workers', in [`read`]'s
/// transaction.
const PER_QUEUE: usize = 14;
/// The commands read per worker: its processing list's length, whether
/// its details exist, and each of [`DETAILS`].
const PER_WORKER: usize = 2 + DETAILS.len();

/// The [`Counts`] of one queue, read as [`read`] does.
pub async fn counts(conn: &mut impl Conn, q: &QueueKeys) -> RedisResult<Counts> {
    Ok(read(conn, std::slice::from_ref(q)).await?.counts())
}

/// Reads `queues` at one instant, with plain read commands only (no
/// script), so that a Redis user granted nothing else can take it
/// (`docs/redis-acl.md`).
///
/// Two round trips. The first reads the Redis clock and each queue's
/// registered workers. The second is one `MULTI`/`EXEC` transaction
/// that reads everything else (the lists, the retries and delayed jobs
/// due at that clock, the counters, the head of each queue, each
/// worker's processing list and details) and the registry again. Redis
/// runs a transaction whole, with nothing in between, so the figures are
/// of one instant: a job that moves between the list and a processing
/// list meanwhile is counted once, in one or the other. Should the
/// registry have changed between the two (a worker came or went), its
/// workers would not all have been read: the read starts over, up to
/// [`ATTEMPTS`] times. On Redis Cluster every key of a queue is in one
/// slot when its name has a hash tag, which a transaction needs as a
/// script did.
pub async fn read(conn: &mut impl Conn, queues: &[QueueKeys]) -> RedisResult<Snapshot> {
    for _ in 0..ATTEMPTS {
        let (now, registered) = registry(conn, queues).await?;
        if let Some(figures) = figures(conn, queues, now, &registered).await? {
            return Ok(Snapshot {
                server_time_ms: now,
                queues: figures,
            });
        }
    }
    Err(redis::RedisError::from((
        redis::ErrorKind::Client,
        "the registry of workers kept changing while the queue was read",
        format!("{ATTEMPTS} attempts"),
    )))
}

/// The first round trip: the Redis clock (unix ms) and, per queue, the
/// instances registered.
async fn registry(
    conn: &mut impl Conn,
    queues: &[QueueKeys],
) -> RedisResult<(u64, Vec<Vec<String>>)> {
    let mut pipe = redis::pipe();
    pipe.cmd("TIME");
    for q in queues {
        pipe.cmd("ZRANGE").arg(q.workers()).arg(0).arg(-1);
    }
    let replies = replies(conn, &pipe, 0, 1 + queues.len()).await?;
    let (time, workers) = replies.split_first().ok_or_else(|| shape("no TIME"))?;
    let (secs, micros): (u64, u64) = redis::from_redis_value_ref(time)?;
    let workers = workers
        .iter()
        .map(redis::from_redis_value_ref::<Vec<String>>)
        .collect::<Result<_, _>>()?;
    Ok((secs * 1000 + micros / 1000, workers))
}

/// The second round trip: every figure, in one transaction. `None` when
/// the registry it reads is not `registered` (then not every worker's
/// figures were asked for).
async fn figures(
    conn: &mut impl Conn,
    queues: &[QueueKeys],
    now: u64,
    registered: &[Vec<String>],
) -> RedisResult<Option<Vec<QueueFigures>>> {
    let mut tx = redis::pipe();
    tx.cmd("MULTI");
    let mut sent = 1;
    for (q, workers) in queues.iter().zip(registered) {
        tx.cmd("LLEN").arg(q.waiting());
        tx.cmd("ZCOUNT").arg(q.retry()).arg("-inf").arg(now);
        tx.cmd("ZCARD").arg(q.retry());
        tx.cmd("ZCOUNT").arg(q.scheduled()).arg("-inf").arg(now);
        tx.cmd("ZCARD").arg(q.scheduled());
        tx.cmd("LLEN").arg(q.dead());
        tx.cmd("GET").arg(q.stats_processed());
        tx.cmd("GET").arg(q.stats_failed());
        tx.cmd("GET").arg(q.stats_dead());
        tx.cmd("GET").arg(q.stats_recovered());
        tx.cmd("GET").arg(q.stats_duration());
        tx.cmd("LINDEX").arg(q.waiting()).arg(-1);
        tx.cmd("ZRANGE")
            .arg(q.workers())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        tx.cmd("GET").arg(q.stats_duration_sq());
        for w in workers {
            let details = q.worker(w);
            tx.cmd("LLEN").arg(q.processing(w));
            tx.cmd("EXISTS").arg(&details);
            for field in DETAILS {
                tx.cmd("HGET").arg(&details).arg(field);
            }
        }
        sent += PER_QUEUE + PER_WORKER * workers.len();
    }
    tx.cmd("EXEC");
    sent += 1;
    // MULTI and EXEC written here rather than by an atomic pipeline, so
    // that a command the ACL refuses comes back as its own refusal (which
    // names it) rather than as EXEC's "transaction discarded".
    let mut replies = replies(conn, &tx, 0, sent).await?;
    let Some(Value::Array(mut read)) = replies.pop() else {
        return Err(shape("EXEC gave no array"));
    };
    if let Some(Value::ServerError(e)) = read.iter().find(|v| matches!(v, Value::ServerError(_))) {
        return Err(e.clone().into());
    }
    let mut out = Vec::with_capacity(queues.len());
    let mut at = 0;
    for (q, workers) in queues.iter().zip(registered) {
        let n = PER_QUEUE + PER_WORKER * workers.len();
        let f = read
            .get_mut(at..at + n)
            .ok_or_else(|| shape("EXEC's reply is cut short"))?;
        at += n;
        let beats: Vec<(String, f64)> = redis::from_redis_value_ref(&f[12])?;
        let mut now_registered: Vec<&str> = beats.iter().map(|(w, _)| w.as_str()).collect();
        let mut asked: Vec<&str> = workers.iter().map(String::as_str).collect();
        now_registered.sort_unstable();
        asked.sort_unstable();
        if now_registered != asked {
            return Ok(None);
        }
        let read_of: HashMap<&str, &[Value]> = workers
            .iter()
            .map(String::as_str)
            .zip(f[PER_QUEUE..].chunks_exact(PER_WORKER))
            .collect();
        let workers = beats
            .iter()
            .map(|(instance, beat)| {
                let w = read_of
                    .get(instance.as_str())
                    .ok_or_else(|| shape("a worker not read"))?;
                worker(instance, *beat, w)
            })
            .collect::<RedisResult<Vec<_>>>()?;
        let head: Option<Vec<u8>> =
            redis::from_redis_value(std::mem::replace(&mut f[11], Value::Nil))?;
        out.push(QueueFigures {
            name: q.name().to_string(),
            waiting: int(&f[0])?,
            retries_due: int(&f[1])?,
            retries: int(&f[2])?,
            scheduled_due: int(&f[3])?,
            scheduled: int(&f[4])?,
            dead: int(&f[5])?,
            processed_total: int(&f[6])?,
            failed_total: int(&f[7])?,
            dead_total: int(&f[8])?,
            recovered_total: int(&f[9])?,
            // Written by the workers' heartbeats: one that does not read
            // as a duration is as good as none.
            job_duration_us: text(&f[10])?
                .and_then(|ms| ms.parse::<f64>().ok())
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
                .map(|ms| (ms * 1000.0).round() as u64),
            job_duration_rms_us: text(&f[13])?
                .and_then(|ms2| ms2.parse::<f64>().ok())
                .filter(|ms2| ms2.is_finite() && *ms2 >= 0.0)
                .map(|ms2| (ms2.sqrt() * 1000.0).round() as u64),
            oldest_enqueued_at_ms: head.as_deref().and_then(enqueued_at),
            workers,
        });
    }
    Ok(Some(out))
}

/// One worker's figures: its instance and beat from the registry, then
/// its reads (the length of its processing list, whether its details
/// exist, and each of [`DETAILS`]).
fn worker(instance: &str, beat: f64, read: &[Value]) -> RedisResult<WorkerFigures> {
    let detail = |i: usize| text(&read[2 + i]);
    let exists: bool = redis::from_redis_value_ref(&read[1])?;
    Ok(WorkerFigures {
        instance: instance.to_string(),
        last_beat_ms: beat as u64,
        in_flight: int(&read[0])?,
        dead_after_ms: match detail(0)? {
            Some(window) => Some(
                window
                    .parse()
                    .map_err(|_| shape("dead_after_ms is no number"))?,
            ),
            None if exists => Some(WorkerFigures::DEFAULT_DEAD_AFTER_MS),
            None => None,
        },
        rate_limit: detail(1)?.filter(|r| !r.is_empty()),
        handler_problem: detail(2)?.filter(|p| !p.is_empty()),
        oldest_job_ms: detail(3)?.and_then(|ms| ms.parse().ok()),
        idle_ms: detail(4)?.and_then(|ms| ms.parse().ok()),
    })
}

/// The `enqueued_at` of the job at a queue's head: its JSON field, or, in
/// a head over [`HEAD_WHOLE_BYTES`], the first `"enqueued_at":N` in its
/// first [`HEAD_START_BYTES`] or its last [`HEAD_END_BYTES`].
fn enqueued_at(head: &[u8]) -> Option<u64> {
    if head.len() <= HEAD_WHOLE_BYTES {
        return serde_json::from_slice::<serde_json::Value>(head)
            .ok()?
            .get(field::ENQUEUED_AT)?
            .as_u64();
    }
    let start = &head[..HEAD_START_BYTES];
    let end = &head[head.len() - HEAD_END_BYTES..];
    stated(start).or_else(|| stated(end))
}

/// The number after the first `"enqueued_at":` that has one, in `bytes`.
fn stated(bytes: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"enqueued_at\":";
    let mut rest = bytes;
    while let Some(at) = rest.windows(KEY.len()).position(|w| w == KEY) {
        rest = &rest[at + KEY.len()..];
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 {
            return std::str::from_utf8(&rest[..digits]).ok()?.parse().ok();
        }
    }
    None
}

/// The replies to `count` commands of `pipe` from `offset` on, the first
/// error among them returned as the error (a refusal names its command).
async fn replies(
    conn: &mut impl Conn,
    pipe: &redis::Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let replies = conn.req_packed_commands(pipe, offset, count).await?;
    if let Some(Value::ServerError(e)) = replies.iter().find(|v| matches!(v, Value::ServerError(_)))
    {
        return Err(e.clone().into());
    }
    Ok(replies)
}

fn shape(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected snapshot reply shape",
        what.to_string(),
    ))
}

fn int(v: &Value) -> RedisResult<u64> {
    Ok(redis::from_redis_value_ref::<Option<u64>>(v)?.unwrap_or(0))
}

fn text(v: &Value) -> RedisResult<Option<String>> {
    Ok(redis::from_redis_value_ref::<Option<String>>(v)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn beat(
        instance: &str,
        at: u64,
        held: u64,
        oldest: Option<u64>,
        idle: Option<u64>,
    ) -> WorkerFigures {
        WorkerFigures {
            instance: instance.into(),
            last_beat_ms: at,
            in_flight: held,
            dead_after_ms: Some(30_000),
            rate_limit: None,
            handler_problem: None,
            oldest_job_ms: oldest,
            idle_ms: idle,
        }
    }

    #[test]
    fn a_long_heads_enqueued_at_is_found_near_its_start_or_its_end_only() {
        let pad = "x".repeat(HEAD_WHOLE_BYTES);
        let first = format!(r#"{{"enqueued_at":17,"data":"{pad}"}}"#);
        assert_eq!(enqueued_at(first.as_bytes()), Some(17));
        let last = format!(r#"{{"data":"{pad}","id":"a","enqueued_at":42}}"#);
        assert_eq!(enqueued_at(last.as_bytes()), Some(42));
        let inside = format!(r#"{{"data":"{pad}","enqueued_at":5,"more":"{pad}"}}"#);
        assert_eq!(enqueued_at(inside.as_bytes()), None);
        let text = format!(r#"{{"enqueued_at":"soon","enqueued_at":7,"data":"{pad}"}}"#);
        assert_eq!(
            enqueued_at(text.as_bytes()),
            Some(7),
            "the first with a number"
        );
        assert_eq!(enqueued_at(br#"{"enqueued_at":9}"#), Some(9));
        assert_eq!(enqueued_at(br#"{"task":"t"}"#), None);
        assert_eq!(enqueued_at(b"\xff not json"), None);
    }

    #[test]
    fn activity_is_as_of_the_last_beat_and_one_process_counts_once() {
        let queue = |name: &str, workers| QueueFigures {
            name: name.into(),
            workers,
            ..QueueFigures::default()
        };
        let s = Snapshot {
            server_time_ms: 100_000,
            queues: vec![
                queue(
                    "a",
                    vec![
                        // Busy 40 s at a beat 3 s ago: 40 s (the job a
                        // beat saw may have ended since).
                        beat("busy~1", 97_000, 1, Some(40_000), None),
                        // Took its job after the beat: just started.
                        beat("fresh~1", 99_000, 1, None, Some(5_000)),
                        // Settled its job after the beat: just idle.
                        beat("ended~1", 99_000, 0, Some(2_000), None),
                        beat("idle~1", 98_000, 0, None, Some(60_000)),
                        // Silent for longer than its window: lost, not shown.
                        beat("lost~1", 10_000, 2, Some(1), None),
                        // An older worker that says neither.
                        beat("old~1", 99_000, 0, None, None),
                    ],
                ),
                // The busy process under a second queue, idle there.
                queue(
                    "b",
                    vec![
                        beat("busy~1", 99_500, 0, Some(42_500), None),
                        beat("idle~1", 99_000, 0, None, Some(61_000)),
                    ],
                ),
            ],
        };
        let a = s.activity_by_worker_id();
        let get = |id: &str| a.get(id).copied();
        assert_eq!(
            get("busy"),
            Some(WorkerActivity {
                in_flight: 1,
                busy_ms: Some(40_000),
                idle_ms: None
            })
        );
        assert_eq!(
            get("fresh"),
            Some(WorkerActivity {
                in_flight: 1,
                busy_ms: Some(0),
                idle_ms: None
            })
        );
        assert_eq!(
            get("ended"),
            Some(WorkerActivity {
                in_flight: 0,
                busy_ms: None,
                idle_ms: Some(0)
            })
        );
        assert_eq!(
            get("idle"),
            Some(WorkerActivity {
                in_flight: 0,
                busy_ms: None,
                idle_ms: Some(60_000)
            })
        );
        assert_eq!(
            get("old"),
            Some(WorkerActivity {
                in_flight: 0,
                busy_ms: None,
                idle_ms: None
            })
        );
        assert_eq!(get("lost"), None);
    }

    fn worker() -> impl Strategy<Value = WorkerFigures> {
        (0u64..20_000, 0u64..50, prop::option::of(0u64..15_000)).prop_map(
            |(last_beat_ms, in_flight, dead_after_ms)| WorkerFigures {
                instance: format!("pod-{last_beat_ms}~1"),
                last_beat_ms,
                in_flight,
                dead_after_ms,
                rate_limit: None,
                handler_problem: None,
                oldest_job_ms: None,
                idle_ms: None,
            },
        )
    }

    fn queue() -> impl Strategy<Value = QueueFigures> {
        (
            (0u64..1_000, 0u64..100, 0u64..100, 0u64..100),
            (0u64..100, 0u64..100, 0u64..1_000),
            prop::option::of(0u64..20_000),
            prop::collection::vec(worker(), 0..4),
        )
            .prop_map(
                |(
                    (waiting, due_retries, later_retries, due_scheduled),
                    (later_scheduled, dead, processed),
                    oldest,
                    workers,
                )| QueueFigures {
                    name: "q".into(),
                    waiting,
                    retries_due: due_retries,
                    retries: due_retries + later_retries,
                    scheduled_due: due_scheduled,
                    scheduled: due_scheduled + later_scheduled,
                    dead,
                    processed_total: processed,
                    oldest_enqueued_at_ms: oldest,
                    workers,
                    ..QueueFigures::default()
                },
            )
    }

    proptest! {
        /// The counts of several queues are the sums of each queue's; every
        /// job a worker holds is in flight or held by a lost worker, once;
        /// the backlog is the list plus what is due, never more.
        #[test]
        fn counts_add_up_over_queues(queues in prop::collection::vec(queue(), 0..5)) {
            let now = 20_000;
            let snap = Snapshot { server_time_ms: now, queues: queues.clone() };
            let all = snap.counts();
            let each: Vec<Counts> = queues.iter().map(|q| q.counts(now)).collect();
            let sum = |f: fn(&Counts) -> u64| each.iter().map(f).sum::<u64>();
            prop_assert_eq!(all.backlog(), sum(Counts::backlog));
            prop_assert_eq!(all.waiting, queues.iter().map(|q| q.waiting).sum::<u64>());
            prop_assert_eq!(
                all.held(),
                queues.iter().flat_map(|q| &q.workers).map(|w| w.in_flight).sum::<u64>()
            );
            prop_assert_eq!(
                all.workers_live + all.workers_lost,
                queues.iter().map(|q| q.workers.len() as u64).sum::<u64>()
            );
            prop_assert_eq!(all.processed_total, sum(|c| c.processed_total));
            prop_assert_eq!(all.dead, sum(|c| c.dead));
            for (q, c) in queues.iter().zip(&each) {
                prop_assert_eq!(c.backlog(), q.waiting + q.retries_due + q.scheduled_due);
                prop_assert_eq!(c.retries_due + c.retries_scheduled, q.retries);
                prop_assert!(c.scheduled_due <= c.scheduled);
            }
            prop_assert_eq!(
                all.oldest_enqueued_at_ms,
                queues.iter().filter_map(|q| q.oldest_enqueued_at_ms).min()
            );
            prop_assert_eq!(all.taken_at_ms, now);
        }
    }
}
