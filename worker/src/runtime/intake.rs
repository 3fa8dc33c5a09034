//! Intake: fresh payloads are stamped, scheduled or dead-lettered in one
//! script, and a task starts for each job to run. Jobs come here from the
//! fetch loop and from the settle loop (jobs taken into freed slots).

use super::*;

impl Worker {
    /// Stamps, schedules or dead-letters freshly fetched payloads and starts
    /// a task for each job to run, one slot each.
    pub(super) async fn dispatch(
        self: &Arc<Self>,
        fetched: Vec<Fetched>,
        permits: &mut Vec<OwnedSemaphorePermit>,
    ) {
        if fetched.is_empty() {
            return;
        }
        let now = self.now_ms();
        let mut by_queue: Vec<Vec<Payload>> = self.queues.iter().map(|_| Vec::new()).collect();
        for Fetched {
            queue: i,
            payload: raw,
        } in fetched
        {
            by_queue[i].push(raw);
        }
        for (qi, raws) in by_queue.into_iter().enumerate() {
            if raws.is_empty() {
                continue;
            }
            let q = &self.queues[qi];
            // Slots for as many as could run: the caller's first, then free ones.
            let mut mine = Vec::new();
            while mine.len() < raws.len() {
                match permits
                    .pop()
                    .or_else(|| self.slots.clone().try_acquire_owned().ok())
                {
                    Some(p) => mine.push(p),
                    None => break,
                }
            }
            let plan = plan(
                raws,
                mine.len(),
                now,
                self.config.max_attempts,
                &self.instance,
            );
            for letter in &plan.dead {
                self.log_dead(qi, letter);
            }
            let Plan {
                actions,
                runs,
                back,
                ..
            } = plan;
            let mut mine = mine.into_iter();
            let runs: Vec<_> = runs
                .into_iter()
                .map(|run| run.and_then(|(job, stamped)| mine.next().map(|p| (job, stamped, p))))
                .collect();
            // Slots no job here needed are the next queue's.
            permits.extend(mine);
            if !back.is_empty() {
                let pairs: Vec<(&[u8], &[u8])> = back
                    .iter()
                    .rev()
                    .map(|r| (r.as_slice(), r.as_slice()))
                    .collect();
                let returned = self
                    .redis
                    .once("give_back", |mut c| async move {
                        queue::give_back(&mut c, q, &self.instance, &pairs).await
                    })
                    .await;
                if returned.is_err() {
                    self.suspect_lost_reply();
                }
            }
            let pending = &actions;
            let settled = self
                .redis
                .once("settle_intake", |mut c| async move {
                    queue::settle_intake(&mut c, q, &self.instance, pending).await
                })
                .await;
            let Ok(settled) = settled else {
                // Unknown whether the script ran: the processing list is
                // checked against the ledger on the next round.
                self.suspect_lost_reply();
                continue;
            };
            for ((action, run), kept) in actions.iter().zip(runs).zip(settled) {
                match (action, run) {
                    (IntakeAction::Run { .. }, Some((job, stamped, permit))) if kept => {
                        let seq = {
                            let mut ledger = self.ledger();
                            let seq = ledger.next;
                            ledger.next += 1;
                            ledger.queues[qi].insert(
                                seq,
                                Held {
                                    payload: stamped.clone(),
                                    job: job.clone(),
                                },
                            );
                            seq
                        };
                        self.tracker
                            .spawn(self.clone().run_job(qi, seq, job, stamped, permit));
                    }
                    (IntakeAction::Schedule { .. }, _) if kept => {
                        self.metrics
                            .jobs
                            .with_label_values(&[q.name(), "scheduled"])
                            .inc();
                    }
                    (IntakeAction::Dead { .. }, _) if kept => {
                        self.metrics
                            .jobs
                            .with_label_values(&[q.name(), "dead"])
                            .inc();
                    }
                    _ => {}
                }
            }
        }
    }
}

/// What intake does with one queue's fresh payloads.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// One per payload that stays (runs, is scheduled or dead-lettered), in
    /// order: what the intake script does with it.
    pub(super) actions: Vec<IntakeAction>,
    /// Beside each action: the job and its stamped payload when it runs.
    pub(super) runs: Vec<Option<(Arc<Job>, Arc<str>)>>,
    /// Jobs beyond the free slots: back to the head of the queue, untouched.
    pub(super) back: Vec<Payload>,
    /// The dead letters among the actions.
    pub(super) dead: Vec<DeadLetter>,
}

/// Plans the intake of `raws` (as fetched, oldest first) with `free` slots:
/// pure, so the rules are tested without Redis.
pub(super) fn plan(
    raws: Vec<Payload>,
    free: usize,
    now_ms: u64,
    max_attempts: u32,
    instance: &str,
) -> Plan {
    let mut plan = Plan::default();
    let mut running = 0;
    for raw in raws {
        match intake(&raw, now_ms, max_attempts, instance) {
            Intake::Run { job, stamped } => {
                if running < free {
                    running += 1;
                    plan.runs
                        .push(Some((Arc::new(job), Arc::<str>::from(stamped.as_str()))));
                    plan.actions.push(IntakeAction::Run { raw, stamped });
                } else {
                    // More arrived at once than slots are free.
                    plan.back.push(raw);
                }
            }
            Intake::Schedule { run_at } => {
                plan.runs.push(None);
                plan.actions.push(IntakeAction::Schedule { raw, run_at });
            }
            Intake::Dead(letter) => {
                plan.runs.push(None);
                plan.actions.push(IntakeAction::Dead {
                    raw,
                    envelope: letter.to_json(),
                });
                plan.dead.push(letter);
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn raws(payloads: &[&[u8]]) -> Vec<Payload> {
        payloads.iter().map(|p| p.to_vec()).collect()
    }

    #[test]
    fn jobs_beyond_the_free_slots_go_back_and_the_rest_are_planned_in_order() {
        let plan = plan(
            raws(&[b"{\"n\":1}", b"{\"n\":2}", b"{\"n\":3}"]),
            2,
            NOW,
            5,
            "w~1",
        );
        assert_eq!(plan.actions.len(), 2);
        assert!(matches!(&plan.actions[0], IntakeAction::Run { raw, .. } if raw == b"{\"n\":1}"));
        assert_eq!(plan.back, raws(&[b"{\"n\":3}"]));
        assert_eq!(plan.runs.iter().flatten().count(), 2);
    }

    #[test]
    fn malformed_and_delayed_payloads_need_no_slot() {
        let later = format!(r#"{{"run_at":{}}}"#, NOW + 60_000);
        let plan = plan(raws(&[b"\xff", later.as_bytes(), b"{}"]), 1, NOW, 5, "w~1");
        assert!(matches!(plan.actions[0], IntakeAction::Dead { .. }));
        assert!(
            matches!(plan.actions[1], IntakeAction::Schedule { run_at, .. } if run_at == NOW + 60_000)
        );
        assert!(matches!(plan.actions[2], IntakeAction::Run { .. }));
        assert!(plan.back.is_empty());
        assert_eq!(plan.dead.len(), 1);
        assert_eq!(plan.runs.len(), plan.actions.len());
    }

    #[test]
    fn with_no_free_slot_every_job_goes_back_untouched() {
        let plan = plan(raws(&[b"{}", b"{}"]), 0, NOW, 5, "w~1");
        assert!(plan.actions.is_empty());
        assert_eq!(plan.back, raws(&[b"{}", b"{}"]));
    }
}
