//! One attempt at one job and its settlement: done, retried later with
//! backoff, or dead-lettered (Sidekiq's processor and job retry).

use super::*;

impl Worker {
    /// One attempt at one job, then its settlement. Holds its slot until
    /// the outcome is recorded in Redis.
    pub(super) async fn run_job(
        self: Arc<Self>,
        qi: usize,
        seq: u64,
        job: Arc<Job>,
        stamped: Arc<str>,
        permit: OwnedSemaphorePermit,
    ) {
        let _slot = permit;
        let queue = self.queues[qi].name();
        self.metrics.in_flight.inc();
        let started = Instant::now();
        let outcome = tokio::select! {
            biased;
            _ = self.give_up.cancelled() => None,
            result = tokio::time::timeout(self.config.job_timeout, self.handler.handle(&job)) => Some(
                result.unwrap_or_else(|_| Outcome::retry(format!(
                    "timed out after {}",
                    humantime::format_duration(self.config.job_timeout)
                ))),
            ),
        };
        self.metrics.in_flight.dec();
        // Abandoned at the shutdown deadline: the drain gives it back.
        let Some(outcome) = outcome else { return };
        self.metrics
            .job_duration
            .with_label_values(&[queue])
            .observe(started.elapsed().as_secs_f64());
        if outcome == Outcome::Done && self.config.concurrency == 1 && !self.shutdown.is_draining()
        {
            // With one slot there is nothing to batch: complete and take the
            // next job in one round trip, so a busy queue costs two round
            // trips per job instead of three. With more slots the fetch loop
            // takes freed slots' jobs in batches, which costs Redis less.
            if let Some(next) = self.ack_and_take(qi, &job, &stamped).await {
                self.ledger().queues[qi].remove(&seq);
                if let Some(next) = next {
                    self.clone().dispatch_into(next, _slot).await;
                }
                return;
            }
        }
        self.settle(qi, &job, &stamped, outcome).await;
        self.ledger().queues[qi].remove(&seq);
    }

    /// Completes a job and takes the next into its slot. `None` when Redis
    /// failed: the caller settles the job the ordinary way, and the
    /// processing list is checked in case a job was moved before the reply
    /// was lost.
    pub(super) async fn ack_and_take(
        &self,
        qi: usize,
        job: &Job,
        stamped: &str,
    ) -> Option<Option<Fetched>> {
        let result = self
            .redis
            .once("ack", |mut c| async move {
                queue::ack_and_take(&mut c, &self.queues, qi, &self.instance, stamped.as_bytes())
                    .await
            })
            .await;
        match result {
            Ok((kept, next)) => {
                self.record(qi, job, "done", Some(kept));
                Some(next)
            }
            Err(_) => {
                self.suspect_lost_reply();
                None
            }
        }
    }

    pub(super) async fn settle(&self, qi: usize, job: &Job, stamped: &str, outcome: Outcome) {
        let q = &self.queues[qi];
        let queue = q.name();
        let stop = self.give_up.clone();
        let (label, kept) = match outcome {
            Outcome::Done => {
                let kept = self
                    .redis
                    .persist("ack", &stop, |mut c| async move {
                        queue::ack(&mut c, q, &self.instance, stamped.as_bytes()).await
                    })
                    .await;
                ("done", kept)
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
                tracing::info!(queue, id = job.id(), attempt = job.attempt(), %error, retry_in = ?delay, "attempt failed");
                let next = job.failed(&error);
                let next = next.as_str();
                let kept = self
                    .redis
                    .persist("retry", &stop, |mut c| async move {
                        let held = stamped.as_bytes();
                        queue::retry_later(&mut c, q, &self.instance, held, next, delay).await
                    })
                    .await;
                ("retried", kept)
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
                };
                self.log_dead(qi, &letter);
                let envelope = letter.to_json();
                let envelope = envelope.as_str();
                let kept = self
                    .redis
                    .persist("bury", &stop, |mut c| async move {
                        queue::bury(&mut c, q, &self.instance, stamped.as_bytes(), envelope).await
                    })
                    .await;
                ("dead", kept)
            }
        };
        self.record(qi, job, label, kept);
    }

    /// Counts a settlement: `Some(false)` when a reaper had already returned
    /// the job, `None` when Redis could not be reached before the deadline.
    pub(super) fn record(&self, qi: usize, job: &Job, label: &str, kept: Option<bool>) {
        let queue = self.queues[qi].name();
        match kept {
            Some(true) => self.metrics.jobs.with_label_values(&[queue, label]).inc(),
            Some(false) => {
                self.metrics.stale_acks.with_label_values(&[queue]).inc();
                tracing::warn!(
                    queue,
                    id = job.id(),
                    "job was already returned to the queue by a reaper; not settled twice"
                );
            }
            // Shutdown deadline while Redis was unreachable: the job stays in
            // the processing list and is recovered by the next incarnation.
            None => {}
        }
    }

    pub(super) fn log_dead(&self, qi: usize, letter: &DeadLetter) {
        let queue = self.queues[qi].name();
        self.metrics
            .dead_letters
            .with_label_values(&[queue, letter.reason.as_str()])
            .inc();
        tracing::warn!(queue, reason = letter.reason.as_str(), error = %letter.error, attempts = letter.attempts, "job dead-lettered");
    }
}
