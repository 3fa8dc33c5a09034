//! Inspecting and operating a queue from outside a worker: what the
//! `workerpool` command line does. Key names come from [`QueueKeys`] only.

use std::collections::HashMap;
use std::time::Duration;

use crate::connection::Conn;
use redis::{AsyncCommands, RedisResult};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::job::{DeadLetter, field, new_id};
use crate::keys::QueueKeys;
use crate::scripts;

/// Silence after which a worker counts as lost when its hash does not say
/// (the worker's `--dead-after` default).
pub const DEFAULT_DEAD_AFTER_MS: u64 = crate::snapshot::WorkerFigures::DEFAULT_DEAD_AFTER_MS;
/// Entries handled per script call when moving or removing dead letters.
const BATCH: usize = 500;
/// Dead letters read per `LRANGE`.
const PAGE: isize = 1000;

/// The Redis server's clock, unix milliseconds.
pub async fn server_time_ms(conn: &mut impl Conn) -> RedisResult<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// Whether any key of the queue exists: a queue nobody has pushed to,
/// served or counted has none.
pub async fn exists(conn: &mut impl Conn, q: &QueueKeys) -> RedisResult<bool> {
    let n: u64 = redis::cmd("EXISTS")
        .arg(q.waiting())
        .arg(q.retry())
        .arg(q.scheduled())
        .arg(q.dead())
        .arg(q.workers())
        .arg(q.stats_processed())
        .arg(q.stats_failed())
        .arg(q.stats_dead())
        .arg(q.stats_recovered())
        .query_async(conn)
        .await?;
    Ok(n > 0)
}

/// A point-in-time view of a queue's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// Jobs waiting in the list.
    pub backlog: u64,
    /// Jobs held by live workers (their processing lists).
    pub in_flight: u64,
    /// Jobs held by workers taken for lost, waiting to be reaped.
    pub held_by_lost_workers: u64,
    /// Failed jobs whose next attempt is due (moved to the queue within a second).
    pub retries_due: u64,
    /// Failed jobs waiting for their backoff to pass.
    pub retries_scheduled: u64,
    /// Delayed jobs (`run_at` in the future).
    pub scheduled: u64,
    /// Dead letters.
    pub dead: u64,
    /// Workers that heartbeat within their dead-after window.
    pub workers_live: u64,
    /// Registered workers silent past their dead-after window.
    pub workers_lost: u64,
    /// Jobs completed, ever.
    pub processed_total: u64,
    /// Failed attempts, ever.
    pub failed_total: u64,
    /// Jobs dead-lettered, ever.
    pub dead_total: u64,
    /// Jobs returned from lost workers, ever.
    pub recovered_total: u64,
    /// The Redis server's clock when it was taken, unix milliseconds.
    pub taken_at_ms: u64,
    /// The rate limit the live workers run with (`20/s`), when they have one.
    pub rate_limit: Option<String>,
}

/// Takes a [`Snapshot`] of `q` in one round trip.
pub async fn snapshot(conn: &mut impl Conn, q: &QueueKeys) -> RedisResult<Snapshot> {
    let read = crate::snapshot::read(conn, std::slice::from_ref(q)).await?;
    let f = read.queues.into_iter().next().unwrap_or_default();
    Ok(Snapshot::from_figures(&f, read.server_time_ms))
}

impl Snapshot {
    /// The counts of one queue's figures read at `now_ms` (Redis clock):
    /// workers split into live and lost by their windows, and the jobs
    /// they hold with them.
    pub fn from_figures(f: &crate::snapshot::QueueFigures, now_ms: u64) -> Self {
        let mut snap = Snapshot {
            backlog: f.waiting,
            retries_due: f.due_retries,
            retries_scheduled: f.retries.saturating_sub(f.due_retries),
            scheduled: f.scheduled,
            dead: f.dead,
            processed_total: f.processed,
            failed_total: f.failed,
            dead_total: f.dead_total,
            recovered_total: f.recovered_total,
            taken_at_ms: now_ms,
            rate_limit: f.rate_limit(now_ms).map(str::to_string),
            ..Snapshot::default()
        };
        for w in &f.workers {
            if w.alive(now_ms) {
                snap.workers_live += 1;
                snap.in_flight += w.in_flight;
            } else {
                snap.workers_lost += 1;
                snap.held_by_lost_workers += w.in_flight;
            }
        }
        snap
    }
}

/// One registered worker instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerInfo {
    /// `<worker-id>~<nonce>`.
    pub instance: String,
    /// Whether it beat within its dead-after window.
    pub alive: bool,
    /// Milliseconds since its last heartbeat (Redis clock).
    pub last_beat_age_ms: u64,
    /// Its dead-after window, as it reported it.
    pub dead_after_ms: u64,
    /// Process id, as reported.
    pub pid: Option<u64>,
    /// Jobs it may run at once.
    pub concurrency: Option<u64>,
    /// Worker version.
    pub version: Option<String>,
    /// Ids of the jobs in its processing list (`?` for a payload not yet
    /// stamped with an id).
    pub jobs: Vec<String>,
}

/// Every registered worker of `q`, as of `now_ms` (Redis clock).
pub async fn workers(
    conn: &mut impl Conn,
    q: &QueueKeys,
    now_ms: u64,
) -> RedisResult<Vec<WorkerInfo>> {
    let registered = crate::ops::workers(conn, q).await?;
    if registered.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for (instance, _) in &registered {
        pipe.hgetall(q.worker(instance))
            .lrange(q.processing(instance), 0, -1);
    }
    let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
    let mut out = Vec::with_capacity(registered.len());
    for ((instance, beat), pair) in registered.into_iter().zip(replies.chunks_exact(2)) {
        let hash: HashMap<String, String> = redis::from_redis_value_ref(&pair[0])?;
        let held: Vec<Vec<u8>> = redis::from_redis_value_ref(&pair[1])?;
        let number = |k: &str| hash.get(k).and_then(|v| v.parse::<u64>().ok());
        let dead_after_ms = number("dead_after_ms").unwrap_or(DEFAULT_DEAD_AFTER_MS);
        let age = now_ms.saturating_sub(beat);
        out.push(WorkerInfo {
            // The hash expires after twice the window: gone means lost.
            alive: !hash.is_empty() && age <= dead_after_ms,
            last_beat_age_ms: age,
            dead_after_ms,
            pid: number("pid"),
            concurrency: number("concurrency"),
            version: hash.get("version").cloned(),
            jobs: held.iter().map(|raw| job_id(raw)).collect(),
            instance,
        });
    }
    Ok(out)
}

fn job_id(raw: &[u8]) -> String {
    serde_json::from_slice::<Value>(raw)
        .ok()
        .and_then(|v| v.get(field::ID).and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// An entry of the dead list: as stored, and decoded when it decodes.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadEntry {
    /// The entry exactly as stored (needed to remove it): bytes, since
    /// anything can be pushed onto a list.
    pub raw: Vec<u8>,
    /// The decoded envelope.
    pub letter: Option<DeadLetter>,
}

impl DeadEntry {
    /// The dead job's id, when it has one.
    pub fn job_id(&self) -> Option<&str> {
        self.letter
            .as_ref()
            .and_then(|l| l.job.get(field::ID))
            .and_then(Value::as_str)
    }
}

/// The dead letters of `q`, newest first; with `id`, only that job's; with
/// `limit`, at most that many. The list is read a page at a time, so
/// looking for one job keeps one page in memory however long the list is.
pub async fn dead_letters(
    conn: &mut impl Conn,
    q: &QueueKeys,
    id: Option<&str>,
    limit: Option<usize>,
) -> RedisResult<Vec<DeadEntry>> {
    let limit = limit.unwrap_or(usize::MAX);
    let mut found = Vec::new();
    let mut start = 0;
    while found.len() < limit {
        let page = dead_range(conn, q, start, start + PAGE - 1).await?;
        let last = page.len() < PAGE as usize;
        start += PAGE;
        found.extend(
            page.into_iter()
                .filter(|e| id.is_none() || e.job_id() == id)
                .take(limit - found.len()),
        );
        if last {
            break;
        }
    }
    Ok(found)
}

/// How many entries the dead list of `q` has.
pub async fn dead_count(conn: &mut impl Conn, q: &QueueKeys) -> RedisResult<u64> {
    conn.llen(q.dead()).await
}

/// Entries `start` to `stop` of the dead list (`LRANGE` indexes: negative
/// ones count from the oldest end).
async fn dead_range(
    conn: &mut impl Conn,
    q: &QueueKeys,
    start: isize,
    stop: isize,
) -> RedisResult<Vec<DeadEntry>> {
    let raw: Vec<Vec<u8>> = conn.lrange(q.dead(), start, stop).await?;
    Ok(raw
        .into_iter()
        .map(|raw| DeadEntry {
            letter: serde_json::from_slice(&raw).ok(),
            raw,
        })
        .collect())
}

/// One page of the waiting list, next to run first: entries `offset` to
/// `offset + count - 1` counted from the end workers take from. One
/// `LRANGE` near the tail, so a page costs the same with a million jobs
/// waiting.
pub async fn waiting_page(
    conn: &mut impl Conn,
    q: &QueueKeys,
    offset: u64,
    count: u64,
) -> RedisResult<Vec<Vec<u8>>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    // Workers pop from the right: index -1 runs next.
    let offset = i64::try_from(offset).unwrap_or(i64::MAX);
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    let stop = (-1i64).saturating_sub(offset);
    let start = stop.saturating_sub(count - 1);
    let mut page: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(q.waiting())
        .arg(start)
        .arg(stop)
        .query_async(conn)
        .await?;
    page.reverse();
    Ok(page)
}

/// One page of a sorted set of jobs (`<q>:retry` or `<q>:scheduled`),
/// soonest first, with each member's score (due time, unix ms).
pub async fn due_page(
    conn: &mut impl Conn,
    key: &str,
    offset: u64,
    count: u64,
) -> RedisResult<Vec<(Vec<u8>, u64)>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let entries: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(offset)
        .arg(offset.saturating_add(count - 1))
        .arg("WITHSCORES")
        .query_async(conn)
        .await?;
    Ok(entries
        .into_iter()
        .map(|(raw, score)| (raw, score as u64))
        .collect())
}

/// One page of the dead letters of `q`, newest first.
pub async fn dead_page(
    conn: &mut impl Conn,
    q: &QueueKeys,
    offset: u64,
    count: u64,
) -> RedisResult<Vec<DeadEntry>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(q.dead())
        .arg(offset)
        .arg(offset.saturating_add(count - 1))
        .query_async(conn)
        .await?;
    Ok(raw
        .into_iter()
        .map(|raw| DeadEntry {
            letter: serde_json::from_slice(&raw).ok(),
            raw,
        })
        .collect())
}

/// The payload a dead job restarts with: its object without `attempt`,
/// `error` and `run_at`, enqueued now. `None` for a malformed payload
/// (it would only die again).
pub fn fresh_start(letter: &DeadLetter, now_ms: u64) -> Option<String> {
    let Value::Object(fields) = &letter.job else {
        return None;
    };
    let mut fields = fields.clone();
    for f in [field::ATTEMPT, field::ERROR, field::RUN_AT] {
        fields.shift_remove(f);
    }
    fields.insert(field::ENQUEUED_AT.into(), Value::from(now_ms));
    Some(Value::Object(fields).to_string())
}

/// What `retry_dead` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Resurrected {
    /// Jobs moved back onto the queue.
    pub retried: u64,
    /// Entries left in the dead list because their payload is not a job.
    pub skipped_malformed: u64,
}

/// Moves dead jobs (all, or those with `id`) back onto the queue for a
/// fresh start (see [`fresh_start`]), oldest first so that they keep their
/// order. Each entry moves atomically and at most once, even with several
/// of these running at once. Only the entries there when it starts are
/// looked at (a retried job that dies again is not retried again), a page
/// at a time from the oldest end.
pub async fn retry_dead(
    conn: &mut impl Conn,
    q: &QueueKeys,
    id: Option<&str>,
) -> RedisResult<Resurrected> {
    let now = server_time_ms(conn).await?;
    let mut report = Resurrected::default();
    let there = isize::try_from(dead_count(conn, q).await?).unwrap_or(isize::MAX);
    // Entries looked at and left in the list: they stay at its oldest end,
    // so the next page starts before them.
    let (mut looked, mut left) = (0, 0);
    while looked < there {
        let want = PAGE.min(there - looked);
        let stop = -1 - left;
        let page = dead_range(conn, q, stop - (want - 1), stop).await?;
        if page.is_empty() {
            break;
        }
        looked += page.len() as isize;
        let mut pairs = Vec::with_capacity(page.len());
        // Oldest first: the page lists the newest first.
        for entry in page.into_iter().rev() {
            if id.is_some() && entry.job_id() != id {
                left += 1;
                continue;
            }
            match entry.letter.as_ref().and_then(|l| fresh_start(l, now)) {
                Some(payload) => pairs.push((entry.raw, payload)),
                None => {
                    report.skipped_malformed += 1;
                    left += 1;
                }
            }
        }
        for chunk in pairs.chunks(BATCH) {
            let mut invocation = scripts::RESURRECT.prepare_invoke();
            invocation.key(q.dead()).key(q.waiting());
            for (raw, payload) in chunk {
                invocation.arg(raw).arg(payload);
            }
            let moved: u64 = invocation.invoke_async(conn).await?;
            report.retried += moved;
        }
    }
    Ok(report)
}

/// Removes dead letters, all or those of job `id`, and returns how many.
/// All of them go in one step (entries added after it stay); those of one
/// job are found a page at a time.
pub async fn purge_dead(conn: &mut impl Conn, q: &QueueKeys, id: Option<&str>) -> RedisResult<u64> {
    let Some(id) = id else {
        return scripts::PURGE.key(q.dead()).invoke_async(conn).await;
    };
    let entries = dead_letters(conn, q, Some(id), None).await?;
    let mut removed = 0;
    for chunk in entries.chunks(BATCH) {
        let mut invocation = scripts::REMOVE.prepare_invoke();
        invocation.key(q.dead());
        for e in chunk {
            invocation.arg(&e.raw);
        }
        let n: u64 = invocation.invoke_async(conn).await?;
        removed += n;
    }
    Ok(removed)
}

/// What [`enqueue`] did with one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Enqueued {
    /// The job's id (its own, or the one given to it).
    pub id: String,
    /// `false`: refused, because another job of the queue holds its
    /// `unique_key`.
    pub accepted: bool,
}

/// Pushes jobs onto `q` in order (the first runs first), each given an
/// `id` and `enqueued_at` when it has none; with `delay`, parks them in
/// the scheduled set with `run_at` that far ahead (Redis clock). When any
/// job has a `unique_key` the batch goes through `enqueue.lua`, which
/// refuses a job whose key another job of the queue holds; otherwise the
/// jobs are pushed with `LPUSH` (or `ZADD`). A job whose `unique_key` or
/// `unique_for` is malformed (see [`crate::job::unique_of`]) is an error
/// and nothing is pushed.
pub async fn enqueue(
    conn: &mut impl Conn,
    q: &QueueKeys,
    jobs: Vec<Map<String, Value>>,
    delay: Option<Duration>,
) -> RedisResult<Vec<Enqueued>> {
    // Each job's hold (unique key, ms), checked before anything is pushed.
    let mut holds = Vec::with_capacity(jobs.len());
    for (i, fields) in jobs.iter().enumerate() {
        match crate::job::unique_of(fields) {
            Ok(u) => holds.push(u.map(|(key, secs)| (key.to_string(), secs.saturating_mul(1000)))),
            Err(e) => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "invalid job",
                    format!("job {}: {e}; nothing was enqueued", i + 1),
                )));
            }
        }
    }
    let unique = holds.iter().any(Option::is_some);
    let now = server_time_ms(conn).await?;
    let run_at = delay.map(|d| now + d.as_millis() as u64);
    let mut out = Vec::with_capacity(jobs.len());
    let mut payloads = Vec::with_capacity(jobs.len());
    for (mut fields, hold) in jobs.into_iter().zip(holds) {
        let id = match fields.get(field::ID).and_then(Value::as_str) {
            Some(id) => id.to_string(),
            None => {
                let id = new_id();
                fields.insert(field::ID.into(), Value::from(id.clone()));
                id
            }
        };
        if !fields.contains_key(field::ENQUEUED_AT) {
            fields.insert(field::ENQUEUED_AT.into(), Value::from(now));
        }
        if let Some(run_at) = run_at {
            fields.insert(field::RUN_AT.into(), Value::from(run_at));
        }
        out.push(Enqueued { id, accepted: true });
        payloads.push((Value::Object(fields).to_string(), hold));
    }
    if unique {
        let mut next = 0;
        for chunk in payloads.chunks(BATCH) {
            let mut invocation = scripts::ENQUEUE.prepare_invoke();
            invocation
                .key(q.waiting())
                .key(q.scheduled())
                .key(q.unique())
                .key(q.unique_expiry());
            for (i, (payload, hold)) in chunk.iter().enumerate() {
                invocation
                    .arg(payload)
                    .arg(run_at.map(|at| at.to_string()).unwrap_or_default())
                    .arg(&out[next + i].id);
                match hold {
                    Some((key, ms)) => invocation.arg(key).arg(*ms),
                    None => invocation.arg("").arg(0),
                };
            }
            let accepted: Vec<i64> = invocation.invoke_async(conn).await?;
            for (i, a) in accepted.into_iter().enumerate() {
                out[next + i].accepted = a == 1;
            }
            next += chunk.len();
        }
        return Ok(out);
    }
    for chunk in payloads.chunks(BATCH) {
        let chunk: Vec<&String> = chunk.iter().map(|(p, _)| p).collect();
        match run_at {
            Some(at) => {
                let members: Vec<(u64, &String)> = chunk.iter().map(|p| (at, *p)).collect();
                let _: u64 = conn.zadd_multiple(q.scheduled(), &members).await?;
            }
            None => {
                let _: u64 = conn.lpush(q.waiting(), chunk).await?;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::DeadReason;
    use serde_json::json;

    #[test]
    fn a_fresh_start_drops_attempt_error_and_run_at_and_keeps_the_rest_in_order() {
        let letter = DeadLetter {
            reason: DeadReason::Exhausted,
            error: "boom".into(),
            attempts: 5,
            died_at: 1,
            worker: "w~1".into(),
            job: json!({"task": "t", "id": "j", "attempt": 5, "error": "boom",
                        "run_at": 3, "enqueued_at": 2, "extra": [1]}),
            encoding: None,
            size: None,
        };
        assert_eq!(
            fresh_start(&letter, 99).as_deref(),
            Some(r#"{"task":"t","id":"j","enqueued_at":99,"extra":[1]}"#)
        );
        let malformed = DeadLetter {
            reason: DeadReason::Malformed,
            job: Value::from("not json"),
            ..letter
        };
        assert_eq!(fresh_start(&malformed, 99), None);
    }
}
