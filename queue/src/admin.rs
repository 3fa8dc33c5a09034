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
/// Dead letters read per page when searching the dead list (each kept up
/// to [`DEAD_WHOLE_BYTES`]).
const PAGE: isize = 100;

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
        .arg(q.stats_duration())
        .arg(q.stats_duration_sq())
        .query_async(conn)
        .await?;
    Ok(n > 0)
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

/// The longest dead letter read whole (ordinary ones, whose jobs ran
/// under a worker's size limit, with a handler's error of any length): a
/// longer one is read as its first [`DEAD_PREVIEW_BYTES`], its last
/// [`DEAD_TAIL_BYTES`] and its digest, so that what a reader keeps is
/// bounded by a page, and what it holds at once by one entry, read alone
/// and cut at once (a `too_large` dead letter keeps a payload of any size;
/// Redis has no command that sends part of a list's entry, and the reads
/// are plain commands so that read-only users can run them).
pub const DEAD_WHOLE_BYTES: usize = 256 * 1024;
/// How much of the start of a dead letter longer than
/// [`DEAD_WHOLE_BYTES`] is read.
pub const DEAD_PREVIEW_BYTES: usize = 64 * 1024;
/// How much of the end of a cut dead letter is read (where producers that
/// follow the contract's advice write a job's `id`).
pub const DEAD_TAIL_BYTES: usize = 256;

/// An entry of the dead list: as stored (or its start, when it is longer
/// than [`DEAD_WHOLE_BYTES`]), and decoded when it decodes.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadEntry {
    /// The entry exactly as stored (needed to remove it): bytes, since
    /// anything can be pushed onto a list. Only its first
    /// [`DEAD_PREVIEW_BYTES`] when [`DeadEntry::cut`] is set.
    pub raw: Vec<u8>,
    /// The decoded envelope. For a cut entry, its fields before `job`,
    /// and as `job` an object of the job's top-level `id` and `task` when
    /// they could be read from the entry's start or end.
    pub letter: Option<DeadLetter>,
    /// The entry's length in bytes, as stored.
    pub size: u64,
    /// Set when `raw` is only the entry's start.
    pub cut: Option<Cut>,
    /// Its index counted from the oldest end when read (-1 the oldest).
    pub from_oldest: i64,
}

/// What identifies a dead letter read as its start only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// The entry's last bytes (up to [`DEAD_TAIL_BYTES`]).
    pub tail: Vec<u8>,
    /// SHA-1 of the whole entry, hex.
    pub digest: String,
}

impl DeadEntry {
    /// The dead job's id, when it has one.
    pub fn job_id(&self) -> Option<&str> {
        self.letter
            .as_ref()
            .and_then(|l| l.job.get(field::ID))
            .and_then(Value::as_str)
    }

    /// The job's bytes as far as they were read: the whole job for an
    /// entry read whole is in [`DeadEntry::letter`]; for a cut one, the
    /// part of its start after `"job":`.
    pub fn job_start(&self) -> Option<&[u8]> {
        self.cut.as_ref()?;
        let at = find(&self.raw, JOB_FIELD)?;
        Some(&self.raw[at + JOB_FIELD.len()..])
    }

    fn read(raw: Vec<u8>, size: u64, cut: Option<Cut>, from_oldest: i64) -> Self {
        let letter = match &cut {
            // A too_large entry whose payload is not JSON is not either:
            // its fields before `job` still are.
            None => serde_json::from_slice(&raw)
                .ok()
                .or_else(|| cut_letter(&raw, &raw[raw.len().saturating_sub(DEAD_TAIL_BYTES)..])),
            Some(cut) => cut_letter(&raw, &cut.tail),
        };
        DeadEntry {
            raw,
            letter,
            size,
            cut,
            from_oldest,
        }
    }

    /// Whether the entry keeps its payload verbatim (a too_large one).
    fn keeps_raw(&self) -> bool {
        self.letter
            .as_ref()
            .is_some_and(|l| l.encoding == Some(crate::job::Encoding::Raw))
    }

    /// Its digest: from Redis for a cut entry, else of the bytes read.
    fn digest(&self) -> String {
        match &self.cut {
            Some(cut) => cut.digest.clone(),
            None => sha1_hex(&self.raw),
        }
    }
}

/// The envelope's `job` field, after the fields every writer puts before
/// it (`reason`, `error`, `attempts`, `died_at`, `worker`, and for a
/// too_large entry `size` and `encoding`): a string's quote is always
/// escaped inside a JSON string, so the first match is the field.
const JOB_FIELD: &[u8] = b",\"job\":";

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The envelope of a dead letter read as its start: its fields before
/// `job`, and the job's `id` and `task` where they can be read.
fn cut_letter(start: &[u8], tail: &[u8]) -> Option<DeadLetter> {
    let at = find(start, JOB_FIELD)?;
    let mut head = start[..at].to_vec();
    head.extend_from_slice(b",\"job\":null}");
    let mut letter: DeadLetter = serde_json::from_slice(&head).ok()?;
    let job = &start[at + JOB_FIELD.len()..];
    let mut fields = top_level_strings(job);
    if !fields.contains_key(field::ID)
        && let Some(id) = id_at_end(tail)
    {
        fields.insert(field::ID.into(), Value::from(id));
    }
    letter.job = Value::Object(fields);
    Some(letter)
}

/// The top-level `id` and `task` of a JSON object's start, when they are
/// strings without escapes (the rest of the object may be cut off).
fn top_level_strings(job: &[u8]) -> Map<String, Value> {
    let mut found = Map::new();
    let Some(text) = job.utf8_chunks().next().map(|c| c.valid()) else {
        return found;
    };
    let bytes = text.as_bytes();
    if bytes.first() != Some(&b'{') {
        return found;
    }
    let (mut depth, mut i) = (0usize, 0usize);
    // Each string's span, to read a key and its value.
    let string_end = |from: usize| -> Option<usize> {
        let mut j = from + 1;
        while j < bytes.len() {
            match bytes[j] {
                b'\\' => j += 2,
                b'"' => return Some(j),
                _ => j += 1,
            }
        }
        None
    };
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let Some(end) = string_end(i) else { break };
                let key = &text[i + 1..end];
                let after = text[end + 1..].trim_start();
                if depth == 1
                    && (key == field::ID || key == field::TASK)
                    && let Some(value) = after.strip_prefix(':').map(str::trim_start)
                    && let Some(value) = value.strip_prefix('"')
                    && let Some(close) = value.find('"')
                    && !value[..close].contains('\\')
                    && !found.contains_key(key)
                {
                    found.insert(key.to_string(), Value::from(&value[..close]));
                }
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The id of a job whose object ends, as the contract's producers write
/// it, with `"id":"…","enqueued_at":N}`, read from the end of a too_large
/// entry (the job's closing brace, then the envelope's).
fn id_at_end(tail: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(tail).ok()?;
    let rest = text.strip_suffix("}}")?;
    let at = rest.rfind(",\"enqueued_at\":")?;
    if !rest[at + 15..].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let before = rest[..at].strip_suffix('"')?;
    let start = before.rfind("\"id\":\"")?;
    let id = &before[start + 6..];
    (!id.contains(['"', '\\'])).then(|| id.to_string())
}

/// The dead letters of `q`, newest first; with `id`, only that job's; with
/// `limit`, at most that many. The list is read a page at a time, each
/// entry longer than [`DEAD_WHOLE_BYTES`] cut (see [`DeadEntry`]), so
/// looking for one job keeps one page in memory however long the list is
/// and however large its entries.
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
        // Without a filter, no more than asked for is read.
        let want = if id.is_none() {
            PAGE.min(isize::try_from(limit - found.len()).unwrap_or(PAGE))
        } else {
            PAGE
        };
        let (_, page) = dead_range(conn, q, start, want).await?;
        let last = page.len() < want as usize;
        start += want;
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

/// `count` entries of the dead list from index `start` (`LRANGE` indexes:
/// negative ones count from the oldest end), each longer than
/// [`DEAD_WHOLE_BYTES`] cut, with the list's length. Plain reads only (no
/// script, so read-only users can list dead letters): the length, then
/// one `LINDEX` per entry, by its place counted from the oldest end (new
/// dead letters are pushed at the other end, so the places read stay
/// those of the entries meant). A long entry is cut as soon as it arrives,
/// so the reader holds one whole entry at most, never a page of them.
async fn dead_range(
    conn: &mut impl Conn,
    q: &QueueKeys,
    start: isize,
    count: isize,
) -> RedisResult<(u64, Vec<DeadEntry>)> {
    let total = dead_count(conn, q).await?;
    if count <= 0 {
        return Ok((total, Vec::new()));
    }
    let len = i64::try_from(total).unwrap_or(i64::MAX);
    let first = match i64::try_from(start).unwrap_or(i64::MAX) {
        s if s < 0 => (len + s).max(0),
        s => s,
    };
    let end = first
        .saturating_add(i64::try_from(count).unwrap_or(i64::MAX))
        .min(len);
    let mut entries = Vec::new();
    for i in first..end {
        let from_oldest = i - len;
        let entry: Option<Vec<u8>> = redis::cmd("LINDEX")
            .arg(q.dead())
            .arg(from_oldest)
            .query_async(conn)
            .await?;
        // Shorter than it was: entries were removed meanwhile.
        let Some(entry) = entry else { break };
        entries.push(cut_dead(entry, from_oldest));
    }
    Ok((total, entries))
}

/// A dead letter as read: whole up to [`DEAD_WHOLE_BYTES`], else its first
/// [`DEAD_PREVIEW_BYTES`], its last [`DEAD_TAIL_BYTES`] (no more than
/// follows the start) and its SHA-1, by which it is found again.
fn cut_dead(mut entry: Vec<u8>, from_oldest: i64) -> DeadEntry {
    let size = entry.len() as u64;
    if entry.len() <= DEAD_WHOLE_BYTES {
        return DeadEntry::read(entry, size, None, from_oldest);
    }
    let preview = DEAD_PREVIEW_BYTES;
    let tail = DEAD_TAIL_BYTES.min(entry.len() - preview);
    let digest = sha1_hex(&entry);
    let tail = entry[entry.len() - tail..].to_vec();
    entry.truncate(preview);
    entry.shrink_to_fit();
    DeadEntry::read(entry, size, Some(Cut { tail, digest }), from_oldest)
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

/// One page of the dead letters of `q`, newest first, each entry longer
/// than [`DEAD_WHOLE_BYTES`] cut (see [`DeadEntry`]).
pub async fn dead_page(
    conn: &mut impl Conn,
    q: &QueueKeys,
    offset: u64,
    count: u64,
) -> RedisResult<Vec<DeadEntry>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let start = isize::try_from(offset).unwrap_or(isize::MAX);
    let count = isize::try_from(count).unwrap_or(isize::MAX);
    Ok(dead_range(conn, q, start, count).await?.1)
}

/// The whole of a cut dead letter, read again by its place and digest
/// (`None`: no longer in the list). For entries whose job is needed whole
/// (a retry computes its fresh start); these are bounded by the workers'
/// payload size limit, unlike too_large ones, which never come here.
async fn dead_whole(
    conn: &mut impl Conn,
    q: &QueueKeys,
    entry: &DeadEntry,
) -> RedisResult<Option<Vec<u8>>> {
    let raw: Option<Vec<u8>> = redis::cmd("LINDEX")
        .arg(q.dead())
        .arg(entry.from_oldest)
        .query_async(conn)
        .await?;
    Ok(raw.filter(|raw| sha1_hex(raw) == entry.digest()))
}

fn sha1_hex(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

/// Runs `dead_pick.lua` on one entry: `R` removes it, `Q` requeues the
/// payload a too_large one keeps. Returns the script's code: 1 done, 0
/// gone, -1 left.
async fn dead_pick(
    conn: &mut impl Conn,
    q: &QueueKeys,
    action: &str,
    entry: &DeadEntry,
) -> RedisResult<i64> {
    let done: Vec<i64> = scripts::DEAD_PICK
        .key(q.dead())
        .key(q.waiting())
        .arg(action)
        .arg(entry.from_oldest)
        .arg(entry.size)
        .arg(entry.digest())
        .invoke_async(conn)
        .await?;
    Ok(done.first().copied().unwrap_or(0))
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
        let (_, page) = dead_range(conn, q, -left - want, want).await?;
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
            match (&entry.cut, entry.keeps_raw()) {
                // A too_large job goes back in Redis, as it was taken:
                // after the jobs before it, so the order is kept.
                (_, true) => {
                    resurrect(conn, q, &mut pairs, &mut report).await?;
                    match dead_pick(conn, q, "Q", &entry).await? {
                        1 => report.retried += 1,
                        -1 => {
                            report.skipped_malformed += 1;
                            left += 1;
                        }
                        _ => {}
                    }
                }
                (Some(_), false) => {
                    // Bounded by the payload limit: read it whole, alone.
                    let whole = dead_whole(conn, q, &entry).await?;
                    let letter = whole
                        .as_deref()
                        .and_then(|w| serde_json::from_slice::<DeadLetter>(w).ok());
                    match (whole, letter.and_then(|l| fresh_start(&l, now))) {
                        (Some(raw), Some(payload)) => pairs.push((raw, payload)),
                        (None, _) => {}
                        (Some(_), None) => {
                            report.skipped_malformed += 1;
                            left += 1;
                        }
                    }
                }
                (None, _) => match entry.letter.as_ref().and_then(|l| fresh_start(l, now)) {
                    Some(payload) => pairs.push((entry.raw, payload)),
                    None => {
                        report.skipped_malformed += 1;
                        left += 1;
                    }
                },
            }
        }
        resurrect(conn, q, &mut pairs, &mut report).await?;
    }
    Ok(report)
}

/// Moves `pairs` (entry as stored, payload to push) back onto the queue
/// (`resurrect.lua`), emptying it.
async fn resurrect(
    conn: &mut impl Conn,
    q: &QueueKeys,
    pairs: &mut Vec<(Vec<u8>, String)>,
    report: &mut Resurrected,
) -> RedisResult<()> {
    for chunk in pairs.chunks(BATCH) {
        let mut invocation = scripts::RESURRECT.prepare_invoke();
        invocation.key(q.dead()).key(q.waiting());
        for (raw, payload) in chunk {
            invocation.arg(raw).arg(payload);
        }
        let moved: u64 = invocation.invoke_async(conn).await?;
        report.retried += moved;
    }
    pairs.clear();
    Ok(())
}

/// Removes dead letters, all or those of job `id`, and returns how many.
/// All of them go in one step (entries added after it stay); those of one
/// job are found a page at a time (long entries by their digest, never
/// read whole).
pub async fn purge_dead(conn: &mut impl Conn, q: &QueueKeys, id: Option<&str>) -> RedisResult<u64> {
    let Some(id) = id else {
        return scripts::PURGE.key(q.dead()).invoke_async(conn).await;
    };
    let entries = dead_letters(conn, q, Some(id), None).await?;
    let (cut, whole): (Vec<&DeadEntry>, Vec<&DeadEntry>) =
        entries.iter().partition(|e| e.cut.is_some());
    let mut removed = 0;
    for chunk in whole.chunks(BATCH) {
        let mut invocation = scripts::REMOVE.prepare_invoke();
        invocation.key(q.dead());
        for e in chunk {
            invocation.arg(&e.raw);
        }
        let n: u64 = invocation.invoke_async(conn).await?;
        removed += n;
    }
    for e in cut {
        if dead_pick(conn, q, "R", e).await? == 1 {
            removed += 1;
        }
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
    // Each job's hold (unique key, ms) and keep, checked before anything
    // is pushed.
    let mut holds = Vec::with_capacity(jobs.len());
    let mut keeps = Vec::with_capacity(jobs.len());
    for (i, fields) in jobs.iter().enumerate() {
        let invalid = |e: String| {
            redis::RedisError::from((
                redis::ErrorKind::Client,
                "invalid job",
                format!("job {}: {e}; nothing was enqueued", i + 1),
            ))
        };
        let hold = crate::job::unique_of(fields).map_err(invalid)?;
        holds.push(hold.map(|(key, secs)| (key.to_string(), secs.saturating_mul(1000))));
        keeps.push(crate::job::keep_of(fields).map_err(invalid)?);
    }
    // Jobs that hold a unique key or keep their outcome go in through the
    // script, which writes both in the same step.
    let scripted = holds.iter().any(Option::is_some) || keeps.iter().any(Option::is_some);
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
    if scripted {
        let mut next = 0;
        for chunk in payloads.chunks(BATCH) {
            let mut invocation = scripts::ENQUEUE.prepare_invoke();
            invocation
                .key(q.waiting())
                .key(q.scheduled())
                .key(q.unique())
                .key(q.unique_expiry());
            // A kept job's outcome keys follow the four (1-based position).
            let mut keys = 4;
            for (i, (payload, hold)) in chunk.iter().enumerate() {
                let id = &out[next + i].id;
                invocation
                    .arg(payload)
                    .arg(run_at.map(|at| at.to_string()).unwrap_or_default())
                    .arg(id);
                match hold {
                    Some((key, ms)) => invocation.arg(key).arg(*ms),
                    None => invocation.arg("").arg(0),
                };
                match keeps[next + i] {
                    Some(keep) => {
                        invocation
                            .key(q.outcome(id))
                            .key(q.outcome_end(id))
                            .arg(keys + 1)
                            .arg(keep.as_millis().max(1) as u64);
                        keys += 2;
                    }
                    None => {
                        invocation.arg("").arg("");
                    }
                }
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
