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
use crate::ops::{MAX_KEEP, RedisResult};
use crate::scripts;

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
    /// In the queue, waiting for a slot (enqueued with `keep`, or given
    /// back to the queue by a worker that stopped or was lost).
    Waiting,
    /// Enqueued to run later, at `next_at_ms`.
    Scheduled,
    /// Taken by a worker, its handler running.
    Running,
    /// An attempt failed; the next is due at `next_at_ms`.
    Retrying,
    /// Completed, with its result when it returned one.
    Done,
    /// Dead-lettered, with its error.
    Dead,
    /// Cancelled before it ran, or asked to stop and then failed.
    Cancelled,
}

impl State {
    /// The word in the hash.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Waiting => "waiting",
            State::Scheduled => "scheduled",
            State::Running => "running",
            State::Retrying => "retrying",
            State::Done => "done",
            State::Dead => "dead",
            State::Cancelled => "cancelled",
        }
    }

    /// Every state, in the order a job passes through them.
    pub const ALL: [State; 7] = [
        State::Waiting,
        State::Scheduled,
        State::Running,
        State::Retrying,
        State::Done,
        State::Dead,
        State::Cancelled,
    ];

    /// Whether nothing more happens to the job.
    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Dead | State::Cancelled)
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
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
    /// When the job ended (done, dead, cancelled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// The latest progress a running job reported (JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<serde_json::Value>,
    /// When it reported it (unix ms, Redis clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress_at_ms: Option<u64>,
    /// When a cancel was asked for a job that was running (or taken).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at_ms: Option<u64>,
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
            progress_at_ms: number(&fields, "progress_at"),
            cancel_requested_at_ms: number(&fields, "cancel_requested"),
            worker: fields.remove("worker"),
            // Written by the worker from JSON it checked: text that does
            // not parse is shown as a string rather than lost.
            result: fields
                .remove("result")
                .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))),
            result_error: fields.remove("result_error"),
            progress: fields
                .remove("progress")
                .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))),
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

/// The field a waiter sets in an outcome before it blocks: the script that
/// makes the outcome final gives the end stream its entry only then, so a
/// job nobody waits for costs no stream.
pub const WAITED_FIELD: &str = "waited";

/// Waits up to `timeout` for job `id` of `queue` to end. Marks the outcome
/// waited for ([`WAITED_FIELD`]), reads it, and blocks on the job's end
/// stream (`XREAD BLOCK` from its start, so the entry stays and every
/// waiter wakes) in slices of at most [`WAIT_SLICE`]: an idle waiter costs
/// Redis a few commands per slice. A user the ACL refuses the mark
/// (`HSET`, `PEXPIRE`) still waits, woken only by the end of each slice.
/// `conn` must allow a reply to take a slice plus a margin (its response
/// timeout), and is blocked meanwhile: use a connection of its own.
pub async fn wait(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    id: &str,
    timeout: Duration,
) -> RedisResult<Waited> {
    let deadline = tokio::time::Instant::now() + timeout;
    let end = queue.outcome_end(id);
    let key = queue.outcome(id);
    let mut marking = true;
    loop {
        // Marked before it is read: a settlement after the mark adds the
        // entry this wait blocks on, and one before it is seen final here.
        // A hash the mark makes (no outcome yet) goes in a week.
        if marking {
            let marked: RedisResult<()> = redis::pipe()
                .hset(&key, WAITED_FIELD, 1)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&key)
                .arg(MAX_KEEP.as_millis() as u64)
                .arg("NX")
                .ignore()
                .query_async(conn)
                .await;
            if let Err(e) = marked {
                if crate::connection::refused(&e).is_none() {
                    return Err(e);
                }
                marking = false;
            }
        }
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

/// Notes that attempt `attempt` of job `id` starts on `worker` (its final
/// outcome kept `keep`), before its handler runs, so it always comes
/// before the settlement that ends the attempt. The taking scripts do this
/// as they take a kept job ([`crate::ops::Start`]); this is for a job they
/// left to the worker ([`crate::ops::Start::Unnoted`]: a `keep` only the
/// worker can judge). Returns `false`, writing nothing, when a cancel was
/// asked for: the job is not to run, and is settled
/// [`crate::ops::Settlement::Cancelled`].
pub async fn start(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    id: &str,
    attempt: u32,
    worker: &str,
    keep: Duration,
) -> RedisResult<bool> {
    let started: i64 = scripts::START
        .key(queue.outcome(id))
        .key(queue.outcome_end(id))
        .arg(attempt)
        .arg(worker)
        .arg(crate::ops::keep_ms(Some(keep)))
        .invoke_async(conn)
        .await?;
    Ok(started == 1)
}

/// The largest progress kept, in bytes of JSON text: a report is a number
/// or a small object, not a result.
pub const MAX_PROGRESS_BYTES: usize = 4096;

/// The least time between two progress writes of one job: a handler that
/// reports more often has its reports between written as the latest one,
/// once the interval is up.
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);

/// What a progress report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// Written: the outcome says this attempt runs on this worker.
    pub written: bool,
    /// A cancel was asked for the job.
    pub cancel_requested: bool,
}

/// Writes the progress (`value`, JSON text of at most
/// [`MAX_PROGRESS_BYTES`]) of attempt `attempt` of job `id` running on
/// `worker`; nothing when the outcome no longer says it runs there.
pub async fn progress(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    id: &str,
    worker: &str,
    attempt: u32,
    value: &str,
) -> RedisResult<Reported> {
    let (written, asked): (i64, i64) = scripts::PROGRESS
        .key(queue.outcome(id))
        .arg(worker)
        .arg(attempt)
        .arg(value)
        .invoke_async(conn)
        .await?;
    Ok(Reported {
        written: written == 1,
        cancel_requested: asked == 1,
    })
}

/// Which of the kept jobs `ids` of `queue` have a cancel asked for: what
/// a worker checks for the kept jobs it runs, once a heartbeat.
pub async fn cancel_requested(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    ids: &[&str],
) -> RedisResult<Vec<bool>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.hexists(queue.outcome(id), "cancel_requested");
    }
    pipe.query_async(conn).await
}

/// What a cancel did (see [`cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "did")]
pub enum Cancel {
    /// Removed from where it waited, and `cancelled`.
    Removed {
        /// Where it was: waiting, scheduled or retrying.
        from: State,
    },
    /// Running (or taken and not yet started): its worker asks the
    /// handler to stop. A handler that finishes anyway ends as it would
    /// have; one that fails is not retried, and ends `cancelled`.
    Requested {
        /// The state it was in.
        state: State,
    },
    /// Already ended; left alone.
    Final {
        /// How it ended.
        state: State,
    },
    /// No job of that id waits, is scheduled or retries, and no kept
    /// outcome says where it is (it was never kept and runs, or ended and
    /// its outcome expired, or never was).
    Unknown,
}

/// How long the outcome of a job cancelled while waiting is kept when the
/// job kept none of its own: a day, as Celery keeps results.
pub const CANCELLED_KEEP: Duration = Duration::from_secs(24 * 3600);

/// Cancels job `id` of `queue`: removes it if it waits (queue, scheduled
/// or retry set), asks it to stop if it runs, and says which
/// ([`Cancel`]). Finding a job that waits scans the queue (O(depth)).
pub async fn cancel(conn: &mut impl Conn, queue: &QueueKeys, id: &str) -> RedisResult<Cancel> {
    let (did, state): (String, String) = scripts::CANCEL
        .key(queue.waiting())
        .key(queue.scheduled())
        .key(queue.retry())
        .key(queue.unique())
        .key(queue.unique_expiry())
        .key(queue.outcome(id))
        .key(queue.outcome_end(id))
        .arg(id)
        .arg(CANCELLED_KEEP.as_millis() as u64)
        .invoke_async(conn)
        .await?;
    let state_of = |s: &str| {
        State::parse(s).ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::Parse,
                "malformed reply",
                format!("cancel.lua answered the state {s:?}"),
            ))
        })
    };
    Ok(match did.as_str() {
        "removed" => Cancel::Removed {
            from: state_of(&state)?,
        },
        "requested" => Cancel::Requested {
            state: state_of(&state)?,
        },
        "final" => Cancel::Final {
            state: state_of(&state)?,
        },
        _ => Cancel::Unknown,
    })
}

/// The facts of outcomes a client library needs, as one JSON object: the
/// client libraries read the copy generated from this
/// (`contract.json` in each package; `tests/tests/contract_facts.rs`
/// fails when a copy differs), so no library types them again.
pub fn facts() -> serde_json::Value {
    let q = QueueKeys::new("{queue}");
    let words = |states: &[State]| states.iter().map(|s| s.as_str()).collect::<Vec<_>>();
    let states = words(&State::ALL);
    let final_states: Vec<&str> = State::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(State::as_str)
        .collect();
    serde_json::json!({
        "outcome_key": q.outcome("{id}"),
        "outcome_end_key": q.outcome_end("{id}"),
        "keep_field": crate::job::field::KEEP,
        "waited_field": WAITED_FIELD,
        "max_keep_seconds": MAX_KEEP.as_secs(),
        "max_result_bytes": MAX_RESULT_BYTES,
        "max_progress_bytes": MAX_PROGRESS_BYTES,
        "progress_interval_ms": u64::try_from(PROGRESS_INTERVAL.as_millis()).unwrap_or(u64::MAX),
        "cancelled_keep_seconds": CANCELLED_KEEP.as_secs(),
        "max_answer_bytes": MAX_ANSWER_BYTES,
        "wait_slice_ms": u64::try_from(WAIT_SLICE.as_millis()).unwrap_or(u64::MAX),
        "states": states,
        "final_states": final_states,
    })
}
