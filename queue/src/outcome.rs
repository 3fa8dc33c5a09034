//! A job's outcome, kept for the jobs that ask (`keep`) or by workers that
//! keep every one (docs/queue-contract.md, "Outcomes"): where a job is and
//! what became of it, read by id in O(1), and waited for without polling.
//!
//! The settle script writes the outcome in the same script that acks,
//! retries or dead-letters the job ([`crate::ops::Kept`]): a job shown as
//! done has its result readable in the same instant, and a settlement that
//! finds its job gone (a reaper returned it meanwhile) writes nothing, so
//! a job run twice ends with its last run's outcome.

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;
use serde::Serialize;

use crate::connection::Conn;
use crate::keys::QueueKeys;
use crate::ops::RedisResult;

/// The longest result kept, in bytes of JSON text. A longer one leaves the
/// job done without it, and `result_error` says why.
pub const MAX_RESULT_BYTES: usize = 1 << 20;

/// The longest answer line an exec child may write: room for the longest
/// result kept and the rest of its answer. A longer one is a protocol
/// break (the child is replaced). A client library that would answer with
/// a longer result answers `"result_error"` instead.
pub const MAX_ANSWER_BYTES: usize = 2 * MAX_RESULT_BYTES;

/// The longest a waiter blocks in one command: a connection whose response
/// timeout is longer than this can wait any time.
pub const WAIT_SLICE: Duration = Duration::from_secs(5);

/// Where a kept job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Taken by a worker, its handler running.
    Running,
    /// An attempt failed; the next is due at `next_at_ms`.
    Retrying,
    /// Completed, with its result when it returned one.
    Done,
    /// Dead-lettered, with its error.
    Dead,
}

impl State {
    /// The word in the hash.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Retrying => "retrying",
            State::Done => "done",
            State::Dead => "dead",
        }
    }

    /// Whether nothing more happens to the job.
    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Dead)
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => State::Running,
            "retrying" => State::Retrying,
            "done" => State::Done,
            "dead" => State::Dead,
            _ => return None,
        })
    }
}

/// A job's outcome as kept in `<q>:job:<id>`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The job's id.
    pub id: String,
    pub state: State,
    /// The attempt running or last ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The worker instance it runs or last ran on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// A done job's result, as the handler returned it (JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// Why a done job has no result though its handler returned one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_error: Option<String>,
    /// The last attempt's error (retrying, dead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When a retrying job's next attempt is due (unix ms, Redis clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_at_ms: Option<u64>,
    /// When the outcome last changed (unix ms, Redis clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at_ms: Option<u64>,
    /// When the job ended (done, dead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
}

impl Outcome {
    /// The outcome in `fields` (a `HGETALL`), `None` when there is none
    /// (never kept, or expired) or it names no state this reads.
    pub fn from_fields(id: &str, mut fields: HashMap<String, String>) -> Option<Self> {
        let state = State::parse(fields.get("state")?)?;
        let number = |fields: &HashMap<String, String>, name: &str| {
            fields.get(name).and_then(|v| v.parse::<u64>().ok())
        };
        Some(Self {
            id: id.to_string(),
            state,
            attempt: number(&fields, "attempt").and_then(|a| u32::try_from(a).ok()),
            next_at_ms: number(&fields, "next_at"),
            updated_at_ms: number(&fields, "updated_at"),
            ended_at_ms: number(&fields, "ended_at"),
            worker: fields.remove("worker"),
            // Written by the worker from JSON it checked: text that does
            // not parse is shown as a string rather than lost.
            result: fields
                .remove("result")
                .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))),
            result_error: fields.remove("result_error"),
            error: fields.remove("error"),
        })
    }
}

/// The outcome of job `id` of `queue`: `None` when none is kept (the job
/// did not ask, has not been taken yet, or its outcome expired).
pub async fn read(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    id: &str,
) -> RedisResult<Option<Outcome>> {
    let fields: HashMap<String, String> = conn.hgetall(queue.outcome(id)).await?;
    Ok(Outcome::from_fields(id, fields))
}

/// What a wait ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum Waited {
    /// The job's final outcome (done or dead).
    Final(Outcome),
    /// The time ran out; the outcome as it last was, if one is kept.
    TimedOut(Option<Outcome>),
}

/// Waits up to `timeout` for job `id` of `queue` to end. Blocks on the
/// job's end stream (`XREAD BLOCK` from its start: a read, so the entry
/// stays and every waiter wakes, and a read-only user may wait) in slices
/// of at most [`WAIT_SLICE`], reading the outcome after each: an idle
/// waiter costs Redis two commands per slice. `conn` must allow a reply to
/// take a slice plus a margin (its response timeout), and is blocked
/// meanwhile: use a connection of its own.
pub async fn wait(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    id: &str,
    timeout: Duration,
) -> RedisResult<Waited> {
    let deadline = tokio::time::Instant::now() + timeout;
    let end = queue.outcome_end(id);
    loop {
        let seen = read(conn, queue, id).await?;
        if let Some(outcome) = seen.as_ref().filter(|o| o.state.is_final()) {
            return Ok(Waited::Final(outcome.clone()));
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Ok(Waited::TimedOut(seen));
        }
        // XREAD's BLOCK is in milliseconds; 0 would block for ever.
        let slice = left.min(WAIT_SLICE).as_millis().max(1) as u64;
        let _: redis::Value = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(slice)
            .arg("STREAMS")
            .arg(&end)
            .arg("0-0")
            .query_async(conn)
            .await?;
    }
}

/// Notes that attempt `attempt` of job `id` runs on `worker` (`at`: unix
/// ms on the Redis clock). Written as a kept job starts, before its
/// handler runs, so it always comes before the settlement that ends the
/// attempt; not written atomically with the taking (a job taken and not
/// yet started still shows its earlier state).
pub async fn running(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    id: &str,
    attempt: u32,
    worker: &str,
    at: u64,
) -> RedisResult<()> {
    let key = queue.outcome(id);
    redis::pipe()
        .atomic()
        .hset_multiple(
            &key,
            &[
                ("state", State::Running.as_str().to_string()),
                ("attempt", attempt.to_string()),
                ("worker", worker.to_string()),
                ("updated_at", at.to_string()),
            ],
        )
        .ignore()
        .hdel(&key, "next_at")
        .ignore()
        .persist(&key)
        .ignore()
        .query_async(conn)
        .await
}

/// The facts of outcomes a client library needs, as one JSON object: the
/// client libraries read the copy generated from this
/// (`contract.json` in each package; `tests/tests/contract_facts.rs`
/// fails when a copy differs), so no library types them again.
pub fn facts() -> serde_json::Value {
    let q = QueueKeys::new("{queue}");
    let words = |states: &[State]| states.iter().map(|s| s.as_str()).collect::<Vec<_>>();
    let states = words(&[State::Running, State::Retrying, State::Done, State::Dead]);
    let final_states = words(&[State::Done, State::Dead]);
    serde_json::json!({
        "outcome_key": q.outcome("{id}"),
        "outcome_end_key": q.outcome_end("{id}"),
        "keep_field": crate::job::field::KEEP,
        "max_keep_seconds": crate::ops::MAX_KEEP.as_secs(),
        "max_result_bytes": MAX_RESULT_BYTES,
        "max_answer_bytes": MAX_ANSWER_BYTES,
        "wait_slice_ms": u64::try_from(WAIT_SLICE.as_millis()).unwrap_or(u64::MAX),
        "states": states,
        "final_states": final_states,
    })
}
