//! Intake: fresh payloads are stamped, scheduled or dead-lettered in one
//! script, and a task starts for each job to run. Both fetch and settle
//! come here: the one-slot fast path goes run_job -> ack_and_take ->
//! dispatch_into -> dispatch, which is why dispatch_into is boxed.

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
            let mut actions = Vec::with_capacity(raws.len());
            let mut runs = Vec::with_capacity(raws.len());
            let mut back = Vec::new();
            for raw in raws {
                match intake(&raw, now, self.config.max_attempts, &self.instance) {
                    Intake::Run { job, stamped } => {
                        let permit = permits
                            .pop()
                            .or_else(|| self.slots.clone().try_acquire_owned().ok());
                        match permit {
                            Some(permit) => {
                                runs.push(Some((
                                    Arc::new(job),
                                    Arc::<str>::from(stamped.as_str()),
                                    permit,
                                )));
                                actions.push(IntakeAction::Run { raw, stamped });
                            }
                            // More arrived at once than slots are free.
                            None => back.push(raw),
                        }
                    }
                    Intake::Schedule { run_at } => {
                        runs.push(None);
                        actions.push(IntakeAction::Schedule { raw, run_at });
                    }
                    Intake::Dead(letter) => {
                        runs.push(None);
                        self.log_dead(qi, &letter);
                        actions.push(IntakeAction::Dead {
                            raw,
                            envelope: letter.to_json(),
                        });
                    }
                }
            }
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

    /// Starts a job taken into a slot a finished job freed. Boxed as a
    /// `Send` future: it spawns `run_job`, which awaits it.
    pub(super) fn dispatch_into(
        self: Arc<Self>,
        next: Fetched,
        slot: OwnedSemaphorePermit,
    ) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut permits = vec![slot];
            self.dispatch(vec![next], &mut permits).await;
        })
    }
}
