//! One attempt at one job and its settlement: done, retried later with
//! backoff, or dead-lettered (Sidekiq's processor and job retry), in
//! batches: one round trip settles every job that finished meanwhile and
//! takes the next jobs into the freed slots.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use workerpool_queue::job::{DeadLetter, DeadReason, Job};
use workerpool_queue::ops::{self, Settlement, Start};
use workerpool_queue::text::LINE_CHARS;

use super::ledger::InHand;
use super::{MAX_BATCH, Worker};
use crate::backoff;
use crate::handler::Outcome;

impl Worker {
    /// One attempt at one job, then its settlement, which the settle loop
    /// sends and records. The job keeps its slot until its outcome is
    /// recorded in Redis, and so does the task tracker that the drain
    /// waits on.
    pub(super) async fn run_job(
        self: Arc<Self>,
        entry: u64,
        in_hand: InHand,
        start: Start,
        permit: OwnedSemaphorePermit,
    ) {
        let (qi, job) = (in_hand.queue, &in_hand.job);
        let keep = self.keep_of(qi, job);
        // A kept job the taking script wrote running (or found cancelled)
        // starts at once; one it could not judge is noted here.
        if let Some(keep) = keep
            && match start {
                Start::Running => false,
                Start::Cancelled => true,
                // Boxed: only kept jobs wait on it, and in place its state
                // would make every job's task larger (tokio copies a task's
                // future as it spawns and finishes it).
                Start::Unnoted => !Box::pin(self.note_running(qi, job, keep)).await,
            }
        {
            // A cancel found it taken and not yet started: it ends
            // cancelled without running.
            tracing::info!(
                queue = self.queues[qi].name(),
                id = ?shown(job.id()),
                "job cancelled before it started"
            );
            let finished = Settling {
                entry,
                in_hand,
                settlement: Settlement::Cancelled,
                kept: Some(KeptValue {
                    keep,
                    value: String::new(),
                    note: String::new(),
                }),
                slot: permit,
                _tracked: self.tracker.token(),
            };
            let _ = self.settler.send(finished);
            return;
        }
        // A kept job is where progress and a producer's cancel find it.
        let current = keep.map(|_| super::report::Current {
            id: job.id().to_string(),
            reports: self.reports.clone(),
            cancelled: self.running.enter(job.id(), qi, job.attempt()),
        });
        self.job_metrics[qi].in_flight.inc();
        let started = Instant::now();
        // Traced: the handler gets the attempt span's traceparent.
        let attempt = self
            .otel
            .as_ref()
            .map(|o| o.start_attempt(self.queues[qi].name(), job, self.now_ms()));
        let traced = attempt
            .as_ref()
            .map(|a| job.with_attempt_trace(a.traceparent()));
        let handed = traced.as_ref().unwrap_or(job);
        // The handler's future is boxed already; a kept job's is boxed again
        // with what it reports to, so that a job that keeps nothing pays for
        // neither in its task's size.
        let handling: futures::future::BoxFuture<'_, Outcome> = match current {
            Some(current) => {
                Box::pin(super::report::CURRENT.scope(current, self.handler.handle(handed)))
            }
            None => self.handler.handle(handed),
        };
        let outcome = tokio::select! {
            biased;
            _ = self.give_up.cancelled() => None,
            result = tokio::time::timeout(self.config.job_timeout, handling) => Some(
                result.unwrap_or_else(|_| Outcome::retry(format!(
                    "timed out after {}",
                    humantime::format_duration(self.config.job_timeout)
                ))),
            ),
        };
        if keep.is_some() {
            self.running.leave(job.id());
        }
        self.job_metrics[qi].in_flight.dec();
        // Abandoned at the shutdown deadline: the drain gives it back.
        let Some(outcome) = outcome else {
            if let Some(attempt) = attempt {
                attempt.given_back();
            }
            return;
        };
        if let Some(attempt) = attempt {
            let dead = match &outcome {
                Outcome::Failed { retry: false, .. } => Some("permanent"),
                Outcome::Failed { retry: true, .. }
                    if job.attempt() >= self.config.max_attempts =>
                {
                    Some("exhausted")
                }
                _ => None,
            };
            attempt.end(&outcome, dead);
        }
        self.job_metrics[qi].timed(started.elapsed().as_secs_f64());
        // The job as handed carries the attempt's trace: a retry links to it.
        let kept = keep.map(|keep| KeptValue::of(keep, &outcome));
        let settlement = self.settlement(qi, traced.as_ref().unwrap_or(job), outcome);
        let finished = Settling {
            entry,
            in_hand,
            settlement,
            kept,
            slot: permit,
            _tracked: self.tracker.token(),
        };
        // An error means the settler has stopped: only after the drain gave
        // up on running jobs, which stay in the processing list (and in the
        // ledger) for the give-back.
        let _ = self.settler.send(finished);
    }

    /// How long to keep the job's outcome, if at all: its own `keep`, else
    /// the worker's `--keep-outcomes`. A `keep` that is not a number of
    /// seconds is ignored with a warning, as a malformed `traceparent` is.
    fn keep_of(&self, qi: usize, job: &Job) -> Option<std::time::Duration> {
        match job.keep() {
            Ok(Some(keep)) => Some(keep),
            Ok(None) => self.config.keep_outcomes,
            Err(problem) => {
                tracing::warn!(
                    queue = self.queues[qi].name(),
                    id = ?shown(job.id()),
                    "{problem}; the worker's --keep-outcomes applies"
                );
                self.config.keep_outcomes
            }
        }
    }

    /// Notes a kept job as running before its handler starts: at most a
    /// second's wait, and the job runs whatever Redis answers (the
    /// settlement writes its outcome all the same). `false` when a cancel
    /// was asked for it: it is not to run.
    async fn note_running(&self, qi: usize, job: &Job, keep: std::time::Duration) -> bool {
        let write = async {
            let mut conn = self.redis.conn().await?;
            workerpool_queue::outcome::start(
                &mut conn,
                &self.queues[qi],
                job.id(),
                job.attempt(),
                &self.instance,
                keep,
            )
            .await
        };
        match tokio::time::timeout(std::time::Duration::from_secs(1), write).await {
            Ok(Ok(run)) => run,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "could not note a kept job as running");
                true
            }
            Err(_) => {
                tracing::debug!("noting a kept job as running took over a second");
                true
            }
        }
    }

    /// What a job's outcome becomes in Redis.
    pub(super) fn settlement(&self, qi: usize, job: &Job, outcome: Outcome) -> Settlement {
        let queue = self.queues[qi].name();
        match outcome {
            Outcome::Done | Outcome::Returned(_) | Outcome::ResultNotKept(_) => Settlement::Done,
            Outcome::NotRun { error, delay } => {
                tracing::warn!(
                    queue,
                    id = ?shown(job.id()),
                    error = %shown(&error),
                    retry_in = ?delay,
                    "the handler could not run the job; it goes back to the queue, its attempt not counted"
                );
                Settlement::NotRun {
                    next: job.not_run(&error),
                    delay,
                }
            }
            Outcome::Failed { error, retry }
                if retry && job.attempt() < self.config.max_attempts =>
            {
                let delay = backoff::retry_delay(
                    job.attempt(),
                    self.config.backoff_base,
                    self.config.backoff_max,
                    &mut rand::rng(),
                );
                tracing::info!(
                    queue,
                    id = ?shown(job.id()),
                    attempt = job.attempt(),
                    error = %shown(&error),
                    retry_in = ?delay,
                    "attempt failed"
                );
                let next = job.failed(&error);
                Settlement::Retry { next, delay }
            }
            Outcome::Failed { error, retry } => {
                let letter = DeadLetter {
                    reason: if retry {
                        DeadReason::Exhausted
                    } else {
                        DeadReason::Permanent
                    },
                    error,
                    attempts: job.attempt(),
                    died_at: self.now_ms(),
                    worker: self.instance.clone(),
                    job: serde_json::Value::Object(job.fields().clone()),
                    encoding: None,
                    size: None,
                };
                self.log_dead(qi, &letter);
                let envelope = letter.to_json();
                Settlement::Dead { envelope }
            }
        }
    }

    /// Settles finished jobs in batches: each round trip settles every job
    /// that finished since the last one was sent, and takes new jobs into
    /// the slots they free (none once the drain has started). Two round
    /// trips (more only above [`MAX_BATCH`] slots per round trip) are under
    /// way at once, each with a share of the slots, so that the jobs of one
    /// run while Redis runs the other instead of each side waiting for the
    /// other. An idle worker flushes a single job at once, so batching adds
    /// no wait.
    pub(super) async fn settle_loop(
        self: Arc<Self>,
        mut finished: tokio::sync::mpsc::UnboundedReceiver<Settling>,
        stop: CancellationToken,
    ) {
        let (in_flight, most) = settle_shares(self.config.concurrency);
        let mut flushing = FuturesUnordered::new();
        loop {
            let first = tokio::select! {
                biased;
                Some(()) = flushing.next(), if !flushing.is_empty() => continue,
                next = finished.recv(), if flushing.len() < in_flight => match next {
                    Some(f) => f,
                    None => break,
                },
                _ = stop.cancelled() => break,
            };
            let mut batch = vec![first];
            while batch.len() < most {
                match finished.try_recv() {
                    Ok(f) => batch.push(f),
                    Err(_) => break,
                }
            }
            flushing.push(self.flush(batch));
            // When the next batch could form at once, send this one first:
            // its first poll hands the script to the connection, and the
            // yield lets the connection write it. Formed together, both
            // batches would reach Redis in one read and come back in one
            // reply, in step, and each side would still wait for the other
            // (docs/benchmarks.md). Otherwise the loop's next wait lets the
            // connection write it anyway.
            if flushing.len() < in_flight && !finished.is_empty() {
                let _ = futures::poll!(flushing.next());
                tokio::task::yield_now().await;
            }
        }
        // Every settlement sent gets its answer before the loop ends: the
        // drain waits for them (each holds a task-tracker token).
        while flushing.next().await.is_some() {}
    }

    /// One settle round trip for `batch`, retried with backoff until done or
    /// until the shutdown deadline (the jobs then stay in the processing
    /// list for the give-back).
    async fn flush(self: &Arc<Self>, batch: Vec<Settling>) {
        let take = if self.shutdown.is_draining() {
            0
        } else {
            batch.len()
        };
        // Frees each done or dead job's unique key.
        let releases: Vec<Option<String>> = batch
            .iter()
            .map(|s| s.in_hand.job.release_token())
            .collect();
        let finished: Vec<ops::Finished<'_>> = batch
            .iter()
            .zip(&releases)
            .map(|(s, release)| {
                let mut f = s.in_hand.finished(&s.settlement, release.as_deref());
                f.kept = s.kept.as_ref().map(|k| ops::Kept {
                    id: s.in_hand.job.id(),
                    keep: k.keep,
                    attempt: s.in_hand.job.attempt(),
                    worker: &self.instance,
                    value: &k.value,
                    note: &k.note,
                    release: release.as_deref(),
                });
                f
            })
            .collect();
        let stop = self.give_up.clone();
        let reply = self
            .redis
            .persist("settle", &stop, |mut c| {
                let finished = &finished;
                async move {
                    let reply = ops::settle(
                        &mut c,
                        &self.queues,
                        &self.instance,
                        finished,
                        take,
                        self.limits(),
                        self.config.rate_limit.as_ref(),
                    )
                    .await;
                    if reply.is_err() && take > 0 {
                        // Jobs may have been taken before the reply was lost.
                        self.suspect_lost_reply();
                    }
                    reply
                }
            })
            .await;
        drop(finished);
        let (kept, taken) = match reply {
            Some((kept, taken)) => {
                if let Some(limited) = taken.limited {
                    // The slots not filled go back to the fetch loop, which
                    // waits for the limit itself.
                    let name = self.queues[limited.queue].name();
                    self.metrics.rate_limited.with_label_values(&[name]).inc();
                }
                self.log_too_large(&taken.too_large);
                (kept.into_iter().map(Some).collect(), taken.jobs)
            }
            None => (vec![None; batch.len()], Vec::new()),
        };
        let mut slots = Vec::with_capacity(batch.len());
        {
            // Out of the ledger even when Redis could not be reached before
            // the deadline: the job then stays in the processing list, for
            // the next incarnation to recover.
            let mut ledger = self.ledger();
            for (settling, kept) in batch.into_iter().zip(kept) {
                let InHand { queue, job, .. } = &settling.in_hand;
                self.record(*queue, job, &settling.settlement, kept);
                ledger.settled(*queue, settling.entry);
                slots.push(settling.slot);
            }
        }
        if !taken.is_empty() {
            let worker = self.clone();
            self.tracker.spawn(async move {
                worker.dispatch(taken, &mut slots).await;
            });
        }
    }

    /// Counts a settlement: `Some(false)` when a reaper had already returned
    /// the job, `None` when Redis could not be reached before the deadline.
    pub(super) fn record(&self, qi: usize, job: &Job, settlement: &Settlement, kept: Option<bool>) {
        let queue = self.queues[qi].name();
        let counted = &self.job_metrics[qi];
        match kept {
            Some(true) => match settlement {
                Settlement::Done => counted.done.inc(),
                Settlement::Retry { .. } => counted.retried.inc(),
                Settlement::NotRun { .. } => counted.requeued.inc(),
                Settlement::Dead { .. } => counted.dead.inc(),
                Settlement::Cancelled => self
                    .metrics
                    .jobs
                    .with_label_values(&[queue, "cancelled"])
                    .inc(),
            },
            Some(false) => {
                self.metrics.stale_acks.with_label_values(&[queue]).inc();
                tracing::warn!(
                    queue,
                    id = ?shown(job.id()),
                    "job was already returned to the queue by a reaper; not settled twice"
                );
            }
            // Shutdown deadline while Redis was unreachable: the job stays in
            // the processing list and is recovered by the next incarnation.
            None => {}
        }
    }

    /// Logs and counts the payloads a taking script dead-lettered for
    /// their size.
    pub(super) fn log_too_large(&self, refused: &[ops::TooLarge]) {
        for r in refused {
            let queue = self.queues[r.queue].name();
            self.metrics
                .dead_letters
                .with_label_values(&[queue, DeadReason::TooLarge.as_str()])
                .inc();
            self.job_metrics[r.queue].dead.inc();
            tracing::warn!(queue, reason = DeadReason::TooLarge.as_str(), error = %shown(&r.error), "job dead-lettered");
        }
    }

    /// The limits the taking scripts enforce.
    pub(super) fn limits(&self) -> ops::Limits {
        ops::Limits {
            max_attempts: self.config.max_attempts,
            max_payload_bytes: self.config.max_payload_bytes,
            keep_outcomes: self.config.keep_outcomes,
        }
    }

    pub(super) fn log_dead(&self, qi: usize, letter: &DeadLetter) {
        let queue = self.queues[qi].name();
        self.metrics
            .dead_letters
            .with_label_values(&[queue, letter.reason.as_str()])
            .inc();
        tracing::warn!(queue, reason = letter.reason.as_str(), error = %shown(&letter.error), attempts = letter.attempts, "job dead-lettered");
    }
}

/// Text from a job or a handler as a log shows it: on one line, control
/// and bidi characters escaped, at most [`LINE_CHARS`] characters. What is
/// stored (a dead letter's error) keeps the real text.
pub(super) fn shown(s: &str) -> String {
    workerpool_queue::text::safe_line(s, LINE_CHARS)
}

/// How many settle round trips may be under way at once, and the most jobs
/// each settles: two halves of the slots, so that one half's jobs run while
/// the other's round trip is under way, and more round trips only when a
/// half would exceed [`MAX_BATCH`].
fn settle_shares(concurrency: usize) -> (usize, usize) {
    let in_flight = concurrency.div_ceil(MAX_BATCH).max(2);
    (in_flight, concurrency.div_ceil(in_flight))
}

/// A finished job on its way to the settle loop, with the slot it keeps
/// until its settlement is recorded in Redis.
/// What a kept job's outcome holds besides its state.
pub(super) struct KeptValue {
    keep: std::time::Duration,
    /// The result of a job done (JSON text, empty for none), or the error.
    value: String,
    /// Why a returned result is not kept.
    note: String,
}

impl KeptValue {
    fn of(keep: std::time::Duration, outcome: &Outcome) -> Self {
        let limit = workerpool_queue::outcome::MAX_RESULT_BYTES;
        let (value, note) = match outcome {
            Outcome::Done => (String::new(), String::new()),
            Outcome::Returned(result) if result.len() > limit => (
                String::new(),
                format!(
                    "the result was not kept: {} bytes of JSON, over the limit of {limit}",
                    result.len()
                ),
            ),
            Outcome::Returned(result) => (result.clone(), String::new()),
            Outcome::ResultNotKept(why) => (String::new(), why.clone()),
            Outcome::Failed { error, .. } | Outcome::NotRun { error, .. } => {
                (error.clone(), String::new())
            }
        };
        Self { keep, value, note }
    }
}

pub(super) struct Settling {
    /// The job's entry in the ledger.
    entry: u64,
    in_hand: InHand,
    settlement: Settlement,
    /// Its outcome to keep, when it is kept.
    kept: Option<KeptValue>,
    slot: OwnedSemaphorePermit,
    /// Keeps the drain waiting until the settlement is recorded.
    _tracked: tokio_util::task::task_tracker::TaskTrackerToken,
}

#[cfg(test)]
mod tests {
    use super::settle_shares;

    #[test]
    fn the_slots_are_settled_in_two_halves_of_at_most_max_batch() {
        assert_eq!(settle_shares(1), (2, 1));
        assert_eq!(settle_shares(10), (2, 5));
        assert_eq!(settle_shares(11), (2, 6));
        assert_eq!(settle_shares(50), (2, 25));
        assert_eq!(settle_shares(200), (2, 100));
        assert_eq!(settle_shares(201), (3, 67));
        assert_eq!(settle_shares(1000), (10, 100));
    }
}
