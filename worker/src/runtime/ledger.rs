//! The ledger of jobs in hand: what this process has taken and not
//! settled, the recheck of the processing lists against it after a lost
//! reply, and the line of state it makes on request (SIGUSR1). Only the
//! ledger's own methods change it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::RedisResult;
use workerpool_queue::job::{Job, SharedText};
use workerpool_queue::ops::{self, Payload, Settlement};

use super::Worker;

/// A job in hand: taken from its queue and not yet settled, from its start
/// to its settlement (Sidekiq's `UnitOfWork`).
#[derive(Clone)]
pub(super) struct InHand {
    /// Index of its queue in the worker's queues.
    pub(super) queue: usize,
    /// The stamped payload, exactly as the processing list holds it.
    held: SharedText,
    /// The job its handler runs.
    pub(super) job: Arc<Job>,
    /// When its attempt started.
    started: Instant,
}

impl InHand {
    /// A job of queue `queue` that starts now, with its payload as held.
    pub(super) fn start(queue: usize, job: Arc<Job>, held: SharedText) -> Self {
        Self {
            queue,
            held,
            job,
            started: Instant::now(),
        }
    }

    /// What the settle script is given for it: its payload as held, what
    /// becomes of it, and the token that frees its unique key.
    pub(super) fn finished<'a>(
        &'a self,
        settlement: &'a Settlement,
        release: Option<&'a str>,
    ) -> ops::Finished<'a> {
        ops::Finished {
            queue: self.queue,
            payload: self.held.as_bytes(),
            settlement,
            release,
            kept: None,
        }
    }
}

/// Every job this process has in hand, per queue, keyed by an entry
/// number (lower = taken earlier).
pub(super) struct Ledger {
    next: u64,
    queues: Vec<BTreeMap<u64, InHand>>,
    /// Since when no job has been in hand (the ledger's creation, or the
    /// settlement that emptied it); `None` while one is.
    empty_since: Option<Instant>,
}

/// How long this process has been busy or idle, as its heartbeat tells the
/// operator (which protects pods holding long jobs from node disruption).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Activity {
    /// The oldest job in hand has run this long.
    Busy(Duration),
    /// No job has been in hand for this long.
    Idle(Duration),
}

impl Ledger {
    /// An empty ledger for `queues` queues.
    pub(super) fn new(queues: usize) -> Self {
        Self {
            next: 0,
            queues: (0..queues).map(|_| BTreeMap::new()).collect(),
            empty_since: Some(Instant::now()),
        }
    }

    /// Whether a job is in hand and for how long, or for how long none
    /// has been, at `now`.
    pub(super) fn activity(&self, now: Instant) -> Activity {
        let oldest = self
            .queues
            .iter()
            .flat_map(BTreeMap::values)
            .map(|j| j.started)
            .min();
        match (oldest, self.empty_since) {
            (Some(started), _) => Activity::Busy(now.saturating_duration_since(started)),
            (None, since) => {
                Activity::Idle(since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s)))
            }
        }
    }

    /// Records a job taken in hand; returns its entry.
    pub(super) fn enter(&mut self, job: InHand) -> u64 {
        let entry = self.next;
        self.next += 1;
        self.queues[job.queue].insert(entry, job);
        self.empty_since = None;
        entry
    }

    /// Removes a settled job's entry.
    pub(super) fn settled(&mut self, queue: usize, entry: u64) {
        self.queues[queue].remove(&entry);
        if self.empty_since.is_none() && self.len() == 0 {
            self.empty_since = Some(Instant::now());
        }
    }

    /// The payloads in hand on `queue`, as its processing list holds them.
    fn held(&self, queue: usize) -> Vec<SharedText> {
        self.queues[queue]
            .values()
            .map(|j| j.held.clone())
            .collect()
    }

    /// The jobs in hand on `queue` by their payload as held: what the
    /// give-back at shutdown returns unstarted.
    pub(super) fn unfinished(&self, queue: usize) -> HashMap<SharedText, Arc<Job>> {
        self.queues[queue]
            .values()
            .map(|j| (j.held.clone(), j.job.clone()))
            .collect()
    }

    /// Jobs in hand, on all queues.
    fn len(&self) -> usize {
        self.queues.iter().map(BTreeMap::len).sum()
    }

    /// The state line's part for each queue of `names`, oldest job first,
    /// with how long each has run at `now`.
    fn state(&self, names: &[&str], now: Instant) -> String {
        let jobs: Vec<String> = names
            .iter()
            .zip(&self.queues)
            .map(|(name, jobs)| {
                let running = jobs
                    .values()
                    .map(|j| (j.job.id(), now.saturating_duration_since(j.started)));
                queue_state(name, jobs.len(), running)
            })
            .collect();
        jobs.join("; ")
    }
}

/// Jobs of one queue named in the state line; the rest are counted.
const STATE_JOBS: usize = 20;
/// Characters of a job's id in the state line.
const STATE_ID_CHARS: usize = 100;

impl Worker {
    pub(super) fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs one line at info: whether the worker drains, and per queue the
    /// jobs in hand (taken, not yet settled), oldest first, with their ids
    /// and how long they have run.
    pub(super) fn log_state(&self) {
        let now = Instant::now();
        let (in_hand, jobs) = {
            let ledger = self.ledger();
            (ledger.len(), ledger.state(&self.queue_names(), now))
        };
        tracing::info!(
            draining = self.shutdown.is_draining(),
            in_flight = in_hand,
            jobs = %jobs,
            "worker state"
        );
    }

    /// Gives back whatever the processing lists hold beyond the ledger: jobs
    /// Redis moved for this process while the reply was lost, and, after a
    /// failover, entries the new primary kept of jobs whose settlement went
    /// to the old one (they run again: at-least-once).
    pub(super) async fn recheck_lost_replies(&self) -> RedisResult<()> {
        let mut c = self.redis.conn().await?;
        for (qi, q) in self.queues.iter().enumerate() {
            let listed = ops::processing(&mut c, q, &self.instance).await?;
            let held = self.ledger().held(qi);
            // The list is newest first; the oldest goes back last, to the very head.
            let unknown = unknown(&listed, &held);
            let ids: Vec<Option<String>> = unknown
                .iter()
                .map(|p| workerpool_queue::job::id_in(p))
                .collect();
            let jobs: Vec<ops::Back<'_>> = unknown
                .iter()
                .zip(&ids)
                .map(|(p, id)| ops::Back {
                    held: p,
                    push: p,
                    kept: id.as_deref(),
                })
                .collect();
            let n = ops::give_back(&mut c, q, &self.instance, &jobs, ops::NOT_STARTED).await?;
            if n > 0 {
                tracing::warn!(
                    queue = q.name(),
                    jobs = n,
                    "returned jobs in this worker's processing list that it does not run (moved while a reply was lost, or left by a failover)"
                );
            }
        }
        Ok(())
    }
}

/// One queue in the state line: `name: N (id 1.2s, id 0.3s, …)`, the
/// first [`STATE_JOBS`] of `jobs` named, their ids escaped and cut.
fn queue_state<'a>(
    name: &str,
    n: usize,
    jobs: impl Iterator<Item = (&'a str, Duration)>,
) -> String {
    let mut shown: Vec<String> = jobs
        .take(STATE_JOBS)
        .map(|(id, ran)| {
            format!(
                "{} {:.1}s",
                workerpool_queue::text::safe_line(id, STATE_ID_CHARS),
                ran.as_secs_f64()
            )
        })
        .collect();
    if n > shown.len() {
        shown.push(format!("{} more", n - shown.len()));
    }
    if shown.is_empty() {
        format!("{name}: 0")
    } else {
        format!("{name}: {n} ({})", shown.join(", "))
    }
}

/// What a processing list holds beyond the ledger, in list order: each
/// held payload accounts for one listed copy (the same job can be listed
/// twice when a producer pushed it twice).
fn unknown<'a>(listed: &'a [Payload], held: &[SharedText]) -> Vec<&'a [u8]> {
    let mut known: HashMap<&[u8], usize> = HashMap::new();
    for payload in held {
        *known.entry(payload.as_bytes()).or_default() += 1;
    }
    let mut extra = Vec::new();
    for payload in listed {
        match known.get_mut(payload.as_slice()) {
            Some(n) if *n > 0 => *n -= 1,
            _ => extra.push(payload.as_slice()),
        }
    }
    extra
}

/// What to push back for each listed payload at shutdown: a job this
/// process started goes back unstarted (its attempt not counted); anything
/// else, even bytes that are no job, goes back exactly as it was.
pub(super) fn unstarted(
    listed: &[Payload],
    started: &HashMap<SharedText, Arc<Job>>,
) -> Vec<Payload> {
    listed
        .iter()
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| started.get(p))
                .map_or_else(|| p.clone(), |j| j.unstarted().into_bytes())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use workerpool_queue::job::intake;

    fn held(payloads: &[&str]) -> Vec<SharedText> {
        payloads.iter().map(|p| SharedText::from(*p)).collect()
    }

    fn listed(payloads: &[&[u8]]) -> Vec<Payload> {
        payloads.iter().map(|p| p.to_vec()).collect()
    }

    #[test]
    fn the_state_line_names_each_queue_and_its_first_jobs_escaped_with_their_time() {
        let ms = Duration::from_millis;
        assert_eq!(queue_state("idle", 0, std::iter::empty()), "idle: 0");
        assert_eq!(
            queue_state("q", 2, [("a", ms(2_040)), ("b\n", ms(30))].into_iter()),
            r"q: 2 (a 2.0s, b\n 0.0s)"
        );
        let many: Vec<String> = (0..STATE_JOBS + 3).map(|n| format!("j{n}")).collect();
        let line = queue_state(
            "busy",
            many.len(),
            many.iter().map(|id| (id.as_str(), ms(1_000))),
        );
        assert!(line.starts_with("busy: 23 (j0 1.0s, j1 1.0s,"), "{line}");
        assert!(line.ends_with("j19 1.0s, 3 more)"), "{line}");
    }

    #[test]
    fn jobs_moved_while_a_reply_was_lost_are_what_the_list_holds_beyond_the_ledger() {
        let list = listed(&[b"new", b"a", b"\xff", b"b"]);
        assert_eq!(
            unknown(&list, &held(&["a", "b"])),
            [b"new".as_slice(), b"\xff".as_slice()]
        );
        assert!(unknown(&list, &held(&["new", "a", "b"])).len() == 1);
        assert!(unknown(&[], &held(&["a"])).is_empty(), "settled meanwhile");
    }

    #[test]
    fn a_payload_listed_twice_but_held_once_is_given_back_once() {
        let list = listed(&[b"same", b"same"]);
        assert_eq!(unknown(&list, &held(&["same"])), [b"same".as_slice()]);
    }

    #[test]
    fn at_shutdown_started_jobs_go_back_unstarted_and_everything_else_as_it_was() {
        let workerpool_queue::job::Intake::Run { job, stamped } =
            intake(br#"{"task":"t"}"#, 1, 5, "w")
        else {
            panic!("runs");
        };
        let started = HashMap::from([(SharedText::from(stamped.as_str()), Arc::new(job.clone()))]);
        let list = listed(&[stamped.as_bytes(), b"\xfe raw", b"{\"other\":1}"]);
        let pushed = unstarted(&list, &started);
        assert_eq!(pushed[0], job.unstarted().into_bytes());
        assert_eq!(pushed[1], b"\xfe raw");
        assert_eq!(pushed[2], br#"{"other":1}"#);
        let back: serde_json::Value = serde_json::from_slice(&pushed[0]).expect("json");
        assert!(back.get("attempt").is_none(), "the attempt is not counted");
    }
}
