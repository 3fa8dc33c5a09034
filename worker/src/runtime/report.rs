//! What running kept jobs report before they end, and what producers ask
//! of them: progress goes to the job's outcome at most once per
//! [`PROGRESS_INTERVAL`] per job (reports in between fold into the
//! latest), and a cancel a producer asked for reaches the handler
//! ([`Handler::cancel`](crate::handler::Handler::cancel)) from the
//! maintenance round or from a progress write's reply, once per attempt.
//!
//! Rust handlers report through [`progress`] and ask [`cancel_requested`]
//! from inside `handle`; exec children through their lines, which the
//! exec handlers hand to [`Reports`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use workerpool_queue::outcome::{self, MAX_PROGRESS_BYTES, PROGRESS_INTERVAL};

use super::Worker;
use super::settle::shown;
use crate::handler::Reports;

/// Reports waiting for the progress loop; beyond this, new ones are
/// dropped (the next one carries the news: only the latest counts).
const QUEUED_REPORTS: usize = 1024;

/// A kept job running in this process.
pub(super) struct RunningJob {
    queue: usize,
    attempt: u32,
    /// Set once a cancel was asked for and told to the handler.
    cancelled: Arc<AtomicBool>,
}

/// The kept jobs running in this process, by id.
#[derive(Default)]
pub(super) struct Running(std::sync::Mutex<HashMap<String, RunningJob>>);

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, RunningJob>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes kept job `id` of queue `queue` running its attempt `attempt`;
    /// returns the flag its cancel sets.
    pub(super) fn enter(&self, id: &str, queue: usize, attempt: u32) -> Arc<AtomicBool> {
        let cancelled = Arc::new(AtomicBool::new(false));
        self.lock().insert(
            id.to_string(),
            RunningJob {
                queue,
                attempt,
                cancelled: cancelled.clone(),
            },
        );
        cancelled
    }

    /// Its attempt ended.
    pub(super) fn leave(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Queue and attempt of running kept job `id`.
    fn find(&self, id: &str) -> Option<(usize, u32)> {
        self.lock().get(id).map(|j| (j.queue, j.attempt))
    }

    /// The running kept jobs of each queue no cancel was told to yet.
    fn untold(&self, queues: usize) -> Vec<Vec<String>> {
        let mut by_queue = vec![Vec::new(); queues];
        for (id, job) in self.lock().iter() {
            if !job.cancelled.load(Ordering::Relaxed)
                && let Some(ids) = by_queue.get_mut(job.queue)
            {
                ids.push(id.clone());
            }
        }
        by_queue
    }

    /// Marks job `id` cancelled; `true` the first time.
    fn mark_cancelled(&self, id: &str) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|j| !j.cancelled.swap(true, Ordering::Relaxed))
    }
}

/// The [`Reports`] the worker gives its handler: hands each report to the
/// progress loop without waiting.
pub(super) struct ReportSink(mpsc::Sender<(String, String)>);

impl Reports for ReportSink {
    fn progress(&self, id: &str, value: String) {
        // Full: dropped; a later report carries the news.
        let _ = self.0.try_send((id.to_string(), value));
    }
}

/// A new sink and the receiving end for [`Worker::progress_loop`].
pub(super) fn sink() -> (Arc<ReportSink>, mpsc::Receiver<(String, String)>) {
    let (tx, rx) = mpsc::channel(QUEUED_REPORTS);
    (Arc::new(ReportSink(tx)), rx)
}

impl Worker {
    /// Writes progress reports of running kept jobs, at most one per job
    /// per [`PROGRESS_INTERVAL`], the latest report winning; until `stop`.
    pub(super) async fn progress_loop(
        self: Arc<Self>,
        mut reports: mpsc::Receiver<(String, String)>,
        stop: CancellationToken,
    ) {
        let mut last: HashMap<String, Instant> = HashMap::new();
        let mut pending: HashMap<String, String> = HashMap::new();
        let mut tick = tokio::time::interval(PROGRESS_INTERVAL / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                report = reports.recv() => {
                    let Some((id, value)) = report else { return };
                    if self.running.find(&id).is_none() {
                        continue;
                    }
                    if value.len() > MAX_PROGRESS_BYTES {
                        tracing::warn!(
                            id = ?shown(&id),
                            bytes = value.len(),
                            limit = MAX_PROGRESS_BYTES,
                            "progress report over the limit dropped"
                        );
                        continue;
                    }
                    if last.get(&id).is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL) {
                        pending.insert(id, value);
                    } else {
                        last.insert(id.clone(), Instant::now());
                        self.write_progress(&id, &value).await;
                    }
                }
                _ = tick.tick() => {
                    let due: Vec<String> = pending
                        .keys()
                        .filter(|id| last.get(*id).is_none_or(|t| t.elapsed() >= PROGRESS_INTERVAL))
                        .cloned()
                        .collect();
                    for id in due {
                        if let Some(value) = pending.remove(&id) {
                            last.insert(id.clone(), Instant::now());
                            self.write_progress(&id, &value).await;
                        }
                    }
                    // Jobs that ended are forgotten.
                    last.retain(|id, _| self.running.find(id).is_some());
                    pending.retain(|id, _| self.running.find(id).is_some());
                }
                _ = stop.cancelled() => return,
            }
        }
    }

    /// One progress write; a reply that says a cancel was asked for tells
    /// the handler. A write that fails is logged and dropped (the next
    /// report carries the news).
    async fn write_progress(&self, id: &str, value: &str) {
        let Some((qi, attempt)) = self.running.find(id) else {
            return;
        };
        let write = async {
            let mut conn = self.redis.conn().await?;
            outcome::progress(
                &mut conn,
                &self.queues[qi],
                id,
                &self.instance,
                attempt,
                value,
            )
            .await
        };
        match tokio::time::timeout(std::time::Duration::from_secs(2), write).await {
            Ok(Ok(reported)) => {
                if reported.cancel_requested {
                    self.tell_cancel(qi, id);
                }
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "could not write a job's progress"),
            Err(_) => tracing::debug!("writing a job's progress took over 2 s"),
        }
    }

    /// Asks Redis which running kept jobs a producer asked to cancel, and
    /// tells the handler of each (once).
    pub(super) async fn check_cancels(&self, conn: &mut impl workerpool_queue::connection::Conn) {
        for (qi, ids) in self
            .running
            .untold(self.queues.len())
            .into_iter()
            .enumerate()
        {
            if ids.is_empty() {
                continue;
            }
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            match outcome::cancel_requested(conn, &self.queues[qi], &refs).await {
                Ok(asked) => {
                    for (id, asked) in ids.iter().zip(asked) {
                        if asked {
                            self.tell_cancel(qi, id);
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "could not check for cancelled jobs"),
            }
        }
    }

    fn tell_cancel(&self, qi: usize, id: &str) {
        if self.running.mark_cancelled(id) {
            tracing::info!(
                queue = self.queues[qi].name(),
                id = ?shown(id),
                "a cancel was asked for a running job; the handler is told"
            );
            self.handler.cancel(id);
        }
    }
}

/// The job a Rust handler's `handle` runs, as [`progress`] and
/// [`cancel_requested`] find it.
#[derive(Clone)]
pub(super) struct Current {
    pub(super) id: String,
    pub(super) reports: Arc<dyn Reports>,
    pub(super) cancelled: Arc<AtomicBool>,
}

tokio::task_local! {
    pub(super) static CURRENT: Current;
}

/// Reports the progress of the job the calling handler runs (any value
/// that serializes to JSON of at most
/// [`MAX_PROGRESS_BYTES`](workerpool_queue::outcome::MAX_PROGRESS_BYTES)):
/// `status` shows the latest. Written at most once per
/// [`PROGRESS_INTERVAL`] per job; reports in between fold into the latest.
/// Does nothing outside a handler's `handle`, or for a job that keeps no
/// outcome. Returns `false` when the value was refused (too large, or not
/// JSON), having logged why.
pub fn progress(value: &impl serde::Serialize) -> bool {
    let text = match serde_json::to_string(value) {
        Ok(text) => text,
        Err(e) => {
            tracing::warn!(error = %e, "a job's progress cannot be written as JSON; dropped");
            return false;
        }
    };
    if text.len() > MAX_PROGRESS_BYTES {
        tracing::warn!(
            bytes = text.len(),
            limit = MAX_PROGRESS_BYTES,
            "progress report over the limit dropped"
        );
        return false;
    }
    let _ = CURRENT.try_with(|c| c.reports.progress(&c.id, text));
    true
}

/// Whether a producer asked to cancel the job the calling handler runs.
/// A handler that sees it may stop early: a failure then ends the job
/// cancelled (not retried); a handler that finishes anyway ends as it
/// would have. Always `false` outside a handler's `handle`, and for a job
/// that keeps no outcome (a cancel finds a running job through it).
pub fn cancel_requested() -> bool {
    CURRENT
        .try_with(|c| c.cancelled.load(Ordering::Relaxed))
        .unwrap_or(false)
}
