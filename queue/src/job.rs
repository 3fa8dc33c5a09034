//! The job envelope: what producers push, what handlers get, what the dead
//! list keeps. Pure code, no I/O.
//!
//! A job is one JSON object. The worker reads and writes only the fields
//! below and keeps every other field as it came (key order included).

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::text;

mod head;
mod shared;
mod stamp;
mod trace;

pub use shared::SharedText;
pub use stamp::{Stamp, stamped, take_stamped, unstamped};
pub use trace::{TRACESTATE_MAX, TraceParent};

/// How much of a malformed payload an error message quotes.
const QUOTE_CHARS: usize = 80;

/// Field names of the envelope.
pub mod field {
    /// Task name chosen by the producer (string, optional).
    pub const TASK: &str = "task";
    /// Payload for the handler (any JSON, optional).
    pub const DATA: &str = "data";
    /// Idempotency key; assigned on first fetch when absent, kept across retries.
    pub const ID: &str = "id";
    /// Number of the current (or last) attempt, 1-based, set by the worker.
    pub const ATTEMPT: &str = "attempt";
    /// Unix milliseconds when the job was enqueued; stamped on first fetch when absent.
    pub const ENQUEUED_AT: &str = "enqueued_at";
    /// Unix milliseconds before which the job must not run (delayed job).
    pub const RUN_AT: &str = "run_at";
    /// The last error, set when an attempt fails.
    pub const ERROR: &str = "error";
    /// A string: while a job with this key is waiting, scheduled, retrying
    /// or running in the queue, another one with it is not enqueued (when
    /// enqueued through the contract's `enqueue.lua`).
    pub const UNIQUE_KEY: &str = "unique_key";
    /// Seconds after which a job's unique key is free whatever became of
    /// the job (default [`super::DEFAULT_UNIQUE_FOR_SECS`]).
    pub const UNIQUE_FOR: &str = "unique_for";
    /// The producer's W3C Trace Context `traceparent` (a string): each
    /// attempt's span continues its trace. A malformed one is ignored.
    pub const TRACEPARENT: &str = "traceparent";
    /// The W3C Trace Context `tracestate` that goes with `traceparent`.
    pub const TRACESTATE: &str = "tracestate";
    /// The `traceparent` of the span of the attempt that failed last, set
    /// by a worker that traces: the next attempt's span links to it.
    pub const PREVIOUS_TRACEPARENT: &str = "previous_traceparent";
    /// Seconds to keep the job's outcome after it ends (a number above 0;
    /// at most [`crate::ops::MAX_KEEP`]): its state, result or error stay
    /// readable by id (docs/queue-contract.md, "Outcomes").
    pub const KEEP: &str = "keep";
}

/// How long a job holds its unique key at most, when it does not say.
pub const DEFAULT_UNIQUE_FOR_SECS: u64 = 3600;

/// A job's unique key and how long it holds it at most, in seconds:
/// `Ok(None)` without `unique_key`; an error, saying what to fix, when the
/// fields are not a non-empty string and a positive whole number.
pub fn unique_of(fields: &Map<String, Value>) -> Result<Option<(&str, u64)>, String> {
    let Some(key) = fields.get(field::UNIQUE_KEY) else {
        if fields.contains_key(field::UNIQUE_FOR) {
            return Err(format!(
                "{:?} is set without {:?}",
                field::UNIQUE_FOR,
                field::UNIQUE_KEY
            ));
        }
        return Ok(None);
    };
    let key = match key.as_str() {
        Some(k) if !k.is_empty() => k,
        _ => {
            return Err(format!(
                "{:?} must be a non-empty string, got {key}",
                field::UNIQUE_KEY
            ));
        }
    };
    let hold = match fields.get(field::UNIQUE_FOR) {
        None => DEFAULT_UNIQUE_FOR_SECS,
        Some(v) => match v.as_u64() {
            Some(secs) if secs > 0 => secs,
            _ => {
                return Err(format!(
                    "{:?} must be a whole number of seconds above 0, got {v}",
                    field::UNIQUE_FOR
                ));
            }
        },
    };
    Ok(Some((key, hold)))
}

/// The `id` of the job in `payload`, when it is a JSON object with a
/// string `id` (`None` for any other bytes).
pub fn id_in(payload: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Id {
        id: String,
    }
    serde_json::from_slice::<Id>(payload).ok().map(|job| job.id)
}

/// How long a job with these fields keeps its outcome once it ends (its
/// `keep`, in seconds): `Ok(None)` when it does not ask, `Err` saying what
/// is wrong with a `keep` that is not a number of seconds above 0. Longer
/// than [`crate::ops::MAX_KEEP`] is cut to it.
pub fn keep_of(fields: &Map<String, Value>) -> Result<Option<std::time::Duration>, String> {
    fields.get(field::KEEP).map_or(Ok(None), keep_in)
}

fn keep_in(value: &Value) -> Result<Option<std::time::Duration>, String> {
    match value.as_f64() {
        Some(secs) if secs > 0.0 && secs.is_finite() => Ok(Some(
            std::time::Duration::from_secs_f64(secs.min(crate::ops::MAX_KEEP.as_secs_f64())),
        )),
        _ => Err(format!(
            "{:?} must be a number of seconds above 0, got {}",
            field::KEEP,
            crate::text::escaped(value.to_string().as_bytes(), 80)
        )),
    }
}

/// The token with which the scripts that end a job free its unique key:
/// `<length of the id>:<id><unique key>`. `None` for a job without a
/// unique key (or without an id, which cannot hold one).
pub fn release_token(fields: &Map<String, Value>) -> Option<String> {
    let key = fields.get(field::UNIQUE_KEY)?.as_str()?;
    let id = fields.get(field::ID)?.as_str()?;
    Some(token_of(id, key))
}

fn token_of(id: &str, unique_key: &str) -> String {
    format!("{}:{id}{unique_key}", id.len())
}

/// A job as handed to a handler: the producer's object with `id`,
/// `attempt` and `enqueued_at` filled in.
///
/// A job read from a payload the fetch script stamped keeps that text and
/// the few fields the worker reads for every job; the whole object is
/// parsed only when something asks for it ([`Job::fields`], [`Job::data`],
/// [`Job::get`]). Handlers that pass the job on as JSON get the text as it
/// was pushed, numbers and all, not a re-serialized copy.
#[derive(Clone)]
pub struct Job {
    repr: Repr,
    /// The `traceparent` of the span of this attempt, when the worker
    /// traces: what the handler gets in place of the producer's.
    attempt_trace: Option<Arc<str>>,
}

#[derive(Clone)]
enum Repr {
    /// Built from fields: by [`intake`], or by a caller.
    Fields(Map<String, Value>),
    /// Read from a stamped payload ([`stamped`]).
    Held(Held),
}

/// A stamped payload and what one pass over it read.
#[derive(Clone)]
struct Held {
    /// The payload, as held in the processing list.
    text: SharedText,
    /// Where `id`, `task` and `unique_key` are in `text` (strings without
    /// escapes: their text is their value).
    id: Range<usize>,
    task: Option<Range<usize>>,
    unique_key: Option<Range<usize>>,
    attempt: u64,
    enqueued_at: u64,
    /// The whole object, parsed on first use.
    fields: OnceLock<Map<String, Value>>,
}

impl Held {
    fn fields(&self) -> &Map<String, Value> {
        self.fields.get_or_init(|| {
            // The pass in `stamped` read the same text with the same
            // parser (deserialize_any all the way down), so this parse
            // succeeds: an empty object is never returned in practice.
            match serde_json::from_str::<Value>(&self.text) {
                Ok(Value::Object(fields)) => fields,
                _ => {
                    debug_assert!(false, "a stamped payload stopped parsing");
                    Map::new()
                }
            }
        })
    }
}

impl Job {
    /// The job's idempotency key.
    pub fn id(&self) -> &str {
        match &self.repr {
            Repr::Fields(fields) => fields
                .get(field::ID)
                .and_then(Value::as_str)
                .unwrap_or_default(),
            Repr::Held(held) => &held.text[held.id.clone()],
        }
    }

    /// The token that frees its unique key when it ends ([`release_token`]).
    pub fn release_token(&self) -> Option<String> {
        match &self.repr {
            Repr::Fields(fields) => release_token(fields),
            Repr::Held(held) => Some(token_of(self.id(), &held.text[held.unique_key.clone()?])),
        }
    }

    /// How long to keep the job's outcome after it ends, when it asks
    /// (`keep`): `Ok(None)` when it does not, `Err` saying what is wrong
    /// with a `keep` that is not a number of seconds above 0. Longer than
    /// [`crate::ops::MAX_KEEP`] is cut to it. Costs nothing for a held job
    /// whose text does not name the field.
    pub fn keep(&self) -> Result<Option<std::time::Duration>, String> {
        if let Repr::Held(held) = &self.repr
            && !held.text.contains("\"keep\"")
        {
            return Ok(None);
        }
        match self.get(field::KEEP) {
            None => Ok(None),
            Some(value) => keep_in(value),
        }
    }

    /// The task name, when the producer gave one.
    pub fn task(&self) -> Option<&str> {
        match &self.repr {
            Repr::Fields(fields) => fields.get(field::TASK).and_then(Value::as_str),
            Repr::Held(held) => Some(&held.text[held.task.clone()?]),
        }
    }

    /// The handler's payload (`Value::Null` when absent).
    pub fn data(&self) -> &Value {
        self.fields().get(field::DATA).unwrap_or(&Value::Null)
    }

    /// The number of this attempt, starting at 1.
    pub fn attempt(&self) -> u32 {
        match &self.repr {
            Repr::Fields(fields) => {
                read_u64(fields, field::ATTEMPT).map_or(0, |a| u32::try_from(a).unwrap_or(u32::MAX))
            }
            Repr::Held(held) => u32::try_from(held.attempt).unwrap_or(u32::MAX),
        }
    }

    /// When the job was enqueued, unix milliseconds.
    pub fn enqueued_at(&self) -> Option<u64> {
        match &self.repr {
            Repr::Fields(fields) => read_u64(fields, field::ENQUEUED_AT),
            Repr::Held(held) => Some(held.enqueued_at),
        }
    }

    /// The producer's trace context: `None` without a `traceparent`, the
    /// reason when it is malformed (the job still runs), else the parsed
    /// `traceparent` and the `tracestate` when it is a string of at most
    /// [`TRACESTATE_MAX`] characters.
    pub fn trace_context(&self) -> Option<Result<(TraceParent, Option<&str>), String>> {
        let fields = self.fields();
        let value = fields.get(field::TRACEPARENT)?;
        let Some(text) = value.as_str() else {
            return Some(Err(format!(
                "traceparent is not a string: {}",
                text::safe_line(&value.to_string(), QUOTE_CHARS)
            )));
        };
        let state = fields
            .get(field::TRACESTATE)
            .and_then(Value::as_str)
            .filter(|s| s.len() <= TRACESTATE_MAX);
        Some(TraceParent::parse(text).map(|tp| (tp, state)))
    }

    /// The span of the attempt that failed last, when it was traced and
    /// its `previous_traceparent` is valid.
    pub fn previous_attempt(&self) -> Option<TraceParent> {
        let text = self.fields().get(field::PREVIOUS_TRACEPARENT)?.as_str()?;
        TraceParent::parse(text).ok()
    }

    /// Any field of the object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields().get(key)
    }

    /// The whole object.
    pub fn fields(&self) -> &Map<String, Value> {
        match &self.repr {
            Repr::Fields(fields) => fields,
            Repr::Held(held) => held.fields(),
        }
    }

    /// The payload as held in the processing list, for a job read from it
    /// by [`stamped`] (`None` for a job built from fields).
    pub fn held(&self) -> Option<&SharedText> {
        match &self.repr {
            Repr::Fields(_) => None,
            Repr::Held(held) => Some(&held.text),
        }
    }

    /// The job as one line of JSON: the payload as held when it is one
    /// line, otherwise serialized from the fields (handlers call this for
    /// every job).
    pub fn to_json(&self) -> String {
        self.json_line().to_string()
    }

    /// The job as one line of JSON, as [`Job::to_json`], shared rather than
    /// copied when it is the payload as held: a handler writes it to a
    /// child's stdin or sends it as a body straight from the bytes the
    /// worker already holds, however large the job.
    pub fn json_line(&self) -> SharedText {
        if let Some(traceparent) = &self.attempt_trace {
            let mut fields = self.fields().clone();
            fields.insert(field::TRACEPARENT.into(), Value::from(traceparent.as_ref()));
            return serde_json::to_string(&fields)
                .expect("a map of JSON values always serializes")
                .into();
        }
        match &self.repr {
            Repr::Held(held) if !held.text.contains(['\n', '\r']) => held.text.clone(),
            _ => serde_json::to_string(self.fields())
                .expect("a map of JSON values always serializes")
                .into(),
        }
    }

    /// The payload that waits for the next attempt after this one failed.
    pub fn failed(&self, error: &str) -> String {
        let mut fields = self.fields().clone();
        fields.insert(field::ERROR.into(), Value::from(error));
        // Traced: the next attempt links to this one.
        if let Some(traceparent) = &self.attempt_trace {
            fields.insert(
                field::PREVIOUS_TRACEPARENT.into(),
                Value::from(traceparent.as_ref()),
            );
        }
        Value::Object(fields).to_string()
    }

    /// The payload to put back on the queue when this attempt is given up
    /// without having failed (shutdown): the attempt is not counted, the id
    /// and enqueue time are kept so a rerun is recognisable.
    pub fn unstarted(&self) -> String {
        Value::Object(self.uncounted()).to_string()
    }

    /// The payload of a job the handler could not run at all (its process
    /// cannot start): as [`Job::unstarted`], with the reason as its `error`.
    pub fn not_run(&self, error: &str) -> String {
        let mut fields = self.uncounted();
        fields.insert(field::ERROR.into(), Value::from(error));
        Value::Object(fields).to_string()
    }

    /// The fields with this attempt taken back.
    fn uncounted(&self) -> Map<String, Value> {
        let mut fields = self.fields().clone();
        match self.attempt() {
            0 | 1 => fields.shift_remove(field::ATTEMPT),
            n => fields.insert(field::ATTEMPT.into(), Value::from(n - 1)),
        };
        fields
    }

    /// A job built from fields (for handlers' tests and the library API).
    pub fn from_fields(fields: Map<String, Value>) -> Self {
        Self {
            repr: Repr::Fields(fields),
            attempt_trace: None,
        }
    }

    /// This job as its handler gets it when the attempt is traced: its
    /// `traceparent` is the attempt span's, so the handler's own spans are
    /// the attempt's children.
    pub fn with_attempt_trace(&self, traceparent: String) -> Job {
        Job {
            repr: self.repr.clone(),
            attempt_trace: Some(Arc::from(traceparent)),
        }
    }

    /// The `traceparent` of this attempt's span, when the worker traces
    /// (exec-per-job handlers get it as `TRACEPARENT`, http ones as the
    /// `traceparent` header).
    pub fn attempt_trace(&self) -> Option<&str> {
        self.attempt_trace.as_deref()
    }
}

impl PartialEq for Job {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("fields", self.fields())
            .finish()
    }
}

/// Why a job ended in the dead list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadReason {
    /// The payload is not a JSON object, or a known field has the wrong type.
    Malformed,
    /// Every allowed attempt failed.
    Exhausted,
    /// The handler said the failure is permanent (`retry: false`).
    Permanent,
    /// Every allowed attempt was used up without finishing: the worker
    /// running it was lost each time (killed, evicted, crashed).
    Lost,
    /// The payload is longer than the worker's `--max-payload-bytes`: the
    /// taking script dead-lettered it, whole, without handing it to the
    /// worker.
    TooLarge,
}

impl DeadReason {
    /// Stable label for metrics and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Malformed => "malformed",
            DeadReason::Exhausted => "exhausted",
            DeadReason::Permanent => "permanent",
            DeadReason::Lost => "lost",
            DeadReason::TooLarge => "too_large",
        }
    }
}

/// An entry of `<queue>:dead`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Why the job is dead.
    pub reason: DeadReason,
    /// The last error.
    pub error: String,
    /// Attempts made.
    pub attempts: u32,
    /// When it was dead-lettered, unix milliseconds (Redis server clock).
    pub died_at: u64,
    /// The worker instance that dead-lettered it.
    pub worker: String,
    /// The job: its JSON object; for a malformed payload the raw text, or
    /// with `encoding` the raw bytes encoded that way.
    pub job: Value,
    /// How `job` encodes a payload that was not UTF-8 (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    /// The payload's length in bytes, for a `too_large` one (absent
    /// otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// How a dead letter keeps a payload that is not text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// Standard base64 with padding (RFC 4648).
    Base64,
    /// The payload's bytes as they were, spliced in as `job`, the last
    /// field: they are the entry's last `size` bytes before its closing
    /// brace (a `too_large` entry; it is JSON when the payload is).
    Raw,
}

impl DeadLetter {
    /// The entry as stored.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a DeadLetter always serializes")
    }

    /// The payload exactly as it was pushed, for a malformed one (its raw
    /// text or decoded bytes); `None` for a job that was read as an object.
    pub fn raw_payload(&self) -> Option<Vec<u8>> {
        let text = self.job.as_str()?;
        match self.encoding {
            None => Some(text.as_bytes().to_vec()),
            Some(Encoding::Base64) => BASE64.decode(text).ok(),
            Some(Encoding::Raw) => None,
        }
    }
}

/// What the worker does with a payload it has just taken from the queue.
#[derive(Debug, Clone, PartialEq)]
pub enum Intake {
    /// Run it: `stamped` replaces the raw payload in the processing list
    /// before the handler starts, so a crash mid-job still counts the attempt.
    Run { job: Job, stamped: String },
    /// Not due yet: park it in the scheduled set until `run_at`.
    Schedule { run_at: u64 },
    /// Dead-letter it without running it.
    Dead(DeadLetter),
}

/// Decides what to do with a raw payload taken from the queue at `now_ms`
/// (Redis server clock), given the pool's attempt limit. Any bytes at all
/// are accepted: what is not a UTF-8 JSON object is dead-lettered as
/// malformed, with the payload kept so nothing is lost.
pub fn intake(raw: impl AsRef<[u8]>, now_ms: u64, max_attempts: u32, worker: &str) -> Intake {
    let raw = raw.as_ref();
    let dead = |reason, error: String, attempts, job, encoding| {
        Intake::Dead(DeadLetter {
            reason,
            error,
            attempts,
            died_at: now_ms,
            worker: worker.to_string(),
            job,
            encoding,
            size: None,
        })
    };
    let Ok(text) = std::str::from_utf8(raw) else {
        let problem = text::utf8_problem(raw).unwrap_or_default();
        let error = format!(
            "payload is not UTF-8 ({problem}), so it cannot be JSON: \"{}\"",
            text::escaped(raw, QUOTE_CHARS)
        );
        let job = Value::from(BASE64.encode(raw));
        return dead(DeadReason::Malformed, error, 0, job, Some(Encoding::Base64));
    };
    let malformed = |error: String| dead(DeadReason::Malformed, error, 0, Value::from(text), None);
    if text.trim().is_empty() {
        return malformed("empty payload: expected a JSON object".into());
    }
    let mut fields = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => fields,
        Ok(other) => {
            return malformed(format!("expected a JSON object, got {}", json_kind(&other)));
        }
        Err(e) => {
            return malformed(format!(
                "not valid JSON: {e}: \"{}\"",
                text::escaped(raw, QUOTE_CHARS)
            ));
        }
    };
    if let Err(error) = check_types(&fields) {
        return dead(DeadReason::Malformed, error, 0, Value::Object(fields), None);
    }
    if let Some(run_at) = read_u64(&fields, field::RUN_AT)
        && run_at > now_ms
    {
        return Intake::Schedule { run_at };
    }
    // In range: check_types refused an attempt above u32::MAX.
    let previous = read_u64(&fields, field::ATTEMPT)
        .and_then(|a| u32::try_from(a).ok())
        .unwrap_or(0);
    if previous >= max_attempts {
        let error = fields
            .get(field::ERROR)
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| {
                format!("attempt {previous} did not finish: the worker running it was lost")
            });
        return dead(
            DeadReason::Lost,
            error,
            previous,
            Value::Object(fields),
            None,
        );
    }
    // `attempt` first, as the fetch script stamps: the next fetch of this
    // payload (a retry, or after a reaper returned it) counts it as text.
    fields.shift_remove(field::ATTEMPT);
    let mut stamped = Map::with_capacity(fields.len() + 3);
    stamped.insert(field::ATTEMPT.into(), Value::from(previous + 1));
    if !fields.contains_key(field::ID) {
        stamped.insert(field::ID.into(), Value::from(new_id()));
    }
    if !fields.contains_key(field::ENQUEUED_AT) {
        stamped.insert(field::ENQUEUED_AT.into(), Value::from(now_ms));
    }
    stamped.extend(fields);
    let job = Job::from_fields(stamped);
    let stamped = job.to_json();
    Intake::Run { job, stamped }
}

/// The worker's own stamp of a fresh job as text, for a payload the fetch
/// script left to it (its text stamp reads large payloads no further than
/// a few KiB): the bytes to put after the opening brace, `"attempt":1`,
/// then `"id"` and `"enqueued_at"` when absent, as `stamp.lua` writes
/// them, so the job is read as one the script stamped ([`take_stamped`]
/// with [`Stamp::Fresh`] of their length) and its held form is the
/// payload's own bytes with these in front: numbers, key order and
/// unknown fields stay exactly as pushed, and nothing is parsed into a
/// `Value`. `None` unless [`intake`] would run it as a fresh job (a UTF-8
/// object starting with its brace, without `attempt` or `run_at`, whose
/// `task` and `id` are strings and `enqueued_at` unix milliseconds, with
/// attempts allowed): take the payload through [`intake`] then.
pub fn fresh_stamp(raw: &[u8], now_ms: u64, max_attempts: u32) -> Option<String> {
    use head::Scalar;
    if max_attempts < 1 || raw.first() != Some(&b'{') {
        return None;
    }
    let text = std::str::from_utf8(raw).ok()?;
    let head = head::read(text)?;
    let typed = head.task.is_none_or(Scalar::is_string)
        && head.id.is_none_or(Scalar::is_string)
        && matches!(head.enqueued_at, None | Some(Scalar::U64(_)));
    if head.attempt.is_some() || !typed {
        return None;
    }
    let mut added = String::with_capacity(80);
    added.push_str("\"attempt\":1");
    if head.id.is_none() {
        added.push_str(",\"id\":\"");
        push_new_id(&mut added);
        added.push('"');
    }
    if head.enqueued_at.is_none() {
        added.push_str(",\"enqueued_at\":");
        added.push_str(&now_ms.to_string());
    }
    // A comma before the payload's own fields, unless it has none.
    if !text[1..].trim_start().starts_with('}') {
        added.push(',');
    }
    Some(added)
}

/// A fresh job id: 128 random bits in hex.
pub fn new_id() -> String {
    let mut id = String::with_capacity(32);
    push_new_id(&mut id);
    id
}

/// Appends a fresh job id (as [`new_id`] makes it) to `to`: the taking
/// scripts get one per slot, all in one string.
pub fn push_new_id(to: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let n = rand::random::<u128>();
    to.extend(
        (0..32)
            .rev()
            .map(|i| char::from(HEX[(n >> (4 * i)) as usize & 0xf])),
    );
}

fn check_types(fields: &Map<String, Value>) -> Result<(), String> {
    let expect = |name: &str, ok: fn(&Value) -> bool, what: &str| match fields.get(name) {
        Some(v) if !ok(v) => Err(format!(
            "field `{name}` must be {what}, got {}",
            json_kind(v)
        )),
        _ => Ok(()),
    };
    expect(field::TASK, Value::is_string, "a string")?;
    expect(field::ID, Value::is_string, "a string")?;
    expect(
        field::ATTEMPT,
        |v| v.as_u64().is_some_and(|a| u32::try_from(a).is_ok()),
        "a non-negative integer up to 4294967295",
    )?;
    expect(field::ENQUEUED_AT, Value::is_u64, "unix milliseconds")?;
    expect(field::RUN_AT, Value::is_u64, "unix milliseconds")?;
    Ok(())
}

fn read_u64(fields: &Map<String, Value>, name: &str) -> Option<u64> {
    fields.get(name).and_then(Value::as_u64)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn a_fresh_stamp_as_text_runs_the_job_intake_would_run_and_refuses_the_rest() {
        for raw in [
            r#"{"task":"t","data":{"x":1.10,"id":5},"id":"a","enqueued_at":7}"#,
            r#"{"data":[1.5e300,-0.0]}"#,
            "{ }",
            r#"{"z":1,"id":"b"}"#,
        ] {
            let added = fresh_stamp(raw.as_bytes(), NOW, 5).expect(raw);
            let held = format!("{{{added}{}", &raw[1..]);
            let Intake::Run { job, .. } = intake(raw, NOW, 5, "w") else {
                panic!("intake runs {raw}");
            };
            let (stamped, _) = take_stamped(held.clone().into_bytes(), Stamp::Fresh(added.len()))
                .expect("the stamp stands");
            assert_eq!(stamped.attempt(), 1, "{held}");
            assert_eq!(stamped.task(), job.task(), "{held}");
            assert_eq!(stamped.enqueued_at(), job.enqueued_at(), "{held}");
            assert_eq!(stamped.data(), job.data(), "{held}");
            if raw.contains(r#""id""#) {
                assert_eq!(stamped.id(), job.id(), "{held}");
            } else {
                assert_eq!(stamped.id().len(), 32, "{held}");
            }
        }
        for refused in [
            r#"{"attempt":1}"#,
            r#"{"run_at":1}"#,
            r#"{"task":5}"#,
            r#"{"id":7}"#,
            r#"{"enqueued_at":-1}"#,
            r#"{"data":1e400}"#,
            r#"{"\u0061ttempt":2}"#,
            r#" {"a":1}"#,
            "[1]",
            "{",
        ] {
            assert_eq!(fresh_stamp(refused.as_bytes(), NOW, 5), None, "{refused}");
        }
        assert_eq!(fresh_stamp(b"{}", NOW, 0), None, "no attempts allowed");
    }

    #[test]
    fn a_traced_attempt_hands_its_own_traceparent_on_and_a_retry_links_back_to_it() {
        let producer = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let attempt = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
        let Value::Object(fields) =
            json!({"id": "a", "traceparent": producer, "tracestate": "v=1"})
        else {
            unreachable!()
        };
        let job = Job::from_fields(fields);
        let (tp, state) = job.trace_context().expect("present").expect("valid");
        assert_eq!((tp.to_string().as_str(), state), (producer, Some("v=1")));
        assert_eq!(job.attempt_trace(), None);
        assert!(!job.to_json().contains("1111111111111111"));

        let handed = job.with_attempt_trace(attempt.to_string());
        let line: Value = serde_json::from_str(&handed.to_json()).expect("json");
        assert_eq!(
            line["traceparent"], attempt,
            "the handler gets the attempt's"
        );
        assert_eq!(line["tracestate"], "v=1");

        let retry = Job::from_fields(match serde_json::from_str(&handed.failed("boom")) {
            Ok(Value::Object(f)) => f,
            other => panic!("{other:?}"),
        });
        assert_eq!(
            retry.get("traceparent"),
            Some(&json!(producer)),
            "still the producer's trace"
        );
        assert_eq!(
            retry.previous_attempt().map(|t| t.to_string()).as_deref(),
            Some(attempt)
        );
        // Untraced, a failure carries no link.
        assert!(!job.failed("boom").contains("previous_traceparent"));

        let Value::Object(bad) = json!({"traceparent": 7}) else {
            unreachable!()
        };
        assert!(
            Job::from_fields(bad)
                .trace_context()
                .expect("present")
                .is_err()
        );
    }

    #[test]
    fn an_id_is_32_lowercase_hex_digits_of_fresh_random_bits() {
        let ids: Vec<String> = (0..64).map(|_| new_id()).collect();
        for id in &ids {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{id}"
            );
        }
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        // Every digit value shows up somewhere in 64 ids (2,048 digits).
        let digits: std::collections::HashSet<u8> = ids.iter().flat_map(|id| id.bytes()).collect();
        assert_eq!(digits.len(), 16);
        let mut two = String::from("x");
        push_new_id(&mut two);
        push_new_id(&mut two);
        assert_eq!(two.len(), 65);
        assert_ne!(two[1..33], two[33..]);
    }

    fn run(raw: &str) -> Job {
        match intake(raw, NOW, 5, "w~1") {
            Intake::Run { job, stamped } => {
                assert_eq!(stamped, job.to_json());
                job
            }
            other => panic!("expected Run, got {other:?}"),
        }
    }

    fn dead(raw: &str, max_attempts: u32) -> DeadLetter {
        match intake(raw, NOW, max_attempts, "w~1") {
            Intake::Dead(d) => d,
            other => panic!("expected Dead, got {other:?}"),
        }
    }

    #[test]
    fn an_attempt_out_of_range_is_malformed_with_its_reason_not_wrapped_or_lost() {
        let letter = dead(r#"{"task":"t","attempt":99999999999}"#, 5);
        assert_eq!(letter.reason, DeadReason::Malformed);
        assert!(
            letter.error.contains("`attempt`") && letter.error.contains("4294967295"),
            "{}",
            letter.error
        );
        assert_eq!(letter.job["attempt"], json!(99999999999_u64));
        // The largest that fits is read as it is: out of attempts, lost.
        let letter = dead(r#"{"task":"t","attempt":4294967295}"#, 5);
        assert_eq!(
            (letter.reason, letter.attempts),
            (DeadReason::Lost, u32::MAX)
        );
    }

    #[test]
    fn first_fetch_stamps_id_attempt_and_enqueue_time_and_keeps_unknown_fields_in_order() {
        let job = run(r#"{"task":"send_email","data":{"to":"a@b.c"},"zeta":1,"alpha":[]}"#);
        assert_eq!(job.task(), Some("send_email"));
        assert_eq!(job.data(), &json!({"to": "a@b.c"}));
        assert_eq!(job.attempt(), 1);
        assert_eq!(job.enqueued_at(), Some(NOW));
        assert_eq!(job.id().len(), 32);
        let keys: Vec<_> = job.fields().keys().map(String::as_str).collect();
        // The stamp first, as the fetch script writes it; the rest in order.
        assert_eq!(
            keys,
            [
                "attempt",
                "id",
                "enqueued_at",
                "task",
                "data",
                "zeta",
                "alpha"
            ]
        );
        assert_eq!(job.get("alpha"), Some(&json!([])));
        assert!(job.to_json().starts_with(r#"{"attempt":1,"id":""#));
    }

    #[test]
    fn producer_ids_and_enqueue_times_are_kept_and_attempts_count_up() {
        let job = run(r#"{"id":"order-42","enqueued_at":5,"attempt":2}"#);
        assert_eq!(job.id(), "order-42");
        assert_eq!(job.enqueued_at(), Some(5));
        assert_eq!(job.attempt(), 3);
    }

    #[test]
    fn non_objects_and_bad_json_are_dead_lettered_as_malformed_with_the_raw_text() {
        for (raw, needle) in [
            ("not json", "not valid JSON"),
            ("[1,2]", "an array"),
            ("\"s\"", "a string"),
            ("{\"attempt\":\"two\"}", "`attempt`"),
            ("{\"id\":7}", "`id`"),
        ] {
            let d = dead(raw, 5);
            assert_eq!(d.reason, DeadReason::Malformed, "{raw}");
            assert!(d.error.contains(needle), "{raw}: {}", d.error);
            assert_eq!(d.died_at, NOW);
        }
        assert_eq!(dead("not json", 5).job, json!("not json"));
    }

    #[test]
    fn bytes_that_are_not_utf8_are_dead_lettered_as_base64_with_the_bad_byte_named() {
        let raw = b"{\"task\":\"caf\xe9\"}";
        let Intake::Dead(d) = intake(raw, NOW, 5, "w~1") else {
            panic!("must be dead");
        };
        assert_eq!(d.reason, DeadReason::Malformed);
        assert_eq!(d.encoding, Some(Encoding::Base64));
        assert!(
            d.error
                .contains("not UTF-8 (invalid byte 0xe9 at offset 12)"),
            "{}",
            d.error
        );
        assert!(d.error.contains(r#"{"task":"caf\xe9"}"#), "{}", d.error);
        assert_eq!(d.raw_payload().as_deref(), Some(raw.as_slice()));
        let v: Value = serde_json::from_str(&d.to_json()).expect("json");
        assert_eq!(v["encoding"], json!("base64"));
        assert_eq!(v["job"], json!("eyJ0YXNrIjoiY2Fm6SJ9"));
    }

    #[test]
    fn an_empty_payload_is_malformed_and_says_so() {
        for raw in ["", " \n"] {
            let d = dead(raw, 5);
            assert_eq!(d.error, "empty payload: expected a JSON object");
            assert_eq!(d.raw_payload().as_deref(), Some(raw.as_bytes()));
        }
    }

    #[test]
    fn a_future_run_at_schedules_the_job_and_a_past_one_runs_it() {
        let later = NOW + 60_000;
        assert_eq!(
            intake(format!(r#"{{"run_at":{later}}}"#), NOW, 5, "w"),
            Intake::Schedule { run_at: later }
        );
        run(&format!(r#"{{"run_at":{}}}"#, NOW - 1));
    }

    #[test]
    fn a_job_whose_last_allowed_attempt_never_finished_is_dead_as_lost() {
        let d = dead(r#"{"id":"x","attempt":2}"#, 2);
        assert_eq!(d.reason, DeadReason::Lost);
        assert_eq!(d.attempts, 2);
        assert!(d.error.contains("attempt 2 did not finish"), "{}", d.error);
        let d = dead(r#"{"id":"x","attempt":2,"error":"boom"}"#, 2);
        assert_eq!(d.error, "boom");
    }

    #[test]
    fn a_failed_job_keeps_its_id_and_attempt_and_records_the_error() {
        let job = run(r#"{"task":"t"}"#);
        let next: Value = serde_json::from_str(&job.failed("boom")).expect("json");
        assert_eq!(next["id"], json!(job.id()));
        assert_eq!(next["attempt"], json!(1));
        assert_eq!(next["error"], json!("boom"));
    }

    #[test]
    fn a_job_given_back_at_shutdown_does_not_count_the_attempt() {
        let first = run(r#"{"task":"t"}"#);
        let back: Value = serde_json::from_str(&first.unstarted()).expect("json");
        assert!(back.get("attempt").is_none());
        assert_eq!(back["id"], json!(first.id()));
        let third = run(r#"{"attempt":2}"#);
        let back: Value = serde_json::from_str(&third.unstarted()).expect("json");
        assert_eq!(back["attempt"], json!(2));
    }

    #[test]
    fn dead_letters_serialize_with_snake_case_reasons() {
        let d = dead("oops", 5);
        let v: Value = serde_json::from_str(&d.to_json()).expect("json");
        assert_eq!(v["reason"], json!("malformed"));
        assert_eq!(v["job"], json!("oops"));
        assert_eq!(v["worker"], json!("w~1"));
    }
}
