//! The ledger of held jobs: what this process has taken and not settled,
//! and the check of the processing lists against it after a lost reply.

use super::*;

/// A job this process has taken and not yet settled, as it sits in the
/// processing list.
pub(super) struct Held {
    /// The stamped payload, exactly as the processing list holds it.
    pub(super) payload: Arc<str>,
    /// The job its handler runs.
    pub(super) job: Arc<Job>,
}

/// Everything this process holds, per queue, keyed by a fetch sequence
/// number (lower = taken earlier).
#[derive(Default)]
pub(super) struct Ledger {
    pub(super) next: u64,
    pub(super) queues: Vec<HashMap<u64, Held>>,
}

impl Worker {
    pub(super) fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives back whatever the processing lists hold beyond the ledger: jobs
    /// Redis moved for us while the reply was lost.
    pub(super) async fn reconcile(&self) -> RedisResult<()> {
        let mut c = self.redis.conn().await?;
        for (qi, q) in self.queues.iter().enumerate() {
            let listed = queue::processing(&mut c, q, &self.instance).await?;
            let held: Vec<Arc<str>> = self.ledger().queues[qi]
                .values()
                .map(|h| h.payload.clone())
                .collect();
            let mut known: HashMap<&[u8], usize> = HashMap::new();
            for payload in &held {
                *known.entry(payload.as_bytes()).or_default() += 1;
            }
            let mut extra = Vec::new();
            for payload in &listed {
                match known.get_mut(payload.as_slice()) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => extra.push(payload.as_slice()),
                }
            }
            // The list is newest first; the oldest goes back last, to the very head.
            let pairs: Vec<(&[u8], &[u8])> = extra.iter().map(|p| (*p, *p)).collect();
            let n = queue::give_back(&mut c, q, &self.instance, &pairs).await?;
            if n > 0 {
                tracing::warn!(
                    queue = q.name(),
                    jobs = n,
                    "returned jobs moved for this worker whose replies were lost"
                );
            }
        }
        Ok(())
    }
}
