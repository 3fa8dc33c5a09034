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
    pub(super) queues: Vec<BTreeMap<u64, Held>>,
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
            // The list is newest first; the oldest goes back last, to the very head.
            let pairs: Vec<(&[u8], &[u8])> = unknown(&listed, &held)
                .into_iter()
                .map(|p| (p, p))
                .collect();
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

/// What a processing list holds beyond the ledger, in list order: each
/// held payload accounts for one listed copy (the same job can be listed
/// twice when a producer pushed it twice).
pub(super) fn unknown<'a>(listed: &'a [Payload], held: &[Arc<str>]) -> Vec<&'a [u8]> {
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
pub(super) fn unstarted(listed: &[Payload], started: &HashMap<Arc<str>, Arc<Job>>) -> Vec<Payload> {
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
    use crate::job::intake;

    fn held(payloads: &[&str]) -> Vec<Arc<str>> {
        payloads.iter().map(|p| Arc::from(*p)).collect()
    }

    fn listed(payloads: &[&[u8]]) -> Vec<Payload> {
        payloads.iter().map(|p| p.to_vec()).collect()
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
        let crate::job::Intake::Run { job, stamped } = intake(br#"{"task":"t"}"#, 1, 5, "w") else {
            panic!("runs");
        };
        let started = HashMap::from([(Arc::<str>::from(stamped.as_str()), Arc::new(job.clone()))]);
        let list = listed(&[stamped.as_bytes(), b"\xfe raw", b"{\"other\":1}"]);
        let pushed = unstarted(&list, &started);
        assert_eq!(pushed[0], job.unstarted().into_bytes());
        assert_eq!(pushed[1], b"\xfe raw");
        assert_eq!(pushed[2], br#"{"other":1}"#);
        let back: serde_json::Value = serde_json::from_slice(&pushed[0]).expect("json");
        assert!(back.get("attempt").is_none(), "the attempt is not counted");
    }
}
