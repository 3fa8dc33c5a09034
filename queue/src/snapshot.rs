//! A read of everything a queue's readers need — backlog, retries, in-flight
//! jobs per worker, counters, the oldest waiting job — in one round trip.
//! The operator polls this for scaling; the CLI shows it.

use std::sync::LazyLock;

use crate::connection::Conn;
use redis::{RedisResult, Script, Value};

use crate::job::field;
use crate::keys::QueueKeys;

static SNAPSHOT: LazyLock<Script> = LazyLock::new(|| crate::scripts::composed("snapshot.lua"));

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
    /// Jobs waiting in the list.
    pub waiting: u64,
    /// Failed jobs whose next attempt is due.
    pub due_retries: u64,
    /// Failed jobs waiting for their next attempt, due or not.
    pub retries: u64,
    /// Delayed jobs whose `run_at` has come.
    pub due_scheduled: u64,
    /// Delayed jobs, due or not.
    pub scheduled: u64,
    /// Dead letters.
    pub dead: u64,
    /// Jobs completed (monotonic counter).
    pub processed: u64,
    /// Failed attempts (monotonic counter).
    pub failed: u64,
    /// Jobs dead-lettered (monotonic counter).
    pub dead_total: u64,
    /// Jobs returned from lost workers (monotonic counter).
    pub recovered_total: u64,
    /// `enqueued_at` of the job at the head of the queue, when it has one.
    pub oldest_enqueued_at_ms: Option<u64>,
    /// Registered workers.
    pub workers: Vec<WorkerFigures>,
}

impl QueueFigures {
    /// Jobs ready to run: waiting plus due retries and due delayed jobs.
    pub fn backlog(&self) -> u64 {
        self.waiting + self.due_retries + self.due_scheduled
    }

    /// Jobs held by workers (including workers not yet found lost).
    pub fn in_flight(&self) -> u64 {
        self.workers.iter().map(|w| w.in_flight).sum()
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

/// Figures of a set of queues at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The Redis server's clock, unix ms.
    pub server_time_ms: u64,
    /// One entry per queue, in the order asked.
    pub queues: Vec<QueueFigures>,
}

impl Snapshot {
    /// Backlog over all queues.
    pub fn backlog(&self) -> u64 {
        self.queues.iter().map(QueueFigures::backlog).sum()
    }

    /// Jobs running over all queues.
    pub fn in_flight(&self) -> u64 {
        self.queues.iter().map(QueueFigures::in_flight).sum()
    }

    /// Due retries and delayed jobs over all queues.
    pub fn due_retries(&self) -> u64 {
        self.queues
            .iter()
            .map(|q| q.due_retries + q.due_scheduled)
            .sum()
    }

    /// Completed jobs over all queues (monotonic).
    pub fn processed(&self) -> u64 {
        self.queues.iter().map(|q| q.processed).sum()
    }

    /// Age in seconds of the oldest waiting job that carries `enqueued_at`.
    pub fn oldest_job_age_seconds(&self) -> Option<f64> {
        self.queues
            .iter()
            .filter_map(|q| q.oldest_enqueued_at_ms)
            .min()
            .map(|t| self.server_time_ms.saturating_sub(t) as f64 / 1000.0)
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

    /// Jobs in flight per worker id (the pod name), over all queues and
    /// incarnations.
    pub fn in_flight_by_worker_id(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for w in self.queues.iter().flat_map(|q| &q.workers) {
            let id = crate::keys::Instance::id_of(&w.instance).unwrap_or(&w.instance);
            *out.entry(id.to_string()).or_default() += w.in_flight;
        }
        out
    }
}

/// Reads `queues` in one round trip.
pub async fn read(conn: &mut impl Conn, queues: &[QueueKeys]) -> RedisResult<Snapshot> {
    let mut invocation = SNAPSHOT.prepare_invoke();
    for q in queues {
        invocation
            .key(q.waiting())
            .key(q.retry())
            .key(q.scheduled())
            .key(q.dead())
            .key(q.workers())
            .key(q.stats_processed())
            .key(q.stats_failed())
            .key(q.stats_dead())
            .key(q.stats_recovered());
    }
    for q in queues {
        invocation.arg(q.processing("")).arg(q.worker(""));
    }
    let reply: Vec<Value> = invocation.invoke_async(conn).await?;
    parse(&reply, queues).ok_or_else(|| {
        redis::RedisError::from((redis::ErrorKind::Parse, "unexpected snapshot reply shape"))
    })
}

fn parse(reply: &[Value], queues: &[QueueKeys]) -> Option<Snapshot> {
    let (now, entries) = reply.split_first()?;
    let server_time_ms = int(now)?;
    let mut out = Vec::with_capacity(queues.len());
    for (q, entry) in queues.iter().zip(entries) {
        let Value::Array(f) = entry else { return None };
        if f.len() != 12 {
            return None;
        }
        // The head is whatever a producer pushed: read it as bytes.
        let head: Vec<u8> = redis::from_redis_value_ref(&f[8]).ok()?;
        let oldest = serde_json::from_slice::<serde_json::Value>(&head)
            .ok()
            .and_then(|j| {
                j.get(field::ENQUEUED_AT)
                    .and_then(serde_json::Value::as_u64)
            });
        let Value::Array(w) = &f[9] else { return None };
        let workers = w
            .chunks_exact(6)
            .map(|c| {
                Some(WorkerFigures {
                    instance: string(&c[0])?,
                    last_beat_ms: string(&c[1])?.parse::<f64>().ok()? as u64,
                    in_flight: int(&c[2])?,
                    dead_after_ms: match string(&c[3])?.as_str() {
                        "" => None,
                        "-" => Some(WorkerFigures::DEFAULT_DEAD_AFTER_MS),
                        n => Some(n.parse().ok()?),
                    },
                    rate_limit: Some(string(&c[4])?).filter(|r| !r.is_empty()),
                    handler_problem: Some(string(&c[5])?).filter(|p| !p.is_empty()),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        out.push(QueueFigures {
            name: q.name().to_string(),
            waiting: int(&f[0])?,
            due_retries: int(&f[1])?,
            retries: int(&f[2])?,
            due_scheduled: int(&f[3])?,
            scheduled: int(&f[4])?,
            dead: int(&f[5])?,
            processed: int(&f[6])?,
            failed: int(&f[7])?,
            dead_total: int(&f[10])?,
            recovered_total: int(&f[11])?,
            oldest_enqueued_at_ms: oldest,
            workers,
        });
    }
    Some(Snapshot {
        server_time_ms,
        queues: out,
    })
}

fn int(v: &Value) -> Option<u64> {
    redis::from_redis_value_ref::<u64>(v).ok()
}

fn string(v: &Value) -> Option<String> {
    redis::from_redis_value_ref::<String>(v).ok()
}
