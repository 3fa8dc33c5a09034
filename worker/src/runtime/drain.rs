//! The graceful drain: in-flight jobs get the shutdown timeout, then every
//! unfinished job goes back to the head of its queue and the worker leaves
//! the registry.

use tokio_util::sync::CancellationToken;
use workerpool_queue::ops;

use super::ledger::unstarted;
use super::{GIVE_BACK_WINDOW, Worker};

impl Worker {
    /// Lets in-flight jobs finish until the shutdown timeout (or a second
    /// signal), then gives every unfinished job back to the head of its
    /// queue without counting the attempt, and leaves the registry.
    pub(super) async fn drain(&self) {
        let tracker = &self.tracker;
        self.health.set_draining();
        let running = self.running();
        tracing::info!(running, timeout = ?self.config.shutdown_timeout, "draining");
        tracker.close();
        tokio::select! {
            _ = tracker.wait() => {}
            _ = tokio::time::sleep(self.config.shutdown_timeout) => {
                tracing::warn!("shutdown timeout reached; returning unfinished jobs to the queue");
            }
            _ = self.shutdown.now.cancelled() => {}
        }
        self.give_up.cancel();
        tracker.wait().await;

        let window = CancellationToken::new();
        let timer = {
            let window = window.clone();
            tokio::spawn(async move {
                tokio::time::sleep(GIVE_BACK_WINDOW).await;
                window.cancel();
            })
        };
        for (qi, q) in self.queues.iter().enumerate() {
            let unfinished = self.ledger().unfinished(qi);
            let returned = self
                .redis
                .persist("give_back", &window, |mut c| {
                    let unfinished = &unfinished;
                    async move {
                        let listed = ops::processing(&mut c, q, &self.instance).await?;
                        let pushed = unstarted(&listed, unfinished);
                        // A kept job still shown running here is waiting again.
                        let ids: Vec<Option<String>> = listed
                            .iter()
                            .map(|p| workerpool_queue::job::id_in(p))
                            .collect();
                        let jobs: Vec<ops::Back<'_>> = listed
                            .iter()
                            .zip(&pushed)
                            .zip(&ids)
                            .map(|((held, push), id)| ops::Back {
                                held,
                                push,
                                kept: id.as_deref(),
                            })
                            .collect();
                        let n =
                            ops::give_back(&mut c, q, &self.instance, &jobs, ops::STOPPING).await?;
                        ops::deregister(&mut c, q, &self.instance).await?;
                        Ok(n)
                    }
                })
                .await;
            match returned {
                Some(n) => {
                    if n > 0 {
                        tracing::info!(
                            queue = q.name(),
                            jobs = n,
                            "unfinished jobs returned to the head of the queue"
                        );
                    }
                    self.metrics
                        .jobs
                        .with_label_values(&[q.name(), "requeued"])
                        .inc_by(n as u64);
                }
                None => tracing::error!(
                    queue = q.name(),
                    error = %self.redis.last_error(),
                    "could not return unfinished jobs at shutdown: they stay in this worker's processing list and are recovered when it is taken for lost or restarts"
                ),
            }
        }
        timer.abort();
    }
}
