//! What the pages and the JSON endpoints show, as plain data: built from
//! what workerpool-queue reads, with no I/O, so that rendering can be
//! tested without Redis.

use serde::Serialize;
use serde_json::Value;
use workerpool_queue::admin::{DeadEntry, WorkerInfo};
use workerpool_queue::job::field;
use workerpool_queue::snapshot::Counts;

/// Characters of a payload shown in a list; the JSON API gives the same.
pub const PAYLOAD_PREVIEW_CHARS: usize = 300;

/// One queue's counts at one instant, with its rates: the queue crate's
/// [`Counts`] under their own names, and what the dashboard adds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueSummary {
    /// The queue's name.
    pub name: String,
    /// What the queue holds and has done.
    #[serde(flatten)]
    pub counts: Counts,
    /// Jobs that can run now: waiting, plus due retries and due delayed
    /// jobs ([`Counts::backlog`]).
    pub backlog: u64,
    /// Completions per second over the last sampling interval.
    pub processed_per_second: Option<f64>,
    /// Failed attempts per second over the last sampling interval.
    pub failed_per_second: Option<f64>,
    /// Age of the job at the head of the queue, when it carries `enqueued_at`.
    pub oldest_job_age_seconds: Option<f64>,
}

impl QueueSummary {
    /// The summary of queue `name`'s `counts`, without rates.
    pub fn new(name: impl Into<String>, counts: Counts) -> Self {
        QueueSummary {
            name: name.into(),
            backlog: counts.backlog(),
            oldest_job_age_seconds: counts.oldest_job_age_seconds(),
            counts,
            processed_per_second: None,
            failed_per_second: None,
        }
    }
}

/// One WorkerPool as the operator sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolRow {
    /// Its namespace (empty in local mode).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The queues it serves, in priority order.
    pub queues: Vec<String>,
    /// `spec.replicas` when the pool has a fixed size.
    pub fixed_replicas: Option<i32>,
    /// `scaling.minReplicas`.
    pub min_replicas: Option<i32>,
    /// `scaling.maxReplicas`.
    pub max_replicas: Option<i32>,
    /// The replica count last decided.
    pub desired: Option<i32>,
    /// Workers ready.
    pub ready: Option<i32>,
    /// The scaling engine's reason for the last decision.
    pub reason: Option<String>,
}

/// Where the operator's pools come from: the controller's cache of
/// WorkerPools, or local mode's state.
pub trait PoolSource: Send + Sync {
    /// The pools now, in the order to show them.
    fn pools(&self) -> Vec<PoolRow>;
}

/// A point of the last-hour chart: `[unix ms, waiting, in flight,
/// processed/s, failed/s]`, an array to keep an hour of them small.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point(pub u64, pub u64, pub u64, pub f64, pub f64);

/// A queue's last hour.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Series {
    /// The queue's name.
    pub queue: String,
    /// Oldest first.
    pub points: Vec<Point>,
}

/// Everything the overview shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Overview {
    /// The Redis URL, password hidden.
    pub redis: String,
    /// Why Redis may delete jobs (its `maxmemory-policy`), when it may.
    pub redis_warning: Option<String>,
    /// Whether actions are off.
    pub read_only: bool,
    /// The Redis server's clock, unix ms.
    pub server_time_ms: u64,
    /// The operator's pools (empty for the CLI's dashboard).
    pub pools: Vec<PoolRow>,
    /// One summary per queue, in the order given.
    pub queues: Vec<QueueSummary>,
    /// The last hour of each queue, sampled in the background.
    pub history: Vec<Series>,
}

/// A job as a list shows it. Any bytes can sit on a queue: what does not
/// decode is shown as escaped text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JobRow {
    /// `id`, when the payload has one.
    pub id: Option<String>,
    /// `task`, when it has one.
    pub task: Option<String>,
    /// Attempts made so far.
    pub attempt: Option<u64>,
    /// `enqueued_at`, unix ms.
    pub enqueued_at_ms: Option<u64>,
    /// When it is due (the sorted set's score) for retries and delayed jobs.
    pub due_at_ms: Option<u64>,
    /// The last error (retries).
    pub error: Option<String>,
    /// The payload as text, cut at [`PAYLOAD_PREVIEW_CHARS`].
    pub payload: String,
    /// Whether the payload is not a JSON object.
    pub malformed: bool,
}

impl JobRow {
    /// A row for the stored payload `raw`.
    pub fn from_raw(raw: &[u8], due_at_ms: Option<u64>) -> Self {
        let decoded = serde_json::from_slice::<Value>(raw).ok();
        let object = decoded.as_ref().and_then(Value::as_object);
        let text = |k: &str| {
            object
                .and_then(|o| o.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let number = |k: &str| object.and_then(|o| o.get(k)).and_then(Value::as_u64);
        JobRow {
            id: text(field::ID),
            task: text(field::TASK),
            attempt: number(field::ATTEMPT),
            enqueued_at_ms: number(field::ENQUEUED_AT),
            due_at_ms,
            error: text(field::ERROR),
            payload: preview(raw),
            malformed: object.is_none(),
        }
    }
}

/// A dead letter as the dead list shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeadRow {
    /// The job's id, when it has one (retry and delete need it).
    pub id: Option<String>,
    /// The job's task.
    pub task: Option<String>,
    /// `malformed`, `exhausted`, `permanent`, `lost`, `too_large`; `unreadable` for an
    /// entry that is not a dead-letter envelope.
    pub reason: String,
    /// The last error.
    pub error: String,
    /// Attempts made.
    pub attempts: Option<u32>,
    /// When it died, unix ms.
    pub died_at_ms: Option<u64>,
    /// The worker instance that dead-lettered it.
    pub worker: Option<String>,
    /// The job as text, cut at [`PAYLOAD_PREVIEW_CHARS`].
    pub payload: String,
    /// The entry's length in bytes, as stored.
    pub bytes: u64,
}

impl DeadRow {
    /// A row for one entry of the dead list.
    pub fn from_entry(e: &DeadEntry) -> Self {
        match &e.letter {
            Some(l) => DeadRow {
                id: e.job_id().map(str::to_string),
                task: l
                    .job
                    .get(field::TASK)
                    .and_then(Value::as_str)
                    .map(Into::into),
                reason: l.reason.as_str().to_string(),
                error: l.error.clone(),
                attempts: Some(l.attempts),
                died_at_ms: Some(l.died_at),
                worker: Some(l.worker.clone()),
                payload: match (e.job_start(), &l.job) {
                    // An entry too long to read whole: the job's start.
                    (Some(start), _) => preview(start),
                    // A malformed payload is kept as its text.
                    (None, Value::String(s)) => preview(s.as_bytes()),
                    (None, other) => preview(other.to_string().as_bytes()),
                },
                bytes: e.size,
            },
            None => DeadRow {
                reason: "unreadable".into(),
                payload: preview(&e.raw),
                bytes: e.size,
                ..DeadRow::default()
            },
        }
    }
}

/// Which list of a queue a page shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ListKind {
    /// The waiting list, next to run first.
    Waiting,
    /// Delayed jobs, soonest first.
    Scheduled,
    /// Failed jobs waiting for their next attempt, soonest first.
    Retries,
    /// Dead letters, newest first.
    Dead,
}

impl ListKind {
    /// Every kind, in the order the queue page shows them.
    pub const ALL: [ListKind; 4] = [
        ListKind::Waiting,
        ListKind::Scheduled,
        ListKind::Retries,
        ListKind::Dead,
    ];

    /// The path segment and JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            ListKind::Waiting => "waiting",
            ListKind::Scheduled => "scheduled",
            ListKind::Retries => "retries",
            ListKind::Dead => "dead",
        }
    }

    /// The kind named by a path segment.
    pub fn parse(s: &str) -> Option<Self> {
        ListKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// A heading.
    pub fn title(self) -> &'static str {
        match self {
            ListKind::Waiting => "Waiting",
            ListKind::Scheduled => "Scheduled",
            ListKind::Retries => "Retries",
            ListKind::Dead => "Dead letters",
        }
    }
}

/// The rows of one page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Rows {
    /// Jobs (waiting, scheduled, retries).
    Jobs(Vec<JobRow>),
    /// Dead letters.
    Dead(Vec<DeadRow>),
}

impl Rows {
    /// How many rows.
    pub fn len(&self) -> usize {
        match self {
            Rows::Jobs(r) => r.len(),
            Rows::Dead(r) => r.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One page of one list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListPage {
    /// The queue.
    pub queue: String,
    /// Which list.
    pub kind: ListKind,
    /// Entries in the whole list.
    pub total: u64,
    /// This page, from 1.
    pub page: u64,
    /// Entries per page.
    pub per_page: u64,
    /// The rows.
    pub items: Rows,
}

impl ListPage {
    /// Pages in the whole list (at least 1).
    pub fn pages(&self) -> u64 {
        self.total.div_ceil(self.per_page.max(1)).max(1)
    }
}

/// Everything a queue's page shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueDetail {
    /// The queue's counts.
    pub summary: QueueSummary,
    /// The Redis server's clock, unix ms.
    pub server_time_ms: u64,
    /// Its registered workers.
    pub workers: Vec<WorkerInfo>,
    /// The first entries of each list.
    pub lists: Vec<ListPage>,
    /// Its last hour.
    pub history: Series,
}

/// `raw` as text for a page: lossy, control characters escaped, cut.
pub fn preview(raw: &[u8]) -> String {
    workerpool_queue::text::escaped(raw, PAYLOAD_PREVIEW_CHARS)
}

/// The longest job id the job view looks up, in bytes.
pub const MAX_JOB_ID_BYTES: usize = 200;

/// Why `id` cannot be looked up (empty, or longer than
/// [`MAX_JOB_ID_BYTES`]), or `None` when it can.
pub fn job_id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        Some(format!(
            "a job id is 1 to {MAX_JOB_ID_BYTES} bytes: this one is empty"
        ))
    } else if id.len() > MAX_JOB_ID_BYTES {
        Some(format!(
            "a job id is 1 to {MAX_JOB_ID_BYTES} bytes: this one is {} bytes",
            id.len()
        ))
    } else {
        None
    }
}

/// What the job view shows: a kept outcome as its JSON object, whatever
/// fields it has (every one becomes a row), and the Redis clock to show
/// its times against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    /// The queue.
    pub queue: String,
    /// The job's id, as looked up.
    pub id: String,
    /// The outcome as `workerpool_queue::outcome::Outcome` serializes it.
    pub outcome: Value,
    /// The Redis server's clock, unix ms.
    pub server_time_ms: u64,
}

/// `value` as pretty JSON for a page, cut as a payload is: at most
/// [`PAYLOAD_PREVIEW_CHARS`] characters, then `…`, each line through
/// [`preview`] (the line breaks of the layout kept). The flag says
/// whether it was cut.
pub fn json_preview(value: &Value) -> (String, bool) {
    let pretty = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    let cut = pretty.chars().count() > PAYLOAD_PREVIEW_CHARS;
    let kept: String = pretty.chars().take(PAYLOAD_PREVIEW_CHARS).collect();
    let mut shown = kept
        .split('\n')
        .map(|line| preview(line.as_bytes()))
        .collect::<Vec<_>>()
        .join("\n");
    if cut {
        shown.push('…');
    }
    (shown, cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use workerpool_queue::snapshot::{QueueFigures, WorkerFigures};

    #[test]
    fn a_summary_counts_live_and_lost_workers_apart() {
        let f = QueueFigures {
            name: "q".into(),
            waiting: 7,
            retries: 5,
            retries_due: 2,
            oldest_enqueued_at_ms: Some(1_000),
            workers: vec![
                WorkerFigures {
                    instance: "a~1".into(),
                    last_beat_ms: 9_000,
                    in_flight: 3,
                    dead_after_ms: Some(30_000),
                    rate_limit: Some("20/s".into()),
                    handler_problem: None,
                    oldest_job_ms: None,
                    idle_ms: None,
                },
                WorkerFigures {
                    instance: "b~1".into(),
                    last_beat_ms: 0,
                    in_flight: 1,
                    dead_after_ms: None,
                    rate_limit: Some("1/h".into()),
                    handler_problem: None,
                    oldest_job_ms: None,
                    idle_ms: None,
                },
            ],
            ..QueueFigures::default()
        };
        let s = QueueSummary::new("q", f.counts(11_000));
        let c = &s.counts;
        assert_eq!((c.workers_live, c.in_flight), (1, 3));
        assert_eq!((c.workers_lost, c.held_by_lost_workers), (1, 1));
        assert_eq!((c.retries_due, c.retries_scheduled), (2, 3));
        assert_eq!(s.backlog, 7 + 2, "the list and the due retries");
        assert_eq!(s.oldest_job_age_seconds, Some(10.0));
        assert_eq!(c.rate_limit.as_deref(), Some("20/s"), "a live worker's");
        // The JSON keeps the dashboard's field names, flat.
        let v = serde_json::to_value(&s).expect("serializes");
        for key in [
            "name",
            "waiting",
            "in_flight",
            "held_by_lost_workers",
            "retries_due",
            "retries_scheduled",
            "scheduled",
            "dead",
            "workers_live",
            "workers_lost",
            "processed_total",
            "failed_total",
            "dead_total",
            "processed_per_second",
            "failed_per_second",
            "oldest_job_age_seconds",
            "rate_limit",
            "backlog",
        ] {
            assert!(v.get(key).is_some(), "{key} in {v}");
        }
        assert_eq!(v["waiting"], 7);
    }

    #[test]
    fn a_payload_that_is_not_json_or_not_utf8_becomes_escaped_text() {
        let row = JobRow::from_raw(b"not json \xff\n", None);
        assert!(row.malformed);
        assert_eq!(row.payload, "not json \\xff\\n");
        let row = JobRow::from_raw(
            br#"{"id":"j1","task":"t","attempt":2,"error":"e"}"#,
            Some(5),
        );
        assert_eq!(row.id.as_deref(), Some("j1"));
        assert_eq!(row.attempt, Some(2));
        assert_eq!(row.due_at_ms, Some(5));
        assert!(!row.malformed);
    }

    #[test]
    fn an_entry_of_the_dead_list_that_is_no_envelope_is_unreadable() {
        let row = DeadRow::from_entry(&DeadEntry {
            raw: b"\xfe garbage".to_vec(),
            letter: None,
            size: 10,
            cut: None,
            from_oldest: -1,
        });
        assert_eq!(row.reason, "unreadable");
        assert_eq!(row.payload, "\\xfe garbage");
        assert_eq!(row.id, None);
    }

    #[test]
    fn a_job_id_is_1_to_200_bytes() {
        assert!(job_id_problem("j1").is_none());
        assert!(job_id_problem(&"é".repeat(100)).is_none(), "200 bytes");
        let long = job_id_problem(&"é".repeat(101)).expect("202 bytes");
        assert!(long.ends_with("this one is 202 bytes"), "{long}");
        let empty = job_id_problem("").expect("empty");
        assert!(empty.ends_with("this one is empty"), "{empty}");
    }

    #[test]
    fn json_is_shown_pretty_escaped_and_cut_like_a_payload() {
        let (shown, cut) = json_preview(&serde_json::json!({"a": "b\u{7f}"}));
        assert_eq!(shown, "{\n  \"a\": \"b\\u{7f}\"\n}");
        assert!(!cut);
        let (shown, cut) = json_preview(&serde_json::json!(["y".repeat(1_000)]));
        assert!(cut);
        assert_eq!(shown.chars().count(), PAYLOAD_PREVIEW_CHARS + 1);
        assert!(shown.starts_with("[\n  \"yyy"), "{shown}");
        assert!(shown.ends_with("y…"), "{shown}");
    }

    #[test]
    fn pages_round_up_and_never_drop_to_zero() {
        let page = |total| ListPage {
            queue: "q".into(),
            kind: ListKind::Waiting,
            total,
            page: 1,
            per_page: 50,
            items: Rows::Jobs(Vec::new()),
        };
        assert_eq!(page(0).pages(), 1);
        assert_eq!(page(50).pages(), 1);
        assert_eq!(page(51).pages(), 2);
        assert_eq!(page(1_000_000).pages(), 20_000);
    }
}
